"""Log-probabilities of completion tokens under a model: the one forward pass training and reference share."""

from __future__ import annotations

import torch
from torch import Tensor

from ..models.load import attention_kernels, cache_arg

CHUNK_ELEMENTS = 2**24
"""Logits `TokenLogProbs` handles at once (64 MB in float32): its float32 temporaries stay this size."""


def _chunks(positions: int, vocab: int):
    """Slices of at most CHUNK_ELEMENTS // vocab positions (at least one) covering `positions`."""
    step = max(1, CHUNK_ELEMENTS // vocab)
    return (slice(i, min(i + step, positions)) for i in range(0, positions, step))


class TokenLogProbs(torch.autograd.Function):
    """log softmax(logits / temperature) at `ids`, and optionally the entropy, in float32 a chunk of positions at
    a time. Autograd keeps the logits in their own dtype (bf16 under autocast) and the [n,T] log-normaliser, and
    the backward writes the gradient in one pass: never a float32 copy of all the logits, their softmax or a
    float32 gradient of them (each [n,T,V]: 5 GB for 16 x 512 tokens of a 151,936-token vocabulary)."""

    @staticmethod
    def forward(ctx, logits: Tensor, ids: Tensor, temperature: float, with_entropy: bool):
        V = logits.shape[-1]
        flat, flat_ids = logits.reshape(-1, V), ids.reshape(-1)                           # [N,V], [N]
        lse = torch.empty(len(flat), dtype=torch.float32, device=logits.device)          # [N]
        logp = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if with_entropy else lse.new_empty(0)
        for part in _chunks(len(flat), V):
            x = flat[part].float() / temperature                                          # [c,V]
            lse[part] = x.logsumexp(-1)
            logp[part] = x.gather(-1, flat_ids[part, None]).squeeze(-1) - lse[part]
            if with_entropy:
                entropy[part] = lse[part] - (x.softmax(-1) * x).sum(-1)
        ctx.save_for_backward(logits, ids, lse, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # an output the loss does not use (the entropy, mostly) sends None
        return logp.view(ids.shape), entropy.view(ids.shape) if with_entropy else entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None):
        """d logp / d logits = (onehot(id) - p) / t and d entropy / d logits = -p (log p + entropy) / t, with
        p = softmax(logits / t); the entropy's term only when the loss used it (an entropy bonus)."""
        logits, ids, lse, entropy = ctx.saved_tensors
        V, t = logits.shape[-1], ctx.temperature
        flat, flat_ids = logits.reshape(-1, V), ids.reshape(-1)
        g = torch.zeros_like(lse) if grad_logp is None else grad_logp.reshape(-1).float()  # [N]
        h = None if grad_entropy is None else grad_entropy.reshape(-1).float()            # [N]
        grad = torch.empty_like(flat)                                                     # [N,V]
        for part in _chunks(len(flat), V):
            x = flat[part].float()                                                        # [c,V]
            if h is None:
                gx = (x / t - lse[part, None]).exp_().mul_(-g[part, None])                # -softmax * g
            else:
                logq = x / t - lse[part, None]                                            # [c,V] log p
                p = logq.exp()
                gx = p * -g[part, None] - h[part, None] * p * (logq + entropy[part, None])
            gx.scatter_add_(-1, flat_ids[part, None], g[part, None])
            grad[part] = gx.div_(t)
        return grad.view(logits.shape), None, None, None


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
                        pad_id: int, temperature: float = 1.0, with_entropy: bool = False,
                        share_prompts: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """log pi(completion token | prefix) [n,T], completion mask [n,T], entropy [n,T] or None.

    Only the T+1 last positions go through the output head (`logits_to_keep`), so prompts cost
    no vocabulary-sized matmul. Logits are divided by the sampling temperature, as in sampling.
    With `share_prompts`, a prompt that several rows share (a GRPO group's) goes through the model once
    (`_shared_prompt_logits`): the same log-probs and gradients up to float summation order.
    """
    device = next(model.parameters()).device
    with attention_kernels(device):  # the backward runs the kernels chosen here
        if share_prompts and len({tuple(p) for p in prompts}) < len(prompts) and min(map(len, prompts)) > 1:
            logits, comp_ids, comp_mask = _shared_prompt_logits(model, prompts, completions, pad_id, device)
        else:
            ids, attn, comp_ids, comp_mask = pad_batch(prompts, completions, pad_id, device)
            T = comp_ids.shape[1]
            pos = (attn.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                           logits_to_keep=T + 1).logits                           # [n,T+1,V]
    # the last position predicts past the completion: scored against any id, its log-prob is cut off below
    ids_next = torch.nn.functional.pad(comp_ids, (0, 1))                          # [n,T+1]
    logp, entropy = TokenLogProbs.apply(logits, ids_next, temperature, with_entropy)
    return logp[:, :-1], comp_mask, entropy[:, :-1] if with_entropy else None


def _shared_prompt_logits(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                          device) -> tuple[Tensor, Tensor, Tensor]:
    """Completion logits [n,T,V] (float32), ids [n,T] and mask [n,T], each distinct prompt run once.

    Two passes: every distinct prompt but its last token (left-padded, u rows) fills the model's cache; the
    cache's rows are gathered to the n rows (autograd sums the gradient of a shared prompt over its rows), and
    each row's last prompt token followed by its completion attends to it. A GRPO group of G completions costs
    one prompt forward and backward instead of G.
    """
    index: dict[tuple, int] = {}
    row = torch.tensor([index.setdefault(tuple(p), len(index)) for p in prompts], device=device)  # [n]
    heads = [list(p[:-1]) for p in index]                                        # u prompts, last token off
    W = max(map(len, heads))
    head_ids = torch.full((len(heads), W), pad_id, dtype=torch.long)
    head_mask = torch.zeros((len(heads), W), dtype=torch.long)
    for i, h in enumerate(heads):
        head_ids[i, W - len(h):], head_mask[i, W - len(h):] = torch.tensor(h, dtype=torch.long), 1
    head_ids, head_mask = head_ids.to(device), head_mask.to(device)
    arg = cache_arg(model)
    cache = getattr(model(input_ids=head_ids, attention_mask=head_mask, use_cache=True, logits_to_keep=1,
                          position_ids=(head_mask.cumsum(-1) - 1).clamp(min=0)), arg)
    cache.batch_select_indices(row)                                              # u rows -> n rows
    ids, attn, comp_ids, comp_mask = pad_batch([p[-1:] for p in prompts], completions, pad_id, device)
    T = comp_ids.shape[1]
    pos = torch.tensor([len(p) - 1 for p in prompts], device=device).unsqueeze(1) + torch.arange(T + 1, device=device)
    logits = model(input_ids=ids, attention_mask=torch.cat([head_mask[row], attn], 1), position_ids=pos,
                   use_cache=True, logits_to_keep=T + 1, **{arg: cache}).logits
    return logits, comp_ids, comp_mask                                           # [n,T+1,V], [n,T], [n,T]

