"""How an update cuts a batch into forward/backward passes when the config leaves it to aha
(`max_tokens_per_micro_batch: null`, `share_prompts: null`, the defaults).

The choice is made per batch from its lengths and from the device's total memory, and is deterministic: the same
batch on the same device gets the same passes. Every choice gives the same loss and gradient up to float summation
order (denominators count the whole minibatch), so it decides speed and peak memory only.

- `share_prompts` is decided once, on the run's first batch, and kept in every checkpoint (so a run, resumed or
  not, keeps one arithmetic from start to end): on when prompts repeat (a GRPO group's). Measured on CPU it never
  lost: 85-token prompts and 36-token completions, G = 8, read 2.6x fewer tokens and updated 2.07x faster
  (BENCHMARKS, "One prompt pass per group"); over prompt:completion lengths from 16:64 to 193:260, the 4m and 30m
  models' forward and backward ran 0.99-1.61x as fast with it (benchmarks/share_ratio.py, "When sharing prompts
  pays"). Off with gradient_checkpointing or learner_sharding=fsdp, which it does not support.
- A batch is cut into length-sorted passes under a padded-token budget only where it pays: on a GPU when a pass of
  per_device_train_batch_size sequences would not fit the memory share below; on a CPU also when its longest
  sequence is over LONG tokens, with passes of at most CPU_PASS_TOKENS (at 512-token completions such passes ran
  1.6-2x faster than one pass of 16 padded to the longest: BENCHMARKS, "The micro-batch token budget at 512
  tokens"). Shorter batches keep per_device_train_batch_size sequences a pass, as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

LONG = 256
"""Tokens (prompt + completion) over which a CPU update cuts the batch into length-sorted passes."""
CPU_PASS_TOKENS = 1024
"""Padded tokens per pass on a CPU: 512 to 1,024 were fastest at 512-token completions (4m and 30m models)."""
MEMORY_SHARE = 0.25
"""Share of the device's total memory one pass's activations may take, by `bytes_per_token`'s estimate."""


@dataclass(frozen=True)
class Passes:
    """How one batch is cut: `tokens` the padded-token budget of a pass (0: per_device_train_batch_size sequences,
    unsorted for the frozen passes), `share` whether each distinct prompt runs once per pass."""
    tokens: int
    share: bool


def device_memory(device: torch.device) -> int:
    """Total bytes of the device: the GPU's memory, or the machine's RAM for a CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def bytes_per_token(model, width: int, elem: int) -> tuple[int, int]:
    """(activation bytes per token of a pass, logit bytes per completion position) for a decoder whose
    `width`-token rows are kept for the backward in `elem`-byte floats: per layer about 8 hidden-size and 4
    MLP-size vectors plus one attention row per head, and the logits with their gradient. For 16 rows of 530
    tokens of Qwen2-0.5B's shape under bf16 autocast it estimates 19 GB; the peak measured on the H100 and the
    H200, less weights and optimizer state, was about 19.5 GB."""
    c = getattr(model, "config", None)
    c = getattr(c, "text_config", None) or c  # a multimodal model's language part
    get = lambda *names, default: next((getattr(c, n) for n in names if getattr(c, n, None)), default)  # noqa: E731
    hidden = get("hidden_size", "n_embd", "d_model", default=1024)
    layers = get("num_hidden_layers", "n_layer", "num_layers", default=24)
    heads = get("num_attention_heads", "n_head", default=16)
    inner = get("intermediate_size", "n_inner", default=4 * hidden)
    vocab = get("vocab_size", default=50_000)
    return layers * (8 * hidden + 4 * inner + heads * width) * elem, 2 * vocab * elem


def pass_bytes(model, prompts: list[list[int]], completions: list[list[int]], share: bool, elem: int) -> int:
    """Estimated activation memory of one pass over these rows (padded as `completion_logprobs` pads them)."""
    P, T = max(map(len, prompts)), max(max(map(len, completions)), 1)
    act, logit = bytes_per_token(model, P + T, elem)
    tokens = len({tuple(p) for p in prompts}) * P + len(prompts) * (T + 1) if share else len(prompts) * (P + T)
    return act * tokens + logit * len(prompts) * (T + 1)


def share_prompts(args, batch) -> bool:
    """share_prompts as set, else whether `batch` (the run's first) gains from running each prompt once."""
    if args.share_prompts is not None:
        return args.share_prompts
    repeats = len({tuple(p) for p in batch.prompt_ids}) < len(batch.prompt_ids)
    return repeats and not args.gradient_checkpointing and args.learner_sharding != "fsdp"


def choose(args, batch, model, memory: int, device_type: str, share: bool) -> Passes:
    """The passes for `batch` (a GRPOBatch) with prompts shared or not: the config's token budget where set, else
    the rules in this module's docstring for a `device_type` ("cpu", "cuda", ...) device of `memory` bytes."""
    prompts, comps = batch.prompt_ids, batch.completion_ids
    if args.max_tokens_per_micro_batch is not None:
        return Passes(args.max_tokens_per_micro_batch, share)
    size, room = args.per_device_train_batch_size, MEMORY_SHARE * memory
    elem = 2 if args.bf16 or args.fp16 else next(model.parameters()).element_size()  # autocast keeps 16-bit ones
    longest = max(len(p) + len(c) for p, c in zip(prompts, comps))
    fits = all(pass_bytes(model, prompts[i:i + size], comps[i:i + size], share, elem) <= room
               for i in range(0, len(prompts), size))
    within = memory_tokens(model, longest, room, elem)
    if device_type != "cuda" and longest > LONG:
        return Passes(CPU_PASS_TOKENS if fits else min(CPU_PASS_TOKENS, within), share)
    return Passes(0 if fits else within, share)


def memory_tokens(model, width: int, room: float, elem: int) -> int:
    """The padded-token budget whose passes fit `room` bytes (a pass's rows all `width` wide); a sequence longer
    than the budget still goes alone."""
    act, logit = bytes_per_token(model, width, elem)
    return max(1, int(room // (act + logit)))


def describe(args, memory: int, device: torch.device) -> str:
    """One line for the log: what the config leaves to aha and the rules it will apply."""
    parts = []
    if args.max_tokens_per_micro_batch is None:
        rule = (f"length-sorted passes of <= {CPU_PASS_TOKENS} padded tokens for batches longer than {LONG} tokens"
                if device.type != "cuda" else "one pass per per_device_train_batch_size sequences")
        parts.append(f"max_tokens_per_micro_batch: auto ({rule}; passes cut further to fit "
                     f"{MEMORY_SHARE:.0%} of {memory / 2**30:.0f} GiB of {device.type} memory)")
    if args.share_prompts is None:
        parts.append("share_prompts: auto (decided on the run's first batch, kept by a resume: on if its prompts "
                     "repeat)")
    return "; ".join(parts)
