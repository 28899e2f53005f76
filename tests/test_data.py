"""aha.data: loading rows and the clear errors bad rows get (each names the row, column or file line)."""

import json

import pytest

from aha.data import encode_prompt, load_rows, read_jsonl, write_jsonl


def test_rows_from_a_list_a_jsonl_file_and_a_renamed_prompt_column(tmp_path):
    path = write_jsonl([{"q": "1+1", "answer": "2"}, {"q": "2+2", "answer": "4"}], tmp_path / "d.jsonl")
    rows = load_rows(path, prompt_column="q")
    assert rows == [{"q": "1+1", "answer": "2", "prompt": "1+1"}, {"q": "2+2", "answer": "4", "prompt": "2+2"}]
    assert load_rows(rows, "prompt") == rows


@pytest.mark.parametrize("rows, msg", [
    ([{"prompt": "ok"}, {"prompt": 7}], r"dataset row 1: 'prompt' must be a string or a list of chat messages, got int 7"),
    ([{"prompt": "ok"}, {"prompt": ""}], r"dataset row 1: 'prompt' is empty"),
    ([{"prompt": "ok"}, {"prompt": []}], r"dataset row 1: 'prompt' is empty"),
    ([{"prompt": "ok"}, "just a string"], r"dataset row 1 is a str, not a mapping"),
    ([{"prompt": "ok"}, {"question": "x"}], r"dataset row 1 has no 'prompt' column; its columns: \['question'\]"),
    ([], "the training dataset is empty"),
])
def test_bad_rows_are_named(rows, msg):
    with pytest.raises(ValueError, match=msg):
        load_rows(rows, "prompt")


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps({"prompt": "a"}).encode() + b"\n" + b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"latin1.jsonl:2: not UTF-8 text \(byte 0xe9"):
        read_jsonl(path)


def test_a_line_that_is_not_json_names_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_jsonl(path)


def test_a_dataset_dict_asks_for_a_split():
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "a"}]),
                               "test": datasets.Dataset.from_list([{"prompt": "b"}])})
    with pytest.raises(ValueError, match=r"the dataset has splits \['test', 'train'\]: pass one"):
        load_rows(dd, "prompt")
    assert load_rows(dd["train"], "prompt") == [{"prompt": "a"}]


def test_prompts_encode_as_text_or_through_the_chat_template(tiny_dir):
    from aha.models import load_tokenizer
    tok = load_tokenizer(tiny_dir)
    assert encode_prompt(tok, "1+1") == tok("1+1", add_special_tokens=False)["input_ids"]
    chat = encode_prompt(tok, [{"role": "user", "content": "1+1"}])
    assert len(chat) > len(encode_prompt(tok, "1+1"))
    with pytest.raises(TypeError, match="a prompt must be a string or a list of chat messages"):
        encode_prompt(tok, 3)


def test_a_string_prompt_gets_the_tokenizers_bos_and_a_chat_prompt_only_the_templates(tiny_dir):
    """As TRL: a Llama-style tokenizer's BOS starts a plain prompt; a rendered chat template is not given a second."""
    from tokenizers.processors import TemplateProcessing
    from aha.models import load_tokenizer
    tok = load_tokenizer(tiny_dir)
    plain = tok("1+1", add_special_tokens=False)["input_ids"]
    tok.add_special_tokens({"bos_token": "<s>"})
    tok._tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
    assert encode_prompt(tok, "1+1") == [tok.bos_token_id] + plain
    tok.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}="
    assert encode_prompt(tok, [{"role": "user", "content": "1+1"}]) == [tok.bos_token_id] + plain + \
        tok("=", add_special_tokens=False)["input_ids"]


def test_a_generator_as_train_dataset_is_refused_with_what_to_pass(tiny_dir, tmp_path):
    """A generator reads once (its first row went to the column check, and a second epoch found it empty)."""
    from aha.config import GRPOConfig
    from aha.train.grpo import GRPOTrainer
    rows = ({"prompt": f"{i}+1="} for i in range(10))
    with pytest.raises(ValueError, match="train_dataset is a generator, which can be read only once.*from_generator"):
        GRPOTrainer(model=tiny_dir, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                    args=GRPOConfig(output_dir=str(tmp_path), report_to=["none"]), train_dataset=rows)
    assert next(rows)["prompt"] == "0+1="  # nothing was read from it


