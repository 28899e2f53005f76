"""Math answers: find the final answer in a completion (extraction), then decide if it equals the gold answer
(comparison). Numbers are compared here, in-process; anything symbolic goes to math-verify in a pool of
killable workers with a wall-clock limit and a memory cap per comparison, so one slow answer costs one
timeout, not a hang. Answers too large to evaluate (`2^{10^{10}}`) are set aside before they reach it.

A comparison that was not decided (time or memory limit, an answer too large to evaluate, a call budget
run out) is not a wrong answer: its reward is None, which the trainer excludes and counts."""
from __future__ import annotations

import math
import os
import re
import string
import sys
import threading
from fractions import Fraction
from typing import Any

from .base import Reward, completion_text
from .pool import WorkerPool

MAX_ANSWER_CHARS = 1000  # longer "answers" are wrong without a look: no real answer is a page long
MAX_BOXES = 20  # more \boxed{} (or <answer>, or ####) than this is spraying, not answering
TAIL_CHARS = 4000  # the last-number fallback looks only at the end of the text
DEFAULT_TIMEOUT_S = 3.0
DEFAULT_MEMORY_MB = 1024
DEFAULT_BATCH_TIMEOUT_S = math.inf  # per-comparison limits bound a call; a finite budget leaves the rest unjudged
MAX_EXPONENT_DIGITS = 5  # an exponent or factorial argument past 99,999, or any tower, is too large to evaluate
FLOAT_ROUNDING = 6  # the fewest decimal places that may stand for an endless expansion: 1/3 == 0.333333 != 0.33

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"[{}]")
# a sign (not a hyphen after a word or a number: "range 10-20"), then a mixed number "1 1/2", a number or ".5"
_LAST_NUMBER = re.compile(r"(?:(?<!\w)[-\u2212])?(?:\d+ \d+/\d+|\d[\d,]*(?:\.\d+)?(?:/\d+)?|(?<!\d)\.\d+)")
# GSM8K's answer line starts with a number (lm-eval: "#### (\-?[0-9\.\,]+)"): "#### 72", not "#### 1. Eggs left"
_HASHES_ANSWER = re.compile(r"\s*(?:\\?\$\s*)?[-\u2212]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:\s|\.?$)")
_POWER = re.compile(r"\^|\*\*")
_DIGITS = re.compile(r"\d+")


# ---------------------------------------------------------------- extraction

def boxed_contents(text: str) -> list[str] | None:
    """Contents of the top-level `\\boxed{...}` in order, nested braces matched; None if one never closes.

    >>> boxed_contents(r"so \\boxed{\\frac{1}{2}} and \\boxed{3}")
    ['\\\\frac{1}{2}', '3']
    """
    out: list[str] = []
    pos = 0
    for m in _BOXED.finditer(text):
        if m.start() < pos:  # inside the previous box
            continue
        depth, end = 1, None
        for b in _BRACE.finditer(text, m.end(), m.end() + MAX_ANSWER_CHARS + 1):
            depth += 1 if b.group() == "{" else -1
            if depth == 0:
                end = b.start()
                break
        if end is None:
            return None
        out.append(text[m.end():end])
        pos = end + 1
        if len(out) > MAX_BOXES:
            return None
    return out


def _tag_blocks(text: str, open_tag: str, close_tag: str) -> list[str]:
    """Contents of every closed `open_tag ... close_tag` block (linear time, unlike a lazy regex)."""
    blocks = []
    for piece in text.split(open_tag)[1:]:
        end = piece.find(close_tag)
        if end >= 0:
            blocks.append(piece[:end])
    return blocks


def _only(answers: list[str]) -> str | None:
    """The one answer (the last, when they are equal in value by `fast_verdict`), or None when there is none or
    several that differ (a hedge earns nothing)."""
    distinct = list(dict.fromkeys(a.strip() for a in answers))
    if not distinct or any(fast_verdict(a, b) is not True for i, a in enumerate(distinct) for b in distinct[i + 1:]):
        return None
    return answers[-1].strip()


