"""Tasks: a dataset, its prompt format and its verifiers under one name (`--task NAME`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Task:
    name: str
    load: Callable[..., list[dict]]
    """load(split, n=None, seed=0): ("train" or "test") -> rows with a `prompt` and the columns the verifiers read."""
    rewards: Callable[[], list]
    """Fresh reward functions for training (TRL signature)."""
    correct: Callable[[], Callable]
    """A reward function whose value 1.0 means the answer is right (accuracy, pass@k)."""
    extract: Callable[[str], str | None] | None = None
    """Pulls the final answer out of a completion, for majority voting (maj@k)."""
    reward_weights: list[float] | None = None
    max_completion_length: int = 256
    """Default generation budget for this task."""
    splits: tuple[str, ...] = ("train", "test")
    info: dict = field(default_factory=dict)


TASKS: dict[str, Task] = {}


def math_answer_reward():
    """`math_reward` (final answer right -> 1.0), imported on first use so that tasks load without the verifiers."""
    from ..rewards import math_reward
    return math_reward


def extract_math_answer(text: str) -> str | None:
    """The final answer of a completion (<answer>, \\boxed{}, last number), for maj@k."""
    from ..rewards import extract_answer
    return extract_answer(text)


def register_task(task: Task) -> Task:
    TASKS[task.name] = task
    return task


def _load_builtin() -> None:
    from . import benchmarks, smollm, synthetic  # noqa: F401  (importing registers their tasks)


def get_task(name: str) -> Task:
    _load_builtin()
    if name not in TASKS:
        raise ValueError(f"unknown task '{name}'; valid: {sorted(TASKS)}")
    return TASKS[name]
