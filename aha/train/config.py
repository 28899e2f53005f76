"""One flat config per training stage. Field names follow TRL's where TRL has the same knob."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from ..config import checked_keys


@dataclass
class TrainConfig:
    """What every training stage shares: model, LoRA, optimiser, logging, checkpoints."""

    output_dir: str = "runs/train"
    """Run directory: metrics, config, checkpoints and the final model go here."""
    model: str = ""
    """Policy model: hub id in the local cache, local directory, or a known short name."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype."""
    attn_implementation: Optional[str] = None
    """transformers attention backend (sdpa, eager, flash_attention_2); None = library default."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    use_lora: bool = False
    """Train LoRA adapters (peft) instead of all weights."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA path."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Modules that get adapters; "all-linear" = every linear layer but the output head."""
    save_merged: bool = True
    """With LoRA, save the final model with adapters merged (else save the adapter only)."""
    learning_rate: float = 1e-6
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""
    lr_scheduler_type: Literal["constant", "cosine", "linear"] = "constant"
    """Learning-rate shape after warmup."""
    warmup_steps: int = 0
    """Linear warmup, in optimizer steps."""
    per_device_train_batch_size: int = 8
    """Sequences per forward/backward pass (micro-batch)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches summed into one optimizer step."""
    max_steps: int = 100
    """Training steps (GRPO: generate-score-update rounds; SFT: optimizer steps)."""
    seed: int = 42
    """Seed for data order, sampling and initialisation."""
    logging_steps: int = 1
    """Write metrics every this many steps."""
    report_to: list[str] = field(default_factory=lambda: ["jsonl", "tensorboard"])
    """Metric sinks: jsonl, tensorboard (both write into output_dir)."""
    save_steps: int = 0
    """Checkpoint every this many steps (0: only at the end)."""
    save_total_limit: int = 2
    """Keep at most this many checkpoints (oldest removed first)."""
    resume: bool = False
    """Continue from the last complete checkpoint in output_dir."""
    progress_bar: bool = True
    """Show a terminal progress bar."""
    threads: int = 0
    """torch CPU threads (0: torch's default)."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """NaN/inf loss or grad norm: stop with an error (nothing saved from it), or skip the update (counted)."""


@checked_keys
@dataclass
class GRPOConfig(TrainConfig):
    """GRPO: sample a group per prompt, score it, group-relative advantages, clipped update."""

    output_dir: str = "runs/grpo"
    """Run directory: metrics, config, checkpoints and the final model go here."""
    task: Optional[str] = None
    """A registered task (dataset, prompt format and rewards in one name), e.g. arithmetic, gsm8k."""
    dataset: Optional[str] = None
    """Training data as a JSONL file with a prompt column (overrides the task's data)."""
    prompt_column: str = "prompt"
    """Column holding the prompt (a string or a list of chat messages)."""
    reward_funcs: list[str] = field(default_factory=list)
    """Reward names from aha.rewards (math, format, ...) or module:function (overrides the task's)."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Per-reward constructor arguments, e.g. {math: {answer_column: gold}}."""
    reward_weights: Optional[list[float]] = None
    """Weight of each reward function in the sum (default: all 1)."""
    num_generations: int = 8
    """Completions sampled per prompt (the group size G)."""
    generation_batch_size: Optional[int] = None
    """Completions per step, B*G (default: per_device_train_batch_size * gradient_accumulation_steps)."""
    max_completion_length: int = 256
    """Most tokens generated per completion."""
    temperature: float = 1.0
    """Sampling temperature (also divides the logits when computing log-probabilities)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = 0
    """Top-k sampling (0: off)."""
    num_iterations: int = 1
    """Passes over each generated batch (mu); >1 reuses samples and needs old log-probs."""
    beta: float = 0.0
    """Weight of the KL penalty to the reference model (0: no reference model at all)."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3."""
    epsilon: float = 0.2
    """Lower clip range: ratio >= 1 - epsilon."""
    epsilon_high: Optional[float] = None
    """Upper clip range (clip-higher, DAPO); None = epsilon."""
    delta: Optional[float] = None
    """Cap on the unclipped ratio (two-sided clipping); None = off."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """token: PPO/GRPO ratios; sequence: GSPO's geometric-mean sequence ratio."""
    advantage_estimator: str = "grpo"
    """grpo (group std), dr_grpo (no std), batch (batch std, REINFORCE++), rloo (leave-one-out)."""
    loss_type: str = "dapo"
    """Loss aggregation: grpo (per-sequence mean), dapo (batch token mean), dr_grpo (fixed length)."""
    mask_truncated_completions: bool = False
    """Leave completions that hit max_completion_length out of the loss."""
    skip_zero_advantage: bool = True
    """With beta=0, skip forward/backward for sequences whose advantage is exactly 0 (same result)."""
    log_completions_steps: int = 10
    """Log sample completions with their rewards every this many steps (0: never)."""
    num_completions_to_print: int = 2
    """How many completions to print when logging them."""
    eval_steps: int = 0
    """Evaluate on the task's held-out split every this many steps (0: never; needs a task)."""
    eval_samples: int = 100
    """Held-out prompts used by the in-training evaluation."""
    generation_max_batch: int = 512
    """Most sequences decoded at once."""

    def __post_init__(self):
        G = self.num_generations
        if G < 2:
            raise ValueError(f"num_generations must be >= 2 for group-relative advantages, got {G}")
        micro, accum = self.per_device_train_batch_size, self.gradient_accumulation_steps
        if micro < 1 or accum < 1:
            raise ValueError("per_device_train_batch_size and gradient_accumulation_steps must be >= 1")
        if self.generation_batch_size is None:
            self.generation_batch_size = micro * accum
        N = self.generation_batch_size
        if N % G:
            raise ValueError(f"generation_batch_size {N} (= per_device_train_batch_size * "
                             f"gradient_accumulation_steps unless set) must be divisible by "
                             f"num_generations {G}")
        if N % (micro * accum):
            raise ValueError(f"generation_batch_size {N} must be divisible by "
                             f"per_device_train_batch_size * gradient_accumulation_steps = {micro * accum}")
        if self.num_iterations < 1:
            raise ValueError("num_iterations must be >= 1")
        if self.reward_weights is not None and self.reward_funcs and \
                len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(f"{len(self.reward_weights)} reward_weights for "
                             f"{len(self.reward_funcs)} reward_funcs")
        from .. import algos  # unknown names fail here, before any model is loaded
        algos.get_advantage(self.advantage_estimator)
        algos.get_aggregation(self.loss_type)
        algos.get_kl(self.kl_estimator)

    @property
    def prompts_per_step(self) -> int:
        """B: distinct prompts sampled each step."""
        return self.generation_batch_size // self.num_generations


@checked_keys
@dataclass
class SFTConfig(TrainConfig):
    """Supervised fine-tuning on prompt/completion pairs or chat messages (loss on completions)."""

    output_dir: str = "runs/sft"
    """Run directory: metrics, config, checkpoints and the final model go here."""
    task: Optional[str] = None
    """A registered task whose worked solutions are the training data."""
    dataset: Optional[str] = None
    """JSONL with prompt/completion columns or a messages column (overrides the task's data)."""
    prompt_column: str = "prompt"
    """Column holding the prompt (string or chat messages)."""
    completion_column: str = "completion"
    """Column holding the target completion."""
    messages_column: str = "messages"
    """Column holding a whole conversation (used when the prompt column is absent)."""
    learning_rate: float = 1e-4
    """Peak learning rate of AdamW."""
    num_train_epochs: float = 1.0
    """Epochs over the data when max_steps is 0."""
    max_steps: int = 0
    """Optimizer steps (0: derived from num_train_epochs)."""
    max_length: int = 1024
    """Longest prompt+completion in tokens; longer examples are an error, not silently cut."""
    eval_samples: int = 100
    """Held-out prompts evaluated at the end (needs a task; 0 disables)."""
