"""A calculator: four tools (TRL's `tools=` form: plain functions) and multi-digit arithmetic tasks a small model
gets wrong without them, judged by the final number of the last reply.

    tasks: "What is 4821 * 37?" (a multiplication of a `digits`-digit number by a 2- or 3-digit one, sometimes
           plus a third number); train and test split by a hash of the question (aha.data.splits.split_of)
    tools: add, subtract, multiply, divide
    reward: `final_answer` = 1.0 when the last number of the last assistant message is the answer, else 0.0
"""

from __future__ import annotations

import random
import re
from fractions import Fraction

from ..data.splits import split_of

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _exact(x: float) -> float | int:
    """Whole results as ints (so 12.0 reads 12)."""
    return int(x) if float(x).is_integer() else x


def add(a: float, b: float) -> float:
    """
    Add two numbers.

    Args:
        a: The first number.
        b: The second number.

    Returns:
        a + b.
    """
    return _exact(a + b)


def subtract(a: float, b: float) -> float:
    """
    Subtract one number from another.

    Args:
        a: The number to subtract from.
        b: The number to subtract.

    Returns:
        a - b.
    """
    return _exact(a - b)


def multiply(a: float, b: float) -> float:
    """
    Multiply two numbers.

    Args:
        a: The first number.
        b: The second number.

    Returns:
        a * b.
    """
    return _exact(a * b)


def divide(a: float, b: float) -> float:
    """
    Divide one number by another.

    Args:
        a: The dividend.
        b: The divisor (not 0).

    Returns:
        a / b.
    """
    return _exact(a / b)


TOOLS = [add, subtract, multiply, divide]
HOW = (' Use the tools, one call at a time, e.g. <tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}'
       '\n</tool_call>, then give the final number.')
"""What a question asks for, with one call shown (a small instruct model never trained on tools rarely writes a call
even so: it needs a warm-up on tool conversations, docs/agents.md)."""


def final_number(text: str) -> str | None:
    """The last number written in `text`, commas dropped: final_number("so 1,234 * 2 = 2,468.") -> "2468"."""
    found = NUMBER.findall(text or "")
    return found[-1].replace(",", "").rstrip(".") if found else None


def final_answer(completions, answer, **kwargs) -> list[float]:
    """1.0 when the last number of the last assistant message (the reply after any tool calls) is the answer, compared
    exactly (as floats, F(79) and F(79) + 1 would be equal: integers past 2**53 round)."""
    out = []
    for completion, gold in zip(completions, answer):
        last = completion if isinstance(completion, str) else next(
            (m.get("content") or "" for m in reversed(completion) if m["role"] == "assistant"), "")
        value = final_number(last)
        out.append(float(value is not None and Fraction(value) == Fraction(str(gold))))
    return out


def make_tasks(split: str, n: int, seed: int = 0, digits: int = 4) -> list[dict]:
    """n rows of `split`: prompt (chat messages), answer, id, and `solution`: the calls that solve it, each with its
    result ([("multiply", {"a": 4821, "b": 37}, 178377)], then an `add` when there is a third number)."""
    rng, rows, seen = random.Random(f"calc-{seed}-{split}-{digits}"), [], set()
    for _ in range(100 * n):
        if len(rows) == n:
            break
        a, b = rng.randint(10 ** (digits - 1), 10 ** digits - 1), rng.randint(11, 999)
        c = rng.choice([0, 0, rng.randint(10, 999)])
        question = f"What is {a} * {b}" + (f" + {c}" if c else "") + "?"
        if question in seen or split_of(question) != split:
            continue
        seen.add(question)
        solution = [("multiply", {"a": a, "b": b}, a * b)] + ([("add", {"a": a * b, "b": c}, a * b + c)] if c else [])
        rows.append({"prompt": [{"role": "user", "content": question + HOW}], "answer": str(a * b + c), "id": question,
                     "solution": solution})
    if len(rows) < n:
        raise ValueError(f"only {len(rows)} distinct {split} questions; asked for {n}")
    return rows
