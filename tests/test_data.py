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
