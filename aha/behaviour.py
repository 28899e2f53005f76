"""What the completions do, not how they score: reflection phrases ("wait", "let me re-check"), lengths of
correct and incorrect answers, and language consistency. Pure functions on decoded texts; cheap enough to run
on every step.

The "aha moment" of DeepSeek-R1 is the model starting to re-check its own work; `reflection_rate` watches for
it. Language consistency is R1's: the share of the completion's words written in the prompt's language, here
approximated by its script (Latin, Cyrillic, Han, ...), since scripts can be told apart without a model.

A task whose completions check themselves in a format of its own (aha.tasks.checked: "check: ... ok / wait N")
registers a parser under its marker word (`register_check_format`); a run whose reflection phrases hold that
marker also gets what the checks did: corrections, whether a "wait" fixed or broke the answer, the accuracy of
reflective and direct completions, and the empty reflections (a check or "wait" that verifies and changes nothing,
what a reward paying for the words would teach).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Callable, Sequence

DEFAULT_REFLECTION_PHRASES = ("wait", "let me re-check", "let me recheck", "let me check", "let me verify",
                              "let me reconsider", "actually", "i made a mistake", "on second thought", "hmm")
"""Phrases that mark a completion re-examining its own reasoning (matched case-insensitively, whole words)."""
PER_TOKENS = 1000
"""Phrase counts are reported per this many completion tokens."""
_WORD = re.compile(r"[^\W\d_]+")
"""A run of letters (digits and punctuation belong to no language)."""
_CHARACTER_SCRIPTS = ("CJK", "HIRAGANA", "KATAKANA")
"""Scripts written without spaces: each character counts as a word."""


def phrase_pattern(phrases: Sequence[str]) -> re.Pattern:
    """One case-insensitive regex matching any phrase as whole words.

    >>> len(phrase_pattern(["wait"]).findall("Wait, wait... awaited"))
    2
    """
    if not phrases:
        return re.compile(r"(?!x)x")  # matches nothing
    alternatives = sorted((re.escape(p.strip()) for p in phrases if p.strip()), key=len, reverse=True)
    return re.compile(r"(?<!\w)(?:" + "|".join(alternatives) + r")(?!\w)", re.IGNORECASE)


def count_phrases(texts: Sequence[str], phrases: Sequence[str]) -> list[int]:
    """Occurrences of the reflection phrases in each text."""
    pattern = phrase_pattern(phrases)
    return [len(pattern.findall(t)) for t in texts]


def script(char: str) -> str:
    """The script of one letter, from its Unicode name: "LATIN", "CYRILLIC", "CJK" (kana included), ...

    >>> script("a"), script("ж"), script("中"), script("か")
    ('LATIN', 'CYRILLIC', 'CJK', 'CJK')
    """
    name = unicodedata.name(char, "UNKNOWN").split(" ")[0]
    return "CJK" if name in _CHARACTER_SCRIPTS else name


def word_scripts(text: str) -> list[str]:
    """The script of each word (Han and kana: of each character).

    >>> word_scripts("The sum 12 is 中文 ok")
    ['LATIN', 'LATIN', 'LATIN', 'CJK', 'CJK', 'LATIN']
    """
    out = []
    for word in _WORD.findall(text):
        first = script(word[0])
        out.extend([script(c) for c in word] if first == "CJK" else [first])
    return out


def main_script(text: str) -> str | None:
    """The script most of the text's words are written in (None: no words)."""
    scripts = word_scripts(text)
    return max(sorted(set(scripts)), key=scripts.count) if scripts else None


def language_consistency(prompt: str, completion: str) -> float | None:
    """Share of the completion's words in the prompt's main script; None when either has no words.

    >>> language_consistency("What is 2 + 2?", "It is four, 四")
    0.75
    """
    target, words = main_script(prompt), word_scripts(completion)
    if target is None or not words:
        return None
    return sum(s == target for s in words) / len(words)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True)
class Reflection:
    """What one completion's self-check did, as its task's parser reads it."""

    reflects: bool
    """A check step of any kind (confirming or correcting)."""
    corrects: bool
    """A correction: the completion says "wait"."""
    first_right: bool | None
    """The answer before any check was right (None: no first answer to read)."""
    empty: bool
    """A check or "wait" that neither re-derives the result nor concludes from it."""


CHECK_FORMATS: dict[str, Callable[[str, str], Reflection]] = {}
"""Marker word -> a task's parser of its check step: (prompt, completion) -> Reflection."""


