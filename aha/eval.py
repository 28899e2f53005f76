"""Evaluation: greedy accuracy, sampled pass@k and maj@k, lengths and format, per problem.

`pass_at_k` is the unbiased estimator of Chen et al. (2021): with n samples of which c are right,
pass@k = 1 - C(n-c, k) / C(n, k), the chance that k of the n samples include a right one.

A comparison the verifier did not decide (its None or NaN: a time or memory limit, an answer too large to
evaluate, a call budget run out, a gold that does not parse, a verifier call that failed) counts as not correct
in accuracy, pass@k and maj@k. The summary says how many there were (`undecided`, `samples/undecided`,
`maj@k/undecided`) and why (the verifier's counters: `reward/timeouts`, `reward/too_large`, `reward/unjudged`,
`reward/data_errors`, `reward/errors`, ...), so a score lowered by them is visible.

An agent task's completions are episodes of the turn loop (its tools, its environments), judged by its success
verdict: accuracy is then task success, by family where the rows have one, with `tools/*` beside it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from .config import EvalConfig
from .data import encode_prompt
from .tasks import Task

CORRECT_AT = 1.0 - 1e-6
"""A verifier value at or above this counts as right (code rewards may return a pass fraction)."""
UNDECIDED_NOTE = ("undecided comparisons (the verifier's None or NaN: time-outs, too_large, unjudged, data errors, "
                  "failed calls) count as not correct in accuracy, pass@k and maj@k")
"""The summary's `note`: how `undecided` entered the scores."""
FORMAT_ASKED = "R1's format (<think> reasoning </think> <answer> answer </answer>)"
"""What a prompt of a task that `asks_format` asks for, in `format_note`."""
NOTES = ("format_note", "note")
"""Summary lines shown after the results table, not in it."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem. Example: n=4, c=1, k=2 -> 1 - C(3,2)/C(4,2) = 0.5."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):  # C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i)
        prod *= 1.0 - k / i
    return 1.0 - prod


def same_answer(a: str, b: str) -> bool:
    """Are two extracted answers the same answer, by the math verifier's own fast comparison (`fast_verdict`:
    cosmetic LaTeX, thousands commas, currency, units, percent, fractions vs decimals)? What it cannot decide
    without sympy counts as different. Example: same_answer("$18", "18.00") -> True."""
    from .rewards.maths import fast_verdict
    return fast_verdict(a, b) is True


def majority_vote(answers: list[str | None], same: Callable[[str, str], bool] = same_answer) -> list[int]:
    """maj@k's winners: the indices of the answers in the largest class of equal answers (`same`; ties: the class
    whose first member came first). Each answer joins the first class whose first member it equals; None (no
    answer) does not vote. [] when no answer voted. Example: ["3", "7", "7.0"] -> [1, 2]."""
    classes: list[list[int]] = []
    for i, a in enumerate(answers):
        if a is None:
            continue
        home = next((c for c in classes if same(a, answers[c[0]])), None)
        if home is None:
            classes.append([i])
        else:
            home.append(i)
    return max(classes, key=len) if classes else []  # max keeps the first of equal lengths: the earliest class


def majority_correct(answers: list[str | None], correct: list[bool | None],
                     same: Callable[[str, str], bool] = same_answer) -> bool | None:
    """maj@k: is the answer most samples agree on right? The winning class (`majority_vote`) is right when more
    of its members were scored right than wrong (they are equal answers, so their verdicts agree but for
    verifier limits); None (undecided) when none of them was decided, False when no sample gave an answer.

    Example: answers ["3", "7", "7.0"] scored [True, False, False] -> False: 7 has two votes.
    """
    winners = majority_vote(answers, same)
    verdicts = [correct[i] for i in winners if correct[i] is not None]
    if winners and not verdicts:
        return None
    return sum(verdicts) * 2 > len(verdicts)


UNDECIDED_REASONS = ("reward/timeouts", "reward/too_large", "reward/unjudged", "reward/data_errors")
"""Verifier counters of undecided comparisons that the summary always shows (0 when a verifier reports none)."""


def _counters(metrics: dict[str, float]) -> dict[str, int]:
    """score_groups' counts (`reward/errors`, `reward/call_timeouts`, `reward/nan`, the verifier's own such as
    `reward/timeouts`, `reward/too_large`, `reward/unjudged`, `reward/data_errors`), without per-function statistics."""
    counts = {k: int(v) for k, v in metrics.items() if k.startswith("reward/") and k.count("/") == 1}
    return {**counts, **{k: counts.get(k, 0) for k in UNDECIDED_REASONS}}


def _score(task: Task, verifier, rows: list[dict], texts: list[str], n: int,
           episodes: dict | None = None) -> tuple[list[bool | None], dict]:
    """The verdict on each of the n completions per row (rows repeated n times, prompt-major): True (right),
    False, or None (undecided: the verifier gave None or NaN, or its call failed); and the verifier's counters.
    Completions are read as the task scores them (cut at its `stop`); an agent's as its `episodes` (their messages
    and environments, aha.rollout.experience.episode_inputs)."""
    from .rewards import score_groups
    values, metrics = score_groups([task.scorer(verifier)], rows, texts, n, episodes=episodes)  # [N,1]
    return [None if math.isnan(v) else v >= CORRECT_AT for v in values[:, 0].tolist()], _counters(metrics)


def _math_verifier(verifier):
    """The MathReward inside a verifier (FormatGated, CutBeforeScoring unwrapped); None when it is not one."""
    from .rewards import MathReward
    inner = verifier
    while not isinstance(inner, MathReward) and getattr(inner, "inner", None) is not None:
        inner = inner.inner
    return inner if isinstance(inner, MathReward) else None


def _answer_reader(task: Task, verifier) -> Callable[[str], str | None] | None:
    """How maj@k reads a completion's answer (None: the task has no `extract`, so no maj@k): as the verifier reads
    it when that is the math verifier (its own last-number fallback or strictness, on the completion cut at the
    task's `stop`), else with `task.extract`."""
    from .rewards import extract_answer
    if task.extract is None:
        return None
    inner = _math_verifier(verifier)
    if inner is not None:
        return lambda text: extract_answer(task.cut(text), inner.last_number_fallback)
    return task.extract


def _format_summary(task: Task, verifier, rows: list[dict], greedy: list[str], right: int) -> dict:
    """Where the prompts asked for R1's format: the share of greedy answers in it (`format_frac`); where the verifier
    then reads only explicit answers, the share whose final number matches the gold anyway (`final_number_accuracy`),
    and when none is in the format but more final numbers match than the `right` answers accuracy counts, a
    `format_note` that says so: a 0% alone reads as a model that cannot do the task. Example: 0 of 150 in the
    format, 126 final numbers right -> "format share 0%: 126 of 150 final numbers match the gold; ..."."""
    from .rewards import MathReward, format_reward
    if not task.asks_format:
        return {}
    share = sum(v is True for v in _score(task, format_reward, rows, greedy, 1)[0]) / len(rows)
    strict = _math_verifier(verifier)
    if strict is None or strict.last_number_fallback:
        return {"format_frac": share}
    final = sum(v is True for v in _score(task, MathReward(strict.answer_column), rows, greedy, 1)[0])
    out = {"format_frac": share, "final_number_accuracy": final / len(rows)}
    if share == 0 and final > right:
        out["format_note"] = (f"format share 0%: {final} of {len(rows)} final numbers match the gold; the prompts "
                              f"asked for {FORMAT_ASKED}, and accuracy counts only the {right} right answers given "
                              "explicitly (<answer>, \\boxed{}, '#### n')")
    return out


@dataclass
class Generated:
    """n completions of each row, prompt-major: their texts and lengths in tokens; for an agent task, the episodes'
    inputs to scoring (messages, environments), their records (aha.rollout.turns.Episode.record) and the prompt ids
    each was shown (its tools listed, its environment's reset text appended)."""

    texts: list[str]
    lengths: list[int]
    inputs: dict | None = None
    episodes: list[dict] | None = None
    prompt_ids: list[list[int]] | None = None


def generate(model, tokenizer, task: Task, rows: list[dict], n: int, params, batch_size: int = 256, seed: int = 0,
             desc: str = "generate", progress: bool = False, engine: str = "hf", tools: bool = True) -> Generated:
    """n completions of each row from the engine named `engine` (aha.rollout.engines); for an agent task, n
    episodes through the turn loop with the task's tools and environments (`tools` false: one reply each, with no
    tool shown and none run)."""
    from tqdm.auto import tqdm

    from .rollout import get_engine
    from .rollout.experience import episode_inputs
    from .rollout.turns import sample_episodes
    if task.is_agent:
        agent, rounds = (task.agent(), task.max_tool_calling_iterations) if tools else (
            task.agent().without_tools(), 0)
        out, _ = sample_episodes(model, tokenizer, agent, rows, params.max_new_tokens, rounds, None, batch_size,
                                 params.temperature, n, seed, engine, params.top_p)
    else:
        ids = [encode_prompt(tokenizer, r["prompt"]) for r in rows]
        with tqdm(total=len(ids), desc=desc, disable=not progress, leave=False) as bar:  # one call: batch_size rows
            out = get_engine(engine)(model, tokenizer, batch_size).generate(  # at once, kept full
                ids, n, params, torch.Generator().manual_seed(seed), on_group=lambda i, r: bar.update())
    return Generated(tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True),
                     [len(c) for c in out.completion_ids], episode_inputs(out), out.episodes, out.prompt_ids)


