"""Rejection sampling: n completions per prompt, keep the verified ones, write an SFT-ready JSONL.

A completion is verified when the task's correctness verifier gives it 1.0; its rank among the
verified ones uses the task's weighted rewards, combined as training combines them (then length for
`shortest_correct`). A task with a base-model template cuts each completion at the next turn label (`Task.stop`):
that cut text is what is scored and written. An agent task's completions are episodes of the turn loop; a kept
one is written in TRL's messages format (`messages`: the prompt, assistant turns with `tool_calls`, `tool`
messages, the closing reply; `tools`: the schemas its episode was shown), which `aha sft` trains on.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import torch

from .config import SampleConfig
from .data import encode_prompt, load_rows, write_jsonl

KEEP = ("best", "all_correct", "shortest_correct")


def select(texts: list[str], lengths: list[int], correct: list[bool], scores: list[float], keep: str) -> list[int]:
    """Indices of the completions to keep for one prompt (distinct texts only). A score of NaN (no reward gave a
    value) ranks below every number.

    Example: texts [a, a, b], all correct, scores [1, 1, 2], keep="best" -> [2].
    """
    seen, ok = set(), []
    for i, t in enumerate(texts):
        if correct[i] and t not in seen:
            seen.add(t)
            ok.append(i)
    if not ok or keep == "all_correct":
        return ok
    if keep == "best":
        return [max(ok, key=lambda i: (scores[i] if scores[i] == scores[i] else -math.inf, -lengths[i]))]
    if keep == "shortest_correct":
        return [min(ok, key=lambda i: lengths[i])]
    raise ValueError(f"unknown keep '{keep}'; valid: {list(KEEP)}")


def task_rows(task, cfg) -> list[dict]:
    """The prompts of a sampling stage: `cfg.split` of the task after `prompts_offset`, `num_prompts` of them
    (0: all)."""
    rows = task.load(cfg.split)[cfg.prompts_offset:]
    rows = rows[:cfg.num_prompts] if cfg.num_prompts else rows
    if not rows:
        raise ValueError(f"no prompts left in {task.name}/{cfg.split} after offset {cfg.prompts_offset}")
    return rows


def load_sampler(cfg, task):
    """(tokenizer, engine, sampling params) of a sampling stage (cfg: a GenerationConfig): cfg.model in the engine
    named cfg.engine decoding cfg.batch_size sequences at once, with the task's generation budget unless
    max_new_tokens says."""
    from .rollout import get_engine
    tok, model, params = load_policy(cfg, task)
    return tok, get_engine(cfg.engine)(model, tok, cfg.batch_size), params


def load_policy(cfg, task):
    """(tokenizer, model, sampling params) of a sampling stage: cfg.model, with the task's generation budget unless
    max_new_tokens says."""
    from .models import load_model, load_tokenizer
    from .rollout import SamplingParams
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tok, model = load_tokenizer(cfg.model), load_model(cfg.model, cfg.dtype)
    return tok, model, SamplingParams(cfg.temperature, cfg.top_p, 0, cfg.max_new_tokens or task.max_completion_length)


def sample_texts(sampler, task, prompt_ids: list[list[int]], n: int, gen, progress: bool, desc: str = "sample",
                 heads: list[str] | None = None):
    """n completions of each prompt, prompt-major, with their Rollout: decoded, each after its prompt's `head`
    (text the prompt ids already end with), and cut as the task scores them."""
    from tqdm.auto import tqdm
    tok, engine, params = sampler
    with tqdm(total=len(prompt_ids), desc=desc, disable=not progress) as bar:  # one call: batch_size rows at once
        out = engine.generate(prompt_ids, n, params, gen, on_group=lambda i, r: bar.update())
    heads = heads or [""] * len(prompt_ids)
    texts = tok.batch_decode(out.completion_ids, skip_special_tokens=True)
    return [task.cut(heads[i // n] + t) for i, t in enumerate(texts)], out


def correct_flags(task, rows: list[dict], texts: list[str], n: int, episodes: dict | None = None) -> list[bool]:
    """Whether each of n texts (an agent's: episodes) per row is right by the task's correctness verifier (texts
    prompt-major)."""
    from .eval import CORRECT_AT
    from .rewards import score_groups
    right, _ = score_groups([task.correct()], rows, texts, n, episodes=episodes)  # [n*len(rows),1]
    return [bool(v >= CORRECT_AT) for v in right[:, 0].tolist()]


def scores(task, rewards: list, rows: list[dict], texts: list[str], n: int, episodes: dict | None = None) -> list:
    """Each completion's reward: `rewards` (the task's, then an agent's environment rewards, weight 1) combined as
    training combines them (aha.rollout.experience.combine_rewards); NaN when none gave a value."""
    from .rewards import score_groups
    from .rollout.experience import combine_rewards
    weights = torch.tensor((task.reward_weights or [1.0] * len(task.rewards())) + [1.0] * (len(rewards) - len(
        task.rewards())), dtype=torch.float32)                                      # [F]
    values, _ = score_groups(rewards, rows, texts, n, episodes=episodes)          # [n*len(rows),F]
    return combine_rewards(values, weights).tolist()


def completions(cfg: SampleConfig, task, rows: list[dict]) -> tuple[list, list[int], list[bool], list[float]]:
    """cfg.n completions of each row, prompt-major: what a kept one writes (its text, or for an agent task its
    conversation in TRL's messages format with its tools), its length, its verdict and its reward."""
    if task.is_agent:
        return episodes(cfg, task, rows)
    sampler = load_sampler(cfg, task)
    texts, out = sample_texts(sampler, task, [encode_prompt(sampler[0], r["prompt"]) for r in rows], cfg.n,
                              torch.Generator().manual_seed(cfg.seed), cfg.progress_bar)
    return ([{"completion": t} for t in texts], [len(c) for c in out.completion_ids],
            correct_flags(task, rows, texts, cfg.n), scores(task, task.rewards(), rows, texts, cfg.n))


def episodes(cfg: SampleConfig, task, rows: list[dict]) -> tuple[list, list[int], list[bool], list[float]]:
    """`completions` of an agent task: cfg.n episodes of each row through the turn loop (aha.eval.generate)."""
    from .eval import generate
    tok, model, params = load_policy(cfg, task)
    drawn = generate(model, tok, task, rows, cfg.n, params, cfg.batch_size, cfg.seed, "sample", cfg.progress_bar,
                     cfg.engine)
    agent = task.agent()
    tools = [agent.schemas[agent.environment_name(r)] for r in rows for _ in range(cfg.n)]
    written = [{"messages": list(p) + list(m), "tools": t}
               for p, m, t in zip(drawn.inputs["prompts"], drawn.inputs["completions"], tools)]
    return (written, drawn.lengths, correct_flags(task, rows, drawn.texts, cfg.n, drawn.inputs),
            scores(task, task.rewards() + agent.rewards, rows, drawn.texts, cfg.n, drawn.inputs))


def run_sample(cfg: SampleConfig) -> dict:
    from .tasks import get_task

    task = get_task(cfg.task)
    mix = load_rows(cfg.mix_dataset, prompt_column=None) if cfg.mix_dataset else []
    rows = task_rows(task, cfg)
    written, lengths, right, score = completions(cfg, task, rows)
    texts = [json.dumps(w, sort_keys=True) for w in written]  # distinct completions: distinct texts or conversations
    kept, per_prompt = [], []
    for j, row in enumerate(rows):
        sl = slice(j * cfg.n, (j + 1) * cfg.n)
        picks = select(texts[sl], lengths[sl], right[sl], score[sl], cfg.keep)
        per_prompt.append({"id": row.get("id"), "accepted": sum(right[sl]) / cfg.n, "kept": len(picks)})
        base = {k: v for k, v in row.items() if k != "completion" and not (task.is_agent and k == "prompt")}
        kept += [{**base, **written[sl][i], "reward": score[sl][i] if score[sl][i] == score[sl][i] else None}
                 for i in picks]
    n_mix = round(len(kept) * cfg.mix_ratio / (1 - cfg.mix_ratio)) if mix else 0
    if n_mix > len(mix):
        raise ValueError(f"mix_ratio {cfg.mix_ratio} needs {n_mix} rows from {cfg.mix_dataset}, which has {len(mix)}")
    rng = random.Random(cfg.seed)
    data = kept + rng.sample(mix, n_mix)
    rng.shuffle(data)
    out_dir = Path(cfg.output_dir)
    write_jsonl(data, out_dir / "data.jsonl")
    write_jsonl(per_prompt, out_dir / "per_prompt.jsonl")
    stats = {"prompts": len(rows), "samples": len(rows) * cfg.n,
             "acceptance_rate": sum(p["accepted"] for p in per_prompt) / len(per_prompt),
             "prompts_with_a_verified_sample": sum(p["kept"] > 0 for p in per_prompt) / len(per_prompt),
             "rows_kept": len(kept), "rows_mixed_in": n_mix, "data": str(out_dir / "data.jsonl")}
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats
