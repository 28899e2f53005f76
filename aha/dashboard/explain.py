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
MAX_TOKENS = 64
"""Longest completion in the token-level loss explorer."""


class BadInput(ValueError):
    """A request the explainer refuses (answered with 400 and the message)."""


def _number(body: dict, key: str, lo: float, hi: float, default: float | None = None) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not lo <= value <= hi:
        raise BadInput(f"{key} must be a number in [{lo}, {hi}], got {value!r}")
    return float(value)


def _floats(t: torch.Tensor) -> list[float]:
    return [round(float(v), 6) for v in t.reshape(-1).tolist()]


ADVANTAGE_FORMULAS = {
    "grpo": "A_i = (r_i - mean(r)) / (std(r) + eps)   [mean, std over the group]",
    "dr_grpo": "A_i = r_i - mean(r)   [no division: no bias toward easy or hard prompts]",
    "batch": "A_i = (r_i - mean(r)) / (std over the batch of (r_j - mean of j's group) + eps)",
    "batch_rewards": "A_i = (r_i - mean(r)) / (std over the batch of r_j + eps)   [TRL's scale_rewards=\"batch\"]",
    "rloo": "A_i = r_i - mean of the group's other rewards   [leave-one-out baseline]",
    "grpo_process": "A_i = (r_i - mean(r)) / (std(r) + eps)   [one step per answer, its outcome: grpo; with step "
                    "rewards each token sums the steps ending at or after it]",
    "gdpo": "A_i = (r_i - mean over the batch of r_j) / (std over the batch of r_j + eps)   [GDPO: after each "
            "function's rewards are normalised in their group and summed (normalize_then_sum)]",
    "gigpo": "A_i = (r_i - mean(r)) / (std(r) + eps), + omega * A_S on an agent's turn   [GiGPO: A_S is grpo's "
             "over the discounted returns of the turns that act from one anchor state; between outcome supervision "
             "(one value per episode) and process supervision (one per step): credit per turn, no step reward needed]",
}
"""How each estimator of algos.ADVANTAGES reads, for the page (the code that computes it is in algos)."""


def doc(fn) -> str:
    """The first paragraph of a function's docstring, on one line."""
    return " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())


def _rewards(values, what: str) -> list[float]:
    if not isinstance(values, list) or not 2 <= len(values) <= MAX_GROUP:
        raise BadInput(f"{what} must be a list of 2 to {MAX_GROUP} numbers")
    return [_number({"r": v}, "r", -1e6, 1e6) for v in values]


def advantages(body: dict) -> dict:
    """A group's rewards -> mean, std and the advantages under every registered estimator (algos.ADVANTAGES),
    with each estimator's formula and docstring. `other`: a second group of the same size in the batch, which
    the batch-wide estimators (batch, batch_rewards) read too."""
    r = _rewards(body.get("rewards"), "rewards")
    other = _rewards(body["other"], "other") if body.get("other") else []
    if other and len(other) != len(r):
        raise BadInput(f"the other group must have as many rewards as this one ({len(r)}), got {len(other)}")
    G = len(r)
    batch = torch.tensor(r + other, dtype=torch.float32)             # [B*G], B = 1 or 2
    stats = algos.group_stats(batch[:G], G)
    got = {name: algos.compute_advantages(name, batch, G)[0] for name in sorted(algos.ADVANTAGES)}  # [B*G]
    return {"mean": round(float(stats.mean), 6), "std": round(float(stats.std), 6), "eps": algos.ADV_EPS,
            "advantages": {n: _floats(a[:G]) for n, a in got.items()},
            "other_advantages": {n: _floats(a[G:]) for n, a in got.items()} if other else None,
            "about": {n: {"formula": ADVANTAGE_FORMULAS.get(n, ""), "doc": doc(algos.ADVANTAGES[n])} for n in got}}


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
    out: dict = {"ratio": round(float(r), 6), "grid": _floats(grid), "by_advantage": {},
                 "clip_range": [round(1 - eps, 6), round(1 + eps_high, 6)]}
    for name, adv in (("positive", 1.0), ("negative", -1.0)):
        value, clip = _objective(r, adv, eps, eps_high)
        curve, _ = _objective(grid, adv, eps, eps_high)
        out["by_advantage"][name] = {"advantage": adv, "objective": round(float(value[0]), 6),
                                     "unclipped": round(float(r[0]) * adv, 6),
                                     "clipped": bool(clip["clip/high"][0] or clip["clip/low"][0]),
                                     "curve": _floats(curve)}
    return out


def _finite(values: list[float]) -> list[float | None]:
    """JSON has no infinity: an infinite KL (a reference that gives the other outcome probability 0) is None."""
    return [v if math.isfinite(v) else None for v in values]


def _two_outcomes(name: str, p: torch.Tensor, p_ref: torch.Tensor) -> torch.Tensor:
    """E over x ~ pi of estimator `name`, for one token as two outcomes (this token, with probability p, or any
    other, 1 - p) against the reference's (p_ref, 1 - p_ref); for k1 (and k3) this is the true KL. p, p_ref: [T]."""
    probs = torch.stack([p, 1 - p], -1)                               # [T,2]
    refs = torch.stack([p_ref, 1 - p_ref], -1)                        # [T,2]
    with torch.no_grad():
        k = algos.kl_penalty(name, torch.log(probs), torch.log(refs))  # [T,2]
    return torch.where(probs > 0, probs * k, torch.zeros_like(k)).sum(-1)  # [T]


