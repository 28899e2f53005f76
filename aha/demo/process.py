"""`aha demo process`: does step-level credit help? The embedded default's task and budget, with the reward
reaching the tokens in one of four ways (`credit`):

    outcome   answer and format only (math 1.0, format 0.1)
    scalar    plus the share of right column sums as one number per completion (weight 0.5), so every token
              of a completion gets the same push (the embedded default also scores the answer's digits:
              tasks.arithmetic.worked_steps_reward)
    steps     plus each column sum as a step reward (weight 0.5) under grpo_process (DeepSeekMath's process
              supervision): a wrong column lowers the tokens up to it, not the ones after
    prm       as steps, with a learned PRM's step scores (prm_model) in place of the rule

build a model in code -> cold start (or `sft_model`: arms of one seed share it) -> GRPO -> held-out greedy
accuracy before and after, demo.png, summary.json (with `credit`), verdicts.json (each held-out problem's greedy
verdict before and after). benchmarks/process_rewards.py runs the grid.
"""

from __future__ import annotations

from ..config import DemoConfig
from . import default
from .default import given_model

DEFAULTS = default.DEFAULTS
"""The embedded default's task and budget."""
STEP_WEIGHT = 0.5
"""Weight of the column-sum reward in every arm that has one (the embedded default's process weight)."""


def credit(cfg: DemoConfig) -> tuple[list, dict]:
    """The reward functions and the GRPOConfig settings of `cfg.credit`."""
    from ..rewards import format_reward, math_reward
    from ..tasks.arithmetic import column_step_rewards, column_steps_reward
    outcome, weights = [math_reward, format_reward], [1.0, 0.1]
    if cfg.credit == "outcome":
        return outcome, {"reward_weights": weights}
    if cfg.credit == "scalar":
        return [*outcome, column_steps_reward], {"reward_weights": [*weights, STEP_WEIGHT]}
    if cfg.credit == "steps":
        return [*outcome, column_step_rewards], {"reward_weights": [*weights, STEP_WEIGHT],
                                                 "advantage_estimator": "grpo_process"}
    if not cfg.prm_model:
        raise ValueError("credit=prm needs prm_model: a PRM made by `aha prm_labels` and `aha prm` "
                         "(docs/process_rewards.md)")
    return outcome, {"reward_weights": weights, "advantage_estimator": "grpo_process",
                     "prm_model": str(given_model(cfg.prm_model, "prm_model")), "prm_weight": STEP_WEIGHT}


def run(cfg: DemoConfig) -> dict:
    rewards, settings = credit(cfg)  # a bad setting fails before any training
    return default.run(cfg, rewards, summary={"credit": cfg.credit}, **settings)
