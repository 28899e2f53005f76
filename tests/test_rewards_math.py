"""Math verifier: a known-answer table (completion, gold, expected reward), extraction, the fast path, the
killable pool, and hostile inputs. benchmarks/rewards_bench.py reports accuracy on the same table."""
from __future__ import annotations

import time

import pytest

from aha.rewards import MathReward, answers_equal, extract_answer
from aha.rewards.maths import compare_answers, fast_verdict, gold_answer, symbolic_pool

GSM8K_GOLD = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
              "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")

# (completion, gold, expected reward)
MATH_CASES: list[tuple[str, str, float]] = [
    # fractions
    (r"so \boxed{\frac{1}{2}}", "0.5", 1), (r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}", 1),
    (r"\boxed{0.75}", r"\frac34", 1), (r"\boxed{3/4}", r"\frac{3}{4}", 1), (r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", 1),
    (r"\boxed{-\frac{1}{2}}", r"-\frac12", 1), (r"\boxed{\frac{1}{3}}", "0.333", 0), (r"\boxed{\frac{2}{1}}", r"\frac{1}{2}", 0),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{3}", 0),
    # LaTeX forms
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1), (r"\boxed{\sqrt{2}}", r"2\sqrt{2}", 0), (r"\boxed{2\pi}", r"\pi", 0),
    (r"\boxed{x^2+2x+1}", r"(x+1)^2", 1), (r"\boxed{x^2+1}", r"(x+1)^2", 0),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)", 1),
    (r"\boxed{(3, \frac{\pi}{2})}", r"\left( 3, \frac{\pi}{2} \right)", 1), (r"\boxed{90^\circ}", "90", 1),
    (r"\boxed{\text{(C)}}", r"\text{(C)}", 1), (r"\boxed{10^{3}}", "1000", 1), (r"\boxed{3i+2}", "2+3i", 1),
    (r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", 1),
    (r"\boxed{\sqrt{4}}", "2", 1), (r"\boxed{\log_2 8}", "3", 1), (r"\boxed{\binom{5}{2}}", "10", 1), (r"\boxed{5!}", "120", 1),
    (r"\boxed{\{1, 2\}}", r"\{2, 1\}", 1), (r"\boxed{\{1, 2\}}", r"\{1, 3\}", 0), (r"\boxed{y = 2x + 1}", r"y=2x+1", 1),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", 1), (r"\boxed{0.8660}", r"\frac{\sqrt{3}}{2}", 0),
    (r"\boxed{\infty}", r"\infty", 1), (r"\boxed{\text{Monday}}", r"\text{Monday}", 1), (r"\boxed{\text{Tuesday}}", r"\text{Monday}", 0),
    # intervals
    (r"\boxed{(1, 2]}", r"(1,2]", 1), (r"\boxed{[1, 2)}", r"(1,2]", 0), (r"\boxed{(-\infty, 3)}", r"(-\infty,3)", 1),
    (r"\boxed{(-\infty, 3]}", r"(-\infty,3)", 0), (r"\boxed{x \in [2, 5]}", r"[2,5]", 1),
    (r"\boxed{[2,5] \cup [7, 8)}", r"[2,5]\cup[7,8)", 1),
    # units, currency, percentages, thousands
    (r"\boxed{12 \text{ cm}}", "12", 1), ("The answer is 12 cm.", "12", 1), (r"\boxed{\$18.90}", "18.9", 1),
    (r"\boxed{50\%}", "50", 1), (r"\boxed{50\%}", "0.5", 1), (r"\boxed{5\%}", "50", 0), (r"\boxed{1,000}", "1000", 1),
    (r"\boxed{12\text{ inches}}", r"12 \text{ inches}", 1),
    # GSM8K
    ("She has 48 + 24 = 72 clips.\n#### 72", GSM8K_GOLD, 1), ("#### 1,080", "So 1080.\n#### 1080", 1),
    ("#### 72.00", "#### 72", 1), ("So the total is $18.", "#### 18", 1), ("#### 71", GSM8K_GOLD, 0),
    ("So it is 7 dollars.\n#### 7 dollars", "#### 7", 1),
    # <answer> tags
    ("<think>6*7</think><answer>42</answer>", "42", 1), ("<think>.</think><answer>x = 5</answer>", "5", 1),
    ("<think>.</think><answer>$\\boxed{7}$</answer>", "7", 1),
    # wrong answers that look right, hedges, candidates
    (r"\boxed{1,2}", "12", 0), (r"\boxed{0.05}", "0.5", 0), (r"\boxed{-5}", "5", 0), (r"\boxed{100}", "1000", 0),
    (r"\boxed{3x}", "3", 0), (r"\boxed{3} or maybe \boxed{5}", "5", 0), (r"\boxed{3, 5, 7}", "5", 0),
    ("<answer>3 or 5</answer>", "5", 0), ("<answer>Either 3, or maybe 5</answer>", "5", 0),
    ("<answer>5</answer><answer>7</answer>", "5", 0), ("No answer here.", "5", 0),
    (r"First \boxed{5}, so the final answer is \boxed{5}.", "5", 1),
    # scale words are no units, exact values are exact, numbers read whole, headings are no answers, equal boxes agree
    (r"The company has \boxed{2 \text{ million}} users.", "2", 0), ("<answer>10 million</answer>", "10", 0),
    (r"\boxed{0}", r"\frac{1}{2000000}", 0), (r"\boxed{0.000067}", ".0000672", 0), (r"\boxed{3.141593}", r"\pi", 1),
    ("The answer is \u22125", "5", 0), ("The answer is \u22125", "-5", 1), ("it is .5", "5", 0), ("it is .5", "0.5", 1),
    ("Answer: 1 1/2 cups", "1/2", 0), ("Answer: 1 1/2 cups", r"\frac32", 1), ("range 10-20", "-20", 0),
    ("#### Step 1: eggs left\n16 - 3 - 4 = 9\n#### Step 2: money\n9 * 2 = 18\nThe answer is 18.", "#### 18", 1),
    ("#### Solution\nShe sells 9 eggs and makes $18.", "#### 18", 1),
    (r"So x = \boxed{\frac{1}{2}}, i.e. \boxed{0.5}.", "0.5", 1),
    (r"First \boxed{12} apples, in all \boxed{18}.", "18", 0),
]


