"""Tasks by name: a file per family registers its tasks; `get_task` is the one resolver.

    arithmetic   column addition, worked in <think> (arithmetic.py, the embedded default)
    add_check    addition answered at once, sometimes checked by columns: reflection that can pay (checked.py)
    chat_add/sub two-number questions for small instruct models (chat.py)
    A+B          equal parts of tasks that share their verifiers (base.mixture)
    gsm8k, math500, humaneval, jsonl:PATH   benchmarks from offline copies, any JSONL (benchmarks.py)
    filesystem, calculator, python   the built-in environments, agent tasks with tools (agents.py)
"""

from __future__ import annotations

from . import agents, arithmetic, benchmarks, chat, checked  # noqa: F401  (importing registers their tasks)
from .base import TASKS, Task, mixture, register_task, split_of, task_corpus


def get_task(name: str) -> Task:
    """`jsonl:PATH[@TEMPLATE][?prompt=COL&answer=COL&reward=math|code]` -> a task over that file;
    `NAME@TEMPLATE` -> a benchmark with another prompt template (`gsm8k@boxed`); any other name -> the
    registered task; `A+B` -> equal parts of tasks A and B (same verifiers). Unknown names raise, listing the
    valid ones."""
    if name.startswith("jsonl:"):
        return benchmarks.jsonl_task_from_name(name)
    if "+" in name:
        return mixture([get_task(part) for part in name.split("+")])
    base, at, template = name.rpartition("@")
    if at and base in benchmarks.BUILDERS:
        return benchmarks.BUILDERS[base](template, name=name)  # an unknown template raises, listing the valid ones
    if name not in TASKS:
        raise ValueError(f"unknown task '{name}'; valid: {sorted(TASKS)}, NAME@TEMPLATE or jsonl:PATH")
    return TASKS[name]


__all__ = ["TASKS", "Task", "get_task", "register_task", "split_of", "task_corpus"]
