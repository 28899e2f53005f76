"""Step verifiers (process rewards): column sums, countdown's equations, GSM8K's calculator notes. Each returns per
completion a list of (end offset, score); offsets are checked against the text they close."""
from __future__ import annotations

import doctest
import time
from fractions import Fraction

import pytest

import aha.rewards.calculator_steps as calculator_module
import aha.rewards.countdown as countdown_module
from aha.rewards import REWARDS, CalculatorStepsReward, CountdownStepsReward, get_reward
from aha.rewards.calculator_steps import annotation_right, calculator_steps
from aha.rewards.countdown import countdown_steps, countdown_value, exact_value
from aha.tasks.arithmetic import column_step_rewards, column_steps_reward


def _chat(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def _ends_with(text: str, steps: list[tuple[int, float]], pieces: list[str]) -> None:
    assert len(steps) == len(pieces)
    for (end, _), piece in zip(steps, pieces):
        assert text[:end].endswith(piece), (text[:end], piece)


# ---------------------------------------------------------------- column sums (arithmetic task, "47+385")
# worked sum of 47+385, rightmost column first: 7+5=12 4+8+1=13 0+3+1=4

def test_column_steps_right_chain_offsets():
    text = "<think>7+5=12 4+8+1=13 0+3+1=4</think><answer>432</answer>"
    [steps] = column_step_rewards(None, [text], ["47+385"])
    # "<think>" is 7 chars: 7+6=13, then a space and 8 chars -> 22, then a space and 7 chars -> 30
    assert steps == [(13, 1.0), (22, 1.0), (30, 1.0)]
    _ends_with(text, steps, ["7+5=12", "4+8+1=13", "0+3+1=4"])
    assert text[30:].startswith("</think>")


def test_column_steps_wrong_missing_padded_and_their_mean_is_the_scalar():
    q = "47+385"
    wrong = "<think>7+5=12 4+8=12 0+3=3</think>"  # carries dropped: columns 2 and 3 wrong
    short = "<think>7+5=12 </think><answer>12</answer>"  # one column of three
    padded = "<think>7+5=12 4+8+1=13 0+3+1=4 0+0=0</think>"  # an extra fourth column
    swapped = "<think>4+8+1=13 7+5=12 0+3+1=4</think>"  # right sums, wrong positions
    out = column_step_rewards(None, [wrong, short, padded, swapped], [q] * 4)
    assert [[s for _, s in steps] for steps in out] == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0],
                                                        [0.0, 0.0, 1.0]]
    # the missing two columns end where the think's content ends: offset of "</think>" = 7 + len("7+5=12 ") = 14
    assert out[1] == [(13, 1.0), (14, 0.0), (14, 0.0)] and short[14:].startswith("</think>")
    _ends_with(padded, out[2], ["7+5=12", "4+8+1=13", "0+3+1=4", "0+0=0"])
    scalars = column_steps_reward(None, [wrong, short, padded, swapped], [q] * 4)
    assert scalars == [1 / 3, 1 / 3, 3 / 4, 1 / 3]
    assert [sum(s for _, s in steps) / len(steps) for steps in out] == scalars


def test_column_steps_chat_no_think_and_garbage():
    text = "<think>7+5=12 4+8+1=13 0+3+1=4</think><answer>432</answer>"
    assert column_step_rewards(None, [_chat(text)], ["47+385"]) == [[(13, 1.0), (22, 1.0), (30, 1.0)]]
    # no complete think: all three columns missing, ending at the text's end (len 20, 13, 0, 0, 0), mean 0.0 as
    # the scalar says
    assert column_step_rewards(None, ["<answer>432</answer>", "<think>7+5=12", None, 42, []], ["47+385"] * 5) == \
        [[(20, 0.0)] * 3, [(13, 0.0)] * 3, [(0, 0.0)] * 3, [(0, 0.0)] * 3, [(0, 0.0)] * 3]
    # an empty think is three missing columns, all ending at 7 (the offset of "</think>")
    assert column_step_rewards(None, ["<think></think>"], ["47+385"]) == [[(7, 0.0)] * 3]
    # a question that is not "a+b" is a data error: None, not a raise
    assert column_step_rewards(None, [text] * 4, ["47-385", "", None, "1+2+3"]) == [None] * 4


# ---------------------------------------------------------------- countdown: numbers [3, 5, 25], target 60
NUMS = [3, 5, 25]


def _countdown(texts, nums=NUMS, target=60):
    return CountdownStepsReward()(None, texts, target=[target] * len(texts), nums=[nums] * len(texts))


