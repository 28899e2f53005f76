"""The chat arithmetic tasks for small instruct models: splits, prompts and the verifier on hand-written replies."""

from __future__ import annotations

import re

import pytest

from aha.data import is_conversational
from aha.tasks.chat import OPERATIONS, STEPS_EXAMPLE, TEST_SIZE
from aha.tasks import get_task

TASKS = ["chat_add", "chat_sub", "chat_mul", "chat_max", "chat_next", "chat_prev", "chat_steps"]


def numbers(row: dict) -> tuple[int, ...]:
    """The problem's numbers, read back from its id ("test/23+41" -> (23, 41); steps: a, b, c, order)."""
    return tuple(map(int, re.findall(r"\d+", row["id"])))


@pytest.mark.parametrize("name", TASKS)
def test_splits_are_disjoint_and_cover_every_problem(name):
    task = get_task(name)
    op = OPERATIONS[name.removeprefix("chat_")]
    train = task.load("train")
    test = task.load("test", n=len(op.problems()) - len(train))  # the whole test split
    assert not {op.key(*numbers(r)) for r in train} & {op.key(*numbers(r)) for r in test}  # 3 + 7 with 7 + 3
    assert len(train) + len(test) == len(op.problems())
    assert len({r["id"] for r in train + test}) == len(op.problems())
    assert 0.15 < len(test) / len(op.problems()) < 0.35  # TEST_PERCENT = 25, by hash


ANSWERS = {"chat_add": lambda a, b: a + b, "chat_sub": lambda a, b: a - b, "chat_mul": lambda a, b: a * b,
           "chat_max": max, "chat_next": lambda a: a + 1, "chat_prev": lambda a: a - 1,
           "chat_steps": lambda a, b, c: a + b - c}
ASKED = {"chat_add": "What is {} + {}?", "chat_sub": "What is {} - {}?", "chat_mul": "What is {} times {}?",
         "chat_max": "Which number is larger, {} or {}?", "chat_next": "What number comes right after {}?",
         "chat_prev": "What number comes right before {}?"}


@pytest.mark.parametrize("name", TASKS)
def test_rows_are_chat_prompts_with_right_answers(name):
    task = get_task(name)
    rows = task.load("test")
    whole = len(OPERATIONS[name.removeprefix("chat_")].problems()) - len(task.load("train"))
    assert len(rows) == min(TEST_SIZE, whole) >= 200  # all of a smaller test split
    assert rows == task.load("test")  # deterministic
    assert rows != task.load("test", seed=1)  # the seed reorders
    for r in rows:
        assert is_conversational(r["prompt"]) and r["prompt"][-1]["role"] == "user"
        nums, text = numbers(r), r["prompt"][-1]["content"]
        assert int(r["answer"]) == ANSWERS[name](*nums) >= 0
        if name == "chat_steps":
            assert text == STEPS_EXAMPLE + "What is {} + {} - {}?".format(*nums)
        else:
            assert ASKED[name].format(*nums) in text and text.endswith("Answer with just the number.")


def test_a_mixture_interleaves_equal_parts_of_each_task():
    add, nxt = get_task("chat_add"), get_task("chat_next")
    mix = get_task("chat_add+chat_next")
    for split in ("train", "test"):
        rows = mix.load(split, seed=3)
        k = min(len(add.load(split)), len(nxt.load(split)))
        assert len(rows) == 2 * k
        assert rows[0::2] == [{**r, "id": f"chat_add:{r['id']}"} for r in add.load(split, seed=3)[:k]]
        assert rows[1::2] == [{**r, "id": f"chat_next:{r['id']}"} for r in nxt.load(split, seed=3)[:k]]
        assert len({r["id"] for r in rows}) == len(rows)
    assert len(mix.load("test", n=100)) == 100 and mix.load("test", n=100) == mix.load("test")[:100]
    assert mix.max_completion_length == 24 and mix.correct() is add.correct()
    with pytest.raises(ValueError, match="has 466"):
        mix.load("test", n=1000)
    with pytest.raises(ValueError, match="no split 'validation'"):
        mix.load("validation")
    with pytest.raises(ValueError, match="different verifiers"):
        get_task("chat_add+arithmetic")
    with pytest.raises(ValueError, match="unknown task 'chat_nope'"):
        get_task("chat_add+chat_nope")


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


@pytest.mark.parametrize("name, task, lora", [("grpo_smollm2_lora.yaml", "chat_add+chat_next", True),
                                             ("grpo_smollm2_mix.yaml", "chat_add+chat_next", False)])
def test_example_configs_parse(name, task, lora):
    from pathlib import Path

    from aha.config import parse_args
    from aha.config import GRPOConfig
    cfg = parse_args(GRPOConfig, [str(Path(__file__).parents[1] / "examples" / name)])
    assert cfg.task == task and cfg.model == "smollm2-135m-instruct" and cfg.use_lora is lora
    assert cfg.max_completion_length <= get_task(task).max_completion_length
    assert cfg.generation_batch_size % cfg.num_generations == 0


def test_the_two_step_config_starts_from_the_mixture_config_output():
    """The curriculum's second stage trains chat_steps from the model the first stage (chat_add+chat_next) writes."""
    from pathlib import Path

    from aha.config import GRPOConfig, parse_args
    examples = Path(__file__).parents[1] / "examples"
    add = parse_args(GRPOConfig, [str(examples / "grpo_smollm2_mix.yaml")])
    steps = parse_args(GRPOConfig, [str(examples / "grpo_smollm2_steps.yaml")])
    assert steps.task == "chat_steps" and steps.model == f"{add.output_dir}/model"
    assert steps.max_completion_length <= get_task("chat_steps").max_completion_length
    assert steps.generation_batch_size % steps.num_generations == 0