def verdicts(model, tokenizer, task: Task, rows: list[dict], n: int, params, batch_size: int = 256, seed: int = 0,
             engine: str = "hf") -> list[bool | None]:
    """The verdict on each of n completions per row (prompt-major; an agent task's: episodes), generated and scored
    as `evaluate` does: True (right, for an agent task: succeeded), False, or None (undecided). For measurements
    outside a full evaluation (a demo's or a benchmark's success per task)."""
    drawn = generate(model, tokenizer, task, rows, n, params, batch_size, seed, engine=engine)
    return _score(task, task.correct(), rows, drawn.texts, n, drawn.inputs)[0]


def _sampled_metrics(task: Task, verifier, rows: list[dict], texts: list[str], records: list[dict], k: list[int],
                     n_samples: int, seed: int, episodes: dict | None = None) -> tuple[dict, list[bool | None]]:
    """pass@k and maj@k of n_samples completions per row (prompt-major), with their undecided counts, and the
    verdict on each completion; each problem's record gets `samples_correct`, `samples_undecided` and `maj`
    ({k: True, False or None})."""
    from .stats import bootstrap, wilson
    sampled, counters = _score(task, verifier, rows, texts, n_samples, episodes)
    read = _answer_reader(task, verifier)
    for i, rec in enumerate(records):
        mine = sampled[i * n_samples:(i + 1) * n_samples]
        rec["samples_correct"] = sum(v is True for v in mine)
        rec["samples_undecided"] = sum(v is None for v in mine)
        if read:
            answers = [read(t) for t in texts[i * n_samples:(i + 1) * n_samples]]
            rec["maj"] = {kk: majority_correct(answers[:kk], mine[:kk]) for kk in k}
    out = {}
    for kk in k:
        per_problem = [pass_at_k(n_samples, r["samples_correct"], kk) for r in records]
        out[f"pass@{kk}"] = sum(per_problem) / len(rows)
        out[f"pass@{kk}_ci95"] = list(bootstrap(per_problem, seed=seed))
        if read:
            wins = sum(r["maj"][kk] is True for r in records)
            out[f"maj@{kk}"], out[f"maj@{kk}_ci95"] = wins / len(rows), list(wilson(wins, len(rows)))
            out[f"maj@{kk}/undecided"] = sum(r["maj"][kk] is None for r in records)
    out.update({"n_samples": n_samples, "samples/undecided": sum(r["samples_undecided"] for r in records)})
    return {**out, **{f"samples/{key}": value for key, value in counters.items()}}, sampled


