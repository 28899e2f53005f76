"""A real model's agent episodes under the turn loop's two schedules: rejoining the running decode batch (the
default) against rounds (`rejoin_episodes: false`), on the episodes GRPO samples.

    .venv/bin/python benchmarks/episodes_schedule.py runs/smollm2_agent/filesystem/cold_start/model \
        --task filesystem --tasks 4 --group 8 --rounds 2 --threads 1

Each side samples --tasks train tasks x --group episodes at --temperature with the task's tools, budget and turn
limit (aha.rollout.turns.sample_episodes, as training's experience does), one generate call of all of them; sides
alternate, --rounds each, the first round of each side a warm-up. At a temperature above 0 the two schedules draw
different samples (the batch's make-up differs at each step), so their tokens differ: printed per side and round
are seconds, decode steps (batch forward passes of one token a row), model tokens, model tokens/s, model turns
and success; the medians over the timed rounds close it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_speed import counting_decode_steps  # noqa: E402  (benchmarks/ is this script's directory)

from aha.models import load_model, load_tokenizer  # noqa: E402
from aha.rollout.turns import sample_episodes  # noqa: E402
from aha.tasks import get_task  # noqa: E402


def run(model, tokenizer, task, rows: list[dict], a, rejoin: bool) -> dict:
    t0 = time.perf_counter()
    with counting_decode_steps() as steps:
        out, envs = sample_episodes(model, tokenizer, task.agent(), rows, task.max_completion_length,
                                    task.max_tool_calling_iterations, None, 256, a.temperature, a.group, a.seed,
                                    rejoin=rejoin)
    seconds = time.perf_counter() - t0
    model_tokens = sum(e["model_tokens"] for e in out.episodes)
    verdict = task.correct()
    success = verdict(environments=envs, episodes=out.episodes) if envs and envs[0] is not None else None
    return {"schedule": "rejoin" if rejoin else "rounds", "seconds": seconds, "decode_steps": len(steps),
            "model_tokens": model_tokens, "model_tokens_per_s": model_tokens / seconds,
            "model_turns": sum(t["role"] == "assistant" for e in out.episodes for t in e["turns"]),
            "success": None if success is None else sum(x == 1.0 for x in success) / len(success)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--task", default="filesystem")
    p.add_argument("--tasks", type=int, default=4, help="train tasks a step")
    p.add_argument("--group", type=int, default=8, help="episodes a task (num_generations)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=2, help="runs per side (the first a warm-up)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write every round and the medians here (JSON)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    task, tokenizer = get_task(a.task), load_tokenizer(a.model)
    model = load_model(a.model, a.dtype)
    rows = task.load("train", a.tasks, seed=a.seed)
    results = []
    for r in range(a.rounds):
        for rejoin in (True, False) if r % 2 == 0 else (False, True):
            res = {"round": r, **run(model, tokenizer, task, rows, a, rejoin)}
            results.append(res)
            print(json.dumps(res), flush=True)
    medians = {}
    for side in ("rejoin", "rounds"):
        timed = [x for x in results if x["schedule"] == side and x["round"] > 0] or \
            [x for x in results if x["schedule"] == side]
        medians[side] = {k: statistics.median(x[k] for x in timed)
                         for k in ("seconds", "decode_steps", "model_tokens_per_s")}
    print(json.dumps({"median": medians,
                      "rounds_over_rejoin_s": medians["rounds"]["seconds"] / medians["rejoin"]["seconds"]}))
    if a.out:
        Path(a.out).write_text(json.dumps({"argv": sys.argv[1:], "rounds": results, "median": medians}, indent=1))


if __name__ == "__main__":
    main()
