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


# ---- a dataset that changed since the checkpoint (bug report 10) ----

def test_a_resume_on_a_changed_dataset_is_refused_at_resume_naming_the_sizes():
    """Before: the shrunk dataset resumed, and `take` died with IndexError steps later."""
    from aha.train.loop import PromptSampler
    sampler = PromptSampler(10, seed=0)
    sampler.take(7)
    state = sampler.state()
    assert state == {"epoch": 0, "index": 7, "n": 10}
    same = PromptSampler(10, seed=0).restored(state)
    assert same.take(5) == sampler.take(5)  # the same order goes on, into the next epoch
    with pytest.raises(ValueError, match="written with a dataset of 10 rows and this one has 6: the dataset changed"):
        PromptSampler(6, seed=0).restored(state)
    with pytest.raises(ValueError, match="written with a dataset of 10 rows and this one has 12"):
        PromptSampler(12, seed=0).restored(state)
    old = {"epoch": 2, "index": 7}  # a checkpoint written before the sampler kept n: its position is checked
    assert PromptSampler(7, seed=0).restored(old).take(1)  # at the end of an epoch: the next one starts
    with pytest.raises(ValueError, match=r"the checkpoint's sampler position \(epoch 2, row 7\) is past this "
                                         r"dataset's 6 rows: the dataset changed since the checkpoint \(was it shrunk"):
        PromptSampler(6, seed=0).restored(old)
    with pytest.raises(ValueError, match="is not"):
        PromptSampler(6, seed=0).restored({"epoch": 0, "index": -1})


def test_a_stream_shorter_than_the_checkpoints_position_is_refused_at_resume():
    """Before: a bare StopIteration from skipping the rows already trained on."""
    from aha.train.loop import StreamSampler
    rows = [{"prompt": f"{i}+1="} for i in range(10)]
    sampler = StreamSampler(rows, 0, lambda i, row: None, shuffle=False)
    sampler.take(7)
    assert StreamSampler(rows, 0, lambda i, row: None, shuffle=False).restored(sampler.state()).index == 7
    with pytest.raises(ValueError, match=r"stream position \(epoch 0, row 7\) is past the end of this streaming "
                                         r"dataset, which has 5 rows: the dataset changed .*shrunk"):
        StreamSampler(rows[:5], 0, lambda i, row: None, shuffle=False).restored(sampler.state())


# ---- every row has the reward functions' columns (bug report 11) ----

def _grpo(tiny_dir, tmp_path, rows, **kw):
    from aha.config import GRPOConfig
    from aha.rewards import math_reward
    from aha.train.grpo import GRPOTrainer
    args = GRPOConfig(output_dir=str(tmp_path), report_to=["none"], num_generations=2, per_device_train_batch_size=2,
                      max_completion_length=8, progress_bar=False, **kw)
    return GRPOTrainer(model=tiny_dir, reward_funcs=[math_reward], args=args, train_dataset=rows)


def test_a_later_row_without_the_gold_column_is_named_at_load(tiny_dir, tmp_path):
    """Before: only row 0 was checked; row 3 was scored None (reward/data_errors) until a batch began with it."""
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(3)] + [{"prompt": "4+1="}]
    with pytest.raises(ValueError, match=r"dataset row 3 has no 'answer' column; its columns: \['prompt'\]"):
        _grpo(tiny_dir, tmp_path, rows)


def test_a_streamed_row_without_the_gold_column_is_named_as_it_is_read(tiny_dir, tmp_path):
    datasets = pytest.importorskip("datasets")

    def gen():
        yield from [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+1=", "answer": "3"}, {"prompt": "3+1="}]
    stream = datasets.IterableDataset.from_generator(gen)
    trainer = _grpo(tiny_dir, tmp_path, stream, max_steps=2, shuffle_dataset=False)
    assert trainer.sampler.take(2) == [0, 1]
    with pytest.raises(ValueError, match=r"dataset row 2 has no 'answer' column; its columns: \['prompt'\]"):
        trainer.sampler.take(1)


def test_a_batch_whose_first_row_lacks_a_column_is_scored_not_reported_as_no_columns():
    """Before: score_groups took the columns of rows[0] only, and a batch starting with a row without the gold
    answer failed with "the dataset has: (no columns)", though the dataset had them."""
    from aha.rewards import math_reward, score_groups
    rewards, metrics = score_groups([math_reward], [{"prompt": "1+1="}, {"prompt": "1+1=", "answer": "2"}],
                                    ["#### 2", "#### 2"], 1)
    assert rewards[0, 0].isnan() and rewards[1, 0] == 1.0 and metrics["reward/data_errors"] == 1
    with pytest.raises(ValueError, match="needs dataset column 'answer'; the dataset has: no column but the prompt"):
        score_groups([math_reward], [{"prompt": "1+1="}], ["#### 2"], 1)


# ---- JSONL text (bug report 12) ----

def test_jsonl_strings_may_hold_unicode_line_separators(tmp_path):
    """Before: str.splitlines() cut the line inside the string at U+2028 / U+0085 ("Unterminated string")."""
    rows = [{"prompt": "a\u2028b\x85c\u2029d\x1ce\x0cf", "answer": "1"}, {"prompt": "g\r", "answer": "2"}]
    path = tmp_path / "seps.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert read_jsonl(path) == rows
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))  # Windows line ends still read
    assert read_jsonl(path) == rows