@pytest.fixture(scope="module")
def reward() -> MathReward:
    return MathReward()


def test_known_answer_table(reward):
    assert len(MATH_CASES) >= 40
    got = reward(None, [c for c, _, _ in MATH_CASES], answer=[g for _, g, _ in MATH_CASES])
    wrong = [(c, g, e, v) for (c, g, e), v in zip(MATH_CASES, got) if v != e]
    assert wrong == []
    assert reward.pop_metrics().get("timeouts", 0) == 0


@pytest.mark.parametrize("text, expected", [
    (r"so \boxed{\frac{a}{\frac{b}{c}}} done", r"\frac{a}{\frac{b}{c}}"),  # nested braces
    ("<think>x</think><answer> 42. </answer>", "42"),
    ("<answer>$\\frac12$</answer>", "\\frac12"),
    ("ends with #### 1,234\n", "1,234"),
    ("the answer is -3.5, I think", "-3.5"),
    (r"\boxed{5} and again \boxed{5}", "5"),
    (r"\boxed{3} \boxed{4}", None), ("<answer>3</answer><answer>4</answer>", None),
    (r"\boxed{unclosed", None), ("no numbers", None), ("\\boxed{}" * 500, None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("The answer is \u22125", "-5"),                 # U+2212 minus: not 5
    ("it is .5", ".5"), ("so it is -.5, then", "-.5"),  # a leading point: not 5
    ("Answer: 1 1/2 cups", "1 1/2"),                 # a mixed number: not 1/2
    ("range 10-20", "20"), ("pages 3-4.", "4"),      # a hyphen after a digit or letter is no minus sign
    ("x=-3", "-3"), ("it is (-7)", "-7"), ("the year 2023-2024", "2024"),
])
def test_last_number_fallback_reads_the_whole_number(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("#### Step 1: eggs left\n16 - 3 - 4 = 9\n#### Step 2: money\n9 * 2 = 18\nThe answer is 18.", "18"),
    ("#### Solution\nShe makes $18.", "18"), ("She makes $18.\n#### Final Answer\n18", "18"),
    ("#### Answer\n23 + 41 = 64", "64"), ("#### 1. Eggs left\n9 eggs\n#### 2. Money\nShe makes 18 dollars.", "18"),
    ("#### Solution\nso \\boxed{18}", "18"), ("#### Steps\nso 18\n#### 18", "18"), ("#### $1,080", "$1,080"),
    ("#### \\$18", "\\$18"), ("#### 72.", "72"),
    ("#### 18\n#### 3", None),  # a number after #### is an answer, and two different ones are a hedge
])
def test_markdown_headings_are_not_gsm8k_answers(text, expected):
    assert extract_answer(text) == expected


