"""Config parsing, CLI help and the errors bad input gets."""

import dataclasses

import pytest
import yaml

from aha.cli import main
from aha.config import ConfigError, field_docs, help_text, parse_args
from aha.config import GRPOConfig, SFTConfig
from aha.train.grpo import GRPOTrainer

PROMPTS = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(8)]


def test_yaml_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("learning_rate: 1e-5\nnum_generations: 4\nreward_funcs: [math, format]\n")
    cfg = parse_args(GRPOConfig, [str(f), "num_generations=8", "beta=0.04", "epsilon_high=0.28", "model=x/y"])
    assert cfg.learning_rate == 1e-5 and cfg.num_generations == 8 and cfg.beta == 0.04
    assert cfg.reward_funcs == ["math", "format"] and cfg.epsilon_high == 0.28 and cfg.model == "x/y"
    assert cfg.generation_batch_size == 8 and cfg.prompts_per_step == 1  # derived once, after parsing


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ConfigError, match="unknown config key 'learning_rat'.*did you mean 'learning_rate'"):
        parse_args(GRPOConfig, ["learning_rat=1e-4"])
    with pytest.raises(ConfigError, match="unknown config key 'num_generation'.*did you mean 'num_generations'"):
        GRPOConfig(num_generation=4)  # the Python API, as in TRL's GRPOConfig(...)


def test_wrong_types_are_named():
    with pytest.raises(ConfigError, match="num_generations: expected an integer"):
        parse_args(GRPOConfig, ["num_generations=abc"])
    with pytest.raises(ConfigError, match=r"dtype: 'fp8' is not one of"):
        parse_args(GRPOConfig, ["dtype=fp8"])


def test_every_field_has_a_docstring_and_appears_in_help():
    for cls in (GRPOConfig, SFTConfig):
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, missing
        text = help_text(cls)
        for f in dataclasses.fields(cls):
            assert f"  {f.name} (" in text


def test_cli_help_and_errors(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "num_generations" in out and "Completions sampled per prompt" in out
    assert main(["train", "num_generation=4"]) == 2
    assert "did you mean 'num_generations'" in capsys.readouterr().err


@pytest.mark.parametrize("kw, msg", [
    (dict(num_generations=1), "num_generations must be >= 2"),
    (dict(num_generations=3, per_device_train_batch_size=8), "must be divisible by num_generations 3"),
    (dict(loss_type="ppo"), r"loss_type: unknown loss_type 'ppo'; valid: \['bnpo', 'cispo', 'dapo', 'dr_grpo', 'grpo', 'luspo', 'sapo', 'vespo'\]"),
    (dict(advantage_estimator="ppo"), r"advantage_estimator: unknown advantage estimator 'ppo'; valid: \['batch', 'batch_rewards', 'dr_grpo', 'gdpo', .*'grpo', 'grpo_process', 'rloo'.*\]"),
    (dict(kl_estimator="k9"), r"unknown KL estimator 'k9'; valid: \['k1', 'k2', 'k3'\]"),
])
def test_config_errors(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        GRPOConfig(**kw)


def _args(tmp_path, **kw):
    return GRPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8,
                      max_completion_length=8, progress_bar=False, report_to=[], **kw)


def test_reward_needing_a_missing_column(tiny_dir, tmp_path):
    def needs_solution(prompts, completions, solution, **kw):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="needs dataset column 'solution'; the dataset has: answer, prompt"):
        GRPOTrainer(tiny_dir, [needs_solution], _args(tmp_path), PROMPTS)

    def reads_kwargs(prompts, completions, **kw):  # TRL style: the column is read from kwargs
        return [float(x) for x in kw["gold"]]

    t = GRPOTrainer(tiny_dir, [reads_kwargs], _args(tmp_path), PROMPTS)
    with pytest.raises(ValueError, match="needs dataset column 'gold'"):
        t.step()


def test_reward_returning_the_wrong_number_of_values(tiny_dir, tmp_path):
    t = GRPOTrainer(tiny_dir, [lambda prompts, completions, **kw: [1.0]], _args(tmp_path), PROMPTS)
    with pytest.raises(ValueError, match="returned 1 values, expected 8"):
        t.step()


def test_empty_dataset_and_prompt_longer_than_the_context(tiny_dir, tmp_path):
    ok = [lambda prompts, completions, **kw: [0.0] * len(completions)]
    with pytest.raises(ValueError, match="the training dataset is empty"):
        GRPOTrainer(tiny_dir, ok, _args(tmp_path), [])
    with pytest.raises(ValueError, match=r"dataset row 1 has no 'prompt' column; its columns: \['question'\]"):
        GRPOTrainer(tiny_dir, ok, _args(tmp_path), [{"prompt": "1+1="}, {"question": "2+2="}])
    long = [{"prompt": "1+1=" * 2100}]  # 8,400 tokens, the tiny model's context is 8,192
    with pytest.raises(ValueError, match=r"prompt 0 has \d+ tokens; with max_completion_length 8 it exceeds "
                                         r"the model's context of 8192"):
        GRPOTrainer(tiny_dir, ok, _args(tmp_path), long)


def test_effective_config_is_saved(tiny_dir, tmp_path):
    t = GRPOTrainer(tiny_dir, [lambda prompts, completions, **kw: [0.0] * len(completions)],
                    _args(tmp_path, max_steps=1, beta=0.5), PROMPTS)
    t.train()
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["beta"] == 0.5 and saved["generation_batch_size"] == 8


