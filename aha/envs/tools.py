"""Tools as TRL takes them: plain sync or async functions, or an environment's public methods, with type hints and
a Google-style docstring; the schema the model sees is transformers' `get_json_schema` of each. Each name is one
tool: two tools of one name (a function twice, or a function beside an environment's method) are an error.

Calling one never raises and never hangs. What the model gets back is always a tool message: the result as text
(`str()` of a value that is not a string, as TRL does), or TRL's error form `{'error': '...'}` when the call was
malformed, named no tool of the episode, had arguments the schema refuses (a missing or unexpected name, a value of
the wrong type), raised, returned something `str()` cannot take, ran past `tool_timeout` (a sync tool runs on a
daemon thread that is abandoned then; an async one is cancelled), or called an environment retired by an earlier
time-out. The result's text (and an exception's) is written where the call runs, under the same limit: a `__str__`
that raises SystemExit or sleeps is the call's failure, never the trainer's. Each outcome is counted (`OUTCOMES`).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import queue
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, Callable

from ..data.toolcalls import ToolCall
from ..rewards.deadline import RewardTimeout
from ..rewards.scoring import ASYNC_GRACE_S, awaited, call_on_thread, start_async

OUTCOMES = ("ok", "malformed", "unknown", "bad_arguments", "raised", "bad_result", "timeout", "retired")
"""What a call can come to; all but ok and timeout count in tools/errors."""
TOOL_WORKERS = 64
"""Most sync tool calls that run at once (`call_all`), each on a daemon thread of CALL_THREADS under tool_timeout;
the others wait for a free one. Async calls are not counted: a round's all share one event loop."""
JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer(),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, (list, tuple)),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}
"""A JSON-schema type -> whether a value is of it (a whole float is an integer, as JSON writes 3.0)."""


def tool_schema(fn: Callable) -> dict:
    """The JSON schema the model is shown (transformers' get_json_schema); a tool without type hints or a Google
    docstring is an error naming it."""
    from transformers.utils import get_json_schema
    try:
        return get_json_schema(fn)
    except Exception as e:  # DocstringParsingException, TypeHintParsingException
        raise ValueError(f"tool {getattr(fn, '__name__', fn)!r}: {e} (a tool needs type hints and a Google-style "
                         "docstring with an Args: section, as TRL and transformers require)") from e


def error_message(text: str) -> str:
    """A failed call's tool message, in TRL's form: str({'error': text})."""
    return str({"error": text})


@dataclass
class ToolResult:
    name: str
    content: str         # the tool message's text: what the model reads next
    outcome: str         # one of OUTCOMES
    non_string: bool = False  # the tool returned a value that is not a string (given to the model as its str())

    def message(self) -> dict:
        return {"role": "tool", "name": self.name, "content": self.content}


def check_arguments(schema: dict, arguments: Any) -> tuple[dict | None, str | None]:
    """(the arguments to call with, None) or (None, why the schema refuses them). Whole floats given for integer
    parameters become ints."""
    if not isinstance(arguments, dict):
        return None, f"arguments must be a JSON object, got {type(arguments).__name__} {arguments!r:.60}"
    params = schema["function"].get("parameters", {})
    props, name = params.get("properties", {}), schema["function"]["name"]
    extra = [k for k in arguments if k not in props]
    missing = [k for k in params.get("required", []) if k not in arguments]
    if extra or missing:
        return None, (f"{name} takes ({', '.join(props)})" + (f"; unexpected {extra}" if extra else "")
                      + (f"; missing {missing}" if missing else ""))
    out = {}
    for key, value in arguments.items():
        kinds = props[key].get("type", [])
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if props[key].get("nullable"):
            kinds.append("null")
        if kinds and not any(JSON_TYPES.get(k, lambda v: True)(value) for k in kinds):
            return None, f"argument {key!r} of {name} must be {' or '.join(kinds)}, got {type(value).__name__} {value!r:.40}"
        out[key] = int(value) if kinds == ["integer"] and isinstance(value, float) else value
    return out, None


