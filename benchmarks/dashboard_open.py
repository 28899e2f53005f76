"""How long `aha dashboard` takes to open a long run: a run directory with 10,000 steps of metrics (the keys of
a real GRPO run), the Curves page in headless Chromium, timed from navigation until every chart is drawn:
cold (a fresh server that has parsed nothing) and warm (the same server again).

    .venv/bin/python benchmarks/dashboard_open.py [--steps 10000] [--repeats 5]

Needs Debian's chromium + chromium-driver and selenium (scripts/setup.sh installs them).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

KEYS = ["reward/mean", "reward/std", "reward/math/mean", "reward/format/mean", "reward/zero_std_frac",
        "reward/group_std_mean", "reward/excluded_frac", "loss", "entropy", "clip/low", "clip/high", "grad_norm",
        "completion/len_mean", "completion/len_min", "completion/len_max", "completion/truncated_frac", "lr",
        "perf/step_s", "perf/generate_s", "perf/train_s", "perf/gen_tokens_per_s", "perf/train_tokens_per_s",
        "train/trained_frac", "behaviour/reflection_rate", "behaviour/reflection_rate/correct",
        "behaviour/reflection_rate/incorrect", "behaviour/phrases_per_1k_tokens", "behaviour/len_correct",
        "behaviour/len_incorrect", "behaviour/lang_consistency"]
"""30 metrics per step, as a GRPO run with two reward functions logs them."""


def write_run(path: Path, steps: int) -> int:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("model: bench\nnum_generations: 8\n")
    rng = random.Random(0)
    with open(path / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            row = {"step": s, **{k: rng.random() for k in KEYS}}
            if s % 100 == 0:
                row["eval/accuracy"] = rng.random()
            f.write(json.dumps(row) + "\n")
    return (path / "metrics.jsonl").stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from aha.config import DashboardConfig
    from aha.dashboard import build_app
    from aha.dashboard.server import Server
    tmp = Path(tempfile.mkdtemp(prefix="aha-dash-bench-"))
    size = write_run(tmp / "runs" / "long", a.steps)
    cfg = DashboardConfig(runs_root=str(tmp / "runs"))
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))
    driver.get("about:blank")

    def open_curves(url: str) -> float:
        driver.get("about:blank")
        t0 = time.perf_counter()
        driver.get(f"{url}/#curves?runs=long")
        while not driver.execute_script("return window.ahaCharts.length > 0 && "
                                        "window.ahaCharts.every(c => c.plot.data[0].length > 0)"):
            time.sleep(0.01)
        return time.perf_counter() - t0

    cold, warm, api = [], [], []
    for _ in range(a.repeats):
        url = Server(build_app(cfg)).start()  # a fresh server: nothing parsed yet
        cold.append(open_curves(url))
        warm.append(open_curves(url))         # the same server again: the rows are parsed already
        t0 = time.perf_counter()
        urllib.request.urlopen(f"{url}/api/metrics?run=long").read()
        api.append(time.perf_counter() - t0)
    charts = driver.execute_script("return window.ahaCharts.length")
    driver.quit()
    stats = lambda ts: {"median": round(statistics.median(ts), 3), "max": round(max(ts), 3),  # noqa: E731
                        "all": [round(t, 3) for t in ts]}
    print(json.dumps({"steps": a.steps, "metrics_per_step": len(KEYS), "file_mb": round(size / 1e6, 1),
                      "charts": charts, "open_cold_s": stats(cold), "open_warm_s": stats(warm),
                      "api_metrics_warm_s": stats(api)}, indent=2))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
