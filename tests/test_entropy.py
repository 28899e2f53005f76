"""Entropy control with TRL's semantics: the bonus's gradient through the chunked log-prob function, the mean
entropy it adds, the adaptive coefficient, and in training: applied from the previous step, logged, and saved in
checkpoints and restored on resume."""

import math

import pytest
import torch

from aha import algos
from aha.config import ConfigError, GRPOConfig
from aha.train import logprobs as lp_mod


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entropy_gradient_matches_autograd_in_float64(dtype, monkeypatch):
    """d(sum w_logp logp + w_ent H) / d logits against autograd in float64, over several chunks."""
    monkeypatch.setattr(lp_mod, "CHUNK_ELEMENTS", 3 * 50)
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 5, 50, generator=g) * 2).to(dtype).requires_grad_()
    ids = torch.randint(0, 50, (2, 5), generator=g)
    w, v = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)
    logp, ent = lp_mod.TokenLogProbs.apply(x, ids, 0.7, True)
    ((logp * w).sum() + (ent * v).sum()).backward()
    ref_x = x.detach().double().requires_grad_()
    ls = (ref_x / 0.7).log_softmax(-1)
    ref_ent = -(ls.exp() * ls).sum(-1)
    ((ls.gather(-1, ids[..., None]).squeeze(-1) * w.double()).sum() + (ref_ent * v.double()).sum()).backward()
    tol = 1e-6 if dtype == torch.float32 else 2**-8
    torch.testing.assert_close(x.grad.double(), ref_x.grad, atol=tol, rtol=tol)


def test_entropy_alone_has_a_gradient():
    x = torch.tensor([[[1.0, 0.0, -1.0]]], requires_grad=True)
    _, ent = lp_mod.TokenLogProbs.apply(x, torch.tensor([[0]]), 1.0, True)
    ent.sum().backward()
    ref = torch.tensor([[[1.0, 0.0, -1.0]]], dtype=torch.float64, requires_grad=True)
    p = ref.softmax(-1)
    (-(p * p.log()).sum()).backward()
    torch.testing.assert_close(x.grad.double(), ref.grad, atol=1e-6, rtol=0)


def test_entropy_bonus_by_hand():
    # a 3-token step in two passes, every token kept: pass 1 entropies [1, 3], pass 2 [2] (one padding column)
    one = algos.entropy_bonus(torch.tensor([[1.0, 3.0]]), torch.ones(1, 2), torch.ones(1, 2), num_tokens=3)
    two = algos.entropy_bonus(torch.tensor([[2.0, 9.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]]),
                              num_tokens=3)
    assert one.item() == pytest.approx(2 / 3 * 2) and two.item() == pytest.approx(1 / 3 * 2)
    assert (one + two).item() == pytest.approx(2.0)              # the step's mean entropy (1 + 3 + 2) / 3
    # top_entropy_quantile keeps tokens 2 and 3 of a pass of 4: its mean over the kept ones, (3 + 4) / 2 = 3.5
    kept = algos.high_entropy_mask(torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.ones(1, 4), 0.5)
    assert algos.entropy_bonus(torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.ones(1, 4), kept, 4).item() == 3.5


def test_adaptive_coefficient_by_hand():
    assert algos.adaptive_entropy_coef(0.01, 0.1, 0.2, 0.005, 0.0, 1.0) == pytest.approx(0.015)  # below target: up
    assert algos.adaptive_entropy_coef(0.01, 0.2, 0.2, 0.005, 0.0, 1.0) == pytest.approx(0.015)  # at target: up
    assert algos.adaptive_entropy_coef(0.01, 0.3, 0.2, 0.005, 0.0, 1.0) == pytest.approx(0.005)  # above: down
    assert algos.adaptive_entropy_coef(0.002, 0.3, 0.2, 0.005, 0.0, 1.0) == 0.0                  # floor
    assert algos.adaptive_entropy_coef(0.998, 0.1, 0.2, 0.005, 0.0, 1.0) == 1.0                  # ceiling
    assert algos.applied_entropy_coef(0.3, False, math.inf, 0.2) == 0.3      # static: always
    assert algos.applied_entropy_coef(0.3, True, math.inf, 0.2) == 0.0       # adaptive, nothing measured yet
    assert algos.applied_entropy_coef(0.3, True, 0.2, 0.2) == 0.3            # previous entropy at the target
    assert algos.applied_entropy_coef(0.3, True, 0.25, 0.2) == 0.0


