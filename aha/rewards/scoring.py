"""Calling a set of reward functions on one batch: the [N, F] reward matrix the trainer weights and sums,
plus metrics. A function that raises (SystemExit and KeyboardInterrupt included), times out or gives no usable
value is excluded (NaN) and counted, never allowed to kill the run; a function that is misconfigured (a return
that is not N values, a missing dataset column) stops it with a clear message. Each call gets its own copy of
the inputs."""
from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import math
import threading
from typing import Any, Callable, Iterable

from .base import completion_text
from .deadline import RewardTimeout, call_bounded
from .steps import clean_steps, is_steps, is_turn_scores, non_integer_end, step_mean, turn_steps

logger = logging.getLogger(__name__)

TRL_ARGUMENTS = {"prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra", "environments",
                 "episodes"}  # the last is aha's: how an agent's episodes ended, their calls' outcomes
LOGGED = "reward/logged/"
"""Metrics a reward function gives through TRL's `log_metric(name, value)`: reward/logged/<name>, the mean of the
values logged in the step."""
_LOGGED: set[str] = set()  # functions whose traceback was already logged
_LOGGED_LOCK = threading.Lock()


def reward_name(fn: Callable) -> str:
    """The name TRL would give the function's metrics."""
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None)
    return name or type(fn).__name__


def needed_columns(fn: Callable) -> list[str]:
    """Dataset columns `fn` needs: its `required_columns` and its required named parameters."""
    cols = list(getattr(fn, "required_columns", ()) or ())
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return cols
    for p in params:
        if (p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
                and p.name not in TRL_ARGUMENTS and p.name not in cols):
            cols.append(p.name)
    return cols


def _missing_column(fn: Callable, column: str, columns: Iterable[str]) -> ValueError:
    have = ", ".join(sorted(columns)) or "no column but the prompt"
    return ValueError(f"reward function {reward_name(fn)} needs dataset column {column!r}; the dataset has: {have}")


def check_columns(reward_funcs: list[Callable], columns: Iterable[str]) -> None:
    """Raise before training when a reward needs a column the dataset lacks."""
    columns = set(columns)
    for fn in reward_funcs:
        for col in needed_columns(fn):
            if col not in columns:
                raise _missing_column(fn, col, columns)


def check_not_all_null(reward_funcs: list[Callable], rows: list[dict]) -> None:
    """Raise before training when a column a reward needs is null in every row: it could never give a value."""
    for fn in reward_funcs:
        for col in needed_columns(fn):
            if rows and all(r.get(col) is None for r in rows):
                raise ValueError(f"column {col!r} is null in all {len(rows)} rows; reward function {reward_name(fn)} "
                                 "has nothing to compare against")


def _first_time(key: str) -> bool:
    """True the first time `key` is seen in this process: each kind of failure is logged once."""
    with _LOGGED_LOCK:
        first = key not in _LOGGED
        _LOGGED.add(key)
    return first


