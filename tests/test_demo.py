"""The embedded default end to end at toy scale: every artefact a person looks at is written."""

import json

import pytest

from aha.cli import main


def test_demo_writes_summary_plot_table_and_models(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", f"output_dir={out}", "size=tiny", "sft_examples=64", "sft_steps=3", "sft_batch=8",
                 "grpo_steps=2", "prompts_per_step=2", "num_generations=2", "eval_problems=8", "eval_every=1",
                 "eval_during=4", "progress_bar=false"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("sft_accuracy", "grpo_accuracy", "steps", "seconds"):
        assert key in summary, key
    assert summary["steps"] == 2 and 0.0 <= summary["grpo_accuracy"] <= 1.0
    assert (out / "demo.png").stat().st_size > 10_000
    assert "| SFT + GRPO |" in (out / "results.md").read_text()
    assert (out / "grpo" / "model" / "config.json").is_file() and (out / "sft" / "model" / "model.safetensors").is_file()
    steps = [json.loads(line)["step"] for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert steps[0] == 0 and steps[-1] == 2  # step 0 is the held-out accuracy before GRPO
    assert "behaviour/reflection_rate" in (out / "grpo" / "metrics.jsonl").read_text()
    held = [json.loads(line) for line in (out / "grpo" / "held_out.jsonl").read_text().splitlines()]
    by_step = {s: [r["id"] for r in held if r["step"] == s] for s in (0, 1, 2)}
    assert len(by_step[0]) == 4 and by_step[0] == by_step[1] == by_step[2]  # the same problems at every evaluation
    assert f"aha dashboard runs_root={tmp_path}" in capsys.readouterr().out  # it ends by saying how to look


def test_aha_plot_draws_every_metric_of_a_run(tmp_path):
    from PIL import Image
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "loss": 1.0 / s, "reward/mean": 0.1 * s, "kl": None, "perf/step_s": 0.5} for s in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["plot", str(run)]) == 0
    png = Image.open(run / "metrics.png")
    assert png.size == (3 * 420, 300)  # three metrics with values (kl has none): one row of three panels
    assert main(["plot", str(tmp_path / "missing")]) == 2


