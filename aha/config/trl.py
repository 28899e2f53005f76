"""TRL `GRPOConfig` names aha reads (its own fields and the transformers `TrainingArguments` fields it inherits):
aliases translated to aha's fields, fields taken that change nothing in aha, and the fields aha does not have, each
refused with what to use instead. `translate` is applied to every config built, from Python, YAML or the command
line (see `checked` in parse.py); every refused field of a config is reported at once. docs/from-trl.md's tables
are generated from these, and tests/test_config_trl.py checks every field of the installed TRL's GRPOConfig."""

from __future__ import annotations

from typing import Any, Callable

from .errors import ConfigError

SCALE_REWARDS = {"group": "grpo", True: "grpo", "true": "grpo", "batch": "batch_rewards", "none": "dr_grpo",
                 False: "dr_grpo", "false": "dr_grpo"}
"""TRL's scale_rewards -> aha's advantage_estimator: divide r - group mean by the group's std, by the std of the
batch's rewards, or by nothing."""


def _scale_rewards(value: Any, kwargs: dict) -> dict:
    """advantage_estimator: group -> grpo, batch -> batch_rewards, none -> dr_grpo (true/false: group/none)."""
    if value not in SCALE_REWARDS:
        raise ConfigError(f"scale_rewards: {value!r} is not one of ['group', 'batch', 'none', true, false]")
    return {"advantage_estimator": SCALE_REWARDS[value]}


def _log_completions(value: Any, kwargs: dict) -> dict:
    """log_completions_steps: logging_steps when true (TRL logs completions at every logging step), else 0."""
    return {"log_completions_steps": int(kwargs.get("logging_steps", 1)) if value else 0}


def _disable_tqdm(value: Any, kwargs: dict) -> dict:
    """progress_bar: not disable_tqdm (None, transformers' default: the bar shows)."""
    return {} if value is None else {"progress_bar": not value}


def _is_cap(value: Any, kwargs: dict) -> dict:
    """vllm_importance_sampling_clip_max (TRL's deprecated name for it; None: unchanged)."""
    return {} if value is None else {"vllm_importance_sampling_clip_max": value}


def _eval_strategy(value: Any, kwargs: dict) -> dict:
    """'steps' without eval_steps evaluates every logging_steps steps, as transformers does; 'no' never."""
    if value in ("no", "none", None):
        if kwargs.get("eval_steps"):
            raise ConfigError(f"eval_strategy={value!r} with eval_steps={kwargs['eval_steps']}: evaluate every "
                              "eval_steps steps ('steps') or never ('no'), not both")
        return {"eval_steps": 0}
    if value != "steps":
        raise ConfigError(f"eval_strategy: {value!r}: aha evaluates every eval_steps steps ('steps') or not ('no')")
    return {"eval_steps": int(kwargs.get("logging_steps", 1))}


ALIASES: dict[str, Callable[[Any, dict], dict]] = {
    "scale_rewards": _scale_rewards,
    "log_completions": _log_completions,
    "eval_strategy": _eval_strategy,
    "evaluation_strategy": _eval_strategy,
    "disable_tqdm": _disable_tqdm,
    "vllm_importance_sampling_cap": _is_cap,
}
"""TRL name -> function(value, all given values) -> aha fields to set."""

UNSUPPORTED: dict[str, str] = {
    "use_vllm": "aha generates with its own KV-cached engine (aha.rollout); there is no vLLM server or colocate mode",
    "max_prompt_length": "prompts are never cut (a prompt longer than the model's context is an error): remove it",
    "save_strategy": "a checkpoint is written every save_steps steps (0: only at the end, always then, so that a run "
                     "can resume): remove it",
    "min_p": "aha's engine samples with temperature, top_p and top_k",
    "repetition_penalty": "aha's engine samples with temperature, top_p and top_k",
    "generation_kwargs": "aha's engine samples with temperature, top_p and top_k",
    "steps_per_generation": "set generation_batch_size (completions per step) and gradient_accumulation_steps",
    "model_init_kwargs": "set dtype and attn_implementation",
    "use_liger_loss": "the loss is aha's own (aha.algos)",
    "wandb_log_unique_prompts": "report_to=wandb logs every completion of a logged step as a table",
    "remove_unused_columns": "every dataset column reaches the reward functions, as TRL does by default",
    "optim": "the optimizer is AdamW (adam_beta1, adam_beta2, weight_decay)",
    "trust_remote_code": "models load with transformers' own code: use a model whose architecture transformers has",
    "router_aux_loss_coef": "aha adds no mixture-of-experts router loss",
    "num_generations_eval": "evaluation decodes one greedy completion per prompt",
    "log_unique_prompts": "report_to=wandb logs every completion of a logged step as a table",
    "log_completions_hub_repo": "completions go to output_dir/completions.jsonl: upload that file",
    "use_transformers_continuous_batching": "aha's own engine (engine=hf) batches continuously with its KV cache",
    "transformers_continuous_batching_config": "aha's own engine (engine=hf) batches continuously with its KV cache",
    "use_transformers_paged": "aha's own engine (engine=hf) batches continuously with its KV cache",
}
"""TRL name -> why aha does not take it, and what to use instead."""

