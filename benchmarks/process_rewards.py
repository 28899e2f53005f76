"""Does step-level credit help? `aha demo process` over seeds and credit arms, each seed's arms from one cold start.

    .venv/bin/python benchmarks/process_rewards.py                                   # seeds 0-4 x 4 arms, 2 jobs
    .venv/bin/python benchmarks/process_rewards.py --arms outcome scalar steps --jobs 2 --out /tmp/process-grid

Arms (aha.demo.process; same seed, same budget, same cold start): outcome, scalar (the embedded default's
rewards), steps (grpo_process on each column sum), prm (grpo_process on a learned PRM's step scores; the seed's
PRM is made first from its cold start: `aha prm_labels` then `aha prm`, docs/process_rewards.md). A seed's
scalar cell trains the cold start; its other cells start from it (sft_model). Cells whose summary.json is under
--out already are read, not rerun, so an interrupted grid resumes. Prints each cell (held-out greedy accuracy
before and after with 95% intervals, gain), each arm's mean over seeds with a Student-t 95% interval, and the
paired difference between arms after GRPO (per seed: paired bootstrap over the 200 held-out problems; over
seeds: mean with a t interval). Writes the cells to process_rewards.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from aha.stats import paired_gain, seed_interval  # noqa: E402

RUN_TIMEOUT_S = 3600
"""Longest one command may take (a cell is ~5-10 minutes on one core; this bounds a stuck run)."""
ARMS = ("outcome", "scalar", "steps", "prm")
PAIRS = [("scalar", "outcome"), ("steps", "scalar"), ("steps", "outcome"), ("prm", "steps"), ("prm", "scalar")]
"""(arm, baseline): the paired differences reported, arm minus baseline."""
PRM_LABELS = ["num_prompts=300", "n=4", "num_continuations=8", 'step_separator=" "']
"""`aha prm_labels` settings for a seed's PRM (docs/prm.md's, each stage within minutes on one core)."""
PRM_TRAIN = ["num_train_epochs=3", "learning_rate=1e-3", "per_device_train_batch_size=32"]
"""`aha prm` settings (docs/prm.md's)."""


def aha(args: list[str], log: Path) -> None:
    """One aha command, one thread, its output in `log`."""
    with open(log, "w") as f:
        subprocess.run([sys.executable, "-m", "aha.cli", *args], cwd=ROOT, check=True, timeout=RUN_TIMEOUT_S,
                       stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def prm_of(seed: int, out: Path, sft: Path) -> Path:
    """The seed's PRM: step labels from its cold start's own rollouts, then `aha prm` on them."""
    model = out / f"prm-seed{seed}" / "model"
    if not (model / "config.json").is_file():
        labels = out / f"prm_labels-seed{seed}"
        aha(["prm_labels", f"model={sft}", "task=arithmetic", f"output_dir={labels}", f"seed={seed}", *PRM_LABELS],
            out / f"prm_labels-seed{seed}.log")
        aha(["prm", f"model={sft}", f"dataset={labels / 'data.jsonl'}", f"output_dir={out / f'prm-seed{seed}'}",
             f"seed={seed}", "progress_bar=false", *PRM_TRAIN], out / f"prm-seed{seed}.log")
    return model


def cell(arm: str, seed: int, out: Path, extra: list[str]) -> dict:
    """One cell: `aha demo process credit=ARM` (or its summary.json, when already there)."""
    target = out / f"{arm}-seed{seed}"
    sft = out / f"scalar-seed{seed}" / "sft" / "model"
    if not (target / "summary.json").is_file():
        t0 = time.monotonic()
        settings = [] if arm == "scalar" else [f"sft_model={sft}"]
        if arm == "prm":
            settings.append(f"prm_model={prm_of(seed, out, sft)}")
        aha(["demo", "process", f"credit={arm}", f"output_dir={target}", f"seed={seed}", "threads=1",
             "progress_bar=false", *settings, *extra], out / f"{arm}-seed{seed}.log")
        (target / "wall_s").write_text(str(round(time.monotonic() - t0)))
    return {"arm": arm, "seed": seed, "wall_s": (target / "wall_s").read_text(),
            **json.loads((target / "summary.json").read_text()),
            "verdicts": json.loads((target / "verdicts.json").read_text())}


def seed_job(seed: int, arms: list[str], out: Path, extra: list[str]) -> list[dict]:
    """A seed's cells in order: scalar first (it trains the cold start the others share). Without the scalar arm
    the grid only adds cells: it waits for another grid's scalar cell of the seed, never runs it beside that one."""
    if "scalar" not in arms:
        summary, t0 = out / f"scalar-seed{seed}" / "summary.json", time.monotonic()
        while not summary.is_file():
            if time.monotonic() - t0 > RUN_TIMEOUT_S:
                raise TimeoutError(f"{summary} did not appear: run the scalar arm of seed {seed} first")
            time.sleep(30)
    return [cell(a, seed, out, extra) for a in ["scalar", *[a for a in arms if a != "scalar"]]]


def pct_ci(v: float, ci: list) -> str:
    return f"{100 * v:.1f} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def tables(cells: list[dict], arms: list[str]) -> str:
    """The cells, each arm over seeds, and the paired differences between arms."""
    lines = ["| arm | seed | SFT accuracy [95% CI] | GRPO accuracy [95% CI] | gain, points [95% CI] | wall |",
             "|---|---|---|---|---|---|"]
    for c in sorted(cells, key=lambda c: (arms.index(c["arm"]), c["seed"])):
        lo, hi = c["gain_points_ci95"]
        lines.append(f"| {c['arm']} | {c['seed']} | {pct_ci(c['sft_accuracy'], c['sft_accuracy_ci95'])} | "
                     f"{pct_ci(c['grpo_accuracy'], c['grpo_accuracy_ci95'])} | {c['gain_points']:+.1f} "
                     f"[{lo:+.1f}, {hi:+.1f}] | {c['wall_s']} s |")
    lines += ["", "| arm | over seeds | mean [95% t-interval] | per seed |", "|---|---|---|---|"]
    for arm in arms:
        mine = sorted((c for c in cells if c["arm"] == arm), key=lambda c: c["seed"])
        for label, key in (("GRPO accuracy, %", "grpo_accuracy"), ("gain, points", "gain_points")):
            vals = [c[key] * (100 if key == "grpo_accuracy" else 1) for c in mine]
            if len(vals) > 1:
                lo, hi = seed_interval(vals)
                lines.append(f"| {arm} | {label} | {sum(vals) / len(vals):.1f} [{lo:.1f}, {hi:.1f}] | "
                             f"{' '.join(f'{v:.1f}' for v in vals)} |")
    return "\n".join(lines) + "\n\n" + differences(cells)


def differences(cells: list[dict]) -> str:
    """Arm minus baseline after GRPO, per seed (paired over problems) and over seeds."""
    by = {(c["arm"], c["seed"]): c for c in cells}
    lines = ["| arm - baseline | per seed: points [paired 95% CI] | over seeds: mean [95% t-interval] |",
             "|---|---|---|"]
    for arm, base in PAIRS:
        seeds = sorted(s for a, s in by if a == arm and (base, s) in by)
        diffs, per = [], []
        for s in seeds:
            d, (lo, hi) = paired_gain(by[(base, s)]["verdicts"]["grpo"], by[(arm, s)]["verdicts"]["grpo"], seed=s)
            diffs.append(100 * d)
            per.append(f"seed {s}: {100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]")
        if seeds:
            over = "–"
            if len(diffs) > 1:
                lo, hi = seed_interval(diffs)
                over = f"{sum(diffs) / len(diffs):+.1f} [{lo:+.1f}, {hi:+.1f}]"
            lines.append(f"| {arm} - {base} | {'; '.join(per)} | {over} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    ap.add_argument("--jobs", type=int, default=2, help="seeds run at once (each cell one thread)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "process_grid")
    ap.add_argument("extra", nargs="*", help="more key=value settings for every cell")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with ThreadPoolExecutor(a.jobs) as pool:
        cells = [c for part in pool.map(lambda s: seed_job(s, a.arms, a.out, a.extra), a.seeds) for c in part]
    arms = [x for x in ARMS if x in a.arms or x == "scalar"]
    report = tables(cells, arms)
    print(report + f"\n{len(cells)} cells, {time.monotonic() - t0:.0f} s")
    (a.out / "process_rewards.json").write_text(json.dumps([{k: v for k, v in c.items() if k != "verdicts"}
                                                            for c in cells], indent=1))
    (a.out / "process_rewards.md").write_text(report)


if __name__ == "__main__":
    main()
