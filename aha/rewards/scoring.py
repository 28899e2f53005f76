"""Calling a set of reward functions on one batch: the [N, F] reward matrix the trainer weights and sums,
plus metrics. A function that raises is excluded (NaN) and counted, never allowed to kill the run; a
function that is misconfigured (wrong length, missing dataset column) stops it with a clear message."""
from __future__ import annotations

import asyncio
import inspect
import logging
import math
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterable

logger = logging.getLogger(__name__)

TRL_ARGUMENTS = {"prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra"}
LOGGED = "reward/logged/"
"""Metrics a reward function gives through TRL's `log_metric(name, value)`: reward/logged/<name>, the mean of the
values logged in the step."""
_LOGGED: set[str] = set()  # functions whose traceback was already logged
_LAST_FAILURE: dict[str, BaseException] = {}  # function name -> the exception of its latest failed call
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
    have = ", ".join(sorted(columns)) or "(no columns)"
    return ValueError(f"reward function {reward_name(fn)} needs dataset column {column!r}; the dataset has: {have}")


def check_columns(reward_funcs: list[Callable], columns: Iterable[str]) -> None:
    """Raise before training when a reward needs a column the dataset lacks."""
    columns = set(columns)
    for fn in reward_funcs:
        for col in needed_columns(fn):
            if col not in columns:
                raise _missing_column(fn, col, columns)


def last_failure(name: str) -> BaseException | None:
    """The exception of the latest call of reward function `name` that raised or timed out."""
    return _LAST_FAILURE.get(name)


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


class RewardTimeout(BaseException):
    """A reward call ran past its wall-clock limit. A BaseException, like KeyboardInterrupt, so that a reward
    function's own `except Exception` cannot swallow it."""


WATCHDOG_SIGNAL = signal.SIGUSR2
"""Sent to the main thread when a synchronous reward call runs past its limit (SIGALRM stays free for
libraries such as math-verify, whose own time-outs use it)."""
ASYNC_GRACE_S = 5.0
"""Extra wait for the async helper thread after its calls were cancelled at their limit."""


@contextmanager
def _deadline(seconds: float):
    """Raise RewardTimeout in the main thread once `seconds` have passed: a timer thread signals it, and the
    handler raises between two bytecodes, interrupting sleeps and lock waits too. A no-op off the main thread."""
    if not math.isfinite(seconds) or threading.current_thread() is not threading.main_thread():
        yield
        return
    state = {"done": False}

    def on_signal(signum, frame):
        if not state["done"]:
            raise RewardTimeout()

    previous = signal.signal(WATCHDOG_SIGNAL, on_signal)
    timer = threading.Timer(seconds, signal.pthread_kill, (threading.main_thread().ident, WATCHDOG_SIGNAL))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        state["done"] = True
        timer.cancel()
        signal.signal(WATCHDOG_SIGNAL, previous)


def _call_sync(fn: Callable, timeout_s: float, **kwargs: Any) -> Any:
    """fn(**kwargs), or the exception it raised (RewardTimeout past `timeout_s`). On the main thread it runs
    there (libraries with signal-based time-outs need it); on another thread it runs on a daemon thread that
    is abandoned at the limit."""
    if threading.current_thread() is threading.main_thread() or not math.isfinite(timeout_s):
        try:
            with _deadline(timeout_s):
                return fn(**kwargs)
        except (Exception, RewardTimeout) as e:  # noqa: BLE001 - any failure is excluded and counted
            return e
    box: list[Any] = [RewardTimeout()]

    def run():
        box[0] = _call_sync(fn, math.inf, **kwargs)

    worker = threading.Thread(target=run, daemon=True, name="aha-reward-call")
    worker.start()
    worker.join(timeout_s)
    return box[0]


