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
_ARITHMETIC = re.compile(r"[0-9\s.+\-*/()]*")


def exact_value(expression: str, decimals: bool = False,
                negation: bool = False) -> tuple[Fraction, list[Fraction]] | None:
    """The exact value of an arithmetic expression and the numbers it is written with, in order, found by walking
    its syntax tree with fractions (never `eval`): numbers, + - * / and parentheses; decimals such as `0.5` and a
    unary minus only when asked. None for anything else, on division by zero, or past MAX_EXPRESSION_CHARS.

    >>> exact_value("(25 - 5) × 3")
    (Fraction(60, 1), [Fraction(25, 1), Fraction(5, 1), Fraction(3, 1)])
    >>> exact_value("-.5 * 4", decimals=True, negation=True)[0], exact_value("-.5 * 4"), exact_value("2 ** 5")
    (Fraction(-2, 1), None, None)
    """
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        return None
    source = expression.translate(_SYMBOLS).replace("\\times", "*").replace("\\div", "/").strip()
    if not _ARITHMETIC.fullmatch(source):  # no names, calls, exponents or underscores reach the parser
        return None
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    used: list[Fraction] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if negation and isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Constant) and (type(node.value) is int or decimals and type(node.value) is float):
            used.append(Fraction(ast.get_source_segment(source, node)))  # as written: 0.1 is 1/10, not a float
            return used[-1]
        raise ValueError(f"not allowed: {type(node).__name__}")

    try:
        return walk(tree.body), used
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


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
    found = exact_value(expression.split("=")[0])
    if found is None:
        return None
    value, used = found
    return value if Counter(used) == Counter(Fraction(int(n)) for n in numbers) else None


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

_NUMBER = r"\d{1,30}(?:\.\d{1,30})?"  # bounded: a longer number is no step (and no huge Fraction)
EQUATION = re.compile(rf"(?<![\d.])({_NUMBER})[ \t]*([-+*/])[ \t]*({_NUMBER})[ \t]*=[ \t]*(-?{_NUMBER})(?!\.?\d)")
"""One written step `a op b = c`, e.g. `25 - 5 = 20` or `20*3=60`: groups are a, op, b, c."""
_CONTINUED = re.compile(r"[\d)][ \t]*[-+*/][ \t]*$")
"""Text ending in `x op ` on one line: an equation starting there is the tail of a longer expression, not a step
(`10 - 5 - 2 = 3` holds no step `5 - 2 = 3`); a new line's `- ` is a bullet."""


def _reasoning_span(text: str) -> tuple[int, int]:
    """Where the steps are: inside `<think>` (to `</think>`, else to `<answer>`, else to the end), or with no
    think everything before `<answer>`. Example: "<think>1+2=3</think><answer>3</answer>" -> (7, 12)."""
    start = text.find("<think>")
    start = 0 if start < 0 else start + len("<think>")
    ends = [i for i in (text.find("</think>", start), text.find("<answer>", start)) if i >= 0]
    return start, min(ends, default=len(text))


def countdown_steps(text: str, numbers: list[int]) -> list[tuple[int, float]]:
    """The equations `a op b = c` written while reasoning, each as (offset just after c, score): 1.0 when c is
    right (exact fractions) and a and b are both available, from `numbers` or from earlier right steps, each
    available value used once; else 0.0. A wrong step changes nothing: its operands stay, its result is not added.

    >>> countdown_steps("<think>25 - 5 = 20, 20*3=60, 20 + 5 = 25</think>", [3, 5, 25])
    [(18, 1.0), (27, 1.0), (40, 0.0)]
    """
    text = text.translate(_SYMBOLS)  # one character for one: offsets are unchanged
    start, end = _reasoning_span(text)
    pool, steps = Counter(Fraction(n) for n in numbers), []
    for m in EQUATION.finditer(text, start, end):
        if _CONTINUED.search(text[max(start, m.start() - 32):m.start()]):
            continue
        found = exact_value(text[m.start(1):m.end(3)], decimals=True)  # None: division by zero
        result, operands = Fraction(m.group(4)), Counter(found[1] if found else [])
        right = found is not None and found[0] == result and all(pool[v] >= k for v, k in operands.items())
        if right:
            pool = pool - operands + Counter([result])
        steps.append((m.end(), float(right)))
    return steps


class CountdownStepsReward(Reward):
    """Process reward for countdown: per completion a list of (end offset, score), one per equation written while
    reasoning (see `countdown_steps`); [] when none is written; None when the row's target or numbers do not
    parse (a data error, counted).

    >>> CountdownStepsReward()(None, ["<think>25-5=20 20*3=60</think>"], target=[60], nums=[[3, 5, 25]])
    [[(14, 1.0), (22, 1.0)]]
    """

    name = "countdown_steps"

    def __init__(self, target_column: str = "target", numbers_column: str = "nums"):
        super().__init__()
        self.target_column = target_column
        self.numbers_column = numbers_column
        self.required_columns = (target_column, numbers_column)

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[list[tuple[int, float]] | None]:
        targets, numbers = kwargs[self.target_column], kwargs[self.numbers_column]
        out: list[list[tuple[int, float]] | None] = []
        for completion, target, nums in zip(completions, targets, numbers):
            try:
                Fraction(str(target))  # unused by the steps, but a row that cannot be checked is a data error
                nums = _numbers(nums)
            except (TypeError, ValueError):
                self.count("data_errors")
                out.append(None)
                continue
            out.append(countdown_steps(completion_text(completion), nums))
        return out