def evaluate(model, tokenizer, task: Task, rows: list[dict], k: list[int] = (1,), n_samples: int = 0,
             temperature: float = 0.7, top_p: float = 1.0, max_new_tokens: int | None = None,
             batch_size: int = 256, seed: int = 0, progress: bool = False,
             keep_samples: bool = False, engine: str = "hf", tools: bool = True) -> tuple[dict, list[dict]]:
    """(summary metrics, per-problem records) for `rows` of `task`. An undecided verdict counts as not correct;
    the summary counts them (`undecided`, `samples/undecided`, `maj@k/undecided`, the verifier's `reward/*`).
    With `keep_samples` each record also holds its sampled completions (`samples`: text, len, correct). For an agent
    task each completion is an episode of the turn loop: accuracy is the task's success, `tools/*` describe the
    greedy episodes, and each record holds its episode's `messages`; with `tools` false its episodes see no tools
    (`generate`)."""
    from .rollout import SamplingParams
    if n_samples and max(k) > n_samples:
        raise ValueError(f"k={max(k)} is larger than n_samples={n_samples}")
    t0 = time.perf_counter()
    budget = max_new_tokens or task.max_completion_length
    verifier = task.correct()
    greedy = generate(model, tokenizer, task, rows, 1, SamplingParams(0.0, 1.0, 0, budget), batch_size, seed,
                      "greedy", progress, engine, tools)
    summary, records = _greedy_summary(task, verifier, tokenizer, rows, greedy)
    if n_samples:
        drawn = generate(model, tokenizer, task, rows, n_samples, SamplingParams(temperature, top_p, 0, budget),
                         batch_size, seed, f"samples x{n_samples}", progress, engine, tools)
        sampled_summary, sampled = _sampled_metrics(task, verifier, rows, drawn.texts, records, k, n_samples, seed,
                                                    drawn.inputs)
        summary.update(sampled_summary)
        kept = [{"text": t, "len": n, "correct": v} for t, n, v in zip(drawn.texts, drawn.lengths, sampled)]
        for i, rec in enumerate(records if keep_samples else []):
            rec["samples"] = kept[i * n_samples:(i + 1) * n_samples]
    summary["note"] = UNDECIDED_NOTE
    summary["seconds"] = time.perf_counter() - t0
    return summary, records


