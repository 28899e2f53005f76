"""The numbers of the Learn GRPO page, every one computed by aha.algos (the page shows them, never computes).

Inputs are checked and bounded here, since they come from a web page.
"""

from __future__ import annotations

import math

import torch

from .. import algos

MAX_GROUP = 16
"""Most rewards in the advantage explainer's group."""
RATIO_GRID = [i / 50 for i in range(0, 126)]
"""Ratios 0 .. 2.5 at which the clipped objective is drawn."""
PROB_FLOOR = 1e-6
"""Probabilities from the page are clamped to [PROB_FLOOR, 1] before their log is taken."""


class BadInput(ValueError):
    """A request the explainer refuses (answered with 400 and the message)."""


def _number(body: dict, key: str, lo: float, hi: float, default: float | None = None) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not lo <= value <= hi:
        raise BadInput(f"{key} must be a number in [{lo}, {hi}], got {value!r}")
    return float(value)


def _floats(t: torch.Tensor) -> list[float]:
    return [round(float(v), 6) for v in t.reshape(-1).tolist()]


def advantages(body: dict) -> dict:
    """A group's rewards -> mean, std and the advantages under every registered estimator (algos.ADVANTAGES)."""
    rewards = body.get("rewards")
    if not isinstance(rewards, list) or not 2 <= len(rewards) <= MAX_GROUP:
        raise BadInput(f"rewards must be a list of 2 to {MAX_GROUP} numbers")
    r = torch.tensor([_number({"r": v}, "r", -1e6, 1e6) for v in rewards], dtype=torch.float32)  # [G]
    G = len(rewards)
    stats = algos.group_stats(r, G)
    out = {name: _floats(algos.compute_advantages(name, r, G)[0]) for name in sorted(algos.ADVANTAGES)}
    return {"mean": round(float(stats.mean), 6), "std": round(float(stats.std), 6), "eps": algos.ADV_EPS,
            "advantages": out}


def _objective(ratios: torch.Tensor, adv: float, epsilon: float, epsilon_high: float) -> tuple[torch.Tensor, dict]:
    """The clipped surrogate objective (minus algos.policy_loss) at each ratio, one token per ratio."""
    logp = torch.log(ratios).unsqueeze(0)                             # [1,T]
    loss, clip = algos.policy_loss(logp, torch.zeros_like(logp), torch.tensor([adv]), torch.ones_like(logp),
                                   epsilon, epsilon_high)             # [1,T]
    return -loss[0], {k: v[0] for k, v in clip.items()}


def ratio(body: dict) -> dict:
    """pi_old and pi_new of one token -> the ratio, and for A = +1 and A = -1 the clipped objective, whether
    the clip bites, and the objective over a grid of ratios (for the plot)."""
    p_old = _number(body, "p_old", PROB_FLOOR, 1.0)
    p_new = _number(body, "p_new", PROB_FLOOR, 1.0)
    eps = _number(body, "epsilon", 0.01, 0.99, 0.2)
    eps_high = _number(body, "epsilon_high", 0.01, 5.0, eps)
    r = torch.tensor([p_new / p_old], dtype=torch.float64)
    grid = torch.tensor([max(x, PROB_FLOOR) for x in RATIO_GRID], dtype=torch.float64)
    out: dict = {"ratio": round(float(r), 6), "grid": _floats(grid), "by_advantage": {}}
    for name, adv in (("positive", 1.0), ("negative", -1.0)):
        value, clip = _objective(r, adv, eps, eps_high)
        curve, _ = _objective(grid, adv, eps, eps_high)
        out["by_advantage"][name] = {"advantage": adv, "objective": round(float(value[0]), 6),
                                     "unclipped": round(float(r[0]) * adv, 6),
                                     "clipped": bool(clip["clip/high"][0] or clip["clip/low"][0]),
                                     "curve": _floats(curve)}
    return out


def kl(body: dict) -> dict:
    """pi and pi_ref of one token -> every registered KL estimator (algos.KL_ESTIMATORS), and each over a
    grid of pi for the plot."""
    p = _number(body, "p", PROB_FLOOR, 1.0)
    p_ref = _number(body, "p_ref", PROB_FLOOR, 1.0)
    grid = torch.tensor([max(i / 100, PROB_FLOOR) for i in range(1, 101)], dtype=torch.float64)  # [T]
    logp = torch.log(torch.tensor([[p]], dtype=torch.float64))
    ref = torch.log(torch.tensor([[p_ref]], dtype=torch.float64))
    out = {"grid": _floats(grid), "values": {}, "curves": {}}
    for name in sorted(algos.KL_ESTIMATORS):
        out["values"][name] = round(float(algos.kl_penalty(name, logp, ref)), 6)
        curve = algos.kl_penalty(name, torch.log(grid).unsqueeze(0), ref.expand(1, len(grid)))
        out["curves"][name] = _floats(curve)
    return out
