"""The Learn page's outcome-versus-process explainer: one group of worked answers to "47+385", each scored per
column step (aha's own `column_step_rewards`) and on its final answer (`math_reward`), and every token's
advantage under outcome supervision (algos.compute_advantages "grpo") and under process supervision
(algos.process_advantages). The page may send other scores (a step toggled right or wrong); the numbers are
always aha.algos' own.
"""

from __future__ import annotations

import torch

from .. import algos
from .explain import BadInput, _floats, _number, doc

QUESTION, GOLD = "47+385", "432"
PIECES = (
    ("<think>", "7+5=12", " 4+8+1=13", " 0+3+1=4", "</think><answer>", "432", "</answer>"),
    ("<think>", "7+5=12", " 4+8=12", " 0+3+1=4", "</think><answer>", "432", "</answer>"),
    ("<think>", "7+5=12", " 4+8+1=13", " 0+3+1=4", "</think><answer>", "423", "</answer>"),
    ("<think>", "7+5=12", " 4+8=12", " 0+3=3", "</think><answer>", "322", "</answer>"),
)
"""The group (G = 4), each completion as its tokens: every column right; a dropped carry in the middle step but
the right answer; every column right but the answer miscopied; the carry forgotten, so a wrong answer."""
MAX_SCORE = 10.0
"""Bound on a score sent by the page."""


class _Pieces:
    """A tokenizer over the example's pieces (token id k is piece k), for rewards.steps.step_tokens."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.pieces[k] for k in ids)


def _default_scores() -> tuple[list[list[float]], list[float], list[list[int]]]:
    """The example's step scores, outcome scores and step ends (characters), by the arithmetic task's rewards."""
    from ..rewards import math_reward
    from ..tasks.arithmetic import column_step_rewards
    texts = ["".join(p) for p in PIECES]
    steps = column_step_rewards([QUESTION] * len(texts), texts, question=[QUESTION] * len(texts))
    outcomes = math_reward([QUESTION] * len(texts), texts, answer=[GOLD] * len(texts))
    return [[s for _, s in st] for st in steps], [float(o) for o in outcomes], [[e for e, _ in st] for st in steps]


def _scores(body: dict, default: list, what: str) -> list:
    """The page's scores shaped like `default` (a list of numbers, or of lists of numbers), each in bounds."""
    got = body.get(what, default)
    flat = isinstance(default[0], float)
    sizes = ", ".join(str(len(d)) for d in default) if not flat else ""
    shape = f"{len(default)} numbers" if flat else f"{len(default)} lists of {sizes} numbers"
    if not isinstance(got, list) or len(got) != len(default) or not flat and any(
            not isinstance(g, list) or len(g) != len(d) for g, d in zip(got, default)):
        raise BadInput(f"{what} must be {shape} (one per completion{'' if flat else ', one per step'})")
    if flat:
        return [_number({what: v}, what, -MAX_SCORE, MAX_SCORE) for v in got]
    return [[_number({what: v}, what, -MAX_SCORE, MAX_SCORE) for v in g] for g in got]


def outcome_vs_process(body: dict) -> dict:
    """Step scores (G lists, one per step) and outcome scores (G numbers; default: the arithmetic task's rewards)
    -> each completion's tokens, steps (end token, score, normalised reward) and per-token advantage under outcome
    and process supervision, and the pool (the group's steps and outcomes) they are normalised over."""
    default_steps, default_outcomes, ends = _default_scores()
    steps, outcomes = _scores(body, default_steps, "steps"), _scores(body, default_outcomes, "outcomes")
    from ..rewards.steps import step_tokens
    G, T = len(PIECES), max(len(p) for p in PIECES)
    tokens = [step_tokens(_Pieces(p), list(range(len(p))), e) for p, e in zip(PIECES, ends)]
    last = torch.tensor([len(p) - 1 for p in PIECES])                 # [N] the outcome's token
    seq = torch.tensor([i for i, st in enumerate(steps) for _ in st], dtype=torch.long)  # [S]
    outcome = torch.tensor(outcomes)                                  # [N]
    process, _ = algos.process_advantages(outcome, last, seq, torch.tensor([t for ts in tokens for t in ts]),
                                          torch.tensor([s for st in steps for s in st]), T, G)  # [N,T]
    per_answer, _ = algos.compute_advantages("grpo", outcome, G)      # [N]
    pool = torch.tensor(outcomes + [s for st in steps for s in st])   # [G+S] the group's one pool
    stats = algos.group_stats(pool, pool.numel())
    norm = _floats(algos.compute_advantages("grpo", pool, pool.numel())[0])  # [G+S] each reward, normalised
    out, k = [], G
    for i, pieces in enumerate(PIECES):
        step_list = [{"end": e, "token": t, "score": s, "normalised": norm[k + j]}
                     for j, (e, t, s) in enumerate(zip(ends[i], tokens[i], steps[i]))]
        k += len(steps[i])
        out.append({"pieces": list(pieces), "steps": step_list,
                    "outcome": {"token": len(pieces) - 1, "score": outcomes[i], "normalised": norm[i]},
                    "outcome_advantage": _floats(per_answer[i].expand(len(pieces))),
                    "process_advantage": _floats(process[i, :len(pieces)])})
    return {"question": QUESTION, "answer": GOLD, "eps": algos.ADV_EPS, "completions": out,
            "pool": {"size": pool.numel(), "mean": round(float(stats.mean), 6), "std": round(float(stats.std), 6)},
            "about": doc(algos.process_advantages)}
