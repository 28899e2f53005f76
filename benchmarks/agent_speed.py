"""Agent episodes at speed: the key/value cache kept across turns against prefilling each turn's whole context
again, and a round's tool calls side by side against the sum of the calls.

    .venv/bin/python benchmarks/agent_speed.py --threads 1             # 4m model, 16 episodes, 3 alternating rounds
    .venv/bin/python benchmarks/agent_speed.py --size 30m --episodes 32 --turn-tokens 48

On a machine shared with other work, --threads 1: two torch threads on two busy cores ran 30x slower here.

Part 1, the kept cache. A scripted policy on a real model: each model turn decodes exactly --turn-tokens tokens
with the model (greedy), its last one then replaced by the end-of-turn token, and the chat's parser asks for one
call of an instant tool until the episode has had its number of turns: the episodes take exactly 1, 2, 4 and 8
turns (a quarter each), so both sides decode the same tokens and run the same tools; only the prefill differs.
"kept" runs the turn loop in rounds (the engine keeps each episode's cache from round to round);
"refill" the same engine with keep_caches switched off (every round prefills every context whole). Each side's
turns are counted and printed, and their tokens compared. Rounds alternate kept/refill so a slow spell of a
shared machine hits both.

Part 2, the tools. --tool-episodes episodes (64) each make one call of a tool that sleeps --tool-seconds (0.2 s);
the model is scripted too (no model). Printed: the wall time of the round's tool phase (aha.envs.tools.call_all)
against the sum of the calls' own times.

Part 3, rows: the model's tokens/s in one generate call of 1, 4, 16 and 64 rows (--turn-tokens each), which bounds
what episodes rejoining a running decode batch could gain on this machine.

Part 4, rejoin: turns of unequal length. The same episodes of 1, 2, 4 and 8 turns, but each model turn decodes a
length drawn from its context (--shortest to --longest tokens, the draw seeded by the context's tokens, so both
sides draw the same), its last token replaced by end-of-turn. "rounds": the turn loop with rejoin off (one engine
call a round, which decodes until the round's longest turn ends); "rejoin": each episode's next turn joins the
running batch as soon as its tool has answered (the tools of the turns that end at one decode step run then, side
by side, while the batch waits: --rejoin-tool-seconds makes each call sleep). Both keep each episode's cache.
Printed per side and round: s/step, decode steps (batch forward passes), model tokens/s, turns; and whether both
sides wrote the same tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import random
import statistics
import time
from dataclasses import replace

import torch

from aha.data.toolcalls import ToolCall, ToolChat
from aha.envs import Toolbox
from aha.rollout import HFEngine, SamplingParams, get_engine
from aha.rollout import hf as engine_module
from aha.rollout.turns import Episode, run_turns

TURNS = (1, 2, 4, 8)


def echo(x: int) -> str:
    """
    Returns its argument.

    Args:
        x: A number.
    """
    return f"echo {x}"


class ScriptedTurns(ToolChat):
    """Calls echo until the episode has had the number of turns its prompt names ("turns: k")."""

    def parse(self, ids, prefix_ids, tools):
        text = self.tokenizer.decode(prefix_ids)
        want = int(text.split("turns: ")[1].split()[0])
        done = text.count("<|im_start|>tool")
        return "", [ToolCall("echo", {"x": done})] if done + 1 < want else []


class FixedTurns(HFEngine):
    """Each model turn exactly `turn_tokens` tokens decoded by the model, the last replaced by end-of-turn (never
    fed back to the model: the next context starts its new tokens there either way)."""

    turn_tokens = 32

    def generate(self, prompt_ids, n, params, generator=None, on_group=None):
        out = super().generate(prompt_ids, n, replace(params, max_new_tokens=min(self.turn_tokens,
                                                                                 params.max_new_tokens)), generator)
        eot = int(self.eos[0])
        out.completion_ids = [c[:-1] + [eot] for c in out.completion_ids]
        out.truncated = [False] * len(out.completion_ids)
        return out


class Refill(FixedTurns):
    keep_caches = None


class DrawnTurns(HFEngine):
    """Each model turn decoded by the model for a length drawn from its context (`drawn`), its last token then
    replaced by end-of-turn (never fed back: the next context starts its new tokens there either way). Without
    on_turn_end one call decodes until its longest drawn turn ends, as a round does; with it each row stops at its
    own draw (the limits) and goes on at once."""

    shortest, longest = 8, 64

    def drawn(self, context: list[int]) -> int:
        return random.Random(str(context)).randint(self.shortest, self.longest)

    def ended(self, tokens: list[int], truncated: bool, drawn: int) -> tuple[list[int], bool]:
        """A turn that reached its drawn length ends there with end-of-turn."""
        return (tokens[:drawn - 1] + [int(self.eos[0])], False) if len(tokens) >= drawn else (tokens, truncated)

    def generate(self, prompt_ids, n, params, generator=None, on_group=None, on_turn_end=None, limits=None):
        want = [self.drawn(p) for p in prompt_ids for _ in range(n)]
        if on_turn_end is None:
            out = super().generate(prompt_ids, n, replace(params, max_new_tokens=min(max(want),
                                                                                     params.max_new_tokens)), generator)
            out.completion_ids, out.truncated = map(list, zip(*map(self.ended, out.completion_ids, out.truncated,
                                                                   want)))
            return out

        def turn_end(rows, turns):
            turns.completion_ids, turns.truncated = map(list, zip(*(
                self.ended(c, t, want[r]) for r, c, t in zip(rows, turns.completion_ids, turns.truncated))))
            nexts = on_turn_end(rows, turns)
            for r, follow in zip(rows, nexts):
                if follow is not None:
                    want[r] = self.drawn(follow[0])
            return [None if f is None else (f[0], min(f[1], want[r])) for r, f in zip(rows, nexts)]
        limits = [min(x, w) for x, w in zip(limits or [params.max_new_tokens] * len(want), want)]
        return super().generate(prompt_ids, n, params, generator, on_turn_end=turn_end, limits=limits)


def build(size: str):
    from aha.models.tiny import build_model, train_tokenizer
    text = "the quick brown fox jumps over the lazy dog 0123456789 turns echo <tool_call> </tool_call>"
    tok = train_tokenizer([text] * 50)
    return tok, build_model(tok, size, "llama", seed=0).eval()


def episodes_run(engine, tok, n: int, budget: int, rejoin: bool = True, tool=echo) -> tuple[float, dict]:
    chat, box = ScriptedTurns(tok), Toolbox([tool], 5.0)
    eps = []
    for i in range(n):
        prompt = [{"role": "user", "content": f"episode {i} turns: {TURNS[i % len(TURNS)]} go"}]
        eps.append(Episode(prompt, chat.prompt_ids(prompt, box.schemas), box))
    t0 = time.perf_counter()
    out = run_turns(engine, chat, eps, 1, SamplingParams(0.0, max_new_tokens=budget), None, None, rejoin=rejoin)
    seconds = time.perf_counter() - t0
    turns = [sum(t["role"] == "assistant" for t in e["turns"]) for e in out.episodes]
    model_tokens = sum(sum(m) for m in out.loss_mask)
    return seconds, {"turns": turns, "model_tokens": model_tokens, "ids": out.completion_ids}


def kept_against_refill(a) -> dict:
    tok, model = build(a.size)
    FixedTurns.turn_tokens = a.turn_tokens
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    engines = {"kept": FixedTurns.for_model(model, tok, eos_token_ids=[eot]),
               "refill": Refill.for_model(model, tok, eos_token_ids=[eot])}
    episodes_run(engines["kept"], tok, 4, a.budget)  # warm-up (weights packed, allocator)
    rows, ids = [], {}
    for r in range(a.rounds):
        for side in ("kept", "refill") if r % 2 == 0 else ("refill", "kept"):
            seconds, info = episodes_run(engines[side], tok, a.episodes, a.budget)
            ids.setdefault(side, info.pop("ids"))
            rows.append({"round": r, "side": side, "s_per_step": round(seconds, 3),
                         "model_tokens_per_s": round(info["model_tokens"] / seconds, 1),
                         "turns": sum(info["turns"]), "turns_by_episode": sorted(set(info["turns"]))})
            print(json.dumps(rows[-1]), flush=True)
    med = {s: statistics.median(x["s_per_step"] for x in rows if x["side"] == s) for s in engines}
    return {"rounds": rows, "median_s_per_step": med, "refill_over_kept": round(med["refill"] / med["kept"], 2),
            "same_tokens": ids["kept"] == ids["refill"]}


def tools_side_by_side(a) -> dict:
    import aha.rollout.turns as turns
    from scripted import ScriptedAgentEngine
    tok, _ = build("tiny")
    calls, phases = [], []

    def nap(x: int) -> str:
        """
        Sleeps a while.

        Args:
            x: Anything.
        """
        t0 = time.perf_counter()
        time.sleep(a.tool_seconds)
        calls.append(time.perf_counter() - t0)
        return "rested"

    def timed(jobs, call_all=turns.call_all):
        t0 = time.perf_counter()
        out = call_all(jobs)
        phases.append(time.perf_counter() - t0)
        return out
    turns.call_all, chat, box = timed, ToolChat(tok), Toolbox([nap], 5.0)
    script = lambda c: '<tool_call>{"name": "nap", "arguments": {"x": 1}}</tool_call>' if "<|im_start|>tool" not in c \
        else "done"  # noqa: E731
    prompt = [{"role": "user", "content": "rest"}]
    eps = [Episode(prompt, chat.prompt_ids(prompt, box.schemas), box) for _ in range(a.tool_episodes)]
    run_turns(ScriptedAgentEngine(None, tok, script=script), chat, eps, a.tool_episodes,
              SamplingParams(max_new_tokens=200), None, None)
    return {"episodes": a.tool_episodes, "calls": len(calls), "tool_phase_s": round(sum(phases), 3),
            "sum_of_calls_s": round(sum(calls), 3)}


def rows_scan(a) -> dict:
    """Model tokens/s of one generate call at 1 to 64 rows (turn-tokens each, one prompt): how much a decode step
    gains from more rows in it, the most that episodes rejoining a running batch could gain."""
    tok, model = build(a.size)
    engine, prompt = get_engine("hf")(model, tok, eos_token_ids=[]), tok("episode turns: 1 go")["input_ids"]
    engine.generate([prompt], 4, SamplingParams(0.0, max_new_tokens=a.turn_tokens))  # warm-up
    out = {}
    for rows in (1, 4, 16, 64):
        t0 = time.perf_counter()
        engine.generate([prompt], rows, SamplingParams(0.0, max_new_tokens=a.turn_tokens))
        out[rows] = round(rows * a.turn_tokens / (time.perf_counter() - t0), 1)
    return {"tokens_per_s_by_rows": out}


@contextlib.contextmanager
def counting_decode_steps():
    """A list that gets one entry per decode step while the block runs (a step samples once for its whole batch)."""
    steps, sample = [], engine_module.sample_tokens

    def counted(*args, **kwargs):
        steps.append(1)
        return sample(*args, **kwargs)
    engine_module.sample_tokens = counted
    try:
        yield steps
    finally:
        engine_module.sample_tokens = sample


def rejoin_against_rounds(a) -> dict:
    """Part 4: turns of drawn, unequal lengths; rounds against rejoining, alternating."""
    tok, model = build(a.size)
    DrawnTurns.shortest, DrawnTurns.longest = a.shortest, a.longest
    engine = DrawnTurns.for_model(model, tok, eos_token_ids=[tok.convert_tokens_to_ids("<|im_end|>")])
    @functools.wraps(echo)  # the same name and schema: the same prompts
    def slow_echo(x: int) -> str:
        time.sleep(a.rejoin_tool_seconds)
        return echo(x)
    tool = slow_echo if a.rejoin_tool_seconds else echo
    episodes_run(engine, tok, 4, a.budget)  # warm-up (weights packed, allocator)
    rows, ids = [], {}
    for r in range(a.rounds):
        for side in ("rounds", "rejoin") if r % 2 == 0 else ("rejoin", "rounds"):
            with counting_decode_steps() as steps:
                seconds, info = episodes_run(engine, tok, a.episodes, a.budget, side == "rejoin", tool)
            ids.setdefault(side, info.pop("ids"))
            rows.append({"round": r, "side": side, "s_per_step": round(seconds, 3), "decode_steps": len(steps),
                         "model_tokens": info["model_tokens"],
                         "model_tokens_per_s": round(info["model_tokens"] / seconds, 1),
                         "turns": sum(info["turns"]), "turns_by_episode": sorted(set(info["turns"]))})
            print(json.dumps(rows[-1]), flush=True)
    med = {s: statistics.median(x["s_per_step"] for x in rows if x["side"] == s) for s in ("rounds", "rejoin")}
    return {"rounds": rows, "median_s_per_step": med, "rounds_over_rejoin": round(med["rounds"] / med["rejoin"], 2),
            "same_tokens": ids["rounds"] == ids["rejoin"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="4m")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--turn-tokens", type=int, default=32)
    p.add_argument("--budget", type=int, default=1024, help="max_completion_length: every token after the prompt")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tool-episodes", type=int, default=64)
    p.add_argument("--tool-seconds", type=float, default=0.2)
    p.add_argument("--shortest", type=int, default=8, help="part 4: the shortest turn drawn")
    p.add_argument("--longest", type=int, default=64, help="part 4: the longest turn drawn")
    p.add_argument("--rejoin-tool-seconds", type=float, default=0.0, help="part 4: each tool call sleeps this long")
    p.add_argument("--skip", choices=["cache", "tools", "rows", "rejoin"], nargs="*", default=[])
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                      "torch_threads": a.threads, "torch": torch.__version__, **vars(a)}))
    for part, run in (("cache", kept_against_refill), ("tools", tools_side_by_side), ("rows", rows_scan),
                      ("rejoin", rejoin_against_rounds)):
        if part not in a.skip:
            print(json.dumps({part: run(a)}), flush=True)


if __name__ == "__main__":
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))  # scripted.ScriptedAgentEngine
    main()
