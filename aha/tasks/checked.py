"""`add_check`: addition whose worked solution may check itself, the task where reflection can pay.

Why this check. The first attempt jots the column sums from the right without the carries and adds those in its
head while reading the answer off ('7+5=12 4+8=12 0+3=3 so 432'); its typical slip is a forgotten carry ('so
422'). The check re-adds the same columns in the same order with every carry written out ('4+8+1=13'), so nothing
is left to do in the head: cheap (the digit pairs are copied from the attempt), and it catches exactly the
attempt's slip, so a check done right makes answers right, which is all the rewards pay for. Whether a tiny model
does it right after seeing it rarely is what `aha demo aha` measures. (Checks that re-add in another order than
the attempt, or check a one-shot sum by columns, were right in 0-8% of sampled checks after the cold start.)
With `carries=False` (no carry anywhere) the attempt has nothing to slip on and the check becomes useless: the
ablation that tells "reflection pays" from "reflection drifts".

Worked solutions, three kinds (the cold start holds a small share `reflect_share` of the last two):
    direct    <think>7+5=12 4+8=12 0+3=3 so 432</think><answer>432</answer>
    confirm   <think>7+5=12 4+8=12 0+3=3 so 432 check: 7+5=12 4+8+1=13 0+3+1=4 ok</think><answer>432</answer>
    correct   <think>7+5=12 4+8=12 0+3=3 so 422 check: 7+5=12 4+8+1=13 0+3+1=4 wait 432</think><answer>432</answer>
Half of the reflective solutions to problems where a carry can be forgotten are corrections; the rest confirm.
"""

from __future__ import annotations

import functools
import random
import re

from ..behaviour import Reflection, register_check_format
from .arithmetic import column_addition, sum_of_steps
from .base import Task, extract_math_answer, math_answer_reward, register_task, split_of

KINDS = ("direct", "confirm", "correct")
MARKER = "check"
"""The word that opens a check step; it joins the run's reflection phrases ("wait" is there already)."""
CORRECTING_SHARE = 0.5
"""Of the reflective solutions to problems with a carry, the share that catch a slip (the rest confirm)."""


