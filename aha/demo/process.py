"""`aha demo process`: does step-level credit help? The embedded default's task and budget, with the reward
reaching the tokens in one of four ways (`credit`):

    outcome   answer and format only (math 1.0, format 0.1)
    scalar    plus the share of right column sums as one number per completion (weight 0.5): the embedded
              default's own rewards, so every token of a completion gets the same push
    steps     plus each column sum as a step reward (weight 0.5) under grpo_process (DeepSeekMath's process
              supervision): a wrong column lowers the tokens up to it, not the ones after
    prm       as steps, with a learned PRM's step scores (prm_model) in place of the rule

build a model in code -> cold start (or `sft_model`: arms of one seed share it) -> GRPO -> held-out greedy
accuracy before and after, demo.png, summary.json (with `credit`), verdicts.json (each held-out problem's greedy
verdict before and after). benchmarks/process_rewards.py runs the grid.
"""

from __future__ import annotations

import json
import time

from ..config import DemoConfig
from .default import cold_start, given_model, held_out, report, start, train_grpo

STEP_WEIGHT = 0.5
"""Weight of the column-sum reward in every arm that has one (the embedded default's)."""


def credit(cfg: DemoConfig, task) -> tuple[list, dict]:
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
    from ..models.tiny import make_tiny
    from ..tasks import get_task, task_corpus

    t0 = time.perf_counter()
    out = start(cfg)
    task = get_task("arithmetic")
    train = task.load("train", 6000, cfg.seed)
    test = task.load("test", cfg.eval_problems, cfg.seed)
    rewards, settings = credit(cfg, task)  # a bad setting fails before any training

    if cfg.sft_model:
        sft_dir, sft_steps = given_model(cfg.sft_model, "sft_model"), 0
    else:
        base = make_tiny(out / "base", task_corpus(train), size=cfg.size, seed=cfg.seed)
        sft_dir, sft_steps = cold_start(cfg, out, base, task, train)
    before = held_out(cfg, task, test, sft_dir)
    grpo_dir = train_grpo(cfg, out, sft_dir, task, train, rewards, test, **settings)
    after = held_out(cfg, task, test, grpo_dir)
    # each held-out problem's greedy verdict before and after, for the paired difference between arms
    (out / "verdicts.json").write_text(json.dumps({"sft": before["correct"], "grpo": after["correct"]}))
    return report(out, before, after, len(test), cfg, grpo_dir, time.perf_counter() - t0, sft_steps,
                  credit=cfg.credit, sft_model=str(sft_dir))
