"""The demo's task: worked column sums and the process reward that checks them."""

import pytest

from aha.tasks.arithmetic import column_addition, column_steps_reward, sum_of_steps


def completion(think: str, answer: str) -> str:
    return f"<think>{think}</think><answer>{answer}</answer>"


def test_column_addition_by_hand():
    assert column_addition(47, 385) == "7+5=12 4+8+1=13 0+3+1=4"
    assert column_addition(5, 3) == "5+3=8"


def test_process_reward_is_the_share_of_right_column_sums():
    q = ["47+385"] * 4
    comps = [completion("7+5=12 4+8+1=13 0+3+1=4", "432"),        # all 3 right: 1
             completion("7+5=12 4+8=12 0+3=3", "322"),            # 1 of 3 right: 1/3
             completion("7+5=12 4+8+1=13 0+3+1=4 0+0=0", "432"),  # an extra step counts as wrong: 3/4
             "no think at all"]                                   # 0
    assert column_steps_reward(None, comps, q) == pytest.approx([1.0, 1 / 3, 3 / 4, 0.0], abs=1e-12)


@pytest.mark.parametrize("steps, value", [
    ("7+5=12 4+8+1=13 0+3+1=4", 432),   # sums 12, 13, 4: 4, then 3, then 2
    ("7+5=12 4+8+1=13", 132),           # the last sum keeps its carry: 13, then 2
    ("5+3=8", 8),
    ("7+5=12 4+8=12 0+3=3", 322),
    ("7+5=12 oops", None),
    ("", None),
])
def test_sum_of_steps_reads_the_number_the_sums_spell(steps, value):
    assert sum_of_steps(steps.split()) == value
