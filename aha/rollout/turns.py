"""The turn loop: an agent's episodes, each advanced one model turn at a time, all of them decoding together.

Where the engine's generate takes `on_turn_end` (HFEngine), every turn of every episode runs in one engine call: at
a decode step where some episodes' turns end, their tool calls run (side by side) and their next turns join the
running decode batch at that step, while the other episodes go on decoding, so no episode waits for the longest
turn of the others. Each turn decodes at most the budget its episode has left. Where episodes rejoin follows from
their tokens alone, never from how long a tool took, so a seed gives the same samples run to run. Other engines (or
rejoin=False) run rounds: one engine call for every episode still running, then the round's tools (the first call
samples the G episodes of a prompt together when their prompts are the same, as does the single call). Either way
the engine keeps each episode's key/value cache from one turn to the next (`keep_caches`, where the engine has it):
a next turn prefills only the tokens added since the last, the tool messages and the template's turn markers, and
the caches of episodes that ended are freed. With greedy decoding both give the same tokens, and log-probs equal
to rounding (tests/test_episode_batching.py).

A model turn's text is read for tool calls through the chat template (aha.data.toolcalls), the calls run
(aha.envs.tools: every failure becomes a tool message), and the tokens the tool messages add are appended with loss
mask 0: the model reads them, never trains on them. Token ids are spliced, never re-tokenized, so what the model
saw is what the learner scores.

The budget is TRL's: max_completion_length counts every token after the prompt, the model's and the tools'. A
model turn is cut at what is left; tool results that would leave no room for one more model token are dropped,
as TRL drops them (one longer than the room left could hold is cut first, never tokenized whole). An episode ends
when a model turn calls no tool (finish "stop"), when the budget runs out ("length"), or when it asks for tools
after max_tool_calling_iterations rounds of them ("tool_limit": those calls are not run). Only "stop" is a finished
episode: the others are truncated.
"""

from __future__ import annotations

import inspect
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from ..data.toolcalls import ToolChat
from ..envs.tools import Toolbox, call_all, guarded
from ..rewards.deadline import RewardTimeout
from .base import Engine, Rollout, SamplingParams, keeping_caches


@dataclass
class Episode:
    """One episode in progress: its prompt, tools, and every token after the prompt so far."""

    prompt: list[dict]
    prompt_ids: list[int]
    toolbox: Toolbox
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)         # 1 model token, 0 tool token
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)    # the turns as chat messages (what reward functions read)
    turns: list[dict] = field(default_factory=list)       # token spans and texts (what groups.jsonl records)
    outcomes: Counter = field(default_factory=Counter)    # tool-call outcome -> count (aha.envs.tools.OUTCOMES)
    non_string: int = 0
    truncated_results: int = 0                            # tool results cut to the budget before tokenizing
    rounds: int = 0                                       # rounds of tools run
    finish: str | None = None
    state_key: Callable[[], object] | None = None         # the environment's state_key, when it has one
    states: list[str] = field(default_factory=list)       # repr(state_key()) before each model turn (anchors, gigpo)

    def record(self) -> dict:
        model = sum(self.mask)
        return {"prompt": self.prompt, "messages": self.messages, "turns": self.turns, "finish": self.finish,
                "calls": sum(self.outcomes.values()), "outcomes": dict(self.outcomes), "non_string": self.non_string,
                "truncated_results": self.truncated_results, "environment_retired": self.toolbox.retired,
                "model_tokens": model, "env_tokens": len(self.mask) - model,
                "states": self.states if self.state_key is not None else None}


def run_turns(engine: Engine, chat: ToolChat, episodes: list[Episode], group_size: int, params: SamplingParams,
              generator: torch.Generator | None, max_rounds: int | None, context: int | None = None,
              rejoin: bool = True) -> Rollout:
    """Run `episodes` (prompt-major, `group_size` per prompt) to their ends; every token after each prompt, its
    loss mask and turn records, as one Rollout. `rejoin`: where the engine's generate takes `on_turn_end`, an
    episode's next turn rejoins the running decode batch as soon as its tools answer (False: rounds)."""
    if rejoin and "on_turn_end" in inspect.signature(engine.generate).parameters:
        _rejoining(engine, chat, episodes, group_size, params, generator, max_rounds, context)
    else:
        _rounds(engine, chat, episodes, group_size, params, generator, max_rounds, context)
    return Rollout(completion_ids=[e.ids for e in episodes], truncated=[e.finish != "stop" for e in episodes],
                   version=engine.version, logprobs=[e.logprobs for e in episodes] if params.logprobs else None,
                   loss_mask=[e.mask for e in episodes], prompt_ids=[e.prompt_ids for e in episodes],
                   episodes=[e.record() for e in episodes])


