"""positive_nll_coef, VAPO's positive-example LM loss: the term by hand, its settings, and in training: it trains the
positive episodes of groups with no spread of reward (advantage 0), none below positive_reward, and its token mean
is the same however the step is cut into passes."""

import math

import pytest
import torch

from aha import algos
from aha.config import ConfigError, GRPOConfig

PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def test_positive_nll_by_hand():
    # a 3-token step in two passes: pass 1 a positive row [-1, -3] and a negative row, pass 2 a positive [-2] + pad
    one = algos.positive_nll(torch.tensor([[-1.0, -3.0], [-5.0, -5.0]]), torch.ones(2, 2),
                             torch.tensor([True, False]), num_tokens=3)
    two = algos.positive_nll(torch.tensor([[-2.0, -9.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([True]), 3)
    assert one.item() == pytest.approx(4 / 3) and two.item() == pytest.approx(2 / 3)
    assert (one + two).item() == pytest.approx(2.0)                       # the step's mean NLL (1 + 3 + 2) / 3
    assert algos.positive_nll(torch.tensor([[-1.0]]), torch.ones(1, 1), torch.tensor([False]), 0).item() == 0.0


def test_positive_settings_are_config_errors():
    with pytest.raises(ConfigError, match="positive_nll_coef must be >= 0"):
        GRPOConfig(positive_nll_coef=-0.1)
    with pytest.raises(ConfigError, match="positive_reward"):
        GRPOConfig(positive_reward=math.nan)


def _trainer(tiny_dir, path, reward, **kw):
    from aha.train.grpo import GRPOTrainer
    args = dict(output_dir=str(path), max_steps=1, num_generations=4, per_device_train_batch_size=8,
                max_completion_length=8, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                log_completions_steps=0, log_groups_steps=0, seed=0, max_grad_norm=0.0)
    constant = lambda prompts, completions, **k: [reward] * len(completions)  # noqa: E731
    return GRPOTrainer(model=tiny_dir, reward_funcs=[constant], train_dataset=PROMPTS,
                       args=GRPOConfig(**{**args, **kw}))


def _moved(t, before):
    return any(not torch.equal(before[n], p) for n, p in t.model.named_parameters())


@pytest.mark.parametrize("reward, coef, moved", [(1.0, 0.0, False), (1.0, 0.5, True), (0.5, 0.5, False)])
def test_positives_train_without_advantage(tiny_dir, tmp_path, reward, coef, moved):
    """Every group succeeds whole (advantage 0): without the term nothing trains; with it the weights move and the
    loss is coef x the logged NLL; episodes below positive_reward are not positives."""
    t = _trainer(tiny_dir, tmp_path / "run", reward, positive_nll_coef=coef)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    m = t.step()
    assert _moved(t, before) == moved
    if coef and moved:
        assert m["positive/frac"] == 1.0 and m["positive/nll"] > 0
        assert m["loss"] == pytest.approx(coef * m["positive/nll"], rel=1e-5)
    elif coef:
        assert m["positive/frac"] == 0.0 and math.isnan(m["positive/nll"])
    else:
        assert "positive/nll" not in m


def test_positive_nll_is_the_same_over_passes(tiny_dir, tmp_path):
    """One pass or passes of a few tokens each: the same term (its denominator is the step's positive tokens)."""
    runs = []
    for budget in (0, 12):
        t = _trainer(tiny_dir, tmp_path / str(budget), 1.0, positive_nll_coef=0.5, max_tokens_per_micro_batch=budget,
                     per_device_train_batch_size=40)
        runs.append(t.step())
    one, cut = runs
    for key in ("positive/nll", "loss", "grad_norm"):  # the gradient's norm: the term's gradient adds up too
        assert one[key] == pytest.approx(cut[key], rel=1e-5), key
    assert one["perf/pass_tokens"] == 0 and cut["perf/pass_tokens"] == 12
