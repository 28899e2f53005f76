"""A replay buffer for groups without reward spread (TRL's GRPOWithReplayBuffer, `replay_buffer_size`): the groups
of past steps whose rewards spread most are kept, and a group of this step with no spread (all its rewards equal: no
policy gradient) is replaced by one drawn from them. `Experience.keep_groups` is its one caller."""

from __future__ import annotations

import heapq
import itertools

import torch
from torch import Tensor

from .. import algos
from ..batch import GRPOBatch


def group_scores(rewards: Tensor, group_size: int) -> Tensor:
    """Each group's worth [B], TRL's: the sum over its rewards of |advantage| times the group's std, the advantage
    (r - mean) / (std + ADV_EPS) (TRL's default scaling); 0 for a group without spread. NaN rewards are left out.
    Example: rewards [0, 1] -> mean 0.5, std 0.7071 -> 2 x 0.5 x 0.7071 / (0.7071 + 1e-4) = 0.9999."""
    g = algos.group_stats(rewards, group_size)
    spread = ((g.r - g.mean).abs() * g.valid).sum(-1, keepdim=True)                  # [B,1]
    return (g.std * spread / (g.std + algos.ADV_EPS)).squeeze(-1)                    # [B]


class ReplayBuffer:
    """The `size` groups with the highest scores seen so far (a min-heap: a new group displaces the lowest when it
    scores higher), drawn with probability proportional to their scores."""

    def __init__(self, size: int):
        self.size, self.heap, self.count = size, [], itertools.count()

    def __len__(self) -> int:
        return len(self.heap)

    def add(self, score: float, group: GRPOBatch) -> None:
        item = (score, next(self.count), group)  # the counter breaks ties (groups do not compare)
        if len(self.heap) < self.size:
            heapq.heappush(self.heap, item)
        elif score > self.heap[0][0]:
            heapq.heapreplace(self.heap, item)

    def sample(self, k: int, generator: torch.Generator | None) -> list[GRPOBatch]:
        """k groups, without replacement unless k exceeds the buffer; none from an empty buffer."""
        if not self.heap or k == 0:
            return []
        p = torch.tensor([s for s, _, _ in self.heap], dtype=torch.float64)               # [M]
        picks = torch.multinomial(p, k, replacement=k > len(self.heap), generator=generator).tolist()
        return [self.heap[i][2] for i in picks]

    def replace_flat_groups(self, batch: GRPOBatch, generator: torch.Generator | None) -> tuple[GRPOBatch, int]:
        """The batch with its groups with spread added to the buffer first, then each group without spread replaced
        by one drawn from the buffer (kept where the buffer is empty); returns it and how many were replaced."""
        G = batch.group_size
        score = group_scores(batch.rewards, G)                                           # [B]
        flat = algos.group_stats(batch.rewards, G).equal.squeeze(-1).tolist()             # [B]
        for i, is_flat in enumerate(flat):
            if not is_flat:
                self.add(float(score[i]), batch.groups([i]))
        drawn = self.sample(sum(flat), generator)
        if not drawn:
            return batch, 0
        it = iter(drawn)
        return GRPOBatch.cat([next(it) if f else batch.groups([i]) for i, f in enumerate(flat)]), len(drawn)
