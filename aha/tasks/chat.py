"""Two-number arithmetic asked in plain words, for small instruct models such as SmolLM2-135M-Instruct.

`chat_add`: "What is 23 + 41? Answer with just the number."   a, b in 0..50
`chat_sub`: "What is 41 - 23? Answer with just the number."   0 <= b <= a <= 50

Prompts are chat messages (the model's own chat template renders them) and the reply is free text: the
verifier is `math_reward`, which takes the final number of the reply ("23 + 41 = 64" -> 64). The base model
is right on about a quarter of these (greedy), far from the ceiling, so GRPO has something to sharpen; the
two tasks are the same kind, so one can be trained while the other shows what is lost or gained.
A problem's split is fixed by a hash of its text, with `a + b` and `b + a` on the same side, so no held-out
sum is ever trained on in either order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from .base import Task, extract_math_answer, math_answer_reward, register_task, split_of

INSTRUCTION = "Answer with just the number."
TEST_PERCENT = 25
"""Share of the problems held out (by hash): about 330 of the 1,326 add pairs, 330 of the 1,326 differences."""
TEST_SIZE = 300
"""Held-out problems evaluated by default: enough that one point of accuracy is three problems."""
MAX_OPERAND = 50


@dataclass(frozen=True)
class Operation:
    symbol: str
    apply: Callable[[int, int], int]
    problems: Callable[[], list[tuple[int, int]]]
    """Every (a, b) the task asks about."""
    commutative: bool

    def key(self, a: int, b: int) -> str:
        """The text that decides the split; a commutative pair shares one key: key(7, 3) == key(3, 7) for +."""
        if self.commutative:
            a, b = min(a, b), max(a, b)
        return f"{a}{self.symbol}{b}"


OPERATIONS = {
    "add": Operation("+", lambda a, b: a + b,
                     lambda: [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)], True),
    "sub": Operation("-", lambda a, b: a - b,
                     lambda: [(a, b) for a in range(MAX_OPERAND + 1) for b in range(a + 1)], False),
}


def question(op: Operation, a: int, b: int) -> str:
    return f"What is {a} {op.symbol} {b}? {INSTRUCTION}"


def make_rows(name: str, split: str, n: int | None = None, seed: int = 0) -> list[dict]:
    """The split's problems of operation `name` in an order shuffled by `seed`; the first n (None: all
    train problems, TEST_SIZE test problems). Columns: prompt (chat messages), answer, question, id."""
    if split not in ("train", "test"):
        raise ValueError(f"unknown split '{split}'; valid: ['test', 'train']")
    op = OPERATIONS[name]
    pairs = [(a, b) for a, b in op.problems() if split_of(op.key(a, b), TEST_PERCENT) == split]
    random.Random(f"chat_{name}-{split}-{seed}").shuffle(pairs)
    n = n if n is not None else (TEST_SIZE if split == "test" else len(pairs))
    if not 0 < n <= len(pairs):
        raise ValueError(f"asked for {n} {split} problems of chat_{name}; the split has {len(pairs)}")
    return [{"prompt": [{"role": "user", "content": question(op, a, b)}], "answer": str(op.apply(a, b)),
             "question": f"{a} {op.symbol} {b}", "id": f"{split}/{a}{op.symbol}{b}"} for a, b in pairs[:n]]


for _name, _desc in (("add", "a + b, a and b in 0..50"), ("sub", "a - b, 0 <= b <= a <= 50")):
    register_task(Task(
        name=f"chat_{_name}",
        load=lambda split, n=None, seed=0, _name=_name: make_rows(_name, split, n, seed),
        rewards=lambda: [math_answer_reward()], correct=math_answer_reward, extract=extract_math_answer, reward_weights=[1.0],
        max_completion_length=24,
        description=f"{_desc}, asked in words as a chat prompt; the reply's final number is checked",
    ))