def extract_answer(text: str, last_number_fallback: bool = True) -> str | None:
    """The final answer: the `<answer>` block (a `\\boxed{}` inside it wins), else the `\\boxed{}` content, else
    GSM8K's `#### n` (a number after `####`: "#### Step 1" is a heading), else (optionally) the last number. Several
    answers of one kind that differ in value are a hedge: None.

    >>> extract_answer(r"<think>...</think><answer>$\\boxed{\\frac{1}{2}}$</answer>")
    '\\\\frac{1}{2}'
    >>> extract_answer("Natalia sold 48 + 24 = 72 clips.\\n#### 72")
    '72'
    >>> extract_answer("so it is 12 cm.")
    '12'
    >>> extract_answer(r"\\boxed{3} or perhaps \\boxed{5}") is None
    True
    >>> extract_answer(r"\\boxed{\\frac{1}{2}}, i.e. \\boxed{0.5}"), extract_answer("#### Step 1\\n3 eggs, 1 1/2 cups")
    ('0.5', '1 1/2')
    """
    if not isinstance(text, str):
        return None
    if text.count("<answer>") > MAX_BOXES or text.count("####") > MAX_BOXES:
        return None
    if "<answer>" in text:
        blocks = _tag_blocks(text, "<answer>", "</answer>")
        if blocks:
            answer = _only(blocks)
            if answer is None:
                return None
            boxes = boxed_contents(answer)
            if boxes is None:
                return None
            return _clean_outer(_only(boxes) if boxes else answer)
    boxes = boxed_contents(text)
    if boxes is None:
        return None
    if boxes:
        return _clean_outer(_only(boxes))
    lines = (block.split("\n", 1)[0] for block in text.split("####")[1:])
    hashes = [line for line in lines if _HASHES_ANSWER.match(line)]
    if hashes:
        return _clean_outer(_only(hashes))
    if last_number_fallback:
        tail_start = max(0, len(text) - TAIL_CHARS)
        last = None
        for last in _LAST_NUMBER.finditer(text, tail_start):
            pass
        if last is not None and not (last.start() == tail_start > 0 and text[tail_start - 1].isdigit()):
            return last.group().rstrip(",").replace("\u2212", "-")
    return None


def _clean_outer(answer: str | None) -> str | None:
    """Strip the wrapping a model puts around an answer: spaces, `$...$`, `\\(...\\)`, a final period."""
    if answer is None:
        return None
    a = answer.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(a) >= len(left) + len(right) and a.startswith(left) and a.endswith(right):
            a = a[len(left):len(a) - len(right)].strip()
    return a.rstrip(".").strip() or None


def gold_answer(gold: Any) -> str | None:
    """The answer in a dataset's gold column: a bare answer, a solution with `\\boxed{}` (the last one counts),
    or a GSM8K solution ending in `#### n`. None when there is nothing to compare with (a data error).

    >>> gold_answer("Natalia sold 48/2 = 24 clips in May.\\n#### 72")
    '72'
    """
    if gold is None or isinstance(gold, bool):
        return None
    text = str(gold).strip()
    boxes = boxed_contents(text)
    if boxes:
        return _clean_outer(boxes[-1])
    if "####" in text:
        return _clean_outer(text.rsplit("####", 1)[1].split("\n", 1)[0])
    return _clean_outer(text)


# ---------------------------------------------------------------- comparison

_THIN_THOUSANDS = re.compile(r"\\(?:(?<=\d\\)|(?<=\d,\\))[,!] *(?=\d{3}(?!\d))")  # digit groups: 1\,000, 11,\! 111
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{([^{}]*)\}")
_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+")
_UNIT = re.compile(r"(?:[a-zA-Z]{2,}\.?)(?:\s+[a-zA-Z]+\.?)*")
_FRAC = re.compile(r"([+-]?)(?:\\frac\{([+-]?\d+)\}\{(\d+)\}|(?:(\d+) )?(\d+)/(\d+))")  # "\frac{-3}{4}", "1 1/2"
_NOT_UNITS = {"pi", "sqrt", "ln", "log", "sin", "cos", "tan", "exp", "cdot", "times", "infty", "or", "and"}
# Words that change the value they follow: never a unit ("10 million" != 10). "squared" and "cubed" act on the
# number only right after it; after a unit they are the unit's ("12 inches squared").
_SCALE_WORDS = set("""hundred thousand million billion trillion dozen half halves third quarter fourth fifth sixth
                   seventh eighth ninth tenth hundredth thousandth millionth percent factorial""".split())
_POWER_WORDS = {"squared", "cubed"}
_WORD_CHARS = string.ascii_letters + ". "
# Spaces that cannot change a value: around an operator or a bracket, before a command, after a comma ("x + 1" is
# "x+1", "(1, 2)" is "(1,2)"). Not between numbers ("2 3" is not 23), nor where a comma would become a thousands
# separator ("2, 100" is two answers, "2,100" one).
_LOOSE_SPACE = re.compile(r" (?:(?<=[-+*/=<>^_;:!|&()\[\]{}] )|(?=[-+*/=<>^_;:!|&()\[\]{}\\])|(?<=, )(?!\d{3}(?!\d)))")


