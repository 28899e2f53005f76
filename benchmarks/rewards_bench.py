"""Verifier benchmark: verdict accuracy on the known-answer tables, the hostile suite (cases tried, contained,
slowest time to verdict), and rewards per second for a batch of 256 math and 64 code completions.

    .venv/bin/python benchmarks/rewards_bench.py

The tables live in the tests (tests/test_rewards_*.py, tests/test_sandbox_hostile.py); this script runs the
same ones and prints the figures for BENCHMARKS.md."""
from __future__ import annotations

import os
import platform
import random
import signal
import socket
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from aha.rewards import CodeReward, FormatReward, MathReward, countdown_value  # noqa: E402
from aha.rewards.pool import default_size  # noqa: E402
from aha.rewards.sandbox import isolation, run_tests  # noqa: E402
from test_rewards_code import CODE_CASES, HUMANEVAL_GOOD, HUMANEVAL_HALF, HUMANEVAL_TEST, MBPP_GOOD, MBPP_TESTS  # noqa: E402
from test_rewards_math import MATH_CASES  # noqa: E402
from test_rewards_shaping import COUNTDOWN_CASES, FORMAT_CASES  # noqa: E402
from test_sandbox_hostile import LIMITS, hostile_cases  # noqa: E402


def accuracy() -> None:
    math = MathReward()
    got = math(None, [c for c, _, _ in MATH_CASES], answer=[g for _, g, _ in MATH_CASES])
    ok = sum(v == e for v, (_, _, e) in zip(got, MATH_CASES))
    print(f"math verdicts       {ok}/{len(MATH_CASES)} correct")
    code = CodeReward(timeout_s=5.0)
    got = code(None, [c for c, _, _, _ in CODE_CASES], tests=[t for _, t, _, _ in CODE_CASES],
               entry_point=[e for _, _, e, _ in CODE_CASES])
    ok = sum(v is not None and abs(v - e) < 1e-9 for v, (_, _, _, e) in zip(got, CODE_CASES))
    print(f"code verdicts       {ok}/{len(CODE_CASES)} correct")
    got = FormatReward()(None, [t for t, _ in FORMAT_CASES])
    print(f"format verdicts     {sum(v == float(e) for v, (_, e) in zip(got, FORMAT_CASES))}/{len(FORMAT_CASES)} correct")
    ok = sum(countdown_value(x, n) == e for x, n, e in COUNTDOWN_CASES)
    print(f"countdown verdicts  {ok}/{len(COUNTDOWN_CASES)} correct")


MATH_HOSTILE = {
    "exponent tower 2^{10^{10}}": r"\boxed{2^{10^{10}}}",
    "huge factorial (10^{10})!": r"\boxed{(10^{10})!}",
    "9999!": r"\boxed{9999!}",
    "10 MB string": "7" * 10_000_000,
    "10 MB of <answer>": "<answer>" * 1_250_000,
    "1000 nested fractions": "\\boxed{" + "\\frac{1}{" * 1000 + "2" + "}" * 1000 + "}",
    "100 nested square roots": "\\boxed{" + "\\sqrt{" * 100 + "2" + "}" * 100 + "}",
    "500 \\boxed{}": "\\boxed{}" * 500,
}


def hostile() -> None:
    timeout_s = 1.0
    math = MathReward(timeout_s=timeout_s)
    math(None, [r"\boxed{\sqrt{4}}"], answer=["2"])  # warm pool
    tried = contained = 0
    slowest = (0.0, "")
    for name, completion in MATH_HOSTILE.items():
        start = time.monotonic()
        out = math(None, [completion], answer=["5"])
        elapsed = time.monotonic() - start
        tried += 1
        contained += out in ([0.0], [None]) and elapsed < timeout_s + 1.5  # no reward (None: set aside as too large)
        slowest = max(slowest, (elapsed, f"math: {name}"))
    print(f"math hostile        limit {timeout_s:.1f} s per comparison")

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    escape = f"/tmp/aha-escape-{uuid.uuid4().hex}"
    signalled: list[int] = []
    signal.signal(signal.SIGUSR1, lambda *_: signalled.append(1))
    modes = (["bwrap"] if isolation() == "bwrap" else []) + ["fallback"]
    fallback = run_tests("def f():\n    return 1\n", [("assert f() == 1", True)], mode="fallback").detail
    for mode in modes:
        for case in hostile_cases(sock.getsockname()[1], escape):
            if mode == "fallback" and case.needs_fs and not fallback.get("landlock"):
                continue
            start = time.monotonic()
            result = run_tests(case.program, [(t, True) for t in case.tests], io=case.io, limits=LIMITS, mode=mode)
            elapsed = time.monotonic() - start
            tried += 1
            contained += result.passed == 0 and result.status != "error" and elapsed < LIMITS.timeout_s + 3.0
            slowest = max(slowest, (elapsed, f"code/{mode}: {case.name}"))
    try:
        sock.accept()
        contained -= 1  # a connection got through
    except BlockingIOError:
        pass
    contained -= bool(signalled) + os.path.exists(escape)
    print(f"code hostile        limit {LIMITS.timeout_s:.1f} s per run; modes {', '.join(modes)} "
          f"(fallback: landlock={fallback.get('landlock')}, seccomp={fallback.get('seccomp')})")
    print(f"hostile cases       {contained}/{tried} contained")
    print(f"slowest verdict     {slowest[0]:.2f} s ({slowest[1]})")