def kl(body: dict) -> dict:
    """pi and pi_ref of one token -> every registered KL estimator (algos.KL_ESTIMATORS) for the sampled token,
    its mean over both outcomes, the true KL of the two-outcome distributions (the mean of k1), and each over a
    grid of pi for the plot."""
    p = _number(body, "p", PROB_FLOOR, 1.0)
    p_ref = _number(body, "p_ref", PROB_FLOOR, 1.0)
    grid = torch.tensor([max(i / 100, PROB_FLOOR) for i in range(1, 101)], dtype=torch.float64)  # [T]
    logp = torch.log(torch.tensor([[p]], dtype=torch.float64))
    ref = torch.log(torch.tensor([[p_ref]], dtype=torch.float64))
    one, ref_one = torch.tensor([p], dtype=torch.float64), torch.tensor([p_ref], dtype=torch.float64)
    out: dict = {"grid": _floats(grid), "values": {}, "curves": {}, "expected": {}}
    for name in sorted(algos.KL_ESTIMATORS):
        out["values"][name] = round(float(algos.kl_penalty(name, logp, ref)), 6)
        curve = algos.kl_penalty(name, torch.log(grid).unsqueeze(0), ref.expand(1, len(grid)))
        out["curves"][name] = _floats(curve)
        out["expected"][name] = _finite(_floats(_two_outcomes(name, one, ref_one)))[0]
    out["true_kl"] = _finite(_floats(_two_outcomes("k1", one, ref_one)))[0]
    out["true_curve"] = _finite(_floats(_two_outcomes("k1", grid, ref_one.expand(len(grid)))))
    out["about"] = {name: doc(algos.KL_ESTIMATORS[name]) for name in sorted(algos.KL_ESTIMATORS)}
    return out


SURROGATE_RATIOS = [0.5, 0.8, 1.0, 1.2, 1.5, 2.0]
"""Ratios pi/pi_old at which the loss explainer shows each surrogate's weight."""


def _surrogates(epsilon: float, epsilon_high: float, eps_max: float) -> dict:
    """Each surrogate of algos.SURROGATES: the weight the objective (minus its loss) puts on grad log pi of a token at
    each of SURROGATE_RATIOS, for A = +1 and A = -1, by autograd through algos.policy_loss (each ratio a one-token
    sequence, so VESPO's sequence weight is that token's), and its docstring. epsilon_high is the clip's upper offset
    (ratio <= 1 + epsilon_high) and cispo's cap on the ratio itself (its eps_max): the page sets them apart."""
    ratios = torch.tensor(SURROGATE_RATIOS, dtype=torch.float64)
    old = torch.zeros(len(ratios), 1, dtype=torch.float64)                               # [R,1] pi_old = 1
    out: dict = {"ratios": SURROGATE_RATIOS}
    for name in sorted(algos.SURROGATES):
        row = {"doc": doc(algos.SURROGATES[name])}
        for label, adv in (("positive", 1.0), ("negative", -1.0)):
            logp = torch.log(ratios).unsqueeze(-1).requires_grad_(True)                # [R,1]
            loss, _ = algos.policy_loss(logp, old, torch.full((len(ratios),), adv, dtype=torch.float64),
                                        torch.ones_like(old), epsilon, eps_max if name == "cispo" else epsilon_high,
                                        surrogate=name)                                  # [R,1]
            (grad,) = torch.autograd.grad(loss.sum(), logp)                            # [R,1]
            row[label] = _floats(-grad)
        out[name] = row
    return out


def aggregation(body: dict) -> dict:
    """A short and a long completion in one batch -> for each loss aggregation (algos.AGGREGATIONS, loss_type) the
    weight of every token in the loss, d(loss)/d(token loss), taken by autograd through algos.aggregate; beside it
    each surrogate's weight per ratio (`_surrogates`) and each TRL loss_type's (surrogate, aggregation) pair."""
    short = int(_number(body, "short", 1, MAX_TOKENS, 4))
    long = int(_number(body, "long", 1, MAX_TOKENS, 16))
    max_len = int(_number(body, "max_len", max(short, long), 4 * MAX_TOKENS, max(short, long, 32)))
    mask = torch.zeros(2, max(short, long), dtype=torch.float64)     # [N=2,T]
    mask[0, :short], mask[1, :long] = 1, 1
    out: dict = {"max_len": max_len, "by_loss_type": {}}
    for name in sorted(algos.AGGREGATIONS):
        w = torch.ones_like(mask, requires_grad=True)                 # [N,T] token losses (the rule is linear)
        (grad,) = torch.autograd.grad(algos.aggregate(name, w, mask, max_len=max_len), w)  # [N,T]
        out["by_loss_type"][name] = {
            "short": _floats(grad[0, :short]), "long": _floats(grad[1, :long]),
            "total": {"short": round(float(grad[0].sum()), 6), "long": round(float(grad[1].sum()), 6)},
            "doc": doc(algos.AGGREGATIONS[name])}
    eps = _number(body, "epsilon", 0.01, 0.99, 0.2)
    out["surrogates"] = _surrogates(eps, _number(body, "epsilon_high", 0.01, 5.0, 0.28),
                                    _number(body, "eps_max", 1.0, 10.0, 5.0))
    out["loss_types"] = {name: t._asdict() for name, t in sorted(algos.LOSS_TYPES.items())}
    return out
