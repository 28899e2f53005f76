"""Benchmark loaders, the JSONL task, prompt templates, and the verifiers against the gold data."""

from __future__ import annotations

import json
import os

import pytest

from aha.data import is_conversational
from aha.tasks.benchmarks import DATA_ENV, data_path, gsm8k_gold, gsm8k_reasoning, gsm8k_shots, jsonl_task
from aha.data.prompts import R1_SYSTEM, PromptTemplate, get_template
from aha.tasks import get_task

try:
    import aha.rewards  # noqa: F401
    REWARDS_SKIP = None
except ImportError as e:
    REWARDS_SKIP = f"aha.rewards is not importable yet ({e})"
needs_rewards = pytest.mark.skipif(REWARDS_SKIP is not None, reason=REWARDS_SKIP or "")


@pytest.fixture(scope="module")
def gsm8k_test():
    return get_task("gsm8k").load("test")


def score(verifier, rows: list[dict], texts: list[str]) -> list[float]:
    """The verifier called as a trainer calls it: chat completions for chat prompts, columns as kwargs."""
    prompts = [r["prompt"] for r in rows]
    comps = [[{"role": "assistant", "content": t}] for t in texts] if is_conversational(prompts[0]) else texts
    cols = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    return list(verifier(prompts=prompts, completions=comps, **cols))


def misses(rows, values) -> list[tuple]:
    return [(r["id"], r["answer"] if "answer" in r else None, v) for r, v in zip(rows, values) if v != 1.0]


# ---- loaders ----

@pytest.mark.parametrize("name,split,count", [("gsm8k", "train", 7473), ("gsm8k", "test", 1319),
                                              ("math500", "test", 500), ("humaneval", "test", 164)])
def test_row_counts(name, split, count):
    rows = get_task(name).load(split)
    assert len(rows) == count
    assert len({r["id"] for r in rows}) == count  # ids are unique
    assert all("prompt" in r for r in rows)


def test_unknown_split_and_subset():
    with pytest.raises(ValueError, match="valid: \\['test'\\]"):
        get_task("math500").load("train")
    a, b = get_task("gsm8k").load("test", n=10, seed=1), get_task("gsm8k").load("test", n=10, seed=1)
    assert [r["id"] for r in a] == [r["id"] for r in b] and len(a) == 10
    with pytest.raises(ValueError, match="asked for 5000 rows"):
        get_task("gsm8k").load("test", n=5000)


def test_gsm8k_gold(gsm8k_test):
    assert gsm8k_gold("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72") == "72"
    assert gsm8k_gold("...\n#### 1,450,000") == "1450000"
    with pytest.raises(ValueError, match="no '#### answer' line"):
        gsm8k_gold("no answer here")
    by_id = {r["id"]: r for r in gsm8k_test}
    assert [by_id[f"test/{i}"]["answer"] for i in (0, 1, 2, 146)] == ["18", "3", "70000", "2125"]
    train = {r["id"]: r["answer"] for r in get_task("gsm8k").load("train")}
    assert (train["train/0"], train["train/5715"]) == ("72", "-7")
    row = by_id["test/0"]
    assert row["solution"].endswith("#### 18") and row["question"].startswith("Janet")
    assert gsm8k_reasoning(row["solution"]) == ("Janet sells 16 - 3 - 4 = 9 duck eggs a day.\n"
                                                "She makes 9 * 2 = $18 every day at the farmer\u2019s market.")
    assert row["completion"] == f"<think>\n{gsm8k_reasoning(row['solution'])}\n</think>\n<answer>18</answer>"
    assert row["prompt"] == [{"role": "system", "content": R1_SYSTEM}, {"role": "user", "content": row["question"]}]


def test_math500_and_humaneval_columns():
    m = get_task("math500").load("test")[0]
    assert (m["id"], m["answer"], m["subject"]) == ("test/precalculus/807.json", "\\left( 3, \\frac{\\pi}{2} \\right)",
                                                     "precalculus")
    h = get_task("humaneval").load("test")[0]
    assert (h["id"], h["entry_point"]) == ("HumanEval/0", "has_close_elements")
    assert "def check(candidate)" in h["tests"] and h["code_prompt"].startswith("from typing import List")
    assert h["prompt"][-1]["role"] == "user" and h["code_prompt"].rstrip() in h["prompt"][-1]["content"]


