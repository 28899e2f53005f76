"""pass@k / maj@k arithmetic and `aha eval` end to end."""

import itertools
import json
from math import comb

import pytest

from aha.cli import main
from aha.config import EvalConfig
from aha.eval import majority_correct, pass_at_k
from aha.stats import wilson


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)       # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)      # pass@1 is the plain success rate
    with pytest.raises(ValueError, match="pass@6 needs at least 6 samples"):
        pass_at_k(5, 1, 6)


def test_pass_at_k_matches_brute_force_enumeration():
    for n, c, k in itertools.product(range(1, 7), range(0, 7), range(1, 7)):
        if c > n or k > n:
            continue
        right = [True] * c + [False] * (n - c)
        subsets = list(itertools.combinations(range(n), k))
        brute = sum(any(right[i] for i in s) for s in subsets) / comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_majority_vote():
    assert majority_correct(["3", "4", "3", None], [True, False, True, False]) is True
    assert majority_correct(["4", "3", "4", "3"], [False, True, False, True]) is False  # tie: first seen wins
    assert majority_correct([None, None], [True, True]) is False


def test_eval_bad_input(tmp_path, capsys):
    assert main(["eval", str(tmp_path), "--task", "arithmetic"]) == 2
    assert "is a directory but not a model directory (it has no config.json)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="k=8 is larger than n_samples=4"):
        EvalConfig(model="x", k=[1, 8], n_samples=4)
    with pytest.raises(ValueError, match=r"k=\[1, 8\] needs sampled completions: set n_samples >= 8"):
        EvalConfig(model="x", k=[1, 8])  # without n_samples the k would be silently ignored


def test_eval_unknown_task(tiny_dir, capsys):
    assert main(["eval", tiny_dir, "--task", "arithmetik"]) == 2
    assert "unknown task 'arithmetik'" in capsys.readouterr().err


