"""A TRL user's script, word for word but for the import: the config's new names, then what such a script does with
train()'s result (transformers' TrainOutput, state.log_history, log_metrics, save_metrics, save_state,
processing_class), with report_to="none" and a run shorter than the logging intervals."""

import json
import math

from aha.metrics import read_metrics

PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def test_a_trl_script_with_the_new_names_runs_unchanged(tiny_dir, tmp_path, capsys):
    from datasets import Dataset

    from aha import GRPOConfig, GRPOTrainer  # from trl import GRPOConfig, GRPOTrainer

    def digits(completions, **kwargs):
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    def short(completions, **kwargs):
        return [-len(c) / 10 for c in completions]

    out = str(tmp_path / "trl-run")
    training_args = GRPOConfig(
        output_dir=out, report_to="none", disable_tqdm=True, dataloader_num_workers=2, torch_compile=False,
        logging_first_step=True, logging_steps=2, save_only_model=False, save_strategy="steps", log_level="passive",
        gradient_checkpointing_kwargs={"use_reentrant": False}, tf32=None, max_steps=3, num_generations=4,
        per_device_train_batch_size=8, max_completion_length=8, learning_rate=1e-3, seed=0, num_iterations=2,
        loss_type="sapo", sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, entropy_coef=0.01,
        use_adaptive_entropy=True, entropy_target=100.0, multi_objective_aggregation="normalize_then_sum",
        reward_weights=[1.0, 0.5], vllm_gpu_memory_utilization=0.3, num_completions_to_print=None)
    trainer = GRPOTrainer(model=tiny_dir, reward_funcs=[digits, short], args=training_args,
                          train_dataset=Dataset.from_list(PROMPTS))
    train_result = trainer.train()
    metrics = train_result.metrics
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    trainer.processing_class.save_pretrained(str(tmp_path / "tokenizer"))

    assert train_result.global_step == 3 and math.isfinite(train_result.training_loss)
    rows = read_metrics(tmp_path / "trl-run" / "metrics.jsonl")  # written although report_to="none"
    assert [r["step"] for r in rows] == [1, 2, 3]                  # the first step, every 2nd, the last
    assert train_result.training_loss == sum(r["loss"] for r in rows) / 3
    assert train_result["loss"] == rows[-1]["loss"]               # still the last step's metrics as a dict
    assert "***** train metrics *****" in capsys.readouterr().out
    saved = json.loads((tmp_path / "trl-run" / "train_results.json").read_text())
    assert saved == json.loads((tmp_path / "trl-run" / "all_results.json").read_text())
    assert saved["train_loss"] == train_result.training_loss and saved["train_runtime"] > 0
    state = json.loads((tmp_path / "trl-run" / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and [h["step"] for h in state["log_history"]] == [1, 2, 3, 3]
    assert state["log_history"][-1]["train_loss"] == train_result.training_loss
    assert trainer.state.log_history[0]["entropy_coef"] == rows[0]["entropy_coef"]
    assert (tmp_path / "tokenizer" / "tokenizer_config.json").is_file()
    # log_completions_steps and log_groups_steps are 10, more than the run: its last step is written
    completions = [json.loads(line) for line in (tmp_path / "trl-run" / "completions.jsonl").read_text().splitlines()]
    assert {c["step"] for c in completions} == {3}
    groups = [json.loads(line) for line in (tmp_path / "trl-run" / "groups.jsonl").read_text().splitlines()]
    assert groups and {g["step"] for g in groups} == {3}