def carry_columns(a: int, b: int) -> list[int]:
    """Columns (0 = units) whose sum carries into the next. Example: carry_columns(47, 385) -> [0, 1]."""
    out, carry = [], 0
    for i in range(max(len(str(a)), len(str(b)))):
        carry = (a // 10 ** i % 10 + b // 10 ** i % 10 + carry) // 10
        if carry:
            out.append(i)
    return out


def slips(a: int, b: int) -> list[int]:
    """Columns whose carry a hurried adder can forget: those carrying into a written column (the top column's
    carry is its sum's own first digit). Example: slips(47, 385) -> [0, 1]; slips(95, 5) -> [0]; slips(7, 5) -> []."""
    return [c for c in carry_columns(a, b) if c < max(len(str(a)), len(str(b))) - 1]


def column_sums(a: int, b: int) -> str:
    """The column sums from the right with no carries written, as a hurried adder jots them, leaving every carry
    to be added in the head. Example: column_sums(47, 385) -> '7+5=12 4+8=12 0+3=3' (the answer is 432)."""
    width = max(len(str(a)), len(str(b)))
    return " ".join(f"{a // 10 ** i % 10}+{b // 10 ** i % 10}={a // 10 ** i % 10 + b // 10 ** i % 10}"
                    for i in range(width))


def checked_solution(a: int, b: int, kind: str, slip: int = 0) -> str:
    """One worked solution of `kind`; a correction's first answer forgets the carry out of column `slip`.

    Example: checked_solution(47, 385, "correct", slip=0) -> '<think>7+5=12 4+8=12 0+3=3 so 422 check: 7+5=12
    4+8+1=13 0+3+1=4 wait 432</think><answer>432</answer>'
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind '{kind}'; valid: {list(KINDS)}")
    first = a + b - (10 ** (slip + 1) if kind == "correct" else 0)
    check = {"direct": "", "confirm": " ok", "correct": f" wait {a + b}"}[kind]
    steps = f" {MARKER}: {column_addition(a, b)}{check}" if check else ""
    return f"<think>{column_sums(a, b)} so {first}{steps}</think><answer>{a + b}</answer>"


def checked_row(a: int, b: int, kind: str = "direct", slip: int = 0) -> dict:
    question = f"{a}+{b}"
    return {"prompt": [{"role": "user", "content": question}], "answer": str(a + b), "question": question,
            "completion": checked_solution(a, b, kind, slip), "kind": kind}


@functools.lru_cache(maxsize=8)
def problem_space(split: str, carries: bool = True, min_digits: int = 1, max_digits: int = 2) -> tuple:
    """Every problem (a, b) of the split, operands of min..max digits (1-digit operands from 1), in order; with
    carries=False only those with no carry anywhere (about a third of the 1-2 digit ones)."""
    if split not in ("train", "test"):
        raise ValueError(f"unknown split '{split}'; valid: ['test', 'train']")
    values = range(1 if min_digits <= 1 else 10 ** (min_digits - 1), 10 ** max_digits)
    return tuple((a, b) for a in values for b in values
                 if (carries or not carry_columns(a, b)) and split_of(f"{a}+{b}") == split)


def make_checked(split: str, n: int | None = None, seed: int = 0, reflect_share: float = 0.05,
                 carries: bool = True, min_digits: int = 1, max_digits: int = 2) -> list[dict]:
    """n distinct problems of the split drawn by `seed` (None: all of them, shuffled), each with a worked solution
    of one kind. The kinds come from a stream of their own, so the same seed gives the same problems whatever
    `reflect_share` (a smaller share's reflective rows are a subset of a larger one's)."""
    space = problem_space(split, carries, min_digits, max_digits)
    if n is not None and n > len(space):
        raise ValueError(f"asked for {n} {split} problems; {len(space)} exist with these settings")
    kinds = random.Random(f"{seed}-{split}-kinds")
    rows = []
    for a, b in random.Random(f"{seed}-{split}-check").sample(space, len(space) if n is None else n):
        can_slip = slips(a, b)
        u, v, slip = kinds.random(), kinds.random(), kinds.choice(can_slip or [0])
        kind = "direct" if u >= reflect_share else "correct" if can_slip and v < CORRECTING_SHARE else "confirm"
        rows.append(checked_row(a, b, kind, slip))
    return rows


def check_corpus(rows: list[dict]) -> list[str]:
    """Text a tokenizer is fitted on: every problem in all three kinds, so the vocabulary (and the model built
    on it) is the same whatever share of the rows reflect."""
    out = []
    for r in rows:
        a, b = map(int, r["question"].split("+"))
        out += [r["question"]] + [checked_solution(a, b, k, (slips(a, b) or [0])[0]) for k in KINDS]
    return out


CHECK = re.compile(MARKER + r":((?:\s*\d+\+\d+(?:\+\d+)?=\d+)*)\s*(?:(ok)|wait\s*(\d+))?(?!\w)")
"""A check step: its column sums, then 'ok' or 'wait N' (group 1 the sums, 2 'ok', 3 the new answer)."""
FIRST = re.compile(r"(?<!\w)so\s*(\d+)")
"""The first answer, at the end of the attempt: 'so 432'."""
WAIT = re.compile(r"(?<!\w)wait(?!\w)", re.IGNORECASE)
PROBLEM = re.compile(r"(\d+)\s*\+\s*(\d+)")
ANSWER = re.compile(r"<answer>\s*(\d+)\s*</answer>")


def _columns(a: int, b: int) -> list[tuple[str, str]]:
    """The digit pair of each column, units first: _columns(47, 385) -> [('7','5'), ('4','8'), ('0','3')]."""
    return [tuple(s.split("=")[0].split("+")[:2]) for s in column_addition(a, b).split()]


def parse_check(prompt: str, text: str) -> Reflection:
    """What a completion's check did, read from the check format above; the problem is the last 'a+b' of the prompt.

    A check verifies when it re-adds this problem's own columns and its verdict follows from the number its sums
    spell ('ok' when that is the first attempt, 'wait N' with N that number when it is not), and the <answer> is
    that verdict. Anything else that says "check" or "wait" is an empty reflection: no column sums, another
    problem's columns, an 'ok' over a sum that disagrees, a 'wait' that keeps the answer it questioned.

    Example: prompt "47+385", text "<think>47+385=422 check: 7+5=12 4+8+1=13 0+3+1=4 wait 432</think>
    <answer>432</answer>" -> Reflection(reflects=True, corrects=True, first_right=False, empty=False);
    "<think>47+385=432 wait</think><answer>432</answer>" -> reflects, corrects, first_right=True, empty=True.
    """
    problem = PROBLEM.findall(prompt or "")
    think = text.split("<think>", 1)[-1].split("</think>", 1)[0]
    said = FIRST.search(re.split(rf"{MARKER}|wait", think, flags=re.IGNORECASE)[0])
    first = int(said.group(1)) if said else None
    a, b = map(int, problem[-1]) if problem else (None, None)
    first_right = None if first is None or a is None else first == a + b
    corrects, check = bool(WAIT.search(think)), CHECK.search(think)
    reflects = corrects or re.search(rf"(?<!\w){MARKER}(?!\w)", think, re.IGNORECASE) is not None
    return Reflection(reflects=reflects, corrects=corrects, first_right=first_right,
                      empty=reflects and not _verifies(check, first, a, b, text))


def _verifies(check: re.Match | None, first: int | None, a: int | None, b: int | None, text: str) -> bool:
    """Does this check re-add the problem's columns and conclude what its sums say, the <answer> agreeing?"""
    if check is None or first is None or a is None:
        return False
    steps, ok, new = check.group(1).split(), check.group(2), check.group(3)
    spelled, answer = sum_of_steps(steps), ANSWER.search(text)
    if spelled is None or [tuple(s.split("=")[0].split("+")[:2]) for s in steps] != _columns(a, b):
        return False
    said = first if ok else int(new) if new and spelled != first else None
    return said == spelled and answer is not None and int(answer.group(1)) == said


def wait_word_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 when the completion says "wait": the reward hack of the ablation that pays for the word. Never one of
    the task's rewards; `behaviour/empty_reflection` is there to catch what it teaches."""
    from ..rewards import completion_text
    return [float(WAIT.search(completion_text(c)) is not None) for c in completions]


def _rewards():
    """Correctness and format only: a reflective and a direct completion with the same final answer score the
    same, so reflection can rise only by making answers right (no process reward: it would pay for the check)."""
    from ..rewards import format_reward, math_reward
    return [math_reward, format_reward]


register_check_format(MARKER, parse_check)
register_task(Task(
    name="add_check",
    load=lambda split, n=None, seed=0: make_checked(split, n or (4000 if split == "train" else 200), seed),
    rewards=_rewards, correct=math_answer_reward, extract=extract_math_answer, reward_weights=[1.0, 0.1],
    max_completion_length=56, asks_format=True,
    description="column addition from the left, sometimes checked from the right ('check: ... ok' / 'wait N')",
))