def test_countdown_steps_right_chain_offsets():
    text = "<think>25 - 5 = 20, 20*3=60</think><answer>(25-5)*3</answer>"
    [steps] = _countdown([text])
    # "<think>" 7 + "25 - 5 = 20" 11 = 18; ", " 20 + "20*3=60" 7 = 27
    assert steps == [(18, 1.0), (27, 1.0)]
    _ends_with(text, steps, ["25 - 5 = 20", "20*3=60"])


def test_countdown_steps_wrong_arithmetic_leaves_the_pool_unchanged():
    # 25 - 5 = 21 is wrong: 21 is not made available, so 21 * 3 = 63 (right arithmetic) scores 0 too
    assert [s for _, s in _countdown(["<think>25 - 5 = 21. 21 * 3 = 63</think>"])[0]] == [0.0, 0.0]
    # ...and 25 and 5 are not consumed: the corrected step and the next one score 1
    assert [s for _, s in _countdown(["<think>25 - 5 = 21, 25 - 5 = 20, 20 * 3 = 60</think>"])[0]] == [0.0, 1.0, 1.0]
    # a wrong quotient, exactly: 7 / 2 is 3.5, not 3.4 or 3
    assert [s for _, s in _countdown(["<think>7/2=3.4 7/2=3 7/2=3.5 3.5*2=7</think>"], nums=[7, 2, 2])[0]] == \
        [0.0, 0.0, 1.0, 1.0]
    # division by zero is a wrong step, never a raise
    assert [s for _, s in _countdown(["<think>5 / 0 = 0</think>"], nums=[5, 0])[0]] == [0.0]


def test_countdown_steps_availability_and_consumption():
    # 4 is not among the numbers
    assert [s for _, s in _countdown(["<think>25 + 4 = 29</think>"])[0]] == [0.0]
    # 25 is consumed by the first step: 25 + 3 = 28 is right arithmetic on a spent number
    assert [s for _, s in _countdown(["<think>25 - 5 = 20 25 + 3 = 28</think>"])[0]] == [1.0, 0.0]
    # 20 made once, used twice: the second use scores 0
    assert [s for _, s in _countdown(["<think>25 - 5 = 20 20 * 3 = 60 20 + 3 = 23</think>"])[0]] == [1.0, 1.0, 0.0]
    # a number given twice may be used twice, in one step
    assert [s for _, s in _countdown(["<think>5 * 5 = 25 25 - 2 = 23</think>"], nums=[5, 5, 2])[0]] == [1.0, 1.0]
    assert [s for _, s in _countdown(["<think>5 * 5 = 25</think>"], nums=[5, 2])[0]] == [0.0]
    # padding with right but unrelated equations earns nothing: 2 + 2 uses numbers the problem does not have
    assert [s for _, s in _countdown(["<think>25 - 5 = 20 2 + 2 = 4 1 + 1 = 2 20 * 3 = 60</think>"])[0]] == \
        [1.0, 0.0, 0.0, 1.0]


def test_countdown_steps_where_and_what_is_a_step():
    # typeset symbols (one character each, so offsets hold): − and ×
    text = "<think>25 − 5 = 20, then 20 × 3 = 60.</think>"
    [steps] = _countdown([text])
    assert [s for _, s in steps] == [1.0, 1.0]
    _ends_with(text, steps, ["25 − 5 = 20", "20 × 3 = 60"])  # the period after 60 is not part of the step
    # the tail of a longer expression is no step: 10 - 5 - 2 = 3 holds no "5 - 2 = 3"
    assert _countdown(["<think>10 - 5 - 2 = 3</think>"], nums=[10, 5, 2]) == [[]]
    # a bullet's dash on a new line is not a continuation
    text = "<think>\n- 25 - 5 = 20\n- 20 * 3 = 60</think>"
    assert [s for _, s in _countdown([text])[0]] == [1.0, 1.0]
    # no think: everything before <answer> (and nothing after it)
    text = "25-5=20 so 20*3=60 <answer>(25-5)*3</answer> 1+2=3"
    [steps] = _countdown([text])
    assert steps == [(7, 1.0), (18, 1.0)]
    _ends_with(text, steps, ["25-5=20", "20*3=60"])
    # with a think, equations after </think> are not steps
    assert _countdown(["<think>25-5=20</think> 20*3=60"]) == [[(14, 1.0)]]


