"""Synthetic verifiable tasks generated from a seed: the embedded default needs no download.

`arithmetic`: column addition of two numbers, answered as
`<think>` the column sums from the right, with carries `</think><answer>` the sum `</answer>`.
Train and test never overlap: a problem's split is fixed by a hash of its text, not by the seed.
"""

from __future__ import annotations

import random
import re

from .base import Task, extract_math_answer, math_answer_reward, register_task, split_of

SYSTEM = "Think step by step inside <think></think>, then give the answer inside <answer></answer>."


def column_addition(a: int, b: int) -> str:
    """Worked sum, rightmost column first: column_addition(47, 385) -> '7+5=12 4+8+1=13 0+3+1=4'."""
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        x, y = int(da[i]) if i < len(da) else 0, int(db[i]) if i < len(db) else 0
        s = x + y + carry
        steps.append(f"{x}+{y}" + (f"+{carry}" if carry else "") + f"={s}")
        carry = s // 10
    return " ".join(steps)


def addition_row(a: int, b: int, system: bool = False) -> dict:
    """One problem as a chat prompt; the system instruction is optional (a tiny model learns the
    format from the worked solutions, and every prompt token costs compute)."""
    question = f"{a}+{b}"
    solution = f"<think>{column_addition(a, b)}</think><answer>{a + b}</answer>"
    prompt = ([{"role": "system", "content": SYSTEM}] if system else []) + [{"role": "user", "content": question}]
    return {"prompt": prompt, "answer": str(a + b), "question": question, "completion": solution}


def make_addition(split: str, n: int, seed: int = 0, min_digits: int = 1, max_digits: int = 2,
                  system: bool = False) -> list[dict]:
    """n distinct addition problems of the split; operands have min..max digits."""
    if split not in ("train", "test"):
        raise ValueError(f"unknown split '{split}'; valid: ['test', 'train']")
    rng = random.Random(f"{seed}-{split}")
    seen: set[str] = set()
    rows: list[dict] = []
    space = sum(9 * 10 ** (d - 1) for d in range(min_digits, max_digits + 1)) ** 2
    cap = int(space * (0.08 if split == "test" else 0.8))  # ~10% / ~90% of all problems, with slack
    if n > cap:
        raise ValueError(f"asked for {n} {split} problems; at most {cap} fit with {max_digits}-digit operands")

    def operand() -> int:
        d = rng.randint(min_digits, max_digits)
        return rng.randint(10 ** (d - 1) if d > 1 else 0, 10 ** d - 1)

    while len(rows) < n:
        a, b = operand(), operand()
        q = f"{a}+{b}"
        if q not in seen and split_of(q) == split:
            seen.add(q)
            rows.append(addition_row(a, b, system))
    return rows


STEP = re.compile(r"\d+\+\d+(?:\+\d+)?=(\d+)")
"""One written column sum, e.g. '4+8+1=13'; group 1 is its sum."""


def sum_of_steps(steps: list[str]) -> int | None:
    """The number written column sums spell, rightmost column first: the last sum whole, then the other sums'
    last digits. Example: ['7+5=12', '4+8+1=13', '0+3+1=4'] -> 432; ['7+5=12', '4+8+1=13'] -> 132; a step that
    is not a column sum -> None."""
    sums = [STEP.fullmatch(s) for s in steps]
    if not sums or not all(sums):
        return None
    *rest, last = (int(m.group(1)) for m in sums)
    return int(str(last) + "".join(str(v % 10) for v in reversed(rest)))


def column_scores(text: str, a: int, b: int) -> list[float]:
    """Each `<think>` column sum of a+b, 1.0 when it is the worked column at its place; a missing or extra step is
    a 0.0, so padding the chain cannot raise the share. Example: 47+385 with "<think>7+5=12 4+8=12 0+3=3</think>"
    -> [1, 0, 0]."""
    m = re.search(r"<think>(.*?)</think>", text, re.S)
    want, got = column_addition(a, b).split(), (m.group(1).split() if m else [])
    return [float(i < len(got) and i < len(want) and got[i] == want[i]) for i in range(max(len(want), len(got)))]


