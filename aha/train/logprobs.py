"""Log-probabilities of completion tokens under a model: the one forward pass training and reference share."""

from __future__ import annotations

import torch
from torch import Tensor


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