def test_entropy_settings_are_config_errors():
    with pytest.raises(ConfigError, match="entropy_coef_min 0.5 > entropy_coef_max 0.1"):
        GRPOConfig(use_adaptive_entropy=True, entropy_coef_min=0.5, entropy_coef_max=0.1)
    with pytest.raises(ConfigError, match="entropy_coef_delta must be >= 0"):
        GRPOConfig(entropy_coef_delta=-1.0)


PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def digit_share(prompts, completions, **kw):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "run"), max_steps=2, num_generations=4, per_device_train_batch_size=8,
                max_completion_length=8, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                log_completions_steps=0, log_groups_steps=0, seed=0)
    return GRPOConfig(**{**base, **kw})


def _step(tiny_dir, tmp_path, **kw):
    from aha.train.grpo import GRPOTrainer
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=_args(tmp_path, **kw), train_dataset=PROMPTS)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    return t, t.step(), before


def test_the_bonus_moves_the_weights_even_with_no_advantage(tiny_dir, tmp_path):
    """A constant reward gives every advantage 0: without a bonus nothing trains; with one every token does, and the
    weights move toward more entropy."""
    def constant(prompts, completions, **kw):
        return [1.0] * len(completions)
    from aha.train.grpo import GRPOTrainer
    for coef, moved in ((0.0, False), (0.5, True)):
        t = GRPOTrainer(model=tiny_dir, reward_funcs=[constant], train_dataset=PROMPTS,
                        args=_args(tmp_path / str(coef), entropy_coef=coef, max_grad_norm=0.0))
        before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
        m = t.step()
        changed = any(not torch.equal(before[n], p) for n, p in t.model.named_parameters())
        assert changed == moved, coef
        if coef:
            # loss = 0 - coef x H: H is the logged mean entropy of the tokens the policy loss uses
            assert m["loss"] == pytest.approx(-coef * m["entropy/policy_tokens"], rel=1e-5)
            assert m["entropy/policy_tokens"] == pytest.approx(m["entropy"], rel=1e-5)  # every token kept
            assert m["entropy_coef"] == m["entropy/applied_coef"] == coef


def test_adaptive_control_applies_the_previous_steps_coefficient_logs_it_and_resumes(tiny_dir, tmp_path):
    from aha.metrics import read_metrics
    from aha.train.grpo import GRPOTrainer
    kw = dict(use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.03, entropy_target=100.0,
              save_steps=1, max_steps=2)  # a target far above any entropy: the coefficient rises every step
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS, args=_args(tmp_path, **kw))
    t.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["entropy/applied_coef"] for r in rows] == pytest.approx([0.0, 0.13])  # step 1: nothing measured yet
    assert [r["entropy_coef"] for r in rows] == pytest.approx([0.13, 0.16])
    assert t.learner.entropy_coef == pytest.approx(0.16)
    t2 = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                     args=_args(tmp_path, **{**kw, "max_steps": 3, "resume": True}))
    t2.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert rows[-1]["entropy/applied_coef"] == pytest.approx(0.16)  # the checkpoint's coefficient, not the start's
    assert rows[-1]["entropy_coef"] == pytest.approx(0.19)


def test_default_runs_have_no_entropy_term(tiny_dir, tmp_path):
    t, m, _ = _step(tiny_dir, tmp_path)
    assert not t.learner.entropy_on and "entropy_coef" not in m