def _greedy_summary(task: Task, verifier, tokenizer, rows: list[dict], greedy: Generated) -> tuple[dict, list[dict]]:
    """Greedy accuracy with its interval, by group (`accuracy_by_group`), format share, lengths, tool use and the
    verifier's counters; and each problem's record."""
    from .rollout.experience import tool_metrics
    from .stats import wilson
    verdicts, counters = _score(task, verifier, rows, greedy.texts, 1, greedy.inputs)
    ok = [v is True for v in verdicts]
    summary = {"accuracy": sum(ok) / len(rows), "accuracy_ci95": list(wilson(sum(ok), len(rows))),
               "undecided": sum(v is None for v in verdicts), **accuracy_by_group(task, rows, ok)}
    summary.update(_format_summary(task, verifier, rows, greedy.texts, sum(ok)))  # where the prompts asked for a format
    summary.update({"len_mean": sum(greedy.lengths) / len(greedy.lengths), "num_problems": len(rows)})
    summary.update(tool_metrics(greedy.episodes) if greedy.episodes else {})
    summary.update(counters)
    sent = [tokenizer.decode(p) for p in greedy.prompt_ids or [encode_prompt(tokenizer, r["prompt"]) for r in rows]]
    records = [{"id": r.get("id", i), "prompt": p, "answer": r.get("answer"), "greedy": g, "greedy_correct": c,
                "greedy_undecided": v is None, "greedy_len": n}
               for i, (r, p, g, c, v, n) in enumerate(zip(rows, sent, greedy.texts, ok, verdicts, greedy.lengths))]
    for rec, episode in zip(records, greedy.episodes or []):
        rec.update({k: episode[k] for k in ("messages", "finish", "calls", "outcomes")})
    return summary, records


def accuracy_by_group(task: Task, rows: list[dict], ok: list[bool]) -> dict:
    """`accuracy/<group>` and its Wilson interval for each group of rows: a mixture's tasks (row ids "PART:..."),
    else the rows' `family` column where they have one (an agent task's kinds of task); {} for neither.
    Example: families [a, a, b], right [True, False, True] -> accuracy/a 0.5, accuracy/b 1.0."""
    from .stats import wilson
    if task.parts:
        labels = [next((p for p in task.parts if str(r.get("id", "")).startswith(f"{p}:")), None) for r in rows]
    else:
        labels = [r.get("family") for r in rows]
    out = {}
    for label in dict.fromkeys(x for x in labels if x is not None):
        mine = [c for x, c in zip(labels, ok) if x == label]
        out[f"accuracy/{label}"] = sum(mine) / len(mine)
        out[f"accuracy/{label}_ci95"] = list(wilson(sum(mine), len(mine)))
    return out


HELD_OUT_SHOWN = 8
"""Held-out problems whose greedy answers an in-training evaluation keeps (`eval_fn.answers`), the same ones
every time, so successive evaluations can be read side by side (held_out.jsonl, the dashboard's aha tracker)."""
ANSWER_CHARS = 400
"""Longest answer text kept."""


