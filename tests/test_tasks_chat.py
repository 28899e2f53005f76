"""The chat arithmetic tasks for small instruct models: splits, prompts and the verifier on hand-written replies."""

from __future__ import annotations

import pytest

from aha.data import is_conversational
from aha.tasks.chat import OPERATIONS, TEST_SIZE
from aha.tasks import get_task

TASKS = ["chat_add", "chat_sub"]


def numbers(row: dict) -> tuple[int, int]:
    a, _, b = row["question"].split()
    return int(a), int(b)


@pytest.mark.parametrize("name", TASKS)
def test_splits_are_disjoint_and_cover_every_problem(name):
    task = get_task(name)
    op = OPERATIONS[name.removeprefix("chat_")]
    train = task.load("train")
    test = task.load("test", n=len(op.problems()) - len(train))  # the whole test split
    def problem(row):  # 3 + 7 and 7 + 3 are one problem; 7 - 3 and 3 - 7 are not
        a, b = numbers(row)
        return (min(a, b), max(a, b)) if name == "chat_add" else (a, b)
    assert not {problem(r) for r in train} & {problem(r) for r in test}
    assert len(train) + len(test) == len(op.problems())
    assert len({r["id"] for r in train + test}) == len(op.problems())
    assert 0.15 < len(test) / len(op.problems()) < 0.35  # TEST_PERCENT = 25, by hash


@pytest.mark.parametrize("name", TASKS)
def test_rows_are_chat_prompts_with_right_answers(name):
    task = get_task(name)
    rows = task.load("test")
    assert len(rows) == TEST_SIZE >= 200
    assert rows == task.load("test")  # deterministic
    assert rows != task.load("test", seed=1)  # the seed reorders
    for r in rows:
        assert is_conversational(r["prompt"]) and r["prompt"][-1]["role"] == "user"
        a, b = numbers(r)
        assert f"What is {a} {OPERATIONS[name[5:]].symbol} {b}?" in r["prompt"][-1]["content"]
        assert int(r["answer"]) == (a + b if name == "chat_add" else a - b) >= 0


def test_bad_split_and_size_are_errors():
    task = get_task("chat_add")
    with pytest.raises(ValueError, match="unknown split"):
        task.load("validation")
    with pytest.raises(ValueError, match="the split has"):
        task.load("test", n=10_000)


@pytest.mark.parametrize("reply, right", [
    ("64", True),
    ("23 + 41 = 64", True),
    ("The answer is 64.", True),
    ("23 + 41 = 64\n\nThis is a simple sum.", True),
    ("63", False),
    ("23 + 41 = 46", False),            # the final number counts, not any number
    ("64, or maybe 65", False),
    ("I am not sure.", False),           # no number at all
    ("", False),
])
def test_verifier_reads_the_final_number(reply, right):
    task = get_task("chat_add")
    row = next(r for r in task.load("train") if r["question"] == "23 + 41")
    verifier = task.correct()
    value = verifier(prompts=[row["prompt"]], completions=[[{"role": "assistant", "content": reply}]],
                     answer=[row["answer"]])
    assert value == [1.0 if right else 0.0]
    rewards = task.rewards()
    assert len(rewards) == len(task.reward_weights) == 1
    assert rewards[0](prompts=[row["prompt"]], completions=[reply], answer=["64"]) == value


@pytest.mark.parametrize("name, lora", [("grpo_smollm2.yaml", False), ("grpo_smollm2_lora.yaml", True)])
def test_example_configs_parse(name, lora):
    from pathlib import Path

    from aha.config import parse_args
    from aha.config import GRPOConfig
    cfg = parse_args(GRPOConfig, [str(Path(__file__).parents[1] / "examples" / name)])
    assert cfg.task == "chat_add" and cfg.model == "smollm2-135m-instruct" and cfg.use_lora is lora
    assert cfg.max_completion_length <= get_task("chat_add").max_completion_length
    assert cfg.generation_batch_size % cfg.num_generations == 0
