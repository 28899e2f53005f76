"""The recipe runner: validation before anything runs, every stage type, resume."""


from pathlib import Path

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
    ({"eval": {"task": "arithmetic", "model": "x"}, "stages": [{"name": "a", "type": "tiny"}]},
     r"recipe `eval` block: model cannot be set there"),
])
def test_recipe_missing_inputs_fail_before_anything_runs(recipe, msg):
    with pytest.raises(ValueError, match=msg):
        validate(recipe)


def test_recipe_runs_all_stage_types_and_resumes(tmp_path, capsys):
    recipe = {
        "output_dir": str(tmp_path / "r"),
        "eval": {"task": "arithmetic", "num_problems": 4, "progress_bar": False},  # the recipe's own default too
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



def _stub_stages(monkeypatch):
    """Stages that only record their directory: recipe bookkeeping without training."""
    import aha.recipe
    ran = []

    def run_stage(kind, fields, stage_dir):
        stage_dir.mkdir(parents=True)
        ran.append(stage_dir)
        return {"ok": 1}

    monkeypatch.setattr(aha.recipe, "_run_stage", run_stage)
    return ran


TINY_RECIPE = "stages:\n  - {name: base, type: tiny, task: arithmetic, size: tiny}\n"


def test_recipe_unknown_keys_and_overrides_are_errors(tmp_path, monkeypatch):
    ran = _stub_stages(monkeypatch)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"unknown recipe key 'outptu_dir'.*did you mean 'output_dir'"):
        validate({"outptu_dir": "x", "stages": [{"name": "a", "type": "tiny"}]})
    path = tmp_path / "rec.yaml"
    path.write_text(TINY_RECIPE)
    with pytest.raises(ValueError, match=r"unknown recipe key 'outptu_dir'.*did you mean 'output_dir'"):
        run_recipe(str(path), ["outptu_dir=elsewhere"])
    with pytest.raises(ValueError, match=r"unknown recipe key 'max_steps'.*set it in a stage"):
        run_recipe(str(path), ["max_steps=1"])
    with pytest.raises(ValueError, match=r"cannot read argument 'max_steps': expected key=value"):
        run_recipe(str(path), ["max_steps"])
    assert ran == []
    run_recipe(str(path), ["output_dir=0123"])  # a text key keeps the command-line text (not octal 83)
    assert ran == [Path("0123") / "base"]


@pytest.mark.parametrize("text, msg", [
    ("- {name: base, type: tiny}\n", r"rec\.yaml: a recipe is a mapping .*got a list"),
    ("stages:\n  - base\n", r"stage 1 of the recipe is not a mapping.*got 'base'"),
    ("stages: [{name: a, type: tiny\n", r"rec\.yaml: not valid YAML at line 2"),
    ("stages:\n  - {name: a, type: tiny, 1: 2}\n", r"stage 'a': config keys are names; got 1"),
    ("stages:\n  - {name: a, type: sft, model: m, run_name: 12:30}\n",
     r"stage 'a': run_name: YAML reads 12:30 as the number 750"),
])
def test_recipe_of_the_wrong_shape_is_a_clear_error(tmp_path, monkeypatch, text, msg):
    ran = _stub_stages(monkeypatch)
    path = tmp_path / "rec.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=msg):
        run_recipe(str(path))
    assert ran == []


def test_a_bad_recipe_override_names_it(tmp_path, monkeypatch):
    _stub_stages(monkeypatch)
    path = tmp_path / "rec.yaml"
    path.write_text(TINY_RECIPE)
    with pytest.raises(ValueError, match=r"eval=\{task: arith: not valid YAML"):
        run_recipe(str(path), ["eval={task: arith"])


def test_done_json_is_written_atomically_and_a_torn_one_is_named(tmp_path, monkeypatch):
    import aha.fileio
    ran = _stub_stages(monkeypatch)
    path = tmp_path / "rec.yaml"
    path.write_text(f"output_dir: {tmp_path / 'out'}\n" + TINY_RECIPE)
    real_replace = aha.fileio.os.replace

    def killed_before_the_rename(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(aha.fileio.os, "replace", killed_before_the_rename)
    with pytest.raises(KeyboardInterrupt):
        run_recipe(str(path))
    monkeypatch.setattr(aha.fileio.os, "replace", real_replace)
    done = tmp_path / "out" / "base" / "done.json"
    assert len(ran) == 1 and not done.exists()  # not marked complete: the next run does the stage again
    done.write_text('{"stage": "base", "ty')  # torn by an older version or a bad disk
    with pytest.raises(ValueError, match=rf"{done}: unreadable .*delete it to run stage 'base' again"):
        run_recipe(str(path))
    assert len(ran) == 1


@pytest.mark.parametrize("stages, msg", [
    ([{"name": "ev", "type": "eval", "model": "@base", "task": "arithmetic"},
      {"name": "cold", "type": "sft", "model": "@ev", "task": "arithmetic"}],
     r"stage 'cold': model: @ev is an eval stage, which makes no model; model takes a tiny, sft or grpo stage"),
    ([{"name": "cold", "type": "sft", "dataset": "@base"}],
     r"stage 'cold': dataset: @base is a tiny stage, which makes a model; dataset takes a sample or prm_labels stage"),
    ([{"name": "rs", "type": "sample", "task": "arithmetic"},
      {"name": "g", "type": "grpo", "model": "@rs", "task": "arithmetic"}],
     r"stage 'g': model: @rs is a sample stage, which makes a data file; model takes a tiny, sft or grpo stage"),
    ([{"name": "g", "type": "grpo", "task": "@base"}],
     r"stage 'g': task: @base .*only model, dataset, mix_dataset and prm_model take"),
])
def test_recipe_references_to_the_wrong_kind_of_output_fail_before_anything_runs(stages, msg):
    with pytest.raises(ValueError, match=msg):
        validate({"stages": [{"name": "base", "type": "tiny", "task": "arithmetic"}, *stages]})

