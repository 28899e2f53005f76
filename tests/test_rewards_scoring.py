"""The interface the trainer relies on: registry, score_completions, check_columns, metrics, and the
docstring examples of every verifier module."""
from __future__ import annotations

import asyncio
import doctest
import logging
import math
import threading
import time

import pytest
import torch

import aha.rewards as R
from aha.rewards import REWARDS, check_columns, get_reward, score_completions


def test_registry_builds_every_reward_by_name():
    assert set(REWARDS) >= {"math", "format", "countdown", "code", "soft_overlong", "length_penalty"}
    for name in REWARDS:
        reward = get_reward(name)
        assert callable(reward) and isinstance(reward.__name__, str)
    assert get_reward("code", mode="all", tests_column="test").required_columns == ("test",)
    gated = get_reward("math", require_format=True)
    assert isinstance(gated, R.FormatGated) and gated.__name__ == "math"
    with pytest.raises(ValueError, match="valid names: code, countdown, format"):
        get_reward("nope")


def test_module_level_defaults_have_trl_names():
    assert (R.math_reward.__name__, R.format_reward.__name__, R.countdown_reward.__name__, R.code_reward.__name__) == \
        ("math", "format", "countdown", "code")


def test_score_completions_matrix_and_metrics():
    def constant(prompts, completions, **kwargs):
        return [0.5, None]

    def broken(prompts, completions, **kwargs):
        raise RuntimeError("boom")

    async def slow_async(prompts, completions, **kwargs):
        await asyncio.sleep(0.2)
        return [1, float("inf")]

    async def slow_async_2(prompts, completions, **kwargs):
        await asyncio.sleep(0.2)
        return [2, 3]

    completions = ["<think>a</think><answer>4</answer>", "4"]
    start = time.monotonic()
    rewards, metrics = score_completions([R.math_reward, R.format_reward, constant, broken, slow_async, slow_async_2],
                                         ["p", "p"], completions, {"answer": ["4", None]}, completion_ids=[[1], [2]])
    assert time.monotonic() - start < 0.39  # the two async functions were awaited together
    assert rewards.dtype == torch.float32 and rewards.shape == (2, 6)
    nan = math.nan
    expected = torch.tensor([[1, 1, 0.5, nan, 1, 2], [nan, 0, nan, nan, nan, 3]], dtype=torch.float32)
    assert torch.equal(rewards.isnan(), expected.isnan())
    assert torch.allclose(rewards.nan_to_num(-9), expected.nan_to_num(-9))
    assert metrics["reward/errors"] == 1
    assert metrics["reward/nan"] == 1  # slow_async's inf; the None values are "not applicable", not counted
    assert metrics["reward/math/none_frac"] == 0.5 and metrics["reward/broken/none_frac"] == 1.0
    assert metrics["reward/slow_async/none_frac"] == 0.5 and metrics["reward/format/none_frac"] == 0.0
    assert metrics["reward/data_errors"] == 1


def test_errors_are_logged_once_per_function(caplog, monkeypatch):
    monkeypatch.setattr("aha.rewards.scoring._LOGGED", set())  # other tests may have logged a "flaky" already

    def flaky(prompts, completions, **kwargs):
        raise ValueError("bad")

    def nan_giver(prompts, completions, **kwargs):
        return [float("nan")]

    with caplog.at_level(logging.ERROR, logger="aha.rewards.scoring"):
        for _ in range(3):
            _, metrics = score_completions([flaky, nan_giver], ["p"], ["c"], {})
            assert metrics["reward/errors"] == 1 and metrics["reward/nan"] == 1
    assert sum("flaky" in r.getMessage() for r in caplog.records) == 1
    assert sum("nan_giver" in r.getMessage() for r in caplog.records) == 1
    assert caplog.records[0].exc_info is not None  # the raise is logged with its traceback


def test_wrong_length_names_function_expected_and_got():
    def short(prompts, completions, **kwargs):
        return [1.0]

    with pytest.raises(ValueError, match="short returned 1 values, expected 3"):
        score_completions([short], ["p"] * 3, ["c"] * 3, {})


def test_missing_column_is_reported_with_the_dataset_columns():
    with pytest.raises(ValueError, match="reward function math needs dataset column 'answer'; the dataset has: "
                                         "question, solution"):
        score_completions([R.math_reward], ["p"], ["c"], {"question": ["q"], "solution": ["s"]})

    def needs_target(prompts, completions, target, **kwargs):
        return [1.0]

    with pytest.raises(ValueError, match="reward function needs_target needs dataset column 'target'; the dataset has: nums"):
        check_columns([R.format_reward, needs_target], ["nums"])
    with pytest.raises(ValueError, match="column 'tests'"):
        check_columns([R.code_reward], ["answer"])
    check_columns([R.math_reward, R.format_reward, needs_target, R.soft_overlong_reward], ["answer", "target"])


def test_trl_style_call_with_extra_kwargs():
    out = R.format_reward(prompts=["p"], completions=[[{"role": "assistant", "content": "<think>a</think><answer>b</answer>"}]],
                          completion_ids=[[1, 2]], trainer_state=object(), answer=["x"])
    assert out == [1.0]


