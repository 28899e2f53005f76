"""`add_check`: the three kinds of worked solution, the cold-start mix, the check parser and rewards that pay for
the answer, never for the words."""

import pytest

from aha.behaviour import Reflection
from aha.tasks import get_task
from aha.tasks.checked import (KINDS, carry_columns, checked_solution, column_sums, make_checked, parse_check,
                               problem_space, slips, wait_word_reward)

PROMPT = "<|im_start|>user\n47+385<|im_end|>\n<|im_start|>assistant\n"
RIGHT, WRONG = "7+5=12 4+8=12 0+3=3 so 432", "7+5=12 4+8=12 0+3=3 so 422"
"""First attempts at 47+385: right, and with the units' carry forgotten."""


def test_three_kinds_of_worked_solution():
    assert carry_columns(47, 385) == [0, 1] and carry_columns(12, 34) == [] and carry_columns(95, 5) == [0, 1]
    assert slips(47, 385) == [0, 1] and slips(95, 5) == [0] and slips(7, 5) == []  # a top carry is not forgotten
    assert column_sums(47, 385) == "7+5=12 4+8=12 0+3=3"
    assert checked_solution(47, 385, "direct") == f"<think>{RIGHT}</think><answer>432</answer>"
    assert checked_solution(47, 385, "confirm") == \
        f"<think>{RIGHT} check: 7+5=12 4+8+1=13 0+3+1=4 ok</think><answer>432</answer>"
    # the slip a correction catches is a forgotten carry: the units' gives 432 - 10, the tens' 432 - 100
    assert checked_solution(47, 385, "correct", slip=0) == \
        f"<think>{WRONG} check: 7+5=12 4+8+1=13 0+3+1=4 wait 432</think><answer>432</answer>"
    assert " so 332 " in checked_solution(47, 385, "correct", slip=1)
    assert checked_solution(95, 5, "correct") == ("<think>5+5=10 9+0=9 so 90 check: 5+5=10 9+0+1=10 wait 100"
                                                  "</think><answer>100</answer>")
    with pytest.raises(ValueError, match="valid"):
        checked_solution(1, 2, "maybe")


def test_the_cold_start_mix_is_rare_nested_and_keeps_the_problems():
    rows = {share: make_checked("train", 2000, seed=0, reflect_share=share) for share in (0.0, 0.05, 0.2)}
    kinds = {share: [r["kind"] for r in rs] for share, rs in rows.items()}
    assert set(kinds[0.0]) == {"direct"}
    assert 0.03 < sum(k != "direct" for k in kinds[0.05]) / 2000 < 0.07
    assert {"confirm", "correct"} <= set(kinds[0.05])
    assert [r["question"] for r in rows[0.0]] == [r["question"] for r in rows[0.2]]  # same problems, any share
    assert all(b != "direct" for a, b in zip(kinds[0.05], kinds[0.2]) if a != "direct")  # 5% is inside 20%
    for r in rows[0.2]:  # every correction's first attempt is wrong, every confirmation's right
        a, b = map(int, r["question"].split("+"))
        first_right = parse_check(r["question"], r["completion"]).first_right
        assert first_right == (r["kind"] != "correct") and r["answer"] == str(a + b)
    test = {r["question"] for r in make_checked("test", 200, seed=0)}
    assert not test & {r["question"] for r in rows[0.0]}  # split by the problem's hash


def test_without_carries_nothing_can_slip_and_every_check_confirms():
    assert len(problem_space("train")) == 8809 and len(problem_space("train", carries=False)) == 2560
    with pytest.raises(ValueError, match="2560 exist"):
        make_checked("train", 3000, carries=False)
    rows = make_checked("train", 500, seed=1, reflect_share=0.5, carries=False)
    assert all(carry_columns(*map(int, r["question"].split("+"))) == [] for r in rows)
    assert {r["kind"] for r in rows} == {"direct", "confirm"}


@pytest.mark.parametrize("text, want", [
    (checked_solution(47, 385, "direct"), Reflection(False, False, True, False)),
    (checked_solution(47, 385, "confirm"), Reflection(True, False, True, False)),
    (checked_solution(47, 385, "correct"), Reflection(True, True, False, False)),
    # a wrong re-add still checks: its verdict follows from its own sums (322), so it is not empty
    (f"<think>{WRONG} check: 7+5=12 4+8=12 0+3=3 wait 322</think><answer>322</answer>",
     Reflection(True, True, False, False)),
    # empty: the word alone; a wait that keeps the answer; an ok over sums that disagree; another problem's
    # columns; a verdict the <answer> ignores
    (f"<think>{RIGHT} wait</think><answer>432</answer>", Reflection(True, True, True, True)),
    (f"<think>{RIGHT} check: 7+5=12 4+8+1=13 0+3+1=4 wait 432</think><answer>432</answer>",
     Reflection(True, True, True, True)),
    (f"<think>{WRONG} check: 7+5=12 4+8+1=13 0+3+1=4 ok</think><answer>422</answer>",
     Reflection(True, False, False, True)),
    (f"<think>{WRONG} check: 7+3=10 4+5+1=10 wait 100</think><answer>100</answer>",
     Reflection(True, True, False, True)),
    (f"<think>{WRONG} check: 7+5=12 4+8+1=13 0+3+1=4 wait 432</think><answer>422</answer>",
     Reflection(True, True, False, True)),
    ("<think>7+5=12 check: 7+5=12 4+8+1=13 0+3+1=4 ok</think><answer>432</answer>",  # no answer to check
     Reflection(True, False, None, True)),
    ("garbage", Reflection(False, False, None, False)),
])
def test_parse_check_by_hand(text, want):
    assert parse_check(PROMPT, text) == want
    assert parse_check("47+385", text) == want  # the bare question, as the trainer passes it


def test_rewards_score_a_reflective_and_a_direct_completion_with_the_same_answer_alike():
    """Correctness and format only: the check and the "wait" earn nothing of their own."""
    task = get_task("add_check")
    wrong_direct = f"<think>{WRONG}</think><answer>422</answer>"
    wrong_checked = f"<think>{WRONG} check: 7+5=12 4+8=12 0+3=3 wait 322</think><answer>322</answer>"
    wrong_other = "<think>7+5=12 4+8=12 0+3=3 so 322</think><answer>322</answer>"
    for fn in task.rewards():
        for same in ([checked_solution(47, 385, k) for k in KINDS], [wrong_checked, wrong_other]):
            scores = fn(prompts=[[{"role": "user", "content": "47+385"}]] * len(same), completions=same,
                        answer=["432"] * len(same))
            assert len(set(scores)) == 1, (fn, same, scores)
        assert fn(prompts=[None] * 2, completions=[wrong_direct, checked_solution(47, 385, "correct")],
                  answer=["432"] * 2) in ([0.0, 1.0], [1.0, 1.0])  # the answer decides, or (format) nothing does
    assert task.reward_weights == [1.0, 0.1] and len(task.rewards()) == 2


def test_the_hack_reward_pays_for_the_word():
    assert wait_word_reward(None, ["<think>1+1=2 wait</think><answer>2</answer>", "<think>1+1=2</think>",
                                   "awaited"]) == [1.0, 0.0, 0.0]
