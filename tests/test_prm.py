"""Process reward models: TRL's input format, Math-Shepherd step labels, `aha prm`, the PRM as a step reward, and
GRPO with one."""

import json
import random

import pytest

from aha.config import ConfigError, GRPOConfig, PRMConfig, PRMLabelsConfig
from aha.rewards.prm import PRMReward, prm_inputs, split_steps
from aha.rollout import Rollout
from aha.stages import get_stage
from aha.tasks import Task, register_task
from aha.tasks.arithmetic import column_addition, make_addition
from aha.tasks.base import math_answer_reward

QUIET = dict(progress_bar=False)
TRAIN_QUIET = dict(progress_bar=False, report_to=["none"])
CHAT = [{"role": "user", "content": "47+85"}]


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def test_split_steps_by_hand():
    text = "<think>7+5=12 4+8+1=13</think><answer>132</answer>"
    # "<think>" is 7 characters and "7+5=12" 6: the first step ends at 13; the last at the text's end
    assert split_steps(text, " ") == [("<think>7+5=12", 13), ("4+8+1=13</think><answer>132</answer>", len(text))]
    assert split_steps("a\n\nb\n", "\n") == [("a", 1), ("b", 4)]  # empty steps skipped
    assert split_steps("", "\n") == []


def test_prm_inputs_are_trls_tokenize_row(tiny_dir):
    from aha.models import load_tokenizer
    tok = load_tokenizer(tiny_dir)

    def enc(s):
        return tok(s, add_special_tokens=False)["input_ids"]
    ids, positions = prm_inputs(tok, "3+4", ["a=1", "b=2"], "\n")
    # no BOS in the tiny tokenizer: the prompt, then each step and the separator; a label on each separator
    assert tok.bos_token_id is None
    assert ids == enc("3+4") + enc("a=1") + enc("\n") + enc("b=2") + enc("\n")
    assert positions == [len(enc("3+4") + enc("a=1") + enc("\n")) - 1, len(ids) - 1]


class ShepherdEngine:
    """Answers 47+85 with one right column sum and one wrong (a forgotten carry); from the first step's prefix,
    continuation 0 finishes right and continuation 1 repeats the slip."""

    ANSWER = "<think>7+5=12 4+8=12</think><answer>122</answer>"
    REST = (" 4+8+1=13</think><answer>132</answer>", " 4+8=12</think><answer>122</answer>")

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def generate(self, prompt_ids, n, params, generator=None, on_group=None):
        self.calls.append((len(prompt_ids), n))
        out = []
        for p in prompt_ids:
            opened = self.tok.decode(p).endswith("assistant\n")  # the prompt alone: write an answer
            out += [self.tok(self.ANSWER if opened else self.REST[j % 2], add_special_tokens=False)["input_ids"]
                    + [self.tok.eos_token_id] for j in range(n)]
        return Rollout(completion_ids=out, truncated=[False] * len(out))


def test_a_step_is_good_when_a_continuation_reaches_the_answer(tiny_dir, tmp_path, monkeypatch):
    import aha.prm_labels
    from aha.models import load_tokenizer
    from aha.rollout import SamplingParams
    register_task(Task(name="test-prm-47", load=lambda split, n=None, seed=0: [{"prompt": CHAT, "answer": "132"}],
                       rewards=lambda: [], correct=math_answer_reward, max_completion_length=24))
    tok = load_tokenizer(tiny_dir)
    engine = ShepherdEngine(tok)
    monkeypatch.setattr(aha.prm_labels, "load_sampler", lambda cfg, task: (tok, engine, SamplingParams()))
    stats = get_stage("prm_labels").run(PRMLabelsConfig(
        model=tiny_dir, task="test-prm-47", n=2, num_continuations=2, step_separator=" ",
        output_dir=str(tmp_path / "labels"), **QUIET))
    rows = _rows(tmp_path / "labels" / "data.jsonl")
    # two identical answers -> one row; step 1 "<think>7+5=12": 1 of 2 continuations reach 132 -> good (share 0.5);
    # the last step is the answer's own: 122 is wrong -> bad
    assert rows == [{"prompt": tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False),
                     "completions": ["<think>7+5=12", "4+8=12</think><answer>122</answer>"],
                     "labels": [True, False], "shares": [0.5, 0.0]}]
    assert engine.calls == [(1, 2), (1, 2)]  # the answers, then one prefix x 2 continuations
    assert (stats["answers"], stats["rows"], stats["steps"], stats["continuations"]) == (2, 1, 2, 2)
    assert stats["answer_accuracy"] == 0.0 and stats["good_step_share"] == 0.5 and stats["step_separator"] == " "


@pytest.fixture(scope="module")
def trained(tiny_dir, tmp_path_factory):
    """Labels from the tiny (untrained) policy on arithmetic with the real engine, then `aha prm` on them."""
    root = tmp_path_factory.mktemp("prm")
    labels = get_stage("prm_labels").run(PRMLabelsConfig(
        model=tiny_dir, task="arithmetic", num_prompts=6, n=2, num_continuations=2, max_new_tokens=16,
        step_separator=" ", output_dir=str(root / "labels"), **QUIET))
    prm = get_stage("prm").run(PRMConfig(model=tiny_dir, dataset=labels["data"], max_steps=2,
                                         per_device_train_batch_size=4, eval_fraction=0.3, learning_rate=1e-3,
                                         output_dir=str(root / "prm"), **TRAIN_QUIET))
    return root, labels, prm


