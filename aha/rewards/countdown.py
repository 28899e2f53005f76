"""Countdown: reach a target with the given numbers, each used exactly once, and + - * / with parentheses.
The expression is evaluated by walking its syntax tree with exact fractions; nothing is ever `eval`ed."""
from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from .base import Reward, completion_text
from .maths import extract_answer

MAX_EXPRESSION_CHARS = 300
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
_SYMBOLS = str.maketrans({"×": "*", "·": "*", "÷": "/", "−": "-", "–": "-"})


def countdown_value(expression: str, numbers: list[int]) -> Fraction | None:
    """The exact value of `expression` if it uses each of `numbers` exactly once (as written: no 2 and 5 made
    into 25, no unary minus, no powers) with + - * / and parentheses; None otherwise or on division by zero.
    A trailing `= target` is ignored.

    >>> countdown_value("(25 - 5) * 3 = 60", [3, 5, 25])
    Fraction(60, 1)
    >>> countdown_value("2 ** 5", [2, 5]) is None, countdown_value("25 * 3", [2, 5, 3]) is None
    (True, True)
    """
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        return None
    expression = expression.translate(_SYMBOLS).replace("\\times", "*").replace("\\div", "/").split("=")[0]
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        raise ValueError(f"not allowed: {type(node).__name__}")

    try:
        value = walk(tree.body)
    except (ValueError, ZeroDivisionError, RecursionError):
        return None
    return value if Counter(used) == Counter(int(n) for n in numbers) else None


def _numbers(value: Any) -> list[int]:
    """A numbers cell as a list: a list already, or text such as "[3, 5, 25]"."""
    if isinstance(value, str):
        return [int(n) for n in re.findall(r"-?\d+", value)]
    return [int(n) for n in value]


class CountdownReward(Reward):
    """1.0 when the answer (in `<answer>` or `\\boxed{}`) is an expression that uses each number once and equals
    the target; `format_score` when it is a well-formed expression over the numbers with another value; else 0.0.

    >>> CountdownReward()(None, ["<answer>(25 - 5) * 3</answer>"], target=[60], nums=[[3, 5, 25]])
    [1.0]
    """

    name = "countdown"

    def __init__(self, target_column: str = "target", numbers_column: str = "nums", format_score: float = 0.0):
        super().__init__()
        self.target_column = target_column
        self.numbers_column = numbers_column
        self.format_score = format_score
        self.required_columns = (target_column, numbers_column)

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        targets, numbers = kwargs[self.target_column], kwargs[self.numbers_column]
        out: list[float | None] = []
        for completion, target, nums in zip(completions, targets, numbers):
            try:
                target, nums = Fraction(str(target)), _numbers(nums)
            except (TypeError, ValueError):
                self.count("data_errors")
                out.append(None)
                continue
            expression = extract_answer(completion_text(completion), last_number_fallback=False)
            value = countdown_value(expression, nums) if expression else None
            out.append(0.0 if value is None else 1.0 if value == target else self.format_score)
        return out


countdown_reward = CountdownReward()
