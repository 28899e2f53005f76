"""What every training loop shares: the step loop, prompt order, optimizer, logging, evaluation, checkpoints."""

from __future__ import annotations

import abc
import logging
import random
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..config import TrainConfig, save_config
from ..metrics import make_logger
from ..models import save_model
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

log = logging.getLogger("aha.train")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_optimizer(cfg: TrainConfig, model, total_steps: int):
    """AdamW over trainable parameters, warmup then constant/cosine/linear."""
    from transformers import get_scheduler
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            weight_decay=cfg.weight_decay)
    name = {"constant": "constant_with_warmup"}.get(cfg.lr_scheduler_type, cfg.lr_scheduler_type)
    sched = get_scheduler(name, opt, num_warmup_steps=cfg.warmup_steps,
                          num_training_steps=max(total_steps, 1))
    return opt, sched


def optimizer_step(cfg: TrainConfig, model, opt, sched) -> float:
    """Clip, step, schedule, zero; returns the pre-clip gradient norm.

    Gradients are zeroed to tensors, not None, so AdamW moves every parameter on every step even
    when a skipped batch left its gradient at 0 (as if the zero loss had been backpropagated).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf"))
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=False)
    return float(norm)


class PromptSampler:
    """Walks seeded per-epoch permutations of the dataset; its position is two integers."""

    def __init__(self, n: int, seed: int, epoch: int = 0, index: int = 0):
        self.n, self.seed, self.epoch, self.index = n, seed, epoch, index
        self._perm = self._permutation()

    def _permutation(self) -> list[int]:
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.index == self.n:
                self.epoch, self.index = self.epoch + 1, 0
                self._perm = self._permutation()
            out.append(self._perm[self.index])
            self.index += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}


class Trainer(abc.ABC):
    """Subclasses set model, tokenizer, optimizer, scheduler, sampler, generator and define step()."""

    args: TrainConfig
    headline: dict[str, tuple[str, str]] = {"loss": ("loss", "{:.3f}")}
    """Progress-bar label -> (metric, format)."""

    def __init__(self, args: TrainConfig, eval_fn: Callable[[object, object], dict] | None):
        self.args = args
        self.run_dir = Path(args.output_dir)
        self.eval_fn = eval_fn
        self.step_count = 0
        self.generator = torch.Generator().manual_seed(args.seed)

    @abc.abstractmethod
    def step(self) -> dict[str, float]:
        """One training step; returns its metrics."""

    def after_step(self, metrics: dict[str, float], bar) -> None:
        """Hook for per-step extras (GRPO logs sample completions here)."""

    def train(self, resume_from_checkpoint: str | bool | None = None) -> dict[str, float]:
        """Run to `max_steps`; resume from a checkpoint dir, or True for the latest in output_dir."""
        from tqdm.auto import tqdm
        a = self.args
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(a, self.run_dir / "config.yaml")
        resume = resume_from_checkpoint if resume_from_checkpoint is not None else a.resume
        if resume:
            path = latest_checkpoint(self.run_dir) if resume is True else Path(resume)
            if path is None:
                raise FileNotFoundError(f"resume requested but no complete checkpoint in {self.run_dir}")
            self._restore(path)
        logger = make_logger(a.report_to, self.run_dir)
        bar = tqdm(total=self.max_steps, initial=self.step_count, desc=type(self).__name__,
                   disable=not a.progress_bar, dynamic_ncols=True)
        metrics: dict[str, float] = {}
        if self.eval_fn and a.eval_steps and self.step_count == 0:  # the starting point of the curve
            logger.log(0, {f"eval/{k}": v for k, v in self.eval_fn(self.model, self.tokenizer).items()})
        try:
            while self.step_count < self.max_steps:
                metrics = self.step()
                self.step_count += 1
                last = self.step_count == self.max_steps
                if self.eval_fn and a.eval_steps and (self.step_count % a.eval_steps == 0 or last):
                    metrics.update({f"eval/{k}": v for k, v in self.eval_fn(self.model, self.tokenizer).items()})
                if self.step_count % a.logging_steps == 0 or last:
                    logger.log(self.step_count, metrics)
                self.after_step(metrics, bar)
                if a.save_steps and self.step_count % a.save_steps == 0:
                    self.save_checkpoint()
                bar.set_postfix({label: f.format(metrics[k]) for label, (k, f) in self.headline.items()
                                 if k in metrics}, refresh=False)
                bar.update(1)
        finally:
            bar.close()
            logger.close()
        self.save_checkpoint()
        return metrics

    @property
    def max_steps(self) -> int:
        return self.args.max_steps

    def _state(self) -> dict:
        return {"step": self.step_count, "sampler": self.sampler.state(),
                "generator": self.generator.get_state()}

    def save_checkpoint(self) -> Path:
        return save_checkpoint(self.run_dir, self.step_count, self.model, self.optimizer, self.scheduler,
                               self._state(), self.args.save_total_limit)

    def _restore(self, path: Path) -> None:
        state = load_checkpoint(path, self.model, self.optimizer, self.scheduler)
        self.step_count = state["step"]
        self.sampler = PromptSampler(self.sampler.n, self.args.seed, **state["sampler"])
        self.generator.set_state(state["generator"])
        log.info("resumed from %s at step %d", path, self.step_count)

    def save_model(self, output_dir: str | Path | None = None) -> Path:
        """Save in Hugging Face format (LoRA merged unless save_merged=false)."""
        return save_model(self.model, self.tokenizer, output_dir or self.run_dir / "model",
                          merge_lora=self.args.save_merged)
