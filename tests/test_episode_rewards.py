"""Episode rewards (aha.rewards.episode) on hand-made episodes, and the `episodes` argument the trainer gives."""

import math

import pytest

from aha import GRPOConfig, GRPOTrainer
from aha.rewards import get_reward
from aha.rewards.episode import (CutAsFailure, EndedReward, ProgressReward, ToolEfficiency, ToolErrorPenalty,
                                 otc_factor)


def ep(finish="stop", calls=0, **outcomes):
    return {"finish": finish, "calls": calls, "outcomes": outcomes or ({"ok": calls} if calls else {})}


def succeeds(*values):
    return lambda prompts, completions, **kw: list(values)


class Env:
    def __init__(self, reward):
        self.reward = reward

    def get_reward(self):
        return self.reward


def test_ended_is_one_only_for_an_episode_the_model_ended():
    episodes = [ep("stop"), ep("length"), ep("tool_limit")]
    assert EndedReward()(None, [[]] * 3, episodes=episodes) == [1.0, 0.0, 0.0]


def test_each_failed_call_costs_per_error_at_most_one_and_a_slow_tool_costs_nothing():
    episodes = [ep(calls=3, ok=2, raised=1), ep(calls=2, malformed=1, bad_arguments=1), ep(calls=4, unknown=3, ok=1),
                ep(calls=1, timeout=1), ep()]
    # errors: 1, 2, 3, 0, 0 -> -min(1, 0.4 * errors)
    assert ToolErrorPenalty(per_error=0.4)(None, [[]] * 5, episodes=episodes) == pytest.approx(
        [-0.4, -0.8, -1.0, 0.0, 0.0], abs=1e-12)
    with pytest.raises(ValueError, match="per_error"):
        ToolErrorPenalty(per_error=0)


def test_tool_efficiency_is_otcs_factor_against_the_fewest_calls_of_the_groups_successes():
    episodes = [ep(calls=2), ep(calls=3), ep(calls=5), ep(calls=1),       # group 1: the 1-call episode failed
                ep(calls=0), ep(calls=2), ep(calls=1), ep(calls=4)]       # group 2: a success with no call
    got = ToolEfficiency(4, success=succeeds(1, 1, 1, 0, 1, 1, 0, 0))(None, [[]] * 8, episodes=episodes)
    # group 1: n = 2 (fewest calls among successes). m=2: f=2*2*2/4=2, sin(2*pi/4)=1; m=3: f=12/5=2.4,
    # sin(2.4*pi/4)=sin(0.6 pi)=0.951057; m=5: f=20/7, sin(20/7*pi/4)=sin(5 pi/7)=0.781831; the failure 0.
    # group 2: n = 0: cos(m*pi/(2m+1)): m=0 -> 1; m=2 -> cos(2 pi/5)=0.309017; the failures 0.
    assert got == pytest.approx([1.0, 0.951057, 0.781831, 0.0, 1.0, 0.309017, 0.0, 0.0], abs=1e-6)
    assert otc_factor(3, 2) == pytest.approx(math.sin(0.6 * math.pi), abs=1e-12)


def test_tool_efficiency_reads_the_environments_and_can_count_a_cut_episode_as_failed():
    episodes = [ep("length", calls=1), ep(calls=2), ep(calls=4), ep(calls=3)]
    envs = [Env(1.0), Env(1.0), Env(1.0), Env(0.5)]                      # 0.5 < threshold 1: not a success
    # the cut 1-call episode succeeds: n = 1; m=2: f=4/3, sin(4/3*pi/2)=sin(2pi/3)=0.866025; m=4: f=8/5,
    # sin(0.8 pi)=0.587785
    assert ToolEfficiency(4)(None, [[]] * 4, episodes=episodes, environments=envs) == pytest.approx(
        [1.0, 0.866025, 0.587785, 0.0], abs=1e-6)
    # cut_is_failure: n = 2 (the cut one is no success); m=4: f=16/6, sin(2/3 pi)=0.866025
    assert ToolEfficiency(4, cut_is_failure=True)(None, [[]] * 4, episodes=episodes, environments=envs) == \
        pytest.approx([0.0, 1.0, 0.866025, 0.0], abs=1e-6)
    with pytest.raises(ValueError, match="not whole groups of group_size=3"):
        ToolEfficiency(3)(None, [[]] * 4, episodes=episodes, environments=envs)