def test_missing_data_file_names_path_and_env(monkeypatch, tmp_path):
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/gsm8k/test.jsonl.*{DATA_ENV}"):
        get_task("gsm8k").load("test")
    (tmp_path / "math500").mkdir()
    (tmp_path / "math500" / "test.json").write_text(json.dumps(
        [{"problem": "1+1?", "answer": "2", "difficulty": 1.0, "unique_id": "test/algebra/1.json"}]))
    assert data_path("math500", "test.json") == tmp_path / "math500" / "test.json"
    assert get_task("math500").load("test")[0]["answer"] == "2"


# ---- generic JSONL task ----

def test_jsonl_task_maps_columns(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"q": "What is 2+3?", "gold": 5, "src": "x"}) + "\n"
                    + json.dumps({"q": [{"role": "user", "content": "1+1?"}], "gold": "2", "src": "y"}) + "\n")
    task = jsonl_task(path, prompt_column="q", answer_column="gold", template="plain", name="qa")
    rows = task.load("train")
    assert task.name == "qa" and len(rows) == 2
    assert rows[0]["prompt"] == [{"role": "user", "content": "What is 2+3?"}]
    assert rows[1]["prompt"] == [{"role": "user", "content": "1+1?"}]  # chat prompts kept as they are
    assert [r["answer"] for r in rows] == ["5", "2"] and [r["id"] for r in rows] == [0, 1]
    assert rows[0]["src"] == "x"
    via_name = get_task(f"jsonl:{path}")
    assert via_name.name == f"jsonl:{path}"
    with pytest.raises(ValueError, match="no column 'prompt'"):
        via_name.load("train")  # default column names do not exist in this file
    mapped = get_task(f"jsonl:{path}@plain?prompt=q&answer=gold")  # the same mapping from a task name
    assert [(r["prompt"], r["answer"]) for r in mapped.load("train")] == [(r["prompt"], r["answer"]) for r in rows]
    with pytest.raises(ValueError, match=r"unknown option 'answer_col' .*valid: \['answer', 'prompt', 'reward'\]"):
        get_task(f"jsonl:{path}?answer_col=gold")
    with pytest.raises(ValueError, match="row 0 has no column 'question'"):
        get_task(f"jsonl:{path}?prompt=question&answer=gold").load("train")


def test_jsonl_task_split_files(tmp_path):
    for split, q in (("train", "a"), ("test", "b")):
        (tmp_path / f"{split}.jsonl").write_text(json.dumps({"prompt": q, "answer": "1"}) + "\n")
    task = get_task(f"jsonl:{tmp_path}/{{split}}.jsonl")
    assert task.load("test")[0]["prompt"][-1]["content"] == "b"
    assert task.load("train")[0]["prompt"][-1]["content"] == "a"


def test_jsonl_missing_column_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n")
    task = jsonl_task(path, prompt_column="problem")
    with pytest.raises(ValueError) as e:
        task.load("train")
    msg = str(e.value)
    assert "'problem'" in msg and str(path) in msg and "['answer', 'question']" in msg
    with pytest.raises(ValueError, match="unknown reward 'nope'; valid: \\['code', 'math'\\]"):
        jsonl_task(path, reward="nope")
    with pytest.raises(FileNotFoundError):
        get_task(f"jsonl:{tmp_path}/absent.jsonl").load("train")


def test_resolve_task_names(tmp_path):
    assert get_task("gsm8k") is get_task("gsm8k")
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        get_task("nope")
    boxed = get_task("gsm8k@boxed_base")
    row = boxed.load("test", n=1)[0]
    assert boxed.name == "gsm8k@boxed_base" and boxed.reward_weights == [1.0]  # no tags asked for: no format reward
    assert row["prompt"].startswith("User: ") and row["prompt"].endswith("\\boxed{}.\nAssistant:")
    assert row["completion"].endswith(f"$\\boxed{{{row['answer']}}}$.")
    with pytest.raises(ValueError, match="unknown prompt template 'nope'"):
        get_task("math500@nope")
    path = tmp_path / "a@b.jsonl"
    path.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    assert get_task(f"jsonl:{path}").load("test")[0]["prompt"][0]["content"] == R1_SYSTEM
    assert get_task(f"jsonl:{path}@plain_base").load("test")[0]["prompt"] == "User: 1+1?\nAssistant:"