def _rounds(engine: Engine, chat: ToolChat, episodes: list[Episode], group_size: int, params: SamplingParams,
            generator: torch.Generator | None, max_rounds: int | None, context: int | None) -> None:
    """One engine call a round for every episode still running, each round's tools after it."""
    live, first = list(range(len(episodes))), True
    with keeping_caches(engine):  # each round's call has every running episode: a cache not read is freed
        while live:
            running = [episodes[i] for i in live]
            out = _generate(engine, running, group_size if first else 1, params, generator, context)
            first = False
            _end_turns(chat, running, out, params.max_new_tokens, max_rounds)
            live = [i for i in live if episodes[i].finish is None]


def _rejoining(engine: Engine, chat: ToolChat, episodes: list[Episode], group_size: int, params: SamplingParams,
               generator: torch.Generator | None, max_rounds: int | None, context: int | None) -> None:
    """Every turn of every episode in one engine call (see the module doc), each at most the budget it has left."""
    budget, n = params.max_new_tokens, _shared(episodes, group_size)

    def room(e: Episode) -> int:  # the budget left, and what the model's context leaves
        left = budget - len(e.ids)
        return max(min(left, context - len(e.prompt_ids) - len(e.ids)) if context else left, 1)

    def turn_end(rows: list[int], turns: Rollout) -> list:
        ended = [episodes[r] for r in rows]
        _end_turns(chat, ended, turns, budget, max_rounds)
        return [None if e.finish is not None else (e.prompt_ids + e.ids, room(e)) for e in ended]
    firsts = [room(e) for e in episodes]
    T = max(firsts)
    with keeping_caches(engine):  # a next turn prefills only what its episode's own cache lacks
        engine.generate([e.prompt_ids for e in episodes[::n]], n, replace(params, max_new_tokens=T), generator,
                        on_turn_end=turn_end, limits=firsts)


def _shared(episodes: list[Episode], group_size: int) -> int:
    """group_size where each group's episodes have the same prompt (sampled together, prefilled once), else 1."""
    n = group_size
    if n > 1 and all(episodes[g].prompt_ids == episodes[g - g % n].prompt_ids for g in range(len(episodes))):
        return n
    return 1


def _end_turns(chat: ToolChat, running: list[Episode], out: Rollout, budget: int, max_rounds: int | None) -> None:
    """Append a model turn to each of `running` (out's rows, in order), run their tool calls side by side and
    append the results."""
    calls = []
    for k, e in enumerate(running):
        lp = out.logprobs[k] if out.logprobs is not None else [0.0] * len(out.completion_ids[k])
        calls.append(_take_turn(e, chat, out.completion_ids[k], out.truncated[k], lp, budget, max_rounds))
    calling = [(e, c) for e, c in zip(running, calls) if c]  # each episode's calls in order, side by side
    for (e, _), results in zip(calling, call_all([(e.toolbox, c) for e, c in calling])):
        _take_results(e, chat, results, budget)


def _generate(engine: Engine, running: list[Episode], n: int, params: SamplingParams,
              generator: torch.Generator | None, context: int | None) -> Rollout:
    """One model turn for each running episode: the first for G episodes of a prompt at once (n=G) when their
    prompts agree, later ones each on its whole conversation, at most the largest budget left (and what the
    model's context leaves)."""
    contexts = [e.prompt_ids + e.ids for e in running]
    if n > 1 and _shared(running, n) == n:
        return engine.generate(contexts[::n], n, params, generator)
    room = max(params.max_new_tokens - len(e.ids) for e in running)
    if context:
        room = min(room, context - max(map(len, contexts)))
    return engine.generate(contexts, 1, replace(params, max_new_tokens=max(room, 1)), generator)


def _take_turn(e: Episode, chat: ToolChat, tokens: list[int], truncated: bool, logprobs: list[float], budget: int,
               max_rounds: int | None) -> list | None:
    """Append a model turn (cut to the budget); the tool calls to run (`call_all`, then `_take_results`), or None
    when the episode ends."""
    if e.state_key is not None:
        e.states.append(state_of(e))
    room, start = budget - len(e.ids), len(e.ids)
    ended = not truncated and len(tokens) <= room
    e.ids, e.mask, e.logprobs = e.ids + tokens[:room], e.mask + [1] * len(tokens[:room]), e.logprobs + logprobs[:room]
    text = chat.tokenizer.decode(tokens[:room], skip_special_tokens=True)
    content, calls = chat.parse(tokens[:room], e.prompt_ids + e.ids[:start], e.toolbox.schemas) if ended else (text, [])
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [c.message() for c in calls if c.error is None]
    e.messages.append(message)
    e.turns.append({"role": "assistant", "start": start, "end": len(e.ids), "text": text,
                    "tool_calls": [{"name": c.name, "arguments": c.arguments, "error": c.error} for c in calls]})
    if not ended or not calls or max_rounds is not None and e.rounds >= max_rounds:
        e.finish = "length" if not ended else "tool_limit" if calls else "stop"
        return None
    return calls


