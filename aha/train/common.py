"""Pieces every training loop shares: model set-up, optimiser, batched log-probabilities."""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from torch import Tensor

from ..models import load_model, load_tokenizer
from .config import TrainConfig


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def setup_model(cfg: TrainConfig, model=None, tokenizer=None, peft_config=None):
    """(model, tokenizer) from a name or objects; LoRA applied when asked for."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if model is None or isinstance(model, str):
        name = model or cfg.model
        if not name:
            raise ValueError("no model given: pass model=... or set `model` in the config")
        tokenizer = tokenizer or load_tokenizer(name)
        model = load_model(name, cfg.dtype, cfg.attn_implementation, cfg.gradient_checkpointing)
    elif tokenizer is None:
        raise ValueError("a model object needs its tokenizer: pass processing_class=...")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
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


def build_optimizer(cfg: TrainConfig, model, total_steps: int):
    """AdamW over trainable parameters, warmup then constant/cosine/linear."""
    from transformers import get_scheduler
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            weight_decay=cfg.weight_decay)
    name = {"constant": "constant_with_warmup"}.get(cfg.lr_scheduler_type, cfg.lr_scheduler_type)
    sched = get_scheduler(name, opt, num_warmup_steps=cfg.warmup_steps,
                          num_training_steps=max(total_steps, 1))
    return opt, sched


class NonFiniteError(FloatingPointError):
    """A loss or gradient norm was NaN or infinite; the weights were left as they were."""


def optimizer_step(cfg: TrainConfig, model, opt, sched, loss: float = 0.0) -> float:
    """Clip, step, schedule, zero; returns the pre-clip gradient norm, or NaN for a skipped update.

    Gradients are zeroed to tensors, not None, so AdamW moves every parameter on every step even
    when a skipped batch left its gradient at 0 (as if the zero loss had been backpropagated).
    A non-finite `loss` (the summed micro-batch losses of this update) or gradient norm never
    reaches the weights: with on_nonfinite="stop" it raises NonFiniteError; with "skip" the
    gradients are zeroed, neither the optimizer (no moment update either) nor the schedule is
    stepped, and NaN is returned so the caller can count it.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")))
    bad = [f"{name} ({value})" for name, value in (("loss", loss), ("grad norm", norm)) if not math.isfinite(value)]
    if bad:
        if cfg.on_nonfinite == "stop":
            raise NonFiniteError("non-finite " + " and ".join(bad))
        opt.zero_grad(set_to_none=False)
        return math.nan
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=False)
    return norm


def pad_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int,
              device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Left-padded prompts followed by right-padded completions, so completions share columns.

    Returns input ids [n,P+T], attention mask [n,P+T], completion ids [n,T], completion mask [n,T].
    """
    n = len(prompts)
    P, T = max(map(len, prompts)), max(max(map(len, completions)), 1)
    ids = torch.full((n, P + T), pad_id, dtype=torch.long)
    attn = torch.zeros((n, P + T), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, P - len(p):P] = torch.tensor(p, dtype=torch.long)
        ids[i, P:P + len(c)] = torch.tensor(c, dtype=torch.long)
        attn[i, P - len(p):P + len(c)] = 1
    comp_ids, comp_mask = ids[:, P:], attn[:, P:]
    return ids.to(device), attn.to(device), comp_ids.to(device), comp_mask.to(device)


def completion_logprobs(model, prompts: list[list[int]], completions: list[list[int]],
                        pad_id: int, temperature: float = 1.0, with_entropy: bool = False
                        ) -> tuple[Tensor, Tensor, Tensor | None]:
    """log pi(completion token | prefix) [n,T], completion mask [n,T], entropy [n,T] or None.

    Only the T+1 last positions go through the output head (`logits_to_keep`), so prompts cost
    no vocabulary-sized matmul. Logits are divided by the sampling temperature, as in sampling.
    """
    device = next(model.parameters()).device
    ids, attn, comp_ids, comp_mask = pad_batch(prompts, completions, pad_id, device)
    T = comp_ids.shape[1]
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                   logits_to_keep=T + 1).logits[:, :T].float()                    # [n,T,V]
    if temperature != 1.0:
        logits = logits / temperature
    lse = logits.logsumexp(-1)                                                    # [n,T]
    logp = logits.gather(-1, comp_ids.unsqueeze(-1)).squeeze(-1) - lse           # [n,T]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = lse - (logits.softmax(-1) * logits).sum(-1)                 # [n,T]
    return logp, comp_mask, entropy
