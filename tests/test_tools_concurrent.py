"""A round's tool calls side by side (aha.envs.tools.call_all, from the turn loop): episodes at once, each
environment's calls in order, every call under tool_timeout, no call after one timed out on its environment; async
calls all on one event loop; calls to standalone tools at once, even two of one episode."""

import asyncio
import threading
import time

import pytest
from transformers import AutoTokenizer

from aha.data.toolcalls import ToolCall, ToolChat
from aha.envs import Agent, Toolbox
from aha.envs import tools as tools_module
from aha.envs.tools import call_all
from aha.rollout import SamplingParams
from aha.rollout.turns import Episode, run_turns
from scripted import CounterEnv, ScriptedAgentEngine


@pytest.fixture(scope="module")
def tok(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


def call(name: str, **arguments) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments!r}}}</tool_call>'.replace("'", '"')


def run(tok, agent: Agent, n: int, first_turn: str):
    """n one-prompt episodes whose first model turn is `first_turn`, then a plain answer; (Rollout, envs, s)."""
    chat, envs = ToolChat(tok), agent.environments([None] * n)
    eps = []
    for env in envs:
        prompt = agent.reset(env, {"prompt": [{"role": "user", "content": "go"}], "target": 3})
        eps.append(Episode(prompt, chat.prompt_ids(prompt, agent.schemas[None]), agent.toolbox(env, None)))
    script = lambda context: first_turn if "<|im_start|>tool" not in context else "done"  # noqa: E731
    t0 = time.monotonic()
    out = run_turns(ScriptedAgentEngine(None, tok, script=script), chat, eps, 1, SamplingParams(max_new_tokens=400),
                    None, None)
    return out, envs, time.monotonic() - t0


class Logged(CounterEnv):
    """Records the calls it gets in the order they run; the first sleeps longest, so calls run at once would end
    (and be logged) out of order."""

    def __init__(self):
        self.log, self.lock = [], threading.Lock()

    def mark(self, k: int) -> str:
        """
        Sleeps (0.3 - 0.1 k s), then logs k.

        Args:
            k: Which call.
        """
        time.sleep(0.3 - 0.1 * k)
        with self.lock:
            self.log.append(k)
        return str(k)


def test_episodes_call_their_tools_side_by_side_and_each_environment_in_order(tok):
    # 12 episodes x 3 calls of 0.3 + 0.2 + 0.1 s: 7.2 s one after another; side by side each episode's 0.6 s
    out, envs, seconds = run(tok, Agent(environment_factory=Logged, tool_timeout=5.0), 12,
                             "".join(call("mark", k=k) for k in range(3)))
    assert all(env.log == [0, 1, 2] for env in envs)
    assert all(e["outcomes"] == {"ok": 3} and e["finish"] == "stop" for e in out.episodes)
    assert seconds < 7.2 / 3


class Hangs(CounterEnv):
    entered = 0

    def hang(self, x: int) -> str:
        """
        Never answers in time.

        Args:
            x: Anything.
        """
        Hangs.entered += 1
        time.sleep(3)
        return "late"


def test_a_hanging_environment_costs_a_round_its_timeout_once_and_is_not_called_again(tok):
    # 8 episodes, each calling the hanging method twice: 8 x 0.3 s one episode after another
    Hangs.entered = 0
    agent = Agent(environment_factory=Hangs, tool_timeout=0.3)
    out, envs, seconds = run(tok, agent, 8, call("hang", x=1) + call("hang", x=2))
    assert all(e["outcomes"] == {"timeout": 1, "retired": 1} and e["environment_retired"] for e in out.episodes)
    assert Hangs.entered == 8 and all(e not in agent.pool[None] for e in envs)  # every one retired, none lost
    assert seconds < 8 * 0.3 / 2


LOOPS: list[int] = []


