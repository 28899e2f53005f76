"""Small arithmetic asked in plain words, for small instruct models such as SmolLM2-135M-Instruct.

`chat_add`:  "What is 23 + 41? Answer with just the number."            a, b in 0..50 (the trained task)
`chat_sub`:  "What is 41 - 23? Answer with just the number."            0 <= b <= a <= 50
`chat_mul`:  "What is 17 times 8? Answer with just the number."         a in 2..99, b in 2..9
`chat_max`:  "Which number is larger, 23 or 41? Answer with just ..."   a != b in 0..99
`chat_next`: "What number comes right after 379? Answer with just ..."  a in 0..999
`chat_prev`: "What number comes right before 379? Answer with just ..." a in 1..1000
`chat_steps`: "What is 14 + 6 - 8?" (a in 10..29, b and c in 1..9) after one worked example in the prompt
("15 + 2 = 17. 17 - 3 = 14. Answer: 14"): the model must work out the first step and carry its result
into the second. (As a word problem, "Mia has 14 pens. Mia gets 6 more ..., then gives 8 away", the
135M base was right on 5% of 300 held-out problems; in this form, 11%.)

Prompts are chat messages (the model's own chat template renders them) and the reply is free text: the
verifier is `math_reward`, which takes the final number of the reply ("23 + 41 = 64" -> 64). The base model
is right on a sixth to two thirds of each (greedy), far from the ceiling, so GRPO has something to sharpen.
Train one and the others are control tasks of other kinds (subtraction, times tables, comparison, counting,
a two-step problem) that show what the training cost or gave.
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
"""Share of the problems held out (by hash)."""
TEST_SIZE = 300
"""Held-out problems evaluated by default (all of a smaller test split): one point of accuracy is three problems."""
MAX_OPERAND = 50

STEPS_EXAMPLE = "Example: What is 15 + 2 - 3?\n15 + 2 = 17. 17 - 3 = 14. Answer: 14\n\n"
"""The one worked example chat_steps shows before its question: the reply's shape, not its numbers."""


@dataclass(frozen=True)
class Operation:
    symbol: str
    apply: Callable[..., int]
    problems: Callable[[], list[tuple[int, ...]]]
    """Every tuple of numbers the task asks about."""
    commutative: bool
    ask: Callable[..., str] | None = None
    """The question for these numbers (default: "What is a <symbol> b? Answer with just the number.")."""
    label: Callable[..., str] | None = None
    """The problem in short, the `question` column (default: "a <symbol> b")."""
    max_completion_length: int = 24

    def key(self, *nums: int) -> str:
        """The text that decides the split; a commutative pair shares one key: key(7, 3) == key(3, 7) for +."""
        if self.commutative:
            nums = tuple(sorted(nums))
        return self.symbol.join(map(str, nums))

    def show(self, *nums: int) -> str:
        return self.label(*nums) if self.label else f"{nums[0]} {self.symbol} {nums[1]}"

    def question(self, *nums: int) -> str:
        return self.ask(*nums) if self.ask else f"What is {nums[0]} {self.symbol} {nums[1]}? {INSTRUCTION}"


PAIRS = lambda hi, lo=0: [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1)]  # noqa: E731
OPERATIONS = {
    "add": Operation("+", lambda a, b: a + b, lambda: PAIRS(MAX_OPERAND), True),
    "sub": Operation("-", lambda a, b: a - b,
                     lambda: [(a, b) for a in range(MAX_OPERAND + 1) for b in range(a + 1)], False),
    "mul": Operation("*", lambda a, b: a * b, lambda: [(a, b) for a in range(2, 100) for b in range(2, 10)], False,
                     ask=lambda a, b: f"What is {a} times {b}? {INSTRUCTION}"),
    "max": Operation("|", max, lambda: [(a, b) for a, b in PAIRS(99) if a != b], True,
                     ask=lambda a, b: f"Which number is larger, {a} or {b}? {INSTRUCTION}",
                     label=lambda a, b: f"{a} or {b}"),
    "next": Operation("", lambda a: a + 1, lambda: [(a,) for a in range(1000)], False,
                      ask=lambda a: f"What number comes right after {a}? {INSTRUCTION}", label=lambda a: f"after {a}"),
    "prev": Operation("", lambda a: a - 1, lambda: [(a,) for a in range(1, 1001)], False,
                      ask=lambda a: f"What number comes right before {a}? {INSTRUCTION}",
                      label=lambda a: f"before {a}"),
    "steps": Operation("_", lambda a, b, c: a + b - c,
                       lambda: [(a, b, c) for a in range(10, 30) for b in range(1, 10) for c in range(1, 10)],
                       False, ask=lambda a, b, c: f"{STEPS_EXAMPLE}What is {a} + {b} - {c}?",
                       label=lambda a, b, c: f"{a} + {b} - {c}", max_completion_length=48),
}


def make_rows(name: str, split: str, n: int | None = None, seed: int = 0) -> list[dict]:
    """The split's problems of operation `name` in an order shuffled by `seed`; the first n (None: all
    train problems, TEST_SIZE test problems). Columns: prompt (chat messages), answer, question, id."""
    if split not in ("train", "test"):
        raise ValueError(f"unknown split '{split}'; valid: ['test', 'train']")
    op = OPERATIONS[name]
    problems = [p for p in op.problems() if split_of(op.key(*p), TEST_PERCENT) == split]
    random.Random(f"chat_{name}-{split}-{seed}").shuffle(problems)
    n = n if n is not None else (min(TEST_SIZE, len(problems)) if split == "test" else len(problems))
    if not 0 < n <= len(problems):
        raise ValueError(f"asked for {n} {split} problems of chat_{name}; the split has {len(problems)}")
    return [{"prompt": [{"role": "user", "content": op.question(*p)}], "answer": str(op.apply(*p)),
             "question": op.show(*p),
             "id": f"{split}/{op.symbol.join(map(str, p))}"} for p in problems[:n]]


DESCRIPTIONS = {"add": "a + b, a and b in 0..50", "sub": "a - b, 0 <= b <= a <= 50", "mul": "a times b, a in 2..99, b in 2..9",
                "max": "the larger of two numbers in 0..99", "next": "the number after a, a in 0..999",
                "prev": "the number before a, a in 1..1000",
                "steps": "a + b - c in two steps after one worked example, a in 10..29, b and c in 1..9"}
for _name, _desc in DESCRIPTIONS.items():
    register_task(Task(
        name=f"chat_{_name}",
        load=lambda split, n=None, seed=0, _name=_name: make_rows(_name, split, n, seed),
        rewards=lambda: [math_answer_reward()], correct=math_answer_reward, extract=extract_math_answer, reward_weights=[1.0],
        max_completion_length=OPERATIONS[_name].max_completion_length,
        description=f"{_desc}, asked in words as a chat prompt; the reply's final number is checked",
    ))