# ---- prompt templates ----

def test_r1_one_shot_chat_prompt():
    tpl = get_template("r1", shots=[("What is 1+1?", "<think>\n1+1=2\n</think>\n<answer>2</answer>")])
    assert tpl("What is 2+3?") == [
        {"role": "system", "content": R1_SYSTEM},
        {"role": "user", "content": "What is 1+1?"},
        {"role": "assistant", "content": "<think>\n1+1=2\n</think>\n<answer>2</answer>"},
        {"role": "user", "content": "What is 2+3?"},
    ]
    shots = gsm8k_shots(2, seed=0, template="boxed")
    assert len(shots) == 2 and all(a.endswith("}$.") for _, a in shots)
    assert len(get_template("boxed", shots=shots)("Q?")) == 5  # 2 x (user, assistant) + the question
    assert R1_SYSTEM.endswith("i.e., <think> reasoning process here </think> <answer> answer here </answer>.")


def test_plain_string_prompts():
    assert get_template("plain", chat=False)("What is 2+3?") == "User: What is 2+3?\nAssistant:"
    boxed = get_template("boxed", chat=False, shots=[("1+1?", "1+1=2\nThe final answer is $\\boxed{2}$.")])
    assert boxed("2+3?") == ("User: 1+1?\n\nPlease reason step by step, and put your final answer within \\boxed{}.\n"
                             "Assistant: 1+1=2\nThe final answer is $\\boxed{2}$.\n\n"
                             "User: 2+3?\n\nPlease reason step by step, and put your final answer within \\boxed{}.\n"
                             "Assistant:")
    r1 = get_template("r1", chat=False)
    assert r1("2+3?") == f"{R1_SYSTEM}\n\nUser: 2+3?\nAssistant:"


def test_template_registry_and_answers():
    with pytest.raises(ValueError) as e:
        get_template("nope")
    assert str(e.value) == ("unknown prompt template 'nope'; valid: "
                            "['boxed', 'boxed_base', 'plain', 'plain_base', 'r1', 'r1_base']")
    with pytest.raises(ValueError, match="unknown answer style"):
        PromptTemplate(style="nope")
    assert get_template("r1").answer("2+2=4", "4") == "<think>\n2+2=4\n</think>\n<answer>4</answer>"
    assert get_template("boxed").answer("2+2=4", "4") == "2+2=4\nThe final answer is $\\boxed{4}$."
    assert get_template("plain").answer("2+2=4", "4") == "2+2=4\n#### 4"


# ---- the verifiers agree with the gold data ----

@needs_rewards
def test_gsm8k_reference_solutions_score_full(gsm8k_test):
    correct = get_task("gsm8k").correct()
    assert misses(gsm8k_test, score(correct, gsm8k_test, [r["solution"] for r in gsm8k_test])) == []
    assert misses(gsm8k_test, score(correct, gsm8k_test, [r["completion"] for r in gsm8k_test])) == []


@needs_rewards
def test_gsm8k_r1_completions_earn_format_reward(gsm8k_test):
    task, rows = get_task("gsm8k"), gsm8k_test[:20]
    fns = task.rewards()
    assert len(fns) == len(task.reward_weights) == 2
    for fn in fns:
        assert score(fn, rows, [r["completion"] for r in rows]) == [1.0] * len(rows)


@needs_rewards
def test_math500_boxed_gold_scores_full():
    rows = get_task("math500").load("test")
    boxed = [f"The final answer is $\\boxed{{{r['answer']}}}$." for r in rows]
    values = score(get_task("math500").correct(), rows, boxed)
    assert misses(rows, values) == []