async def nap(x: int) -> str:
    """
    Sleeps 0.2 s on its event loop, noting which loop.

    Args:
        x: Echoed.
    """
    LOOPS.append(id(asyncio.get_running_loop()))
    await asyncio.sleep(0.2)
    return f"nap {x}"


def test_async_calls_of_a_round_share_one_event_loop_and_run_side_by_side():
    # 16 episodes x 2 calls of a 0.2 s async tool: 6.4 s one after another
    LOOPS.clear()
    boxes = [Toolbox([nap], 5.0) for _ in range(16)]
    t0 = time.monotonic()
    out = call_all([(box, [ToolCall("nap", {"x": k}), ToolCall("nap", {"x": k + 100})]) for k, box in enumerate(boxes)])
    seconds = time.monotonic() - t0
    assert [[r.content for r in results] for results in out] == [[f"nap {k}", f"nap {k + 100}"] for k in range(16)]
    assert len(LOOPS) == 32 and len(set(LOOPS)) == 1
    assert seconds < 6.4 / 2


class AsyncLogged(CounterEnv):
    """Logged, with an async method: calls run at once would end (and be logged) out of order."""

    def __init__(self):
        self.log = []

    async def amark(self, k: int) -> str:
        """
        Sleeps (0.3 - 0.1 k s) on its event loop, then logs k.

        Args:
            k: Which call.
        """
        LOOPS.append(id(asyncio.get_running_loop()))
        await asyncio.sleep(0.3 - 0.1 * k)
        self.log.append(k)
        return str(k)


def test_async_environment_methods_keep_each_environments_order_on_one_loop(tok):
    # 12 episodes x 3 calls of 0.3 + 0.2 + 0.1 s: 7.2 s one after another; side by side each episode's 0.6 s
    LOOPS.clear()
    out, envs, seconds = run(tok, Agent(environment_factory=AsyncLogged, tool_timeout=5.0), 12,
                             "".join(call("amark", k=k) for k in range(3)))
    assert all(env.log == [0, 1, 2] for env in envs)
    assert all(e["outcomes"] == {"ok": 3} and e["finish"] == "stop" for e in out.episodes)
    assert len(LOOPS) == 36 and len(set(LOOPS)) == 1
    assert seconds < 7.2 / 2


def stalls(x: int) -> str:
    """
    Never answers in time.

    Args:
        x: Anything.
    """
    time.sleep(3)
    return "late"


async def astalls(x: int) -> str:
    """
    Never answers in time, awaiting.

    Args:
        x: Anything.
    """
    await asyncio.sleep(3)
    return "late"


@pytest.mark.parametrize("tool", [stalls, astalls], ids=["sync", "async"])
def test_a_hanging_standalone_tool_called_twice_in_one_turn_costs_its_timeout_once(tool):
    box = Toolbox([tool], 0.5)
    t0 = time.monotonic()
    [results] = call_all([(box, [ToolCall(tool.__name__, {"x": 1}), ToolCall(tool.__name__, {"x": 2})])])
    seconds = time.monotonic() - t0
    assert [r.outcome for r in results] == ["timeout", "timeout"]
    assert results[0].content == f"{{'error': '{tool.__name__} ran past tool_timeout=0.5 s'}}"
    assert not box.retired  # a standalone tool has no environment to retire
    assert seconds < 1.8 * 0.5  # one after another: 1.0 s


async def sleeps_for(s: float) -> str:
    """
    Sleeps s seconds.

    Args:
        s: Seconds.
    """
    await asyncio.sleep(s)
    return f"slept {s}"


def waits_for(s: float) -> str:
    """
    Sleeps s seconds, not awaiting.

    Args:
        s: Seconds.
    """
    time.sleep(s)
    return f"waited {s}"


