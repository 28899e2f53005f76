"""Verifiers under load: does any correct answer score 0 when a batch is large and full of slow items?

    .venv/bin/python benchmarks/rewards_load.py                 # 5,000 math + 200 code completions
    .venv/bin/python benchmarks/rewards_load.py --math 1000 --code 50

Math: 60% plain numbers (decided in-process), 37% symbolic (math-verify in the killable pool:
`\\frac{k}{\\sqrt{2}}` vs `\\frac{k\\sqrt{2}}{2}`, `\\sqrt{4k}` vs `2\\sqrt{k}`, `2^{e}+k` vs its value), 3% "bombs" (`k^{10^{10}}`), half of the
numeric and symbolic answers right. Run twice: as shipped (bombs are set aside as too large to evaluate) and
with that screen off, so every bomb reaches the pool and burns its whole per-comparison limit.
Code: 45% right, 45% wrong, 10% infinite loops, each program under the sandbox with the default limits.
Reported: wall time, items/s, per-item latency of the pool's comparisons (p50/p99), right answers scored
right, undecided (None) items by reason, peak RSS of this process and its children.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import threading
import time

import psutil

from aha.rewards import CodeReward, MathReward
from aha.rewards.maths import symbolic_pool

SAMPLE_S = 0.05


class PeakRSS:
    """Largest resident memory of this process plus its children, sampled every SAMPLE_S."""

    def __enter__(self):
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in [me] + me.children(recursive=True):
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(SAMPLE_S)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def math_load(n: int, rng: random.Random) -> list[tuple[str, str, str]]:
    """(completion, gold, kind) with kind in right/wrong numeric/symbolic, bomb."""
    rows = []
    for i in range(n):
        u = rng.random()
        right = rng.random() < 0.5
        if u < 0.60:
            a = rng.randint(1, 10 ** 6)
            rows.append((f"so the answer is \\boxed{{{a if right else a + 1}}}", str(a), f"numeric_{right}"))
        elif u < 0.97:
            k, form = rng.randint(2, 5000), rng.randrange(3)
            if form == 0:    # \frac{k}{\sqrt{2}} vs \frac{k\sqrt{2}}{2}
                pred, gold = f"\\frac{{{k}}}{{\\sqrt{{2}}}}", f"\\frac{{{k if right else k + 1}\\sqrt{{2}}}}{{2}}"
            elif form == 1:  # \sqrt{4k} vs 2\sqrt{k}
                pred, gold = f"\\sqrt{{{4 * k}}}", f"{2 if right else 3}\\sqrt{{{k}}}"
            else:            # 2^{e} + k vs its value
                e = k % 40 + 2
                pred, gold = f"2^{{{e}}}+{k}", str(2 ** e + k + (0 if right else 1))
            rows.append((f"Hence \\boxed{{{pred}}}.", gold, f"symbolic_{right}"))
        else:
            rows.append((f"\\boxed{{{rng.randint(2, 9)}^{{10^{{{rng.randint(9, 10 ** 6)}}}}}}}", "5", "bomb"))  # distinct
    return rows


def run_math(rows, **kwargs) -> dict:
    reward = MathReward(**kwargs)
    reward(None, ["\\boxed{\\sqrt{4}}"], answer=["2"])  # start the pool: its start-up is not the load
    reward.pop_metrics()
    with PeakRSS() as mem:
        start = time.monotonic()
        out = reward(None, [c for c, _, _ in rows], answer=[g for _, g, _ in rows])
        wall = time.monotonic() - start
    lat = sorted(x for x in symbolic_pool().last_latencies if x is not None)
    right = [(v, k) for v, (_, _, k) in zip(out, rows) if k.endswith("True")]
    wrong = [(v, k) for v, (_, _, k) in zip(out, rows) if k.endswith("False")]
    return {"items": len(rows), "wall_s": round(wall, 2), "items_per_s": round(len(rows) / wall, 1),
            "pool_comparisons": len(lat),
            "pool_latency_p50_ms": round(1000 * statistics.median(lat), 1) if lat else None,
            "pool_latency_p99_ms": round(1000 * lat[int(0.99 * (len(lat) - 1))], 1) if lat else None,
            "right_scored_right": f"{sum(v == 1.0 for v, _ in right)}/{len(right)}",
            "right_scored_0": sum(v == 0.0 for v, _ in right), "right_undecided": sum(v is None for v, _ in right),
            "wrong_scored_1": sum(v == 1.0 for v, _ in wrong),
            "bombs_none": f"{sum(v is None for v, (_, _, k) in zip(out, rows) if k == 'bomb')}/"
                          f"{sum(k == 'bomb' for _, _, k in rows)}",
            "counters": reward.pop_metrics(), "peak_rss_mb": round(mem.peak / 2 ** 20)}


def code_load(n: int, rng: random.Random) -> list[tuple[str, list[str], str]]:
    rows = []
    for i in range(n):
        u, a = rng.random(), rng.randint(1, 100)
        tests = [f"assert f({a}) == {a * 2}", f"assert f({a + 1}) == {(a + 1) * 2}"]
        if u < 0.10:
            body, kind = "    while True:\n        pass", "loop"
        elif u < 0.55:
            body, kind = "    return 2 * x", "right"
        else:
            body, kind = "    return x + 2", "wrong"
        rows.append((f"```python\ndef f(x):\n{body}\n```", tests, kind))
    return rows


def run_code(rows) -> dict:
    reward = CodeReward()
    with PeakRSS() as mem:
        start = time.monotonic()
        out = reward(None, [c for c, _, _ in rows], tests=[t for _, t, _ in rows])
        wall = time.monotonic() - start
    by = {k: [v for v, (_, _, kk) in zip(out, rows) if kk == k] for k in ("right", "wrong", "loop")}
    return {"items": len(rows), "wall_s": round(wall, 2), "items_per_s": round(len(rows) / wall, 1),
            "timeout_s_per_program": reward.timeout_s, "workers": reward.max_workers,
            "right_scored_1": f"{sum(v == 1.0 for v in by['right'])}/{len(by['right'])}",
            "wrong_scored_1": sum(v == 1.0 for v in by["wrong"]),
            "loops": {str(v): by["loop"].count(v) for v in set(by["loop"])},
            "counters": reward.pop_metrics(), "peak_rss_mb": round(mem.peak / 2 ** 20)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--math", type=int, default=5000)
    ap.add_argument("--code", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    print(f"machine: {platform.processor() or platform.machine()}, {psutil.cpu_count()} cores; "
          f"pool workers: {symbolic_pool().size}")
    rows = math_load(a.math, rng)
    print("math, as shipped:", json.dumps(run_math(rows), indent=1))
    print("math, bombs sent to the pool:", json.dumps(run_math(rows, max_exponent_digits=None), indent=1))
    if a.code:
        print("code:", json.dumps(run_code(code_load(a.code, rng)), indent=1))


if __name__ == "__main__":
    main()