_TRAINING_ARGUMENTS: list[tuple[str, tuple, str]] = [
    ("lr_scheduler_kwargs optim_args optim_target_modules", (None, {}),
     "the optimizer is AdamW with lr_scheduler_type's schedule: remove it"),
    ("adam_epsilon", (1e-8,), "AdamW's epsilon is 1e-8"),
    ("average_tokens_across_devices", (True,), "loss denominators count every learner's tokens"),
    ("label_smoothing_factor", (0, 0.0), "there are no labels to smooth in GRPO"),
    ("bf16_full_eval fp16_full_eval", (False,), "evaluation runs in the training dtype: set dtype"),
    ("tf32", (None, False), "aha leaves TF32 as torch sets it: set torch.backends.cuda.matmul.allow_tf32 in your "
                            "script"),
    ("activation_checkpointing", (None, False), "set gradient_checkpointing"),
    ("activation_checkpointing_kwargs", (None,), "gradient_checkpointing checkpoints every layer (use_reentrant "
                                                 "False)"),
    ("gradient_checkpointing_kwargs", (None, {}, {"use_reentrant": False}),
     "gradient checkpointing runs with use_reentrant=False: remove it"),
    ("torch_compile torch_compile_backend torch_compile_mode", (False, None),
     "the model is not compiled (the engine's decode step on a GPU is replayed from a CUDA graph): remove it"),
    ("use_liger_kernel liger_kernel_config neftune_noise_alpha", (False, None), "the loss is aha's own (aha.algos)"),
    ("auto_find_batch_size", (False,), "a GRPO batch holds whole groups: lower per_device_train_batch_size or set "
                                       "max_tokens_per_micro_batch"),
    ("logging_strategy", ("steps",), "metrics are written every logging_steps steps"),
    ("include_num_input_tokens_seen", ("no", False), "perf/*_tokens_per_s count the tokens"),
    ("log_level", ("passive",), "set the level of the `aha` logger (logging.getLogger('aha').setLevel)"),
    ("project trackio_space_id trackio_bucket_id trackio_static_space_id", (None,),
     "trackers take their project from WANDB_PROJECT / TRACKIO_PROJECT and the run name from run_name"),
    ("eval_delay", (0, 0.0), "evaluation runs at step 0 and every eval_steps"),
    ("eval_accumulation_steps", (None,), "evaluation generates and scores; it accumulates nothing"),
    ("include_for_metrics", ([], None), "evaluation reports rewards and the task's metrics"),
    ("batch_eval_metrics prediction_loss_only eval_use_gather_object", (False,),
     "evaluation generates and scores; transformers' evaluation loop is not used"),
    ("eval_do_concat_batches", (True,), "evaluation generates and scores; transformers' evaluation loop is not used"),
    ("save_only_model", (False,), "checkpoints hold the optimizer and schedule so that a run resumes exactly; the "
                                  "model alone is output_dir/model (save_model)"),
    ("enable_jit_checkpoint", (False,), "a stop signal already writes a checkpoint after the current step"),
    ("hub_token", (None,), "log in with `hf auth login` or set HF_TOKEN"),
    ("hub_private_repo hub_revision", (None,), "push_to_hub uploads the final model once to hub_model_id"),
    ("hub_strategy", ("every_save", "end"), "push_to_hub uploads the final model once to hub_model_id"),
    ("hub_always_push", (False,), "push_to_hub uploads the final model once to hub_model_id"),
    ("load_best_model_at_end", (False,), "the final model is the last step's (checkpoints keep earlier ones)"),
    ("metric_for_best_model greater_is_better", (None,), "the final model is the last step's"),
    ("ignore_data_skip", (False,), "a resume restores the prompt order exactly"),
    ("restore_callback_states_from_checkpoint", (False,), "callbacks are not saved in checkpoints"),
    ("full_determinism", (False,), "runs are seeded (seed); set torch.use_deterministic_algorithms in your script"),
    ("data_seed", (None,), "the prompt order follows seed"),
    ("use_cpu", (False,), "aha trains on CUDA when present: hide the GPUs with CUDA_VISIBLE_DEVICES="),
    ("accelerator_config parallelism_config deepspeed", (None,), "there is no Accelerate or DeepSpeed: learners "
                                                                 "are set by num_learners and learner_sharding"),
    ("fsdp fsdp_config", (None, "", [], False), "set learner_sharding=fsdp with num_learners >= 2"),
    ("ddp_backend", (None,), "learners use gloo on CPU and NCCL on GPU"),
    ("ddp_timeout", (1800,), "set dist_timeout"),
    ("debug", ("", [], None), "remove it"),
    ("dataloader_drop_last", (False,), "prompts are drawn across epoch boundaries: no step is short"),
    ("label_names", (None,), "there are no labels in GRPO"),
    ("train_sampling_strategy", ("random",), "set shuffle_dataset"),
    ("resume_from_checkpoint", (None,), "pass it to train(resume_from_checkpoint=...), or set resume=true"),
]
"""transformers TrainingArguments fields: (names, the values taken as asking for what aha does, why not others)."""
NO_EFFECT: dict[str, str] = {
    **dict.fromkeys(["dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
                     "dataloader_prefetch_factor", "dataloader_multiprocessing_context", "dataloader_in_order",
                     "length_column_name"], "prompts are read in the training process, with no DataLoader"),
    **dict.fromkeys(["ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph",
                     "local_rank"], "learners all-reduce their gradients themselves (num_learners)"),
    **dict.fromkeys(["log_on_each_node", "log_level_replica", "save_on_each_node"],
                    "the driver alone logs and saves"),
    "logging_nan_inf_filter": "each step's values are written; a non-finite one as null",
    "skip_memory_metrics": "no memory metrics are added",
    "torch_empty_cache_steps": "a memory setting that changes no result; aha does not empty the CUDA cache",
    "use_cache": "training passes never use the KV cache; the engine always does",
    "eval_on_start": "with eval_steps set, aha evaluates at step 0 anyway (the start of the curve)",
    **dict.fromkeys(["do_train", "do_eval", "do_predict"], "read by scripts, not by the trainer (as in transformers)"),
    "log_multimodal": "aha trains text models",
    "ds3_gather_for_generation": "there is no DeepSpeed integration",
    "pad_to_multiple_of": "padding changes no result; each pass is padded to its longest sequence",
    "cache_implementation": "the engine keeps its own KV cache",
    "per_device_eval_batch_size": "evaluation decodes up to generation_max_batch sequences at once",
    "cast_lm_head_to_fp32": "log-probabilities are computed in float32 from the logits whatever the weights' dtype",
}
"""TRL and transformers fields taken at any value, and why nothing changes in aha."""