def test_countdown_steps_chat_garbage_and_data_errors():
    assert _countdown([_chat("<think>25-5=20 20*3=60</think>")]) == [[(14, 1.0), (22, 1.0)]]
    # nothing written, or nothing readable: []
    long = "1" * 40
    assert _countdown(["<think>hmm</think>", "", None, 42, [{"role": "assistant"}], f"{long}+1={long}2"]) == [[]] * 6
    r = CountdownStepsReward()
    out = r(None, ["<think>25-5=20</think>"] * 3, target=["x", 60, None], nums=[NUMS, None, NUMS])
    assert out == [None, None, None] and r.pop_metrics() == {"data_errors": 3.0}
    # numbers as text, as CountdownReward reads them
    assert r(None, ["<think>25-5=20</think>"], target=["60"], nums=["[3, 5, 25]"]) == [[(14, 1.0)]]


def test_exact_value_is_shared_and_countdown_value_unchanged():
    assert exact_value("7 / 2 + 1 / 2") == (Fraction(4), [Fraction(7), Fraction(2), Fraction(1), Fraction(2)])
    assert exact_value("0.1 + 0.2", decimals=True)[0] == Fraction(3, 10)  # exact, not 0.30000000000000004
    assert exact_value("0.1 + 0.2") is None and exact_value("-3") is None
    assert exact_value("-(3 - 5)", negation=True)[0] == 2
    for hostile in ["__import__('os')", "0x10", "1_000", "1e5", "2 ** 5", "5 // 2", "(1)(2)", "abs(-5)", "1" * 301]:
        assert exact_value(hostile, decimals=True, negation=True) is None, hostile
    assert countdown_value("(25 - 5) * 3 = 60", NUMS) == 60
    assert countdown_value("25.0 * 3 - 5 - 10", [3, 5, 10, 25]) is None  # countdown stays integers only


# ---------------------------------------------------------------- GSM8K calculator notes
GSM8K = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
         "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")


def test_calculator_steps_gsm8k_offsets():
    steps = calculator_steps(GSM8K)
    assert [s for _, s in steps] == [1.0, 1.0]
    _ends_with(GSM8K, steps, ["<<48/2=24>>", "<<48+24=72>>"])
    # "Natalia sold 48/2 = " is 20 chars, the note 11 more
    assert steps[0][0] == 31


@pytest.mark.parametrize("note, right", [
    ("48/2=24", True), ("48+24=70", False),
    ("20*.01=.2", True), ("10/4=2.5", True), ("10/3=3.33", False),  # decimals, exactly: 10/3 is not 3.33
    ("-3+5=2", True), ("(3+1)*2=8", True), ("3+1*2=8", False),  # unary minus, precedence
    ("1/3+1/3+1/3=1", True), ("0.1+0.2=0.3", True),  # fractions, not floats
    ("24", False), ("2**5=32", False), ("1/0=0", False), ("2=2=2", False), ("2*3=six", False), ("=5", False),
    ("__import__('os')=1", False), ("1+" * 200 + "1=201", False),  # right, but past MAX_EXPRESSION_CHARS
])
def test_annotation_table(note, right):
    assert annotation_right(note) is right


def test_calculator_steps_reward_chat_padding_and_garbage():
    r = get_reward("calculator_steps")
    assert isinstance(r, CalculatorStepsReward) and r.__name__ == "calculator_steps" and r.required_columns == ()
    text = "2*3 = <<2*3=6>>6, then <<6+1=8>>8 and <<6+1=7>>7"
    [steps] = r(None, [_chat(text)])
    assert [s for _, s in steps] == [1.0, 0.0, 1.0]
    _ends_with(text, steps, ["<<2*3=6>>", "<<6+1=8>>", "<<6+1=7>>"])
    assert r(None, ["no notes here, 2*3=6", "", None, 42, [], "<<unclosed 2*3=6", "<< >>"]) == \
        [[], [], [], [], [], [], [(5, 0.0)]]


def test_step_verifiers_never_hang():
    hostile = ["<<" * 50_000, "1 + " * 25_000, "<think>" * 10_000 + "25-5=20 " * 5_000, "9" * 100_000 + "=9"]
    t = time.perf_counter()
    for text in hostile:
        calculator_steps(text)
        countdown_steps(text, NUMS)
        column_step_rewards(None, [text], ["47+385"])
    assert time.perf_counter() - t < 5.0


def test_registered_and_documented():
    assert REWARDS["countdown_steps"] is CountdownStepsReward and REWARDS["calculator_steps"] is CalculatorStepsReward
    r = get_reward("countdown_steps", target_column="t", numbers_column="n")
    assert r.__name__ == "countdown_steps" and r.required_columns == ("t", "n")
    for module in (calculator_module, countdown_module):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0