def describe(e: BaseException) -> str:
    """An exception's text (its type's name when empty); when its `__str__` fails, that it has none."""
    try:
        return str.__str__(str(e)) or type(e).__name__
    except BaseException as inner:  # noqa: BLE001 - a hostile __str__ (SystemExit included) is only a missing text
        return f"{type(e).__name__} (its message cannot be written: {type(inner).__name__})"


def _finished(finish: Callable, value: Any) -> tuple[str, Any]:
    try:
        return "ok", finish(value)
    except BaseException as e:  # noqa: BLE001 - off the main thread, as the call itself
        return "bad_result", describe(e)


def settling(fn: Callable, kwargs: dict, finish: Callable) -> Callable:
    """fn(**kwargs) as a function of nothing (a coroutine function when fn is one) that gives ("ok", finish(value)),
    ("raised", (the exception's type name, its text)) or ("bad_result", the text of what finish raised)."""
    if inspect.iscoroutinefunction(fn):
        async def settled():
            try:
                value = await fn(**kwargs)
            except (Exception, SystemExit, KeyboardInterrupt) as e:  # CancelledError is the time limit's own
                return "raised", (type(e).__name__, describe(e))
            return _finished(finish, value)
        return settled

    def settled_sync():
        try:
            value = fn(**kwargs)
        except BaseException as e:  # noqa: BLE001 - off the main thread no stop signal can land here
            return "raised", (type(e).__name__, describe(e))
        return _finished(finish, value)
    return settled_sync


def run_settled(settled: Callable, timeout_s: float):
    """A `settling` function's outcome, or RewardTimeout past `timeout_s`: a sync one on a daemon thread, abandoned
    at the limit; an async one on an event loop of its own, cancelled (start_async)."""
    if inspect.iscoroutinefunction(settled):
        return start_async([(settled, {})], timeout_s)()[0]
    return call_on_thread(settled, timeout_s, {}, name="aha-tool-call")


def guarded(fn: Callable, kwargs: dict, timeout_s: float, finish: Callable = lambda value: value):
    """("ok", finish(fn(**kwargs))), ("raised", (the exception's type name, its text)), ("bad_result", the text of
    what finish raised), or RewardTimeout past `timeout_s`. The call, `finish` and the exception's text all run
    where the call can be cut off (a sync fn on a daemon thread, abandoned at the limit; an async one on an event
    loop, cancelled), so nothing of the callee's objects (a __str__ that raises SystemExit or sleeps) runs on the
    caller's thread."""
    return run_settled(settling(fn, kwargs, finish), timeout_s)


def as_text(value: Any) -> tuple[str, bool]:
    """A tool's value as the text the model reads (a plain str, even of a str subclass), and whether it was not a
    string (then it is its str(), as TRL gives it)."""
    if isinstance(value, str):
        return str.__str__(value), False
    try:
        return str.__str__(str(value)), True
    except BaseException as e:  # noqa: BLE001 - SystemExit from a __str__ too: a result that is not text
        raise ValueError(f"a {type(value).__name__} that cannot be written as text ({type(e).__name__}: "
                         f"{describe(e)})") from None


def check_unique(tools: list[Callable], where: str = "") -> None:
    """Each tool's name once: the model calls a tool by its name, so a second tool of that name could never be
    called (TRL keeps the later one, silently); the duplicate is an error naming it."""
    seen: set = set()
    for fn in tools:
        name = getattr(fn, "__name__", repr(fn))
        if name in seen:
            raise ValueError(f"two tools are named {name!r}{where}: the model calls a tool by its name, so each name "
                             "must be one tool (rename one, or give it once)")
        seen.add(name)


