"""A lower bound on a text's token count that needs no tokenizing, so that an over-long prompt (a 10 MB line) is
refused in milliseconds instead of after tens of seconds and gigabytes of tokenizing it whole.

Why it is sound: a tokenizer that keeps all of its normalized text (byte-level BPE as GPT-2, Llama 3 and Qwen use,
SentencePiece with byte fallback as Llama 2 and Gemma use) splits that text into pieces, one per token, and no piece
is longer than L, the longest token string in the vocabulary (a byte-level token string has one character per byte,
so it never covers more characters than its length; a byte-fallback token such as "<0x0A>" covers one). A text of
C normalized characters therefore has at least ceil(C / L) tokens, and more if special tokens are added.

A tokenizer that drops or fuses text (a whitespace pre-tokenizer, one [UNK] for a long word, lower-casing) could
give fewer tokens, so the bound is used only for a tokenizer that gives a probe text (runs of spaces, tabs and
newlines, a 300-letter word, digits, accents, CJK, an emoji, a control character) back unchanged; for any other
tokenizer, or one without a `backend_tokenizer`, there is no bound and the prompt is tokenized as before.
"""

from __future__ import annotations

import math
import weakref

PROBE = "Ab  c\t\t\n\n  d " + "x" * 300 + " 1234567 é中🙂\x01 ~~~"
"""Text a tokenizer must give back unchanged (encode, then decode) before its length bound is trusted."""
_LONGEST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> L (or None), computed once


class PromptTooLong(ValueError):
    """A prompt that is certainly longer than allowed, told by its length in characters (it was not tokenized)."""


def longest_token_chars(tokenizer) -> int | None:
    """L: the most characters one token of `tokenizer` covers; None when the bound does not hold for it."""
    try:
        return _LONGEST[tokenizer]
    except KeyError:
        longest = _LONGEST[tokenizer] = _longest(tokenizer)
        return longest
    except TypeError:  # not weakly referable: computed each time
        return _longest(tokenizer)


def _longest(tokenizer) -> int | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "get_vocab"):
        return None
    try:
        back = backend.decode(backend.encode(PROBE, add_special_tokens=False).ids, skip_special_tokens=False)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot round-trip the probe gets no bound, not an error
        return None
    if back != PROBE:
        return None
    return max(map(len, backend.get_vocab(with_added_tokens=True)), default=0) or None


def tokens_over(tokenizer, text: str, max_tokens: int) -> int | None:
    """A lower bound on the tokens of `text` when it proves the text longer than max_tokens, else None (it may fit:
    tokenize it to know). The length is taken after the tokenizer's normalizer (NFC may join characters), which is
    run only when the raw length already exceeds max_tokens * L."""
    longest = longest_token_chars(tokenizer)
    if longest is None or len(text) <= max(max_tokens, 0) * longest:
        return None
    normalizer = tokenizer.backend_tokenizer.normalizer
    chars = len(normalizer.normalize_str(text)) if normalizer is not None else len(text)
    at_least = math.ceil(chars / longest)
    return at_least if at_least > max_tokens else None
