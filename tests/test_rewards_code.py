"""Code verifier: program extraction, the three test styles, and a known-answer table run in the sandbox.
benchmarks/rewards_bench.py reports accuracy on the same table."""
from __future__ import annotations

import time

import pytest

from aha.rewards import CodeReward, extract_program, parse_tests

HUMANEVAL_TEST = '''
METADATA = {"author": "jt", "dataset": "test"}


def check(candidate):
    assert candidate([1.0, 2.0, 3.0], 0.5) == False
    assert candidate([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3) == True
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True
'''
HUMANEVAL_GOOD = '''```python
def has_close_elements(numbers, threshold):
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i != j and abs(a - b) < threshold:
                return True
    return False
```'''
HUMANEVAL_HALF = '''```python
def has_close_elements(numbers, threshold):
    return threshold > 0.9
```'''
FIND_ZERO_TEST = '''
def check(candidate):
    import math
    import random
    rng = random.Random(42)
    import copy
    for x in range(100):
        ncoeff = 2 * rng.randint(1, 4)
        coeffs = []
        for _ in range(ncoeff):
            coeff = rng.randint(-10, 10)
            if coeff == 0:
                coeff = 1
            coeffs.append(coeff)
        solution = candidate(copy.deepcopy(coeffs))
        assert math.fabs(poly(coeffs, solution)) < 1e-4
'''
FIND_ZERO_GOOD = '''```python
import math


def poly(xs: list, x: float):
    return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])


def find_zero(xs: list):
    lo, hi = -1.0, 1.0
    while poly(xs, lo) * poly(xs, hi) > 0:
        lo, hi = lo * 2.0, hi * 2.0
    while hi - lo > 1e-10:
        mid = (lo + hi) / 2.0
        if poly(xs, mid) * poly(xs, lo) > 0:
            lo = mid
        else:
            hi = mid
    return lo
```'''
MBPP_TESTS = ["assert math.isclose(area(2), 12.566, rel_tol=1e-3)", "assert area(0) == 0",
              "assert round(area(1), 2) == 3.14"]
MBPP_GOOD = "```python\nimport math\ndef area(r):\n    return math.pi * r * r\n```"
IO_TESTS = {"inputs": ["1 2\n", "10 20\n"], "outputs": ["3\n", "30\n"]}
IO_GOOD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"

# (completion, tests, entry point, expected reward in "fraction" mode)
CODE_CASES: list[tuple[str, object, str | None, float]] = [
    (HUMANEVAL_GOOD, HUMANEVAL_TEST, "has_close_elements", 1.0),
    (HUMANEVAL_HALF, HUMANEVAL_TEST, "has_close_elements", 0.75),
    (FIND_ZERO_GOOD, FIND_ZERO_TEST, "find_zero", 1.0),  # the tests call `poly`, defined by the program
    (FIND_ZERO_GOOD.replace("return lo", "return lo + 1"), FIND_ZERO_TEST, "find_zero", 0.0),
    ("```python\ndef has_close_elements(numbers, threshold):\n    return None\n```", HUMANEVAL_TEST,
     "has_close_elements", 0.0),
    ("I cannot solve this.", HUMANEVAL_TEST, "has_close_elements", 0.0),
    ("```python\ndef has_close_elements(numbers, threshold)\n    return True\n```", HUMANEVAL_TEST,
     "has_close_elements", 0.0),  # syntax error
    (MBPP_GOOD, MBPP_TESTS, None, 1.0),
    ("```python\ndef area(r):\n    return 3.14 * r * r\n```", MBPP_TESTS, None, 2 / 3),  # imports nothing: math test fails
    ("```py\ndef area(r):\n    raise ValueError\n```", MBPP_TESTS, None, 0.0),
    ("def area(r):\n    import math\n    return math.pi * r ** 2\n", "\n".join(["import math"] + MBPP_TESTS), None, 1.0),
    (IO_GOOD, IO_TESTS, None, 1.0),
    ("```python\nprint(3)\n```", IO_TESTS, None, 0.5),
    ("```python\na, b = map(int, input().split())\nprint(a + b, 'extra')\n```", IO_TESTS, None, 0.0),  # no prefix match
    ("```python\na, b = map(int, input().split())\nprint(a + b)\nprint()\n```", IO_TESTS, None, 1.0),  # trailing blank line
    ("```python\na, b = map(int, input().split())\nprint(str(a + b)[:1])\n```", IO_TESTS, None, 0.5),  # "3" is not "30"
    ("```python\nimport sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(0)\n```", IO_TESTS, None, 1.0),
    ("```python\nimport sys\nprint(len(sys.stdin.read()))\n```", {"inputs": ["", "ab"], "outputs": ["0", "2"]}, None, 1.0),
    ("```python\ndef f(xs):\n    xs.sort()\n    return xs\n```", ["assert f([3, 1, 2]) == [1, 2, 3]",
     "assert f((2, 1)) == [1, 2]"], None, 0.5),  # tuples come back as tuples; sort() on one raises
    # results keep Python's equality: a Counter equals a dict, a generator never equals a list
    ("```python\nfrom collections import Counter, namedtuple\nP = namedtuple('P', 'x y')\n"
     "def f(s):\n    return Counter(s)\ndef g():\n    return P(1, 2)\ndef h():\n    return (i for i in range(3))\n```",
     ["assert f('aab') == {'a': 2, 'b': 1}", "assert g() == (1, 2)", "assert list(h()) == [0, 1, 2]",
      "assert h() == [0, 1, 2]"], None, 0.75),
]


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    return CodeReward(timeout_s=5.0)


