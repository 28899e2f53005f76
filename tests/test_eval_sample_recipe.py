"""pass@k / maj@k arithmetic, `aha eval`, rejection sampling and the recipe runner."""

import itertools
import json
from math import comb

import pytest
import yaml

from aha.cli import main
from aha.data.tasks import Task, register_task
from aha.eval import EvalConfig, majority_correct, pass_at_k
from aha.recipe import run_recipe, validate
from aha.sample import SampleConfig, run_sample, select


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


def test_select_by_hand():
    texts, lengths = ["a", "a", "bb", "c"], [1, 1, 2, 1]
    correct, scores = [True, True, True, False], [1.0, 1.0, 2.0, 9.0]
    assert select(texts, lengths, correct, scores, "best") == [2]            # highest reward, verified
    assert select(texts, lengths, correct, scores, "all_correct") == [0, 2]  # duplicates dropped
    assert select(texts, lengths, correct, scores, "shortest_correct") == [0]
    assert select(texts, lengths, [False] * 4, scores, "best") == []


def _digit_task():
    def has_digit(prompts, completions, **kw):
        return [1.0 if any(ch.isdigit() for ch in c) else 0.0 for c in completions]
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i), "id": i} for i in range(6)]
    return register_task(Task(name="test-digits", load=lambda split, n=None, seed=0: rows,
                              rewards=lambda: [has_digit], correct=lambda: has_digit,
                              max_completion_length=6))


def test_rejection_sampling_writes_verified_rows_and_mixes(tiny_dir, tmp_path):
    _digit_task()
    mix = tmp_path / "mix.jsonl"
    mix.write_text("".join(json.dumps({"prompt": f"m{i}", "completion": "x"}) + "\n" for i in range(50)))
    stats = run_sample(SampleConfig(model=tiny_dir, task="test-digits", n=8, keep="all_correct",
                                    mix_dataset=str(mix), mix_ratio=0.5, output_dir=str(tmp_path / "s"),
                                    progress_bar=False))
    rows = [json.loads(line) for line in (tmp_path / "s" / "data.jsonl").read_text().splitlines()]
    kept = [r for r in rows if "reward" in r]
    assert stats["rows_kept"] == len(kept) > 0
    assert all(any(ch.isdigit() for ch in r["completion"]) for r in kept)
    assert stats["rows_mixed_in"] == len(rows) - len(kept) == len(kept)   # ratio 0.5
    per_prompt = (tmp_path / "s" / "per_prompt.jsonl").read_text().splitlines()
    assert len(per_prompt) == 6 and 0 < stats["acceptance_rate"] <= 1


@pytest.mark.parametrize("stages, msg", [
    ([{"name": "a", "type": "grpo", "model": "@b"}, {"name": "b", "type": "sft", "model": "@a"}], "cycle"),
    ([{"name": "a", "type": "distill", "model": "m"}], "unknown type 'distill'"),
    ([{"name": "a", "type": "sft", "model": "@nope"}], "uses @nope, which is not a stage"),
    ([{"name": "a", "type": "sft", "model": "m", "learning_rat": 1}], "did you mean 'learning_rate'"),
    ([{"name": "a", "type": "sft"}], "has no model"),
])
def test_recipe_errors_before_anything_runs(stages, msg):
    with pytest.raises(ValueError, match=msg):
        validate({"stages": stages})


@pytest.mark.parametrize("recipe, msg", [
    ({"stages": [{"name": "a", "type": "sft", "model": "no/such-model"}]},
     r"stage 'a': 'no/such-model' is neither a known short name"),
    ({"model": "@x", "stages": [{"name": "a", "type": "sft", "dataset": "missing.jsonl"}]},
     r"stage 'a': dataset 'missing.jsonl' is not a file"),
    ({"model": "@x", "stages": [{"name": "a", "type": "eval", "task": "arithmetik"}]}, r"stage 'a': .*arithmetik"),
    ({"eval": {"task": "arithmetic", "num_problem": 4}, "stages": [{"name": "a", "type": "tiny"}]},
     r"recipe `eval` block: .*did you mean 'num_problems'"),
])
def test_recipe_missing_inputs_fail_before_anything_runs(recipe, msg):
    with pytest.raises(ValueError, match=msg):
        validate(recipe)


def test_recipe_runs_all_stage_types_and_resumes(tmp_path, capsys):
    recipe = {
        "output_dir": str(tmp_path / "r"),
        "eval": {"task": "arithmetic", "num_problems": 4},
        "stages": [
            {"name": "base", "type": "tiny", "task": "arithmetic", "size": "tiny"},
            {"name": "sft", "type": "sft", "task": "arithmetic", "max_steps": 2, "per_device_train_batch_size": 4,
             "eval_samples": 0, "progress_bar": False, "report_to": []},
            {"name": "grpo", "type": "grpo", "task": "arithmetic", "max_steps": 1, "num_generations": 2,
             "per_device_train_batch_size": 4, "max_completion_length": 8, "progress_bar": False, "report_to": []},
            {"name": "rs", "type": "sample", "task": "arithmetic", "num_prompts": 3, "n": 2, "keep": "best",
             "max_new_tokens": 8, "progress_bar": False},
            {"name": "final", "type": "eval", "model": "@grpo", "task": "arithmetic", "num_problems": 3,
             "progress_bar": False},
        ],
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    first = run_recipe(str(path))
    assert [s["stage"] for s in first["stages"]] == ["base", "sft", "grpo", "rs", "final"]
    assert all("eval" in s for s in first["stages"][:3])
    assert (tmp_path / "r" / "rs" / "stats.json").is_file()
    assert (tmp_path / "r" / "summary.md").read_text().count("\n") == 7
    capsys.readouterr()
    run_recipe(str(path))
    assert capsys.readouterr().out.count("already complete, skipped") == 5


def test_eval_on_gsm8k_with_a_tiny_random_model(tiny_dir, tmp_path):
    """The benchmark path end to end: real GSM8K rows, a random model, accuracy near 0 expected."""
    out = tmp_path / "gsm"
    assert main(["eval", tiny_dir, "--task", "gsm8k", "--num_problems", "4", "--max_new_tokens", "16",
                 f"output_dir={out}", "progress_bar=false"]) == 0
    res = json.loads((out / "results.json").read_text())["summary"]
    assert res["task"] == "gsm8k" and res["num_problems"] == 4 and 0.0 <= res["accuracy"] <= 0.25
    ids = [json.loads(line)["id"] for line in (out / "per_problem.jsonl").read_text().splitlines()]
    assert len(set(ids)) == 4