TRL_SENTINELS: dict[str, dict] = {"output_dir": {None: None}, "eval_steps": {None: None}, "bf16": {None: None},
                                  "max_steps": {-1: 0}, "save_total_limit": {None: 0}}
"""aha fields whose TRL/transformers default is a placeholder: value -> aha's value for the same meaning (None:
aha's default, or an alias's choice). max_steps -1: from num_train_epochs; save_total_limit None: keep all."""

ALREADY: dict[str, tuple] = {
    "use_vllm": (False,), "remove_unused_columns": (False,), "save_strategy": ("steps",),
    "optim": ("adamw_torch", "adamw_torch_fused"), "max_prompt_length": (None,), "steps_per_generation": (None,),
    "model_init_kwargs": (None,), "use_liger_loss": (False, None), "min_p": (None,), "repetition_penalty": (1.0, 1),
    "generation_kwargs": (None,), "trust_remote_code": (False,),
    "router_aux_loss_coef": (None, 0, 0.0), "num_generations_eval": (None,),
    "log_unique_prompts": (False,), "wandb_log_unique_prompts": (False,),
    "log_completions_hub_repo": (None,), "use_transformers_continuous_batching": (False,),
    "transformers_continuous_batching_config": (None,), "use_transformers_paged": (False,),
}
"""Values of unsupported TRL fields that ask for what aha does anyway: taken, and nothing changes."""
for _names, _taken, _why in _TRAINING_ARGUMENTS:
    for _name in _names.split():
        UNSUPPORTED[_name], ALREADY[_name] = _why, _taken


