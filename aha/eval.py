"""Evaluation: greedy accuracy, sampled pass@k and maj@k, lengths and format, per problem.

`pass_at_k` is the unbiased estimator of Chen et al. (2021): with n samples of which c are right,
pass@k = 1 - C(n-c, k) / C(n, k), the chance that k of the n samples include a right one.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import torch

from .config import EvalConfig
from .data import encode_prompt
from .tasks import Task

CORRECT_AT = 1.0 - 1e-6
"""A verifier value at or above this counts as right (code rewards may return a pass fraction)."""


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


def majority_correct(answers: list[str | None], correct: list[bool]) -> bool:
    """maj@k: is the most frequent extracted answer (ties: first seen) a right one?"""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return False
    top = max(votes, key=lambda a: (votes[a], -answers.index(a)))
    return correct[answers.index(top)]


def _score(task: Task, verifier, rows: list[dict], texts: list[str], n: int) -> list[bool]:
    """Is each of the n completions per row right? Rows are repeated n times, prompt-major."""
    from .rewards import score_groups
    values, _ = score_groups([verifier], rows, texts, n)                          # [N,1]
    return [bool(v >= CORRECT_AT) for v in values[:, 0].tolist()]  # NaN compares False


def _generate(model, tokenizer, rows, n, params, batch_size, seed, desc, progress):
    from tqdm.auto import tqdm

    from .rollout import HFEngine
    engine = HFEngine.for_model(model, tokenizer, batch_size)
    gen = torch.Generator().manual_seed(seed)
    ids = [encode_prompt(tokenizer, r["prompt"]) for r in rows]
    with tqdm(total=len(ids), desc=desc, disable=not progress, leave=False) as bar:  # one call: batch_size rows
        out = engine.generate(ids, n, params, gen, on_group=lambda i, r: bar.update())  # at once, kept full
    return (tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True),
            [len(c) for c in out.completion_ids])


def evaluate(model, tokenizer, task: Task, rows: list[dict], k: list[int] = (1,), n_samples: int = 0,
             temperature: float = 0.7, top_p: float = 1.0, max_new_tokens: int | None = None,
             batch_size: int = 256, seed: int = 0, progress: bool = False) -> tuple[dict, list[dict]]:
    """(summary metrics, per-problem records) for `rows` of `task`."""
    from .rewards import format_reward
    from .rollout import SamplingParams
    from .stats import bootstrap, wilson
    if n_samples and max(k) > n_samples:
        raise ValueError(f"k={max(k)} is larger than n_samples={n_samples}")
    t0 = time.perf_counter()
    budget = max_new_tokens or task.max_completion_length
    verifier = task.correct()
    greedy, glen = _generate(model, tokenizer, rows, 1, SamplingParams(0.0, 1.0, 0, budget),
                             batch_size, seed, "greedy", progress)
    ok = _score(task, verifier, rows, greedy, 1)
    summary = {"accuracy": sum(ok) / len(rows), "accuracy_ci95": list(wilson(sum(ok), len(rows)))}
    for part in task.parts:  # a mixture: each task's own accuracy (`accuracy/chat_add`)
        mine = [c for r, c in zip(rows, ok) if str(r.get("id", "")).startswith(f"{part}:")]
        if mine:
            summary[f"accuracy/{part}"] = sum(mine) / len(mine)
    if task.asks_format:  # the share of answers in the format the prompt asked for
        summary["format_frac"] = sum(_score(task, format_reward, rows, greedy, 1)) / len(rows)
    summary.update({"len_mean": sum(glen) / len(glen), "num_problems": len(rows)})
    sent = [tokenizer.decode(encode_prompt(tokenizer, r["prompt"])) for r in rows]
    records = [{"id": r.get("id", i), "prompt": p, "answer": r.get("answer"), "greedy": g, "greedy_correct": c}
               for i, (r, p, g, c) in enumerate(zip(rows, sent, greedy, ok))]
    if n_samples:
        texts, _ = _generate(model, tokenizer, rows, n_samples, SamplingParams(temperature, top_p, 0, budget),
                             batch_size, seed, f"samples x{n_samples}", progress)
        right = _score(task, verifier, rows, texts, n_samples)
        for i, rec in enumerate(records):
            mine = right[i * n_samples:(i + 1) * n_samples]
            rec["samples_correct"] = sum(mine)
            if task.extract:
                answers = [task.extract(t) for t in texts[i * n_samples:(i + 1) * n_samples]]
                rec["maj"] = {kk: majority_correct(answers[:kk], mine[:kk]) for kk in k}
        for kk in k:
            per_problem = [pass_at_k(n_samples, r["samples_correct"], kk) for r in records]
            summary[f"pass@{kk}"] = sum(per_problem) / len(rows)
            summary[f"pass@{kk}_ci95"] = list(bootstrap(per_problem, seed=seed))
            if task.extract:
                wins = sum(r["maj"][kk] for r in records)
                summary[f"maj@{kk}"], summary[f"maj@{kk}_ci95"] = wins / len(rows), list(wilson(wins, len(rows)))
        summary["n_samples"] = n_samples
    summary["seconds"] = time.perf_counter() - t0
    return summary, records


HELD_OUT_SHOWN = 8
"""Held-out problems whose greedy answers an in-training evaluation keeps (`eval_fn.answers`), the same ones
every time, so successive evaluations can be read side by side (held_out.jsonl, the dashboard's aha tracker)."""
ANSWER_CHARS = 400
"""Longest answer text kept."""


def make_eval_fn(task: Task, rows: list[dict], max_new_tokens: int | None = None, batch_size: int = 256):
    """Greedy held-out accuracy as a trainer hook: (model, tokenizer) -> metrics. After each call,
    `eval_fn.answers` holds the greedy answers to the first HELD_OUT_SHOWN problems."""
    def eval_fn(model, tokenizer) -> dict:
        summary, records = evaluate(model, tokenizer, task, rows, max_new_tokens=max_new_tokens, batch_size=batch_size)
        eval_fn.answers = [{"id": r["id"], "prompt": r["prompt"], "answer": r["answer"],
                            "greedy": r["greedy"][:ANSWER_CHARS], "correct": bool(r["greedy_correct"])}
                           for r in records[:HELD_OUT_SHOWN]]
        return {k: v for k, v in summary.items()
                if k in ("accuracy", "format_frac", "len_mean") or k.startswith("accuracy/")}
    eval_fn.answers = []
    return eval_fn


def to_markdown(summary: dict, title: str) -> str:
    """One table row; a value with an interval (`X` and `X_ci95`) is shown as `0.420 [0.328, 0.518]`."""
    keys = [k for k in summary if k != "seconds" and not k.endswith("_ci95")]

    def cell(k):
        v, ci = summary[k], summary.get(f"{k}_ci95")
        text = f"{v:.3f}" if isinstance(v, float) else str(v)
        return f"{text} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else text

    head = "| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n"
    cells = [cell(k) for k in keys]
    return f"### {title}\n\n{head}| " + " | ".join(cells) + " |\n"


def run_eval(cfg: EvalConfig) -> dict:
    """Load, evaluate, and write results.json / results.md / per_problem.jsonl when output_dir is set."""
    from .models import load_model, load_tokenizer
    from .tasks import get_task
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task = get_task(cfg.task)
    if cfg.split not in task.splits:
        raise ValueError(f"task '{task.name}' has no split '{cfg.split}'; valid: {list(task.splits)}")
    tokenizer = load_tokenizer(cfg.model)
    model = load_model(cfg.model, cfg.dtype)
    rows = task.load(cfg.split)
    rows = rows[:cfg.num_problems] if cfg.num_problems else rows
    summary, records = evaluate(model, tokenizer, task, rows, cfg.k, cfg.n_samples, cfg.temperature,
                                cfg.top_p, cfg.max_new_tokens, cfg.batch_size, cfg.seed, cfg.progress_bar)
    summary = {"model": cfg.model, "task": task.name, "split": cfg.split, **summary}
    if cfg.output_dir:
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"config": asdict(cfg), "summary": summary}, indent=2))
        (out / "results.md").write_text(to_markdown(summary, f"{task.name} / {cfg.split}: {cfg.model}"))
        (out / "per_problem.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return summary
