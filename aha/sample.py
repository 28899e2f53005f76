"""Rejection sampling: n completions per prompt, keep the verified ones, write an SFT-ready JSONL.

A completion is verified when the task's correctness verifier gives it 1.0; its rank among the
verified ones uses the task's weighted rewards (then length for `shortest_correct`). A task with a base-model
template cuts each completion at the next turn label (`Task.stop`): that cut text is what is scored and written.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from .config import SampleConfig
from .data import encode_prompt, load_rows, write_jsonl

KEEP = ("best", "all_correct", "shortest_correct")


def select(texts: list[str], lengths: list[int], correct: list[bool], scores: list[float], keep: str) -> list[int]:
    """Indices of the completions to keep for one prompt (distinct texts only).

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
        return [max(ok, key=lambda i: (scores[i], -lengths[i]))]
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
    """(tokenizer, engine, sampling params) of a sampling stage (cfg: a GenerationConfig): cfg.model in an HFEngine
    decoding cfg.batch_size sequences at once, with the task's generation budget unless max_new_tokens says."""
    from .models import load_model, load_tokenizer
    from .rollout import HFEngine, SamplingParams
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tok, model = load_tokenizer(cfg.model), load_model(cfg.model, cfg.dtype)
    params = SamplingParams(cfg.temperature, cfg.top_p, 0, cfg.max_new_tokens or task.max_completion_length)
    return tok, HFEngine.for_model(model, tok, cfg.batch_size), params


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


def correct_flags(task, rows: list[dict], texts: list[str], n: int) -> list[bool]:
    """Whether each of n texts per row is right by the task's correctness verifier (texts prompt-major)."""
    from .eval import CORRECT_AT
    from .rewards import score_groups
    right, _ = score_groups([task.correct()], rows, texts, n)                     # [n*len(rows),1]
    return [bool(v >= CORRECT_AT) for v in right[:, 0].tolist()]


def run_sample(cfg: SampleConfig) -> dict:
    from .rewards import score_groups
    from .tasks import get_task

    task = get_task(cfg.task)
    mix = load_rows(cfg.mix_dataset, prompt_column=None) if cfg.mix_dataset else []
    rows = task_rows(task, cfg)
    sampler = load_sampler(cfg, task)
    gen = torch.Generator().manual_seed(cfg.seed)
    rewards = task.rewards()
    weights = torch.tensor(task.reward_weights or [1.0] * len(rewards))
    kept, per_prompt = [], []
    prompts = [encode_prompt(sampler[0], r["prompt"]) for r in rows]
    texts, out = sample_texts(sampler, task, prompts, cfg.n, gen, cfg.progress_bar)
    right = correct_flags(task, rows, texts, cfg.n)
    values, _ = score_groups(rewards, rows, texts, cfg.n)                         # [n*len(rows),F]
    score = torch.nan_to_num(values, nan=0.0) @ weights                             # [n*len(rows)]
    for j, row in enumerate(rows):
        sl = slice(j * cfg.n, (j + 1) * cfg.n)
        ok = right[sl]
        picks = select(texts[sl], [len(c) for c in out.completion_ids[sl]], ok, score[sl].tolist(), cfg.keep)
        per_prompt.append({"id": row.get("id"), "accepted": sum(ok) / cfg.n, "kept": len(picks)})
        base = {k: v for k, v in row.items() if k != "completion"}
        kept += [{**base, "completion": texts[sl][i], "reward": float(score[sl][i])} for i in picks]
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