def test_labels_from_a_policy_train_a_prm_that_scores_steps(trained):
    root, labels, prm = trained
    rows = _rows(labels["data"])
    assert labels["rows"] == len(rows) > 0 and labels["steps"] == sum(len(r["labels"]) for r in rows)
    for r in rows:  # TRL's stepwise-supervision rows
        assert isinstance(r["prompt"], str) and len(r["completions"]) == len(r["labels"]) == len(r["shares"]) > 0
        assert r["labels"] == [s > 0 for s in r["shares"]] and all(0 <= s <= 1 for s in r["shares"])
    config = json.loads((root / "prm" / "model" / "config.json").read_text())
    assert config["step_separator"] == " " and config["architectures"] == ["LlamaForTokenClassification"]
    assert "eval/step_accuracy" in json.loads((root / "prm" / "eval.json").read_text())
    assert not list((root / "prm").glob(".model*"))  # written beside and renamed into place

    reward = PRMReward(prm["model_dir"])
    assert reward.step_separator == " " and reward.__name__ == "prm"  # the separator from the PRM's config
    text = "<think>7+5=12 4+8+1=13</think><answer>132</answer>"
    out = reward([CHAT, CHAT, "9+9="], [[{"role": "assistant", "content": text}], [{"role": "assistant",
                                                                                      "content": ""}], "1 22"])
    assert [e for e, _ in out[0]] == [13, len(text)]  # each end just after its step, in the completion's text
    assert out[1] == [] and [e for e, _ in out[2]] == [1, 4]
    assert all(0 <= s <= 1 for steps in out for _, s in steps)
    assert reward.pop_metrics() == {"prm_steps": 4.0}


def _synthetic(n: int, seed: int, split: str) -> list[dict]:
    """Worked column sums of 2-digit additions; half the rows have a forgotten (or invented) carry in one column,
    that step bad and the row cut after it, as Math-Shepherd's labels are after a first error."""
    rng, rows = random.Random(seed), []
    for r in make_addition(split, n, seed=seed, min_digits=2, max_digits=2):
        steps = column_addition(*map(int, r["question"].split("+"))).split()
        labels = [True] * len(steps)
        if rng.random() < 0.5:
            j = rng.randrange(len(steps))
            head, _, s = steps[j].rpartition("=")
            steps[j] = f"{head}={int(s) + 10 if int(s) < 10 else int(s) - 10}"
            steps, labels = steps[:j + 1], labels[:j] + [False]
        rows.append({"prompt": r["question"], "completions": ["<think>" + steps[0]] + steps[1:], "labels": labels})
    return rows


def test_a_prm_trained_on_separable_labels_scores_good_steps_above_bad_ones(tiny_dir, tmp_path):
    data = tmp_path / "labels.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _synthetic(600, 0, "train")))
    prm = get_stage("prm").run(PRMConfig(model=tiny_dir, dataset=str(data), step_separator=" ", max_steps=400,
                                         per_device_train_batch_size=32, learning_rate=3e-3, eval_fraction=0.0,
                                         threads=1, output_dir=str(tmp_path / "prm"), **TRAIN_QUIET))
    held = _synthetic(100, 1, "test")  # other problems than the training ones
    reward = PRMReward(prm["model_dir"])
    scores = reward([r["prompt"] for r in held], [" ".join(r["completions"]) for r in held])
    pairs = [(s, y) for r, steps in zip(held, scores) for (_, s), y in zip(steps, r["labels"])]
    assert len(pairs) == sum(len(r["labels"]) for r in held)
    good, bad = [s for s, y in pairs if y], [s for s, y in pairs if not y]
    accuracy = sum((s > 0.5) == y for s, y in pairs) / len(pairs)
    assert sum(good) / len(good) - sum(bad) / len(bad) > 0.4, (sum(good) / len(good), sum(bad) / len(bad))
    assert accuracy > max(len(good), len(bad)) / len(pairs)  # better than always answering the common label


def _grpo(tiny_dir, tmp_path, **kw):
    from aha.train.grpo import GRPOTrainer

    def length(prompts, completions, **kw):
        return [len(c) / 10 for c in completions]
    args = dict(output_dir=str(tmp_path / "grpo"), num_generations=2, per_device_train_batch_size=4,
                max_completion_length=8, max_steps=1, learning_rate=1e-3, log_completions_steps=0, **TRAIN_QUIET)
    return GRPOTrainer(model=tiny_dir, reward_funcs=[length], args=GRPOConfig(**{**args, **kw}),
                       train_dataset=[{"prompt": CHAT}, {"prompt": [{"role": "user", "content": "3+4"}]}])