@pytest.mark.parametrize("kw, msg", [
    (dict(temperature=0), r"temperature must be > 0"),
    (dict(temperature=-1), r"temperature must be > 0"),
    (dict(top_p=0), r"top_p must be in \(0, 1\]"),
    (dict(max_completion_length=0), r"max_completion_length must be >= 1"),
    (dict(max_steps=-3), r"max_steps must be >= 0"),
    (dict(save_steps=-1), r"save_steps must be >= 0"),
    (dict(learning_rate=-1), r"learning_rate must be >= 0, got -1.0"),
    (dict(learning_rate=float("nan")), r"learning_rate must be >= 0"),
    (dict(beta=-0.1), r"beta must be >= 0"),
    (dict(epsilon=0), r"epsilon must be in \(0, 1\)"),
    (dict(report_to="wandbb"), r"report_to: 'wandbb' is not one of"),
    (dict(dtype="bf16"), r"dtype: 'bf16' is not one of"),
    (dict(lr_scheduler_type="cosin"), r"lr_scheduler_type: 'cosin' is not one of"),
    (dict(importance_sampling_level="seq"), r"importance_sampling_level: 'seq' is not one of"),
])
def test_out_of_range_values_are_refused_with_the_key_named(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        GRPOConfig(**kw)
    key, value = next(iter(kw.items()))
    if value == value:  # the command line refuses the same value the same way
        with pytest.raises(ConfigError, match=msg.split(",")[0]):
            parse_args(GRPOConfig, [f"{key}={value}"])


def test_python_values_are_coerced_like_the_command_line():
    cfg = GRPOConfig(report_to="none", learning_rate="1e-5", num_generations=4.0, per_device_train_batch_size=8)
    assert cfg.report_to == ["none"] and cfg.learning_rate == 1e-5 and cfg.num_generations == 4
    assert cfg == parse_args(GRPOConfig, ["report_to=none", "learning_rate=1e-5", "num_generations=4",
                                          "per_device_train_batch_size=8"])


def test_derived_values_are_computed_once_in_the_config():
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                     generation_batch_size=16, num_iterations=2, max_steps=10)
    # 10 steps x 2 passes x (16 completions / (4 x 2) per optimizer step) = 40 optimizer steps
    assert cfg.prompts_per_step == 4 and cfg.optimizer_steps_per_step * cfg.max_steps == 40


def test_help_names_the_allowed_values():
    text = help_text(GRPOConfig)
    assert "dtype (one of float32, bfloat16, float16, auto, default \"float32\")" in text
    assert "epsilon_high (float or null, default null)" in text


def test_dashed_option_with_equals_keeps_dashes_in_the_value():
    from aha.cli import _normalise
    argv = ["--output-dir=runs/my-run", "--learning_rate=1e-6", "--model=smollm2-135m-instruct", "--beta", "0.1"]
    assert _normalise(argv) == ["output_dir=runs/my-run", "learning_rate=1e-6", "model=smollm2-135m-instruct",
                                "beta=0.1"]
    cfg = parse_args(GRPOConfig, _normalise(argv))
    assert cfg.output_dir == "runs/my-run" and cfg.learning_rate == 1e-6 and cfg.model == "smollm2-135m-instruct"


def test_yaml_syntax_errors_are_config_errors_naming_the_source(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"reward_funcs=\[format, math: not valid YAML.*expected ',' or ']'"):
        parse_args(GRPOConfig, ["reward_funcs=[format, math"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: arithmetic\nlearning_rate: [1e-6\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML at line 3"):
        parse_args(GRPOConfig, [str(bad)])
    numkey = tmp_path / "numkey.yaml"
    numkey.write_text("1: 2\n")
    with pytest.raises(ConfigError, match=r"numkey\.yaml: config keys are names; got 1"):
        parse_args(GRPOConfig, [str(numkey)])
    assert main(["train", str(bad)]) == 2 and "bad.yaml: not valid YAML" in capsys.readouterr().err


def test_text_fields_keep_the_command_line_text():
    cases = {
        "output_dir=0123": ("output_dir", "0123"),        # YAML 1.1 reads the octal number 83
        "output_dir=1_000": ("output_dir", "1_000"),      # 1000
        "output_dir=.5": ("output_dir", ".5"),            # 0.5
        "run_name=12:30": ("run_name", "12:30"),          # sexagesimal 750
        "run_name=2024-01-01": ("run_name", "2024-01-01"),  # a date
        "run_name=[a, b": ("run_name", "[a, b"),          # not YAML: still text
        "run_name=yes": ("run_name", "error: run_name: expected a string, got True"),  # a boolean: refused
        "run_name=null": ("run_name", None),              # Optional[str]: null is still None
        "run_name='null'": ("run_name", "null"),          # quoted: the text inside the quotes
        "hub_model_id=user/1e3": ("hub_model_id", "user/1e3"),
    }
    def value(arg, key):
        try:
            return getattr(parse_args(GRPOConfig, [arg]), key)
        except ConfigError as e:
            return f"error: {e}"

    got = {arg: value(arg, key) for arg, (key, _) in cases.items()}
    assert got == {arg: expected for arg, (_, expected) in cases.items()}


def test_a_yaml_number_for_a_text_field_is_refused_naming_the_key(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("output_dir: 0123\n")
    with pytest.raises(ConfigError, match=r'c\.yaml: output_dir: YAML reads 0123 as the number 83.*output_dir: "0123"'):
        parse_args(GRPOConfig, [str(f)])
    f.write_text("run_name: 12:30\n")
    with pytest.raises(ConfigError, match=r"run_name: YAML reads 12:30 as the number 750"):
        parse_args(GRPOConfig, [str(f)])
    f.write_text("output_dir: '0123'\nrun_name: \"12:30\"\nlearning_rate: 1e-6\n")
    cfg = parse_args(GRPOConfig, [str(f)])
    assert cfg.output_dir == "0123" and cfg.run_name == "12:30" and cfg.learning_rate == 1e-6