def math_batch(n: int = 256, symbolic_share: float = 0.4, seed: int = 0) -> tuple[list[str], list[str]]:
    """GRPO-like: groups of 8 sharing a gold answer; numeric answers (GSM8K) and LaTeX ones (MATH)."""
    rng = random.Random(seed)
    completions, golds = [], []
    for _ in range(n // 8):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        symbolic = rng.random() < symbolic_share
        gold = rf"\frac{{{a}}}{{{b}}}\sqrt{{{a + b}}}" if symbolic else str(a * b)
        for _ in range(8):
            r = rng.random()
            if symbolic:
                pred = [rf"\dfrac{{{a}\sqrt{{{a + b}}}}}{{{b}}}", rf"\frac{{{a}}}{{{b + 1}}}\sqrt{{{a + b}}}",
                        rf"{a}\sqrt{{{a + b}}}/{b}", rf"\frac{{{a}}}{{{b}}}"][min(int(r * 4), 3)]
                text = f"<think>{'work ' * 200}</think><answer>\\boxed{{{pred}}}</answer>"
            else:
                pred = [f"{a * b:,}", str(a * b + 1), f"{a * b}.0", str(a + b)][min(int(r * 4), 3)]
                text = f"Reasoning {'step ' * 200}so the total is {pred}.\n#### {pred}"
            completions.append(text)
            golds.append(gold)
    return completions, golds


def code_batch(n: int = 64) -> tuple[list[str], list, list]:
    pool = [(HUMANEVAL_GOOD, HUMANEVAL_TEST, "has_close_elements"), (HUMANEVAL_HALF, HUMANEVAL_TEST, "has_close_elements"),
            (MBPP_GOOD, MBPP_TESTS, None), ("```python\ndef area(r):\n    return r\n```", MBPP_TESTS, None)]
    rows = [pool[i % len(pool)] for i in range(n)]
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def throughput() -> None:
    for share, label in ((0.0, "math 256 (numeric: in-process)"), (0.4, "math 256 (60% numeric, 40% LaTeX)"),
                         (1.0, "math 256 (all LaTeX: worker pool)")):
        reward = MathReward()
        warm, warm_golds = math_batch(64, share, seed=1)
        reward(None, warm, answer=warm_golds)  # pool start-up is paid once per run, not per batch
        completions, golds = math_batch(256, share)
        start = time.monotonic()
        reward(None, completions, answer=golds)
        elapsed = time.monotonic() - start
        print(f"{label:36s} {len(completions) / elapsed:8.0f} rewards/s ({elapsed:.2f} s)")
    completions, tests, entries = code_batch(64)
    reward = CodeReward()
    start = time.monotonic()
    reward(None, completions, tests=tests, entry_point=entries)
    elapsed = time.monotonic() - start
    print(f"{'code 64 (HumanEval + MBPP, ' + isolation() + ')':36s} {64 / elapsed:8.1f} rewards/s ({elapsed:.2f} s)")


def main() -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {platform.machine()}, {default_size()} usable cores, Python {platform.python_version()}, "
          f"{platform.system()} {platform.release()}; sandbox: {isolation()}; load average {load}")
    accuracy()
    hostile()
    throughput()


if __name__ == "__main__":
    main()