def test_a_markdown_heading_leaves_no_answer_when_the_fallback_is_off():
    assert extract_answer("#### Solution\nShe makes $18.", last_number_fallback=False) is None


@pytest.mark.parametrize("text, expected", [
    (r"So x = \boxed{\frac{1}{2}}, i.e. \boxed{0.5}.", "0.5"),
    (r"\boxed{18} dollars, that is \boxed{\$18.00}", r"\$18.00"),
    ("<answer>1/2</answer> or rather <answer>0.5</answer>", "0.5"), ("#### 18\n#### 18.00", "18.00"),
    (r"First \boxed{12} apples, so the total is \boxed{18}.", None), (r"\boxed{2} and \boxed{2 \text{ million}}", None),
    (r"\boxed{50} \boxed{0.5} \boxed{50\%}", None),  # 50% matches each, but 50 != 0.5: still a hedge
])
def test_boxes_equal_in_value_are_one_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("pred, gold, expected", [
    ("10 million", "10", False), ("1.5 million", "1.5", False), ("5 thousand", "5", False), ("3 hundred", "3", False),
    ("2 dozen", "2", False), ("2 thirds", "2", False), ("3 quarters", "3", False), ("12 squared", "12", False),
    ("4 cubed", "4", False), ("5 factorial", "5", False), ("50 percent", "50", False), ("$2 million", "2", False),
    (r"2 \text{ million}", "2", False), (r"2\text{ dozen}", "2", False),
    (r"\frac{1}{2} \text{ dozen}", r"\frac12", False),
    (r"\sqrt{4} \text{ million}", "2", False), ("2", r"2 \text{ million}", False),
    ("10 million", r"10 \text{ million}", True),  # the same words
    ("12 cm", "12", True), (r"12 \text{ inches}", "12", True), ("5 dollars", "5", True), (r"30^\circ", "30", True),
    ("12 inches squared", "12", True),  # after a unit, "squared" is the unit's
])
def test_words_that_change_the_value_are_not_units(pred, gold, expected):
    assert compare_answers([(pred, gold)])[0][0] is expected


@pytest.mark.parametrize("pred, gold, expected", [
    ("0", r"\frac{1}{2000000}", False), (r"\frac{1}{3}", r"\frac{333333}{1000000}", False),
    ("0.000067", ".0000672", False), ("0.0000668", ".0000672", False), ("1.0000001", "1", False),
    ("0.0000672", r"\frac{21}{312500}", True),
    # an endless expansion (1/3, 2/3, 1/7) matches a decimal of 6 or more places at the decimal's own precision
    ("0.333333", r"\frac{1}{3}", True), (r"\frac{1}{3}", "0.333333", True), ("0.3333333333", r"\frac{1}{3}", True),
    ("0.666667", r"\frac{2}{3}", True), ("0.142857", r"\frac{1}{7}", True), (r"33.3333\%", r"\frac{1}{3}", True),
    ("0.3333334", r"\frac{1}{3}", False), ("0.666666", r"\frac{2}{3}", False), ("0.33", r"\frac{1}{3}", False),
    (r"\frac{1}{3}", "0.333", False), ("0", r"\frac{1}{3000000}", False), (r"\frac{1}{7}", r"\frac{1}{3}", False),
])
def test_exact_values_are_compared_exactly(pred, gold, expected):
    assert fast_verdict(pred, gold) is expected


