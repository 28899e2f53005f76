"""How much the demo's GRPO gain depends on the seed and on the CPU's floating-point kernels.

    .venv/bin/python benchmarks/learning.py                         # seeds 0-4, default kernels and AVX2
    .venv/bin/python benchmarks/learning.py --seeds 0 1 --kernels default --jobs 2
    .venv/bin/python benchmarks/learning.py --collect /tmp/a /tmp/b    # one table of cells already run (any session)

Runs `aha demo seed=S` for every seed under each kernel setting (`ATEN_CPU_CAPABILITY=avx2` makes torch
use the kernels a CPU without AVX-512 runs; "default" is what this CPU picks), `--jobs` at a time, one
thread each, and prints every cell (SFT and GRPO held-out accuracy with Wilson 95% intervals, the gain
with its paired bootstrap interval) and min / median / max of each column per kernel setting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 1800
"""Longest one demo may take (10 minutes is the target on 2 cores; this bounds a stuck run)."""


def run(seed: int, kernels: str, out: Path) -> dict:
    env = dict(os.environ)
    if kernels != "default":
        env["ATEN_CPU_CAPABILITY"] = kernels
    target = out / f"{kernels}-seed{seed}"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "aha.cli", "demo", f"output_dir={target}", f"seed={seed}",
                    "progress_bar=false"], cwd=ROOT, env=env, check=True, timeout=RUN_TIMEOUT_S,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    summary = json.loads((target / "summary.json").read_text())
    return {"kernels": kernels, "seed": seed, "wall_s": round(time.monotonic() - t0), **summary}


def collect(dirs: list[str]) -> list[dict]:
    """Cells finished earlier (each `KERNELS-seedS/summary.json` under `dirs`), in kernels then seed order; the wall
    time is the demo's own `seconds`."""
    cells = []
    for d in dirs:
        for summary in sorted(Path(d).glob("*-seed*/summary.json")):
            kernels, _, seed = summary.parent.name.rpartition("-seed")
            s = json.loads(summary.read_text())
            cells.append({"kernels": kernels, "seed": int(seed), "wall_s": round(s["seconds"]), **s})
    return sorted(cells, key=lambda c: (c["kernels"] != "default", c["kernels"], c["seed"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--kernels", nargs="+", default=["default", "avx2"])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--collect", nargs="+", default=None, help="only print the table of the cells under these dirs")
    a = ap.parse_args()
    out = Path(a.out or (a.collect[0] if a.collect else tempfile.mkdtemp(prefix="aha-learning-")))
    if a.collect:
        cells = collect(a.collect)
        a.kernels = sorted({c["kernels"] for c in cells}, key=lambda k: (k != "default", k))
    else:
        jobs = [(s, k) for k in a.kernels for s in a.seeds]
        with ThreadPoolExecutor(a.jobs) as pool:
            cells = list(pool.map(lambda job: run(*job, out), jobs))
    print("| kernels | seed | SFT [95% CI] | GRPO [95% CI] | gain, points [95% CI] | wall |\n|---|---|---|---|---|---|")
    for c in cells:
        sft, grpo, gain = c["sft_accuracy_ci95"], c["grpo_accuracy_ci95"], c["gain_points_ci95"]
        print(f"| {c['kernels']} | {c['seed']} | {c['sft_accuracy']:.1%} [{sft[0]:.1%}, {sft[1]:.1%}] | "
              f"{c['grpo_accuracy']:.1%} [{grpo[0]:.1%}, {grpo[1]:.1%}] | {c['gain_points']:+.1f} "
              f"[{gain[0]:+.1f}, {gain[1]:+.1f}] | {c['wall_s']} s |")
    print("\n| kernels | column | min | median | max |\n|---|---|---|---|---|")
    for k in a.kernels:
        mine = [c for c in cells if c["kernels"] == k]
        for col, scale in (("sft_accuracy", 100), ("grpo_accuracy", 100), ("gain_points", 1)):
            vals = [scale * c[col] for c in mine]
            print(f"| {k} | {col} | {min(vals):.1f} | {statistics.median(vals):.1f} | {max(vals):.1f} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning.json").write_text(json.dumps(cells, indent=1))
    print(f"\ncells: {out / 'learning.json'}")


if __name__ == "__main__":
    main()
