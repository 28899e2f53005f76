"""Code rewards: extract the program from a completion, turn a dataset's tests into sandbox steps, and score
the fraction of tests passed (or all-or-nothing). Three test styles are understood:
HumanEval (`def check(candidate)` plus an entry point), a list of assert statements (MBPP), and
stdin/stdout pairs ({"inputs": [...], "outputs": [...]}, as in APPS), compared exactly (see `_same_output`
in the harness: only trailing whitespace is forgiven, never a prefix)."""
from __future__ import annotations

import ast
import json
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .base import Reward, completion_text
from .pool import default_size
from .sandbox import Limits, SandboxResult, isolation, run_tests

logger = logging.getLogger(__name__)

MAX_PROGRAM_CHARS = 100_000
_PYTHON_FENCES = {"", "python", "py", "python3"}


def extract_program(text: str) -> str:
    """The program in a completion: the last ```python (or bare ```) block, looked for inside the `<answer>`
    block when there is one; else the raw text. An unclosed final fence counts (the model ran out of tokens).

    >>> extract_program("Sure:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
    'def f():\\n    return 1\\n'
    """
    if not isinstance(text, str):
        return ""
    if "<answer>" in text:
        inner = text.rsplit("<answer>", 1)[1].split("</answer>", 1)[0]
        if "```" in inner:
            text = inner
    pieces = text.split("```")
    for block in reversed(pieces[1::2]):  # odd pieces are inside fences
        lang, _, body = block.partition("\n")
        if lang.strip().lower() in _PYTHON_FENCES:
            return body
    return text


@dataclass
class TestSpec:
    steps: list[tuple[str, bool]] = field(default_factory=list)  # (source, counts as a test)
    setup: list[str] = field(default_factory=list)  # trusted: the dataset's own code
    bind: dict[str, str] = field(default_factory=dict)
    io: list[tuple[str, str]] | None = None
    imports: list[str] = field(default_factory=list)  # the program's safe imports (see program_imports)

    @property
    def total(self) -> int:
        return len(self.io) if self.io is not None else sum(1 for _, t in self.steps if t)


def _is_test(node: ast.AST) -> bool:
    """A step that tests something: it holds an assert whose condition reads a name. HumanEval's
    `assert True, "This prints if this assert fails"` tests nothing, and would pay a do-nothing program."""
    return any(isinstance(n, ast.Assert) and any(isinstance(m, ast.Name) for m in ast.walk(n.test))
               for n in ast.walk(node))


def _statements(source: str, nodes: list[ast.stmt]) -> list[tuple[str, bool]]:
    return [(ast.get_source_segment(source, n) or ast.unparse(n), _is_test(n)) for n in nodes]


def parse_tests(tests: Any, entry_point: str | None = None) -> TestSpec:
    """A dataset's tests as sandbox steps; ValueError when they are unusable (no asserts, no entry point...).
    Every top-level statement that contains an assert is one test; the others are setup, run in order. An assert
    that reads no name (`assert True`, `assert 1 == 1`) tests nothing: it runs, but does not count.

    >>> parse_tests(["assert f(1) == 2", "assert f(2) == 3"]).total
    2
    >>> parse_tests("def check(candidate):\\n    assert candidate(1) == 2\\n    assert candidate(0) == 1", "f").bind
    {'candidate': 'f'}
    """
    if isinstance(tests, str) and tests.lstrip().startswith("{"):
        tests = json.loads(tests)
    if isinstance(tests, dict):
        inputs, outputs = tests.get("inputs"), tests.get("outputs")
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs) or not inputs:
            raise ValueError("io tests need equal, non-empty 'inputs' and 'outputs' lists")
        return TestSpec(io=[(str(i), str(o)) for i, o in zip(inputs, outputs)])
    if isinstance(tests, (list, tuple)):
        tests = "\n".join(str(t) for t in tests)
    if not isinstance(tests, str):
        raise ValueError(f"tests of type {type(tests).__name__}")
    try:
        tree = ast.parse(tests)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise ValueError(f"tests do not parse: {e}") from None
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        spec = TestSpec(steps=_statements(tests, tree.body))
    else:  # HumanEval: the module is setup, check's body runs step by step with `candidate` bound
        if not entry_point:
            raise ValueError("HumanEval-style tests need an entry point")
        calls_check = [n for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                       and isinstance(n.value.func, ast.Name) and n.value.func.id == "check"]
        setup = [n for n in tree.body if n is not check and n not in calls_check]
        spec = TestSpec(steps=_statements(tests, check.body), setup=[s for s, _ in _statements(tests, setup)],
                        bind={check.args.args[0].arg if check.args.args else "candidate": entry_point})
    if spec.total == 0:
        raise ValueError("tests contain no assert that tests anything")
    return spec


SAFE_IMPORTS = frozenset((
    "abc", "array", "bisect", "calendar", "cmath", "collections", "collections.abc", "copy", "dataclasses",
    "datetime", "decimal", "enum", "fractions", "functools", "hashlib", "heapq", "itertools", "json", "math",
    "numbers", "operator", "random", "re", "statistics", "string", "sys", "textwrap", "time", "typing",
    "unicodedata"))
"""Modules whose import does nothing but define names: the only ones a program's imports may bring into the
checker, where the tests run outside the candidate's seccomp filter (`import venv.__main__` would run there)."""


