"""The embedded default end to end at toy scale: every artefact a person looks at is written."""

import json

from aha.cli import main


def test_demo_writes_summary_plot_table_and_models(tmp_path):
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
