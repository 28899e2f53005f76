"""Does GRPO make the model reflect more, and why? `aha demo aha` over seeds and ablation arms.

    .venv/bin/python benchmarks/aha_moment.py                                   # seeds 0-4 x 4 arms, 2 at a time
    .venv/bin/python benchmarks/aha_moment.py --arms main --jobs 1 --out /tmp/aha-grid   # the main arm only

Arms (same seeds, same budget; each cell is one `aha demo aha seed=S ...`, one thread):
    main        reflect_share=0.05: the behaviour exists but is rare
    no_reflect  reflect_share=0: no reflective solution in the cold start -> reflection should stay at 0
    no_carry    check_carries=false: the check has nothing to catch -> does reflection still rise? (only 2,560
                train problems have no carry, so GRPO draws from 460 problems where the others have 3,900)
    pay_wait    wait_reward=0.5 from its seed's main cold start (sft_model): a reward for the word "wait";
                behaviour/empty_reflection should catch the hack
A pay_wait cell runs after its seed's main cell, in the same worker. Cells whose summary.json is already under
--out are read, not rerun, so an interrupted grid resumes. Prints every cell (held-out greedy and sampled
reflection before and after GRPO with 95% intervals, the change with its paired bootstrap interval, accuracy,
corrections, empty reflections) and, per arm, the mean over seeds with a Student-t 95% interval and how many
seeds' rises lie outside their interval; writes the cells to aha_moment.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from aha.stats import seed_interval  # noqa: E402

RUN_TIMEOUT_S = 3600
"""Longest one cell may take (15 minutes is the target on 2 cores; this bounds a stuck run)."""
ARMS = {"main": [], "no_reflect": ["reflect_share=0"], "no_carry": ["check_carries=false"],
        "pay_wait": ["wait_reward=0.5"]}
"""Arm -> its settings beside the seed (pay_wait also gets its seed's main cold start)."""


def run(arm: str, seed: int, out: Path, extra: list[str]) -> dict:
    """One cell: `aha demo aha` with the arm's settings (or its summary.json, when already there)."""
    target = out / f"{arm}-seed{seed}"
    settings = list(ARMS[arm]) + (["sft_model=" + str(out / f"main-seed{seed}" / "sft" / "model")]
                                  if arm == "pay_wait" else [])
    if not (target / "summary.json").is_file():
        t0 = time.monotonic()
        with open(out / f"{arm}-seed{seed}.log", "w") as log:
            subprocess.run([sys.executable, "-m", "aha.cli", "demo", "aha", f"output_dir={target}", f"seed={seed}",
                            "threads=1", "progress_bar=false", *settings, *extra], cwd=ROOT, check=True,
                           timeout=RUN_TIMEOUT_S, stdout=log, stderr=subprocess.STDOUT,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        (target / "wall_s").write_text(str(round(time.monotonic() - t0)))
    wall = (target / "wall_s").read_text() if (target / "wall_s").is_file() else "?"
    return {"arm": arm, "seed": seed, "wall_s": wall, **json.loads((target / "summary.json").read_text()),
            **training_ends(target / "grpo" / "metrics.jsonl")}


TRAINING = ("behaviour/reflection_rate", "behaviour/empty_reflection", "behaviour/accuracy/reflective",
            "behaviour/accuracy/direct", "completion/len_mean")
"""Metrics of the sampled training completions compared at the first and last ENDS steps of GRPO."""
ENDS = 20


def training_ends(path: Path) -> dict:
    """Mean of each TRAINING metric over the first and the last ENDS GRPO steps (`train_first/...`,
    `train_last/...`): the sampled completions GRPO itself scored, where a hack of the reward shows first."""
    rows = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("step", 0) > 0
            and "completion/len_mean" in r]
    out = {}
    for end, part in (("first", rows[:ENDS]), ("last", rows[-ENDS:])):
        for key in TRAINING:
            vals = [r[key] for r in part if isinstance(r.get(key), (int, float))]
            out[f"train_{end}/{key}"] = sum(vals) / len(vals) if vals else None
    return out


def jobs_of(arms: list[str], seeds: list[int], out: Path, extra: list[str]) -> list:
    """One job per cell, except that a seed's pay_wait cell runs after its main cell in the same job."""
    jobs = []
    for seed in seeds:
        chain = [a for a in ("main", "pay_wait") if a in arms or (a == "main" and "pay_wait" in arms)]
        jobs.append(lambda s=seed, c=tuple(chain): [run(a, s, out, extra) for a in c])
        jobs += [lambda s=seed, a=a: [run(a, s, out, extra)] for a in arms if a not in ("main", "pay_wait")]
    return jobs


def pct(v) -> str:
    """A rate in percent ("–" for none)."""
    return "–" if v is None else f"{100 * v:.1f}"


def rate_ci(lo_hi) -> str:
    """A rate's interval in percent."""
    return "–" if lo_hi is None or lo_hi[0] is None else f"[{100 * lo_hi[0]:.1f}, {100 * lo_hi[1]:.1f}]"


def points_ci(lo_hi) -> str:
    """A change's interval in signed points."""
    return "–" if lo_hi is None or lo_hi[0] is None else f"[{lo_hi[0]:+.1f}, {lo_hi[1]:+.1f}]"


def cell_row(c: dict) -> str:
    s = c["behaviour"].get("grpo_sampled", {})
    return (f"| {c['arm']} | {c['seed']} | {pct(c['sft_accuracy'])} -> {pct(c['grpo_accuracy'])} "
            f"{points_ci(c['gain_points_ci95'])} | {pct(c['sft_reflection_rate'])} "
            f"{rate_ci(c['sft_reflection_rate_ci95'])} -> {pct(c['grpo_reflection_rate'])} "
            f"{rate_ci(c['grpo_reflection_rate_ci95'])} | "
            f"{c['reflection_gain_points']:+.1f} {points_ci(c['reflection_gain_ci95'])} | "
            f"{pct(c.get('sft_reflection_rate_sampled'))} -> {pct(c.get('grpo_reflection_rate_sampled'))} "
            f"{points_ci(c.get('reflection_gain_sampled_ci95'))} | {pct(c['grpo_corrected_rate'])} | "
            f"{pct(s.get('behaviour/wait_fixed_rate'))} / {pct(s.get('behaviour/wait_broke_rate'))} | "
            f"{pct(s.get('behaviour/empty_reflection'))} | {pct(s.get('behaviour/accuracy/reflective'))} / "
            f"{pct(s.get('behaviour/accuracy/direct'))} | {c['wall_s']} s |")


OVER_SEEDS = [("SFT accuracy", "sft_accuracy", 100), ("GRPO accuracy", "grpo_accuracy", 100),
              ("reflection, greedy, SFT", "sft_reflection_rate", 100),
              ("reflection, greedy, GRPO", "grpo_reflection_rate", 100),
              ("reflection change, greedy, points", "reflection_gain_points", 1),
              ("reflection, sampled, SFT", "sft_reflection_rate_sampled", 100),
              ("reflection, sampled, GRPO", "grpo_reflection_rate_sampled", 100),
              ("reflection change, sampled, points", "reflection_gain_sampled_points", 1),
              ("corrected by a wait, greedy, GRPO", "grpo_corrected_rate", 100),
              ("training samples: reflection, first 20 steps", "train_first/behaviour/reflection_rate", 100),
              ("training samples: reflection, last 20 steps", "train_last/behaviour/reflection_rate", 100),
              ("training samples: empty reflection, first 20 steps", "train_first/behaviour/empty_reflection", 100),
              ("training samples: empty reflection, last 20 steps", "train_last/behaviour/empty_reflection", 100),
              ("training samples: accuracy reflective, last 20", "train_last/behaviour/accuracy/reflective", 100),
              ("training samples: accuracy direct, last 20", "train_last/behaviour/accuracy/direct", 100),
              ("training samples: length, last 20 steps", "train_last/completion/len_mean", 1)]
"""Figures averaged over seeds: (label, summary key, scale to percent or points)."""


def over_seeds(arm: str, cells: list[dict]) -> str:
    """Mean over seeds with its Student-t 95% interval, and the seeds whose greedy rise excludes 0."""
    lines = []
    for label, key, scale in OVER_SEEDS:
        vals = [scale * c[key] for c in cells if c.get(key) is not None]
        if vals:
            lo, hi = seed_interval(vals)
            lines.append(f"| {arm} | {label} | {sum(vals) / len(vals):.1f} [{lo:.1f}, {hi:.1f}] | "
                         f"{' '.join(f'{v:.1f}' for v in vals)} |")
    rose = sum(c["reflection_rose"] for c in cells)
    lines.append(f"| {arm} | greedy reflection rose outside its 95% CI | {rose} of {len(cells)} seeds | |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None, help="cells go here (default: a new temporary directory)")
    ap.add_argument("extra", nargs="*", help="key=value settings for every cell (e.g. grpo_steps=100)")
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="aha-moment-"))
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(a.jobs) as pool:
        cells = [c for done in pool.map(lambda job: job(), jobs_of(a.arms, a.seeds, out, a.extra)) for c in done]
    cells.sort(key=lambda c: (list(ARMS).index(c["arm"]), c["seed"]))
    print("| arm | seed | accuracy SFT -> GRPO [gain CI] | reflection, greedy, SFT -> GRPO [95% CI] | change, points "
          "[95% CI] | reflection, sampled, SFT -> GRPO [change CI] | corrected by wait, greedy | sampled: wait "
          "fixed / broke | sampled: empty | sampled accuracy reflective / direct | wall |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(cell_row(c) for c in cells))
    print("\n| arm | figure | mean over seeds [t 95% CI] | per seed |\n|---|---|---|---|")
    print("\n".join(over_seeds(arm, [c for c in cells if c["arm"] == arm]) for arm in ARMS
                    if any(c["arm"] == arm for c in cells)))
    (out / "aha_moment.json").write_text(json.dumps(cells, indent=1))
    print(f"\ncells: {out / 'aha_moment.json'}")


if __name__ == "__main__":
    main()