def test_grpo_with_a_prm_adds_it_as_a_step_reward_and_trains(trained, tiny_dir, tmp_path):
    prm_dir = trained[2]["model_dir"]
    trainer = _grpo(tiny_dir, tmp_path, prm_model=prm_dir, prm_weight=0.5, reward_weights=[2.0],
                    advantage_estimator="grpo_process")
    assert [getattr(f, "__name__", "") for f in trainer.reward_funcs] == ["length", "prm"]
    assert trainer.reward_funcs[-1] is trainer.prm and trainer.reward_weights.tolist() == [2.0, 0.5]
    assert trainer.prm.step_separator == " " and trainer.prm.batch_size == 16
    metrics = trainer.train()
    assert 0 <= metrics["reward/prm/mean"] <= 1 and metrics["process/steps_per_completion"] > 0


def test_prm_settings_are_checked(tiny_dir, tmp_path):
    with pytest.raises(ValueError, match=r"prm_model '.*no_such_prm'"):
        _grpo(tiny_dir, tmp_path, prm_model=str(tmp_path / "no_such_prm"))
    with pytest.raises(ValueError, match=r"is a LlamaForCausalLM, not a token-classification PRM"):
        _grpo(tiny_dir, tmp_path, prm_model=tiny_dir)
    with pytest.raises(ValueError, match=r"2 reward_weights for 1 reward functions \(the PRM's weight is prm_weight"):
        _grpo(tiny_dir, tmp_path, prm_model=str(tmp_path / "unread"), reward_weights=[1.0, 1.0])
    with pytest.raises(ConfigError, match=r"prm_batch_size must be >= 1"):
        GRPOConfig(prm_model="x", prm_batch_size=0)
    with pytest.raises(ConfigError, match=r"prm_model runs the PRM on the learner's device.*num_reward_workers=0"):
        GRPOConfig(prm_model="x", num_reward_workers=1)
    with pytest.raises(ConfigError, match=r"eval_fraction must be in \[0, 1\)"):
        PRMConfig(eval_fraction=1.0)
    with pytest.raises(ConfigError, match=r"use_lora"):
        PRMConfig(use_lora=True)
    with pytest.raises(ConfigError, match=r"step_separator must be a non-empty string"):
        PRMLabelsConfig(step_separator="")


def test_prm_rows_are_checked(tiny_dir, tmp_path):
    from aha.train.prm import PRMTrainer
    good = {"prompt": "1+1", "completions": ["1+1=2"], "labels": [True]}
    args = PRMConfig(model=tiny_dir, output_dir=str(tmp_path / "prm"), eval_fraction=0.0, max_length=8, **TRAIN_QUIET)
    with pytest.raises(ValueError, match=r"PRM row 1: 'labels' must be one true/false per step \(2 steps\)"):
        PRMTrainer(args=args, train_dataset=[good, {**good, "completions": ["a", "b"]}])
    with pytest.raises(ValueError, match=r"PRM row 1: 'prompt' must be text"):
        PRMTrainer(args=args, train_dataset=[good, {**good, "prompt": CHAT}])
    with pytest.raises(ValueError, match=r"PRM row 0 has \d+ tokens, over max_length 8"):
        PRMTrainer(args=args, train_dataset=[{**good, "completions": ["1+1=2 " * 5]}])


def test_a_recipe_chains_labels_prm_and_grpo():
    from aha.recipe import validate
    stages = [{"name": "labels", "type": "prm_labels", "task": "arithmetic", "step_separator": " "},
              {"name": "prm", "type": "prm", "dataset": "@labels"},
              {"name": "grpo", "type": "grpo", "task": "arithmetic", "prm_model": "@prm"}]
    assert [s["name"] for s in validate({"model": "@x", "stages": stages})] == ["labels", "prm", "grpo"]
    wrong = [*stages[:2], {**stages[2], "prm_model": "@labels"}]
    with pytest.raises(ConfigError, match=r"prm_model: @labels is a prm_labels stage, which makes a data file; "
                                          r"prm_model takes a prm stage"):
        validate({"model": "@x", "stages": wrong})


def test_a_causal_lm_without_architectures_is_refused_as_prm_naming_the_missing_head(tiny_dir, tmp_path):
    import shutil
    lm = tmp_path / "lm"
    shutil.copytree(tiny_dir, lm)
    config = json.loads((lm / "config.json").read_text())
    del config["architectures"]  # the check by saved class cannot see it: only the weights tell
    (lm / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"prm_model '.*lm' has no trained score head: score\.bias, score\.weight not "
                                         r"in its weights \(a LlamaForTokenClassification would start it from random"):
        PRMReward(str(lm))


@pytest.mark.parametrize("value, end", [([[(2.0, 1.0)], [(1, 0.5)]], "2.0"), ([[], [(1, 0.5), ("3", 1.0)]], "'3'")])
def test_step_rewards_with_ends_that_are_not_integers_say_ends_must_be_integers(value, end):
    from aha.rewards.scoring import score_completions
    with pytest.raises(ValueError, match=rf"has a step ending at {end} \(step ends must be integers: character "
                                         r"offsets into the completion's text\)"):
        score_completions([lambda prompts, completions, **kw: value], [""] * 2, ["ab", "cd"], {})
