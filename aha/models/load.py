"""Load, set up and save policy models: hub id (from the local cache), local directory or short name;
pad token, LoRA and dtype set in one place."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import os
from pathlib import Path

import torch
from torch import Tensor

from ..fileio import atomic_directory
from .tokens import ensure_pad_token

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of CPUs that multiply bfloat16 natively (without them a bf16 matmul is emulated, slower
than float32)."""


def native_bf16(device: str | None = None) -> bool:
    """Does `device` (default: CUDA when present, else the CPU) compute bfloat16 natively? On the CPU, a torch
    told to use AVX2 kernels (ATEN_CPU_CAPABILITY=avx2 or lower) does not, whatever the CPU."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        return torch.cuda.is_bf16_supported()
    if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() in ("default", "avx2", "avx"):
        return False
    return any(flag in cpu_flags() for flag in BF16_CPU_FLAGS)


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (none where it cannot be read)."""
    try:
        return frozenset(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return frozenset()


def attention_kernels(device) -> contextlib.AbstractContextManager:
    """The scaled-dot-product attention kernels of aha's own forward passes (training, reference, prefill) on
    `device`: on CUDA every kernel but cuDNN's, elsewhere PyTorch's choice. Left-padded prompts make attention
    take a mask, and PyTorch may then pick cuDNN's kernel, which builds an execution plan for every new shape:
    on an H100 (PyTorch 2.11) GRPO steps took 1-2 s longer in their forward and backward when the batch's padded
    width was new, whatever Python's garbage collector did (benchmarks/step_phases.py), as cuDNN's plan
    building does. The memory-efficient kernel takes the mask and builds nothing."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def resolve_dtype(dtype: str, device: str | None = None) -> torch.dtype:
    """A dtype name, or "auto": bfloat16 where computed natively, float32 elsewhere."""
    if dtype == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype '{dtype}'; valid: {sorted(DTYPES)} or auto")
    return DTYPES[dtype]


def training_precision(dtype: str, bf16: bool, device: str | None = None) -> tuple[str, bool]:
    """(weights dtype, bf16 autocast) for training. `auto` is bf16 mixed precision where the device computes
    bfloat16 natively (float32 weights and optimizer state, forward passes in bfloat16, as TRL's bf16=true)
    and plain float32 elsewhere, so an update smaller than a weight's bfloat16 spacing is never lost. Only an
    explicit dtype=bfloat16 trains bfloat16 weights (half the memory; such updates are rounded away)."""
    if dtype == "auto":
        return "float32", bf16 or native_bf16(device)
    return dtype, bf16


SAFE_WEIGHTS = "model.safetensors"
"""The single-file weights name transformers writes and reads."""


def seed_everything(seed: int) -> None:
    """Python's, numpy's and torch's global generators seeded (dropout, initialisation, anything that draws)."""
    import random

    import numpy as np
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def autocast(cfg, model):
    """The mixed-precision context of forward passes (bf16/fp16 mixed precision, or dtype=auto on a device with
    native bfloat16), or a no-op."""
    device = next(model.parameters()).device.type
    bf16 = cfg.bf16 if cfg.fp16 else training_precision(cfg.dtype, cfg.bf16, device)[1]
    if not (bf16 or cfg.fp16):
        return contextlib.nullcontext()
    if cfg.fp16 and device != "cuda":
        raise ValueError("fp16 mixed precision needs a CUDA device; on a CPU use bf16=true")
    return torch.autocast(device, dtype=torch.bfloat16 if bf16 else torch.float16)


def resolve(name_or_path: str) -> str:
    """A local directory for a known short name or directory; a cached hub id passes through."""
    from .zoo import resolve_model
    return resolve_model(name_or_path)


def load_tokenizer(name_or_path: str):
    """Tokenizer with a pad token (EOS when the model has none) and left padding for generation."""
    from transformers import AutoTokenizer
    path = resolve(name_or_path)
    files = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    if Path(path).is_dir() and not any((Path(path) / f).is_file() for f in files):
        raise ValueError(f"no tokenizer in {path}: it has none of {', '.join(files)} (save one there with "
                         "tokenizer.save_pretrained, or pass processing_class=)")
    tok = ensure_pad_token(AutoTokenizer.from_pretrained(path))
    tok.padding_side = "left"
    return tok


def load_model(name_or_path: str, dtype: str = "float32", attn_implementation: str | None = None,
               gradient_checkpointing: bool = False, device: str | None = None, auto_class=None, **extra):
    """A transformers causal LM (or the model `auto_class` builds, e.g. AutoModelForTokenClassification, with
    `extra` from_pretrained arguments), on `device` (default: CUDA when present, else CPU)."""
    from transformers import AutoModelForCausalLM
    kwargs = {"dtype": resolve_dtype(dtype, device), **extra}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    path = resolve(name_or_path)
    try:
        model = (auto_class or AutoModelForCausalLM).from_pretrained(path, **kwargs)
    except Exception as e:  # noqa: BLE001 - a damaged weights file surfaces as many exception types
        if not Path(path).is_dir():
            raise
        weights = Path(path) / SAFE_WEIGHTS
        reason = (str(e).strip().splitlines() or [""])[0]
        source = path if "attn_implementation" in reason or not weights.is_file() else weights  # a setting, not a file
        raise ValueError(f"cannot load model from {source}: {type(e).__name__}: {reason}") from e
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if gradient_checkpointing:
        enable_checkpointing(model)
    return model


def enable_checkpointing(model) -> None:
    """Recompute each layer in the backward instead of keeping its activations (the method's name since
    transformers 5.2x, and the one before it)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False  # generation passes use_cache=True explicitly


def cache_arg(model) -> str:
    """The name under which a causal LM's forward (or a decoder layer's) takes, and its output returns, the KV
    cache: `cache` since transformers 5.2x (`past_key_values` warns there), `past_key_values` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _cache_arg(type(base))


@functools.cache
def _cache_arg(cls) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def context_length(model) -> int | None:
    """The model's maximum sequence length, when its config states one."""
    return getattr(model.config, "max_position_embeddings", None)


def save_model(model, tokenizer, path: str | Path, merge_lora: bool = True) -> Path:
    """Save so that transformers and vLLM load it: LoRA merged into the weights, or as an adapter.

    Written into a hidden temporary directory and renamed into place, so `path` is always either
    the previous model or the new one, never a mix or a half-written file.
    """
    path = Path(path)
    if hasattr(model, "peft_config") and merge_lora:
        model = copy.deepcopy(model).merge_and_unload()
    with atomic_directory(path) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return path


def disable_dropout(model) -> None:
    """Every dropout probability to 0 (modules and attention), so a sequence's outputs are the same on every
    forward pass, as TRL's disable_dropout."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def weight_snapshot(model) -> dict[str, Tensor]:
    """A CPU copy of every parameter (tied ones once), the start for `interpolate_weights`."""
    return {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters()}


@torch.no_grad()
def interpolate_weights(model, start: dict[str, Tensor], alpha: float) -> None:
    """In place, each parameter p becomes start + alpha x (p - start), in float32 (a tied parameter once)."""
    params = dict(model.named_parameters())
    if params.keys() != start.keys():
        raise ValueError(f"the start weights do not match the model's parameters: "
                         f"{sorted(params.keys() ^ start.keys())[:5]} ...")
    for name, p in params.items():
        p.copy_(torch.lerp(start[name].to(p.device, torch.float32), p.float(), alpha))


def setup_model(cfg, model=None, tokenizer=None, peft_config=None):
    """(model, tokenizer) for a training stage from a name or objects, LoRA applied when asked for.

    `cfg` is a TrainConfig: model, dtype, attn_implementation, gradient_checkpointing, threads and lora_*.
    """
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if model is None or isinstance(model, str):
        name = model or cfg.model
        if not name:
            raise ValueError("no model given: pass model=... or set `model` in the config")
        tokenizer = tokenizer or load_tokenizer(name)
        model = load_model(name, training_precision(cfg.dtype, cfg.bf16)[0], cfg.attn_implementation,
                           cfg.gradient_checkpointing)
    elif tokenizer is None:
        raise ValueError("a model object needs its tokenizer: pass processing_class=...")
    else:  # a model object is treated as one loaded by name: on the GPU where there is one, checkpointing as asked
        if torch.cuda.is_available() and next(model.parameters()).device.type == "cpu":
            model.to("cuda")
        if cfg.gradient_checkpointing:
            enable_checkpointing(model)
    ensure_pad_token(tokenizer)
    if peft_config is None and cfg.use_lora:
        from peft import LoraConfig
        targets = cfg.lora_target_modules
        peft_config = LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
            target_modules=targets[0] if targets == ["all-linear"] else targets, task_type="CAUSAL_LM")
    if peft_config is not None:
        from peft import get_peft_model
        if cfg.gradient_checkpointing:
            model.enable_input_require_grads()
        model = get_peft_model(model, peft_config)
    return model, tokenizer
