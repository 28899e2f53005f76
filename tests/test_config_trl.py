"""aha.config.trl: TRL's GRPOConfig names, translated or refused with a reason, on every path."""

import pytest

from aha.config import ConfigError, GRPOConfig, SFTConfig, parse_args
from aha.config.trl import UNSUPPORTED


@pytest.mark.parametrize("value, estimator", [("group", "grpo"), (True, "grpo"), ("batch", "batch"),
                                              ("none", "dr_grpo"), (False, "dr_grpo")])
def test_scale_rewards_picks_the_advantage_normalisation(value, estimator):
    assert GRPOConfig(scale_rewards=value).advantage_estimator == estimator
    cli = "true" if value is True else "false" if value is False else value
    assert parse_args(GRPOConfig, [f"scale_rewards={cli}"]).advantage_estimator == estimator


def test_an_explicit_aha_field_wins_over_its_alias():
    assert GRPOConfig(scale_rewards="none", advantage_estimator="rloo").advantage_estimator == "rloo"


def test_log_completions_and_eval_strategy():
    assert GRPOConfig(log_completions=True, logging_steps=5).log_completions_steps == 5
    assert GRPOConfig(log_completions=False).log_completions_steps == 0
    assert GRPOConfig(eval_strategy="no", eval_steps=10).eval_steps == 10  # the explicit field wins
    assert GRPOConfig(eval_strategy="no").eval_steps == 0
    with pytest.raises(ConfigError, match="eval_strategy: 'epoch'"):
        GRPOConfig(eval_strategy="epoch")


@pytest.mark.parametrize("key", ["use_vllm", "vllm_mode", "max_prompt_length", "steps_per_generation",
                                 "sync_ref_model", "repetition_penalty"])
def test_unsupported_trl_fields_say_so_and_what_to_use(key):
    with pytest.raises(ConfigError, match=rf"'{key}' is a TRL GRPOConfig field aha does not support: \w"):
        GRPOConfig(**{key: 1})
    with pytest.raises(ConfigError, match=rf"'{key}' is a TRL GRPOConfig field aha does not support"):
        parse_args(GRPOConfig, [f"{key}=1"])


def test_a_name_that_is_an_aha_field_is_never_refused():
    assert SFTConfig(num_train_epochs=2.0).num_train_epochs == 2.0  # SFT has it; GRPO does not
    assert "num_train_epochs" in UNSUPPORTED
    with pytest.raises(ConfigError, match="'num_train_epochs' is a TRL GRPOConfig field"):
        GRPOConfig(num_train_epochs=2)
    assert GRPOConfig(bf16=True).bf16 is True  # a TRL name aha has as a field of its own


def test_warmup_ratio_shuffle_dataset_and_logging_dir_do_what_trl_says(tiny_dir, tmp_path):
    from aha.train.grpo import GRPOTrainer

    def digit_share(prompts, completions, **kw):
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    rows = [{"prompt": f"{a}+1="} for a in range(12)]
    cfg = GRPOConfig(output_dir=str(tmp_path / "run"), max_steps=4, num_generations=4, per_device_train_batch_size=8,
                     max_completion_length=4, learning_rate=1e-2, progress_bar=False, report_to=["tensorboard"],
                     log_completions_steps=0, warmup_ratio=0.5, shuffle_dataset=False,
                     logging_dir=str(tmp_path / "tb"))
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=cfg, train_dataset=rows)
    assert t.sampler.take(6) == [0, 1, 2, 3, 4, 5]  # dataset order
    lrs = [t.scheduler.get_last_lr()[0]]
    for _ in range(4):
        t.optimizer.step()
        t.scheduler.step()
        lrs.append(t.scheduler.get_last_lr()[0])
    # 4 optimizer steps, warmup 0.5 * 4 = 2: 0, 1/2, 1 of the peak, then constant
    assert lrs[:3] == pytest.approx([0.0, 5e-3, 1e-2]) and lrs[3:] == pytest.approx([1e-2, 1e-2])
    t2 = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=rows,
                     args=GRPOConfig(**{**cfg.__dict__, "output_dir": str(tmp_path / "run2"), "max_steps": 1}))
    t2.train()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*")) and not (tmp_path / "run2" / "tensorboard").exists()
