"""Step rewards: a reward function's value for one completion may be a list of `(end, score)` pairs, one per
reasoning step, instead of one number. `end` is the character offset in the completion's text just after the
step's last character (`text[:end]` ends with the step); `score` is the step's reward. Plain tuples: a reward
needs no aha import (`Step` is the same pair with names). An empty list means no step was written.

The trainer maps each end to the token that holds the step's last character (`step_tokens`, the one place
offsets become token indices; a step ending inside a token belongs to that token) and, under
`advantage_estimator: grpo_process`, gives each token the sum of the normalised rewards of the steps ending at
or after it (aha.algos.process_advantages). Under an outcome estimator a completion's steps count as one number,
the mean of their scores (`step_mean`).

An agent's episode is scored otherwise: its reward may be a list of numbers, one score per model turn (the
assistant messages of its `completions`), each a step the trainer puts on that turn's last model token
(`TurnEnd`). Character offsets into an episode are refused: its reward functions read messages, not one text.
"""
from __future__ import annotations

import math
import re
from typing import Any, NamedTuple, Sequence


PARTIAL = "\ufffd"
"""What a decoder writes for the bytes of a character whose other bytes are in a later token."""


class Step(NamedTuple):
    """One step's reward: it ends at character `end` of the completion's text (exclusive)."""

    end: int
    score: float


def is_steps(value: Any) -> bool:
    """Whether a reward value is a list of (end, score) pairs (an empty list is one: no steps written).

    >>> is_steps([(5, 1.0), (9, 0.0)]), is_steps([]), is_steps(0.5), is_steps([0.5, 1.0])
    (True, True, False, False)
    """
    return isinstance(value, (list, tuple)) and not hasattr(value, "shape") and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and _is_int(p[0]) for p in value)


def _is_int(x: Any) -> bool:
    return hasattr(x, "__index__") and not isinstance(x, bool)  # int, numpy and 0-d torch integers


def non_integer_end(value: Any) -> Any:
    """The first end that keeps a list of pairs from being step rewards (an end must be an integer), or None.

    >>> non_integer_end([(2.0, 1.0)]), non_integer_end([(2, 1.0)]), non_integer_end([0.5])
    (2.0, None, None)
    """
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        return None
    return next((p[0] for p in value if not _is_int(p[0])), None)


def clean_steps(value: Sequence, text_len: int | None = None) -> list[Step]:
    """One value's steps sorted by end, each score a float: NaN where it is NaN, inf or not a number (such a step
    is left out like a None reward, and counted). An end past the text is the text's end. A negative end is a
    mistake in the reward function: ValueError.

    >>> clean_steps([(9, 0.0), (4, 1), (6, "x")], text_len=8)
    [Step(end=4, score=1.0), Step(end=6, score=nan), Step(end=8, score=0.0)]
    """
    steps = []
    for end, score in value:
        end = int(end)
        if end < 0:
            raise ValueError(f"a step reward ends at character {end}; ends are offsets into the completion's text, >= 0")
        try:
            score = float(score)
        except (TypeError, ValueError):
            score = math.nan
        steps.append(Step(end if text_len is None else min(end, text_len), score if math.isfinite(score) else math.nan))
    return sorted(steps, key=lambda s: s.end)


class TurnEnd(int):
    """A step's end given as a model turn's index (an agent's episode: one score per model turn), not a character
    offset: the trainer puts the step on that turn's last model token."""


def is_turn_scores(value: Any) -> bool:
    """Whether a reward value is one score per model turn of an episode: a list of numbers (None, or anything not a
    number, is an unusable score).

    >>> is_turn_scores([0.0, 1.0]), is_turn_scores([]), is_turn_scores([(3, 1.0)]), is_turn_scores(0.5)
    (True, True, False, False)
    """
    return isinstance(value, (list, tuple)) and not hasattr(value, "shape") and not any(
        isinstance(x, (list, tuple, dict, set)) for x in value)


def turn_steps(value: Sequence) -> list[Step]:
    """Per-turn scores as steps ending at their turns (TurnEnd), each score a float, NaN where unusable.

    >>> turn_steps([1, None])
    [Step(end=0, score=1.0), Step(end=1, score=nan)]
    """
    out = []
    for k, score in enumerate(value):
        try:
            score = float(score)
        except (TypeError, ValueError):
            score = math.nan
        out.append(Step(TurnEnd(k), score if math.isfinite(score) else math.nan))
    return out


def step_mean(steps: Sequence[Step]) -> float:
    """The one number a list of steps counts as under an outcome estimator: the mean of its usable scores (NaN
    when none is usable or no step was written).

    >>> step_mean([Step(3, 1.0), Step(5, 0.0), Step(8, float("nan"))])
    0.5
    """
    usable = [s.score for s in steps if not math.isnan(s.score)]
    return sum(usable) / len(usable) if usable else math.nan


def delimited_ends(text: str, delimiter: str | re.Pattern = "\n") -> list[int]:
    """Where the steps of `text` end when a delimiter (a string such as "\\n" or "\\n\\n", or a compiled regex)
    separates them: each step ends before its delimiter; empty steps are skipped; the last step ends at the text's
    end. Pair the ends with scores to make a step reward.

    >>> delimited_ends("a=1\\nb=2\\n\\nc=3")
    [3, 7, 12]
    >>> delimited_ends("x. y. z", re.compile(r"\\.\\s*"))
    [1, 4, 7]
    """
    pattern = delimiter if isinstance(delimiter, re.Pattern) else re.compile(re.escape(delimiter))
    ends, start = [], 0
    for m in pattern.finditer(text):
        if m.end() == m.start():
            continue
        if text[start:m.start()].strip():
            ends.append(m.start())
        start = m.end()
    if text[start:].strip():
        ends.append(len(text))
    return ends


def step_tokens(tokenizer, completion_ids: list[int], ends: list[int]) -> list[int]:
    """The token index of each step end: the token that holds the step's last character (text[end - 1]), in the
    completion's text as decoded from `completion_ids` (skip_special_tokens, as the rewards saw it). Found by
    bisection on the decoded length of prefixes of the tokens, so tokens that merge characters across a step
    boundary (BPE, byte-level pieces of one character) are handled: the step belongs to the first token whose
    prefix holds its last character. An end of 0 (an empty step) is token 0; an end past the text, the last
    token. A few decodes per step: 1,024 tokens with 10 steps cost about a millisecond, not a decode per token.

    Example: tokens "ab" "c=" "3" (text "abc=3"), a step "abc" ends at 3: its last character "c" is in token 1;
    "é" as two byte-level tokens belongs to the second, where it is complete.
    """
    if not ends:
        return []
    if not completion_ids:
        raise ValueError("a step reward on an empty completion: it has no token to put the step on")
    done: dict[int, int] = {}

    def complete(i: int) -> int:  # characters complete after token i (a split character decodes to PARTIAL)
        if i not in done:
            prefix = tokenizer.decode(completion_ids[:i + 1], skip_special_tokens=True)
            done[i] = len(prefix) - prefix.endswith(PARTIAL)
        return done[i]

    out = []
    for end in ends:
        lo, hi = 0, len(completion_ids) - 1
        while lo < hi:  # the first token whose prefix holds `end` characters (the last token if none does)
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if complete(mid) >= end else (mid + 1, hi)
        out.append(lo)
    return out