def test_known_answer_table(reward):
    got = reward(None, [c for c, _, _, _ in CODE_CASES], tests=[t for _, t, _, _ in CODE_CASES],
                 entry_point=[e for _, _, e, _ in CODE_CASES])
    wrong = [(c[:60], e, v) for (c, _, _, e), v in zip(CODE_CASES, got) if v is None or abs(v - e) > 1e-9]
    assert wrong == []
    metrics = reward.pop_metrics()
    assert metrics[f"sandbox/{reward.isolation}"] == len(CODE_CASES) - 2  # no sandbox for no code or bad syntax


def test_all_mode_is_all_or_nothing():
    reward = CodeReward(mode="all", timeout_s=5.0)
    out = reward(None, [HUMANEVAL_GOOD, HUMANEVAL_HALF], tests=[HUMANEVAL_TEST] * 2,
                 entry_point=["has_close_elements"] * 2)
    assert out == [1.0, 0.0]


def test_a_batch_of_infinite_loops_is_bounded_by_the_batch_timeout():
    """The runs that started hit their own limit and fail (0.0); the rest were never judged: None, not 0.0."""
    reward = CodeReward(timeout_s=1.0, batch_timeout_s=0.5, max_workers=2)
    start = time.monotonic()
    out = reward(None, ["```python\nwhile True:\n    pass\n```"] * 8, tests=[["assert f() == 1"]] * 8)
    assert time.monotonic() - start < 1.0 + 4.0
    ran = [v for v in out if v is not None]
    assert ran == [0.0] * len(ran) and 1 <= len(ran) <= 4
    counts = reward.pop_metrics()
    assert counts["timeouts"] == len(ran) and counts["unjudged"] == 8 - len(ran)


RANGES_AND_ITERATORS = '''```python
def gen():
    return (x for x in (0, 1))


def rng():
    return range(3)


def nested():
    return {"r": range(1, 3), "m": map(abs, [-1, -2])}


def total(xs):
    return sum(xs)
```'''


def test_ranges_and_iterators_compare_as_python_compares_them(reward):
    """They cross the sandbox boundary as tagged data and come back as a range, or an iterator over the items: a
    generator equals only itself and a range only an equal range, never a tuple or list (a HumanEval/8 answer
    returning `(x for x in (s, p))` must fail `== (0, 1)`). Iterating them, and passing them back, still works."""
    tests = ["assert gen() != (0, 1)", "assert rng() != (0, 1, 2)", "assert rng() != [0, 1, 2]",
             "assert rng() == range(0, 3) and rng()[1:] == range(1, 3) and rng() != range(4)",
             "assert tuple(gen()) == (0, 1) and list(rng()) == [0, 1, 2]",
             ["g = gen()", "assert next(g) == 0 and list(g) == [1] and list(g) == []"],
             "assert nested()['r'] == range(1, 3) and list(nested()['m']) == [1, 2]",
             "assert total(rng()) == 3 and total(gen()) == 1 and total(iter([5, 6])) == 11"]
    out = reward(None, [RANGES_AND_ITERATORS] * len(tests), tests=[t if isinstance(t, list) else [t] for t in tests])
    assert out == [1.0] * len(tests)
    reward.pop_metrics()


