"""Every stage's flat config: one dataclass per stage, a one-line docstring per field.

Field names follow TRL's where TRL has the same knob. Values are checked (names, types, ranges)
when the object is built, whether from Python, YAML or the command line, and derived values are
computed once in `__post_init__`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from ..behaviour import DEFAULT_REFLECTION_PHRASES
from .parse import ConfigError, checked

DEFAULT_GRPO_STEPS = 100
"""GRPO steps when neither max_steps nor num_train_epochs is set."""

DType = Literal["float32", "bfloat16", "float16", "auto"]


def require(ok: bool, key: str, rule: str, value: Any) -> None:
    """Raise a ConfigError naming the key, the rule and the value when `ok` is false."""
    if not ok:
        raise ConfigError(f"{key} must be {rule}, got {value!r}")


def require_all(cfg, rules: dict[str, tuple[Any, str]]) -> None:
    """`rules`: key -> (predicate on the value, the rule in words). Checked in order."""
    for key, (pred, rule) in rules.items():
        value = getattr(cfg, key)
        require(pred(value), key, rule, value)


def positive(v) -> bool:
    return v > 0


def non_negative(v) -> bool:
    return v >= 0


def at_least_one(v) -> bool:
    return v >= 1


def finite(pred):
    return lambda v: math.isfinite(v) and pred(v)


@dataclass
class TrainConfig:
    """What every training stage shares: model, LoRA, optimiser, logging, checkpoints."""

    output_dir: str = "runs/train"
    """Run directory: metrics, config, checkpoints and the final model go here."""
    model: str = ""
    """Policy model: hub id in the local cache, local directory, or a known short name."""
    dtype: DType = "float32"
    """Weights dtype (all of training happens in it; for mixed precision keep float32 and set bf16).
    auto: in training, bf16 mixed precision (float32 weights, bfloat16 forward) where the device computes
    bfloat16 natively and float32 elsewhere; in evaluation and sampling, bfloat16 weights where native."""
    bf16: bool = False
    """Mixed precision as in TRL/transformers: forward passes under torch.autocast to bfloat16, weights and
    optimizer state in `dtype`. Fast where the CPU or GPU computes bfloat16 natively."""
    fp16: bool = False
    """Mixed precision in float16 (CUDA only)."""
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
    weight_interpolation: float = 1.0
    """When training ends, the weights become start + weight_interpolation x (trained - start), start being the
    weights training began from (WiSE-FT's weight-space ensemble, WARP's interpolation towards the
    initialisation): 1 keeps the trained weights, 0.5 the midpoint. Full fine-tuning only."""
    learning_rate: float = 1e-6
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.0
    """AdamW weight decay, on weight matrices only (not biases or norm scales), as transformers' Trainer."""
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
    warmup_ratio: float = 0.0
    """Linear warmup as a share of all optimizer steps (TRL's name; used when warmup_steps is 0)."""
    per_device_train_batch_size: int = 8
    """Sequences per forward/backward pass (micro-batch)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches summed into one optimizer step."""
    max_steps: int = 100
    """Training steps (GRPO: generate-score-update rounds; SFT: optimizer steps)."""
    seed: int = 42
    """Seed for data order, sampling and initialisation."""
    logging_steps: int = 1
    """Write metrics every this many steps (and at the last step)."""
    logging_first_step: bool = False
    """Write the first step's metrics too, whatever logging_steps (transformers' name)."""
    report_to: list[Literal["jsonl", "tensorboard", "wandb", "trackio", "none"]] = field(
        default_factory=lambda: ["jsonl", "tensorboard"])
    """Metric sinks beside metrics.jsonl, which every run writes (it is the run's own record, read by the dashboard
    and resume): tensorboard (in output_dir), wandb, trackio (optional packages; GRPO's completion groups go to them
    as tables); none: no other sink."""
    run_name: Optional[str] = None
    """Name of the run in wandb and trackio (default: the output_dir's name)."""
    logging_dir: Optional[str] = None
    """TensorBoard directory (default: output_dir/tensorboard)."""
    save_steps: int = 0
    """Checkpoint every this many steps (0: only at the end)."""
    save_total_limit: int = 2
    """Keep at most this many checkpoints (oldest removed first)."""
    resume: bool = False
    """Continue from the last complete checkpoint in output_dir, with the run's own settings: only how long it trains
    and how it logs, evaluates and saves may change (aha.config.resume.RESUMABLE); any other difference is refused."""
    push_to_hub: bool = False
    """After training, upload the saved model to the Hub repository hub_model_id (huggingface_hub; needs a token)."""
    hub_model_id: Optional[str] = None
    """Hub repository for push_to_hub, e.g. user/model (default: the output_dir's name under your account)."""
    overwrite_output_dir: bool = False
    """Remove an earlier run's files from output_dir first, only where its marker (.aha-run.json) shows an aha run
    wrote them; nothing else there, and never an input (without it, an output_dir with a run's files is refused)."""
    progress_bar: bool = True
    """Show a terminal progress bar."""
    threads: int = 0
    """torch CPU threads (0: torch's default)."""
    eval_steps: int = 0
    """Evaluate on the task's held-out split every this many steps (0: never; needs a task or eval_fn)."""
    eval_samples: int = 100
    """Held-out prompts used by the in-training evaluation."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """NaN/inf loss or grad norm: stop with an error (nothing saved from it), or skip the update (counted)."""

    def __post_init__(self):
        require_all(self, {
            "learning_rate": (finite(non_negative), ">= 0"),
            "weight_decay": (finite(non_negative), ">= 0"),
            "adam_beta1": (lambda v: 0 <= v < 1, "in [0, 1)"),
            "adam_beta2": (lambda v: 0 <= v < 1, "in [0, 1)"),
            "max_grad_norm": (finite(non_negative), ">= 0 (0 disables clipping)"),
            "warmup_steps": (non_negative, ">= 0"),
            "warmup_ratio": (lambda v: 0 <= v < 1, "in [0, 1)"),
            "per_device_train_batch_size": (at_least_one, ">= 1"),
            "gradient_accumulation_steps": (at_least_one, ">= 1"),
            "max_steps": (non_negative, ">= 0"),
            "logging_steps": (at_least_one, ">= 1"),
            "save_steps": (non_negative, ">= 0 (0: save only at the end)"),
            "save_total_limit": (non_negative, ">= 0 (0: keep every checkpoint)"),
            "threads": (non_negative, ">= 0"),
            "lora_r": (at_least_one, ">= 1"),
            "lora_alpha": (positive, "> 0"),
            "lora_dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
            "eval_steps": (non_negative, ">= 0"),
            "eval_samples": (non_negative, ">= 0"),
            "weight_interpolation": (lambda v: 0 <= v <= 1, "in [0, 1] (1: the trained weights)"),
        })
        if self.use_lora and self.weight_interpolation != 1:
            raise ConfigError("weight_interpolation needs full fine-tuning: with LoRA the start is the base with "
                              "adapters whose product, not each factor, would have to be interpolated")
        if self.bf16 and self.fp16:
            raise ConfigError("bf16 and fp16 are both set: choose one mixed precision")


@checked
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
    shuffle_dataset: bool = True
    """Draw prompts in a seeded random order, reshuffled every epoch (false: in dataset order)."""
    balance_by: Optional[str] = None
    """Draw prompts round-robin over the values of this dataset column (e.g. `family`): each value as often as
    another, a rare value's rows repeating sooner, each value's rows in a seeded order of their own. Not with a
    streaming dataset."""
    reward_funcs: list[str] = field(default_factory=list)
    """Reward names from aha.rewards (math, format, ...), module:function, or a reward model's hub id or
    directory, as TRL's (overrides the task's)."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Per-reward constructor arguments, e.g. {math: {answer_column: gold}}."""
    reward_weights: Optional[list[float]] = None
    """Weight of each reward function in the sum (default: all 1)."""
    multi_objective_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize"
    """How several reward functions make one advantage (TRL's): sum_then_normalize, the advantage estimator on their
    weighted sum; normalize_then_sum (GDPO, arXiv 2601.05242), each function normalised within its group, the weighted
    sum normalised over the batch (advantage_estimator becomes gdpo; another one is refused)."""
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
    use_bias_correction_kl: bool = False
    """Multiply each token's KL estimate by the importance ratio pi/pi_old (at importance_sampling_level), gradient
    included, as TRL's: 1 in value on a batch's first pass, but the ratio's gradient adds KL x grad log pi."""
    epsilon: float = 0.2
    """Lower clip range: ratio >= 1 - epsilon."""
    epsilon_high: Optional[float] = None
    """Upper clip range (clip-higher, DAPO); None = epsilon."""
    delta: Optional[float] = None
    """Cap on the unclipped ratio (two-sided clipping); None = off."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """token: PPO/GRPO ratios; sequence: GSPO's geometric-mean sequence ratio."""
    vllm_importance_sampling_correction: bool = False
    """TRL's name, applied to aha's engine: weight each token's loss by pi_old/mu, mu the engine's log-prob of it at
    sampling time, to correct the engine-learner mismatch (off: aha's engine samples with the learner's own weights
    and code; mismatch/* is logged either way)."""
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = \
        "sequence_mask"
    """The correction's weight per token or per sequence (the product of its token ratios), truncated to the bounds or
    set to 0 outside them (TRL's)."""
    vllm_importance_sampling_clip_max: Optional[float] = 3.0
    """The correction's upper bound (None: none)."""
    vllm_importance_sampling_clip_min: Optional[float] = None
    """The correction's lower bound (None: none)."""
    off_policy_mask_threshold: Optional[float] = None
    """DeepSeek-V3.2's off-policy sequence mask: drop negative-advantage sequences whose mean log mu - log pi exceeds
    it (None: off)."""
    advantage_estimator: str = "grpo"
    """grpo (group std), dr_grpo (no std), batch (std of the centred rewards over the batch, REINFORCE++),
    batch_rewards (std of the batch's rewards, TRL's scale_rewards=batch), rloo (leave-one-out), grpo_process
    (DeepSeekMath's process supervision: step rewards give each token its own advantage; outcome only: grpo), gigpo
    (agents: grpo over episodes plus, per turn, grpo over the returns of turns from one anchor state; else grpo)."""
    loss_type: str = "dapo"
    """TRL's loss_type, a (surrogate, aggregation) pair (aha.algos.LOSS_TYPES): grpo (clip, per-sequence mean), dapo
    (clip, batch token mean), dr_grpo (clip, fixed length), bnpo (clip, token mean of each rank's share), luspo (clip,
    per-sequence token sum), cispo (clipped IS weight, MiniMax-M1; epsilon_high is its eps_max), sapo (soft gate),
    vespo (Gamma-shaped sequence weight); the table: docs/training.md."""
    sapo_temperature_pos: float = 1.0
    """loss_type=sapo: temperature of the soft gate on tokens with a positive advantage (arXiv 2511.20347)."""
    sapo_temperature_neg: float = 1.05
    """loss_type=sapo: temperature of the soft gate on tokens with a non-positive advantage."""
    vespo_k_pos: float = 2.0
    """loss_type=vespo: power k of the weight phi(w) = e^(lambda + k log w - lambda w) where A >= 0 (arXiv 2602.10693)."""
    vespo_lambda_pos: float = 3.0
    """loss_type=vespo: decay lambda of phi where A >= 0."""
    vespo_k_neg: float = 3.0
    """loss_type=vespo: power k of phi where A < 0."""
    vespo_lambda_neg: float = 2.0
    """loss_type=vespo: decay lambda of phi where A < 0."""
    mask_truncated_completions: bool = False
    """Leave completions that hit max_completion_length out of the loss (they still count in the grpo and dr_grpo
    losses' number of sequences, as in TRL)."""
    skip_zero_advantage: bool = True
    """With beta=0 (and top_entropy_quantile=1), skip forward/backward for sequences whose advantage is exactly 0
    (same result)."""
    max_tokens_per_micro_batch: Optional[int] = None
    """Padded tokens per forward/backward pass. null: aha chooses per batch from its lengths and the device's
    memory (aha.train.passes; on a CPU length-sorted passes of <= 1,024 tokens once a sequence is over 256 tokens,
    on a GPU cut only to fit memory), and logs the rule once and each step's choice as perf/pass_tokens. 0: every
    pass takes per_device_train_batch_size sequences. N > 0: length-sorted sequences are grouped so that no pass
    pads past N tokens (sequences x (longest prompt + longest completion)), at most per_device_train_batch_size
    of them; a longer sequence goes alone. Same loss and gradient (denominators count the whole minibatch); less
    padding and a memory bound when completion lengths spread. Applies to the reference and old-policy passes
    too. One exception: top_entropy_quantile < 1 takes its entropy threshold per pass (as TRL does per
    micro-batch), so other passes give other thresholds."""
    share_prompts: Optional[bool] = None
    """Run each distinct prompt once per forward/backward pass and let its completions attend to its KV cache,
    instead of once per completion: the same log-probs and gradients up to float summation order, and a GRPO
    group of G costs one prompt pass instead of G (worth most when prompts are long against completions).
    Micro-batches then hold whole groups, ordered by their longest sequence. Not with gradient_checkpointing
    or learner_sharding=fsdp. null: decided on the run's first batch, on if its prompts repeat (where those two
    allow it); logged, and recorded each step as perf/share_prompts."""
    log_completions_steps: int = 10
    """Log sample completions with their rewards every this many steps and at the last step (0: never)."""
    num_completions_to_print: Optional[int] = 2
    """How many completions to print when logging them (None: all, as TRL's)."""
    engine: str = "hf"
    """Generation engine by name (aha.rollout.engines.ENGINES): hf, the in-process KV-cached engine."""
    generation_max_batch: int = 512
    """Most sequences decoded at once (it bounds the KV cache's memory). The prompts beyond it wait for the next
    batch; with AHA_ADMIT_FRACTION=0.25 in the environment their rows join the running batch as its rows finish
    (Llama-layout models decoded without CUDA graphs; see aha/rollout/hf.py)."""
    max_steps: int = 0
    """GRPO steps (generate-score-update rounds). 0: num_train_epochs' worth when that is set, else 100. A
    positive value wins over num_train_epochs, as in TRL."""
    num_train_epochs: Optional[float] = None
    """Passes over the training prompts; with max_steps 0, the steps are derived from the dataset size (TRL's name)."""
    disable_dropout: bool = False
    """Set every dropout probability of the policy and reference to 0, so log-probs are deterministic."""
    sync_ref_model: bool = False
    """Every ref_model_sync_steps, move the reference toward the policy: ref = a*policy + (1-a)*ref (TR-DPO)."""
    ref_model_sync_steps: int = 512
    """Steps between reference syncs (with sync_ref_model)."""
    ref_model_mixup_alpha: float = 0.6
    """The a of the reference sync."""
    top_entropy_quantile: float = 1.0
    """Train the policy loss on the top share of tokens by entropy only (1.0: all tokens; 0.2 in the paper)."""
    entropy_coef: float = 0.0
    """Entropy bonus: the loss becomes loss - entropy_coef x H, H the mean per-token entropy over the tokens the policy
    loss uses (after top_entropy_quantile), whatever the loss_type (TRL's). With use_adaptive_entropy: the start."""
    use_adaptive_entropy: bool = False
    """Adaptive entropy control (Skywork-OR1, as TRL): after each optimizer step entropy_coef rises by
    entropy_coef_delta when that step's H is at or below entropy_target, else falls by it; the bonus applies only to
    a step after one whose H was at or below the target. Saved in checkpoints; logged as entropy_coef."""
    entropy_coef_min: float = 0.0
    """Lower bound of the adaptive entropy_coef."""
    entropy_coef_max: float = 1.0
    """Upper bound of the adaptive entropy_coef."""
    entropy_coef_delta: float = 0.005
    """Step of the adaptive entropy_coef at each optimizer step."""
    entropy_target: float = 0.2
    """Adaptive control's target H in nats (TRL's default 0.2 acts only on a near-collapsed entropy: set it near the
    `entropy/policy_tokens` a run logs early on)."""
    positive_nll_coef: float = 0.0
    """VAPO's positive-example LM loss (arXiv 2504.05118, which uses 0.1): the loss becomes loss + positive_nll_coef x
    NLL, NLL the mean negative log-likelihood of the model tokens of the batch's positive episodes (reward at least
    positive_reward; log-probs at the sampling temperature, as the policy loss's), a plain token mean whatever the
    loss_type. It keeps learning from successes whatever their group's spread: a group whose episodes all succeed
    carries advantage 0, so without it only the KL term holds that behaviour while other groups move the tokens it
    shares with them. Logged as positive/nll and positive/frac (the share of episodes counted positive). On the agent
    demo it raised sampled success, not greedy (BENCHMARKS.md)."""
    positive_reward: float = 1.0
    """The least reward (the weighted sum over reward functions) of an episode positive_nll_coef trains on: 1.0, a
    verifier's pass."""
    reward_fail_steps: int = 3
    """Stop the run when one reward function has raised or timed out on this many consecutive steps (0: never)."""
    reward_timeout: float = 300.0
    """Wall-clock seconds each reward function call may take; past it, that call's rewards are excluded and
    counted in reward/call_timeouts (the run goes on; a call that swallows the cut and runs 10 s more ends the run,
    aha.rewards.deadline.STUCK_GRACE_S)."""
    stream_rewards: bool = False
    """Score each prompt's G completions as soon as they are all finished, on a helper thread, while the engine
    decodes the rest. Each reward function is then called once per group instead of once per batch (the rewards
    are the same for functions that score each completion on its own, as TRL's do), and off the main thread, so
    a synchronous call past reward_timeout is abandoned on its daemon thread instead of interrupted."""
    reflection_phrases: list[str] = field(default_factory=lambda: list(DEFAULT_REFLECTION_PHRASES))
    """Phrases counted as reflection in behaviour/reflection_rate (case-insensitive, whole words)."""
    correct_reward: Optional[str] = None
    """Reward function whose value decides "correct" for the behaviour/ metrics (None: the first one)."""
    correct_threshold: float = 1.0
    """A completion is correct when correct_reward gives at least this."""
    log_groups_steps: int = 10
    """Write whole groups with per-token log-prob, ratio, clip, KL and loss share to groups.jsonl every this
    many steps and at the last step (0: never)."""
    log_groups_max: int = 2
    """Most groups written per logged step (the first ones of the batch)."""
    log_groups_max_mb: float = 50.0
    """Size cap of groups.jsonl in MB; once reached, no more groups are written (a warning says so)."""
    dashboard: bool = False
    """`aha train`: serve this run on the local dashboard while it trains (from Python: aha.dashboard.serve_in_background)."""
    dashboard_port: int = 8765
    """Port of the dashboard served with dashboard=true (on 127.0.0.1)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose rewards have no spread and sample more until the batch is full."""
    dynamic_sampling_max_rounds: int = 4
    """Extra sampling rounds per step at most (dynamic_sampling); after them the step trains on what it has."""
    keep_groups_by_std: float = 1.0
    """Train on this share of each step's groups (at least one), those whose rewards spread most (largest std;
    RAGEN's rollout filter, arXiv 2504.20073), after dynamic sampling; the others are left out of the update, KL term
    included (1: keep every group)."""
    replay_buffer_size: int = 0
    """TRL's GRPOWithReplayBuffer: keep this many past groups whose rewards spread most, and replace each group
    of a step whose rewards are all equal by one drawn from them (0: off; TRL's default 64)."""
    # Agents: tools and environments with TRL's contract (aha.envs). From Python, GRPOTrainer(tools=[...],
    # environment_factory=...) takes the objects themselves.
    tools: list[str] = field(default_factory=list)
    """Tools every episode may call, as module:function (plain sync or async functions with type hints and a
    Google docstring, as TRL's `tools=`); a module beside you is found as reward functions are."""
    environment: Optional[str] = None
    """An environment class as module:Class (TRL's `environment_factory=`): one per episode, reset(**row) starts
    it, its public methods are tools, an optional get_reward() scores the episode."""
    max_tool_calling_iterations: Optional[int] = None
    """Rounds of tool calls an episode may make (TRL's name); a turn that calls tools after them ends the episode,
    truncated. None: no limit but max_completion_length."""
    tool_timeout: float = 30.0
    """Wall-clock seconds one tool call, or an environment's reset, may take; past it the model gets an error message
    instead (counted in tools/timeouts), the call is abandoned and its environment retired (a reset past it is an
    error)."""
    rejoin_episodes: bool = True
    """An episode's next turn rejoins the running decode batch at the step its turn ended, its tools run then (the
    hf engine; aha.rollout.turns). The batch waits while a step's tools run, and turns end at many steps, so tools
    slower than about 0.1 s a call are faster in rounds (false: one engine call a round for every episode, the
    round's tools run once); BENCHMARKS.md "Agent episodes": 1.82x a step with an instant tool, 0.81x at 0.2 s."""
    chat_template_kwargs: Optional[dict[str, Any]] = None
    """Extra arguments to the chat template for every chat prompt (TRL's name), e.g. {enable_thinking: false}."""
    # The system at scale (aha.dist, on Ray). At these defaults everything runs in this one process, without Ray.
    num_rollout_workers: int = 0
    """Ray actors generating rollouts, each with a policy copy (0: generate in the training process)."""
    num_reward_workers: int = 0
    """Ray actors scoring completions while the next ones are generated (0: score in the training process)."""
    num_learners: int = 1
    """Data-parallel learners (torch.distributed, gloo); more than 1 run as Ray actors."""
    learner_sharding: Literal["replicate", "fsdp"] = "replicate"
    """replicate: every learner holds the whole model (DDP's arithmetic: one gradient all-reduce per optimizer
    step); fsdp: parameters, gradients and optimizer state sharded over the learners (FSDP2 fully_shard)."""
    max_staleness: int = 0
    """Weight versions a trained batch may lag behind (0: on-policy); k > 0 generates the next k steps while
    this one trains (needs num_rollout_workers >= 1), and stale tokens get a behaviour importance weight."""
    off_policy_is_cap: float = 2.0
    """Truncation of the behaviour importance weight pi_prox/mu of stale tokens (decoupled PPO, truncated IS)."""
    ray_address: Optional[str] = None
    """Ray cluster to join ("auto", or host:port); None starts a local Ray instance bound to 127.0.0.1."""
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_SPREAD"] = "PACK"
    """How the workers' placement group spreads them over nodes."""
    dist_timeout: float = 600.0
    """Seconds any remote call or collective may take before the run fails naming the component."""
    max_worker_restarts: int = 3
    """Times Ray restarts a dead rollout or reward worker (its in-flight prompts are re-issued)."""
    # A learned process reward model (aha.rewards.prm), e.g. one `aha prm` trained.
    prm_model: str = ""
    """A PRM (token classification, TRL's PRMTrainer format) whose P(good) of each step is one more reward function,
    "prm", after the others: a step reward (empty: none)."""
    prm_weight: float = 1.0
    """The PRM's weight in the sum (reward_weights then weigh the other reward functions only)."""
    prm_step_separator: Optional[str] = None
    """What separates steps for the PRM (None: the step_separator in the PRM's config.json, else TRL's "\\n")."""
    prm_batch_size: int = 16
    """Completions per PRM forward pass (it runs without gradients on the policy's device)."""

    def __post_init__(self):
        super().__post_init__()
        self._check_distributed()
        require_all(self, {
            "dynamic_sampling_max_rounds": (non_negative, ">= 0"),
            "keep_groups_by_std": (lambda v: 0 < v <= 1, "in (0, 1]"),
            "replay_buffer_size": (non_negative, ">= 0 (0: off)"),
            "num_generations": (lambda v: v >= 2, ">= 2 for group-relative advantages"),
            "max_completion_length": (at_least_one, ">= 1"),
            "temperature": (finite(positive), "> 0 (GRPO samples from the policy and divides its logits by the "
                                              "temperature; greedy decoding is for `aha eval`)"),
            "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
            "top_k": (non_negative, ">= 0 (0: off)"),
            "num_iterations": (at_least_one, ">= 1"),
            "beta": (finite(non_negative), ">= 0"),
            "epsilon": (lambda v: 0 < v < 1, "in (0, 1)"),
            "epsilon_high": (lambda v: v is None or v > 0, "> 0 or null"),
            "delta": (lambda v: v is None or v > 1, "> 1 or null"),
            "generation_max_batch": (at_least_one, ">= 1"),
            "max_tokens_per_micro_batch": (lambda v: v is None or v >= 0,
                                           ">= 0 (0: per_device_train_batch_size sequences) or null (aha chooses)"),
            "log_completions_steps": (non_negative, ">= 0"),
            "num_completions_to_print": (lambda v: v is None or v >= 0, ">= 0 or null (all)"),
            "reward_timeout": (positive, "> 0 seconds"),
            "reward_fail_steps": (non_negative, ">= 0 (0: never stop)"),
            "num_train_epochs": (lambda v: v is None or v > 0, "> 0 or null"),
            "ref_model_sync_steps": (at_least_one, ">= 1"),
            "ref_model_mixup_alpha": (lambda v: 0 <= v <= 1, "in [0, 1]"),
            "top_entropy_quantile": (lambda v: 0 <= v <= 1, "in [0, 1]"),
            "correct_threshold": (math.isfinite, "a finite number"),
            "log_groups_steps": (non_negative, ">= 0 (0: never)"),
            "log_groups_max": (at_least_one, ">= 1"),
            "log_groups_max_mb": (finite(positive), "> 0"),
            "dashboard_port": (lambda v: 0 <= v < 65536, "in [0, 65535] (0: any free port)"),
            "max_tool_calling_iterations": (lambda v: v is None or v >= 0, ">= 0 or null (no limit)"),
            "tool_timeout": (positive, "> 0 seconds"),
            "prm_weight": (math.isfinite, "a finite number"),
            "prm_batch_size": (at_least_one, ">= 1"),
            "prm_step_separator": (lambda v: v is None or v != "", 'a non-empty string or null (the PRM\'s own)'),
        })
        if self.max_steps == 0 and self.num_train_epochs is None:
            self.max_steps = DEFAULT_GRPO_STEPS
        self._check_batch()
        if self.reward_weights is not None and self.reward_funcs and \
                len(self.reward_weights) != len(self.reward_funcs):
            raise ConfigError(f"{len(self.reward_weights)} reward_weights for "
                              f"{len(self.reward_funcs)} reward_funcs")
        if self.share_prompts and (self.gradient_checkpointing or self.learner_sharding == "fsdp"):
            raise ConfigError("share_prompts runs a prompt's cache into its completions' pass, which gradient "
                              "checkpointing (recomputes each layer) and learner_sharding=fsdp (needs the same "
                              "passes on every rank) do not support: turn one of them off")
        if self.sync_ref_model and self.beta == 0:
            raise ConfigError("sync_ref_model needs a reference model: set beta > 0")
        from ..rollout.engines import ENGINES
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine '{self.engine}'; valid: {sorted(ENGINES)}")
        self._check_loss()

    def _check_loss(self) -> None:
        """The algorithm's names (each a registry entry of aha.algos) and the numbers the loss reads."""
        from .. import algos  # unknown names fail here, before any model is loaded
        for key, get in (("advantage_estimator", algos.get_advantage), ("loss_type", algos.get_loss_type),
                         ("kl_estimator", algos.get_kl), ("importance_sampling_level", algos.get_ratio)):
            try:
                get(getattr(self, key))
            except ValueError as e:
                raise ConfigError(f"{key}: {e}") from None
        require_all(self, {
            **{k: (math.isfinite, "a finite number") for k in (
                "entropy_coef", "entropy_coef_min", "entropy_coef_max", "entropy_target", "vespo_k_pos", "vespo_k_neg",
                "vespo_lambda_pos", "vespo_lambda_neg", "positive_reward")},
            **{k: (finite(non_negative), ">= 0") for k in ("entropy_coef_delta", "positive_nll_coef")},
            "sapo_temperature_pos": (finite(positive), "> 0"),
            "sapo_temperature_neg": (finite(positive), "> 0")})
        self._check_behaviour_weights()
        if self.loss_type == "cispo" and self.epsilon_high is None:
            raise ConfigError("loss_type=cispo caps the importance weight at epsilon_high (its eps_max; ScaleRL uses 5): "
                              "set it (TRL falls back to epsilon, which caps every weight below 1)")
        if self.multi_objective_aggregation == "normalize_then_sum":
            if self.advantage_estimator not in ("grpo", "gdpo"):
                raise ConfigError(f"multi_objective_aggregation=normalize_then_sum (GDPO) normalises each reward in its group "
                                  f"and the sum over the batch; advantage_estimator={self.advantage_estimator!r} (or "
                                  "scale_rewards, which TRL ignores there) would be another baseline: remove it")
            self.advantage_estimator = "gdpo"
        if self.use_adaptive_entropy and self.entropy_coef_min > self.entropy_coef_max:
            raise ConfigError(f"entropy_coef_min {self.entropy_coef_min} > entropy_coef_max {self.entropy_coef_max}")

    def _check_behaviour_weights(self) -> None:
        """The engine-mismatch correction's bounds and the off-policy mask's threshold, as TRL checks them."""
        require_all(self, {
            "vllm_importance_sampling_clip_max": (lambda v: v is None or finite(positive)(v), "> 0 or null"),
            "vllm_importance_sampling_clip_min": (lambda v: v is None or finite(non_negative)(v), ">= 0 or null"),
            "off_policy_mask_threshold": (lambda v: v is None or finite(positive)(v), "> 0 or null")})
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if low is not None and high is not None and low >= high:
            raise ConfigError(f"vllm_importance_sampling_clip_min {low} must be below "
                              f"vllm_importance_sampling_clip_max {high}")
        if self.vllm_importance_sampling_correction and self.loss_type == "vespo":
            raise ConfigError("loss_type=vespo with vllm_importance_sampling_correction: TRL folds the correction into "
                              "VESPO's sequence weight, aha does not: turn the correction off")
        if self.vllm_importance_sampling_correction and self.vllm_importance_sampling_mode.endswith("truncate") \
                and low is None and high is None:
            raise ConfigError(f"vllm_importance_sampling_mode={self.vllm_importance_sampling_mode} truncates to "
                              "bounds: set vllm_importance_sampling_clip_max or _clip_min")

    def _check_batch(self) -> None:
        """generation_batch_size (derived when unset) against the group size, the minibatch and the engine's batch."""
        G, micro, accum = self.num_generations, self.per_device_train_batch_size, self.gradient_accumulation_steps
        if self.generation_batch_size is None:
            self.generation_batch_size = micro * accum
        N = self.generation_batch_size
        if N % G:
            raise ConfigError(f"generation_batch_size {N} (= per_device_train_batch_size * "
                              f"gradient_accumulation_steps unless set) must be divisible by "
                              f"num_generations {G}")
        if N % (micro * accum):
            raise ConfigError(f"generation_batch_size {N} must be divisible by "
                              f"per_device_train_batch_size * gradient_accumulation_steps = {micro * accum}")
        if self.generation_max_batch < G:
            raise ConfigError(f"generation_max_batch {self.generation_max_batch} < num_generations {G}: a prompt's "
                              "G completions decode together (its prompt prefilled once for all of them)")

    def _check_distributed(self) -> None:
        require_all(self, {
            "num_rollout_workers": (non_negative, ">= 0"),
            "num_reward_workers": (non_negative, ">= 0"),
            "num_learners": (at_least_one, ">= 1"),
            "max_staleness": (non_negative, ">= 0"),
            "off_policy_is_cap": (lambda v: v >= 1, ">= 1"),
            "dist_timeout": (positive, "> 0 seconds"),
            "max_worker_restarts": (non_negative, ">= 0"),
        })
        if self.learner_sharding == "fsdp" and self.num_learners < 2:
            raise ConfigError("learner_sharding=fsdp shards the model over learners: set num_learners >= 2")
        if self.prm_model and self.num_reward_workers:
            raise ConfigError("prm_model runs the PRM on the learner's device, in the driver: set num_reward_workers=0 "
                              "(rollout workers and learners may still run on Ray)")
        if self.max_staleness and not self.num_rollout_workers:
            raise ConfigError(f"max_staleness={self.max_staleness} overlaps generation with training, which needs "
                              "rollout workers: set num_rollout_workers >= 1 (or max_staleness=0)")

    @property
    def distributed(self) -> bool:
        """Whether any component runs as a Ray actor."""
        return self.num_rollout_workers > 0 or self.num_reward_workers > 0 or self.num_learners > 1

    @property
    def prompts_per_step(self) -> int:
        """B: distinct prompts sampled each step."""
        return self.generation_batch_size // self.num_generations

    @property
    def optimizer_steps_per_step(self) -> int:
        """Optimizer steps a GRPO step takes: num_iterations passes over N / (micro * accum) minibatches (TRL's
        max_steps, logging_steps and save_steps count these; aha's count GRPO steps)."""
        minibatch = self.per_device_train_batch_size * self.gradient_accumulation_steps
        return self.num_iterations * (self.generation_batch_size // minibatch)


@checked
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

    def __post_init__(self):
        super().__post_init__()
        require_all(self, {"num_train_epochs": (finite(positive), "> 0"), "max_length": (at_least_one, ">= 1")})


@checked
@dataclass
class PRMConfig(TrainConfig):
    """A process reward model: token classification (bad/good) at each step's end, TRL's PRMTrainer format."""

    output_dir: str = "runs/prm"
    """Run directory: metrics, config, checkpoints, eval.json and the PRM (model/) go here."""
    model: str = ""
    """Where training starts: a causal LM checkpoint (e.g. the SFT model; a new two-label score head is fitted) or
    a PRM."""
    dataset: str = ""
    """Step labels as JSONL in TRL's stepwise-supervision format: prompt (text), completions (the steps), labels."""
    step_separator: Optional[str] = None
    """What follows each step in the PRM's input, saved in its config.json for the reward (None: the separator the
    labels were split by, from the stats.json `aha prm_labels` wrote beside the dataset, else TRL's "\\n")."""
    eval_fraction: float = 0.1
    """Share of the prompts held out (with all their rows) for the step accuracy in eval.json."""
    eval_steps: int = 0
    """Score the held-out steps every this many steps too (0: only at the end, into eval.json)."""
    eval_samples: int = 0
    """Most held-out rows scored per evaluation (0: all of them)."""
    train_on_last_step_only: bool = False
    """Learn the last step's label only (TRL's option); evaluation still scores every step."""
    learning_rate: float = 1e-5
    """Peak learning rate of AdamW (TRL's PRM default)."""
    num_train_epochs: float = 1.0
    """Epochs over the training rows when max_steps is 0."""
    max_steps: int = 0
    """Optimizer steps (0: derived from num_train_epochs)."""
    max_length: int = 1024
    """Longest PRM input (prompt and steps with their separators) in tokens; a longer row is an error, not cut."""

    def __post_init__(self):
        super().__post_init__()
        require_all(self, {"num_train_epochs": (finite(positive), "> 0"), "max_length": (at_least_one, ">= 1"),
                           "eval_fraction": (lambda v: 0 <= v < 1, "in [0, 1)"),
                           "step_separator": (lambda v: v is None or v != "", "a non-empty string or null")})
        if self.use_lora:
            raise ConfigError("use_lora: PRM training fine-tunes all weights (LoRA is not supported for it)")



@dataclass
class GenerationConfig:
    """What evaluation and rejection sampling share: a model, a task's split, and how to decode."""

    model: str = ""
    """Model directory, cached hub id or known short name."""
    task: str = "arithmetic"
    """Registered task name (arithmetic, chat_add, gsm8k, math500, humaneval, ...) or jsonl:PATH."""
    split: str = "test"
    """Which split to draw prompts from."""
    temperature: float = 0.7
    """Sampling temperature (0: greedy)."""
    top_p: float = 1.0
    """Nucleus mass."""
    max_new_tokens: Optional[int] = None
    """Generation budget (default: the task's)."""
    batch_size: int = 256
    """Most sequences decoded at once (the others wait: `generation_max_batch`)."""
    engine: str = "hf"
    """Generation engine by name (aha.rollout.engines.ENGINES), as training's `engine`."""
    seed: int = 0
    """Seed for sampling."""
    dtype: DType = "float32"
    """Weights dtype."""
    threads: int = 0
    """torch CPU threads (0: torch's default)."""
    progress_bar: bool = True
    """Show a progress bar."""

    def __post_init__(self):
        require_all(self, {
            "temperature": (finite(non_negative), ">= 0"),
            "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
            "max_new_tokens": (lambda v: v is None or v >= 1, ">= 1 or null"),
            "batch_size": (at_least_one, ">= 1"),
            "threads": (non_negative, ">= 0"),
        })
        from ..rollout.engines import ENGINES
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine '{self.engine}'; valid: {sorted(ENGINES)}")


@checked
@dataclass
class EvalConfig(GenerationConfig):
    """Greedy accuracy, sampled pass@k and maj@k on a task's split."""

    num_problems: int = 0
    """Evaluate the first this many problems (0: all)."""
    k: list[int] = field(default_factory=lambda: [1])
    """pass@k and maj@k for each k (needs n_samples >= max k)."""
    n_samples: int = 0
    """Sampled completions per problem for pass@k/maj@k (0: greedy only)."""
    tools: bool = True
    """An agent task's tools. false: its episodes are one reply to a prompt that lists no tools (a call written
    anyway is not run), scored by the task's verdict as usual: the baseline of a model without tools."""
    output_dir: Optional[str] = None
    """Write results.json, results.md and per_problem.jsonl here."""

    def __post_init__(self):
        super().__post_init__()
        require_all(self, {"num_problems": (non_negative, ">= 0"), "n_samples": (non_negative, ">= 0"),
                           "k": (lambda v: len(v) > 0 and min(v) >= 1, "a non-empty list of integers >= 1")})
        if not self.n_samples and max(self.k) > 1:
            raise ConfigError(f"k={self.k} needs sampled completions: set n_samples >= {max(self.k)} "
                              "(n_samples=0 evaluates greedy decoding only)")
        if self.n_samples and max(self.k) > self.n_samples:
            raise ConfigError(f"k={max(self.k)} is larger than n_samples={self.n_samples}: "
                              "pass@k needs at least k samples per problem")


@checked
@dataclass
class SampleConfig(GenerationConfig):
    """Rejection sampling: n completions per prompt, the verified ones written as SFT data."""

    split: str = "train"
    """Split to draw prompts from."""
    temperature: float = 1.0
    """Sampling temperature."""
    num_prompts: int = 0
    """Prompts to sample (0: the whole split)."""
    prompts_offset: int = 0
    """Skip this many prompts first (e.g. the ones already used for SFT)."""
    n: int = 8
    """Completions generated per prompt."""
    keep: Literal["best", "all_correct", "shortest_correct"] = "best"
    """best: the highest-reward verified completion; all_correct: every distinct verified one;
    shortest_correct: the shortest verified one."""
    mix_dataset: Optional[str] = None
    """A JSONL of prompt/completion rows to mix into the output."""
    mix_ratio: float = 0.0
    """Fraction of the output rows taken from mix_dataset."""
    output_dir: str = "runs/sample"
    """data.jsonl, stats.json and per_prompt.jsonl go here."""

    def __post_init__(self):
        super().__post_init__()
        require_all(self, {"n": (at_least_one, ">= 1"), "num_prompts": (non_negative, ">= 0"),
                           "prompts_offset": (non_negative, ">= 0"),
                           "mix_ratio": (lambda v: 0.0 <= v < 1.0, "in [0, 1)")})
        if self.mix_ratio > 0 and not self.mix_dataset:
            raise ConfigError("mix_ratio > 0 needs mix_dataset")


@checked
@dataclass
class PRMLabelsConfig(GenerationConfig):
    """Step labels the Math-Shepherd way: a step is good when some continuation from it reaches the right answer."""

    split: str = "train"
    """Split to draw prompts from."""
    temperature: float = 1.0
    """Sampling temperature of the completions and of the continuations."""
    num_prompts: int = 64
    """Prompts to label (0: the whole split)."""
    prompts_offset: int = 0
    """Skip this many prompts first (e.g. the ones GRPO will train on)."""
    n: int = 4
    """Completions sampled per prompt; each distinct one becomes a labelled row."""
    num_continuations: int = 8
    """Continuations sampled from each step (Math-Shepherd's N): more find more good steps, and cost more."""
    step_separator: str = "\n"
    """What separates steps in a completion ("\\n" as TRL; " " for arithmetic, whose <think> holds column sums
    separated by spaces; on the command line quote it: 'step_separator=" "')."""
    output_dir: str = "runs/prm_labels"
    """data.jsonl (TRL's stepwise-supervision rows, plus each step's share of right continuations) and stats.json."""

    def __post_init__(self):
        super().__post_init__()
        require_all(self, {"n": (at_least_one, ">= 1"), "num_prompts": (non_negative, ">= 0"),
                           "prompts_offset": (non_negative, ">= 0"),
                           "num_continuations": (at_least_one, ">= 1"),
                           "step_separator": (lambda v: v != "", "a non-empty string")})


@checked
@dataclass
class TinyConfig:
    """A small Llama-layout model built in code, its tokenizer trained on a task's text."""

    output_dir: str = "runs/tiny"
    """The model directory written."""
    task: str = "arithmetic"
    """Task whose training text the tokenizer is fitted on."""
    size: str = "small"
    """Named model size from aha.models.tiny."""
    seed: int = 0
    """Seed for the weights."""


CREDITS = ("outcome", "scalar", "steps", "prm")
"""`aha demo process`'s credit settings."""


@checked
@dataclass
class DemoConfig:
    """`aha demo [NAME]`: tiny model, cold-start SFT, GRPO, before/after table (variants: aha.demo.VARIANTS)."""

    variant: str = ""
    """Which demo: empty for the embedded default, `aha` for the aha moment (the word after `aha demo`)."""
    output_dir: str = ""
    """Where the models, metrics, plot and summary go (empty: runs/demo, or runs/demo_NAME for `aha demo NAME`)."""
    seed: int = 0
    """Seed for the data, the model and training."""
    size: str = "small"
    """Named model size from aha.models.tiny."""
    threads: Optional[int] = None
    """torch CPU threads (default: the variant's, aha/demo/<name>.py DEFAULTS)."""
    sft_examples: Optional[int] = None
    """Worked solutions used for the cold start (a small set keeps the model imperfect; default: the variant's,
    aha/demo/<name>.py DEFAULTS)."""
    sft_steps: Optional[int] = None
    """Most SFT optimizer steps (the cold start usually ends earlier, at sft_target; default: the variant's,
    aha/demo/<name>.py DEFAULTS)."""
    sft_target: Optional[float] = None
    """End the cold start once greedy accuracy on 100 dev problems (train split, trained on by neither stage)
    reaches this (0: run all sft_steps; default: the variant's, aha/demo/<name>.py DEFAULTS)."""
    sft_check_every: Optional[int] = None
    """Check the dev accuracy every this many SFT steps (default: the variant's, aha/demo/<name>.py DEFAULTS)."""
    sft_lr: float = 3e-3
    """SFT learning rate."""
    sft_batch: int = 32
    """SFT batch size."""
    grpo_steps: Optional[int] = None
    """GRPO steps (default: the variant's, aha/demo/<name>.py DEFAULTS)."""
    grpo_lr: float = 5e-4
    """GRPO learning rate."""
    prompts_per_step: Optional[int] = None
    """Prompts per GRPO step (B; default: the variant's, aha/demo/<name>.py DEFAULTS)."""
    num_generations: int = 8
    """Completions per prompt (G)."""
    eval_problems: int = 200
    """Held-out problems for the before/after table (never seen in training)."""
    eval_every: int = 20
    """Evaluate held-out accuracy every this many GRPO steps (for the plot)."""
    eval_during: int = 100
    """Held-out problems used for the in-training curve."""
    progress_bar: bool = True
    """Show progress bars."""
    reflect_share: float = 0.05
    """aha: share of the cold start's worked solutions that check themselves (rare, as reflection is in a base
    model); half of those where a carry can be forgotten catch that slip and correct it ("wait"), the rest confirm."""
    check_carries: bool = True
    """aha: problems with carries (false: none anywhere, so the check has nothing to catch; an ablation)."""
    wait_reward: float = 0.0
    """aha: weight of a reward for saying "wait" (an ablation: the hack behaviour/empty_reflection should catch)."""
    sft_model: str = ""
    """aha, process, agent: start GRPO from this cold-start model (an earlier run's sft/model) instead of training one,
    so arms that differ only after the cold start share it."""
    credit: str = "steps"
    """process: how reward reaches tokens: outcome (answer and format only), scalar (plus the share of right column
    sums as one number), steps (each column sum a step reward, grpo_process), prm
    (a learned PRM's step scores instead of the rule, grpo_process; needs prm_model)."""
    prm_model: str = ""
    """process: the PRM for credit=prm (made by `aha prm_labels` then `aha prm`: docs/process_rewards.md)."""
    held_out_samples: int = 4
    """aha: completions sampled per held-out problem (temperature 1, as in training) for the sampled reflection
    rate before and after GRPO; agent: episodes sampled per held-out task (at grpo_temperature) for the sampled
    success before and after (0: greedy only)."""
    grpo_temperature: float = 1.0
    """agent: sampling temperature of GRPO's episodes."""
    grpo_mask_truncated: bool = False
    """agent: leave the episodes cut by the token budget or the rounds out of GRPO's loss (DAPO's overlong
    filtering, `mask_truncated_completions`)."""
    grpo_beta: float = 0.04
    """agent: weight of GRPO's KL penalty to the cold start (GRPOConfig.beta: 0.04 is DeepSeekMath's; 0, TRL's
    default, keeps no reference model). On seeds 0-2, 0 gave gains of -5.0, +14.5, -0.5 points and 0.04 gave
    +0.5, +13.5, +7.5 (BENCHMARKS.md, Agents)."""
    grpo_families: list = field(default_factory=list)
    """agent: the task families GRPO's prompts are drawn from (empty: every family; `[move_txt, delete_logs, create,
    rename]` is the pool the demo had before every family reached GRPO, an ablation arm)."""
    grpo_config: dict = field(default_factory=dict)
    """agent: GRPOConfig settings laid over the demo's own, as a YAML mapping, e.g.
    `grpo_config='{balance_by: family, advantage_estimator: gigpo}'` (a name GRPOConfig lacks is an error)."""

    def __post_init__(self):
        if not self.output_dir:
            self.output_dir = "runs/demo" + (f"_{self.variant}" if self.variant else "")
        # the settings left None take the variant's defaults, which live beside its run() (aha/demo/<name>.py
        # DEFAULTS) and are laid on by aha.demo.configured as the demo starts: here only a value given is checked
        unset = lambda rule: lambda v: v is None or rule(v)  # noqa: E731
        require_all(self, {
            "sft_target": (unset(lambda v: 0 <= v <= 1), "in [0, 1]"),
            "threads": (unset(at_least_one), ">= 1"),
            "reflect_share": (lambda v: 0 <= v <= 1, "in [0, 1]"),
            "wait_reward": (math.isfinite, "a finite number"),
            "held_out_samples": (non_negative, ">= 0"),
            "grpo_temperature": (lambda v: v > 0 and math.isfinite(v), "> 0"),
            "grpo_beta": (lambda v: v >= 0 and math.isfinite(v), ">= 0"),
            "credit": (lambda v: v in CREDITS, f"one of {', '.join(CREDITS)}"),
            **{k: (unset(at_least_one), ">= 1") for k in ("sft_steps", "sft_check_every", "sft_batch", "grpo_steps",
                                                           "prompts_per_step", "num_generations", "eval_problems")}})


@checked
@dataclass
class DashboardConfig:
    """The local web dashboard: runs, curves, group records, the aha tracker and the Learn GRPO explainer."""

    runs: list[str] = field(default_factory=list)
    """Run directories to show (default: every run found under runs_root)."""
    runs_root: str = "runs"
    """Where runs are looked for when `runs` is empty (three levels deep)."""
    host: str = "127.0.0.1"
    """Address to bind; the default serves this machine only. Also a Host name the dashboard answers to (beside
    localhost, 127.0.0.1 and [::1]; any other Host is refused against DNS rebinding)."""
    port: int = 8765
    """Port to serve on (0: any free port)."""
    playground_dir: Optional[str] = None
    """Where playground runs are written (default: runs_root/playground)."""
    playground_model: Optional[str] = None
    """Model the playground trains (default: the demo's SFT model runs_root/demo/sft/model when it exists, else a
    tiny model built in code)."""
    playground_max_steps: int = 30
    """Most steps a playground run may ask for."""
    playground_time_s: float = 300.0
    """Wall-clock cap of one playground run; past it the run is killed."""

    def __post_init__(self):
        require_all(self, {"port": (lambda v: 0 <= v < 65536, "in [0, 65535]"),
                           "playground_max_steps": (at_least_one, ">= 1"),
                           "playground_time_s": (finite(positive), "> 0 seconds")})