def greedy_behaviour(records: list[dict], phrases: Sequence[str]) -> tuple[dict[str, float], list[dict]]:
    """aha.behaviour's metrics of the greedy answers in `records`, and what each answer's reflection did:
    `reflects` (a reflection phrase), and where the phrases hold a registered check marker, the check's parse
    (`reflects`, `corrects`, `first_right`, `empty`)."""
    from .behaviour import behaviour_metrics, check_parser, count_phrases
    prompts, texts = [r["prompt"] for r in records], [r["greedy"] for r in records]
    verdicts = [None if r["greedy_undecided"] else bool(r["greedy_correct"]) for r in records]
    metrics = behaviour_metrics(prompts, texts, [r["greedy_len"] for r in records], verdicts, phrases)
    parse = check_parser(phrases)
    marks = [asdict(parse(p, t)) if parse else {"reflects": n > 0}
             for p, t, n in zip(prompts, texts, count_phrases(texts, phrases))]
    return metrics, marks


def make_eval_fn(task: Task, rows: list[dict], max_new_tokens: int | None = None, batch_size: int = 256,
                 shown: int = HELD_OUT_SHOWN, phrases: Sequence[str] | None = None):
    """Greedy held-out accuracy as a trainer hook: (model, tokenizer) -> metrics. After each call,
    `eval_fn.answers` holds the greedy answers to the first `shown` problems. With reflection `phrases`, the
    greedy answers' behaviour metrics join the accuracy (`behaviour/...`) and each kept answer says what its
    reflection did (`greedy_behaviour`)."""
    def eval_fn(model, tokenizer) -> dict:
        summary, records = evaluate(model, tokenizer, task, rows, max_new_tokens=max_new_tokens, batch_size=batch_size)
        behaviour, marks = greedy_behaviour(records, phrases) if phrases else ({}, [{}] * len(records))
        eval_fn.answers = [{"id": r["id"], "prompt": r["prompt"], "answer": r["answer"],
                            "greedy": r["greedy"][:ANSWER_CHARS], "correct": bool(r["greedy_correct"]), **m}
                           for r, m in list(zip(records, marks))[:shown]]
        return {**{k: v for k, v in summary.items()
                   if k in ("accuracy", "undecided", "format_frac", "final_number_accuracy", "len_mean")
                   or k.startswith(("accuracy/", "tools/")) and not k.endswith("_ci95")}, **behaviour}
    eval_fn.answers = []
    return eval_fn


def to_markdown(summary: dict, title: str) -> str:
    """One table row; a value with an interval (`X` and `X_ci95`) is shown as `0.420 [0.328, 0.518]`; the
    summary's notes (`format_note`, `note`) follow the table."""
    keys = [k for k in summary if k not in ("seconds", *NOTES) and not k.endswith("_ci95")]

    def cell(k):
        v, ci = summary[k], summary.get(f"{k}_ci95")
        text = f"{v:.3f}" if isinstance(v, float) else str(v)
        return f"{text} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else text

    head = "| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n"
    cells = [cell(k) for k in keys]
    note = "".join(f"\n{summary[k]}.\n" for k in NOTES if summary.get(k))
    return f"### {title}\n\n{head}| " + " | ".join(cells) + " |\n" + note


def run_eval(cfg: EvalConfig) -> dict:
    """Load, evaluate, and write results.json / results.md / per_problem.jsonl when output_dir is set."""
    from .models import load_model, load_tokenizer
    from .tasks import get_task
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task = get_task(cfg.task)
    if cfg.split not in task.splits:
        raise ValueError(f"task '{task.name}' has no split '{cfg.split}'; valid: {list(task.splits)}")
    if not cfg.tools and not task.is_agent:
        raise ValueError(f"tools=false: task '{task.name}' is not an agent task, it has no tools to leave out")
    tokenizer = load_tokenizer(cfg.model)
    model = load_model(cfg.model, cfg.dtype)
    rows = task.load(cfg.split)
    rows = rows[:cfg.num_problems] if cfg.num_problems else rows
    summary, records = evaluate(model, tokenizer, task, rows, cfg.k, cfg.n_samples, cfg.temperature,
                                cfg.top_p, cfg.max_new_tokens, cfg.batch_size, cfg.seed, cfg.progress_bar,
                                engine=cfg.engine, tools=cfg.tools)
    summary = {"model": cfg.model, "task": task.name, "split": cfg.split, **({} if cfg.tools else {"tools": False}),
               **summary}
    if cfg.output_dir:
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"config": asdict(cfg), "summary": summary}, indent=2))
        (out / "results.md").write_text(to_markdown(summary, f"{task.name} / {cfg.split}: {cfg.model}"))
        (out / "per_problem.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return summary
