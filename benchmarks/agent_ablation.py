"""The agent demo's GRPO options, arm by arm, each GRPO run from the same seed's cold start.

    .venv/bin/python benchmarks/agent_ablation.py --seeds 1 2 --arms balanced episode_rewards gigpo --out runs/abl
    .venv/bin/python benchmarks/agent_ablation.py --seeds 1 2 --out runs/abl --collect     # the table only

For each seed the first arm's run builds the cold start (`aha demo agent seed=S`); every later arm starts GRPO
from it (`sft_model=OUT/sS_FIRST/sft/model`), so arms differ only in GRPO's settings (ARMS). Runs
that wrote their summary.json are not run again. Arms run one after another (`--parallel 2` runs two at once, each
on --threads torch threads). The table: per arm and seed, the cold start's and GRPO's greedy held-out success, the
paired gain with its bootstrap 95% interval, the sampled gain, greedy success by family, and the run's minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ARMS = {
    "balanced": [],
    "before": ["grpo_families=[move_txt, delete_logs, create, rename]"],
    "episode_rewards": ['grpo_config={"reward_funcs": ["cut_as_failure", "tool_errors"], "reward_weights": [1.0, 0.2]}'],
    "cut_t07": ['grpo_config={"reward_funcs": ["cut_as_failure"], "temperature": 0.7}'],
    "gigpo": ['grpo_config={"advantage_estimator": "gigpo"}'],
    "variance_filter": ['grpo_config={"keep_groups_by_std": 0.5}'],
    "dynamic_sampling": ['grpo_config={"dynamic_sampling": true}'],
    "entropy_control": ['grpo_config={"use_adaptive_entropy": true, "entropy_target": 0.07}'],
    "progress": ['grpo_config={"reward_funcs": ["progress"], "reward_weights": [1.0]}'],
    "positive_nll": ['grpo_config={"positive_nll_coef": 0.1}'],
    "steps120": ["grpo_steps=120"],
    "batch8": ["prompts_per_step=8", "grpo_steps=120"],
    "mu2": ['grpo_config={"num_iterations": 2}'],
    "loss_grpo": ['grpo_config={"loss_type": "grpo"}'],
    "lr25": ["grpo_lr=2.5e-4"],
    "lr10": ["grpo_lr=1e-4"],
    "forking": ['grpo_config={"top_entropy_quantile": 0.2}'],
    "until30": ["sft_steps=1000", "sft_check_every=50", "sft_target=0.3"],
}
"""Arm name -> its `aha demo agent` settings beyond the demo's own (balanced: the demo as it ships; before: GRPO's
pool without copy and mkdir tasks, as the demo's was before every family reached GRPO; grpo_config lays
GRPOConfig settings over the demo's; until30 changes the cold start, SFT until dev success reaches 30% checked every
50 steps, as the demo did before its 100-step cold start, so it runs first in its own --arms list and builds its
own; entropy_control: Skywork-OR1's adaptive entropy bonus held at 0.07 nats a token, the entropy the demo's GRPO
logs over its first steps; positive_nll: VAPO's positive-example LM loss at its paper's 0.1; batch8: the demo's
episodes in twice the updates, 120 steps of 8 tasks; mu2: two clipped updates on each step's episodes, TRL's
num_iterations; loss_grpo: each episode's tokens averaged on their own, so a long failed episode weighs as much as a
short success, not more; lr25, lr10: half and a fifth of the demo's GRPO rate; forking: the loss on each step's 20%
highest-entropy tokens only, arXiv 2506.01939)."""


def command(seed: int, arm: str, out: Path, first: str, threads: int) -> list[str]:
    """The `aha demo agent` command line of one (seed, arm) run."""
    argv = [sys.executable, "-m", "aha.cli", "demo", "agent", f"seed={seed}", f"threads={threads}",
            f"output_dir={out / f's{seed}_{arm}'}", "progress_bar=false", *ARMS[arm]]
    if arm != first:
        argv.append(f"sft_model={out / f's{seed}_{first}' / 'sft' / 'model'}")
    return argv


def run_seed(seed: int, arms: list[str], out: Path, threads: int, timeout_s: float) -> None:
    """Each arm of one seed in order (the first builds the cold start), skipping runs already summarised."""
    for arm in arms:
        run = out / f"s{seed}_{arm}"
        if (run / "summary.json").exists():
            continue
        run.mkdir(parents=True, exist_ok=True)
        with open(run.with_suffix(".log"), "w") as log:
            subprocess.run(command(seed, arm, out, arms[0], threads), stdout=log, stderr=subprocess.STDOUT,
                           check=True, timeout=timeout_s)


def table(out: Path, seeds: list[int], arms: list[str]) -> str:
    """The markdown table of every finished run under `out`."""
    lines = ["| arm | seed | cold start | after GRPO | greedy gain [95% CI] | sampled gain [95% CI] | by family "
             "(cold start -> GRPO) | minutes |", "|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        for seed in seeds:
            path = out / f"s{seed}_{arm}" / "summary.json"
            if not path.exists():
                continue
            s = json.loads(path.read_text())
            lo, hi = s["gain_points_ci95"]
            slo, shi = s["sampled_gain_points_ci95"]
            fam = ", ".join(f"{f} {a:.0%}->{b:.0%}" for f, (a, b) in s["greedy_success_by_family"].items())
            lines.append(f"| {arm} | {seed} | {s['sft_success']:.1%} | {s['grpo_success']:.1%} | "
                         f"{s['gain_points']:+.1f} [{lo:+.1f}, {hi:+.1f}] | {s['sampled_gain_points']:+.1f} "
                         f"[{slo:+.1f}, {shi:+.1f}] | {fam} | {s['seconds'] / 60:.1f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--out", type=Path, default=Path("runs/agent_ablation"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--parallel", type=int, default=1, help="seeds run at once")
    p.add_argument("--run-timeout", type=float, default=3 * 3600, help="seconds one demo run may take")
    p.add_argument("--collect", action="store_true", help="print the table of the runs found; run nothing")
    a = p.parse_args()
    if not a.collect:
        with ThreadPoolExecutor(a.parallel) as pool:
            list(pool.map(lambda seed: run_seed(seed, a.arms, a.out, a.threads, a.run_timeout), a.seeds))
    print(table(a.out, a.seeds, a.arms))


if __name__ == "__main__":
    main()
