"""A task: a dataset, its prompt format and its verifiers under one name (`task=NAME`), and the registry."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from ..data.prompts import TEMPLATES, cut_at
from ..data.splits import split_of  # noqa: F401  (tasks import it from here)


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
    stop: tuple[str, ...] | None = None
    """Where a completion ends for scoring: it is cut at the first of these strings before `rewards()`,
    `correct()` and `extract` read it (the next-turn label "\\nUser:" of a base-model template, whose model may
    go on with a turn of its own and a second answer). None: the `stop` of the template named after the last "@"
    of `name` (`gsm8k@r1_base`, `jsonl:PATH@plain_base?...`), else none. Generation is not stopped there: the
    tokens after the cut are still generated (and, in training, still in completion_ids)."""
    tools: Callable[[], list] | None = None
    """An agent task's tools: () -> the plain functions every episode may call (TRL's `tools=`)."""
    environment: Callable | None = None
    """An agent task's environment factory (TRL's `environment_factory=`): an environment per episode, reset(**row)
    starts it, its public methods are tools, its get_reward() is a reward of the task."""
    max_tool_calling_iterations: int | None = None
    """Rounds of tool calls an episode may make (None: no limit but the token budget)."""
    demonstrate: Callable[[dict], list[dict]] | None = None
    """An agent task's row -> a worked episode as chat messages in TRL's format (the prompt, assistant turns with
    `tool_calls`, `tool` messages): what a cold start (`aha sft task=NAME`) learns from."""

    @property
    def is_agent(self) -> bool:
        """Its episodes run tools: every stage samples it through the turn loop."""
        return self.tools is not None or self.environment is not None

    def agent(self, tool_timeout: float = 30.0):
        """A fresh aha.envs.Agent with this task's tools and environment factory."""
        from ..envs import Agent
        return Agent(self.tools() if self.tools else [], self.environment, tool_timeout)

    def __post_init__(self):
        if self.stop is None:
            self.stop = template_stop(self.name)
        self.stop = tuple(self.stop)
        if self.stop:
            rewards, correct, stop = self.rewards, self.correct, self.stop
            self.rewards = lambda: [cut_before_scoring(fn, stop) for fn in rewards()]
            self.correct = lambda: cut_before_scoring(correct(), stop)
            if self.extract is not None and not (isinstance(self.extract, CutExtract) and self.extract.stop == stop):
                self.extract = CutExtract(self.extract, stop)

    def cut(self, text: str) -> str:
        """The part of a completion that is scored: `text` up to the first of `stop`."""
        return cut_at(text, self.stop) if self.stop and isinstance(text, str) else text

    def scorer(self, fn: Callable) -> Callable:
        """A reward function that reads completions as this task scores them (cut at `stop`)."""
        return cut_before_scoring(fn, self.stop) if self.stop else fn


def template_stop(name: str) -> tuple[str, ...]:
    """The `stop` of the prompt template that a task name picks with "@" (`gsm8k@plain_base` -> ("\\nUser:",));
    () when it names none."""
    _, at, template = name.partition("?")[0].rpartition("@")
    return TEMPLATES[template].stop if at and template in TEMPLATES else ()


def _cut_completion(completion: Any, stop: tuple[str, ...]) -> Any:
    """A completion as TRL passes it (a string, or chat messages whose last one is the reply) cut at `stop`."""
    if isinstance(completion, str):
        return cut_at(completion, stop)
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict) \
            and isinstance(completion[-1].get("content"), str):
        return [*completion[:-1], {**completion[-1], "content": cut_at(completion[-1]["content"], stop)}]
    return completion


class CutBeforeScoring:
    """A reward function that reads each completion only up to the first of `stop` strings. Keeps the inner
    function's name, dataset columns and counters (`pop_metrics`), so metrics and checks see it unchanged."""

    def __init__(self, inner: Callable, stop: tuple[str, ...]):
        from ..rewards.scoring import needed_columns, reward_name
        self.inner, self.stop = inner, tuple(stop)
        self.__name__ = reward_name(inner)
        self.required_columns = tuple(needed_columns(inner))

    def _cut(self, completions: list) -> list:
        return [_cut_completion(c, self.stop) for c in completions]

    def __call__(self, prompts: list | None = None, completions: list | None = None, **kwargs: Any) -> list:
        return self.inner(prompts=prompts, completions=self._cut(completions or []), **kwargs)

    def pop_metrics(self) -> dict[str, float]:
        pop = getattr(self.inner, "pop_metrics", None)
        return pop() if callable(pop) else {}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.inner == self.inner and other.stop == self.stop

    def __hash__(self) -> int:
        return hash((type(self), self.inner, self.stop))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r}, stop={self.stop!r})"


class AsyncCutBeforeScoring(CutBeforeScoring):
    """CutBeforeScoring of an async reward function (awaited, as the scorer awaits the inner one)."""

    async def __call__(self, prompts: list | None = None, completions: list | None = None, **kwargs: Any) -> list:
        return await self.inner(prompts=prompts, completions=self._cut(completions or []), **kwargs)


def cut_before_scoring(fn: Callable, stop: tuple[str, ...]) -> Callable:
    """`fn` reading completions cut at `stop` (itself when already so, or when `stop` is empty)."""
    if not stop or isinstance(fn, CutBeforeScoring) and fn.stop == tuple(stop):
        return fn
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
    return (AsyncCutBeforeScoring if is_async else CutBeforeScoring)(fn, stop)


class CutExtract:
    """A task's `extract` that reads the completion only up to the first of `stop` strings."""

    def __init__(self, inner: Callable[[str], str | None], stop: tuple[str, ...]):
        self.inner, self.stop = inner, tuple(stop)

    def __call__(self, text: str) -> str | None:
        return self.inner(cut_at(text, self.stop) if isinstance(text, str) else text)


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    TASKS[task.name] = task
    return task


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
        if (t.rewards() != first.rewards() or t.correct() != first.correct() or t.stop != first.stop
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
                splits=first.splits, asks_format=first.asks_format, parts=tuple(t.name for t in parts), stop=first.stop,
                description="equal parts of " + ", ".join(t.name for t in parts))
