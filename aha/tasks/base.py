"""A task: a dataset, its prompt format and its verifiers under one name (`task=NAME`), and the registry."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
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
    """Weight of each of `rewards()` in the sum (None: all 1)."""
    max_completion_length: int = 256
    """Default generation budget for this task."""
    splits: tuple[str, ...] = ("train", "test")
    asks_format: bool = False
    """Its prompts ask for R1's <think>/<answer> format, so evaluation reports the share that follows it."""
    description: str = ""
    """One line for `--help` and listings."""
    parts: tuple[str, ...] = ()
    """A mixture's tasks: row ids start with "PART:" and evaluation reports each part's accuracy too."""


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    TASKS[task.name] = task
    return task


def split_of(key: str, test_percent: int = 10) -> str:
    """"test" for about `test_percent`% of keys, fixed by a hash of the text (not by a seed), so train and
    test never overlap whatever the seed. Example: split_of("3+4") is the same on every machine and run."""
    h = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)
    return "test" if h % 100 < test_percent else "train"


def check_split(name: str, split: str, splits: tuple[str, ...]) -> None:
    if split not in splits:
        raise ValueError(f"task '{name}' has no split '{split}'; valid: {list(splits)}")


def math_answer_reward():
    """`math_reward` (final answer right -> 1.0), imported on first use so that tasks load without the verifiers."""
    from ..rewards import math_reward
    return math_reward


def extract_math_answer(text: str) -> str | None:
    """The final answer of a completion (<answer>, \\boxed{}, last number), for maj@k."""
    from ..rewards import extract_answer
    return extract_answer(text)


def task_corpus(rows: list[dict]) -> list[str]:
    """The text a tokenizer for a tiny model is fitted on: every question and worked solution, and
    every chat message of the first prompt (so the template's words are in the vocabulary)."""
    texts = [f"{r.get('question', '')} {r.get('completion', '')}" for r in rows]
    prompt = rows[0]["prompt"] if rows else ""
    return texts + ([m["content"] for m in prompt] if isinstance(prompt, list) else [str(prompt)])


def mixture(parts: list[Task]) -> Task:
    """One task from several that share their verifiers (`chat_add+chat_next`): each split holds the same
    number of rows of every part (the smallest part's count), interleaved, ids prefixed with the part's name.
    Raises if the parts score replies differently, since one reward would then be wrong for some rows."""
    first = parts[0]
    for t in parts[1:]:
        if (t.rewards() != first.rewards() or t.correct() is not first.correct()
                or t.reward_weights != first.reward_weights or t.splits != first.splits):
            raise ValueError(f"tasks '{first.name}' and '{t.name}' have different verifiers or splits; a mixture "
                             "needs tasks scored the same way")
    name = "+".join(t.name for t in parts)

    def load(split: str, n: int | None = None, seed: int = 0) -> list[dict]:
        check_split(name, split, first.splits)
        each = [t.load(split, seed=seed) for t in parts]
        k = min(map(len, each))
        rows = [{**own[i], "id": f"{t.name}:{own[i]['id']}"} for i in range(k) for t, own in zip(parts, each)]
        if n is not None and not 0 < n <= len(rows):
            raise ValueError(f"asked for {n} {split} rows of {name}; it has {len(rows)} ({k} of each part)")
        return rows[:n]

    return Task(name=name, load=load, rewards=first.rewards, correct=first.correct, extract=first.extract,
                reward_weights=first.reward_weights, max_completion_length=max(t.max_completion_length for t in parts),
                splits=first.splits, asks_format=first.asks_format, parts=tuple(t.name for t in parts),
                description="equal parts of " + ", ".join(t.name for t in parts))
