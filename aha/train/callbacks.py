"""transformers `TrainerCallback` objects driven by aha's loop, so callbacks written for TRL's trainer work:
the same events, a `TrainerState` (global_step, max_steps, log_history) and a `TrainerControl` whose
`should_training_stop` ends the run after the current step; and what a TRL script does with `train()`'s result
(`TrainOutput`, `log_metrics`, `save_metrics`), as transformers does it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class TrainOutput(dict):
    """What `train()` returns: the last step's metrics, a dict as aha has always returned, with transformers'
    TrainOutput fields beside them: `global_step`, `training_loss` (the mean loss of the steps this call trained;
    NaN when none had one) and `metrics` (train_runtime, train_steps_per_second, train_loss)."""

    def __init__(self, last: dict[str, float], global_step: int, losses: list[float], seconds: float, steps: int):
        super().__init__(last)
        finite = [x for x in losses if x is not None and math.isfinite(x)]
        self.global_step = global_step
        self.training_loss = sum(finite) / len(finite) if finite else math.nan
        self.metrics = {"train_runtime": round(seconds, 4), "train_steps_per_second": round(steps / max(seconds, 1e-9), 3),
                        "train_loss": self.training_loss}


def format_metrics(split: str, metrics: dict[str, Any]) -> str:
    """transformers' `log_metrics` text: a header, then each metric sorted by name, names aligned."""
    width = max((len(k) for k in metrics), default=0)
    return "\n".join([f"***** {split} metrics *****"] + [f"  {k:<{width}} = {v}" for k, v in sorted(metrics.items())])


def save_metrics(run_dir: Path, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
    """transformers' `save_metrics`: `{split}_results.json`, and with `combined` the metrics merged into
    `all_results.json`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"{split}_results.json").write_text(json.dumps(metrics, indent=4, sort_keys=True) + "\n")
    if combined:
        path = run_dir / "all_results.json"
        merged = {**(json.loads(path.read_text()) if path.is_file() else {}), **metrics}
        path.write_text(json.dumps(merged, indent=4, sort_keys=True) + "\n")


class Callbacks:
    """Sends the loop's events to each callback that defines them."""

    def __init__(self, callbacks: list | None, args: Any, max_steps: int):
        from transformers import TrainerControl, TrainerState
        self.callbacks = list(callbacks or [])
        self.args = args
        self.state = TrainerState(max_steps=max_steps, global_step=0)
        self.control = TrainerControl()

    def fire(self, event: str, step: int, model, **kwargs: Any) -> None:
        """Call `event` (on_train_begin, on_step_end, on_log, on_evaluate, on_save, on_train_end) on each callback."""
        self.state.global_step = step
        if event == "on_log":
            self.state.log_history.append({**kwargs["logs"], "step": step})
        for cb in self.callbacks:
            handler = getattr(cb, event, None)
            if handler is not None:
                handler(self.args, self.state, self.control, model=model, **kwargs)

    @property
    def should_stop(self) -> bool:
        return bool(self.control.should_training_stop)
