"""The replay buffer for groups without reward spread (TRL's GRPOWithReplayBuffer, replay_buffer_size): scores by
hand, the buffer keeps the best, flat groups replaced through Experience.keep_groups, and a few steps of training."""

import math

import pytest
import torch

from aha.batch import GRPOBatch
from aha.config import ConfigError, GRPOConfig
from aha.rollout.replay import ReplayBuffer, group_scores


def batch(rewards: list[list[float]], tag: str, version: int = 0) -> GRPOBatch:
    """Groups of 2 whose completions are named after the batch and group (`tag`0, `tag`1, ...)."""
    r = torch.tensor([float(x) for g in rewards for x in g])
    N = len(r)
    return GRPOBatch(rows=[{"prompt": f"{tag}{i}"} for i in range(len(rewards))], prompt_ids=[[1]] * N,
                     completion_ids=[[2, 3]] * N, texts=[f"{tag}{i // 2}" for i in range(N)],
                     truncated=torch.zeros(N, dtype=torch.bool), rewards_per_func=r[:, None], rewards=r,
                     advantages=torch.zeros(N), versions=torch.full((N,), version, dtype=torch.long))


def test_group_scores_by_hand():
    # [0, 1]: mean .5, std .7071 (n-1), sum |r - mean| = 1 -> .7071 x 1 / (.7071 + 1e-4) = 0.99986
    # [0, 3]: std 2.1213, sum 3 -> 2.1213 x 3 / 2.1214 = 2.99986;  [1, 1]: no spread -> 0
    s = group_scores(torch.tensor([0.0, 1.0, 0.0, 3.0, 1.0, 1.0]), 2)
    torch.testing.assert_close(s, torch.tensor([0.70711 / (0.70711 + 1e-4), 3 * 2.12132 / (2.12132 + 1e-4), 0.0]),
                               atol=1e-4, rtol=0)


def test_the_buffer_keeps_the_highest_scores_and_draws_by_score():
    buf = ReplayBuffer(2)
    for score, tag in [(1.0, "a"), (3.0, "b"), (2.0, "c"), (0.5, "d")]:
        buf.add(score, batch([[0, 1]], tag))
    assert sorted(s for s, _, _ in buf.heap) == [2.0, 3.0]            # a (1.0) displaced by c; d (0.5) never in
    drawn = buf.sample(300, torch.Generator().manual_seed(0))        # with replacement: 300 > 2
    share_b = sum(g.texts[0] == "b0" for g in drawn) / 300
    assert abs(share_b - 0.6) < 0.1                                  # 3 / (3 + 2)
    assert ReplayBuffer(2).sample(3, None) == [] and buf.sample(0, None) == []


def test_flat_groups_are_replaced_by_past_groups_with_spread():
    buf, gen = ReplayBuffer(4), torch.Generator().manual_seed(0)
    first, n = buf.replace_flat_groups(batch([[1, 1], [0, 1]], "s0-"), gen)
    # step 0: its spread group goes in first, so its flat group is replaced by it (the only one in the buffer)
    assert n == 1 and first.texts == ["s0-1", "s0-1", "s0-1", "s0-1"] and len(buf) == 1
    out, n = buf.replace_flat_groups(batch([[0, 2], [5, 5], [0, 0]], "s1-", version=1), gen)
    assert n == 2 and out.texts[:2] == ["s1-0", "s1-0"]              # its own spread group stays first
    assert {t for t in out.texts[2:]} <= {"s0-1", "s1-0"}            # the flat ones: past (or this step's) spread
    assert out.rewards.view(3, 2).std(-1).min() > 0                  # no flat group left


def test_an_empty_buffer_keeps_the_flat_groups():
    out, n = ReplayBuffer(4).replace_flat_groups(batch([[1, 1], [2, 2]], "x"), None)
    assert n == 0 and out.texts == ["x0", "x0", "x1", "x1"]


def test_replay_buffer_size_is_checked():
    assert GRPOConfig().replay_buffer_size == 0
    with pytest.raises(ConfigError, match="replay_buffer_size"):
        GRPOConfig(replay_buffer_size=-1)


PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def coin(prompts, completions, **kw):
    """The parity of the completion's characters' codes: in pairs, about half the groups have no spread."""
    return [float(sum(map(ord, c)) % 2) for c in completions]


def test_training_replays_past_groups_through_keep_groups(tiny_dir, tmp_path):
    from aha.metrics import read_metrics
    from aha.train.grpo import GRPOTrainer
    args = GRPOConfig(output_dir=str(tmp_path / "run"), max_steps=4, num_generations=2, per_device_train_batch_size=16,
                      max_completion_length=8, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                      log_completions_steps=0, log_groups_steps=0, seed=0, replay_buffer_size=8)
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[coin], args=args, train_dataset=PROMPTS)
    calls = []
    keep = t.experience.keep_groups
    t.experience.keep_groups = lambda *a: calls.append(keep(*a)) or calls[-1]
    t.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 4 and all(math.isfinite(r["loss"]) for r in rows)
    assert sum(r["sampling/replayed_groups"] for r in rows) > 0 and rows[-1]["sampling/replay_size"] > 0
    for out, metrics in calls:  # once the buffer holds a group, no trained group is flat
        if metrics["sampling/replay_size"]:
            assert out.rewards.view(-1, 2).std(-1).min() > 0
