"""The interface the trainer relies on: registry, score_completions, check_columns, metrics, and the
docstring examples of every verifier module."""
from __future__ import annotations

import asyncio
import copy
import doctest
import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy
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
    with pytest.raises(ValueError, match=r"valid names: (\w+, )*code, countdown, (\w+, )*format"):
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
        return [float("nan"), 1.0]  # one usable value: the NaN is excluded, the call is no failure

    with caplog.at_level(logging.ERROR, logger="aha.rewards.scoring"):
        for _ in range(3):
            _, metrics = score_completions([flaky, nan_giver], ["p"] * 2, ["c"] * 2, {})
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

    failures = {}
    rewards, m = score_completions([extra], ["p"], ["a"], {}, failures_out=failures)
    assert m["reward/errors"] == 1.0 and math.isnan(rewards[0, 0])
    assert "log_metric(name, value) instead" in str(failures["extra"])


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


# ------------------------------------------------------------------ rewards that fight their limits
from test_faults import PROMPTS, ROOT, SUBPROCESS_TIMEOUT_S, read_line  # noqa: E402  (their one home)
from test_faults import digit_share as _digit_share  # noqa: E402
from test_faults import grpo_args as _grpo_args  # noqa: E402


def _python(tmp_path, script: str) -> subprocess.Popen:
    (tmp_path / "script.py").write_text(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, str(tmp_path / "script.py")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout_s: float = SUBPROCESS_TIMEOUT_S) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_reward_that_swallows_its_time_limit_ends_the_process_naming_it(tmp_path):
    from aha.rewards.deadline import STUCK_EXIT_CODE
    proc = _python(tmp_path, """
        import time
        import aha.rewards.deadline as deadline
        from aha.rewards import score_completions
        deadline.STUCK_GRACE_S = 0.5

        def swallows(prompts, completions, **kw):
            while True:
                try:
                    time.sleep(0.01)
                except:  # noqa: E722 - the bug: it swallows RewardTimeout too
                    pass

        start = time.monotonic()
        try:
            score_completions([swallows], ["p"], ["c"], {}, timeout_s=0.3)
        finally:
            print(f"returned after {time.monotonic() - start:.1f} s", flush=True)
        """)
    out, err = _finish(proc, 60)
    assert proc.returncode == STUCK_EXIT_CODE, (out, err)
    assert out == ""  # neither returned nor unwound: ended from the watchdog
    assert err.strip().splitlines()[-1].startswith(
        "aha: reward function swallows ignored its time limit (reward_timeout=0.3 s) and still ran 0.5 s later")


def test_a_second_stop_signal_ends_a_reward_that_swallows_it(tmp_path):
    proc = _python(tmp_path, f"""
        import sys, time
        from aha.config import SFTConfig
        from aha.rewards import score_completions
        from aha.train.loop import Trainer

        class Idle(Trainer):
            def step(self):
                return {{}}

        Idle(SFTConfig(output_dir={str(tmp_path / "idle")!r}), eval_fn=None)._install_signal_handlers()

        def swallows(prompts, completions, **kw):
            print("in", flush=True)
            while True:
                try:
                    time.sleep(0.01)
                except:  # noqa: E722
                    pass

        score_completions([swallows], ["p"], ["c"], {{}})  # no time limit: only the stop can end it
        """)
    try:
        assert read_line(proc) == "in\n", _finish(proc, 1)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        elapsed = time.monotonic() - start
    finally:
        _, err = _finish(proc, 1)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert elapsed < 10, elapsed
    assert err.strip().splitlines()[-1] == (
        "aha: stopped at once by a second SIGTERM during step 1; steps since the last checkpoint are lost "
        "(no checkpoint yet); reward function swallows caught the stop and ran on: process ended")


def test_a_stop_signal_raised_inside_a_reward_reaches_the_trainer_even_if_swallowed(tmp_path):
    from aha.config import SFTConfig
    from aha.train.loop import Preempted, Trainer

    class Idle(Trainer):
        def step(self):
            return {}

    def stop_twice(swallow: bool):
        def reward(prompts, completions, **kw):
            for _ in range(2):
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.2)
                except BaseException:
                    if not swallow:
                        raise
            return [1.0] * len(completions)
        return reward

    trainer = Idle(SFTConfig(output_dir=str(tmp_path / "idle")), eval_fn=None)
    previous = trainer._install_signal_handlers()
    try:
        for swallow in (True, False):
            trainer._stop_signal = None
            with pytest.raises(Preempted) as e:  # a SystemExit, yet the trainer's: not a reward failure
                score_completions([stop_twice(swallow)], ["p"], ["c"], {}, timeout_s=30)
            assert e.value.code == 128 + signal.SIGTERM
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    rewards, _ = score_completions([_ones], ["p"], ["c"], {}, timeout_s=30)  # the handlers are back, nothing pending
    assert rewards.tolist() == [[1.0]]


