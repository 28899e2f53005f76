"""Each stage as one function of its config: what `aha <stage>` and the recipe call."""

from __future__ import annotations

import json
from pathlib import Path

from .data import load_rows


def _task(name):
    from .data.benchmarks import resolve_task
    return resolve_task(name) if name else None


def _eval_hook(task, cfg):
    if not (task and getattr(cfg, "eval_samples", 0) and "test" in task.splits):
        return None
    from .eval import make_eval_fn
    return make_eval_fn(task, task.load("test")[:cfg.eval_samples], getattr(cfg, "max_completion_length", None))


def run_grpo(cfg) -> dict:
    """GRPO from a GRPOConfig: data and rewards from `task` unless `dataset`/`reward_funcs` say otherwise."""
    from .train.grpo import GRPOTrainer
    task = _task(cfg.task)
    if cfg.dataset:
        data = load_rows(cfg.dataset, cfg.prompt_column)
    elif task:
        data = task.load("train")
    else:
        raise ValueError("GRPO needs training data: set `task` or `dataset`")
    if cfg.reward_funcs:
        rewards = cfg.reward_funcs
    elif task:
        rewards = task.rewards()
        if cfg.reward_weights is None and task.reward_weights:
            cfg.reward_weights = list(task.reward_weights)
    else:
        raise ValueError("GRPO needs reward functions: set `reward_funcs` or `task`")
    eval_fn = _eval_hook(task, cfg) if cfg.eval_steps else None
    trainer = GRPOTrainer(model=cfg.model, reward_funcs=rewards, args=cfg, train_dataset=data, eval_fn=eval_fn)
    metrics = trainer.train()
    trainer.save_model()
    return metrics


def run_sft(cfg) -> dict:
    """SFT from an SFTConfig: worked solutions of `task` (its `completion` column) or a JSONL."""
    from .train.sft import SFTTrainer
    task = _task(cfg.task)
    if cfg.dataset:
        data = load_rows(cfg.dataset, prompt_column=None)
    elif task:
        data = task.load("train")
    else:
        raise ValueError("SFT needs training data: set `task` or `dataset`")
    trainer = SFTTrainer(model=cfg.model, args=cfg, train_dataset=data)
    metrics = trainer.train()
    path = trainer.save_model()
    hook = _eval_hook(task, cfg)
    if hook:
        metrics.update({f"eval/{k}": v for k, v in hook(trainer.model, trainer.tokenizer).items()})
        (Path(cfg.output_dir) / "eval.json").write_text(json.dumps(metrics, indent=2))
    return {**metrics, "model_dir": str(path)}