@pytest.mark.parametrize("module", ["", ".base", ".maths", ".format", ".countdown", ".length", ".code_tests", ".sandbox"])
def test_docstring_examples(module):
    import importlib
    result = doctest.testmod(importlib.import_module(f"aha.rewards{module}"), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def _hangs_on_a_lock(prompts, completions, **kw):
    threading.Event().wait()  # never set


def _spins(prompts, completions, **kw):
    while True:
        try:
            pass
        except Exception:  # a broad handler in user code must not swallow the time limit
            pass


async def _awaits_forever(prompts, completions, **kw):
    await asyncio.Event().wait()


def _ones(prompts, completions, **kw):
    return [1.0] * len(completions)


def test_reward_functions_that_never_return_are_cut_at_their_limit():
    start = time.monotonic()
    rewards, metrics = score_completions([_hangs_on_a_lock, _ones, _spins, _awaits_forever], ["p"] * 2, ["c"] * 2,
                                         {}, timeout_s=0.5)
    elapsed = time.monotonic() - start
    assert elapsed < 0.5 * 2 + 1.0, elapsed  # two sync calls cut in turn, the async one alongside them
    assert torch.isnan(rewards[:, [0, 2, 3]]).all() and rewards[:, 1].tolist() == [1.0, 1.0]
    assert metrics["reward/call_timeouts"] == 3 and metrics["reward/errors"] == 0
    assert metrics["reward/_hangs_on_a_lock/none_frac"] == 1.0 and metrics["reward/_ones/none_frac"] == 0.0
    # the process is usable afterwards: the watchdog signal handler was restored, a fast call is unaffected
    rewards, metrics = score_completions([_ones], ["p"], ["c"], {}, timeout_s=0.5)
    assert rewards.tolist() == [[1.0]] and metrics["reward/call_timeouts"] == 0


def test_off_the_main_thread_a_hung_call_is_abandoned_at_its_limit():
    box = {}
    worker = threading.Thread(target=lambda: box.update(out=score_completions([_hangs_on_a_lock, _ones], ["p"], ["c"],
                                                                               {}, timeout_s=0.5)))
    start = time.monotonic()
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and time.monotonic() - start < 3.0
    rewards, metrics = box["out"]
    assert torch.isnan(rewards[0, 0]) and rewards[0, 1] == 1.0 and metrics["reward/call_timeouts"] == 1


@pytest.mark.parametrize("returned", [None, 1.0, "0.5", {"a": 1}])
def test_a_reward_returning_something_other_than_a_list_is_named(returned):
    def odd(prompts, completions, **kw):
        return returned

    with pytest.raises(ValueError, match=rf"reward function odd returned {type(returned).__name__} .*expected a list "
                                         r"of 2 values"):
        score_completions([odd], ["p"] * 2, ["c"] * 2, {})


@pytest.mark.parametrize("spec", ["Qwen/Qwen2.5-0.5B-reward", torch.nn.Linear(2, 1)])
def test_a_reward_model_is_refused_with_what_to_do_instead(spec):
    """TRL takes a model id or a model as a reward; aha says it does not and how to wrap one."""
    from aha.train.grpo import resolve_reward_funcs
    with pytest.raises(TypeError, match="aha takes no reward models .* wrap yours in a function"):
        resolve_reward_funcs([spec])


def test_log_metric_values_are_a_mean_over_calls_and_log_extra_says_what_to_use():
    from aha.rewards.scoring import merge_reward_metrics

    def logs(completions, log_metric, **kw):
        for c in completions:
            log_metric("chars", len(c))
        return [0.0] * len(completions)

    _, m = score_completions([logs], ["p"] * 3, ["a", "bb", "cccccc"], {})
    assert m["reward/logged/chars"] == 3.0  # (1 + 2 + 6) / 3
    # per-group calls merged: a mean over the calls that logged it (here 3.0 and 1.0), not a sum
    merged = merge_reward_metrics([logs], [m, {"reward/logged/chars": 1.0}, {}], torch.zeros(3, 1))
    assert merged["reward/logged/chars"] == 2.0

    def extra(completions, log_extra, **kw):
        log_extra("note", ["x"] * len(completions))
        return [0.0] * len(completions)

    rewards, m = score_completions([extra], ["p"], ["a"], {})
    assert m["reward/errors"] == 1.0 and math.isnan(rewards[0, 0])
    from aha.rewards.scoring import last_failure
    assert "log_metric(name, value) instead" in str(last_failure("extra"))


@pytest.mark.parametrize("specs, kwargs, message", [
    (["math"], {"maht": {"answer_column": "gold"}}, r"reward_kwargs has 'maht', but no reward function is built by "
                                                    r"that name \(by name: \['math'\]\)"),
    ([lambda completions, **kw: [0.0]], {"math": {}}, "a task builds its own rewards, set reward_funcs to choose"),
    (["math"], {"math": 3}, r"reward_kwargs\['math'\] must be a mapping"),
    (["math"], {"math": {"bogus": 1}}, r"reward 'math' with reward_kwargs \{'bogus': 1\}: .*bogus"),
])
def test_reward_kwargs_that_build_nothing_or_cannot_build_are_named(specs, kwargs, message):
    from aha.train.grpo import resolve_reward_funcs
    with pytest.raises(ValueError, match=message):
        resolve_reward_funcs(specs, kwargs)
    assert resolve_reward_funcs(["math"], {"math": {"answer_column": "gold"}})[0].required_columns == ("gold",)