def test_eval_end_to_end_writes_results(tiny_dir, tmp_path):
    out = tmp_path / "ev"
    assert main(["eval", tiny_dir, "--task", "arithmetic", "--num_problems", "6", "--n_samples", "4",
                 "k=[1,4]", f"output_dir={out}", "progress_bar=false"]) == 0
    res = json.loads((out / "results.json").read_text())["summary"]
    for key in ("accuracy", "format_frac", "len_mean", "pass@1", "pass@4", "maj@4"):
        assert 0.0 <= res[key] <= 48.0, key
    assert res["num_problems"] == 6 and res["pass@4"] >= res["pass@1"]
    rows = [json.loads(line) for line in (out / "per_problem.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all("samples_correct" in r for r in rows)
    assert (out / "results.md").read_text().startswith("### arithmetic")
    # intervals: Wilson for the greedy accuracy, from the per-problem results; bootstrap brackets pass@k
    right = sum(r["greedy_correct"] for r in rows)
    assert res["accuracy"] == right / 6 and res["accuracy_ci95"] == list(wilson(right, 6))
    for key in ("pass@1", "pass@4"):
        lo, hi = res[f"{key}_ci95"]
        assert 0.0 <= lo <= res[key] <= hi <= 1.0, key


def test_eval_on_gsm8k_with_a_tiny_random_model(tiny_dir, tmp_path):
    """The benchmark path end to end: real GSM8K rows, a random model, accuracy near 0 expected."""
    out = tmp_path / "gsm"
    assert main(["eval", tiny_dir, "--task", "gsm8k", "--num_problems", "4", "--max_new_tokens", "16",
                 f"output_dir={out}", "progress_bar=false"]) == 0
    res = json.loads((out / "results.json").read_text())["summary"]
    assert res["task"] == "gsm8k" and res["num_problems"] == 4 and 0.0 <= res["accuracy"] <= 0.25
    ids = [json.loads(line)["id"] for line in (out / "per_problem.jsonl").read_text().splitlines()]
    assert len(set(ids)) == 4


def test_eval_reports_format_only_where_asked_and_records_the_prompt_as_sent(tiny_dir, tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": f"{a}+1", "answer": str(a + 1)}) + "\n" for a in range(3)))
    out = tmp_path / "ev"
    assert main(["eval", tiny_dir, "--task", f"jsonl:{path}@plain_base?prompt=question", f"output_dir={out}",
                 "progress_bar=false"]) == 0
    res = json.loads((out / "results.json").read_text())["summary"]
    assert "format_frac" not in res and res["num_problems"] == 3
    rows = [json.loads(line) for line in (out / "per_problem.jsonl").read_text().splitlines()]
    assert rows[0]["prompt"].endswith("0+1\nAssistant:") and "User: 0+1" in rows[0]["prompt"]


def test_eval_takes_threads_and_help_does_not_import_torch(tiny_dir, tmp_path):
    import subprocess
    import sys
    assert main(["eval", tiny_dir, "--task", "arithmetic", "--num_problems", "2", "threads=1",
                 "progress_bar=false"]) == 0
    probe = "import sys; from aha.cli import main; main(['--help']); print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False False"  # `aha --help` loads no ML library: it is instant


def test_a_mixture_reports_each_part_accuracy(tiny_dir):
    """Part "a" asks for answers the verifier always accepts, part "b" for ones it never does."""
    from aha.eval import evaluate, make_eval_fn
    from aha.models import load_model, load_tokenizer
    from aha.tasks.base import Task, mixture

    def verifier(prompts, completions, answer, **kw):
        return [1.0 if a == "yes" else 0.0 for a in answer]

    def part(name, answer, size):
        return Task(name=name, rewards=lambda: [verifier], correct=lambda: verifier, max_completion_length=4,
                    load=lambda split, n=None, seed=0: [
                        {"prompt": f"3+{i}=", "answer": answer, "id": f"{split}/{i}"} for i in range(size)])
    mix = mixture([part("a", "yes", 3), part("b", "no", 5)])
    rows = mix.load("test")
    model, tok = load_model(tiny_dir, "float32"), load_tokenizer(tiny_dir)
    summary, records = evaluate(model, tok, mix, rows)
    assert [r["id"] for r in records] == ["a:test/0", "b:test/0", "a:test/1", "b:test/1", "a:test/2", "b:test/2"]
    assert summary["accuracy/a"] == 1.0 and summary["accuracy/b"] == 0.0 and summary["accuracy"] == 0.5
    metrics = make_eval_fn(mix, rows)(model, tok)
    assert metrics["accuracy/a"] == 1.0 and metrics["accuracy/b"] == 0.0 and metrics["accuracy"] == 0.5


def test_evaluation_decodes_all_prompts_in_one_call_through_a_small_batch(tiny_dir, monkeypatch):
    """batch_size=4 with 3 samples of 6 prompts: one generate call for the sampled pass (the engine keeps at most 4
    rows in flight and starts the others as rows finish), whose 18 completions reach the 6 records in order."""
    from aha.eval import evaluate
    from aha.models import load_model, load_tokenizer
    from aha.rollout import HFEngine
    from aha.tasks.base import Task

    def verifier(prompts, completions, answer, **kw):
        return [1.0 if c.startswith(a) else 0.0 for c, a in zip(completions, answer)]

    calls, generate = [], HFEngine.generate
    monkeypatch.setattr(HFEngine, "generate", lambda self, ids, n, *a, **kw: calls.append(
        (len(ids), n, self.max_batch)) or generate(self, ids, n, *a, **kw))
    task = Task(name="t", rewards=lambda: [verifier], correct=lambda: verifier, max_completion_length=6,
                load=lambda split, n=None, seed=0: [{"prompt": f"{i}+1=", "answer": "", "id": str(i)} for i in range(6)])
    model, tok = load_model(tiny_dir, "float32"), load_tokenizer(tiny_dir)
    summary, records = evaluate(model, tok, task, task.load("test"), k=[1, 3], n_samples=3, batch_size=4)
    assert calls == [(6, 1, 4), (6, 3, 4)]  # the greedy pass, then the sampled one
    assert [r["id"] for r in records] == [str(i) for i in range(6)]
    assert summary["accuracy"] == 1.0 and summary["pass@3"] == 1.0  # the empty answer accepts every completion


# ---- maj@k votes on equal answers; undecided verdicts are counted; base-model turns are cut ----

class _Chars:
    """A tokenizer stand-in for plain-string prompts: one id per character."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids):
        return "".join(map(chr, ids))


def _canned(monkeypatch, greedy: list[str], samples: list[list[str]] = ()):
    """evaluate() reads these completions instead of a model's: greedy[i] for row i, samples[i] its n (>= 2)."""
    import aha.eval

    def generate(model, tokenizer, task, rows, n, params, *args):
        texts = list(greedy) if n == 1 else [t for row in samples for t in row]
        assert len(texts) == len(rows) * n
        return aha.eval.Generated(texts, [len(t) for t in texts])
    monkeypatch.setattr(aha.eval, "generate", generate)


def test_majority_vote_groups_equal_answers_and_takes_the_winners_verdict():
    """The review's cases, checked by hand: votes go to classes of equal answers (the verifier's fast comparison),
    and the verdict is the winning class's, whatever order the samples came in."""
    assert majority_correct(["\\frac{1}{2}", "0.5", "1/2", "3", "3"], [True, True, True, False, False]) is True
    assert majority_correct(["$18", "18.00", "18 dollars", "20", "20"], [True, True, True, False, False]) is True
    assert majority_correct(["3", "7", "7.0"], [True, False, False]) is False  # 7 has two votes (aha said True)
    assert majority_correct(["3", "3", "$7", "7", "7.0"], [True, True, False, False, False]) is False  # 7: three
    assert majority_correct(["3", "7", "7.0"], [False, True, True]) is True
    assert majority_correct(["4", "4.0", "3", "3"], [False, False, True, True]) is False  # tie: the first class
    assert majority_correct([None, "5", "5.0", "2"], [False, True, True, False]) is True  # no answer: no vote
    assert majority_correct(["5", "5", "2"], [True, None, False]) is True  # undecided members do not vote on it
    assert majority_correct(["5", "5", "2"], [None, None, False]) is None  # the winner's verdict is undecided
    from aha.eval import majority_vote
    assert majority_vote(["3", "7", "7.0", None, "\\boxed{x}"]) == [1, 2]


def test_maj_at_k_reads_answers_as_the_verifier_does_whatever_the_sample_order(monkeypatch):
    """math500 scores strictly: an unboxed "3" is no answer to its verifier, so it casts no vote either, and swapping
    two samples does not change maj@4; gsm8k: "7" and "7.0" are one answer with two votes against one "3"."""
    from aha.eval import evaluate
    from aha.tasks import get_task
    rows = [{"prompt": "Q?", "answer": "3", "id": i} for i in range(2)]
    _canned(monkeypatch, ["\\boxed{3}"] * 2, [["so the answer is 3.", "\\boxed{3}", "\\boxed{3}", "\\boxed{5}"],
                                            ["\\boxed{3}", "so the answer is 3.", "\\boxed{3}", "\\boxed{5}"]])
    summary, records = evaluate(None, _Chars(), get_task("math500"), rows, k=[4], n_samples=4)
    assert [r["maj"][4] for r in records] == [True, True] and summary["maj@4"] == 1.0
    assert [r["samples_correct"] for r in records] == [2, 2]
    rows = [{"prompt": "Q?", "answer": gold, "id": i} for i, gold in enumerate(["3", "3", "18"])]
    _canned(monkeypatch, ["#### 3", "#### 3", "#### 18"], [["#### 3", "#### 7", "#### 7.0", "#### 3", "#### 1"],
                                                           ["#### 3", "#### 3", "#### $7", "#### 7", "#### 7.0"],
                                                           ["#### $18", "#### 18.00", "#### 18 dollars", "#### 20",
                                                            "#### 20"]])
    summary, records = evaluate(None, _Chars(), get_task("gsm8k"), rows, k=[3, 5], n_samples=5)
    assert records[0]["maj"][3] is False  # the first 3 samples: 3, 7, 7.0 (aha said True)
    assert [r["maj"][5] for r in records[1:]] == [False, True]  # (aha said True, False)


def test_eval_summary_counts_undecided_verdicts_and_says_they_count_as_not_correct(monkeypatch):
    """2^{10^{10}} is set aside as too large (undecided), a missing gold is a data error: both count as not
    correct, and the summary says how many and why, for the greedy and the sampled pass and for maj@k."""
    from aha.eval import evaluate, to_markdown
    from aha.tasks import get_task
    rows = [{"prompt": "Q?", "answer": gold, "id": i} for i, gold in enumerate(["256", "7", None])]
    huge = "\\boxed{2^{10^{10}}}"
    _canned(monkeypatch, [huge, "\\boxed{7}", "\\boxed{1}"],
            [[huge, huge], ["\\boxed{7}", "\\boxed{8}"], ["\\boxed{1}", "\\boxed{1}"]])
    summary, records = evaluate(None, _Chars(), get_task("math500"), rows, k=[1, 2], n_samples=2)
    assert summary["accuracy"] == 1 / 3 and summary["undecided"] == 2
    assert summary["reward/too_large"] == 1 and summary["reward/data_errors"] == 1 and summary["reward/timeouts"] == 0
    assert [r["greedy_undecided"] for r in records] == [True, False, True]
    assert summary["samples/undecided"] == 4 and [r["samples_undecided"] for r in records] == [2, 0, 2]
    assert summary["samples/reward/too_large"] == 2 and summary["samples/reward/data_errors"] == 2
    assert summary["pass@2"] == 1 / 3 and summary["maj@2"] == 1 / 3 and summary["maj@2/undecided"] == 2
    assert "undecided" in summary["note"] and "count as not correct in accuracy, pass@k and maj@k" in summary["note"]
    table = to_markdown(summary, "t")
    assert table.endswith(f"\n\n{summary['note']}.\n") and "| note |" not in table and "| undecided |" in table


def test_eval_counts_a_failing_verifier_as_undecided(monkeypatch):
    from aha.eval import evaluate
    from aha.tasks.base import Task

    def broken(prompts, completions, **kw):
        raise RuntimeError("verifier bug")
    task = Task(name="t", load=None, rewards=lambda: [broken], correct=lambda: broken)
    _canned(monkeypatch, ["a", "b"])
    summary, _ = evaluate(None, _Chars(), task, [{"prompt": "Q", "answer": "a", "id": i} for i in range(2)])
    assert summary["accuracy"] == 0.0 and summary["undecided"] == 2 and summary["reward/errors"] == 1


def test_eval_scores_a_base_model_completion_up_to_its_next_turn(monkeypatch):
    """A base model that goes on with "\\n\\nUser: ... Assistant: ..." and a second answer is scored on its first
    answer (the cut at the template's next-turn label), for accuracy, format and maj@k alike."""
    from aha.eval import evaluate
    from aha.tasks import get_task
    task = get_task("gsm8k@r1_base")
    rows = [{"prompt": "User: Q?\nAssistant:", "answer": "18", "id": 0}]
    text = ("<think>16-3-4=9, 9*2=18</think> <answer>18</answer>\n\nUser: A robe takes 2 bolts of blue fiber and "
            "half that much white fiber. How many bolts?\nAssistant: <think>2+1=3</think> <answer>3</answer>")
    _canned(monkeypatch, [text], [[text, text.replace("18", "20", 2)]])
    summary, records = evaluate(None, _Chars(), task, rows, k=[2], n_samples=2)
    assert summary["accuracy"] == 1.0 and summary["format_frac"] == 1.0 and summary["undecided"] == 0
    assert records[0]["samples_correct"] == 1 and records[0]["maj"][2] is True  # tie: the first answer, 18


# ---- scoring follows what the prompt as sent asked for ----

class _ChatChars(_Chars):
    """_Chars with a chat template: chat prompts are sent as "user: ...\\nassistant:"."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def _times_file(path, chat: bool):
    """Three "What is a times b?" rows (golds 50, 84, 12), their prompts chat messages or plain strings."""
    lines = []
    for a, b in ((10, 5), (12, 7), (3, 4)):
        q = f"What is {a} times {b}? Answer with just the number."
        lines.append(json.dumps({"prompt": [{"role": "user", "content": q}] if chat else q, "answer": str(a * b)}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_eval_of_chat_prompts_counts_the_final_number_they_asked_for(monkeypatch, tmp_path):
    """task=jsonl:FILE with chat-message prompts: the default r1 template does not wrap them, so they ask for no
    format and "10 * 5 = 50" for gold 50 is right (it scored 0% while 84% of the final numbers were right)."""
    from aha.eval import evaluate
    from aha.tasks import get_task
    task = get_task(f"jsonl:{_times_file(tmp_path / 'chat.jsonl', chat=True)}")
    _canned(monkeypatch, ["10 * 5 = 50", "12 times 7 is 84", "3 * 4 = 7"])
    summary, records = evaluate(None, _ChatChars(), task, task.load("test"))
    assert summary["accuracy"] == 2 / 3 and [r["greedy_correct"] for r in records] == [True, True, False]
    assert "format_frac" not in summary and "format_note" not in summary  # no format was asked for
    assert records[0]["prompt"] == "user: What is 10 times 5? Answer with just the number.\nassistant:"


def test_eval_says_when_no_answer_is_in_the_asked_format_but_final_numbers_match(monkeypatch, tmp_path):
    """String prompts that r1 wraps do ask for <answer>, so bare numbers are not answers (accuracy 0); the summary
    says how many final numbers match the gold anyway, in a figure and a line after the table, not 0% alone."""
    from aha.eval import evaluate, to_markdown
    from aha.tasks import get_task
    task = get_task(f"jsonl:{_times_file(tmp_path / 'str.jsonl', chat=False)}")
    _canned(monkeypatch, ["10 * 5 = 50", "12 times 7 is 84", "3 * 4 = 7"])
    summary, _ = evaluate(None, _ChatChars(), task, task.load("test"))
    assert summary["accuracy"] == 0.0 and summary["format_frac"] == 0.0
    assert summary["final_number_accuracy"] == 2 / 3
    assert summary["format_note"].startswith("format share 0%: 2 of 3 final numbers match the gold; the prompts "
                                             "asked for R1's format (<think>")
    table = to_markdown(summary, "t")
    assert f"\n{summary['format_note']}.\n" in table and "| format_note |" not in table
    _canned(monkeypatch, ["<think>10*5</think> <answer>50</answer>", "no idea", "3 * 4 = 7"])
    summary, _ = evaluate(None, _ChatChars(), task, task.load("test"))  # some answers in the format: no note
    assert summary["accuracy"] == 1 / 3 and summary["format_frac"] == 1 / 3 and "format_note" not in summary


def test_held_out_answers_say_what_their_reflection_did_and_samples_can_be_kept(monkeypatch):
    """make_eval_fn with reflection phrases: the greedy answers' behaviour metrics join the accuracy, and every
    kept answer carries its check's parse (what the aha tracker reads from held_out.jsonl)."""
    from aha.eval import evaluate, make_eval_fn
    from aha.tasks import get_task
    from aha.tasks.checked import checked_solution
    task = get_task("add_check")
    rows = [{"prompt": "47+385", "answer": "432", "id": i} for i in range(3)]
    greedy = [checked_solution(47, 385, "direct"), checked_solution(47, 385, "correct"),
              "<think>7+5=12 4+8=12 0+3=3 so 422 wait</think><answer>422</answer>"]
    _canned(monkeypatch, greedy, [[greedy[0], greedy[2]]] * 3)
    eval_fn = make_eval_fn(task, rows, shown=3, phrases=["wait", "check"])
    metrics = eval_fn(None, _Chars())
    assert metrics["accuracy"] == 2 / 3 and metrics["behaviour/reflection_rate"] == 2 / 3
    assert metrics["behaviour/wait_fixed_rate"] == 1 / 3 and metrics["behaviour/empty_reflection"] == 1 / 3
    assert [(a["reflects"], a["corrects"], a["first_right"], a["empty"], a["correct"]) for a in eval_fn.answers] == [
        (False, False, True, False, True), (True, True, False, False, True), (True, True, False, True, False)]
    plain = make_eval_fn(task, rows)  # no phrases: accuracy alone, as before
    assert not any(k.startswith("behaviour/") for k in plain(None, _Chars())) and "reflects" not in plain.answers[0]
    _, records = evaluate(None, _Chars(), task, rows, n_samples=2, keep_samples=True)
    assert records[0]["greedy_len"] == len(greedy[0])
    assert records[1]["samples"] == [{"text": greedy[0], "len": len(greedy[0]), "correct": True},
                                     {"text": greedy[2], "len": len(greedy[2]), "correct": False}]
