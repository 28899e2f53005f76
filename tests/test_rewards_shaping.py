"""Format, format gating, countdown and length rewards: known-answer tables and edge cases."""
from __future__ import annotations

from fractions import Fraction

import pytest

from aha.rewards import (CountdownReward, FormatGated, FormatReward, LengthPenalty, MathReward, SoftOverlongReward,
                         countdown_value, format_ok)

# (completion, expected format_ok)
FORMAT_CASES = [
    ("<think>2+2 is 4</think><answer>4</answer>", True),
    ("<think>\nsteps\n</think>\n<answer>\n4\n</answer>\n", True),  # whitespace around and between
    ("<think></think><answer>4</answer>", True),  # an empty think block is still the format
    ("<think>a</think><answer>  </answer>", False),  # but the answer may not be empty
    ("<think>a</think><answer>4</answer>extra", False),  # nothing after
    ("<think>a</think><answer>4</answer><answer>5</answer>", False),
    ("preamble <think>a</think><answer>4</answer>", False),  # nothing before
    ("<think>a</think> words <answer>4</answer>", False),  # nothing between
    ("<answer>4</answer><think>a</think>", False),
    ("<think>a<think>b</think><answer>4</answer>", False),
    ("<think>a</think>", False), ("4", False), ("", False),
    ("<think>a</think><answer>4", False),
]


@pytest.mark.parametrize("text, expected", FORMAT_CASES)
def test_format_table(text, expected):
    assert format_ok(text) is expected
    assert FormatReward()(None, [text]) == [float(expected)]


def test_format_with_think_opened_by_the_prompt():
    assert format_ok("reasoning</think><answer>4</answer>", think_in_prompt=True)
    assert not format_ok("reasoning</think><answer>4</answer>")


def test_format_gate_pays_correctness_only_with_the_format():
    gated = FormatGated(MathReward())
    good, bare = "<think>6*7</think><answer>42</answer>", r"\boxed{42}"
    assert gated(None, [good, bare, good], answer=["42", "42", None]) == [1.0, 0.0, None]
    assert gated.__name__ == "math" and gated.required_columns == ("answer",)
    assert gated.pop_metrics() == {"data_errors": 1.0, "timeouts": 0.0, "too_large": 0.0, "unjudged": 0.0,
                                   "errors": 0.0}  # zeros logged too


# (expression, numbers, expected value or None)
COUNTDOWN_CASES = [
    ("(25 - 5) * 3", [3, 5, 25], Fraction(60)),
    ("25*3 - 5 - 10", [3, 5, 10, 25], Fraction(60)),
    ("100 / (5 - 1)", [1, 5, 100], Fraction(25)),
    ("7 / 2 + 1 / 2", [1, 2, 2, 7], Fraction(4)),  # exact fractions, not floats
    ("(25 − 5) × 3", [3, 5, 25], Fraction(60)),  # typeset operators
    ("(25 - 5) * 3 = 60", [3, 5, 25], Fraction(60)),
    ("25 * 3", [3, 5, 25], None),  # 5 unused
    ("25 * 3 * 3", [3, 25], None),  # 3 used twice
    ("253", [25, 3], None),  # digits glued into a new number
    ("2 ** 5", [2, 5], None), ("2 ^ 5", [2, 5], None),  # no powers
    ("-3 + 5", [3, 5], None),  # no unary minus
    ("3.0 + 5", [3, 5], None),  # numbers exactly as given
    ("5 / (3 - 3)", [3, 3, 5], None),  # division by zero
    ("__import__('os').system('true')", [1], None), ("(lambda: 1)()", [1], None), ("abs(-5)", [5], None),
    ("(" * 300 + "1" + ")" * 300, [1], None),
]


@pytest.mark.parametrize("expr, numbers, expected", COUNTDOWN_CASES)
def test_countdown_table(expr, numbers, expected):
    assert countdown_value(expr, numbers) == expected


def test_countdown_reward():
    r = CountdownReward(format_score=0.1)
    completions = ["<think>.</think><answer>(25 - 5) * 3</answer>", "<answer>25 + 5 + 3</answer>",
                   "<answer>25 * 3</answer>", "the answer is 60", r"\boxed{(25-5)*3}"]
    out = r(None, completions, target=[60] * 5, nums=[[3, 5, 25]] * 4 + ["[3, 5, 25]"])
    assert out == [1.0, 0.1, 0.0, 0.0, 1.0]
    assert r(None, ["<answer>1</answer>"], target=["x"], nums=[[1]]) == [None]


def test_soft_overlong_matches_dapo():
    r = SoftOverlongReward(max_len=20, cache_len=10)
    lengths = [0, 10, 11, 15, 20, 21]
    # 0 up to 20 - 10 = 10 tokens; then (10 - n) / 10: n=11 -> -0.1, n=15 -> -0.5, n=20 -> -1.0; beyond 20: -1
    expected = [0.0, 0.0, -0.1, -0.5, -1.0, -1.0]
    out = r(None, [""] * 6, completion_ids=[[0] * n for n in lengths])
    assert out == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError):
        SoftOverlongReward(max_len=10, cache_len=11)


def test_length_fallback_counts_characters():
    r = SoftOverlongReward(max_len=20, cache_len=10, chars_per_token=4.0)
    assert r(None, ["x" * 60, [{"role": "assistant", "content": "x" * 100}]]) == [-0.5, -1.0]  # 15 and 25 tokens
    assert LengthPenalty(max_len=100)(None, ["x" * 200]) == [-0.5]
    assert LengthPenalty(max_len=10, scale=2.0)(None, [""] * 2, completion_ids=[[0] * 5, [0] * 50]) == [-1.0, -2.0]
