"""What becomes of groups whose rewards barely differ: RAGEN's std filter (keep_groups_by_std) after dynamic
sampling, in Experience.keep_groups; the groups left out take no part in the update."""

import pytest
import torch

from aha import algos
from aha.config import ConfigError, GRPOConfig
from aha.train.grpo import GRPOTrainer


def test_top_std_groups_keeps_the_most_spread_share_in_batch_order():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.5])         # G=2: std 0.7071, 0, 0.3536
    assert algos.top_std_groups(rewards, 2, 0.5).tolist() == [0, 2]   # ceil(0.5 * 3) = 2
    assert algos.top_std_groups(rewards, 2, 0.2).tolist() == [0]      # ceil(0.6) = 1
    assert algos.top_std_groups(rewards, 2, 1.0).tolist() == [0, 1, 2]
    # a group with one valid reward spreads least (std 0), equal spreads keep batch order
    assert algos.top_std_groups(torch.tensor([float("nan"), 5.0, 0.0, 1.0, 1.0, 0.0]), 2, 0.5).tolist() == [1, 2]


SPREAD = {"p0": 0.0, "p1": 3.0, "p2": 1.0, "p3": 2.0}


def spread_by_prompt(prompts, completions, **kw):
    """Group of 2 on prompt p: rewards [0, SPREAD[p]] (std SPREAD[p] / sqrt 2)."""
    return [SPREAD[p] * (i % 2) for i, p in enumerate(prompts)]


def _trainer(tmp_path, **kw):
    args = GRPOConfig(**{**dict(output_dir=str(tmp_path / "run"), max_steps=1, num_generations=2,
                                per_device_train_batch_size=8, max_completion_length=4, progress_bar=False,
                                report_to=["jsonl"], log_completions_steps=0, seed=0), **kw})
    return args


def test_the_filter_keeps_the_groups_that_spread_most_and_the_update_sees_only_them(tiny_dir, tmp_path):
    rows = [{"prompt": p} for p in SPREAD]
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[spread_by_prompt], train_dataset=rows,
                    args=_trainer(tmp_path, keep_groups_by_std=0.5, beta=0.04))
    seen = []
    update = t.learner.update
    t.learner.update = lambda batch: seen.append(batch) or update(batch)
    metrics = t.step()
    (batch,) = seen
    assert sorted(r["prompt"] for r in batch.rows) == ["p1", "p3"]     # std 2.12 and 1.41 of 2.12, 0, 0.71, 1.41
    assert len(batch.completion_ids) == 4 and metrics["sampling/std_filtered_groups"] == 2.0
    assert metrics["reward/mean"] == pytest.approx(sum(SPREAD.values()) / 8)  # rewards: every group sampled


def test_a_keep_share_outside_0_1_is_refused():
    with pytest.raises(ConfigError, match="keep_groups_by_std"):
        GRPOConfig(keep_groups_by_std=0)