@needs_rewards
def test_math500_rejects_a_wrong_answer():
    rows = get_task("math500").load("test")[:3]  # golds: (3, pi/2), p - q, 14/3
    wrong = ["\\boxed{\\left( 3, \\pi \\right)}", "\\boxed{p + q}", "\\boxed{\\frac{14}{5}}"]
    assert score(get_task("math500").correct(), rows, wrong) == [0.0, 0.0, 0.0]


HUMANEVAL_SAMPLE = 20
"""Each sandboxed run costs ~0.3 s (2 workers here): all 164 take ~35 s, so the default run checks a sample;
AHA_FULL_BENCHMARK_TESTS=1 checks them all."""


@needs_rewards
@pytest.mark.parametrize("n", [HUMANEVAL_SAMPLE, pytest.param(None, marks=[pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("AHA_FULL_BENCHMARK_TESTS"), reason="all 164 take ~35 s: set AHA_FULL_BENCHMARK_TESTS=1")])])
def test_humaneval_canonical_bodies_pass(n):
    task = get_task("humaneval")
    rows = task.load("test", n=n, seed=0)
    assert misses(rows, score(task.correct(), rows, [r["solution"] for r in rows])) == []


@needs_rewards
def test_humaneval_whole_functions_pass_and_wrong_ones_fail():
    task = get_task("humaneval")
    rows = task.load("test", n=4, seed=1)
    whole = [f"Here it is:\n```python\n{r['code_prompt']}{r['solution']}```" for r in rows]
    assert misses(rows, score(task.correct(), rows, whole)) == []
    broken = [f"```python\n{r['code_prompt']}    return None\n```" for r in rows]
    assert score(task.correct(), rows, broken) == [0.0] * len(rows)
    fraction = task.rewards()[0]  # training reward: the fraction of asserts passed
    assert score(fraction, rows, [r["solution"] for r in rows]) == [1.0] * len(rows)
    assert all(v < 1.0 for v in score(fraction, rows, ["    return None"] * len(rows)))


HUMANEVAL_WITH_HELPERS = {"HumanEval/10": "is_palindrome", "HumanEval/32": "poly", "HumanEval/38": "encode_cyclic",
                          "HumanEval/50": "encode_shift"}
"""Prompts that define a helper before the function asked for; the tests or the canonical solution call it."""


def entry_function_only(row: dict) -> str:
    """A reply with just the function asked for: the prompt from its `def <entry_point>(` on, plus the body."""
    code = row["code_prompt"]
    start = code.rindex(f"def {row['entry_point']}(")
    return f"```python\n{code[start:]}{row['solution']}```"


@needs_rewards
def test_humaneval_reply_with_only_the_asked_function_gets_the_prompts_helpers():
    """The official harness runs prompt + completion + tests in one namespace, so the prompt's imports and helpers
    exist even when the reply is just the function asked for; and the reply's own definitions still win."""
    task = get_task("humaneval")
    rows = [r for r in task.load("test") if r["id"] in HUMANEVAL_WITH_HELPERS]
    replies = [entry_function_only(r) for r in rows]
    assert len(rows) == 4 and all(f"def {HUMANEVAL_WITH_HELPERS[r['id']]}" not in t for r, t in zip(rows, replies))
    assert misses(rows, score(task.correct(), rows, replies)) == []
    assert misses(rows, score(task.rewards()[0], rows, replies)) == []
    # HumanEval/10's solution calls is_palindrome: the reply's own (wrong) one replaces the prompt's
    row = next(r for r in rows if r["id"] == "HumanEval/10")
    own = "```python\ndef is_palindrome(string):\n    return False\n\n\n" + entry_function_only(row)[10:]
    assert score(task.correct(), [row], [own]) == [0.0]
    # but the tests call the prompt's helpers, not the reply's: an identity encode_cyclic, or a poly that
    # is always 0, would otherwise pass HumanEval/38 and /32 without solving them
    by_id = {r["id"]: r for r in rows}
    hacks = {"HumanEval/38": "def encode_cyclic(s):\n    return s\n\n\ndef decode_cyclic(s):\n    return s\n",
             "HumanEval/32": "def poly(xs, x):\n    return 0\n\n\ndef find_zero(xs):\n    return 0.0\n"}
    hacked = [by_id[k] for k in hacks]
    assert score(task.correct(), hacked, [f"```python\n{hacks[r['id']]}```" for r in hacked]) == [0.0, 0.0]