def test_aha_examples_lists_and_copies_the_shipped_configs(tmp_path, capsys):
    assert main(["examples"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert "grpo_arithmetic.yaml" in listed["configs"] and "recipe_arithmetic.yaml" in listed["configs"]
    assert main(["examples", str(tmp_path / "ex")]) == 0
    assert (tmp_path / "ex" / "grpo_arithmetic.yaml").is_file()
    assert main(["examples", str(tmp_path / "ex")]) == 2  # never overwrites


def test_cold_start_ends_at_its_target_accuracy(tmp_path):
    """The demo's SFT stops at the first check whose dev accuracy reaches sft_target, not at sft_steps."""
    from aha.config import SFTConfig
    from aha.demo import StopAtAccuracy
    from aha.models.tiny import make_tiny
    from aha.tasks import get_task, task_corpus
    from aha.train.sft import SFTTrainer
    rows = get_task("arithmetic").load("train", 64)
    model = make_tiny(tmp_path / "base", task_corpus(rows), size="tiny")
    seen = []

    def dev_accuracy(model, tokenizer):  # 0.1, 0.2, 0.3, ... at successive checks (step 0 is checked too)
        seen.append(len(seen) / 10)
        return {"accuracy": seen[-1]}

    args = SFTConfig(output_dir=str(tmp_path / "sft"), model=str(model), max_steps=40, eval_steps=2,
                     per_device_train_batch_size=4, progress_bar=False, report_to=["none"])
    trainer = SFTTrainer(args=args, train_dataset=rows, eval_fn=dev_accuracy, callbacks=[StopAtAccuracy(0.25)])
    trainer.train()
    assert trainer.step_count == 6 and seen == [0.0, 0.1, 0.2, 0.3]  # checks at steps 0, 2, 4, 6


SMOKE = ["size=tiny", "sft_examples=64", "sft_steps=3", "sft_batch=8", "grpo_steps=2", "prompts_per_step=2",
         "num_generations=2", "eval_problems=8", "eval_every=1", "eval_during=4", "progress_bar=false"]
"""A demo at toy scale: seconds, not minutes."""


def test_demo_variants_are_named_after_the_command_and_their_settings_are_their_own(capsys):
    import importlib

    from aha.config import DemoConfig
    from aha.demo import VARIANTS
    assert DemoConfig().output_dir == "runs/demo" and DemoConfig(variant="aha").output_dir == "runs/demo_aha"
    assert DemoConfig(variant="aha", output_dir="x").output_dir == "x"
    from aha.demo import configured
    assert DemoConfig().sft_target is None  # unset until the demo starts: then the variant's default
    assert configured(DemoConfig()).sft_target == 0.25 and configured(DemoConfig(variant="aha")).sft_target == 0.5
    assert configured(DemoConfig(variant="aha", sft_target=0.3)).sft_target == 0.3
    assert configured(DemoConfig(sft_target=0)).sft_target == 0
    assert all(callable(importlib.import_module(f"aha.demo.{v.module}").run) for v in VARIANTS.values())
    assert main(["demo", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown demo 'nosuch'; valid: [" in err and "'aha'" in err  # every name, listed
    assert main(["demo", "reflect_share=0.2"]) == 2  # read by `aha demo aha` only: an error, not a silent no-op
    assert "reflect_share is a setting of `aha demo aha`, not of `aha demo`" in capsys.readouterr().err
    assert main(["demo", "grpo_temperature=0.7"]) == 2  # the agent demo's, refused elsewhere
    assert "grpo_temperature is a setting of `aha demo agent`, not of `aha demo`" in capsys.readouterr().err
    assert main(["demo", "agent", "grpo_temperature=0"]) == 2  # 0 would be greedy GRPO episodes: refused
    assert "grpo_temperature" in capsys.readouterr().err
    assert main(["demo", "grpo_beta=0.1"]) == 2
    assert "grpo_beta is a setting of `aha demo agent`" in capsys.readouterr().err
    assert main(["demo", "agent", "grpo_beta=-0.1"]) == 2
    assert "grpo_beta" in capsys.readouterr().err


def test_aha_demo_measures_reflection_before_and_after_and_keeps_what_the_tracker_needs(tmp_path, capsys):
    out = tmp_path / "aha"
    assert main(["demo", "aha", f"output_dir={out}", *SMOKE, "held_out_samples=2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("sft_accuracy", "grpo_accuracy", "gain_points_ci95", "sft_reflection_rate", "grpo_reflection_rate",
                "reflection_gain_ci95", "sft_reflection_rate_sampled", "grpo_reflection_rate_ci95",
                "grpo_corrected_rate", "behaviour", "fixed_by_reflection"):
        assert key in summary, key
    assert summary["reflect_share"] == 0.05 and summary["steps"] == 2
    assert "NaN" not in (out / "summary.json").read_text()  # a split with no completion is null: JSON a browser reads
    assert set(summary["behaviour"]) == {"sft_greedy", "sft_sampled", "grpo_greedy", "grpo_sampled"}
    metrics = (out / "grpo" / "metrics.jsonl").read_text()
    assert '"behaviour/empty_reflection"' in metrics and '"eval/behaviour/reflection_rate"' in metrics
    held = [json.loads(line) for line in (out / "grpo" / "held_out.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in held}) == [0, 1, 2] and len(held) == 3 * 4  # every in-training problem
    assert all({"id", "answer", "greedy", "correct", "reflects", "corrects", "first_right", "empty"} <= set(r)
               for r in held)
    assert "| held-out completions | reflection |" in (out / "results.md").read_text()
    assert "problems answered wrong were later fixed" in (out / "results.md").read_text()
    assert (out / "aha.png").is_file() and f"aha dashboard runs_root={tmp_path}" in capsys.readouterr().out
    # an arm that differs only after the cold start starts from this run's, here the one that pays for "wait"
    arm = tmp_path / "wait"
    assert main(["demo", "aha", f"output_dir={arm}", *SMOKE, f"sft_model={out / 'sft' / 'model'}",
                 "wait_reward=0.5", "held_out_samples=0"]) == 0
    again = json.loads((arm / "summary.json").read_text())
    assert again["sft_steps"] == 0 and again["sft_accuracy"] == summary["sft_accuracy"] and not (arm / "base").exists()
    assert "reward_weights:\n- 1.0\n- 0.1\n- 0.5" in (arm / "grpo" / "config.yaml").read_text()


def test_process_demo_arms_share_a_cold_start_and_record_their_credit(tmp_path):
    """`aha demo process`: the steps arm trains a cold start, the outcome arm starts from it (sft_model, 0 SFT
    steps taken), each records its credit and each held-out problem's verdicts; steps logs process/* metrics under
    grpo_process; credit=prm without a PRM, or an unknown credit, is refused before training."""
    small = ["size=tiny", "sft_examples=64", "sft_steps=3", "sft_batch=8", "sft_target=0", "grpo_steps=2",
             "prompts_per_step=2", "num_generations=2", "eval_problems=8", "eval_every=0", "progress_bar=false"]
    assert main(["demo", "process", "credit=steps", f"output_dir={tmp_path / 'steps'}", *small]) == 0
    sft = tmp_path / "steps" / "sft" / "model"
    assert main(["demo", "process", "credit=outcome", f"output_dir={tmp_path / 'out'}", f"sft_model={sft}",
                 *small]) == 0
    steps, outcome = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("steps", "out"))
    assert (steps["credit"], outcome["credit"]) == ("steps", "outcome") and outcome["sft_steps"] == 0
    assert outcome["sft_accuracy"] == steps["sft_accuracy"]  # the same cold start, the same held-out problems
    verdicts = json.loads((tmp_path / "out" / "verdicts.json").read_text())
    assert len(verdicts["sft"]) == len(verdicts["grpo"]) == 8 and set(verdicts["sft"]) <= {0.0, 1.0}
    rows = [json.loads(line) for line in (tmp_path / "steps" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert all("process/steps_per_completion" in r for r in rows if r["step"] > 0)
    assert "advantage_estimator: grpo_process" in (tmp_path / "steps" / "grpo" / "config.yaml").read_text()
    assert "advantage_estimator: grpo\n" in (tmp_path / "out" / "grpo" / "config.yaml").read_text()
    assert main(["demo", "process", "credit=prm", f"output_dir={tmp_path / 'prm'}", *small]) == 2
    assert main(["demo", "process", "credit=magic", f"output_dir={tmp_path / 'bad'}", *small]) == 2


def test_the_agent_demo_uses_two_threads_unless_told_and_the_others_one():
    from aha.config import ConfigError
    from aha.config import DemoConfig as given
    from aha.demo import configured

    def DemoConfig(**kwargs):  # as the demo runs it: the variant's defaults laid on
        return configured(given(**kwargs))
    assert DemoConfig(variant="agent").threads == 2 and DemoConfig(variant="agent", threads=1).threads == 1
    assert DemoConfig().threads == DemoConfig(variant="aha").threads == DemoConfig(variant="process").threads == 1
    assert (DemoConfig(variant="agent").sft_steps, DemoConfig(variant="agent").sft_check_every) == (100, 100)
    assert DemoConfig(variant="agent", sft_target=0.25).sft_target == 0.25
    with pytest.raises(ConfigError, match="threads must be >= 1"):
        DemoConfig(threads=0)
