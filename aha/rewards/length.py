"""Length shaping: DAPO's soft overlong punishment and a plain length penalty.

Both read the completion's token count from TRL's `completion_ids` when given; without it they estimate tokens
as ceil(characters / chars_per_token), 4 characters per token by default (English BPE text)."""
from __future__ import annotations

import math
from typing import Any

from .base import Reward, completion_text

CHARS_PER_TOKEN = 4.0


def completion_lengths(completions: list, completion_ids: list | None, chars_per_token: float) -> list[int]:
    """Token counts from `completion_ids`, else the character estimate."""
    if completion_ids is not None:
        return [len(ids) for ids in completion_ids]
    return [math.ceil(len(completion_text(c)) / chars_per_token) for c in completions]


class SoftOverlongReward(Reward):
    """DAPO (eq. 13): 0 up to `max_len - cache_len` tokens, then a linear ramp down to -1 at `max_len`,
    and -1 beyond. Add it to the correctness reward.

    >>> SoftOverlongReward(max_len=10, cache_len=4)(None, ["", "", ""], completion_ids=[[0] * 6, [0] * 8, [0] * 11])
    [0.0, -0.5, -1.0]
    """

    name = "soft_overlong"

    def __init__(self, max_len: int = 4096, cache_len: int = 1024, chars_per_token: float = CHARS_PER_TOKEN):
        super().__init__()
        if not 0 < cache_len <= max_len:
            raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
        self.max_len, self.cache_len, self.chars_per_token = max_len, cache_len, chars_per_token

    def __call__(self, prompts: list, completions: list, completion_ids: list | None = None,
                 **kwargs: Any) -> list[float | None]:
        start = self.max_len - self.cache_len
        return [0.0 if n <= start else -1.0 if n > self.max_len else (start - n) / self.cache_len
                for n in completion_lengths(completions, completion_ids, self.chars_per_token)]


class LengthPenalty(Reward):
    """-scale * min(tokens / max_len, 1): a steady push towards shorter completions, bounded in [-scale, 0].

    >>> LengthPenalty(max_len=100, scale=0.5)(None, ["", ""], completion_ids=[[0] * 50, [0] * 300])
    [-0.25, -0.5]
    """

    name = "length_penalty"

    def __init__(self, max_len: int = 4096, scale: float = 1.0, chars_per_token: float = CHARS_PER_TOKEN):
        super().__init__()
        if max_len <= 0:
            raise ValueError(f"max_len must be positive, got {max_len}")
        self.max_len, self.scale, self.chars_per_token = max_len, scale, chars_per_token

    def __call__(self, prompts: list, completions: list, completion_ids: list | None = None,
                 **kwargs: Any) -> list[float | None]:
        return [-self.scale * min(n / self.max_len, 1.0)
                for n in completion_lengths(completions, completion_ids, self.chars_per_token)]


soft_overlong_reward = SoftOverlongReward()
length_penalty_reward = LengthPenalty()
