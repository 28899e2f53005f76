"""Behaviour metrics (reflection, lengths, language consistency) by hand, and the group records of a real run."""

import json
import math

import pytest
import torch

from aha.behaviour import (behaviour_metrics, count_phrases, language_consistency, main_script, phrase_pattern,
                           word_scripts)
from aha.config import ConfigError, GRPOConfig
from aha.rewards import get_reward, language_consistency_reward
from aha.train.grpo import GRPOTrainer
from aha.train.records import loss_terms

PHRASES = ["wait", "let me re-check", "actually"]


def test_phrases_match_whole_words_case_insensitively():
    texts = ["Wait, 2+2=5? Wait. Let me re-check: 4", "I awaited it; actually fine", "no doubt", ""]
    assert count_phrases(texts, PHRASES) == [3, 1, 0, 0]  # "awaited" is not "wait"
    assert count_phrases(["wait"], []) == [0]
    assert phrase_pattern(["let me"]).findall("LET ME see, letme") == ["LET ME"]


def test_behaviour_metrics_by_hand():
    prompts = ["What is 2+2?"] * 4
    texts = ["wait, it is 4", "it is 4", "actually 5, wait", "5"]
    lengths = [10, 20, 30, 40]                      # 100 tokens in all
    correct = [True, True, False, None]             # the last one: correctness unknown
    m = behaviour_metrics(prompts, texts, lengths, correct, PHRASES)
    assert m["behaviour/reflection_rate"] == pytest.approx(2 / 4)          # texts 0 and 2
    assert m["behaviour/reflection_rate/correct"] == pytest.approx(1 / 2)  # of texts 0, 1
    assert m["behaviour/reflection_rate/incorrect"] == pytest.approx(1.0)  # text 2
    assert m["behaviour/phrases_per_1k_tokens"] == pytest.approx(1000 * 3 / 100)  # 1 + 0 + 2 + 0 phrases
    assert m["behaviour/len_correct"] == pytest.approx(15.0)               # (10 + 20) / 2
    assert m["behaviour/len_incorrect"] == pytest.approx(30.0)
    assert m["behaviour/lang_consistency"] == pytest.approx((1 + 1 + 1) / 3)  # "5" has no words: left out


def test_an_empty_split_is_nan_not_zero():
    m = behaviour_metrics(["q"], ["a"], [0], [True], PHRASES)
    assert math.isnan(m["behaviour/reflection_rate/incorrect"]) and math.isnan(m["behaviour/len_incorrect"])
    assert math.isnan(m["behaviour/phrases_per_1k_tokens"])  # no tokens


def test_language_consistency_by_script():
    assert word_scripts("sum 中文 ж1") == ["LATIN", "CJK", "CJK", "CYRILLIC"]  # Han: one word per character
    assert main_script("Сколько будет 2+2? ok") == "CYRILLIC"
    assert language_consistency("Сколько будет 2+2?", "Будет four") == 0.5
    assert language_consistency("计算 2+2", "答案是 4 ok") == pytest.approx(3 / 4)
    assert language_consistency("2+2", "four") is None and language_consistency("two", "4") is None


def test_language_consistency_reward_is_registered():
    chat = [{"role": "user", "content": "What is two plus two?"}]
    assert get_reward("language_consistency")([chat, chat], [[{"role": "assistant", "content": "four 四"}],
                                                            [{"role": "assistant", "content": "four"}]]) == [0.5, 1.0]
    assert language_consistency_reward(["hi"], ["?"]) == [None]


def test_config_checks_the_new_fields():
    for bad in (dict(log_groups_steps=-1), dict(log_groups_max=0), dict(log_groups_max_mb=0),
                dict(dashboard_port=70000), dict(correct_threshold=math.nan)):
        with pytest.raises(ConfigError):
            GRPOConfig(**bad)


def test_loss_terms_add_up_to_the_aggregated_loss():
    from aha import algos
    loss = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0]])   # [2,3]
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # grpo: per-sequence mean then mean: ((1+2)/2 + 3/1) / 2 = 2.25; terms 1/4, 2/4, 3/2
    terms = loss_terms(loss, lambda t: algos.aggregate("grpo", t, mask))
    assert terms.flatten().tolist() == pytest.approx([0.25, 0.5, 0.0, 1.5, 0.0, 0.0])
    # dapo: token mean over 3 tokens: 1/3, 2/3, 3/3
    terms = loss_terms(loss, lambda t: algos.aggregate("dapo", t, mask))
    assert terms.sum().item() == pytest.approx(2.0) and terms[1, 0].item() == pytest.approx(1.0)


PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def digit_share(prompts, completions, **kw):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def _run(tiny_dir, tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "run"), max_steps=1, num_generations=4, per_device_train_batch_size=8,
                max_completion_length=8, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                log_completions_steps=0, seed=0, log_groups_steps=1, log_groups_max=2)
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=GRPOConfig(**{**base, **kw}),
                    train_dataset=PROMPTS)
    metrics = t.train()
    path = tmp_path / "run" / "groups.jsonl"
    return t, metrics, [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def test_group_records_hold_the_updates_own_token_values(tiny_dir, tmp_path):
    t, metrics, groups = _run(tiny_dir, tmp_path, beta=0.04, correct_threshold=0.5)
    assert "behaviour/reflection_rate" in metrics and "behaviour/lang_consistency" in metrics
    assert [g["group"] for g in groups] == [0, 1] and all(len(g["completions"]) == 4 for g in groups)
    total = 0.0
    for g in groups:
        assert g["reward_names"] == ["digit_share"]
        rewards = [c["reward"] for c in g["completions"]]
        assert g["mean"] == pytest.approx(sum(rewards) / 4, abs=1e-4)
        for c in g["completions"]:
            tok = c["tokens"]
            assert c["trained"] and len(tok["piece"]) == len(tok["logp"]) == len(tok["loss"]) == len(tok["kl"])
            assert all(r == 1.0 for r in tok["ratio"]) and set(tok["clip"]) <= {0}  # one pass: ratio 1
            assert all(lp <= 0 for lp in tok["logp"]) and all(k >= 0 for k in tok["kl"])
            total += sum(tok["loss"])
    # one minibatch holds the whole batch and both groups are recorded: the terms add up to the logged loss
    assert total == pytest.approx(metrics["loss"], abs=1e-3)


def test_group_records_show_the_clip_of_a_second_pass(tiny_dir, tmp_path):
    eps = 0.2
    _, _, groups = _run(tiny_dir, tmp_path, num_iterations=2, learning_rate=0.3, epsilon=eps)
    seen_ratio = False
    for c in (c for g in groups for c in g["completions"] if c["trained"]):
        for r, flag in zip(c["tokens"]["ratio"], c["tokens"]["clip"]):
            seen_ratio |= abs(r - 1) > 1e-4
            expected = 1 if r > 1 + eps and c["advantage"] > 0 else -1 if r < 1 - eps and c["advantage"] < 0 else 0
            assert flag == expected
    assert seen_ratio  # the last pass is recorded: its ratios moved off 1


def test_group_records_stop_at_their_size_cap(tiny_dir, tmp_path, caplog):
    _, _, groups = _run(tiny_dir, tmp_path, log_groups_max_mb=0.0001)  # 100 bytes: not even one group
    assert groups == [] and "reached its cap" in caplog.text


def test_check_metrics_by_hand():
    from aha.behaviour import Reflection, check_metrics
    R = Reflection
    reflections = [R(False, False, True, False),   # direct, right
                   R(False, False, False, False),  # direct, wrong
                   R(True, False, True, False),    # confirmed, right
                   R(True, True, False, False),    # wait: wrong -> right (fixed)
                   R(True, True, True, False),     # wait: right -> wrong (broke)
                   R(True, True, True, True),      # an empty wait, answer unknown
                   R(True, False, None, True)]     # an empty check, wrong
    correct = [True, False, True, True, False, None, False]
    m = check_metrics(reflections, correct)
    assert m["behaviour/correction_rate"] == pytest.approx(3 / 7)
    assert m["behaviour/wait_fixed_rate"] == pytest.approx(1 / 7)
    assert m["behaviour/wait_broke_rate"] == pytest.approx(1 / 7)
    assert m["behaviour/empty_reflection"] == pytest.approx(2 / 7)
    assert m["behaviour/accuracy/reflective"] == pytest.approx(2 / 4)  # of 2, 3, 4, 6 (5 is unknown)
    assert m["behaviour/accuracy/direct"] == pytest.approx(1 / 2)
    assert math.isnan(check_metrics([R(False, False, True, False)], [True])["behaviour/accuracy/reflective"])


def test_a_tasks_check_format_joins_the_metrics_only_when_its_marker_is_a_phrase():
    import aha.tasks  # noqa: F401  (registers add_check's check format under "check")
    from aha.tasks.checked import checked_solution
    texts = [checked_solution(47, 385, k) for k in ("direct", "confirm", "correct")] + \
        ["<think>7+5=12 4+8=12 0+3=3 so 432 wait</think><answer>432</answer>"]
    args = (["47+385"] * 4, texts, [10] * 4, [True] * 4)
    assert not any("empty_reflection" in k for k in behaviour_metrics(*args, PHRASES))
    m = behaviour_metrics(*args, [*PHRASES, "check"])
    assert m["behaviour/reflection_rate"] == pytest.approx(3 / 4)  # "check" or "wait": a reflection of any kind
    assert m["behaviour/correction_rate"] == pytest.approx(2 / 4)
    assert m["behaviour/empty_reflection"] == pytest.approx(1 / 4)
    assert m["behaviour/wait_fixed_rate"] == pytest.approx(1 / 4) and m["behaviour/wait_broke_rate"] == 0.0


def test_first_fixes_finds_the_step_a_wait_first_fixed_a_problem_answered_wrong_before():
    from aha.behaviour import first_fixes
    wait_fix = {"correct": True, "corrects": True, "first_right": False}
    rows = [{"step": 0, "id": 1, "correct": False}, {"step": 20, "id": 1, "correct": False},
            {"step": 40, "id": 1, **wait_fix}, {"step": 60, "id": 1, **wait_fix},   # first fixed at 40
            {"step": 0, "id": 2, **wait_fix},                                       # fixed, but never wrong before
            {"step": 0, "id": 3, "correct": False}, {"step": 20, "id": 3, "correct": True},  # right without a wait
            {"step": 20, "id": 4, "correct": True, "corrects": True, "first_right": True}]   # a wait, nothing fixed
    assert first_fixes(list(reversed(rows))) == {1: 40}