def test_cut_as_failure_takes_back_the_success_of_an_episode_that_did_not_end_by_itself():
    episodes = [ep("stop"), ep("length"), ep("tool_limit"), ep("length")]
    envs = [Env(1.0), Env(1.0), Env(1.0), Env(None)]
    assert CutAsFailure()(None, [[]] * 4, episodes=episodes, environments=envs) == [0.0, -1.0, -1.0, None]
    only_length = CutAsFailure(finishes=("length",))
    assert only_length(None, [[]] * 4, episodes=episodes, environments=envs) == [0.0, -1.0, 0.0, None]
    with pytest.raises(ValueError, match="finishes"):
        CutAsFailure(finishes=("stop",))


class AsyncEnv(Env):
    async def get_reward(self):
        return self.reward


def test_success_is_awaited_when_async_and_numpy_or_tensor_values_are_numbers():
    import numpy as np
    import torch
    episodes = [ep("stop"), ep("length"), ep("length"), ep("length")]
    envs = [AsyncEnv(1.0), AsyncEnv(np.float32(1.0)), Env(torch.tensor(0.5)), AsyncEnv(None)]
    # -s on the cut ones, s read as a number: [0, -1, -0.5, None (no reward)]
    assert CutAsFailure()(None, [[]] * 4, episodes=episodes, environments=envs) == [0.0, -1.0, -0.5, None]

    async def success(prompts, completions, **kw):
        return [np.float32(1.0), torch.tensor(1.0), 0.0, float("inf")]
    assert CutAsFailure(success=success)(None, [[]] * 4, episodes=episodes) == [0.0, -1.0, 0.0, None]


def test_an_environment_retired_during_its_episode_gives_no_success():
    episodes = [ep("length"), {**ep("length"), "environment_retired": True}]
    # the second environment's call ran past tool_timeout: its get_reward is not read (None), however it reads now
    assert CutAsFailure()(None, [[]] * 2, episodes=episodes, environments=[Env(1.0), Env(1.0)]) == [-1.0, None]


def test_progress_reads_each_environments_progress_and_names_one_without_it():
    class Partial(Env):
        def progress(self):
            return self.reward

    episodes = [ep(), ep("length"), {**ep(), "environment_retired": True}]
    got = get_reward("progress")(None, [[]] * 3, episodes=episodes,
                                 environments=[Partial(0.25), Partial(1), Partial(0.5)])
    assert got == [0.25, 1.0, None]                       # the retired environment is not read
    with pytest.raises(ValueError, match="Env has none"):
        ProgressReward()(None, [[]], episodes=[ep()], environments=[Env(1.0)])
    with pytest.raises(ValueError, match="environment_factory"):
        ProgressReward()(None, [[]], episodes=[ep()])


def test_an_episode_reward_without_episodes_names_itself():
    with pytest.raises(ValueError, match="reward episode_ended scores an agent's episodes"):
        get_reward("episode_ended")(["q"], ["a"])


def test_the_trainer_gives_reward_functions_each_episodes_finish_and_call_outcomes(tiny_dir, tmp_path):
    from scripted import CounterEnv, ScriptedAgentEngine
    seen = {}

    def record(completions, episodes, **kwargs):
        seen["episodes"] = episodes
        return [0.0] * len(completions)

    rows = [{"prompt": [{"role": "user", "content": f"Count to {t}."}], "target": t} for t in (3, 4)]
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, num_generations=2, per_device_train_batch_size=4,
                      max_completion_length=1024, progress_bar=False, report_to=["jsonl"], log_completions_steps=0,
                      seed=0)
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[record, get_reward("episode_ended"), get_reward("tool_errors")],
                    train_dataset=rows, environment_factory=CounterEnv, engine_factory=ScriptedAgentEngine, args=args)
    batch, _ = t.next_batch()
    assert seen["episodes"] == [{"finish": "stop", "calls": 3, "outcomes": {"ok": 3},  # the script's 3 calls
                                 "environment_retired": False}] * 4
    assert batch.rewards_per_func[:, 1].tolist() == [1.0] * 4 and batch.rewards_per_func[:, 2].tolist() == [0.0] * 4


def test_tool_efficiency_finds_a_rows_episodes_without_group_size():
    prompts = [[{"role": "user", "content": "Move every .txt"}]] * 4     # one instruction, two rows (two trees)
    episodes = [ep(calls=2), ep(calls=3), ep(calls=3), ep(calls=4)]
    got = ToolEfficiency(success=succeeds(1, 1, 1, 1))(prompts, [[]] * 4, episodes=episodes, fs=["a", "a", "b", "b"])
    # row a: n = 2: [1, sin(2.4 pi / 4) = 0.951057]; row b: n = 3: [1, f = 24/7, sin(24/7 * pi / 6) = 0.974928]
    assert got == pytest.approx([1.0, 0.951057, 1.0, 0.974928], abs=1e-6)
