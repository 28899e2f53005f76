"""TRL `GRPOConfig` names aha reads: aliases translated to aha's fields, and the fields aha does not have,
each refused with what to use instead. `translate` is applied to every config built, from Python, YAML or
the command line (see `checked` in parse.py). The README's "From TRL" table lists the same."""

from __future__ import annotations

from typing import Any, Callable

from .errors import ConfigError

SCALE_REWARDS = {"group": "grpo", True: "grpo", "true": "grpo", "batch": "batch_rewards", "none": "dr_grpo",
                 False: "dr_grpo", "false": "dr_grpo"}
"""TRL's scale_rewards -> aha's advantage_estimator: divide r - group mean by the group's std, by the std of the
batch's rewards, or by nothing."""


def _scale_rewards(value: Any, kwargs: dict) -> dict:
    if value not in SCALE_REWARDS:
        raise ConfigError(f"scale_rewards: {value!r} is not one of ['group', 'batch', 'none', true, false]")
    return {"advantage_estimator": SCALE_REWARDS[value]}


def _log_completions(value: Any, kwargs: dict) -> dict:
    """TRL logs completions at every logging step when log_completions is true."""
    return {"log_completions_steps": int(kwargs.get("logging_steps", 1)) if value else 0}


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
}
"""TRL name -> function(value, all given values) -> aha fields to set."""

UNSUPPORTED: dict[str, str] = {
    "use_vllm": "aha generates with its own KV-cached engine (aha.rollout); there is no vLLM server or colocate mode",
    "max_prompt_length": "prompts are never cut: a prompt longer than the model's context is an error",
    "save_strategy": "checkpoints every save_steps steps (0: only at the end)",
    "per_device_eval_batch_size": "evaluation decodes up to generation_max_batch sequences at once",
    "min_p": "aha's engine samples with temperature, top_p and top_k",
    "repetition_penalty": "aha's engine samples with temperature, top_p and top_k",
    "generation_kwargs": "aha's engine samples with temperature, top_p and top_k",
    "steps_per_generation": "set generation_batch_size (completions per step) and gradient_accumulation_steps",
    "model_init_kwargs": "set dtype and attn_implementation",
    "use_liger_loss": "the loss is aha's own (aha.algos)",
    "wandb_log_unique_prompts": "report_to=wandb logs every completion of a logged step as a table",
    "remove_unused_columns": "every dataset column reaches the reward functions, as TRL does by default",
    "cast_lm_head_to_fp32": "log-probabilities are computed in float32 whatever the weights' dtype",
    "ds3_gather_for_generation": "there is no DeepSpeed integration",
    "optim": "the optimizer is AdamW (adam_beta1, adam_beta2, weight_decay)",
}
"""TRL name -> why aha does not take it, and what to use instead."""

ALREADY: dict[str, tuple] = {
    "use_vllm": (False,), "remove_unused_columns": (False,), "save_strategy": ("steps",),
    "optim": ("adamw_torch", "adamw_torch_fused"), "max_prompt_length": (None,), "steps_per_generation": (None,),
    "model_init_kwargs": (None,), "use_liger_loss": (False, None), "min_p": (None,), "repetition_penalty": (1.0, 1),
    "generation_kwargs": (None,), "cast_lm_head_to_fp32": (True,),
}
"""Values of unsupported TRL fields that ask for what aha does anyway: taken, and nothing changes."""


def translate(kwargs: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """Replace TRL aliases by aha's `fields` (an explicit aha field wins); refuse unsupported TRL fields.
    A name that is one of `fields` is aha's own and passes through."""
    out = {k: v for k, v in kwargs.items() if k in fields or k not in ALIASES}
    for key, value in kwargs.items():
        if key in fields:
            continue
        if key in ALIASES:
            for field, mapped in ALIASES[key](value, kwargs).items():
                out.setdefault(field, mapped)
        if key in ALREADY and any(type(value) is type(v) and value == v for v in ALREADY[key]):
            out.pop(key, None)
            continue
        if key in UNSUPPORTED or key.startswith("vllm_"):
            why = UNSUPPORTED.get(key, UNSUPPORTED["use_vllm"])
            raise ConfigError(f"'{key}' is a TRL GRPOConfig field aha does not support: {why}")
    return out
