"""Tasks by name: a file per family registers its tasks; `get_task` is the one resolver.

    arithmetic   column addition, worked in <think> (arithmetic.py, the embedded default)
    chat_add/sub two-number questions for small instruct models (chat.py)
    gsm8k, math500, humaneval, jsonl:PATH   benchmarks from offline copies, any JSONL (benchmarks.py)
"""

from __future__ import annotations

from . import arithmetic, benchmarks, chat  # noqa: F401  (importing registers their tasks)
from .base import TASKS, Task, register_task, split_of, task_corpus


def get_task(name: str) -> Task:
    """`jsonl:PATH[@TEMPLATE][?prompt=COL&answer=COL&reward=math|code]` -> a task over that file;
    `NAME@TEMPLATE` -> a benchmark with another prompt template (`gsm8k@boxed`); any other name -> the
    registered task. Unknown names raise, listing the valid ones."""
    if name.startswith("jsonl:"):
        return benchmarks.jsonl_task_from_name(name)
    base, at, template = name.rpartition("@")
    if at and base in benchmarks.BUILDERS:
        return benchmarks.BUILDERS[base](template, name=name)  # an unknown template raises, listing the valid ones
    if name not in TASKS:
        raise ValueError(f"unknown task '{name}'; valid: {sorted(TASKS)}, NAME@TEMPLATE or jsonl:PATH")
    return TASKS[name]


__all__ = ["TASKS", "Task", "get_task", "register_task", "split_of", "task_corpus"]
