"""Where a GRPO step waits, in one process and on the Ray layer: seconds per step and each component's busy share.

    .venv/bin/python benchmarks/dist_pipeline.py [--size 4m] [--steps 8] [--verifier-ms 300]

The reward is the arithmetic task's answer check behind a fixed wall-clock latency per call (`--verifier-ms`,
standing in for a sandbox or a remote verifier), so the layouts differ in what they overlap:
  one process             generate -> score -> train, one after another (with 2 torch threads, and with 1)
  ray, staleness 0        rollout + reward workers; on-policy, so each step still waits for its rollouts
  ray, staleness 1        the next step is generated and scored while this one trains
Each Ray worker is a 1-CPU actor with one torch thread. Each layout runs the same number of steps from the
same model; the first step (start-up) is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = {
    "one process, 2 threads": dict(threads=2),
    "one process, 1 thread": dict(threads=1),
    "ray, staleness 0": dict(num_rollout_workers=1, num_reward_workers=1, max_staleness=0),
    "ray, staleness 1": dict(num_rollout_workers=1, num_reward_workers=1, max_staleness=1),
}


class SlowVerifier:
    """The task's exact-answer reward after `latency_s` of waiting (a picklable callable for reward workers)."""

    def __init__(self, latency_s: float):
        self.latency_s, self.__name__ = latency_s, "slow_verifier"

    def __call__(self, prompts, completions, answer, **kw):
        from aha.rewards import math_reward
        time.sleep(self.latency_s)
        return math_reward(prompts, completions, answer=answer)


def run(layout: dict, model: str, rows: list, a, out: Path) -> dict:
    from aha.config import GRPOConfig
    from aha.train.grpo import GRPOTrainer
    cfg = GRPOConfig(output_dir=str(out), max_steps=a.steps, num_generations=8, per_device_train_batch_size=16,
                     gradient_accumulation_steps=1, generation_batch_size=64, max_completion_length=a.tokens,
                     learning_rate=1e-5, progress_bar=False, report_to=["jsonl"], log_completions_steps=0, seed=0,
                     **layout)
    t = GRPOTrainer(model=model, reward_funcs=[SlowVerifier(a.verifier_ms / 1000)], args=cfg, train_dataset=rows)
    start = time.perf_counter()
    t.train()
    wall = time.perf_counter() - start
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    keys = ("perf/step_s", "dist/rollout_busy", "dist/reward_busy", "dist/learner_busy", "dist/staleness_mean")
    return {"wall_s": wall, **{k: statistics.median(s[k] for s in steps) for k in keys if k in steps[0]}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="4m")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--verifier-ms", type=float, default=300.0)
    a = p.parse_args()
    from aha.models.tiny import make_tiny
    from aha.tasks import get_task, task_corpus
    task = get_task("arithmetic")
    rows = task.load("train", n=512, seed=0)
    tmp = Path(tempfile.mkdtemp(prefix="aha-dist-bench-"))
    model = str(make_tiny(tmp / "model", task_corpus(rows), size=a.size, seed=0))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; model {a.size}, 64 completions "
          f"x {a.tokens} tokens per step, verifier latency {a.verifier_ms:.0f} ms per call, {a.steps} steps")
    print("| layout | s/step (median) | rollout busy | reward busy | learner busy | staleness |")
    print("|---|---|---|---|---|---|")
    for name, layout in LAYOUTS.items():
        r = run(layout, model, rows, a, tmp / name.replace(" ", "_").replace(",", ""))
        cell = lambda k: f"{r[k]:.2f}" if k in r else "-"  # noqa: E731
        print(f"| {name} | {r['perf/step_s']:.2f} | {cell('dist/rollout_busy')} | {cell('dist/reward_busy')} | "
              f"{cell('dist/learner_busy')} | {cell('dist/staleness_mean')} |", flush=True)


if __name__ == "__main__":
    main()