def test_a_program_cannot_change_what_the_tests_compute(reward):
    """The tests see the real builtins and the dataset's own helpers, whatever the program defines or imports
    under their names (`def sum` once made the test module's `poly` return 0); a program may still use a helper
    named like a builtin itself."""
    poly_tests = FIND_ZERO_TEST.replace("def check(candidate):", "import math\n\n\ndef poly(xs, x):\n"
                                        "    return sum([c * math.pow(x, i) for i, c in enumerate(xs)])\n\n\n"
                                        "def check(candidate):")
    cases = [("def sum(*a):\n    return 0\n\ndef find_zero(xs):\n    return 0.0", poly_tests, "find_zero", 0.0),
             ("def abs(x):\n    return 0\n\ndef f():\n    return 2", ["assert abs(f() - 1) < 1e-9"], None, 0.0),
             ("from operator import truth as isinstance\ndef f():\n    return 2", ["assert isinstance(f(), str)"],
              None, 0.0),
             ("def tuple(*a):\n    return (1, 2)\n\ndef f():\n    return [2, 1]", ["assert tuple(f()) == (1, 2)"],
              None, 0.0),
             ("def max(a, b):\n    return a if a > b else b\n\ndef f(xs):\n    return max(xs[0], xs[1])",
              ["assert f([1, 3]) == 3 == max(1, 3)"], None, 1.0)]
    out = reward(None, [f"```python\n{c}\n```" for c, _, _, _ in cases], tests=[t for _, t, _, _ in cases],
                 entry_point=[e for _, _, e, _ in cases])
    assert out == [v for _, _, _, v in cases]
    reward.pop_metrics()


def test_constant_asserts_are_not_tests(reward):
    """HumanEval's `assert True, "This prints if this assert fails"` steps test nothing: they run, but count for
    nothing, so a do-nothing program earns nothing from them."""
    tests = ("def check(candidate):\n    assert candidate(1) == 2\n    assert True, 'prints if this fails'\n"
             "    assert True\n    assert 1 == 1\n")
    spec = parse_tests(tests, "f")
    assert spec.total == 1 and len(spec.steps) == 4
    assert parse_tests(["assert True", "assert f(1) == 2"]).total == 1
    with pytest.raises(ValueError, match="no assert"):
        parse_tests(["assert True"])
    assert reward(None, ["```python\ndef f(x):\n    return None\n```"], tests=[tests], entry_point=["f"]) == [0.0]
    reward.pop_metrics()


def test_base_model_continuation_gets_the_prompt_prepended(reward):
    prompt = 'def add(a, b):\n    """Add two numbers."""\n'
    out = reward([prompt], ["    return a + b\n"], tests=["def check(candidate):\n    assert candidate(2, 3) == 5\n"],
                 entry_point=["add"])
    assert out == [1.0]


def test_unusable_tests_are_data_errors(reward):
    out = reward(None, [MBPP_GOOD] * 4, tests=["x = 1", "def check(candidate):\n    assert candidate(1)", "(((", None],
                 entry_point=[None] * 4)
    assert out == [None] * 4
    assert reward.pop_metrics()["data_errors"] == 4


def test_missing_column_is_a_key_error(reward):
    with pytest.raises(KeyError):
        reward(None, [MBPP_GOOD], answer=["x"])


@pytest.mark.parametrize("text, expected", [
    ("```python\nx = 1\n```", "x = 1\n"),
    ("```\nx = 2\n```", "x = 2\n"),
    ("a\n```python\nx = 1\n```\nthen\n```python\nx = 3\n```\n", "x = 3\n"),  # the last block
    ("```python\nx = 1\n```\n```text\noutput\n```", "x = 1\n"),  # not a text block
    ("<think>```python\nx = 0\n```</think><answer>```python\nx = 4\n```</answer>", "x = 4\n"),
    ("```python\nx = 5\n", "x = 5\n"),  # unclosed at the end
    ("x = 6", "x = 6"),  # raw
])
def test_extract_program(text, expected):
    assert extract_program(text) == expected


def test_parse_tests_styles():
    he = parse_tests(HUMANEVAL_TEST, "has_close_elements")
    assert he.total == 4 and he.bind == {"candidate": "has_close_elements"} and len(he.setup) == 1
    assert parse_tests(MBPP_TESTS).total == 3
    io = parse_tests('{"inputs": ["1"], "outputs": ["2"]}')
    assert io.io == [("1", "2")] and io.total == 1
    for bad in ("x = 1", {"inputs": ["1"], "outputs": []}, 5):
        with pytest.raises(ValueError):
            parse_tests(bad)
    with pytest.raises(ValueError):
        parse_tests(HUMANEVAL_TEST)  # no entry point
