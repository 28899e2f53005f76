"""The Learn page's "run it in your browser" toy: one GRPO update of a toy softmax policy over six completions of
one prompt, by aha's own pieces (algos' advantages, clipped surrogate, KL and aggregation, then the trainer's
AdamW and optimizer step from train/loop.py), so what the page shows is what aha's update does.

The policy is six logits, one per completion; the group is those six completions, each once (a real group is
sampled from the policy). The page keeps no number of its own: it sends back the state this module returned
(logits and AdamW's moments) for the next update.
"""

from __future__ import annotations

import math

import torch

from .. import algos
from .explain import BadInput, _floats, _number

COMPLETIONS = ("<think>6*7 = 42</think><answer>42</answer>", "<answer>42</answer>",
               "<think>6*7 = 6+7 = 13</think><answer>13</answer>", "42, because 6*7 = 42",
               "<think>6*7 = 48</think><answer>48</answer>", "I am not sure.")
"""The six completions of the prompt "What is 6*7?" (labels only: the policy is one logit per completion)."""
PROMPT = "What is 6*7? Think in <think>, answer in <answer>."
START_PROBS = (0.10, 0.10, 0.25, 0.10, 0.25, 0.20)
"""The starting policy, which is also the reference for the KL term."""
START_REWARDS = (1.0, 1.0, 0.0, 0.5, 0.0, 0.0)
MAX_LOGIT = 50.0
"""Bound on a logit sent back by the page."""
MAX_PASSES = 8
"""Most optimizer steps on one group (num_iterations)."""


def _vector(body: dict, key: str, lo: float, hi: float) -> torch.Tensor:
    values = body.get(key)
    if not isinstance(values, list) or len(values) != len(COMPLETIONS):
        raise BadInput(f"{key} must be a list of {len(COMPLETIONS)} numbers")
    return torch.tensor([_number({key: v}, key, lo, hi) for v in values], dtype=torch.float32)


def _state(body: dict) -> tuple[torch.Tensor, dict | None]:
    """The logits and AdamW state the page sent back; the starting policy when it sent none."""
    state = body.get("state")
    if not state:
        return torch.log(torch.tensor(START_PROBS)), None
    if not isinstance(state, dict):
        raise BadInput("state must be what the last answer returned")
    logits = _vector(state, "logits", -MAX_LOGIT, MAX_LOGIT)
    adam = {k: _vector(state, k, -1e6, 1e6) for k in ("exp_avg", "exp_avg_sq")}
    if (adam["exp_avg_sq"] < 0).any():
        raise BadInput("exp_avg_sq must be >= 0")
    adam["step"] = torch.tensor(_number(state, "step", 0, 1e6))
    return logits, adam


def _settings(body: dict):
    """The GRPOConfig of the toy update (validated there) and the advantage estimator."""
    from ..config import GRPOConfig
    estimator, loss_type = body.get("estimator", "grpo"), body.get("loss_type", "dapo")
    if estimator not in algos.ADVANTAGES or loss_type not in algos.AGGREGATIONS:
        raise BadInput(f"estimator must be one of {sorted(algos.ADVANTAGES)}, "
                       f"loss_type one of {sorted(algos.AGGREGATIONS)}")
    return GRPOConfig(learning_rate=_number(body, "learning_rate", 1e-4, 2.0, 0.1),
                      epsilon=_number(body, "epsilon", 0.01, 0.9, 0.2), beta=_number(body, "beta", 0.0, 1.0, 0.0),
                      num_iterations=int(_number(body, "passes", 1, MAX_PASSES, 1)), loss_type=loss_type,
                      advantage_estimator=estimator, output_dir="toy"), estimator


def _loss(policy: torch.nn.Module, old: torch.Tensor, ref: torch.Tensor, adv: torch.Tensor, cfg):
    """The learner's loss for six one-token completions: clipped surrogate, + beta * KL, aggregated."""
    logp = torch.log_softmax(policy.logits, -1).unsqueeze(-1)          # [N=6,T=1]
    mask = torch.ones_like(logp)                                       # [N,T]
    loss_tok, clip = algos.policy_loss(logp, old, adv, mask, cfg.epsilon, cfg.epsilon_high)  # [N,T]
    if cfg.beta > 0:
        loss_tok = loss_tok + cfg.beta * algos.kl_penalty(cfg.kl_estimator, logp, ref)      # [N,T]
    return algos.aggregate(cfg.loss_type, loss_tok, mask), clip


def update(body: dict) -> dict:
    """rewards [6], the returned state and the settings -> advantages, the policy before and after one GRPO
    update (`passes` optimizer steps on the group, as num_iterations), and the state for the next one.
    With apply=false: the policy and advantages only, nothing stepped."""
    rewards = _vector(body, "rewards", -10.0, 10.0)                    # [N]
    logits, adam = _state(body)
    cfg, estimator = _settings(body)
    adv, _ = algos.compute_advantages(estimator, rewards, len(COMPLETIONS))  # [N]
    before = torch.softmax(logits, -1)                                 # [N]
    out = {"prompt": PROMPT, "completions": list(COMPLETIONS), "advantages": _floats(adv), "before": _floats(before)}
    if body.get("apply") is False:
        return {**out, "state": None}
    new, state, losses, clipped = _step(logits, adam, adv, cfg)
    after = torch.softmax(new, -1)                                     # [N]
    return {**out, "after": _floats(after), "change": _floats(after - before), "loss": losses, "clipped": clipped,
            "state": {"logits": _floats(new), "exp_avg": _floats(state["exp_avg"]),
                      "exp_avg_sq": [float(v) for v in state["exp_avg_sq"].tolist()], "step": float(state["step"])}}


def _step(logits: torch.Tensor, adam: dict | None, adv: torch.Tensor, cfg):
    """`cfg.num_iterations` optimizer steps on the group, the old log-probs fixed at the first pass's; returns the
    new logits, AdamW's state for them, and each pass's loss and number of clipped completions."""
    from ..train.loop import build_optimizer, optimizer_step
    policy = torch.nn.Module()
    policy.logits = torch.nn.Parameter(logits.clone())
    opt, sched = build_optimizer(cfg, policy, total_steps=1)
    if adam is not None:
        opt.state[policy.logits] = {k: v.clone() for k, v in adam.items()}
    ref = torch.log(torch.tensor(START_PROBS)).unsqueeze(-1)           # [N,1]
    old = torch.log_softmax(logits, -1).unsqueeze(-1)                  # [N,1]
    losses, clipped = [], []
    for _ in range(cfg.num_iterations):
        loss, clip = _loss(policy, old, ref, adv, cfg)
        loss.backward()
        value = float(loss.detach())
        optimizer_step(cfg, policy, opt, sched, value)
        losses.append(round(value, 6) if math.isfinite(value) else None)
        clipped.append(int((clip["clip/low"] + clip["clip/high"]).sum()))
    return policy.logits.detach(), opt.state[policy.logits], losses, clipped
