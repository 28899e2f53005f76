"""GSM8K's calculator annotations `<<48/2=24>>` as reasoning steps: each is right when its expression's exact value
is the value written after `=`. The expression is walked with fractions (countdown's `exact_value`), never `eval`ed."""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from .base import Reward, completion_text
from .countdown import MAX_EXPRESSION_CHARS, exact_value

ANNOTATION = re.compile(r"<<([^<>]*)>>")
"""One calculator note, GSM8K's format: `<<48/2=24>>`; group 1 is `48/2=24`."""
_DECIMAL = re.compile(r"-?(?:\d+\.?\d*|\.\d+)")


def annotation_right(note: str) -> bool:
    """Whether a note `expr=value` is exact arithmetic: numbers (decimals too), + - * /, parentheses, unary minus.

    >>> annotation_right("48/2=24"), annotation_right("(3+1)*-.5=-2"), annotation_right("10/3=3.33")
    (True, True, False)
    >>> annotation_right("24"), annotation_right("2**5=32"), annotation_right("1/0=0")
    (False, False, False)
    """
    if len(note) > MAX_EXPRESSION_CHARS:
        return False
    expression, sep, value = note.rpartition("=")
    if not sep or not _DECIMAL.fullmatch(value.strip()):
        return False
    found = exact_value(expression, decimals=True, negation=True)
    return found is not None and found[0] == Fraction(value.strip())


def calculator_steps(text: str) -> list[tuple[int, float]]:
    """Each `<<expr=value>>` note in `text` as (offset just after its `>>`, 1.0 if right else 0.0).

    >>> calculator_steps("48/2 = <<48/2=24>>24 and 48+24 = <<48+24=70>>70")
    [(18, 1.0), (45, 0.0)]
    """
    return [(m.end(), float(annotation_right(m.group(1)))) for m in ANNOTATION.finditer(text)]


class CalculatorStepsReward(Reward):
    """Process reward for GSM8K-style reasoning: per completion a list of (end offset, score), one per calculator
    note written (see `calculator_steps`), [] when none is written. Needs no dataset column.

    >>> CalculatorStepsReward()(None, [[{"role": "assistant", "content": "<<2*3=6>>6 <<6+1=8>>8"}]])
    [[(9, 1.0), (20, 0.0)]]
    """

    name = "calculator_steps"

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[list[tuple[int, float]]]:
        return [calculator_steps(completion_text(completion)) for completion in completions]