@pytest.mark.parametrize("pred, gold, expected", [
    ("2 3", "23", False), ("1 2", "12", False), ("2, 100", "2,100", False),  # spaces between numbers matter
    ("x + 1", "x+1", True), ("(1, 2)", "(1,2)", True), (r"2 \pi", r"2\pi", True),
    (r"\frac {1} {2}", r"\frac{1}{2}", True),
    (r"1\,000", "1000", True), (r"11,\! 111,\! 100", "11111100", True),  # LaTeX spacing between digit groups
])
def test_spaces_are_dropped_only_where_they_cannot_matter(pred, gold, expected):
    assert (fast_verdict(pred, gold) is True) is expected  # "not equal" may be False or left to math-verify (None)
    assert compare_answers([(pred, gold)])[0][0] is expected


def test_last_number_fallback_can_be_switched_off():
    assert extract_answer("it is 12", last_number_fallback=False) is None
    reward = MathReward(last_number_fallback=False)
    assert reward(None, ["it is 12", r"\boxed{12}"], answer=["12", "12"]) == [0.0, 1.0]


def test_chat_completions_and_extra_kwargs(reward):
    out = reward([[{"role": "user", "content": "q"}]], [[{"role": "assistant", "content": r"\boxed{7}"}]],
                 answer=["7"], completion_ids=[[1, 2]], trainer_state=None)
    assert out == [1.0]


def test_numeric_comparisons_never_touch_the_pool(monkeypatch):
    def no_pool(*args, **kwargs):
        raise AssertionError("numeric comparison went to the pool")
    monkeypatch.setattr("aha.rewards.maths.symbolic_pool", no_pool)
    pairs = [("42", "42.0"), ("1,000", "1000"), ("$1,000.00", "1000"), ("50%", "0.5"), ("3/4", "0.75"),
             ("\\frac{1}{3}", "0.333333"), ("12 cm", "12"), ("7", "8")]
    assert [v for v, _ in compare_answers(pairs)] == [True] * 7 + [False]
    assert fast_verdict("12345678901234567890", "12345678901234567891") is False  # exact, not float


def test_unparseable_gold_is_a_data_error_not_a_reward(reward):
    assert gold_answer(None) is None and gold_answer("  ") is None
    out = reward(None, ["\\boxed{5}", "\\boxed{5}", "\\boxed{5}"], answer=[None, "\\frac{1}{", "5"])
    assert out == [None, None, 1.0]
    assert reward.pop_metrics()["data_errors"] == 2
    assert answers_equal("5", "\\frac{1}{") is None


@pytest.mark.parametrize("name, completion, expected", [
    ("exponent tower", r"\boxed{2^{10^{10}}}", None),      # too large to evaluate: set aside, not judged
    ("huge factorial", r"\boxed{(10^{10})!}", None),
    ("9999!", r"\boxed{9999!}", 0.0),
    ("10 MB string", "7" * 10_000_000, 0.0),
    ("10 MB of answer tags", "<answer>" * 1_250_000, 0.0),
    ("10 MB box", "\\boxed{" + "{" * 10_000_000, 0.0),
    ("1000 nested fractions", "\\boxed{" + "\\frac{1}{" * 1000 + "2" + "}" * 1000 + "}", 0.0),
    # about a second of sympy work: wrong, or not decided within the limit; never right
    ("deep nesting within the length cap", "\\boxed{" + "\\sqrt{" * 100 + "2" + "}" * 100 + "}", (0.0, None)),
    ("500 boxes", "\\boxed{}" * 500, 0.0),
])
def test_hostile_math_is_judged_within_the_limit(name, completion, expected):
    reward = MathReward(timeout_s=1.0)
    reward(None, ["\\boxed{\\sqrt{4}}"], answer=["2"])  # a warm pool: start-up is not the thing measured
    start = time.monotonic()
    (got,) = reward(None, [completion], answer=["5"])
    assert got in (expected if isinstance(expected, tuple) else (expected,)), got
    assert time.monotonic() - start < 1.0 + 1.5, name
    counts = reward.pop_metrics()
    assert got is not None or counts["too_large"] + counts["timeouts"] == 1, counts


def test_timeouts_are_excluded_and_counted_and_the_pool_recovers():
    reward = MathReward(timeout_s=1.0, max_exponent_digits=None)  # towers reach the pool and hit the limit
    out = reward(None, [r"\boxed{2^{10^{10}}}", r"\boxed{\sqrt{9}}", r"\boxed{10^{10^{10}}}"], answer=["5", "3", "7"])
    assert out == [None, 1.0, None]  # not decided is not wrong
    assert reward.pop_metrics()["timeouts"] == 2
    assert reward(None, [r"\boxed{\sqrt{16}}"], answer=["4"]) == [1.0]  # killed workers were replaced