def _start_async(fns: list[Callable], timeout_s: float, **kwargs: Any) -> Callable[[], list]:
    """Start awaiting the async reward functions together on a daemon thread, each with `timeout_s`; returns a
    function that waits for them (bounded) and gives their outcomes as _call_sync's. A coroutine that blocks
    its event loop past the limit is abandoned with its thread."""
    limit = None if not math.isfinite(timeout_s) else timeout_s

    async def one(fn):
        try:
            return await asyncio.wait_for(fn(**kwargs), limit)
        except asyncio.TimeoutError:
            return RewardTimeout()

    async def gather() -> list:
        return await asyncio.gather(*(one(fn) for fn in fns), return_exceptions=True)

    box: list[Any] = [[RewardTimeout() for _ in fns]]
    worker = threading.Thread(target=lambda: box.__setitem__(0, asyncio.run(gather())), daemon=True,
                              name="aha-async-rewards")
    worker.start()

    def outcomes() -> list:
        worker.join(None if limit is None else limit + ASYNC_GRACE_S)
        return box[0]

    return outcomes


def _values(fn: Callable, outcome: Any, n: int, columns: Iterable[str], kwargs: dict) -> list | None:
    """The n values a call returned; None when it raised or timed out (logged once per function)."""
    name = reward_name(fn)
    if isinstance(outcome, KeyError) and outcome.args and outcome.args[0] not in kwargs:
        raise _missing_column(fn, outcome.args[0], columns) from outcome
    if isinstance(outcome, RewardTimeout):
        if _first_time(name + "/timeout"):
            logger.error("reward function %s ran past its time limit (reward_timeout); its rewards are excluded", name)
        return None
    if isinstance(outcome, BaseException):
        if not isinstance(outcome, Exception):
            raise outcome  # KeyboardInterrupt, SystemExit: not ours to swallow
        if _first_time(name):
            logger.error("reward function %s raised; its rewards are NaN for this batch", name,
                         exc_info=(type(outcome), outcome, outcome.__traceback__))
        return None
    if outcome is None or isinstance(outcome, (str, bytes, dict)) or not hasattr(outcome, "__len__"):
        raise ValueError(f"reward function {name} returned {type(outcome).__name__} {outcome!r:.40}; "
                         f"expected a list of {n} values (one per completion, None where not applicable)")
    values = list(outcome)
    if len(values) != n:
        raise ValueError(f"reward function {name} returned {len(values)} values, expected {n}")
    return values