def test_a_reward_that_ignores_its_limit_ends_aha_train_and_leaves_its_checkpoint(tiny_dir, tmp_path):
    from aha.rewards.deadline import STUCK_EXIT_CODE
    from aha.train.grpo import GRPOTrainer
    (tmp_path / "stubborn_rewards.py").write_text(textwrap.dedent("""
        import time
        import aha.rewards.deadline as deadline
        deadline.STUCK_GRACE_S = 1.0
        CALLS = [0]

        def stubborn(prompts, completions, **kw):
            CALLS[0] += 1
            while CALLS[0] >= 2:  # step 2 on: never returns, and swallows the cut
                try:
                    time.sleep(0.01)
                except:  # noqa: E722
                    pass
            return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
        """))
    data, run = tmp_path / "data.jsonl", tmp_path / "run"
    data.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    cfg = dict(max_steps=4, save_steps=1, num_generations=4, per_device_train_batch_size=8, max_completion_length=8,
               learning_rate=1e-2, progress_bar=False, report_to=["jsonl"], log_completions_steps=0, seed=0,
               threads=torch.get_num_threads(), reward_timeout=1.0)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    proc = subprocess.Popen([sys.executable, "-m", "aha.cli", "train", f"model={tiny_dir}", f"dataset={data}",
                             "reward_funcs=stubborn_rewards:stubborn", f"output_dir={run}",
                             *[f"{k}={json.dumps(v)}" for k, v in cfg.items()]],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = _finish(proc)
    assert proc.returncode == STUCK_EXIT_CODE, err
    assert err.strip().splitlines()[-1].startswith(
        "aha: reward function stubborn ignored its time limit (reward_timeout=1 s) and still ran 1 s later")
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    resumed = GRPOTrainer(model=tiny_dir, reward_funcs=[_digit_share], train_dataset=PROMPTS,
                          args=_grpo_args(run, max_steps=1, resume=True))
    resumed.train()  # checkpoint-1 loads: written before the stop, and whole
    assert resumed.step_count == 1 and resumed.saved_step == 1


# ------------------------------------------------------------------ a reward's exit is its failure
def _exits(prompts, completions, **kw):
    sys.exit(0)


def _exits_3(prompts, completions, **kw):
    raise SystemExit(3)


def _interrupts(prompts, completions, **kw):
    raise KeyboardInterrupt


async def _exits_async(prompts, completions, **kw):
    sys.exit(0)


@pytest.mark.parametrize("thread", ["main", "worker"])
def test_a_reward_that_exits_or_interrupts_is_a_failed_call_not_an_exit(thread):
    funcs = [_exits, _exits_3, _interrupts, _ones, _exits_async]
    failures = {}
    call = lambda: score_completions(funcs, ["p"] * 2, ["c"] * 2, {}, timeout_s=30, failures_out=failures)  # noqa: E731
    if thread == "main":
        rewards, metrics = call()
    else:
        box = {}
        worker = threading.Thread(target=lambda: box.update(out=call()))
        worker.start()
        worker.join(30)
        rewards, metrics = box["out"]
    assert metrics["reward/errors"] == 4 and metrics["reward/call_timeouts"] == 0
    assert rewards[:, 3].tolist() == [1.0, 1.0] and torch.isnan(rewards[:, [0, 1, 2, 4]]).all()
    assert all(metrics[f"reward/{f.__name__}/failed"] == 1.0 for f in (_exits, _exits_3, _interrupts, _exits_async))
    assert isinstance(failures["_exits"], SystemExit) and isinstance(failures["_interrupts"], KeyboardInterrupt)
    assert set(failures) == {"_exits", "_exits_3", "_interrupts", "_exits_async"}  # the failed calls, returned


def _all_inf(prompts, completions, **kw):
    return [math.inf] * len(completions)


@pytest.mark.parametrize("bad, last", [(_exits, r"SystemExit\(0\)"), (_interrupts, r"KeyboardInterrupt\(\)"),
                                       (_all_inf, r"all 8 values were unusable")], ids=["exit", "interrupt", "inf"])
def test_a_reward_that_exits_or_gives_nothing_usable_counts_toward_reward_fail_steps(tiny_dir, tmp_path, bad, last):
    from aha.train.grpo import GRPOTrainer
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[_digit_share, bad], train_dataset=PROMPTS,
                    args=_grpo_args(tmp_path / "run", max_steps=4, reward_fail_steps=2))
    verb = "gave no usable value" if bad is _all_inf else "raised or timed out"
    with pytest.raises(RuntimeError, match=rf"reward function {bad.__name__} {verb} on 2 consecutive steps "
                                           rf"\(last: .*{last}"):
        t.train()
    assert t.step_count == 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and rows[0]["reward/errors"] == 1.0