def test_a_lone_surrogate_is_named_by_row_and_column(tmp_path, tiny_dir):
    """Before: the row loaded, and the tokenizer failed with a TypeError traceback ("TextEncodeInput must be ...")."""
    path = tmp_path / "surrogate.jsonl"
    path.write_text('{"prompt": "ok", "answer": "1"}\n{"prompt": "x\\ud800y", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"dataset row 1, column 'prompt': character 1 is a lone surrogate '\\ud800'"):
        load_rows(path, "prompt")
    chat = [{"prompt": [{"role": "user", "content": "ok"}, {"role": "user", "content": "ab\udc00"}]}]
    with pytest.raises(ValueError, match=r"dataset row 0, column 'prompt': character 2 is a lone surrogate"):
        load_rows(chat, "prompt")
    with pytest.raises(ValueError, match=r"dataset row 0, column 'answer': .*lone surrogate"):
        load_rows([{"prompt": "ok", "answer": "\udfff"}], "prompt")
    trainer = _grpo(tiny_dir, tmp_path, [{"prompt": "1+1=", "answer": "2"}], max_steps=1)
    with pytest.raises(ValueError, match=r"dataset row 4: the tokenizer cannot take column 'prompt' \(TypeError"):
        trainer._encode(4, {"prompt": "x\ud800"})  # a row that bypassed check_row: still named


# ---- an over-long prompt is refused before it is tokenized (bug report 13) ----

class _NoTokenizing:
    """A tokenizer's backend without its __call__: the test fails if the prompt is tokenized."""

    def __init__(self, tokenizer):
        self.backend_tokenizer = tokenizer.backend_tokenizer

    def __call__(self, *args, **kwargs):
        raise AssertionError("the prompt was tokenized")


def test_a_prompt_far_over_the_context_is_refused_without_tokenizing_it(tiny_dir, tmp_path):
    """Before: a 10 MB line was tokenized whole (39 s, 4.46 GB) before the length check."""
    from aha.data import PromptTooLong
    from aha.data.length import longest_token_chars
    from aha.models import load_tokenizer
    tok = load_tokenizer(tiny_dir)
    L = longest_token_chars(tok)
    assert L == max(map(len, tok.get_vocab()))
    with pytest.raises(PromptTooLong, match=rf"at least {-(-10_000_000 // L)} tokens \(10000000 characters; no "
                                            rf"token of this tokenizer covers more than {L}\)"):
        encode_prompt(_NoTokenizing(tok), "x" * 10_000_000, max_tokens=8184)
    assert encode_prompt(tok, "x" * 20, max_tokens=8) == tok("x" * 20)["input_ids"]  # unsure: tokenized, exact
    with pytest.raises(ValueError, match=r"prompt 0 has at least \d+ tokens .*; with max_completion_length 8 it "
                                         r"exceeds the model's context of 8192"):
        _grpo(tiny_dir, tmp_path, [{"prompt": "1+1=" * 500_000, "answer": "2"}])


@pytest.mark.parametrize("text", ["x" * 3000, " " * 3000, "\n\t " * 900, "🙂中é" * 700, "e\u0301" * 1500,
                                  "<|im_start|>" * 300, "count the letters: aaa bbb " * 200])
def test_the_length_bound_never_exceeds_the_true_token_count(tiny_dir, text):
    """ceil(normalized characters / L) <= tokens, including NFC joining "e" and a combining accent into one."""
    from aha.data.length import tokens_over
    from aha.models import load_tokenizer
    tok = load_tokenizer(tiny_dir)
    n = len(tok(text)["input_ids"])
    assert tokens_over(tok, text, n) is None  # never claims more than the true count
    bound = tokens_over(tok, text, 0)
    assert bound is not None and 1 <= bound <= n


def test_a_tokenizer_that_drops_text_gets_no_length_bound():
    """A whitespace pre-tokenizer drops spaces and WordPiece makes one [UNK] of a long word: C characters may be
    far fewer than C / L tokens, so such a tokenizer is always tokenized."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from aha.data.length import longest_token_chars, tokens_over
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.pre_tokenizer, wp.decoder = pre_tokenizers.Whitespace(), decoders.WordPiece()
    wp.train_from_iterator(["the cat sat on the mat"] * 10, trainers.WordPieceTrainer(vocab_size=60,
                           special_tokens=["[UNK]"], show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=wp)
    assert longest_token_chars(tok) is None and tokens_over(tok, " " * 100_000, 10) is None
    assert len(tok(" " * 100_000 + "x" * 1000)["input_ids"]) == 1  # what a bound would have got wrong