# ---- base-model templates: a completion ends at the next turn label ----

BASE_TURNS = {  # a base model's answer, then a turn of its own with a second answer (review B3)
    "r1_base": "<think>16-3-4=9, 9*2=18</think> <answer>18</answer>\n\nUser: A robe takes 2 bolts of blue fiber and "
               "half that much white fiber. How many bolts?\nAssistant: <think>2+1=3</think> <answer>3</answer>",
    "plain_base": " 16-3-4=9 eggs, 9*2=18 dollars.\n#### 18\n\nUser: A robe takes 2 bolts ...\nAssistant: 2+1=3\n"
                  "#### 3",
    "boxed_base": " ... The final answer is $\\boxed{18}$.\n\nUser: Another question\nAssistant: ... The final answer "
                  "is $\\boxed{3}$.",
}


def test_base_templates_cut_a_completion_at_the_next_turn_label():
    from aha.data.prompts import TEMPLATES, get_template
    for name, text in BASE_TURNS.items():
        tpl = get_template(name)
        assert "User:" not in tpl.cut(text) and "18" in tpl.cut(text) and tpl.stop == ("\nUser:",), name
    assert get_template("plain_base").cut("#### 18\nUser: next\nAssistant: #### 3") == "#### 18"  # one newline too
    assert get_template("plain_base").cut("#### 18") == "#### 18"
    assert get_template("plain_base", user_prefix="Q: ").cut("#### 18\n\nQ: next\n#### 3") == "#### 18"
    assert all(TEMPLATES[name].stop == () for name in ("r1", "boxed", "plain"))  # chat turns end with EOS
    assert get_template("r1").cut(BASE_TURNS["r1_base"]) == BASE_TURNS["r1_base"]


def test_base_template_tasks_score_the_answer_before_the_next_turn():
    """Training rewards, the correctness verifier and maj@k's extract all read the completion up to the next turn,
    and keep their names, columns and counters; chat templates are left as they were."""
    from aha.rewards import math_reward, score_groups
    from aha.rewards.scoring import needed_columns, reward_name
    from aha.tasks import get_task
    from aha.tasks.base import Task, mixture
    for name, text in BASE_TURNS.items():
        task = get_task(f"gsm8k@{name}")
        assert task.correct()(None, [text], answer=["18"]) == [1.0], name  # 0.0 before: two different answers
        assert [fn(None, [text], answer=["18"]) for fn in task.rewards()] == [[1.0]] * len(task.rewards()), name
        assert task.stop == ("\nUser:",) and task.extract(text) == "18", name
    fns = get_task("gsm8k@r1_base").rewards()
    assert [reward_name(f) for f in fns] == ["math", "format"] and needed_columns(fns[0]) == ["answer"]
    rows = [{"prompt": "User: Q?\nAssistant:", "answer": "256"}]
    _, metrics = score_groups(fns, rows, ["<answer>2^{10^{10}}</answer>\nUser: hi"], 1)
    assert metrics["reward/too_large"] == 1 and "reward/math/mean" in metrics
    assert get_task("jsonl:qa.jsonl@plain_base?prompt=q").stop == ("\nUser:",)  # the file is read at load
    assert get_task("gsm8k").stop == () and get_task("gsm8k").correct() is math_reward
    assert get_task("gsm8k@boxed").stop == ()
    own = Task(name="mine", load=None, rewards=lambda: [math_reward], correct=lambda: math_reward, stop=("\nQ:",))
    assert own.correct()(None, ["#### 18\nQ: next\n#### 3"], answer=["18"]) == [1.0]
    both = mixture([get_task("gsm8k@plain_base"), get_task("gsm8k@plain_base")])
    assert both.stop == ("\nUser:",) and both.correct()(None, [BASE_TURNS["plain_base"]], answer=["18"]) == [1.0]