# ------------------------------------------------------------------ each function its own inputs
def test_each_reward_function_gets_its_own_copy_of_prompts_completions_and_columns():
    rows = [{"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4", "meta": {"tags": ["a"]}}]
    original = copy.deepcopy(rows)
    seen = []

    def edits(prompts, completions, meta, **kw):
        prompts[0].append({"role": "assistant", "content": "judge"})  # G completions: must not share one list
        completions[0][0]["content"] = ""
        completions[1].clear()
        meta[0]["tags"].append("b")
        return [0.0] * len(completions)

    def looks(prompts, completions, meta, **kw):
        seen.append((prompts, completions, meta))
        return [float(len(completions[i][0]["content"])) for i in range(len(completions))]

    async def edits_async(prompts, completions, meta, **kw):
        return edits(prompts, completions, meta)

    for funcs in ([edits, looks], [edits_async, looks]):
        rewards, _ = R.score_groups(funcs, rows, ["four", "4"], 2)
        assert rewards[:, 1].tolist() == [4.0, 1.0]
    for prompts, completions, meta in seen:
        assert prompts == [original[0]["prompt"]] * 2 and meta == [{"tags": ["a"]}] * 2
        assert completions == [[{"role": "assistant", "content": "four"}], [{"role": "assistant", "content": "4"}]]
    assert rows == original  # the sampler's rows never change

    def appends_to_the_first(prompts, completions, **kw):
        prompts[0].append({"role": "assistant", "content": "judge"})
        return [float(len(p)) for p in prompts]

    rewards, _ = R.score_groups([appends_to_the_first], rows, ["a", "b"], 2)
    assert rewards[:, 0].tolist() == [2.0, 1.0] and rows == original


# ------------------------------------------------------------------ values that cannot be used
@pytest.mark.parametrize("values, nan, failed", [
    ([math.inf, -math.inf, math.nan], 3, True),
    ([None, math.inf, "n/a"], 2, True),       # no usable value at all
    ([None, None, None], 0, False),           # not applicable to this batch: legitimate
    ([1.0, math.inf, None], 1, False),        # one usable value
], ids=["all-nonfinite", "none-and-unusable", "all-none", "one-usable"])
def test_a_reward_with_no_usable_value_at_all_is_a_failed_call(values, nan, failed):
    def unusable(prompts, completions, **kw):
        return values

    failures = {}
    _, metrics = score_completions([unusable], ["p"] * 3, ["c"] * 3, {}, failures_out=failures)
    assert metrics["reward/unusable/failed"] == float(failed) and metrics["reward/errors"] == float(failed)
    assert metrics["reward/nan"] == nan  # the values are still counted one by one
    if failed:
        assert "reward function unusable gave no usable value: all 3 values were unusable" in \
            str(failures["unusable"])


@pytest.mark.parametrize("returned, shape", [
    (lambda n: numpy.ones((n, 1)), r"\(3, 1\)"),
    (lambda n: torch.ones(n, 2), r"\(3, 2\)"),
    (lambda n: [[1.0]] * n, r"\(3, 1\)"),
    (lambda n: [1.0, [0.5, 0.5], 1.0], r"value 1 is a list"),
], ids=["numpy-n-1", "tensor-n-2", "list-of-lists", "one-list"])
def test_a_reward_of_a_shape_trl_refuses_is_an_error_naming_the_shape(returned, shape):
    def shaped(prompts, completions, **kw):
        return returned(len(completions))

    with pytest.raises(ValueError, match=rf"reward function shaped returned .*{shape}.*expected 3 values"):
        score_completions([shaped], ["p"] * 3, ["c"] * 3, {})
