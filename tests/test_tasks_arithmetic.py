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


def _process_term(comps: list[str], q: str) -> list[float]:
    """The demo task's process term (its third reward, weight 0.5) as the trainer calls it."""
    from aha.tasks import TASKS
    task = TASKS["arithmetic"]
    fn = task.rewards()[2]
    assert task.reward_weights[2] == 0.5
    return fn(None, comps, [q] * len(comps))


def test_the_demo_process_term_pays_right_sums_only_under_the_right_answer():
    # The mode GRPO found on seed 16: every column sum right, the last column's sum written as the whole answer.
    # Column sums alone paid it in full, as much as the right answer; the demo's term must rank it below.
    right, gamed = completion("4+8=12 0+9+1=10", "102"), completion("4+8=12 0+9+1=10", "10")
    assert column_steps_reward(None, [right, gamed], ["4+98"] * 2) == [1.0, 1.0]
    # 2 sums right + digits of "10" against "102" from the right: 0/2, 1/0, missing -> 0 of 3: 2/5
    assert _process_term([right, gamed], "4+98") == pytest.approx([1.0, 2 / 5], abs=1e-12)


def test_the_demo_process_term_grows_with_right_answer_digits_and_peaks_only_when_right():
    import random
    rng = random.Random(0)
    for _ in range(200):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        chain, gold = column_addition(a, b), str(a + b)
        wrong = [str(n) for n in rng.sample(range(0, 300), 20) if n != a + b]
        scores = _process_term([completion(chain, gold)] + [completion(chain, w) for w in wrong], f"{a}+{b}")
        assert scores[0] == 1.0 and max(scores[1:]) < 1.0, (a, b)
    # one more right digit, from the right, scores more: 432 > 431 > 421 > 999 (no digit right)
    steps = _process_term([completion("7+5=12 4+8+1=13 0+3+1=4", n) for n in ("432", "431", "421", "999")],
                          "47+385")
    assert steps == pytest.approx([6 / 6, 5 / 6, 4 / 6, 3 / 6], abs=1e-12)
