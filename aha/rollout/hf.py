"""Sampling loop over any transformers causal LM, with a KV cache and no wasted rows.

Why not `model.generate`: a GRPO step samples n completions of each prompt, so the prompt is
prefilled once and its cache repeated n times; and rows that hit EOS are dropped from the batch
(cache included) instead of decoding padding until the longest row ends.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import Rollout, SamplingParams

COMPACT_FRACTION = 0.125
"""Drop finished rows from the batch once they are this fraction of it (each drop copies the cache)."""


def sample_tokens(logits: Tensor, params: SamplingParams,
                  generator: torch.Generator | None = None) -> Tensor:
    """Next token [m] from logits [m,V]: greedy at temperature 0, else tempered top-k/top-p sampling."""
    if params.temperature == 0:
        return logits.argmax(-1)
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]           # [m,1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)      # [m,V]
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > params.top_p  # keep the smallest prefix reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class HFEngine:
    """Generates with the policy module itself, so weight updates need no copy."""

    def __init__(self, model, eos_token_ids: list[int], pad_token_id: int, max_batch: int = 512):
        self.model = model
        self.eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long)
        self.pad = pad_token_id
        self.max_batch = max_batch
        """Most sequences decoded at once; prompts are chunked to stay under it."""

    def update_weights(self, model) -> None:
        """The engine shares the policy's parameters; only a new module object needs rebinding."""
        self.model = model

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> Rollout:
        """n completions per prompt, prompt-major (see Rollout)."""
        if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
            raise ValueError("generate needs at least one prompt and no empty prompt")
        was_training = self.model.training
        self.model.eval()
        try:
            per_chunk = max(1, self.max_batch // n)
            parts = [self._chunk(prompt_ids[i:i + per_chunk], n, params, generator)
                     for i in range(0, len(prompt_ids), per_chunk)]
        finally:
            self.model.train(was_training)
        return Rollout(completion_ids=[c for p in parts for c in p.completion_ids],
                       truncated=[t for p in parts for t in p.truncated],
                       decode_steps=sum(p.decode_steps for p in parts))

    def _forward(self, ids: Tensor, mask: Tensor, pos: Tensor, cache=None):
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].float(), out.past_key_values

    def _chunk(self, prompts: list[list[int]], n: int, params: SamplingParams,
               generator: torch.Generator | None) -> Rollout:
        device = next(self.model.parameters()).device
        P, L = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((P, L), self.pad, dtype=torch.long)                    # [P,L] left-padded
        mask = torch.zeros((P, L), dtype=torch.long)                             # [P,L]
        for i, p in enumerate(prompts):
            ids[i, L - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, L - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)                                 # [P,L]
        logits, cache = self._forward(ids, mask, pos)                           # [P,V]
        if n > 1:  # prefill once per prompt, then share the cache among its n samples
            cache.batch_repeat_interleave(n)
            logits, mask = logits.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        M, T = P * n, params.max_new_tokens
        eos = self.eos.to(device)
        out = torch.full((M, T), self.pad, dtype=torch.long, device=device)     # [M,T]
        length = torch.zeros(M, dtype=torch.long, device=device)                # [M]
        done = torch.zeros(M, dtype=torch.bool, device=device)                  # [M]
        rows = torch.arange(M, device=device)    # output row of each batch row   [m]
        next_pos = mask.sum(-1)                                                  # [m]
        steps = 0
        for t in range(T):
            tok = sample_tokens(logits, params, generator)                      # [m]
            live = ~done[rows]                                                   # [m]
            out[rows[live], t] = tok[live]
            length[rows[live]] = t + 1
            done[rows[live & torch.isin(tok, eos)]] = True
            if t == T - 1 or bool(done.all()):
                break
            finished = done[rows]
            if finished.sum() >= max(1, COMPACT_FRACTION * len(rows)):
                keep = (~finished).nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                rows, tok, mask, next_pos = rows[keep], tok[keep], mask[keep], next_pos[keep]
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=-1)
            logits, cache = self._forward(tok[:, None], mask, next_pos[:, None], cache)
            next_pos = next_pos + 1
            steps += 1
        out, length, done = out.cpu(), length.cpu(), done.cpu()
        return Rollout(completion_ids=[out[i, :length[i]].tolist() for i in range(M)],
                       truncated=(~done).tolist(), decode_steps=steps + 1)
