"""The built-in environments as tasks: trained, sampled and evaluated by name like any task (`task=filesystem`).

    filesystem   a virtual filesystem's six tools; reward: the final tree equals the reference (aha.envs.filesystem);
                 rows carry a `family` (move_txt, delete_logs, create, rename, copy, mkdir): eval reports each.
                 Budget 256 tokens, a quarter above its longest demonstrations (move every .txt with five files
                 listed: 200 tokens with `aha demo agent`'s tokenizer, which 192 cut as `length`); 3 rounds of
                 tool calls, where every task is solved in at most 2
    calculator   add/subtract/multiply/divide on multiplications a small model gets wrong without them; reward: the
                 last number of the last reply is the answer (aha.envs.calculator)
    python       run_python in aha's sandbox on questions a short program answers (aha.envs.python); same reward

A task of your own is one file with a `Task(..., tools=... or environment=...)` and one `register_task` line (see
docs/agents.md). Each row's `solution` (the solving calls and their results) makes its demonstration: the worked
episode a cold start learns from (`demonstration_messages`).
"""

from __future__ import annotations

from typing import Callable

from ..envs import calculator, filesystem, python
from .base import Task, check_split, register_task

TEST_SIZE = 200
"""Rows in each task's test split."""


def demonstration_messages(row: dict, closing: str, first: tuple[str, ...] = ()) -> list[dict]:
    """A row's `solution` [(tool, arguments, result), ...] as one episode in TRL's messages format: the prompt, then
    an assistant turn per call (the calls named in `first` together in one turn before the rest, which act on what
    they saw), each followed by its tool messages, then the `closing` reply."""
    calls = [tuple(c) for c in row["solution"]]
    looks = [c for c in calls if c[0] in first]
    turns = [looks, calls[len(looks):]] if looks else [[c] for c in calls]
    messages = list(row["prompt"])
    for turn in turns:
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": name, "arguments": args}} for name, args, _ in turn]})
        messages += [{"role": "tool", "name": name, "content": str(result)} for name, _, result in turn]
    return messages + [{"role": "assistant", "content": closing}]


def _loader(name: str, make: Callable[..., list[dict]], train_size: int) -> Callable[..., list[dict]]:
    """load(split, n=None, seed=0): n rows (None: `train_size` of train, TEST_SIZE of test)."""
    def load(split: str, n: int | None = None, seed: int = 0) -> list[dict]:
        check_split(name, split, ("train", "test"))
        return make(split, n or (train_size if split == "train" else TEST_SIZE), seed)
    return load


def _no_rewards() -> list:
    """The environment's get_reward is the task's reward (the Agent adds it)."""
    return []


def _tree_matches():
    """1.0 when the episode's final tree equals the reference (FilesystemEnv.get_reward), read from each
    episode's environment."""
    from ..envs import EnvironmentReward
    return EnvironmentReward(filesystem.FilesystemEnv)


def _final_answer_rewards() -> list:
    return [calculator.final_answer]


def _final_answer():
    return calculator.final_answer


register_task(Task(
    name="filesystem", load=_loader("filesystem", filesystem.make_tasks, 4000), rewards=_no_rewards,
    correct=_tree_matches, environment=filesystem.FilesystemEnv, max_completion_length=256,
    max_tool_calling_iterations=3,
    demonstrate=lambda row: demonstration_messages(row, "Done.", first=("list_dir", "read_file")),
    description="a virtual filesystem's tools; success: the final tree equals the reference"))
register_task(Task(
    name="calculator", load=_loader("calculator", calculator.make_tasks, 4000), rewards=_final_answer_rewards,
    correct=_final_answer, tools=lambda: list(calculator.TOOLS), max_completion_length=256,
    max_tool_calling_iterations=3, demonstrate=lambda row: demonstration_messages(row, f"The answer is {row['answer']}."),
    description="four calculator tools on multiplications; success: the final number is the answer"))
register_task(Task(
    name="python", load=_loader("python", python.make_tasks, 1000), rewards=_final_answer_rewards,
    correct=_final_answer, tools=lambda: [python.run_python], max_completion_length=384,
    max_tool_calling_iterations=3, demonstrate=lambda row: demonstration_messages(row, f"The answer is {row['answer']}."),
    description="run_python in the sandbox on questions a short program answers; success: the final number"))