def _is_async(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _as_float(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x if math.isfinite(x) else math.nan


ASYNC_GRACE_S = 5.0
"""Extra wait for the async helper thread after its calls were cancelled at their limit."""


def _call_caught(fn: Callable, kwargs: dict) -> Any:
    """fn(**kwargs), or what it raised: a reward's SystemExit or KeyboardInterrupt is its failure, not an exit."""
    try:
        return fn(**kwargs)
    except BaseException as e:  # noqa: BLE001 - off the main thread no stop signal can land here
        return e


def _call_sync(fn: Callable, timeout_s: float, kwargs: dict) -> Any:
    """fn(**kwargs), or the exception it raised (RewardTimeout past `timeout_s`). On the main thread it runs
    there (libraries with signal-based time-outs need it), bounded by aha.rewards.deadline; on another thread
    it runs on a daemon thread that is abandoned at the limit."""
    if threading.current_thread() is threading.main_thread():
        return call_bounded(fn, reward_name(fn), timeout_s, kwargs)
    return call_on_thread(fn, timeout_s, kwargs)


def call_on_thread(fn: Callable, timeout_s: float, kwargs: dict, name: str = "aha-reward-call") -> Any:
    """fn(**kwargs) on a daemon thread: its value, the exception it raised, or RewardTimeout when it runs past
    `timeout_s` (the thread is then abandoned: a call that never ends costs a thread, never a hang)."""
    if not math.isfinite(timeout_s):
        return _call_caught(fn, kwargs)
    box: list[Any] = [RewardTimeout()]
    worker = threading.Thread(target=lambda: box.__setitem__(0, _call_caught(fn, kwargs)), daemon=True, name=name)
    worker.start()
    worker.join(timeout_s)
    return box[0]


async def awaited(fn: Callable, kwargs: dict, timeout_s: float) -> Any:
    """await fn(**kwargs): its value, the exception it raised, or RewardTimeout when it runs past `timeout_s` (it
    is cancelled then). A coroutine that blocks its loop is not cut off here: whoever waits for the loop is."""
    async def caught():
        try:
            return await fn(**kwargs)
        except (Exception, SystemExit, KeyboardInterrupt) as e:  # asyncio would end its whole loop on the last two
            return e
    try:
        return await asyncio.wait_for(caught(), None if not math.isfinite(timeout_s) else timeout_s)
    except asyncio.TimeoutError:
        return RewardTimeout()


def start_async(calls: list[tuple[Callable, dict]], timeout_s: float) -> Callable[[], list]:
    """Start awaiting the async reward functions together on a daemon thread, each on its own inputs and with
    `timeout_s`; returns a function that waits for them (bounded) and gives their outcomes as _call_sync's.
    A coroutine that blocks its event loop past the limit is abandoned with its thread."""
    limit = None if not math.isfinite(timeout_s) else timeout_s

    async def gather() -> list:
        return await asyncio.gather(*(awaited(fn, kwargs, timeout_s) for fn, kwargs in calls),
                                    return_exceptions=True)

    box: list[Any] = [[RewardTimeout() for _ in calls]]
    worker = threading.Thread(target=lambda: box.__setitem__(0, asyncio.run(gather())), daemon=True,
                              name="aha-async-rewards")
    worker.start()

    def outcomes() -> list:
        worker.join(None if limit is None else limit + ASYNC_GRACE_S)
        return box[0]

    return outcomes


SHARED_ARGUMENTS = {"trainer_state", "log_metric", "log_extra", "environments"}
"""Arguments every reward call shares (an agent's environments are live objects, read as they are); all others
are copied for each call."""


_ATOMIC = (str, bytes, int, float, bool, type(None))


def _copy(x: Any) -> Any:
    """A deep copy of `x`; a flat list of numbers or strings (token ids, a plain-text batch) the fast way."""
    if isinstance(x, _ATOMIC):
        return x
    if type(x) is list and all(isinstance(e, _ATOMIC) for e in x):
        return x.copy()
    return copy.deepcopy(x)


def _own_inputs(kwargs: dict) -> dict:
    """One call's inputs: a deep copy of each prompt, completion and column value (each on its own, so that the G
    completions of a group do not share one prompt either). A function that edits them in place changes
    nothing that the next function, or the sampler's rows, see."""
    return {k: v if k in SHARED_ARGUMENTS else [_copy(x) for x in v] if isinstance(v, list) else copy.deepcopy(v)
            for k, v in kwargs.items()}


class NoUsableValue(ValueError):
    """A call gave no usable value at all (every one NaN, inf or not a number): a failure, like a raise."""


def _failed(name: str, outcome: BaseException) -> None:
    """Log a failed call, once per function and kind."""
    if isinstance(outcome, RewardTimeout):
        if _first_time(name + "/timeout"):
            logger.error("reward function %s ran past its time limit (reward_timeout); its rewards are excluded", name)
    elif isinstance(outcome, NoUsableValue):
        if _first_time(name + "/unusable"):
            logger.error("%s; its rewards are NaN for this batch", outcome)
    elif _first_time(name):  # SystemExit and KeyboardInterrupt too: a reward's exit is its failure, not the run's
        logger.error("reward function %s raised; its rewards are NaN for this batch", name,
                     exc_info=(type(outcome), outcome, outcome.__traceback__))


def _is_nested(v: Any) -> bool:
    """A sequence or array where TRL expects one number (a 0-d array or a numpy scalar is a number)."""
    return isinstance(v, (list, tuple, dict, set)) or bool(getattr(v, "shape", ()))


def _bad_shape(outcome: Any, values: list, n: int, turns: list[int] | None = None) -> str | None:
    """What is wrong with the shape of a returned sequence, or None: TRL makes a 1-D tensor of n values and stops
    on anything else (a 2-D array, a list of lists, a wrong length). An episode (`turns`: its model turns) may have
    one score per model turn."""
    shape = getattr(outcome, "shape", None)
    if shape is not None and len(shape) != 1:
        return f"{type(outcome).__name__} of shape {tuple(int(d) for d in shape)}"
    per_turn = [i for i, v in enumerate(values) if turns is not None and _is_nested(v) and is_turn_scores(v) and v]
    if wrong := [i for i in per_turn if i < len(turns) and len(values[i]) != turns[i]]:
        return (f"{len(values[wrong[0]])} turn scores for episode {wrong[0]}, which has {turns[wrong[0]]} model "
                "turns (one score per model turn)")
    nested = [i for i, v in enumerate(values) if _is_nested(v) and not is_steps(v) and i not in per_turn]
    ends = [(i, end) for i in nested if (end := non_integer_end(values[i])) is not None]
    if ends:
        return (f"a list whose value {ends[0][0]} has a step ending at {ends[0][1]!r} (step ends must be integers: "
                "character offsets into the completion's text)")
    if nested and len(nested) == len(values) and len({len(v) for v in values}) == 1:
        return f"a list of shape ({len(values)}, {len(values[0])})"
    if nested:
        return f"a list whose value {nested[0]} is a {type(values[nested[0]]).__name__} ({values[nested[0]]!r:.40})"
    return None if len(values) == n else f"{len(values)} values"


def _values(fn: Callable, outcome: Any, n: int, columns: Iterable[str], kwargs: dict,
            turns: list[int] | None = None) -> list | None:
    """The n values a call returned; None when it raised or timed out (logged once per function). A return
    that is not n values (a mistake in the function, not in one completion) raises, naming what it was."""
    name = reward_name(fn)
    if isinstance(outcome, KeyError) and outcome.args and outcome.args[0] not in kwargs:
        raise _missing_column(fn, outcome.args[0], columns) from outcome
    if isinstance(outcome, BaseException):
        _failed(name, outcome)
        return None
    if outcome is None or isinstance(outcome, (str, bytes, dict)) or not hasattr(outcome, "__len__"):
        raise ValueError(f"reward function {name} returned {type(outcome).__name__} {outcome!r:.40}; "
                         f"expected a list of {n} values (one per completion, None where not applicable)")
    shape = getattr(outcome, "shape", None)
    values = list(outcome) if shape is None or len(shape) == 1 else []  # a 0-d array is not iterable
    bad = _bad_shape(outcome, values, n, turns)
    if bad is not None:
        raise ValueError(f"reward function {name} returned {bad}, expected {n} values (one number per "
                         "completion, None where not applicable, or a list of (end, score) step rewards)")
    return values


def _column(name: str, values: list, texts: list[str], turns: list[int] | None = None
            ) -> tuple[list[float], list, BaseException | None, int]:
    """One function's values as floats (NaN where unusable; a list of steps counts as the mean of its usable
    scores), its steps (aha.rewards.steps.clean_steps per completion, None where it gave a number), the failure
    when none is usable although some were given (all None, or no step written, is "not applicable": no
    failure), and the count of values that are NaN, inf or not numbers (a list of steps: one with such a score).
    An episode's list of numbers (`turns` given) is its turns' scores (aha.rewards.steps.turn_steps)."""
    steps = [turn_steps(v) if turns is not None and is_turn_scores(v) else clean_steps(v, len(t)) if is_steps(v)
             else None for v, t in zip(values, texts)]
    floats = [_as_float(v) if s is None else step_mean(s) for v, s in zip(values, steps)]
    bad = [v for v, x, s in zip(values, floats, steps)
           if v is not None and (math.isnan(x) if s is None else any(math.isnan(st.score) for st in s))]
    if bad and all(math.isnan(x) for x in floats):
        return floats, steps, NoUsableValue(
            f"reward function {name} gave no usable value: all {len(values)} values were unusable ({len(bad)} NaN, "
            f"inf or not a number, first {bad[0]!r}; {len(values) - len(bad)} None)"), len(bad)
    if bad and _first_time(name + "/nan"):
        logger.error("reward function %s returned %d non-finite or non-numeric value(s) (first: %r); "
                     "they are excluded like None", name, len(bad), bad[0])
    return floats, steps, None, len(bad)


def _call_all(reward_funcs: list[Callable], kwargs: dict, timeout_s: float) -> list[Any]:
    """Each function's outcome (its return value or what it raised), each called on its own copy of the inputs:
    async ones awaited together on a helper thread while the sync ones run one after another here."""
    async_idx = [i for i, fn in enumerate(reward_funcs) if _is_async(fn)]
    outcomes: list[Any] = [None] * len(reward_funcs)
    async_outcomes = start_async([(reward_funcs[i], _own_inputs(kwargs)) for i in async_idx], timeout_s) \
        if async_idx else None
    for i, fn in enumerate(reward_funcs):
        if i not in async_idx:
            outcomes[i] = _call_sync(fn, timeout_s, _own_inputs(kwargs))
    for i, value in zip(async_idx, async_outcomes() if async_outcomes else []):
        outcomes[i] = value
    return outcomes


def score_completions(reward_funcs: list[Callable], prompts: list, completions: list, columns: dict[str, list],
                      completion_ids: list | None = None, trainer_state: Any = None,
                      timeout_s: float = math.inf, environments: list | None = None,
                      steps_out: list | None = None, episodes: list | None = None,
                      failures_out: dict | None = None) -> tuple[Any, dict[str, float]]:
    """Rewards [N, F] (float32, NaN where a value is None, non-finite, or its function raised or timed out) and
    metrics: `reward/errors` (calls that raised, exited, or gave values none of which is usable),
    `reward/call_timeouts` (calls cut at `timeout_s`), `reward/<name>/failed` (1.0 when that function's call
    counted in one of those two), `reward/nan` (returned values that are NaN, inf or not numbers; None is "not
    applicable" and not counted), `reward/<name>/none_frac` (share of NaN in the column), and each function's
    `pop_metrics()` as `reward/<key>`, summed over functions.

    Async functions are awaited together on a helper thread while the sync ones run one after another on the
    calling thread: verifiers parallelise their own batches, and libraries such as math-verify use signal-based
    time-outs that only work on the main thread. Every call gets `timeout_s` of wall clock and its own deep copy
    of the prompts, completions and columns; an agent's `environments` (one per completion, as TRL passes them) are
    shared: a function reads each episode's final state. aha's `episodes` say how each ended and what its calls came
    to ({"finish", "calls", "outcomes"}: aha.rewards.episode).
    A value may be a list of (end, score) step rewards (aha.rewards.steps; an episode's: one score per model turn):
    its matrix entry is the mean usable step score, and `steps_out` receives per completion the (end, score,
    function index) triples (a score that is NaN, inf or not a number is NaN: left out, counted).
    `failures_out` receives name -> what it raised for each failed call (`_count_failure`)."""
    import torch  # here, so that the verifiers themselves import without torch
    n, logged = len(completions), {}  # logged: name -> the values given through log_metric
    kwargs = dict(columns, prompts=prompts, completions=completions, completion_ids=completion_ids,
                  trainer_state=trainer_state,  # as TRL passes it: curricula read trainer_state.global_step
                  environments=environments, episodes=episodes, log_extra=_no_log_extra,
                  log_metric=lambda name, value: logged.setdefault(str(name), []).append(float(value)))
    kwargs = {k: v for k, v in kwargs.items() if v is not None or k in columns}  # the optional ones when given
    outcomes = _call_all(reward_funcs, kwargs, timeout_s)

    rewards = torch.full((n, len(reward_funcs)), math.nan, dtype=torch.float32)  # [N, F]
    metrics: dict[str, float] = {"reward/errors": 0.0, "reward/call_timeouts": 0.0, "reward/nan": 0.0}
    texts = [completion_text(c) for c in completions]
    turns = None if episodes is None else [sum(m.get("role") == "assistant" for m in c) for c in completions]
    steps: list[list] = [[] for _ in range(n)]
    for j, (fn, outcome) in enumerate(zip(reward_funcs, outcomes)):
        name = reward_name(fn)
        values = _values(fn, outcome, n, columns, kwargs, turns)
        if values is not None:
            floats, given, outcome, bad = _column(name, values, texts, turns)
            rewards[:, j] = torch.tensor(floats, dtype=torch.float32)
            metrics["reward/nan"] += bad
            for i, s in enumerate(given):
                steps[i] += [(end, score, j) for end, score in s or ()]
        _count_failure(name, outcome, metrics, failures_out)
        metrics[f"reward/{name}/none_frac"] = _none_frac(rewards[:, j])
        pop = getattr(fn, "pop_metrics", None)
        if callable(pop):
            for key, value in pop().items():
                metrics[f"reward/{key}"] = metrics.get(f"reward/{key}", 0.0) + float(value)
    metrics.update({LOGGED + name: sum(values) / len(values) for name, values in logged.items()})
    if steps_out is not None:
        steps_out[:] = steps
    return rewards, metrics


def _no_log_extra(column: str, values: list) -> None:
    raise NotImplementedError(f"log_extra({column!r}, ...): aha writes each completion with its prompt and rewards "
                              "to completions.jsonl (log_completions_steps) and takes no extra columns; report a "
                              "number with log_metric(name, value) instead")


def _count_failure(name: str, outcome: Any, metrics: dict[str, float], failures_out: dict | None) -> None:
    """`reward/<name>/failed` for one function's call, counted in `reward/errors` or `reward/call_timeouts` when it
    failed (raised or exited, gave nothing usable: NoUsableValue, ran past its limit: RewardTimeout); what it raised
    goes to `failures_out` (name -> exception), which the caller keeps for the error that stops a run."""
    failed = isinstance(outcome, BaseException)
    metrics[f"reward/{name}/failed"] = float(failed)
    if not failed:
        return
    if failures_out is not None:
        failures_out[name] = outcome
    metrics["reward/call_timeouts" if isinstance(outcome, RewardTimeout) else "reward/errors"] += 1
    if isinstance(outcome, NoUsableValue):
        _failed(name, outcome)


def score_groups(reward_funcs: list[Callable], rows: list[dict], texts: list[str], n: int,
                 completion_ids: list | None = None, trainer_state: Any = None,
                 timeout_s: float = math.inf, episodes: dict | None = None,
                 steps_out: list | None = None, failures_out: dict | None = None) -> tuple[Any, dict[str, float]]:
    """Score n completions of each row, prompt-major (texts i*n .. i*n+n-1 answer rows[i]): the one entry point
    that training, evaluation and rejection sampling share. Each row's prompt and columns are repeated n times and
    completions of chat prompts are wrapped as assistant messages, as TRL passes them; an agent's `episodes` give
    their own "prompts" (after their environment's reset), "completions" (the turns' messages) and
    "environments". Returns rewards [N, F] and the metrics of `score_completions` plus `reward/<name>/mean` and
    `reward/<name>/std` over the values given."""
    from ..data import is_conversational
    episodes = episodes or {}
    prompts = episodes.get("prompts") or [r["prompt"] for r in rows for _ in range(n)]
    completions = episodes.get("completions") or (
        [[{"role": "assistant", "content": t}] for t in texts] if is_conversational(rows[0]["prompt"]) else list(texts))
    keys = dict.fromkeys(k for r in rows for k in r if k != "prompt")  # every row's: rows[0] may lack one
    columns = {k: [r.get(k) for r in rows for _ in range(n)] for k in keys}
    rewards, metrics = score_completions(reward_funcs, prompts, completions, columns, completion_ids=completion_ids,
                                         trainer_state=trainer_state, timeout_s=timeout_s,
                                         environments=episodes.get("environments"), steps_out=steps_out,
                                         episodes=episodes.get("episodes"), failures_out=failures_out)  # [N, F]
    return rewards, {**metrics, **column_metrics(reward_funcs, rewards)}


def column_metrics(reward_funcs: list[Callable], rewards: Any) -> dict[str, float]:
    """`reward/<name>/mean` and `/std` over the values given, from rewards [N, F]."""
    metrics = {}
    for j, fn in enumerate(reward_funcs):
        col, name = rewards[:, j], reward_name(fn)
        ok = col[col.isfinite()]
        metrics[f"reward/{name}/mean"] = ok.mean().item() if len(ok) else math.nan
        metrics[f"reward/{name}/std"] = ok.std().item() if len(ok) > 1 else math.nan
    return metrics


def _none_frac(col: Any) -> float:
    """Share of one function's values that are NaN (None, failed, non-finite)."""
    return col.isnan().float().mean().item() if len(col) else 0.0


def merge_reward_metrics(reward_funcs: list[Callable], parts: list[dict[str, float]], rewards: Any) -> dict[str, float]:
    """The metrics of several `score_groups` calls as if they were one call over `rewards` (all their rows):
    counts add up, `/failed` is 1 if any call failed, per-column statistics are recomputed."""
    merged: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            merged[key] = max(merged.get(key, 0.0), value) if key.endswith("/failed") else merged.get(key, 0.0) + value
    for key in [k for k in merged if k.startswith(LOGGED)]:  # a mean: over the calls that logged it
        merged[key] /= sum(key in part for part in parts)
    merged.update({f"reward/{reward_name(fn)}/none_frac": _none_frac(rewards[:, j]) for j, fn in enumerate(reward_funcs)})
    return {**merged, **column_metrics(reward_funcs, rewards)}

