"""aha.config.trl: TRL's GRPOConfig names, translated or refused with a reason, on every path."""

import pytest

from aha.config import ConfigError, GRPOConfig, SFTConfig, parse_args
from aha.config.trl import NO_EFFECT, TRL_FIELDS, TRL_VERSION, UNSUPPORTED, decide


@pytest.mark.parametrize("value, estimator", [("group", "grpo"), (True, "grpo"), ("batch", "batch_rewards"),
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
    assert GRPOConfig(eval_strategy="no").eval_steps == 0
    with pytest.raises(ConfigError, match="eval_strategy='no' with eval_steps=10"):
        GRPOConfig(eval_strategy="no", eval_steps=10)
    # transformers: 'steps' without eval_steps evaluates every logging_steps; an explicit eval_steps wins
    assert GRPOConfig(eval_strategy="steps", logging_steps=5).eval_steps == 5
    assert GRPOConfig(eval_strategy="steps", logging_steps=5, eval_steps=20).eval_steps == 20
    with pytest.raises(ConfigError, match="eval_strategy: 'epoch'"):
        GRPOConfig(eval_strategy="epoch")


@pytest.mark.parametrize("key", ["use_vllm", "max_prompt_length", "steps_per_generation",
                                 "min_p", "repetition_penalty", "torch_compile", "save_only_model"])
def test_unsupported_trl_fields_say_so_and_what_to_use(key):
    with pytest.raises(ConfigError, match=rf"'{key}' is a TRL GRPOConfig field aha does not support: \w"):
        GRPOConfig(**{key: 2})
    with pytest.raises(ConfigError, match=rf"'{key}' is a TRL GRPOConfig field aha does not support"):
        parse_args(GRPOConfig, [f"{key}=2"])


def test_trl_settings_that_ask_for_what_aha_does_are_taken():
    given = dict(use_vllm=False, remove_unused_columns=False, save_strategy="steps", optim="adamw_torch",
                 max_prompt_length=None, repetition_penalty=1.0)
    assert GRPOConfig(**given) == GRPOConfig()
    assert parse_args(GRPOConfig, ["use_vllm=false", "optim=adamw_torch", "max_prompt_length=null"]) == GRPOConfig()
    for key, value in [("use_vllm", True), ("save_strategy", "no"), ("optim", "sgd"), ("max_prompt_length", 512)]:
        with pytest.raises(ConfigError, match=rf"'{key}' is a TRL GRPOConfig field aha does not support"):
            GRPOConfig(**{key: value})


def test_a_name_that_is_an_aha_field_is_never_refused():
    assert SFTConfig(num_train_epochs=2.0).num_train_epochs == 2.0  # SFT has it; GRPO does not
    assert "optim" in UNSUPPORTED and SFTConfig.__dataclass_fields__.get("optim") is None
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


def _trainer(tiny_dir, tmp_path, **kw):
    from aha.train.grpo import GRPOTrainer

    def digit_share(prompts, completions, **kw):  # spread inside every group
        return [float(sum(map(ord, c)) % 3) for c in completions]

    base = dict(output_dir=str(tmp_path / "run"), num_generations=4, per_device_train_batch_size=8,
                max_completion_length=4, learning_rate=1e-2, progress_bar=False, report_to=["none"],
                log_completions_steps=0)
    return GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=GRPOConfig(**{**base, **kw}),
                       train_dataset=[{"prompt": f"{a}+{b}="} for a in range(10) for b in range(3)])


def test_num_train_epochs_sets_the_steps_from_the_dataset(tiny_dir, tmp_path):
    t = _trainer(tiny_dir, tmp_path, num_train_epochs=0.2)  # 30 prompts, 2 a step: ceil(0.2 * 30 / 2) = 3
    assert t.max_steps == 3
    t.train()
    assert t.step_count == 3


def test_a_set_max_steps_wins_over_num_train_epochs(tiny_dir, tmp_path):
    """TRL's rule: a positive max_steps overrides num_train_epochs; neither set: 100 steps."""
    assert _trainer(tiny_dir, tmp_path / "a", num_train_epochs=1.0, max_steps=2).max_steps == 2
    assert _trainer(tiny_dir, tmp_path / "b", num_train_epochs=1.0).max_steps == 15  # 30 prompts, 2 a step
    assert GRPOConfig().max_steps == 100 and GRPOConfig(num_train_epochs=1.0).max_steps == 0


def test_sync_ref_model_mixes_the_policy_into_the_reference(tiny_dir, tmp_path):
    import torch
    t = _trainer(tiny_dir, tmp_path, max_steps=2, beta=0.1, sync_ref_model=True, ref_model_sync_steps=2,
                 ref_model_mixup_alpha=0.5)
    ref0 = {n: p.clone() for n, p in t.ref_model.named_parameters()}
    t.step()
    t.step_count = 1
    assert all(torch.equal(ref0[n], p) for n, p in t.ref_model.named_parameters())  # step 1: no sync
    t.step()
    policy = dict(t.model.named_parameters())
    for n, p in t.ref_model.named_parameters():  # step 2: ref = 0.5 policy + 0.5 ref
        torch.testing.assert_close(p, 0.5 * policy[n].detach() + 0.5 * ref0[n], rtol=0, atol=1e-7)
    with pytest.raises(ConfigError, match="sync_ref_model needs a reference model: set beta > 0"):
        GRPOConfig(sync_ref_model=True)
    for kw in (dict(gradient_checkpointing=True), dict(learner_sharding="fsdp", num_learners=2)):
        with pytest.raises(ConfigError, match="share_prompts .* do not support"):
            GRPOConfig(share_prompts=True, **kw)


def test_disable_dropout_and_top_entropy_quantile(tiny_dir, tmp_path):
    import torch
    t = _trainer(tiny_dir, tmp_path, max_steps=1, disable_dropout=True, top_entropy_quantile=0.2)
    assert all(m.p == 0.0 for m in t.model.modules() if isinstance(m, torch.nn.Dropout))
    assert all(m.attention_dropout == 0.0 for m in t.model.modules() if hasattr(m, "attention_dropout"))
    m = t.train()
    assert m["train/trained_frac"] > 0 and m["grad_norm"] > 0


def test_a_model_object_gets_gradient_checkpointing_as_a_path_does(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from aha.train.grpo import GRPOTrainer
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    on = lambda m: any(getattr(x, "gradient_checkpointing", False) for x in m.modules())  # noqa: E731
    assert not on(model)
    t = GRPOTrainer(model=model, processing_class=AutoTokenizer.from_pretrained(tiny_dir),
                    reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]],
                    args=GRPOConfig(output_dir=str(tmp_path / "run"), num_generations=4, per_device_train_batch_size=8,
                                    gradient_checkpointing=True, report_to=["none"], progress_bar=False),
                    train_dataset=[{"prompt": f"{a}+{a}="} for a in range(10)])
    assert on(t.model)



