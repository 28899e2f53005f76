"""The recipe runner: validation before anything runs, every stage type, resume."""


import pytest
import yaml

from aha.recipe import run_recipe, validate


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

