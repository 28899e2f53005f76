"""DeepSeek-R1's language-consistency reward: the share of the completion's words in the prompt's language.

R1 added it so the chain of thought stops mixing languages; it costs a little accuracy and buys readability.
The language is told by its script (see aha.behaviour), so no language model is needed.
"""
from __future__ import annotations

from typing import Any

from ..behaviour import language_consistency
from .base import Reward, completion_text


class LanguageConsistencyReward(Reward):
    """Share of the completion's words in the prompt's main script, in [0, 1]; None when the prompt or the
    completion has no words (digits and symbols belong to no language).

    >>> LanguageConsistencyReward()(["What is 2 + 2?"] * 3, ["four", "four 四", "4"])
    [1.0, 0.5, None]
    """

    name = "language_consistency"

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        return [language_consistency(completion_text(p), completion_text(c)) for p, c in zip(prompts, completions)]


language_consistency_reward = LanguageConsistencyReward()