def register_check_format(marker: str, parse: Callable[[str, str], Reflection]) -> None:
    CHECK_FORMATS[marker.lower()] = parse


def check_parser(phrases: Sequence[str]) -> Callable[[str, str], Reflection] | None:
    """The parser of the first registered marker among the run's reflection phrases (None: none is there)."""
    wanted = {p.strip().lower() for p in phrases}
    return next((parse for marker, parse in CHECK_FORMATS.items() if marker in wanted), None)


def check_metrics(reflections: Sequence[Reflection], correct: Sequence[bool | None]) -> dict[str, float]:
    """Per-completion shares of what the checks did; accuracy split by whether the completion reflected.

    A "wait" fixed the answer when the first attempt was wrong and the final one right, broke it when the first
    was right and the final wrong; both are shares of all completions (divide by correction_rate for the share
    of corrections). `empty_reflection` is the share of completions whose reflection was empty."""
    assert len(reflections) == len(correct), "one verdict per completion"
    pairs = list(zip(reflections, correct))
    fixed = [r.corrects and r.first_right is False and c is True for r, c in pairs]
    broke = [r.corrects and r.first_right is True and c is False for r, c in pairs]
    return {
        "behaviour/correction_rate": _mean([float(r.corrects) for r in reflections]),
        "behaviour/wait_fixed_rate": _mean([float(f) for f in fixed]),
        "behaviour/wait_broke_rate": _mean([float(b) for b in broke]),
        "behaviour/empty_reflection": _mean([float(r.empty) for r in reflections]),
        "behaviour/accuracy/reflective": _mean([float(c) for r, c in pairs if r.reflects and c is not None]),
        "behaviour/accuracy/direct": _mean([float(c) for r, c in pairs if not r.reflects and c is not None]),
    }


def behaviour_metrics(prompts: Sequence[str], texts: Sequence[str], lengths: Sequence[int],
                      correct: Sequence[bool | None], phrases: Sequence[str]) -> dict[str, float]:
    """behaviour/* metrics of one step's N completions.

    `lengths` are completion tokens; `correct` is None where correctness is unknown (left out of the
    correct/incorrect splits). A split with no completion is NaN, never 0. When `phrases` hold a registered
    check marker, the check metrics of its task's format join them (`check_metrics`).
    """
    assert len(prompts) == len(texts) == len(lengths) == len(correct), "one prompt, length and verdict per text"
    counts = count_phrases(texts, phrases)
    reflects = [c > 0 for c in counts]
    right = [i for i, c in enumerate(correct) if c is True]
    wrong = [i for i, c in enumerate(correct) if c is False]
    consistency = [v for v in map(language_consistency, prompts, texts) if v is not None]
    tokens = sum(lengths)
    parse = check_parser(phrases)
    checks = check_metrics([parse(p, t) for p, t in zip(prompts, texts)], correct) if parse else {}
    return {
        "behaviour/reflection_rate": _mean([float(r) for r in reflects]),
        "behaviour/reflection_rate/correct": _mean([float(reflects[i]) for i in right]),
        "behaviour/reflection_rate/incorrect": _mean([float(reflects[i]) for i in wrong]),
        "behaviour/phrases_per_1k_tokens": PER_TOKENS * sum(counts) / tokens if tokens else math.nan,
        "behaviour/len_correct": _mean([float(lengths[i]) for i in right]),
        "behaviour/len_incorrect": _mean([float(lengths[i]) for i in wrong]),
        "behaviour/lang_consistency": _mean(consistency),
        **checks,
    }


def first_fixes(rows: Sequence[dict]) -> dict:
    """For each held-out problem, the first evaluation step at which a "wait" fixed it (`corrects`, first answer
    wrong, final answer right) after an earlier evaluation answered it wrong: the aha moment of one problem.
    `rows` are held_out.jsonl's ({step, id, correct, corrects, first_right}); problems never so fixed are absent.

    >>> first_fixes([{"step": 0, "id": 7, "correct": False}, {"step": 20, "id": 7, "correct": True,
    ...              "corrects": True, "first_right": False}])
    {7: 20}
    """
    wrong_before, out = set(), {}
    for r in sorted(rows, key=lambda r: r["step"]):
        fixed = r.get("corrects") and r.get("first_right") is False and r.get("correct")
        if fixed and r["id"] in wrong_before and r["id"] not in out:
            out[r["id"]] = r["step"]
        if not r.get("correct"):
            wrong_before.add(r["id"])
    return out