def program_imports(program: str) -> list[str]:
    """The program's top-level imports that tests often rely on (MBPP's `math.isclose`), limited to SAFE_IMPORTS:
    they run again in the checker, so any other module (or a private name) is left out. The checker also drops
    whatever they bind over a builtin (`from operator import truth as isinstance`).

    >>> program_imports("import math, os\\nfrom venv import __main__\\nfrom collections import Counter as C")
    ['import math', 'from collections import Counter as C']
    """
    out = []
    for node in ast.parse(program).body:
        if isinstance(node, ast.Import):
            names = [a for a in node.names if a.name in SAFE_IMPORTS]
            if names:
                out.append(ast.unparse(ast.Import(names=names)))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module in SAFE_IMPORTS:
            names = [a for a in node.names if not a.name.startswith("_")]
            if names:
                out.append(ast.unparse(ast.ImportFrom(module=node.module, names=names, level=0)))
    return out


class CodeReward(Reward):
    """Runs the completion's program against the tests in `tests_column` in the sandbox. mode="fraction" gives
    the fraction of tests passed, mode="all" 1.0 only when all pass. A program that leaves or dies before the
    tests end, or overruns `timeout_s`, gets 0.0. Unusable tests give None (`data_errors`). Metrics count
    `sandbox/bwrap` or `sandbox/fallback` per run, and `timeouts`. Runs are spread over `max_workers` threads
    (one per core); each run has its own `timeout_s`, so a call is bounded without a call budget. With a finite
    `batch_timeout_s`, runs not started within it are not judged: None, counted in `unjudged` (never 0.0).

    >>> CodeReward()(["Write add."], ["```python\\ndef add(a, b):\\n    return a + b\\n```"],
    ...              tests=[["assert add(1, 2) == 3", "assert add(0, 0) == 1"]])
    [0.5]
    """

    name = "code"

    def __init__(self, tests_column: str = "tests", mode: str = "fraction", timeout_s: float = 10.0,
                 memory_mb: int = 1024, entry_point_column: str = "entry_point", max_workers: int | None = None,
                 batch_timeout_s: float = math.inf):
        super().__init__()
        if mode not in ("fraction", "all"):
            raise ValueError(f"mode must be 'fraction' or 'all', got {mode!r}")
        self.tests_column, self.mode, self.timeout_s, self.memory_mb = tests_column, mode, timeout_s, memory_mb
        self.entry_point_column = entry_point_column
        self.max_workers = max_workers or default_size()
        self.batch_timeout_s = batch_timeout_s
        self.required_columns = (tests_column,)
        self._executor: ThreadPoolExecutor | None = None

    @property
    def isolation(self) -> str:
        """"bwrap" or "fallback": which sandbox this machine gives (see aha.rewards.sandbox)."""
        return isolation()

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        tests = kwargs[self.tests_column]
        entries = kwargs.get(self.entry_point_column) or [None] * len(completions)
        prompts = prompts if prompts is not None else [None] * len(completions)
        rewards: list[float | None] = [0.0] * len(completions)
        jobs: dict[int, tuple[str, TestSpec]] = {}
        for i, (prompt, completion, test, entry) in enumerate(zip(prompts, completions, tests, entries)):
            try:
                spec = parse_tests(test, entry)
            except (ValueError, TypeError) as e:
                rewards[i] = None
                self.count("data_errors")
                logger.debug("unusable tests in row %d: %s", i, e)
                continue
            program = self.program(i, prompt, completion, entry, kwargs)
            if not program.strip() or len(program) > MAX_PROGRAM_CHARS:
                continue
            try:
                spec.imports = program_imports(program)
            except (SyntaxError, ValueError, MemoryError, RecursionError):
                continue  # it cannot run: 0.0 without starting a sandbox
            spec.setup = self.dataset_setup(i, entry, kwargs) + spec.setup
            jobs[i] = (program, spec)
        if jobs:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="aha-sandbox")
            limits = Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb)
            batch_end = time.monotonic() + self.batch_timeout_s

            def run(job: tuple[str, TestSpec]) -> SandboxResult:
                program, spec = job
                if time.monotonic() > batch_end:  # a batch of infinite loops must not stall the trainer
                    return SandboxResult(0, spec.total, "unjudged", isolation(), 0.0, {"skipped": True})
                return run_tests(program, spec.steps, spec.setup, spec.bind, spec.io, limits, imports=spec.imports)

            results = self._executor.map(run, jobs.values())
            for i, result in zip(jobs, results):
                rewards[i] = self._score(result)
        return rewards

    def program(self, index: int, prompt: Any, completion: Any, entry: str | None, columns: dict) -> str:
        """The program to run for row `index` (`columns`: the call's keyword columns): the completion's code,
        after the prompt when a base model continued a plain-string prompt's signature and docstring."""
        text = completion_text(completion)
        program = extract_program(text)
        if entry and isinstance(prompt, str) and f"def {entry}" not in program and f"def {entry}" in prompt:
            program = prompt + text  # a base model continuing HumanEval's signature and docstring
        return program

    def dataset_setup(self, index: int, entry: str | None, columns: dict) -> list[str]:
        """Trusted code from the dataset (not the completion) to run where the tests run, before the test module's
        own setup: what it defines is what the tests see, whatever the program defines under the same names."""
        return []

    def _score(self, result: SandboxResult) -> float | None:
        self.count(f"sandbox/{result.isolation}", not result.detail.get("skipped"))
        self.count("timeouts", result.status == "timeout")
        self.count("unjudged", result.status == "unjudged")
        if result.status == "unjudged":
            return None
        if result.status == "error":
            self.count("errors")
            logger.warning("sandbox harness error: %s", result.detail.get("error"))
            return None
        if result.total <= 0:
            return 0.0
        if self.mode == "all":
            return float(result.passed == result.total)
        return result.passed / result.total


code_reward = CodeReward()
