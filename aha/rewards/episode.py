"""Episode rewards: TRL-signature reward functions that score how an agent's episode went, not only where it ended,
to be added beside a task's own success reward (an environment's get_reward, or a verifier).

They read the `episodes` argument aha gives every reward function for an agent's episodes: per episode its
`finish` ("stop": the model ended it; "length": cut by the token budget; "tool_limit": it asked for tools after
max_tool_calling_iterations rounds), `calls` (tool calls run) and `outcomes` (outcome -> count, aha.envs.tools:
ok, malformed, unknown, bad_arguments, raised, bad_result, timeout). A batch without episodes (no agent) is an
error naming the reward. Success, where one is read, is each episode environment's get_reward() >= `threshold`
unless `success` gives another TRL-signature reward function to read it from; an environment retired during its
episode (`environment_retired`: a call ran past tool_timeout) is not read.

    episode_ended      e = 1 if finish == "stop" else 0
    tool_errors        p = -min(1, per_error * errors), errors = calls whose outcome is not ok or timeout
    tool_efficiency    OTC-GRPO's tool factor (arXiv 2504.14870) on successful episodes, 0 on the others
    cut_as_failure     -s on an episode that did not end by itself, 0 otherwise: beside a success reward s of the
                       same weight, a cut episode totals 0, a failure however right its final state
    progress           the environment's partial credit, its progress() in [0, 1] (aha.envs.filesystem: the Jaccard
                       index of the changes needed and made), so a group whose episodes all fail still has a spread
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable

from .base import Reward
from .scoring import TRL_ARGUMENTS, _as_float, start_async

CUT = ("length", "tool_limit")
"""The finishes of an episode that did not end by itself."""


def episode_records(name: str, kwargs: dict) -> list[dict]:
    """The `episodes` argument, or an error naming the reward that needs it."""
    episodes = kwargs.get("episodes")
    if episodes is None:
        raise ValueError(f"reward {name} scores an agent's episodes (the `episodes` argument) and got none: use it "
                         "with tools or environment_factory")
    return episodes


def failed_calls(episode: dict) -> int:
    """Tool calls that raised, were malformed, named no tool, had arguments the schema refuses or gave a result
    that is not text: every outcome but ok and timeout (a slow tool is not the model's error), as tools/errors."""
    outcomes = episode["outcomes"]
    return sum(outcomes.values()) - outcomes.get("ok", 0) - outcomes.get("timeout", 0)


def success_values(success: Callable | None, prompts: list, completions: list, kwargs: dict) -> list[float]:
    """Each episode's success reward: `success(prompts, completions, **kwargs)`, or its environment's get_reward(),
    either awaited when async; NaN where there is none (None, not a number: scoring's conversion)."""
    if success is not None:
        values = awaited([success(prompts, completions, **kwargs)])[0]
        if isinstance(values, BaseException):
            raise values
    else:
        environments = usable_environments(kwargs.get("environments") or [None] * len(completions),
                                           kwargs.get("episodes"))
        values = awaited([getattr(e, "get_reward", lambda: None)() for e in environments])
    return [_as_float(v) for v in values]


def usable_environments(environments: list, episodes: list | None) -> list:
    """The environments whose state a reward may read: None in place of one retired during its episode (a call ran
    past tool_timeout; its abandoned thread may still be changing it), so its reward is None, counted."""
    if not episodes:
        return list(environments)
    return [None if ep.get("environment_retired") else e for e, ep in zip(environments, episodes)]


def awaited(values: list) -> list:
    """`values` with each awaitable (an async get_reward's or success's) awaited, together on scoring's async
    helper thread (what one raised: in its place). The reward calling this is bounded by reward_timeout."""
    pending = [i for i, v in enumerate(values) if inspect.isawaitable(v)]
    outcomes = start_async([(lambda v=values[i]: v, {}) for i in pending], math.inf)() if pending else []
    done = dict(zip(pending, outcomes))
    return [done.get(i, v) for i, v in enumerate(values)]


def otc_factor(m: int, n: int, c: float = 1.0) -> float:
    """OTC-GRPO's tool factor for an episode of m calls when the fewest calls among its group's successful episodes
    is n: sin(f * pi / (2n)) with f = 2nm / (m + n) (1 at m = n, falling toward 0 as m grows past it); when n = 0,
    cos(m * pi / (2m + c)) (1 at m = 0), c the smoothing constant.

    >>> otc_factor(2, 2), round(otc_factor(4, 2), 4), otc_factor(0, 0), round(otc_factor(1, 0), 4)
    (1.0, 0.866, 1.0, 0.5)
    """
    if n == 0:
        return math.cos(m * math.pi / (2 * m + c))
    return math.sin(2 * n * m / (m + n) * math.pi / (2 * n))


class EndedReward(Reward):
    """1.0 when the episode ended by itself (a model turn that calls no tool), 0.0 when the token budget or the
    turn limit cut it.

    >>> EndedReward()(None, [[], []], episodes=[{"finish": "stop"}, {"finish": "length"}])
    [1.0, 0.0]
    """

    name = "episode_ended"

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        return [float(e["finish"] == "stop") for e in episode_records(self.name, kwargs)]


class ToolErrorPenalty(Reward):
    """-min(1, per_error * errors): each call that failed (`failed_calls`) costs per_error, at most 1 in all; 0 for
    an episode whose calls all worked, or that made none. (ToolRL, arXiv 2504.13958, scores a call's structure 0/1;
    this counts what the calls came to, so a run of bad calls costs more than one.)

    >>> ToolErrorPenalty()(None, [[], []], episodes=[{"outcomes": {"ok": 2, "raised": 1}}, {"outcomes": {}}])
    [-0.5, 0.0]
    """

    name = "tool_errors"

    def __init__(self, per_error: float = 0.5):
        super().__init__()
        if not per_error > 0 or not math.isfinite(per_error):
            raise ValueError(f"per_error must be a positive number, got {per_error!r}")
        self.per_error = per_error

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        return [0.0 - min(1.0, self.per_error * failed_calls(e)) for e in episode_records(self.name, kwargs)]


class ToolEfficiency(Reward):
    """OTC-GRPO's tool efficiency: a successful episode (success >= threshold) of m calls scores
    `otc_factor(m, n)`, n the fewest calls among its group's successful episodes; a failed one scores 0. Groups are
    `group_size` consecutive episodes (the trainer's num_generations), or by default the runs of consecutive
    episodes of one dataset row (equal prompt and columns; an environment that writes each episode's prompt in
    reset makes each its own group unless their prompts agree). OTC multiplies the correctness reward by the
    factor; added beside a 0/1 success reward s at weight w, an episode totals s * (1 + w * factor). With
    cut_is_failure, an episode that did not end by itself is not a success (nor counted in n).

    >>> eps = [{"calls": 2, "finish": "stop"}, {"calls": 4, "finish": "stop"}, {"calls": 1, "finish": "stop"}]
    >>> scores = ToolEfficiency(3, success=lambda p, c, **k: (1, 1, 0))(None, ((),) * 3, episodes=eps)
    >>> tuple(round(x, 4) for x in scores)
    (1.0, 0.866, 0.0)
    """

    name = "tool_efficiency"

    def __init__(self, group_size: int | None = None, success: Callable | None = None, threshold: float = 1.0,
                 c: float = 1.0, cut_is_failure: bool = False):
        super().__init__()
        if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
            raise ValueError(f"group_size must be the trainer's num_generations (an integer >= 1), got {group_size!r}")
        if not c > 0:
            raise ValueError(f"c must be > 0, got {c!r}")
        self.group_size, self.success, self.threshold, self.c = group_size, success, threshold, c
        self.cut_is_failure = cut_is_failure

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        episodes, G = episode_records(self.name, kwargs), self.group_size
        if G is not None and len(episodes) % G:
            raise ValueError(f"{len(episodes)} episodes are not whole groups of group_size={G}")
        ok = [s >= self.threshold and not (self.cut_is_failure and e["finish"] in CUT)
              for s, e in zip(success_values(self.success, prompts, completions, kwargs), episodes)]
        starts = list(range(0, len(episodes), G)) if G else row_starts(prompts, kwargs)
        out = []
        for a, b in zip(starts, starts[1:] + [len(episodes)]):
            calls = [e["calls"] for e in episodes[a:b]]
            fewest = min((m for m, good in zip(calls, ok[a:b]) if good), default=0)
            out += [otc_factor(m, fewest, self.c) if good else 0.0 for m, good in zip(calls, ok[a:b])]
        return out


def row_starts(prompts: list, kwargs: dict) -> list[int]:
    """Where each run of consecutive episodes of one dataset row starts: equal prompts and dataset columns (the
    trainer repeats a row's prompt and columns for its G episodes).

    >>> row_starts(["a", "a", "a", "a"], {"fs": [1, 1, 2, 2], "environments": [None] * 4})
    [0, 2]
    """
    columns = [v for k, v in kwargs.items() if k not in TRL_ARGUMENTS and isinstance(v, list)]
    keys = [repr((p, [c[i] for c in columns])) for i, p in enumerate(prompts)]
    return [i for i, key in enumerate(keys) if i == 0 or key != keys[i - 1]]


class CutAsFailure(Reward):
    """-s for an episode that did not end by itself (finish in `finishes`: the token budget or the turn limit cut
    it), 0 otherwise, s its success reward (NaN s: None). Beside that success reward, at the same weight, a cut
    episode totals 0: it scores as a failure, however right its final state. (Leaving cut episodes out of the loss,
    mask_truncated_completions, removes them; this penalises running on.)

    >>> CutAsFailure(success=lambda p, c, **k: [1.0, 1.0, 0.0])(
    ...     None, [[]] * 3, episodes=[{"finish": "stop"}, {"finish": "length"}, {"finish": "tool_limit"}])
    [0.0, -1.0, 0.0]
    """

    name = "cut_as_failure"

    def __init__(self, success: Callable | None = None, finishes: tuple[str, ...] = CUT):
        super().__init__()
        if not finishes or set(finishes) - set(CUT):
            raise ValueError(f"finishes must name some of {CUT}, got {finishes!r}")
        self.success, self.finishes = success, tuple(finishes)

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        episodes = episode_records(self.name, kwargs)
        values = success_values(self.success, prompts, completions, kwargs)
        return [None if math.isnan(s) else 0.0 - s * (e["finish"] in self.finishes) for s, e in zip(values, episodes)]


class ProgressReward(Reward):
    """Each episode environment's `progress()`: partial credit, in [0, 1], as the environment defines it (for
    aha.envs.filesystem, |need & made| / |need | made| over the changes the task needs and those the episode made).
    Beside the 0/1 success reward, it lets GRPO tell a run that did two of three moves from one that did none. An
    environment without progress() is an error naming it; a retired one (a call ran past tool_timeout) gives None.

    >>> class Env:
    ...     def __init__(self, p): self.p = p
    ...     def progress(self): return self.p
    >>> ProgressReward()(None, [[], []], environments=[Env(0.5), Env(1)], episodes=[{}, {}])
    [0.5, 1.0]
    """

    name = "progress"

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        episodes, given = episode_records(self.name, kwargs), kwargs.get("environments")
        if not given:
            raise ValueError("reward 'progress' reads each episode's environment; this batch has none "
                             "(train with environment_factory=)")
        lacking = {type(e).__name__ for e in given if not callable(getattr(e, "progress", None))}
        if lacking:
            raise ValueError(f"reward 'progress' reads each environment's progress(); {', '.join(sorted(lacking))} "
                             "has none")
        values = awaited([None if e is None else e.progress() for e in usable_environments(given, episodes)])
        for v in values:
            if isinstance(v, BaseException):
                raise v
        return [None if v is None else float(v) for v in values]