def _normalise(s: str) -> str:
    """Cosmetic LaTeX that never changes a value: spacing (`_LOOSE_SPACE`), \\left/\\right, dfrac, \\text{}, degrees,
    \\$, LaTeX spacing between digit groups (1\\,000)."""
    s = _THIN_THOUSANDS.sub("", _TEXT_WRAP.sub(r" \1 ", s))
    for old, new in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""), ("\\!", ""),
                     ("\\,", " "), ("\\;", " "), ("\\ ", " "), ("~", " "), ("^{\\circ}", ""), ("^\\circ", ""),
                     ("\\%", "%"), ("\\$", ""), ("\u2212", "-")):
        s = s.replace(old, new)
    return _LOOSE_SPACE.sub("", " ".join(s.split())).rstrip(".").strip()


def _changes_value(words: list[str]) -> bool:
    """Do these words after a number change its value ("10 million", "2 thirds", "5 factorial", "12 squared")?

    >>> _changes_value(["million"]), _changes_value(["thirds"]), _changes_value(["inches", "squared"])
    (True, True, False)
    """
    words = [w.rstrip(".").lower() for w in words]
    return bool(words) and (words[0] in _POWER_WORDS or any({w, w[:-1]} & _SCALE_WORDS for w in words))


def _scaled(answer: str) -> bool:
    """Does `answer` end in words that change the value before them ("2 \\text{ million}", "\\frac{1}{2} dozen")?"""
    s = _normalise(answer)
    head = s.rstrip(_WORD_CHARS)  # a text answer ("one half") is all words: there is nothing they could scale
    return bool(head) and _changes_value(s[len(head):].split())


def parse_number(answer: str) -> tuple[Fraction, bool, Fraction] | None:
    """(value, is_percent, last_place) of a plain number, possibly with thousands commas, a currency sign, a percent
    sign, a unit word, or a simple or mixed fraction; None for anything else (that is math-verify's job), and for a
    word that changes the value, which is no unit ("10 million"). last_place is the value of a 1 in the last digit
    written (0.01 for 1,000.50, 1 for 12), and 0 for a fraction, which is exact.

    >>> parse_number("$1,000.50")
    (Fraction(2001, 2), False, Fraction(1, 100))
    >>> parse_number("12 cm")
    (Fraction(12, 1), False, Fraction(1, 1))
    >>> parse_number("-\\\\frac{3}{4}")[0], parse_number("1 1/2")[0], parse_number("10 million")
    (Fraction(-3, 4), Fraction(3, 2), None)
    """
    s = _normalise(answer).lstrip("$").strip()
    if len(s) > 64:
        return None
    percent = s.endswith("%")
    s = s.rstrip("%").strip()
    m = _FRAC.fullmatch(s)
    if m:
        sign, num, den, whole = m.group(1), m.group(2) or m.group(5), m.group(3) or m.group(6), m.group(4) or "0"
        if int(den) == 0:
            return None
        value = int(whole) + Fraction(int(num), int(den))
        return (-value if sign == "-" else value), percent, Fraction(0)
    m = _NUMBER.match(s)
    if not m:
        return None
    rest = s[m.end():].strip()
    if rest:
        words = rest.split()
        if percent or not _UNIT.fullmatch(rest) or _changes_value(words) or \
                any(w.rstrip(".").lower() in _NOT_UNITS for w in words):
            return None
    number = m.group().replace(",", "")
    return Fraction(number), percent, Fraction(1, 10 ** len(number.partition(".")[2]))


def _endless(x: Fraction) -> bool:
    """Does the decimal expansion of `x` never end (1/3), i.e. has its denominator a prime other than 2 and 5?"""
    d = x.denominator
    for prime in (2, 5):
        while d % prime == 0:
            d //= prime
    return d != 1