def score_completions(reward_funcs: list[Callable], prompts: list, completions: list, columns: dict[str, list],
                      completion_ids: list | None = None, trainer_state: Any = None,
                      timeout_s: float = math.inf) -> tuple[Any, dict[str, float]]:
    """Rewards [N, F] (float32, NaN where a value is None, non-finite, or its function raised or timed out) and
    metrics: `reward/errors` (calls that raised), `reward/call_timeouts` (calls cut at `timeout_s`),
    `reward/<name>/failed` (1.0 when that function's call raised or timed out),
    `reward/nan` (returned values that are NaN, inf or not numbers; None is "not applicable" and not counted),
    `reward/<name>/none_frac` (share of NaN in the column), and each function's `pop_metrics()` as
    `reward/<key>`, summed over functions.

    Async functions are awaited together on a helper thread while the sync ones run one after another on the
    calling thread: verifiers parallelise their own batches, and libraries such as math-verify use signal-based
    time-outs that only work on the main thread. Every call gets `timeout_s` of wall clock."""
    import torch  # here, so that the verifiers themselves import without torch

    n = len(completions)
    kwargs: dict[str, Any] = dict(columns, prompts=prompts, completions=completions)
    if completion_ids is not None:
        kwargs["completion_ids"] = completion_ids
    if trainer_state is not None:
        kwargs["trainer_state"] = trainer_state  # as TRL passes it: curricula read trainer_state.global_step
    logged: dict[str, list[float]] = {}
    kwargs["log_metric"] = lambda name, value: logged.setdefault(str(name), []).append(float(value))
    kwargs["log_extra"] = _no_log_extra
    async_idx = [i for i, fn in enumerate(reward_funcs) if _is_async(fn)]
    outcomes: list[Any] = [None] * len(reward_funcs)
    async_outcomes = _start_async([reward_funcs[i] for i in async_idx], timeout_s, **kwargs) if async_idx else None
    for i, fn in enumerate(reward_funcs):
        if i not in async_idx:
            outcomes[i] = _call_sync(fn, timeout_s, **kwargs)
    for i, value in zip(async_idx, async_outcomes() if async_outcomes else []):
        outcomes[i] = value

    rewards = torch.full((n, len(reward_funcs)), math.nan, dtype=torch.float32)  # [N, F]
    metrics: dict[str, float] = {"reward/errors": 0.0, "reward/call_timeouts": 0.0, "reward/nan": 0.0}
    for j, (fn, outcome) in enumerate(zip(reward_funcs, outcomes)):
        name = reward_name(fn)
        values = _values(fn, outcome, n, columns, kwargs)
        metrics[f"reward/{name}/failed"] = float(values is None)
        if values is None:
            _LAST_FAILURE[name] = outcome
            metrics["reward/call_timeouts" if isinstance(outcome, RewardTimeout) else "reward/errors"] += 1
        else:
            floats = [_as_float(v) for v in values]
            rewards[:, j] = torch.tensor(floats, dtype=torch.float32)
            bad = [v for v, x in zip(values, floats) if v is not None and math.isnan(x)]  # NaN, inf, not a number
            metrics["reward/nan"] += len(bad)
            if bad and _first_time(name + "/nan"):
                logger.error("reward function %s returned %d non-finite or non-numeric value(s) (first: %r); "
                             "they are excluded like None", name, len(bad), bad[0])
        metrics[f"reward/{name}/none_frac"] = _none_frac(rewards[:, j])
        pop = getattr(fn, "pop_metrics", None)
        if callable(pop):
            for key, value in pop().items():
                metrics[f"reward/{key}"] = metrics.get(f"reward/{key}", 0.0) + float(value)
    metrics.update({LOGGED + name: sum(values) / len(values) for name, values in logged.items()})
    return rewards, metrics


def _no_log_extra(column: str, values: list) -> None:
    raise NotImplementedError(f"log_extra({column!r}, ...): aha writes each completion with its prompt and rewards "
                              "to completions.jsonl (log_completions_steps) and takes no extra columns; report a "
                              "number with log_metric(name, value) instead")


def score_groups(reward_funcs: list[Callable], rows: list[dict], texts: list[str], n: int,
                 completion_ids: list | None = None, trainer_state: Any = None,
                 timeout_s: float = math.inf) -> tuple[Any, dict[str, float]]:
    """Score n completions of each row, prompt-major (texts i*n .. i*n+n-1 answer rows[i]): the one entry point
    that training, evaluation and rejection sampling share. Each row's prompt and columns are repeated n times and
    completions of chat prompts are wrapped as assistant messages, as TRL passes them. Returns rewards [N, F] and
    the metrics of `score_completions` plus `reward/<name>/mean` and `reward/<name>/std` over the values given."""
    from ..data import is_conversational
    prompts = [r["prompt"] for r in rows for _ in range(n)]
    completions = [[{"role": "assistant", "content": t}] for t in texts] if is_conversational(rows[0]["prompt"]) \
        else list(texts)
    columns = {k: [r.get(k) for r in rows for _ in range(n)] for k in rows[0] if k != "prompt"}
    rewards, metrics = score_completions(reward_funcs, prompts, completions, columns, completion_ids=completion_ids,
                                         trainer_state=trainer_state, timeout_s=timeout_s)  # [N, F]
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


def record_failure(name: str, error: BaseException) -> None:
    """Note a reward function's failure seen elsewhere (a reward actor), for `last_failure`."""
    _LAST_FAILURE[name] = error
