"""The embedded default end to end at toy scale: every artefact a person looks at is written."""

import json

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