def translate(kwargs: dict[str, Any], fields: set[str]) -> tuple[dict[str, Any], list[str]]:
    """Replace TRL aliases by aha's `fields` (an explicit aha field wins), drop the fields that change nothing, map
    TRL's placeholder values; returns the values and one message per refused TRL field (the caller reports them
    all). A name that is one of `fields` is aha's own and passes through."""
    out = {k: v for k, v in kwargs.items() if k in fields or k not in ALIASES}
    refused = []
    for key, value in kwargs.items():
        if key in fields:
            if key in TRL_SENTINELS and _same(value, TRL_SENTINELS[key]):
                mapped = TRL_SENTINELS[key][value]
                if mapped is None:
                    out.pop(key)
                else:
                    out[key] = mapped
            continue
        if key in ALIASES:
            for field, mapped in ALIASES[key](value, kwargs).items():
                out.setdefault(field, mapped)
        if key in NO_EFFECT or key in ALREADY and _same(value, ALREADY[key]):
            out.pop(key, None)
            continue
        if key.startswith("vllm_") and kwargs.get("use_vllm") is not True:  # inert without vLLM, as in TRL
            out.pop(key, None)
            continue
        if key in UNSUPPORTED or key.startswith("vllm_"):
            why = UNSUPPORTED.get(key, UNSUPPORTED["use_vllm"])
            refused.append(f"'{key}' is a TRL GRPOConfig field aha does not support: {why}")
            out.pop(key, None)
    return out, refused


def _same(value: Any, values) -> bool:
    """`value` is one of `values`, of the same type (so True is not 1, nor 0.0 False)."""
    return any(type(value) is type(v) and value == v for v in values)


TRL_VERSION = "1.16.0"
"""The TRL release whose GRPOConfig fields are decided below (the test extra pins it)."""
TRL_FIELDS = tuple("""
model_init_kwargs trust_remote_code router_aux_loss_coef disable_dropout cast_lm_head_to_fp32 num_generations
num_generations_eval max_completion_length ds3_gather_for_generation shuffle_dataset pad_to_multiple_of
generation_batch_size steps_per_generation temperature top_p top_k min_p generation_kwargs
chat_template_kwargs repetition_penalty cache_implementation use_vllm vllm_mode vllm_model_impl
vllm_enable_sleep_mode vllm_structured_outputs_regex vllm_server_base_url vllm_server_host vllm_server_port
vllm_server_timeout vllm_group_port vllm_gpu_memory_utilization vllm_max_model_length
vllm_tensor_parallel_size beta num_iterations epsilon delta epsilon_high sapo_temperature_neg
sapo_temperature_pos vespo_k_pos vespo_lambda_pos vespo_k_neg vespo_lambda_neg importance_sampling_level
reward_weights multi_objective_aggregation scale_rewards loss_type mask_truncated_completions sync_ref_model
ref_model_mixup_alpha ref_model_sync_steps top_entropy_quantile entropy_coef use_adaptive_entropy
entropy_coef_min entropy_coef_max entropy_coef_delta entropy_target max_tool_calling_iterations
vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_importance_sampling_clip_max
vllm_importance_sampling_clip_min off_policy_mask_threshold use_bias_correction_kl log_completions
log_multimodal num_completions_to_print log_unique_prompts log_completions_hub_repo
use_transformers_continuous_batching transformers_continuous_batching_config use_transformers_paged
vllm_importance_sampling_cap""".split())
"""TRL's GRPOConfig's own fields (beside those it inherits from transformers' TrainingArguments), in its order."""


def decide(name: str, fields: set[str]) -> tuple[str, str] | None:
    """What aha does with TRL field `name`, as (taken | translated | no effect | refused, why), given aha's config
    `fields`; None for a field aha has not decided on."""
    if name in fields:
        return "taken", "aha's field of the same name"
    if name in ALIASES:
        return "translated", " ".join((ALIASES[name].__doc__ or "").split()) or f"sets {name}'s aha fields"
    if name in NO_EFFECT:
        return "no effect", NO_EFFECT[name]
    if name.startswith("vllm_"):
        return "no effect", "inert without use_vllm, as in TRL (use_vllm=true is refused)"
    if name in UNSUPPORTED:
        taken = ", ".join(repr(v) for v in ALREADY.get(name, ()))
        return "refused", UNSUPPORTED[name] + (f" (taken: {taken}, which ask for what aha does)" if taken else "")
    return None
