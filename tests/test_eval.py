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
