"""The demo's task: worked column sums and the process reward that checks them."""

import pytest

from aha.tasks import get_task
from aha.tasks.arithmetic import column_addition, column_steps_reward, sum_of_steps


def completion(think: str, answer: str) -> str:
    return f"<think>{think}</think><answer>{answer}</answer>"


def test_column_addition_by_hand():
    assert column_addition(47, 385) == "7+5=12 4+8+1=13 0+3+1=4"
    assert column_addition(5, 3) == "5+3=8"


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


def test_process_reward_pays_right_sums_only_under_the_answer_they_give():
    q = ["47+385"] * 4
    comps = [completion("7+5=12 4+8+1=13 0+3+1=4", "432"),   # all right: 1
             completion("7+5=12 4+8=12 0+3=3", "322"),       # 1 of 3 sums right, answer follows them: 1/3
             completion("7+5=12 4+8+1=13 0+3+1=4", "431"),   # right sums, an answer they do not give: 0
             completion("7+5=12 4+8+1=13 0+3+1=4", "")]      # no answer: 0
    assert column_steps_reward(None, comps, q) == pytest.approx([1.0, 1 / 3, 0.0, 0.0], abs=1e-12)


def test_no_wrong_answer_outscores_a_right_one_under_the_demos_weights():
    # The cause of demo runs whose reward rose while held-out accuracy did not: right sums under a wrong answer
    # earned 0.5 x 1.0 + 0.1 (format) = 0.6 of the 1.6 a right answer earns. With the gate the sums earn nothing
    # under an answer they do not give, so a wrong answer scores the format's 0.1.
    task = get_task("arithmetic")
    row = {"question": "47+385", "answer": "432"}
    comps = [completion("7+5=12 4+8+1=13 0+3+1=4", "431"),   # right sums, wrong answer
             completion("7+5=12 4+8+1=13 0+3+1=4", "432")]   # right sums, right answer
    fns, w = task.rewards(), task.reward_weights
    totals = [sum(wi * fn([None] * 2, comps, **{k: [v] * 2 for k, v in row.items()})[j] for fn, wi in zip(fns, w))
              for j in range(2)]
    assert totals[0] == pytest.approx(0.1)   # format only: the sums earn nothing under an answer they do not give
    assert totals[1] == pytest.approx(1.6)
