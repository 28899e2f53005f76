"""multi_objective_aggregation with TRL's semantics: normalize_then_sum (GDPO) normalises each reward function
within its group, sums them with their weights, and normalises the sum over the batch."""

import math

import pytest
import torch

from aha import algos
from aha.config import ConfigError, GRPOConfig

EPS = algos.ADV_EPS


def gdpo(rpf, weights, G):
    z = algos.normalize_then_sum(rpf, G)                                          # [N,F]
    finite = torch.isfinite(z)
    s = torch.where(finite.any(-1), (torch.where(finite, z, torch.zeros_like(z)) * weights).sum(-1),
                    torch.full((len(z),), float("nan")))
    return algos.compute_advantages("gdpo", s, G)[0]


def test_normalize_then_sum_by_hand():
    # G=2, two groups, two functions weighted [1, 2]: f1 = [1, 0 | 2, 2], f2 = [3, 3 | 0, 4]
    rpf = torch.tensor([[1.0, 3.0], [0.0, 3.0], [2.0, 0.0], [2.0, 4.0]])
    a = 0.5 / (math.sqrt(0.5) + EPS)            # f1 in group 0: mean .5, std .7071
    b = 2.0 / (math.sqrt(8.0) + EPS)            # f2 in group 1: mean 2, std 2.8284
    z = algos.normalize_then_sum(rpf, 2)
    torch.testing.assert_close(z, torch.tensor([[a, 0.0], [-a, 0.0], [0.0, -b], [0.0, b]]), atol=1e-6, rtol=0)
    s = [a, -a, -2 * b, 2 * b]                  # the weighted sums; batch mean 0
    std = math.sqrt(sum(x * x for x in s) / 3)
    adv = gdpo(rpf, torch.tensor([1.0, 2.0]), 2)
    torch.testing.assert_close(adv, torch.tensor([x / (std + EPS) for x in s]), atol=1e-5, rtol=0)
    # the weights now count: group 1's f2 (weight 2) moves it twice as far as group 0's f1; summed first, both
    # groups' rewards [7, 6] and [2, 10] give +-0.707 alike
    assert adv[3] / adv[0] == pytest.approx(2 * b / a, rel=1e-4)
    plain = algos.compute_advantages("grpo", (rpf * torch.tensor([1.0, 2.0])).sum(-1), 2)[0]
    assert plain.abs().tolist() == pytest.approx([0.7070] * 4, abs=1e-3)


def test_normalize_then_sum_matches_trl_formula_with_missing_rewards():
    """Against TRL's arithmetic written out with nanmean and Bessel-corrected nanstd, where a function returned None
    (NaN) for some completions; aha's equal-group rule is the only difference and this batch has no equal group."""
    g = torch.Generator().manual_seed(3)
    rpf = torch.rand(12, 3, generator=g)
    rpf[1, 0] = rpf[7, 2] = rpf[8, 1] = float("nan")
    w, G = torch.tensor([1.0, 0.5, 2.0]), 4

    def nanstd(x, dim):
        n = (~torch.isnan(x)).sum(dim, keepdim=True)
        m = torch.nanmean(x, dim, keepdim=True)
        return (torch.nanmean((x - m) ** 2, dim, keepdim=True) * n / (n - 1)).sqrt()

    grouped = rpf.view(-1, G, 3)
    z = ((grouped - torch.nanmean(grouped, 1, keepdim=True)) / (nanstd(grouped, 1) + EPS)).view(-1, 3)
    s = (z * w).nansum(1)
    expect = (s - s.mean()) / (nanstd(s, 0) + EPS)
    torch.testing.assert_close(gdpo(rpf, w, G), expect, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kw", [dict(advantage_estimator="rloo"), dict(advantage_estimator="grpo_process"),
                                dict(scale_rewards="batch"), dict(scale_rewards="none")])
def test_normalize_then_sum_refuses_another_baseline(kw):
    with pytest.raises(ConfigError, match="normalize_then_sum .GDPO. normalises each reward in its group"):
        GRPOConfig(multi_objective_aggregation="normalize_then_sum", **kw)


def test_normalize_then_sum_selects_the_gdpo_estimator():
    assert GRPOConfig(multi_objective_aggregation="normalize_then_sum").advantage_estimator == "gdpo"
    assert GRPOConfig(multi_objective_aggregation="normalize_then_sum", scale_rewards="group").advantage_estimator == "gdpo"
    assert GRPOConfig().multi_objective_aggregation == "sum_then_normalize"
    with pytest.raises(ConfigError, match="multi_objective_aggregation: 'mean' is not one of"):
        GRPOConfig(multi_objective_aggregation="mean")


PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def digits(prompts, completions, **kw):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def length(prompts, completions, completion_ids, **kw):
    return [len(ids) / 100 for ids in completion_ids]


def test_a_training_step_uses_the_gdpo_advantages(tiny_dir, tmp_path):
    from aha.train.grpo import GRPOTrainer
    args = GRPOConfig(output_dir=str(tmp_path / "run"), max_steps=1, num_generations=4, per_device_train_batch_size=8,
                      max_completion_length=8, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                      log_completions_steps=0, log_groups_steps=0, seed=0, reward_weights=[1.0, 3.0],
                      multi_objective_aggregation="normalize_then_sum")
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digits, length], args=args, train_dataset=PROMPTS)
    m = t.step()
    b = t.last_batch
    torch.testing.assert_close(b.advantages, gdpo(b.rewards_per_func, torch.tensor([1.0, 3.0]), 4))
    assert m["reward/mean"] == pytest.approx(b.rewards.mean().item())  # the reported reward is the raw weighted sum
    assert math.isfinite(m["loss"])