class Toolbox:
    """The tools of one episode by name (standalone tools, then its environment's methods), each call bounded by
    `timeout_s`. When a call to one of `env_methods` runs past the limit, its thread may still be changing the
    environment: the environment is retired (`retire()` is called once; the agent builds a fresh one for later
    episodes) and this episode's later calls to its methods get an error message instead of running."""

    def __init__(self, tools: list[Callable], timeout_s: float, schemas: list[dict] | None = None,
                 env_methods: list[str] = (), retire: Callable[[], None] | None = None):
        check_unique(tools)
        self.tools = {fn.__name__: fn for fn in tools}
        self.schemas = schemas if schemas is not None else [tool_schema(fn) for fn in tools]
        self.by_name = {s["function"]["name"]: s for s in self.schemas}
        self.timeout_s, self.env_methods, self.retire, self.retired = timeout_s, set(env_methods), retire, False

    def call(self, call: ToolCall) -> ToolResult:
        """The tool message for one call (see the module doc); never raises."""
        ready = self.ready(call)
        return ready if isinstance(ready, ToolResult) else self.result(call.name, run_settled(ready, self.timeout_s))

    def ready(self, call: ToolCall) -> ToolResult | Callable:
        """The call as a `settling` function to run under timeout_s, or the message of a call that is not run (it is
        malformed, names no tool, has arguments the schema refuses, or is on a retired environment)."""
        if call.error is not None:
            return ToolResult(call.name or "invalid", error_message(call.error), "malformed")
        if call.name not in self.tools:
            return ToolResult(call.name, error_message(f"Tool {call.name} not found. Available: {sorted(self.tools)}"),
                              "unknown")
        if self.retired and call.name in self.env_methods:
            return ToolResult(call.name, error_message(f"{call.name} was not run: an earlier call ran past tool_timeout"
                                                       " and the environment it may still be changing was retired"),
                              "retired")
        kwargs, why = check_arguments(self.by_name[call.name], call.arguments)
        if why is not None:
            return ToolResult(call.name, error_message(why), "bad_arguments")
        return settling(self.tools[call.name], kwargs, as_text)

    def result(self, name: str, outcome: Any) -> ToolResult:
        """The message of a call that ran (`run_settled`'s outcome); one past the limit on an environment's method
        retires the environment."""
        if isinstance(outcome, RewardTimeout):
            self._retire(name)
            return ToolResult(name, error_message(f"{name} ran past tool_timeout={self.timeout_s:g} s"), "timeout")
        if isinstance(outcome, BaseException):  # an async tool's own CancelledError, which no except clause takes
            return ToolResult(name, error_message(describe(outcome)), "raised")
        kind, value = outcome
        if kind == "raised":
            return ToolResult(name, error_message(value[1]), "raised")
        if kind == "bad_result":
            return ToolResult(name, error_message(f"{name} returned {value}"), "bad_result")
        return ToolResult(name, value[0], "ok", non_string=value[1])

    def _retire(self, name: str) -> None:
        if name in self.env_methods:
            self.retire_environment()

    def retire_environment(self) -> None:
        """Retire this episode's environment (once): a call on it ran past the limit and may still change it."""
        if not self.retired:
            self.retired = True
            if self.retire is not None:
                self.retire()


class RoundLoop:
    """The one event loop a round's async calls share, on a daemon thread, each call under its own limit (awaited).
    A coroutine that blocks the loop cannot be cancelled: as start_async's, the calls waiting on it are given up as
    timeouts ASYNC_GRACE_S past their limit and the loop is abandoned with its thread; later calls get a fresh one."""

    def __init__(self):
        self.loop: asyncio.AbstractEventLoop | None = None

    def submit(self, settled: Callable, timeout_s: float) -> tuple[Future, float, asyncio.AbstractEventLoop]:
        """The call's future, the time.monotonic() past which its loop is taken to be blocked, and the loop."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=_run_loop, args=(self.loop,), daemon=True, name="aha-async-tools").start()
        return (asyncio.run_coroutine_threadsafe(awaited(settled, {}, timeout_s), self.loop),
                time.monotonic() + timeout_s + ASYNC_GRACE_S, self.loop)

    def close(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Stop the loop (or `loop`, if it is still the one in use) when it is next free, which a blocked one may
        never be; a later call starts a fresh one."""
        if self.loop is not None and loop in (None, self.loop):
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.loop = None