# ---- every field of TRL's GRPOConfig, read from the installed TRL --------------------------------------------

def _trl_fields():
    trl = pytest.importorskip("trl")
    import dataclasses
    from transformers import TrainingArguments
    assert trl.__version__ == TRL_VERSION, "aha.config.trl decides the fields of the pinned TRL (pyproject: test)"
    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    every = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
             for f in dataclasses.fields(trl.GRPOConfig)}
    return every, [n for n in every if n not in inherited]


def test_every_trl_field_is_taken_or_refused_with_a_reason():
    """A field a new TRL adds fails here until aha decides on it (aha.config.trl)."""
    import dataclasses
    every, own = _trl_fields()
    assert tuple(own) == TRL_FIELDS
    ours = {f.name for f in dataclasses.fields(GRPOConfig)}
    undecided = [name for name in every if decide(name, ours) is None]
    assert not undecided, undecided
    for name, default in every.items():  # at TRL's default: taken, or refused naming the field and why
        try:
            GRPOConfig(**{name: default})
        except ConfigError as e:
            assert f"'{name}' is a TRL GRPOConfig field aha does not support: " in str(e), (name, str(e))
            assert decide(name, ours)[0] == "refused"


def test_a_config_of_every_trl_default_is_taken_but_the_tracker_project():
    every, _ = _trl_fields()
    with pytest.raises(ConfigError) as e:
        GRPOConfig(**every)
    refused = [n for n, v in every.items() if _refused(n, v)]
    assert refused == ["project"]  # transformers' "huggingface": aha's trackers take theirs from the environment
    assert all(f"'{n}' is a TRL GRPOConfig field" in str(e.value) for n in refused)


def _refused(name, value):
    try:
        GRPOConfig(**{name: value})
    except ConfigError:
        return True
    return False


def test_refusals_and_unknown_keys_are_reported_together():
    with pytest.raises(ConfigError) as e:
        GRPOConfig(max_prompt_length=512, tf32=True, learning_rat=1e-3)
    text = str(e.value)
    assert text.startswith("3 config keys are not taken:")
    assert "'max_prompt_length' is a TRL GRPOConfig field aha does not support: prompts are never cut" in text
    assert "remove it" in text and "torch.backends.cuda.matmul.allow_tf32" in text
    assert "unknown config key 'learning_rat' for GRPOConfig; did you mean 'learning_rate'?" in text
    with pytest.raises(ConfigError, match=r"^2 config keys are not taken:\n  'tf32'"):
        parse_args(GRPOConfig, ["tf32=true", "save_strategy=no"])


def test_training_arguments_a_trl_script_inherits():
    assert GRPOConfig(disable_tqdm=True).progress_bar is False
    assert GRPOConfig(disable_tqdm=None).progress_bar is True
    assert GRPOConfig(logging_first_step=True).logging_first_step is True
    taken = dict(dataloader_num_workers=4, torch_compile=False, save_only_model=False, tf32=None, log_level="passive",
                 gradient_checkpointing_kwargs={"use_reentrant": False}, dataloader_pin_memory=True, do_train=True)
    assert GRPOConfig(**taken) == GRPOConfig()
    for key in taken:
        assert key in NO_EFFECT or key in UNSUPPORTED
    # TRL's placeholders: output_dir None and eval_steps None are aha's defaults, max_steps -1 derives the steps
    # from the epochs, save_total_limit None keeps every checkpoint
    assert GRPOConfig(output_dir=None, eval_steps=None, bf16=None) == GRPOConfig()
    assert GRPOConfig(max_steps=-1, num_train_epochs=2.0).max_steps == 0
    assert GRPOConfig(save_total_limit=None).save_total_limit == 0
    assert GRPOConfig(num_completions_to_print=None).num_completions_to_print is None


def test_vllm_settings_are_inert_without_use_vllm():
    assert GRPOConfig(vllm_mode="server", vllm_gpu_memory_utilization=0.5) == GRPOConfig()
    with pytest.raises(ConfigError, match=r"^2 config keys are not taken:\n  'use_vllm'.*\n  'vllm_mode'"):
        GRPOConfig(use_vllm=True, vllm_mode="server")
