"""An agent's tools and environments, with TRL's contract (`GRPOTrainer(tools=..., environment_factory=...)`).

- `tools`: plain functions (sync or async) every episode may call.
- `environment_factory`: a class (or any zero-argument callable) building an environment, or a dict of them by
  name. An environment is built per concurrent episode and reused across steps (reset between episodes), so an
  expensive `__init__` is paid once. `reset(**row)` starts an episode with the dataset row's columns (the whole row,
  as TRL passes it; with a dict of factories, all but `environment`) and returns None, a string, or a list of text
  content parts (`{"type": "text", "text": ...}`, their texts joined), which is appended to the prompt's last
  message (its content + the string, as TRL joins them; with no dataset the prompt is one empty user message, so
  the string is the prompt). Any other return (a dict, an image part) is an error stating that contract. `reset`
  runs bounded by `tool_timeout`, as a tool call; one that raises or runs past it is an error naming the
  environment's class and the row (one past it also retires the environment, as below). Its public methods are the
  episode's tools, after the standalone ones (a name used twice is an error, see aha.envs.tools). An optional `get_reward()` (sync or async) scores the episode it
  ran: it is a reward function named after the class, weight 1 (`reward_weights` weigh the `reward_funcs` only),
  summed with them. An optional `state_key()` (aha's) names the state the environment is in, read before each model
  turn, bounded by `tool_timeout` as a tool call: `advantage_estimator: gigpo` groups the turns that act from one
  state (with what each episode has read). An optional `progress()` (aha's) is partial credit for the `progress`
  reward (aha.rewards.episode). None of these four is a tool.
- An environment one of whose calls ran past `tool_timeout` may still be changed by that call's thread: it is taken
  out of the pool (a fresh one is built from the factory when an episode next needs one) and counted
  (`tools/environments_replaced`); the rest of its episode gets an error message for each call to its methods, its
  state_key is not read again and its get_reward is not read: the episode's environment reward is None (counted).
- With a dict of factories, each row's `environment` column names its environment, and only that environment's
  methods are offered to the episode.
"""

from __future__ import annotations

import inspect
import reprlib
from typing import Callable

from ..rewards.deadline import RewardTimeout
from ..rewards.episode import usable_environments
from .tools import Toolbox, check_unique, guarded, tool_schema

RESERVED = ("reset", "get_reward", "state_key", "progress")
"""Environment methods that are not tools."""
PLACEHOLDER_PROMPT = [{"role": "user", "content": ""}]
"""The prompt of a row without one (an environment that owns its data writes it in `reset`), as TRL's."""


def methods(env) -> list[Callable]:
    """An environment's tools: its public methods but the RESERVED ones, in name order (as inspect lists them)."""
    return [m for name, m in inspect.getmembers(env, predicate=inspect.ismethod)
            if name not in RESERVED and not name.startswith("_")]


class EnvironmentReward:
    """An environment class's `get_reward` as a reward function: each episode of that exact class scores itself;
    episodes of another environment, and one retired during its episode (`usable_environments`), get None."""

    def __init__(self, env_type: type):
        self.env_type, self.__name__ = env_type, env_type.__name__

    def __call__(self, environments: list, episodes: list | None = None, **kwargs) -> list:
        return [e.get_reward() if type(e) is self.env_type else None
                for e in usable_environments(environments, episodes)]


class AsyncEnvironmentReward(EnvironmentReward):
    async def __call__(self, environments: list, episodes: list | None = None, **kwargs) -> list:
        return [await e.get_reward() if type(e) is self.env_type else None
                for e in usable_environments(environments, episodes)]


