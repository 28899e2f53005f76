"""transformers `TrainerCallback` objects driven by aha's loop, so callbacks written for TRL's trainer work:
the same events, a `TrainerState` (global_step, max_steps, log_history) and a `TrainerControl` whose
`should_training_stop` ends the run after the current step."""

from __future__ import annotations

from typing import Any


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
