"""Step labels without human annotation, as Math-Shepherd makes them (Wang et al. 2024, "Math-Shepherd: Verify and
Reinforce LLMs Step-by-step without Human Annotations", hard estimation): a policy answers each prompt; each
answer is split into steps by a separator; from every step's prefix (the prompt and the steps so far) the policy
writes `num_continuations` continuations, and the step is good when at least one reaches the right answer. The
last step's label is whether the answer itself is right.

The output is TRL's stepwise-supervision format (`prompt` text, `completions` the steps, `labels` one bool per
step), what `aha prm` and TRL's PRMTrainer train on, plus `shares`: each step's share of right continuations
(Math-Shepherd's soft estimation; 1.0 or 0.0 for the last step).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .config import PRMLabelsConfig
from .data import encode_prompt, write_jsonl
from .fileio import atomic_write
from .rewards.prm import prompt_text, split_steps
from .sample import correct_flags, load_sampler, sample_texts, task_rows


def answers(rows: list[dict], texts: list[str], right: list[bool], n: int, separator: str) -> list[dict]:
    """The distinct answers of each row that have at least one step: {row, text, steps, right}, steps being
    aha.rewards.prm.split_steps's (text, end) pairs."""
    out = []
    for j in range(len(rows)):
        seen: set[str] = set()
        for i in range(j * n, (j + 1) * n):
            steps = split_steps(texts[i], separator)
            if steps and texts[i] not in seen:
                seen.add(texts[i])
                out.append({"row": j, "text": texts[i], "steps": steps, "right": right[i]})
    return out


def step_shares(sampler, task, cfg: PRMLabelsConfig, rows: list[dict], prompt_ids: list[list[int]],
                found: list[dict], gen) -> list[list[float]]:
    """Per answer, each step's share of right continuations (sampled from the prompt and that step's prefix of the
    answer); the last step's share is the answer's own rightness."""
    tok, k = sampler[0], cfg.num_continuations
    prefixes = [(i, a["text"][:end]) for i, a in enumerate(found) for _, end in a["steps"][:-1]]
    shares: list[list[float]] = [[] for _ in found]
    if prefixes:
        ids = [prompt_ids[found[i]["row"]] + tok(head, add_special_tokens=False)["input_ids"] for i, head in prefixes]
        texts, _ = sample_texts(sampler, task, ids, k, gen, cfg.progress_bar, "continuations",
                                heads=[head for _, head in prefixes])
        right = correct_flags(task, [rows[found[i]["row"]] for i, _ in prefixes], texts, k)
        for j, (i, _) in enumerate(prefixes):  # prompt-major: continuations j*k .. j*k+k-1 are prefix j's
            shares[i].append(sum(right[j * k:(j + 1) * k]) / k)
    return [share + [float(a["right"])] for share, a in zip(shares, found)]


def _id(row: dict) -> dict:
    """The row's id column, when it has one (to trace a labelled answer back to its problem)."""
    return {"id": row["id"]} if row.get("id") is not None else {}


def run_prm_labels(cfg: PRMLabelsConfig) -> dict:
    """Label the steps of sampled answers to `cfg.task` and write data.jsonl and stats.json to cfg.output_dir."""
    from .tasks import get_task
    from .train.prm import LABELS_STATS
    t0 = time.perf_counter()
    task = get_task(cfg.task)
    rows = task_rows(task, cfg)
    sampler = load_sampler(cfg, task)
    tok, gen = sampler[0], torch.Generator().manual_seed(cfg.seed)
    prompt_ids = [encode_prompt(tok, r["prompt"]) for r in rows]
    texts, _ = sample_texts(sampler, task, prompt_ids, cfg.n, gen, cfg.progress_bar, "answers")
    right = correct_flags(task, rows, texts, cfg.n)
    found = answers(rows, texts, right, cfg.n, cfg.step_separator)
    shares = step_shares(sampler, task, cfg, rows, prompt_ids, found, gen)
    data = [{"prompt": prompt_text(tok, rows[a["row"]]["prompt"]), "completions": [s for s, _ in a["steps"]],
             "labels": [v > 0 for v in share], "shares": share, **_id(rows[a["row"]])}
            for a, share in zip(found, shares)]
    if not data:
        raise ValueError(f"no answer of {cfg.model} to {len(rows)} prompts had a step (all empty): nothing to label")
    out_dir = Path(cfg.output_dir)
    write_jsonl(data, out_dir / "data.jsonl")
    labels = [v for r in data for v in r["labels"]]
    stats = {"prompts": len(rows), "answers": len(texts), "rows": len(data), "steps": len(labels),
             "good_step_share": sum(labels) / len(labels), "answer_accuracy": sum(right) / len(right),
             "continuations": (len(labels) - len(data)) * cfg.num_continuations, "step_separator": cfg.step_separator,
             "seconds": round(time.perf_counter() - t0, 1), "data": str(out_dir / "data.jsonl")}
    atomic_write(out_dir / LABELS_STATS, json.dumps(stats, indent=2))
    return stats
