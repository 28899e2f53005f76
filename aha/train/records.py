"""Group records: whole groups of a step with, per token, what the update did to it (groups.jsonl).

One JSON line per group: the prompt, the G completions with their per-function rewards, total reward and
advantage, the group's reward mean and std, and per token the text piece, log-prob, ratio, clip flag, KL and
its term in the loss. Step rewards add each completion's `steps` (`end` character, `token`, `reward` function
name, `score`), and per token `advantage` when the tokens' advantages differ (process supervision). An agent's episode adds its own prompt (after its environment's reset), its `turns`
(assistant turns with their text and tool calls, tool turns with each call's outcome and message, each with its
token span [start, end) in the completion), its `finish` (stop, length, tool_limit) and per token `model`: 1 on
the tokens the model wrote, 0 on the tokens the tools added, which carry no loss (loss term 0, clip 0). The per-token values are the tensors of the real update (`GRPOTrainer._micro_step`),
captured as it runs; nothing is recomputed with another formula. When a sequence is seen by several
minibatch passes (num_iterations > 1) the last pass is kept. A sequence left out of the update (advantage 0
with beta = 0, or masked as truncated) has text pieces only and `trained: false`.

Bounded: at most `log_groups_max` groups per logged step (the first groups of the batch), and once the file
reaches `log_groups_max_mb` nothing more is written (one warning). Floats keep 5 significant digits.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from .. import algos
from ..metrics import append_jsonl

log = logging.getLogger("aha.train")
GROUPS_LOG = "groups.jsonl"
BYTES_PER_MB = 1_000_000
DIGITS = 5
"""Significant digits kept for each per-token float."""
CLIP_LOW, CLIP_NONE, CLIP_HIGH = -1, 0, 1
"""The clip flag of a token: clipped at 1 - epsilon (A < 0), not clipped, clipped at 1 + epsilon_high (A > 0)."""


def _short(values: list[float]) -> list[float | None]:
    return [float(f"{v:.{DIGITS}g}") if v == v else None for v in values]


def loss_terms(loss_tok: Tensor, aggregate: Callable[[Tensor], Tensor]) -> Tensor:
    """Each token's term in the aggregated loss, [n,T]: d(loss)/d(token loss) * token loss.

    Every aggregation is linear in the token losses, so the terms add up to the loss exactly, whatever rule
    `aggregate` (algos.aggregate with the update's own denominators) applies.
    """
    w = loss_tok.detach().float().requires_grad_(True)                      # [n,T]
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(aggregate(w), w)                      # [n,T]
    return grad * w.detach()                                                # [n,T]


class GroupRecorder:
    """Captures per-token tensors of the sequences of logged groups during the update; writes them after."""

    def __init__(self, run_dir: Path, every: int, max_groups: int, max_mb: float, group_size: int,
                 last_step: int = 0):
        self.path, self.every, self.max_groups = Path(run_dir) / GROUPS_LOG, every, max_groups
        self.last_step = last_step
        """The run's last step, logged too (with `every` > 0), so that a run shorter than `every` has groups."""
        self.max_bytes, self.G = int(max_mb * BYTES_PER_MB), group_size
        self.tokens: dict[int, dict] = {}
        """Sequence index in the batch -> its per-token values."""
        self.full = False

    def wants(self, step: int) -> bool:
        """Whether step `step` (1-based) is logged."""
        return bool(self.every) and (step % self.every == 0 or step == self.last_step) and not self.full

    def capture(self, ids: list[int], lengths: list[int], logp: Tensor, loss_tok: Tensor, clip: dict[str, Tensor],
                kl: Tensor | None, mask: Tensor, aggregate: Callable[[Tensor], Tensor]) -> None:
        """Keep the values of the sequences `ids` (rows of the [n,T] tensors, `lengths` tokens each) that belong to
        a logged group. Tokens out of the loss (`mask` 0: an episode's tool tokens) have clip 0 and loss term 0."""
        keep = [r for r, i in enumerate(ids) if i < self.max_groups * self.G]
        if not keep:
            return
        terms = loss_terms(loss_tok, aggregate)                             # [n,T]
        flag = ((clip["clip/high"] - clip["clip/low"]) * mask).detach()      # [n,T] -1, 0, 1
        for r in keep:
            n = lengths[r]
            row = lambda t: _short(t[r, :n].detach().float().cpu().tolist())  # noqa: E731
            self.tokens[ids[r]] = {"logp": row(logp), "ratio": row(clip["ratio"]), "clip": [int(v) for v in row(flag)],
                                   "kl": row(kl) if kl is not None else None, "loss": row(terms)}

    def write(self, step: int, batch, tokenizer, names: list[str]) -> None:
        """The logged groups of `batch` (a GRPOBatch) as lines of groups.jsonl, within the size cap."""
        captured, self.tokens = self.tokens, {}
        if not self.wants(step):
            return
        B = len(batch.rows)
        lines = [self._group(g, batch, tokenizer, names, captured, step) for g in range(min(B, self.max_groups))]
        data = sum(len(json.dumps(x)) + 1 for x in lines)
        size = self.path.stat().st_size if self.path.is_file() else 0
        if size + data > self.max_bytes:
            self.full = True
            log.warning("%s reached its cap of %d bytes (log_groups_max_mb): no more groups are written",
                        self.path, self.max_bytes)
            return
        append_jsonl(self.path, lines)

    def _group(self, g: int, batch, tokenizer, names: list[str], captured: dict, step: int) -> dict:
        G = self.G
        stats = algos.group_stats(batch.rewards[g * G:(g + 1) * G].float(), G)
        seqs = []
        for i in range(g * G, (g + 1) * G):
            ids = batch.completion_ids[i]
            pieces = tokenizer.batch_decode([[t] for t in ids], skip_special_tokens=False) if ids else []
            values = captured.get(i, {})
            seqs.append({"text": batch.texts[i], "rewards": _short(batch.rewards_per_func[i].tolist()),
                         "reward": _short([float(batch.rewards[i])])[0], "advantage": _short([float(batch.advantages[i])])[0],
                         "trained": bool(values), "tokens": {"piece": pieces, **values}})
            adv = batch.token_advantages[i]
            if len(adv) and bool((adv != adv[0]).any()):  # process supervision: each token its own advantage
                seqs[-1]["tokens"]["advantage"] = _short(adv.tolist())
            if batch.steps is not None:  # step rewards: where each step ends (character, token) and its score
                seqs[-1]["steps"] = [{"end": end, "token": tok, "reward": names[j], "score": _short([score])[0]}
                                     for end, tok, j, score in batch.steps[i]]
            if batch.episodes is not None:  # an agent's episode: its turns, and which tokens the model wrote
                ep = batch.episodes[i]
                seqs[-1].update({"prompt": ep["prompt"], "turns": ep["turns"], "finish": ep["finish"]})
                seqs[-1]["tokens"]["model"] = batch.loss_mask[i].tolist()
        # a row an environment writes the prompt for (reset's text) has none: the group shows its first episode's
        prompt = batch.rows[g].get("prompt", seqs[0].get("prompt"))
        return {"step": step, "group": g, "prompt": prompt, "answer": batch.rows[g].get("answer"),
                "reward_names": names, "mean": _short([float(stats.mean)])[0], "std": _short([float(stats.std)])[0],
                "completions": seqs}