@needs_rewards
def test_math500_plain_template_reads_the_final_number_as_jsonl_does():
    """The plain templates ask for no answer format, so the final number counts (as in jsonl_task and gsm8k);
    templates that ask for a format stay strict."""
    for name, expect in (("math500@plain", 1.0), ("math500@plain_base", 1.0), ("math500", 0.0),
                         ("math500@boxed", 0.0)):
        task = get_task(name)
        row = task.load("test")[2]  # gold 14/3
        assert row["answer"] == "\\frac{14}{3}"
        text = "Dividing, the result is 14/3."
        assert score(task.correct(), [row], [text]) == [expect], name
        assert score(task.rewards()[0], [row], [text]) == [expect], name
        assert score(task.correct(), [row], ["\\boxed{\\frac{14}{3}}"]) == [1.0], name


def test_jsonl_correctness_agrees_with_the_training_reward(tmp_path):
    """A plain template asks for no answer format, so the final number counts in evaluation as in training;
    an r1 template asks for <answer>, and a bare number there is not an answer, in both."""
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "27 + 12?", "answer": "39"}) + "\n")
    for template, expect in (("plain", 1.0), ("r1", 0.0)):
        task = get_task(f"jsonl:{path}@{template}?prompt=question")
        correct, trained = task.correct(), task.rewards()[0]
        assert correct(None, ["27 + 12 = 39"], answer=["39"]) == [expect], template
        assert trained(None, ["27 + 12 = 39"], answer=["39"]) == [expect], template
        assert task.asks_format == (template == "r1")


def _chat_rows_file(path, golds=("50", "84")):
    """A JSONL file whose prompts are chat messages, as an instruct model's evaluation set is written."""
    questions = ["What is 10 times 5? Answer with just the number.", "What is 12 times 7? Answer with just the number."]
    path.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": q}], "answer": g}) + "\n"
                            for q, g in zip(questions, golds)))
    return path


@needs_rewards
@pytest.mark.parametrize("template", ["", "@r1", "@r1_base", "@boxed"])
def test_jsonl_chat_prompts_ask_for_no_format_so_the_final_number_counts(tmp_path, template):
    """No template wraps chat-message prompts, so they ask for no answer format: "10 * 5 = 50" is right for gold 50
    in evaluation and in training (one reward, no format reward, no next-turn cut), whatever template the name
    gives (r1 by default); a string prompt that r1 wraps still asks for <answer> and is read strictly."""
    task = get_task(f"jsonl:{_chat_rows_file(tmp_path / 'chat.jsonl')}{template}")
    rows = task.load("test")
    assert rows[0]["prompt"] == [{"role": "user", "content": "What is 10 times 5? Answer with just the number."}]
    replies = ["10 * 5 = 50", "12 times 7 is 84."]
    assert score(task.correct(), rows, replies) == [1.0, 1.0], template
    assert [score(fn, rows, replies) for fn in task.rewards()] == [[1.0, 1.0]], template
    assert task.reward_weights == [1.0] and not task.asks_format and task.stop == ()
    (tmp_path / "str.jsonl").write_text(json.dumps({"prompt": "What is 10 times 5?", "answer": "50"}) + "\n")
    strict = get_task(f"jsonl:{tmp_path / 'str.jsonl'}{template}")
    assert score(strict.correct(), strict.load("test"), ["10 * 5 = 50"]) == [0.0] and strict.asks_format == (
        template in ("", "@r1", "@r1_base"))


def test_jsonl_mixing_chat_and_string_prompts_under_a_format_template_is_a_data_error(tmp_path):
    """r1 wraps the string prompts (asks for <answer>) but not the chat ones (asks for nothing): no one verifier
    scores both right, so the task says so; under a plain template both ask for nothing."""
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps({"prompt": "What is 2+3?", "answer": "5"}) + "\n"
                    + json.dumps({"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match="some prompts are chat messages.*and some are strings.*'r1'"):
        get_task(f"jsonl:{path}")
    assert len(get_task(f"jsonl:{path}@plain").load("train")) == 2