def test_results_come_in_the_order_the_model_wrote_the_calls_whatever_ends_first(tok):
    # the first calls end last; calls that are not run (unknown, malformed, bad arguments) are answered at once
    agent = Agent(tools=[sleeps_for, waits_for], environment_factory=AsyncLogged, tool_timeout=5.0)
    [env] = agent.environments([None])
    box = agent.toolbox(env, None)
    calls = [ToolCall("sleeps_for", {"s": 0.3}), ToolCall("amark", {"k": 0}), ToolCall("waits_for", {"s": 0.2}),
             ToolCall("nope", {}), ToolCall(None, error="not JSON"), ToolCall("sleeps_for", {"s": 0.0}),
             ToolCall("waits_for", {"t": 1}), ToolCall("amark", {"k": 2}), ToolCall("waits_for", {"s": 0.0})]
    results, [other] = call_all([(box, calls), (Toolbox([waits_for], 5.0), [ToolCall("waits_for", {"s": 0.1})])])
    assert other.content == "waited 0.1"
    assert [r.outcome for r in results] == ["ok", "ok", "ok", "unknown", "malformed", "ok", "bad_arguments", "ok",
                                            "ok"]
    assert [r.content for r in results if r.outcome == "ok"] == ["slept 0.3", "0", "waited 0.2", "slept 0.0", "2",
                                                                 "waited 0.0"]
    assert env.log == [0, 2]


def test_a_coroutine_that_blocks_the_shared_loop_is_given_up_and_the_next_round_gets_a_fresh_loop(monkeypatch):
    async def blocks(x: int) -> str:
        """
        Blocks its event loop.

        Args:
            x: Anything.
        """
        time.sleep(2)
        return "late"

    monkeypatch.setattr(tools_module, "ASYNC_GRACE_S", 0.2)
    LOOPS.clear()
    t0 = time.monotonic()
    [[blocked]] = call_all([(Toolbox([blocks], 0.2), [ToolCall("blocks", {"x": 1})])])
    assert blocked.outcome == "timeout" and time.monotonic() - t0 < 1.5  # given up at 0.4 s, not 2 s
    [[woke]] = call_all([(Toolbox([nap], 5.0), [ToolCall("nap", {"x": 7})])])
    assert woke.content == "nap 7" and time.monotonic() - t0 < 1.5  # not queued behind the blocked loop


async def cancels(x: int) -> str:
    """
    Raises CancelledError of its own.

    Args:
        x: Anything.
    """
    raise asyncio.CancelledError("mine")


def test_an_async_tools_own_cancelled_error_is_its_failure_not_a_timeout_or_the_callers():
    box = Toolbox([cancels], 5.0)
    alone, [[together]] = box.call(ToolCall("cancels", {"x": 1})), call_all([(box, [ToolCall("cancels", {"x": 1})])])
    assert alone.outcome == "raised" and together.outcome == "raised" and not box.retired


def test_sync_calls_run_on_kept_threads_at_most_tool_workers_at_once(monkeypatch):
    """Past TOOL_WORKERS running sync calls the rest wait for a thread (each still timed from its own start); a
    later round reuses the threads of an earlier one instead of starting its own."""
    live, peak, lock, ran_on = [0], [0], threading.Lock(), []

    def nap(s: float) -> str:
        """
        Sleeps.

        Args:
            s: Seconds.
        """
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            ran_on.append(threading.current_thread())  # the Thread objects kept: none is a later one
        time.sleep(s)
        with lock:
            live[0] -= 1
        return "ok"

    monkeypatch.setattr(tools_module, "TOOL_WORKERS", 2)
    box = Toolbox([nap], 1.0)
    jobs = [(box, [ToolCall("nap", {"s": 0.2})]) for _ in range(6)]
    t0 = time.monotonic()
    results = call_all(jobs)
    assert [[r.outcome for r in rs] for rs in results] == [["ok"]] * 6  # none waited into a timeout
    assert peak[0] == 2 and time.monotonic() - t0 >= 0.55               # three waves of two
    existing = threading.enumerate()
    assert call_all(jobs[:2])[0][0].outcome == "ok"
    assert all(any(t is u for u in existing) for t in ran_on[6:])  # the second round started no thread