def test_a_call_budget_leaves_items_unjudged_never_wrong():
    MathReward()(None, ["\\boxed{\\sqrt{4}}"], answer=["2"])  # a warm pool
    reward = MathReward(timeout_s=1.0, batch_timeout_s=1.5, max_exponent_digits=None)
    start = time.monotonic()
    towers = [rf"\boxed{{{k}^{{10^{{10}}}}}}" for k in range(2, 10)]
    out = reward(None, towers + [r"\boxed{\sqrt{4}}"], answer=["5"] * 8 + ["2"])
    assert out[:8] == [None] * 8 and time.monotonic() - start < 3.0
    counts = reward.pop_metrics()
    assert out[8] in (1.0, None)  # the correct answer is right or unjudged, never 0.0
    assert counts["timeouts"] + counts["unjudged"] == 8 + (out[8] is None) and counts["unjudged"] >= 1


def test_correct_symbolic_answers_survive_a_batch_full_of_slow_ones():
    """Per-item limits: however many comparisons time out, every correct answer in the batch scores 1.0."""
    reward = MathReward(timeout_s=1.0, max_exponent_digits=None)
    right = [(r"\boxed{\frac{1}{2}}", "0.5"), (r"\boxed{2\sqrt{2}}", r"\sqrt{8}"), (r"\boxed{\sqrt{9}}", "3")] * 2
    bombs = [(rf"\boxed{{{k}^{{10^{{10}}}}}}", "5") for k in range(2, 6)]
    pairs = bombs[:2] + right[:3] + bombs[2:] + right[3:]
    out = reward(None, [c for c, _ in pairs], answer=[g for _, g in pairs])
    assert [v for v, (c, _) in zip(out, pairs) if (c, _) in right] == [1.0] * 6
    assert [v for v, p in zip(out, pairs) if p in bombs] == [None] * 4
    counts = reward.pop_metrics()
    assert counts["timeouts"] == 4 and counts["unjudged"] == 0


def test_pool_recovers_when_a_worker_is_killed_from_outside():
    import os
    import signal
    pool = symbolic_pool()
    limit = 30.0  # generous: this checks recovery, not speed, and a loaded machine forks slowly
    assert pool.map([{"pred": "1", "gold": "1"}], limit)[0][0] == "ok"
    for w in list(pool._workers):
        os.kill(w.pid, signal.SIGKILL)
    assert pool.map([{"pred": r"\sqrt{4}", "gold": "2"}], limit) == [("ok", {"gold_ok": True, "equal": True})]


def test_a_call_cut_by_reward_timeout_leaves_no_task_for_the_next_call():
    """reward_timeout interrupts MathReward mid-map; the next, shorter call must not see the cut call's tasks."""
    from aha.rewards import score_completions
    reward = MathReward(timeout_s=2.0, max_exponent_digits=None)  # towers reach the pool and run until cut
    reward(None, ["\\boxed{\\sqrt{4}}"], answer=["2"])  # a warm pool: the cut lands mid-map, not mid-start
    towers = [rf"\boxed{{{k}^{{10^{{10}}}}}}" for k in range(2, 10)]
    _, metrics = score_completions([reward], ["q"] * 8, towers, {"answer": ["5"] * 8}, timeout_s=0.3)
    assert metrics["reward/call_timeouts"] == 1.0
    rewards, metrics = score_completions([reward], ["q"], [r"\boxed{\sqrt{4}}"], {"answer": ["2"]}, timeout_s=30.0)
    assert rewards[:, 0].tolist() == [1.0] and metrics["reward/errors"] == 0.0


def test_workers_run_under_the_memory_cap():
    pool = symbolic_pool(memory_mb=512)
    assert pool.map([{"pred": "2", "gold": "2"}], 30.0)[0][0] == "ok"
    worker = next(w for w in pool._workers if w.ready)
    limits = open(f"/proc/{worker.pid}/limits").read()
    line = next(row for row in limits.splitlines() if row.startswith("Max address space"))
    assert line.split()[3] == str(512 << 20)
    pool.close()