def _same_number(a: Fraction, a_place: Fraction, b: Fraction, b_place: Fraction) -> bool:
    """Two values with the value of their last written digit (`parse_number`): exact values must be equal. Only a
    decimal written to FLOAT_ROUNDING places or more may stand for a value that never ends, and then for the one
    it rounds: 0.333333 == 1/3, but 0.33 != 1/3, 0.3333334 != 1/3, 1/3 != 333333/1000000 and 0 != 1/2000000.

    >>> third, six_places, two_places = (Fraction(1, 3), 0), Fraction(1, 10**6), Fraction(1, 100)
    >>> _same_number(*third, Fraction("0.333333"), six_places), _same_number(*third, Fraction("0.33"), two_places)
    (True, False)
    """
    if a == b:
        return True
    return any(0 < place <= Fraction(1, 10 ** FLOAT_ROUNDING) and _endless(other) and abs(other - decimal) < place / 2
               for decimal, place, other in ((a, a_place, b), (b, b_place, a)))


def fast_verdict(pred: str, gold: str) -> bool | None:
    """Decide without sympy when possible: identical after cosmetic normalisation, or both plain numbers.
    None means undecided (symbolic). A percent matches its number and its fraction: 50% == 50 == 0.5. A number
    with a word that changes its value matches only the same text: "10 million" != 10, and != 10000000 too.

    >>> fast_verdict("1,000", "1000"), fast_verdict("42.0", "42"), fast_verdict("0.5", "1/2"), fast_verdict("41", "42")
    (True, True, True, False)
    >>> fast_verdict("\\\\sqrt{4}", "2") is None
    True
    >>> fast_verdict("10 million", "10"), fast_verdict("0.333333", "1/3"), fast_verdict("0", "1/2000000")
    (False, True, False)
    """
    if len(pred) > MAX_ANSWER_CHARS:
        return False
    if _normalise(pred) == _normalise(gold):
        return True
    p, g = parse_number(pred), parse_number(gold)
    if p is None or g is None:
        return False if _scaled(pred) or _scaled(gold) else None  # "10 million" is neither 10 nor, here, 10^7
    (pv, pp, p_place), (gv, gp, g_place) = p, g
    preds = {(pv, p_place), (pv / 100, p_place / 100)} if pp and not gp else {(pv, p_place)}
    golds = {(gv, g_place), (gv / 100, g_place / 100)} if gp and not pp else {(gv, g_place)}
    return any(_same_number(*x, *y) for x in preds for y in golds)


def _operand(text: str, start: int) -> str:
    """The exponent that starts at `start`: a `{...}` group (braces matched) or the token there."""
    text = text[start:].lstrip()
    if text.startswith("{"):
        depth = 0
        for i, ch in enumerate(text):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth == 0:
                return text[1:i]
        return text[1:]
    m = re.match(r"\d+|\\?[A-Za-z]+|\(", text)
    return m.group() if m else text[:1]


def too_large(answer: str, max_digits: int | None = MAX_EXPONENT_DIGITS) -> bool:
    """Would evaluating `answer` build an astronomically large number? An exponent that is itself a power (a
    tower), or an exponent or factorial argument with more than `max_digits` digits. None disables the check.

    >>> too_large("2^{10^{10}}"), too_large("(10^{10})!"), too_large("2^{100000}"), too_large("2^{10} + 3!")
    (True, True, True, False)
    """
    if max_digits is None:
        return False
    for m in _POWER.finditer(answer):
        exponent = _operand(answer, m.end())
        if _POWER.search(exponent) or any(len(d) > max_digits for d in _DIGITS.findall(exponent)):
            return True
    for i in (i for i, ch in enumerate(answer) if ch == "!"):
        head = answer[:i].rstrip()
        argument = head[head.rfind("(") + 1:] if head.endswith(")") else (_DIGITS.findall(head[-12:]) or [""])[-1]
        if _POWER.search(argument) or any(len(d) > max_digits for d in _DIGITS.findall(argument)):
            return True
    return False


UNDECIDED_COUNTERS = {"timeout": "timeouts", "too_large": "too_large", "unjudged": "unjudged", "error": "errors"}
"""How a comparison went undecided -> the metric that counts it (reward/<counter>)."""

