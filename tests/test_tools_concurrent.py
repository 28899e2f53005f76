"""A round's tool calls side by side (aha.envs.tools.call_all, from the turn loop): episodes at once, each
environment's calls in order, every call under tool_timeout, no call after one timed out on its environment."""

import threading
import time

import pytest
from transformers import AutoTokenizer

from aha.data.toolcalls import ToolChat
from aha.envs import Agent
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