class Agent:
    """The tools and environment factories of a run, a pool of environments per name, and each name's schemas."""

    def __init__(self, tools: list[Callable] | None = None, environment_factory=None, tool_timeout: float = 30.0):
        self.tools, self.tool_timeout = list(tools or []), tool_timeout
        self.multi = isinstance(environment_factory, dict)
        self.factories: dict | None = (None if environment_factory is None else dict(environment_factory)
                                       if self.multi else {None: environment_factory})
        self.pool: dict = {}
        self.rewards: list[EnvironmentReward] = []
        check_unique(self.tools, " in tools=")
        self.schemas: dict = {None: [tool_schema(t) for t in self.tools]}
        """Environment name -> the schemas of the tools its episodes see (None: no environment)."""
        for name, factory in (self.factories or {}).items():
            env = factory()  # probed once, then kept in the pool
            if not callable(getattr(env, "reset", None)):
                raise ValueError(f"environment {name or getattr(factory, '__name__', factory)!r}: an environment "
                                 "must define a callable reset(**row)")
            check_unique(self.tools + methods(env), f" among tools= and environment {type(env).__name__}'s methods")
            self.pool[name] = [env]
            self.schemas[name] = self.schemas[None] + [tool_schema(m) for m in methods(env)]
            get_reward = getattr(env, "get_reward", None)
            if callable(get_reward) and type(env) not in [r.env_type for r in self.rewards]:
                wrap = AsyncEnvironmentReward if inspect.iscoroutinefunction(get_reward) else EnvironmentReward
                self.rewards.append(wrap(type(env)))

    def without_tools(self) -> "Agent":
        """This agent with no tool shown to the model: every prompt's schemas empty (environments still reset and
        score episodes). The turn loop should then run no tool round (max_rounds=0), so a call is never run."""
        self.schemas = dict.fromkeys(self.schemas, [])
        return self

    def __getstate__(self) -> dict:
        """A copy in another process (a Ray rollout worker) builds its own environments."""
        return {**self.__dict__, "pool": {}}

    @property
    def has_environments(self) -> bool:
        return self.factories is not None

    def environment_name(self, row: dict):
        """The factory a row's episodes use (its `environment` column, with several); an unknown name raises."""
        if not self.multi:
            return None
        name = row.get("environment")
        if name not in self.factories:
            raise ValueError(f"a row has environment={name!r}, which is not among the environments given to "
                             f"environment_factory: {sorted(self.factories)}")
        return name

    def environments(self, names: list) -> list:
        """One environment per episode, from the pool of each name (grown when a batch needs more at once); None
        for each when there are only standalone tools."""
        if not self.has_environments:
            return [None] * len(names)
        out, taken = [], {}
        for name in names:
            pool, k = self.pool.setdefault(name, []), taken.get(name, 0)
            if k == len(pool):
                pool.append(self.factories[name]())
            taken[name] = k + 1
            out.append(pool[k])
        return out

    def reset(self, env, row: dict) -> list[dict]:
        """Start an episode on `env`: the prompt it sees (the row's, with reset's string appended to its last
        message). A prompt that is not a list of chat messages is an error: tools are offered through the chat
        template."""
        prompt = row.get("prompt", PLACEHOLDER_PROMPT)
        if not (isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt)):
            raise ValueError(f"an agent's prompts must be chat messages (the tools' schemas are rendered by the chat "
                             f"template), got {type(prompt).__name__} {prompt!r:.60}")
        if env is None:
            return prompt
        columns = {k: v for k, v in row.items() if k != "environment"} if self.multi else row
        outcome = guarded(env.reset, columns, self.tool_timeout, observation_text)
        where = f"{type(env).__name__}.reset on the row {reprlib.repr(row)}"
        if isinstance(outcome, RewardTimeout):  # its thread may still change it: out of the pool
            self.retire(env, self.environment_name(row))
            raise TimeoutError(f"{where} ran past tool_timeout={self.tool_timeout:g} s (which bounds reset too)")
        kind, observation = outcome
        if kind == "raised":
            raise RuntimeError(f"{where} raised {observation[0]}: {observation[1]}")
        if kind != "ok":
            raise TypeError(f"{where} {observation}")
        if observation:
            prompt = prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + observation}]
        return prompt

    def toolbox(self, env, name) -> Toolbox:
        """The tools of one episode: the standalone ones, then its environment's methods (the environment is retired
        when one of them runs past tool_timeout)."""
        own = methods(env) if env is not None else []
        return Toolbox(self.tools + own, self.tool_timeout, self.schemas[name], [m.__name__ for m in own],
                       (lambda: self.retire(env, name)) if env is not None else None)

    def retire(self, env, name) -> None:
        """Take `env` out of the pool: a call on it ran past tool_timeout and may still change it. The pool grows a
        fresh one from the factory when a batch next needs it."""
        self.pool[name] = [e for e in self.pool.get(name, []) if e is not env]


def observation_text(value) -> str | None:
    """What reset returned, as the text appended to the prompt: None, a string, or a list of text content parts
    (TRL's contract); anything else is refused, saying so."""
    if value is None or isinstance(value, str):
        return value and str.__str__(value)
    if isinstance(value, list) and all(type(p) is dict and p.get("type") == "text" and isinstance(p.get("text"), str)
                                       for p in value):
        return "".join(str.__str__(p["text"]) for p in value)
    raise TypeError(f"returned a {type(value).__name__}: reset must return None, a string, or a list of text "
                    "content parts [{'type': 'text', 'text': ...}] (TRL's contract; aha's prompts are text, so an "
                    "image or other part is refused)")