def _take_results(e: Episode, chat: ToolChat, results: list, budget: int) -> None:
    """Append the tool messages of a model turn's calls, or end the episode where they leave no room."""
    results, cut = _run_tools(e, chat, results, budget - len(e.ids))
    calls_done = [{"name": r.name, "outcome": r.outcome, "content": r.content} for r in results]
    suffix = [] if cut else chat.tool_suffix_ids([r.message() for r in results])
    if cut or len(e.ids) + len(suffix) >= budget:  # no room left for a model turn after them: dropped, as in TRL
        e.turns[-1]["dropped_results"], e.finish = calls_done, "length"
        return
    e.turns.append({"role": "tool", "start": len(e.ids), "end": len(e.ids) + len(suffix), "calls": calls_done})
    e.ids, e.mask, e.logprobs = e.ids + suffix, e.mask + [0] * len(suffix), e.logprobs + [0.0] * len(suffix)
    e.messages.extend(r.message() for r in results)
    e.rounds += 1


def _run_tools(e: Episode, chat: ToolChat, results: list, room: int) -> tuple[list, bool]:
    """The results of an episode's calls, counted, and whether one was cut: a result longer than `room` tokens can
    hold (told by its length, aha.data.toolcalls) is cut before anything tokenizes or logs it; it cannot fit."""
    e.outcomes.update(r.outcome for r in results)
    e.non_string += sum(r.non_string for r in results)
    fitted = [chat.fit(r.content, room) for r in results]
    cut = sum(was_cut for _, was_cut in fitted)
    e.truncated_results += cut
    return [replace(r, content=text) for r, (text, _) in zip(results, fitted)], cut > 0


def state_of(e: Episode) -> str:
    """The episode's environment's state key as text (repr), read as a tool call is (aha.envs.tools.guarded: off
    this thread, bounded by tool_timeout); a key that raises (SystemExit too) or whose repr fails gives what went
    wrong instead, so a broken key never stops an episode (its turns then share an anchor only with turns whose key
    broke the same way). One past the limit retires the environment, and a retired one is not read."""
    if e.toolbox.retired:
        return "<environment retired>"
    outcome = guarded(e.state_key, {}, e.toolbox.timeout_s, repr)
    if isinstance(outcome, RewardTimeout):
        e.toolbox.retire_environment()
        return "<state_key ran past tool_timeout>"
    kind, value = outcome
    if kind == "ok":
        return value
    return f"<state_key raised {value[0]}>" if kind == "raised" else "<state_key: no repr>"


def greedy_episodes(model, tokenizer, agent, rows: list[dict], max_new_tokens: int, max_rounds: int | None = None,
                    template_kwargs: dict | None = None, max_batch: int = 256, engine: str = "hf") -> tuple[Rollout, list]:
    """One greedy episode per row (held-out evaluation of an agent): the Rollout and each episode's environment,
    whose state (get_reward) says whether it succeeded."""
    return sample_episodes(model, tokenizer, agent, rows, max_new_tokens, max_rounds, template_kwargs, max_batch,
                           engine=engine)


def sample_episodes(model, tokenizer, agent, rows: list[dict], max_new_tokens: int, max_rounds: int | None = None,
                    template_kwargs: dict | None = None, max_batch: int = 256, temperature: float = 0.0, n: int = 1,
                    seed: int = 0, engine: str = "hf", top_p: float = 1.0,
                    rejoin: bool = True) -> tuple[Rollout, list]:
    """n episodes per row (row-major) at `temperature` (0: greedy, and n must be 1) and `top_p`, sampled with a
    generator seeded by `seed` on the engine named `engine` (aha.rollout.engines), the turn loop rejoining or in
    rounds (`run_turns`): the Rollout and each episode's environment (get_reward says whether it succeeded)."""
    from .engines import get_engine
    if n < 1 or temperature == 0 and n != 1:
        raise ValueError(f"n={n} episodes per row at temperature {temperature}: n must be >= 1, and 1 when greedy")
    chat, names = ToolChat(tokenizer, template_kwargs), [agent.environment_name(r) for r in rows for _ in range(n)]
    envs, episodes = agent.environments(names), []
    for env, name, row in zip(envs, names, [r for r in rows for _ in range(n)]):
        prompt = agent.reset(env, row)
        episodes.append(Episode(prompt, chat.prompt_ids(prompt, agent.schemas[name]), agent.toolbox(env, name),
                                state_key=getattr(env, "state_key", None)))
    generator = torch.Generator().manual_seed(seed) if temperature > 0 else None
    out = run_turns(get_engine(engine)(model, tokenizer, max_batch), chat, episodes, n,
                    SamplingParams(temperature, top_p, 0, max_new_tokens), generator, max_rounds, rejoin=rejoin)
    out.environments = envs if agent.has_environments else None
    return out, envs
