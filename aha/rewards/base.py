"""What every reward shares: reading a completion's text, a name for metrics, and counters to report."""
from __future__ import annotations

import abc

import threading
from collections import Counter
from typing import Any


def completion_text(completion: Any) -> str:
    """The text of a completion (or prompt): a string, or the content of the last message of a chat list.

    >>> completion_text([{"role": "assistant", "content": "42"}])
    '42'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)) and completion:
        content = completion[-1].get("content", "") if isinstance(completion[-1], dict) else completion[-1]
        if isinstance(content, list):  # multimodal parts: keep the text ones
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content if isinstance(content, str) else ""
    return ""


class Reward(abc.ABC):
    """Base of the configurable rewards: TRL calls `reward(prompts, completions, **columns)` and names metrics
    by `__name__`; the trainer checks `required_columns` before training and logs `pop_metrics()` each step."""

    name = "reward"
    required_columns: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.__name__ = self.name
        self._counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()

    def count(self, key: str, n: float = 1) -> None:
        """Add n to a counter; a zero still makes the key appear, so the metric is logged every step."""
        with self._counts_lock:
            self._counts[key] += n

    def pop_metrics(self) -> dict[str, float]:
        """Counts since the last call, e.g. {"timeouts": 2.0}."""
        with self._counts_lock:
            out = {k: float(v) for k, v in self._counts.items()}
            self._counts.clear()
        return out

    @abc.abstractmethod
    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        """One value per completion (None: not applicable); each subclass defines it."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_") and k != "__name__")
        return f"{type(self).__name__}({fields})"