class CallThreads:
    """Daemon threads that run sync tool calls, kept from round to round: a call starts a thread only when every
    kept one is busy. A call that runs past its limit is given up by its caller (`call_all`) and keeps its thread
    until it ends, if ever; the thread then takes calls again."""

    def __init__(self):
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.idle, self.lock = 0, threading.Lock()

    def submit(self, settled: Callable) -> Future:
        """settled() on a kept thread: a future of its outcome (its value, or the exception it raised)."""
        future: Future = Future()
        with self.lock:
            fresh = self.idle == 0
            if not fresh:
                self.idle -= 1  # one waiting thread takes this call
        if fresh:
            threading.Thread(target=self._work, daemon=True, name="aha-tool-call").start()
        self.calls.put((settled, future))
        return future

    def _work(self) -> None:
        while True:
            settled, future = self.calls.get()
            future.set_result(call_on_thread(settled, math.inf, {}))  # math.inf: here, caught, no thread of its own
            with self.lock:
                self.idle += 1


CALL_THREADS = CallThreads()
"""The threads every round's sync tool calls run on (one process-wide set)."""


def _outcome(future: Future) -> Any:
    """A call's outcome as run_settled gives it: what it returned, what ended it (a tool's own CancelledError), or
    RewardTimeout when it is not done."""
    if not future.done():
        return RewardTimeout()
    try:
        return future.result()
    except BaseException as e:  # noqa: BLE001 - the call's, not the caller's
        return e


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    try:
        loop.run_forever()
    finally:
        loop.close()


def call_all(jobs: list[tuple[Toolbox, list[ToolCall]]]) -> list[list[ToolResult]]:
    """The results of each toolbox's calls, in the order given. The calls of a round run side by side: sync ones on
    at most TOOL_WORKERS kept threads (CALL_THREADS), async ones all on one event loop (RoundLoop), each under
    tool_timeout from when it starts. The calls to one environment's methods run one after another in the order the
    model wrote them, and none after one ran past tool_timeout (Toolbox.call); calls to standalone tools keep no
    order (there is no state between them to keep it for), so they run side by side, even two of one episode: a
    standalone tool must take calls at once, as it does from the episodes of a round. A tool that hangs costs a
    round its timeout once, not once per call."""
    results: list[list[ToolResult | None]] = [[None] * len(calls) for _, calls in jobs]
    queues = []  # (job, call) indices to run one after another: an environment's calls, or one standalone call
    for j, (box, calls) in enumerate(jobs):
        own = [(j, i) for i, c in enumerate(calls) if c.name in box.env_methods]
        queues += ([own] if own else []) + [[(j, i)] for i, c in enumerate(calls) if c.name not in box.env_methods]
    loop, running, waiting = RoundLoop(), {}, []  # running: future -> (its queue, when it is given up, its loop)
    threads = [0]  # sync calls running (each holds a thread of CALL_THREADS)

    def start(queue: list) -> None:
        """Answer the queue's calls that are not run; start the first that is (or leave the queue waiting for a
        thread)."""
        while queue:
            j, i = queue[0]
            box = jobs[j][0]
            ready = box.ready(jobs[j][1][i])
            if not isinstance(ready, ToolResult):
                if inspect.iscoroutinefunction(ready):
                    future, deadline, its_loop = loop.submit(ready, box.timeout_s)
                elif threads[0] >= TOOL_WORKERS:
                    waiting.append(queue)
                    return
                else:
                    future, deadline, its_loop = CALL_THREADS.submit(ready), time.monotonic() + box.timeout_s, None
                    threads[0] += 1
                running[future] = queue, deadline, its_loop
                return
            results[j][i] = ready
            queue.pop(0)

    for queue in queues:
        start(queue)
    while running:
        first = min(deadline for _, deadline, _ in running.values())
        wait(running, None if first == math.inf else max(first - time.monotonic(), 0), FIRST_COMPLETED)
        now = time.monotonic()
        for future, (queue, deadline, its_loop) in list(running.items()):
            if future.done() or deadline <= now:
                del running[future]
                if its_loop is None:
                    threads[0] -= 1
                elif not future.done():  # its loop is blocked
                    loop.close(its_loop)
                j, i = queue.pop(0)
                results[j][i] = jobs[j][0].result(jobs[j][1][i].name, _outcome(future))
                start(queue)
        while waiting and threads[0] < TOOL_WORKERS:
            start(waiting.pop(0))
    loop.close()
    return results