def answer_digit_scores(text: str, a: int, b: int) -> list[float]:
    """The last step of a worked sum, writing the answer from the column sums: each digit of the `<answer>`,
    compared from the right with a+b's (digit i is column i's sum mod 10; the leading one the last carry). A missing
    or extra digit counts as wrong. Example: 47+385 with <answer>432</answer> -> [1, 1, 1]; with the last column's
    sum written as the answer, <answer>4</answer> -> [0, 0, 0]; with <answer>431</answer> -> [0, 1, 1]."""
    m = re.search(r"<answer>(.*?)</answer>", text, re.S)
    want, got = str(a + b), (m.group(1).strip() if m else "")
    return [float(i < len(got) and i < len(want) and got[-1 - i] == want[-1 - i])
            for i in range(max(len(want), len(got)))]


def _share(scores_of, completions, question) -> list[float]:
    from ..rewards import completion_text
    out = []
    for comp, q in zip(completions, question):
        scores = scores_of(completion_text(comp), *(int(x) for x in q.split("+")))
        out.append(sum(scores) / len(scores))
    return out


def column_steps_reward(prompts, completions, question, **kwargs) -> list[float]:
    """Share of the `<think>` column sums that match the problem's own worked sum (a process check).

    Example: question "47+385", think "7+5=12 4+8+1=13 0+3+1=4" -> 1.0; "7+5=12 4+8=12 0+3=3" -> 1/3.
    Extra or missing steps count as wrong, so padding the chain cannot raise the share.
    """
    return _share(column_scores, completions, question)


def worked_steps_reward(prompts, completions, question, **kwargs) -> list[float]:
    """Share of right steps over the whole worked solution: every `<think>` column sum (`column_scores`) and every
    digit of the `<answer>` (`answer_digit_scores`). The embedded default's process term.

    Why the answer's digits: with column sums alone, right sums under a wrong answer (the last column's sum
    written as the whole answer, "<think>4+8=12 0+9+1=10</think><answer>10</answer>" for 102) scored as much as
    the right answer, so GRPO could raise the reward without answering better. With the digits, a solution's
    share is 1.0 only when its answer is right, and more right digits score more.
    Example: question "47+385", think "7+5=12 4+8+1=13 0+3+1=4": answer 432 -> 6/6; answer 4 -> 3/6.
    """
    return _share(lambda text, a, b: column_scores(text, a, b) + answer_digit_scores(text, a, b),
                  completions, question)


def column_step_rewards(prompts, completions, question, **kwargs) -> list[list[tuple[int, float]] | None]:
    """`column_steps_reward` step by step: per completion one (end offset, score) per column sum written in
    `<think>...</think>` (its whitespace-separated tokens), 1.0 when it is the worked column at that position,
    else 0.0; each missing column is a 0.0 step ending where the think's content ends (with no
    `<think>...</think>`, every column is missing and ends at the text's end), so the steps' mean is
    `column_steps_reward`. A question that is not `a+b`: None.

    Example: question "47+385", completion "<think>7+5=12 </think>" -> [(13, 1.0), (14, 0.0), (14, 0.0)].
    """
    from ..rewards import completion_text
    out: list[list[tuple[int, float]] | None] = []
    for comp, q in zip(completions, question):
        operands = re.fullmatch(r"\s*(\d{1,1000})\s*\+\s*(\d{1,1000})\s*", q) if isinstance(q, str) else None
        text = completion_text(comp)
        start = text.find("<think>") + len("<think>")  # found with str.find: linear on "<think>" * n, not quadratic
        end = text.find("</think>", start) if start >= len("<think>") else -1
        if operands is None:
            out.append(None)
            continue
        want = column_addition(*(int(x) for x in operands.groups())).split()
        if end < 0:  # no chain written: every column is missing
            out.append([(len(text), 0.0)] * len(want))
            continue
        written = list(re.finditer(r"\S+", text[start:end]))
        steps = [(start + w.end(), float(i < len(want) and w.group() == want[i])) for i, w in enumerate(written)]
        out.append(steps + [(end, 0.0)] * (len(want) - len(written)))
    return out


def _rewards():
    from ..rewards import format_reward, math_reward
    return [math_reward, format_reward, worked_steps_reward]


register_task(Task(
    name="arithmetic",
    load=lambda split, n=None, seed=0: make_addition(split, n or (4000 if split == "train" else 200), seed),
    rewards=_rewards, correct=math_answer_reward, extract=extract_math_answer, reward_weights=[1.0, 0.1, 0.5],
    max_completion_length=48, asks_format=True,
    description="column addition of 1-2 digit numbers, <think> column sums </think><answer>",
))