_POOLS: dict[tuple[int, int], WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


def symbolic_pool(memory_mb: int = DEFAULT_MEMORY_MB) -> WorkerPool:
    """The shared math-verify pool for this memory cap (one per process, started on first use)."""
    key = (os.getpid(), memory_mb)  # a forked trainer process gets its own workers
    with _POOLS_LOCK:
        if key not in _POOLS:
            worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_math_worker.py")
            _POOLS[key] = WorkerPool([sys.executable, "-I", worker, str(memory_mb), str(os.getpid())])
        return _POOLS[key]


def compare_answers(pairs: list[tuple[str, str]], timeout_s: float = DEFAULT_TIMEOUT_S,
                    memory_mb: int = DEFAULT_MEMORY_MB, batch_timeout_s: float = DEFAULT_BATCH_TIMEOUT_S,
                    max_exponent_digits: int | None = MAX_EXPONENT_DIGITS) -> list[tuple[bool | None, str]]:
    """(verdict, how) for each (pred, gold). how is "fast" or "symbolic" (decided: verdict True/False, or None
    when the gold does not parse), else the verdict is None (not decided, never "wrong") and how says why:
    "too_large" (set aside before evaluation), "timeout" (its own time or memory limit), "unjudged" (the call's
    `batch_timeout_s` ran out before it was judged) or "error" (the pool could not run)."""
    out: list[tuple[bool | None, str] | None] = []
    symbolic: dict[tuple[str, str], list[int]] = {}
    for i, (pred, gold) in enumerate(pairs):
        verdict = fast_verdict(pred, gold)
        if verdict is None and too_large(pred, max_exponent_digits):
            out.append((None, "too_large"))
            continue
        out.append(None if verdict is None else (verdict, "fast"))
        if verdict is None:
            symbolic.setdefault((pred, gold), []).append(i)  # GRPO groups repeat answers: judge each pair once
    if symbolic:
        keys = list(symbolic)
        replies = symbolic_pool(memory_mb).map([{"pred": p, "gold": g} for p, g in keys], timeout_s, batch_timeout_s)
        for key, (status, reply) in zip(keys, replies):
            if status == "ok" and "limit" not in reply:
                result = (bool(reply["equal"]) if reply["gold_ok"] else None, "symbolic")
            else:
                result = (None, {"ok": "timeout", "crash": "timeout"}.get(status, status))
            for i in symbolic[key]:
                out[i] = result
    return out  # type: ignore[return-value]


def answers_equal(pred: str, gold: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool | None:
    """Is `pred` the same answer as `gold`? None when `gold` cannot be parsed (or the pool cannot run).

    >>> answers_equal("1,000", "1000")
    True
    """
    if pred is None:
        return False
    gold_text = gold_answer(gold)
    if gold_text is None:
        return None
    return compare_answers([(str(pred), gold_text)], timeout_s)[0][0]


# ---------------------------------------------------------------- reward

class MathReward(Reward):
    """1.0 when the completion's final answer equals the gold answer in `answer_column`, else 0.0; None (and a
    `data_errors` count) when the gold answer is missing or cannot be parsed. Each symbolic comparison gets
    `timeout_s` of wall clock and `memory_mb` of address space; one that is not decided is None, never 0.0, and
    counts in `timeouts`, `too_large` or `unjudged` (a finite `batch_timeout_s` for the whole call ran out).

    >>> MathReward()(["1+1?"], ["<answer>2</answer>"], answer=["2"])
    [1.0]
    """

    name = "math"

    def __init__(self, answer_column: str = "answer", last_number_fallback: bool = True,
                 timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
                 batch_timeout_s: float = DEFAULT_BATCH_TIMEOUT_S,
                 max_exponent_digits: int | None = MAX_EXPONENT_DIGITS):
        super().__init__()
        self.max_exponent_digits = max_exponent_digits
        self.answer_column = answer_column
        self.last_number_fallback = last_number_fallback
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.batch_timeout_s = batch_timeout_s
        self.required_columns = (answer_column,)

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        golds = kwargs[self.answer_column]
        if len(golds) != len(completions):
            raise ValueError(f"column {self.answer_column!r} has {len(golds)} rows for {len(completions)} completions")
        rewards: list[float | None] = [0.0] * len(completions)
        pairs, where = [], []
        for i, (completion, gold) in enumerate(zip(completions, golds)):
            gold_text = gold_answer(gold)
            if gold_text is None:
                rewards[i] = None
                self.count("data_errors")
                continue
            pred = extract_answer(completion_text(completion), self.last_number_fallback)
            if pred is not None:
                pairs.append((pred, gold_text))
                where.append(i)
        verdicts = compare_answers(pairs, self.timeout_s, self.memory_mb, self.batch_timeout_s, self.max_exponent_digits)
        for i, (verdict, how) in zip(where, verdicts):
            rewards[i] = None if verdict is None else float(verdict)
            for how_name, counter in UNDECIDED_COUNTERS.items():
                self.count(counter, how == how_name)
            self.count("data_errors", verdict is None and how == "symbolic")
        return rewards


math_reward = MathReward()
