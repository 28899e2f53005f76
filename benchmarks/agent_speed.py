"""Agent episodes at speed: the key/value cache kept across turns against prefilling each turn's whole context
again, and a round's tool calls side by side against the sum of the calls.

    .venv/bin/python benchmarks/agent_speed.py --threads 1             # 4m model, 16 episodes, 3 alternating rounds
    .venv/bin/python benchmarks/agent_speed.py --size 30m --episodes 32 --turn-tokens 48

On a machine shared with other work, --threads 1: two torch threads on two busy cores ran 30x slower here.

Part 1, the kept cache. A scripted policy on a real model: each model turn decodes exactly --turn-tokens tokens
with the model (greedy), its last one then replaced by the end-of-turn token, and the chat's parser asks for one
call of an instant tool until the episode has had its number of turns: the episodes take exactly 1, 2, 4 and 8
turns (a quarter each), so both sides decode the same tokens and run the same tools; only the prefill differs.
"kept" runs the turn loop as the trainer does (the engine keeps each episode's cache from round to round);
"refill" the same engine with keep_caches switched off (every round prefills every context whole). Each side's
turns are counted and printed, and their tokens compared. Rounds alternate kept/refill so a slow spell of a
shared machine hits both.

Part 2, the tools. --tool-episodes episodes (64) each make one call of a tool that sleeps --tool-seconds (0.2 s);
the model is scripted too (no model). Printed: the wall time of the round's tool phase (aha.envs.tools.call_all)
against the sum of the calls' own times.

Part 3, rows: the model's tokens/s in one generate call of 1, 4, 16 and 64 rows (--turn-tokens each), which bounds
what episodes rejoining a running decode batch could gain on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import replace

import torch

from aha.data.toolcalls import ToolCall, ToolChat
from aha.envs import Toolbox
from aha.rollout import HFEngine, SamplingParams
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


def build(size: str):
    from aha.models.tiny import build_model, train_tokenizer
    text = "the quick brown fox jumps over the lazy dog 0123456789 turns echo <tool_call> </tool_call>"
    tok = train_tokenizer([text] * 50)
    return tok, build_model(tok, size, "llama", seed=0).eval()


def episodes_run(engine, tok, n: int, budget: int) -> tuple[float, dict]:
    chat, box = ScriptedTurns(tok), Toolbox([echo], 5.0)
    eps = []
    for i in range(n):
        prompt = [{"role": "user", "content": f"episode {i} turns: {TURNS[i % len(TURNS)]} go"}]
        eps.append(Episode(prompt, chat.prompt_ids(prompt, box.schemas), box))
    t0 = time.perf_counter()
    out = run_turns(engine, chat, eps, 1, SamplingParams(0.0, max_new_tokens=budget), None, None)
    seconds = time.perf_counter() - t0
    turns = [sum(t["role"] == "assistant" for t in e["turns"]) for e in out.episodes]
    model_tokens = sum(sum(m) for m in out.loss_mask)
    return seconds, {"turns": turns, "model_tokens": model_tokens, "ids": out.completion_ids}


def kept_against_refill(a) -> dict:
    tok, model = build(a.size)
    FixedTurns.turn_tokens = a.turn_tokens
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    engines = {"kept": FixedTurns(model, [eot], tok.pad_token_id), "refill": Refill(model, [eot], tok.pad_token_id)}
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
    engine, prompt = HFEngine(model, [10**6], tok.pad_token_id), tok("episode turns: 1 go")["input_ids"]
    engine.generate([prompt], 4, SamplingParams(0.0, max_new_tokens=a.turn_tokens))  # warm-up
    out = {}
    for rows in (1, 4, 16, 64):
        t0 = time.perf_counter()
        engine.generate([prompt], rows, SamplingParams(0.0, max_new_tokens=a.turn_tokens))
        out[rows] = round(rows * a.turn_tokens / (time.perf_counter() - t0), 1)
    return {"tokens_per_s_by_rows": out}


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
    p.add_argument("--skip", choices=["cache", "tools", "rows"], nargs="*", default=[])
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                      "torch_threads": a.threads, "torch": torch.__version__, **vars(a)}))
    for part, run in (("cache", kept_against_refill), ("tools", tools_side_by_side), ("rows", rows_scan)):
        if part not in a.skip:
            print(json.dumps({part: run(a)}), flush=True)


if __name__ == "__main__":
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))  # scripted.ScriptedAgentEngine
    main()
