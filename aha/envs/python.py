"""`run_python`: a code tool that runs model-written Python in aha's sandbox (aha.rewards.sandbox: no network, a
private scratch directory, no fork or exec, CPU-time, memory and file limits, a wall-clock kill) and returns what
it printed, and the last line of an exception it raised. Output past 4 KB is cut."""

from __future__ import annotations

import random

from ..data.splits import split_of
from ..rewards.sandbox import Limits, run_tests

RUN_LIMITS = Limits(timeout_s=5.0, memory_mb=512)
"""What one run may take: 5 s of wall clock, 512 MB of address space (the sandbox's other limits as they are)."""
WRAPPER = """
_code = {code!r}
try:
    exec(compile(_code, "<tool>", "exec"), {{"__name__": "__main__"}})
except BaseException as _e:
    print(f"{{type(_e).__name__}}: {{_e}}")
"""
"""The program the sandbox runs: the code, with what it raised printed after its output."""


def run_python(code: str) -> str:
    """
    Run a Python program and return what it printed.

    Args:
        code: The Python source to run. Print the results you need.

    Returns:
        The program's standard output, and the error it raised, if any.
    """
    result = run_tests(WRAPPER.format(code=code), [], io=[("", "")], limits=RUN_LIMITS)
    out = (result.detail.get("outputs") or [""])[0]
    if result.status == "timeout":
        return out + f"\n[stopped: ran past {RUN_LIMITS.timeout_s:g} s]"
    if result.status in ("killed", "error"):
        return out + f"\n[the sandbox ended the program: {result.status}]"
    return out


# ------------------------------------------------------------------ a task for the code tool
PRIMES_BELOW = "print(sum(all(p % d for d in range(2, int(p ** 0.5) + 1)) for p in range(2, {n})))"
FIBONACCI = "a, b = 0, 1\nfor _ in range({k}):\n    a, b = b, a + b\nprint(a)"


def _task(rng) -> tuple[str, int, str]:
    """(question, answer, a program that prints the answer)."""
    kind = rng.randrange(3)
    if kind == 0:
        n, k = rng.randint(2, 9), rng.randint(20, 60)
        return (f"What is the sum of the digits of {n}**{k}?", sum(map(int, str(n ** k))),
                f"print(sum(map(int, str({n} ** {k}))))")
    if kind == 1:
        n = rng.randint(100, 3000)
        return f"How many prime numbers are there below {n}?", sum(
            all(p % d for d in range(2, int(p ** 0.5) + 1)) for p in range(2, n)), PRIMES_BELOW.format(n=n)
    k = rng.randint(30, 90)
    a, b = 0, 1
    for _ in range(k):
        a, b = b, a + b
    return f"What is the {k}th Fibonacci number (F(1) = F(2) = 1)?", a, FIBONACCI.format(k=k)


def make_tasks(split: str, n: int, seed: int = 0) -> list[dict]:
    """n rows of `split` (by a hash of the question): questions a short program answers exactly (digit sums of
    powers, prime counts, Fibonacci numbers); judged by aha.envs.calculator.final_answer. `solution` is the call
    that solves it, with the output it prints: [("run_python", {"code": ...}, "123\\n")]."""
    rng, rows, seen = random.Random(f"python-{seed}-{split}"), [], set()
    for _ in range(100 * n):
        if len(rows) == n:
            break
        question, answer, code = _task(rng)
        if question in seen or split_of(question) != split:
            continue
        seen.add(question)
        rows.append({"prompt": [{"role": "user", "content": question + " You may run Python."}],
                     "answer": str(answer), "id": question, "solution": [("run_python", {"code": code}, f"{answer}\n")]})
    if len(rows) < n:
        raise ValueError(f"only {len(rows)} distinct {split} questions; asked for {n}")
    return rows
