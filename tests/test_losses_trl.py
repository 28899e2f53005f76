"""TRL's loss types as aha's (surrogate, aggregation) pairs: each surrogate's per-token weight on grad log pi by hand,
the new aggregations by hand, the table against TRL's, and a few steps of each on a tiny model."""

import math

import pytest
import torch

from aha import algos
from aha.config import ConfigError, GRPOConfig

# One known batch: two sequences of three tokens, the old policy at p = 0.5 on each, the policy at 0.5, 0.75, 0.25
# (ratios 1, 1.5, 0.5); sequence 0 has A = +1, sequence 1 has A = -1.
RATIOS = [1.0, 1.5, 0.5]
OLD = torch.full((2, 3), math.log(0.5))
ADV = torch.tensor([1.0, -1.0])
MASK = torch.ones(2, 3)


def weights(surrogate, **kw):
    """Per-token loss, d loss / d log pi (the weight each token's grad log pi gets) and the clip indicators."""
    logp = (OLD + torch.log(torch.tensor([RATIOS, RATIOS]))).requires_grad_(True)
    loss, stats = algos.policy_loss(logp, OLD, ADV, MASK, surrogate=surrogate, **kw)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return loss.detach(), grad, stats


def close(a, b, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32),
                               atol=tol, rtol=0)


def test_clip_weights_by_hand():
    loss, w, stats = weights("clip", epsilon=0.2)
    # A=+1: -min(r, clip(r, .8, 1.2)) -> r=1: -1 (weight -r = -1); r=1.5: -1.2 clipped (weight 0); r=.5: -.5 (-.5)
    # A=-1: max(r, clip(r)) -> r=1: 1 (weight +1); r=1.5: 1.5 (weight +1.5); r=.5: .8 clipped (weight 0)
    close(loss, [[-1, -1.2, -0.5], [1, 1.5, 0.8]])
    close(w, [[-1, 0, -0.5], [1, 1.5, 0]])
    close(stats["clip/high"], [[0, 1, 0], [0, 0, 0]])
    close(stats["clip/low"], [[0, 0, 0], [0, 0, 1]])


def test_cispo_weights_by_hand():
    loss, w, stats = weights("cispo", epsilon_high=1.2)
    # weight -A min(r, 1.2), never 0: A=+1 -> [-1, -1.2, -.5]; A=-1 -> [1, 1.2, .5]
    close(w, [[-1, -1.2, -0.5], [1, 1.2, 0.5]])
    # loss -sg(w) A log pi: token (0,0) -1 x 1 x log .5 = .6931; token (1,1) 1.2 x log .75 = -.3452
    close(loss[0, 0], math.log(2))
    close(loss[1, 1], 1.2 * math.log(0.75))
    close(stats["clip/high"], [[0, 1, 0], [0, 0, 0]])             # r 1.5 > 1.2 where A > 0
    close(stats["clip/low"], [[0, 0, 0], [0, 0, 0]])


def test_sapo_weights_by_hand():
    loss, w, _ = weights("sapo", sapo_temperature_pos=1.0, sapo_temperature_neg=1.05)

    def weight(r, a, tau):  # d/d log pi of -(4/tau) sigmoid(tau (r - 1)) a = -a r 4 s (1 - s)
        s = 1 / (1 + math.exp(-tau * (r - 1)))
        return -a * r * 4 * s * (1 - s)

    close(w, [[weight(r, 1, 1.0) for r in RATIOS], [weight(r, -1, 1.05) for r in RATIOS]])
    close(w[0, 0], -1.0)                                         # r = 1: exactly the plain policy gradient
    close(w[0, 1], -1.5 * 4 * 0.6224593 * 0.3775407)             # sigmoid(.5) = .6224593
    close(loss[0, 0], -2.0)                                      # -(4/1) x .5 x 1
    close(loss[1, 0], 4 / 1.05 * 0.5)


def test_vespo_weights_by_hand():
    loss, w, _ = weights("vespo")
    # log w = log 1 + log 1.5 + log .5 = log .75 for both sequences.
    # A=+1 (k 2, lambda 3): phi = exp(3 + 2 log .75 - 3 x .75) = e^.75 x .5625 = 1.19081 -> weight -1.19081 each token
    # A=-1 (k 3, lambda 2): phi = exp(2 + 3 log .75 - 2 x .75) = e^.5 x .421875 = .69557 -> weight +.69557 each token
    phi_pos, phi_neg = math.exp(0.75) * 0.5625, math.exp(0.5) * 0.421875
    close(w, [[-phi_pos] * 3, [phi_neg] * 3])
    close(loss[0], [-phi_pos * math.log(p) for p in (0.5, 0.75, 0.25)])


def test_vespo_weight_is_one_on_policy_and_ignores_masked_tokens():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    old = torch.tensor([[-1.0, -2.0, 5.0]])                      # only the masked token differs
    loss, _ = algos.policy_loss(logp, old, torch.tensor([2.0]), mask, surrogate="vespo")
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    close(grad, [[-2.0, -2.0, -2.0]])                            # phi(1) = 1: weight -A on every token


def test_clip_surrogate_is_the_previous_policy_loss():
    """loss_type dapo/grpo/dr_grpo keep the formula they had: the registry's clip is the default surrogate."""
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    adv, mask = torch.randn(3, generator=g), torch.ones(3, 4)
    a, _ = algos.policy_loss(logp, old, adv, mask, 0.2, 0.28, "token", 3.0)
    b, _ = algos.policy_loss(logp, old, adv, mask, 0.2, 0.28, "token", 3.0, surrogate="clip")
    r = torch.exp(logp - old)
    expect = -torch.min(r.clamp(max=3.0) * adv[:, None], r.clamp(0.8, 1.28) * adv[:, None])
    assert torch.equal(a, b) and torch.allclose(a, expect)


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
LMASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_bnpo_and_luspo_aggregations_by_hand():
    # bnpo on one process: the token mean, (1+2+3+4)/4 = 2.5, as dapo
    close(algos.aggregate("bnpo", LOSS, LMASK), 2.5)
    # bnpo on rank r of 2, whose share of the minibatch has these 4 of its 10 tokens: sum / (local 4 x 2 ranks)
    close(algos.aggregate("bnpo", LOSS, LMASK, num_tokens=10, local_tokens=4, world=2), 10 / 8)
    # dapo on the same rank divides by the minibatch's 10 tokens
    close(algos.aggregate("dapo", LOSS, LMASK, num_tokens=10, local_tokens=4, world=2), 1.0)
    # luspo: each sequence's token sum, mean over sequences: (6 + 4) / 2 = 5 (= dr_grpo 10/(2x3) x max_len 3)
    close(algos.aggregate("luspo", LOSS, LMASK), 5.0)
    close(algos.aggregate("luspo", LOSS, LMASK, max_len=3), 3 * algos.aggregate("dr_grpo", LOSS, LMASK, max_len=3))


def test_luspo_with_sequence_ratios_is_length_times_the_sequence_loss():
    """TRL's luspo at importance_sampling_level=sequence: mean over sequences of L_i x |y_i|."""
    logp, old = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]]), torch.tensor([[-1.1, -2.1, 0.0], [-0.9, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, _ = algos.policy_loss(logp, old, torch.tensor([1.0, -1.0]), mask, 0.2, 0.2, "sequence")
    # sequence 0: r = e^0.1 = 1.105 (unclipped, A=+1) -> -1.105 x 2 tokens; sequence 1: r = e^-0.1 = .905, A=-1 ->
    # max(.905, .905) = .905 x 1 token; (-2.2103 + .9048) / 2 = -.6527
    close(algos.aggregate("luspo", loss, mask), (-2 * math.exp(0.1) + math.exp(-0.1)) / 2)


TRL_LOSS_TYPES = {  # trl/trainer/grpo_trainer.py: the per-token loss and the normalisation of each loss_type
    "grpo": ("clip", "grpo"), "dapo": ("clip", "dapo"), "dr_grpo": ("clip", "dr_grpo"), "bnpo": ("clip", "bnpo"),
    "luspo": ("clip", "luspo"), "cispo": ("cispo", "dapo"), "sapo": ("sapo", "grpo"), "vespo": ("vespo", "dapo")}


def test_every_trl_loss_type_names_a_surrogate_and_an_aggregation():
    assert {k: tuple(v) for k, v in algos.LOSS_TYPES.items()} == TRL_LOSS_TYPES
    for surrogate, aggregation in algos.LOSS_TYPES.values():
        assert surrogate in algos.SURROGATES and aggregation in algos.AGGREGATIONS
    for fn in algos.SURROGATES.values():
        assert "Example" in fn.__doc__ and "loss" in fn.__doc__


@pytest.mark.parametrize("kw, msg", [
    (dict(loss_type="bnpo2"), r"loss_type: unknown loss_type 'bnpo2'; valid: \['bnpo', 'cispo'"),
    (dict(loss_type="cispo"), r"loss_type=cispo caps the importance weight at epsilon_high"),
    (dict(sapo_temperature_pos=0.0), r"sapo_temperature_pos must be > 0"),
    (dict(vespo_k_pos=math.inf), r"vespo_k_pos must be a finite number"),
])
def test_loss_settings_are_config_errors(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        GRPOConfig(**kw)


PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def digit_share(prompts, completions, **kw):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


@pytest.mark.parametrize("loss_type", sorted(TRL_LOSS_TYPES))
def test_three_steps_of_each_loss_type_log_finite_losses(tiny_dir, tmp_path, loss_type):
    from aha.metrics import read_metrics
    from aha.train.grpo import GRPOTrainer
    extra = {"cispo": dict(epsilon_high=5.0), "luspo": dict(importance_sampling_level="sequence")}.get(loss_type, {})
    args = GRPOConfig(output_dir=str(tmp_path / "run"), max_steps=3, num_generations=4, per_device_train_batch_size=4,
                      generation_batch_size=8, num_iterations=2, max_completion_length=8, learning_rate=1e-2,
                      progress_bar=False, report_to=["jsonl"], log_completions_steps=0, log_groups_steps=0, seed=0,
                      loss_type=loss_type, **extra)
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args, train_dataset=PROMPTS)
    t.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 3 and all(r["loss"] is not None and math.isfinite(r["loss"]) for r in rows)
    assert any(r["loss"] != 0 for r in rows)                     # two passes over each batch: ratios move off 1


def test_bnpo_local_batches_partition_the_minibatch_over_ranks():
    """With two learners, each rank's local batch is its share of the trained sequences and of those skipped for a
    zero advantage: the local token counts add up to the minibatch's, and bnpo's loss is the mean of the ranks'
    token means."""
    from types import SimpleNamespace

    from aha.train.learner import Learner
    n_tok = torch.tensor([1, 2, 3, 4, 5, 6])
    trainable = torch.tensor([True, False, True, True, False, True])
    batch = SimpleNamespace(group_size=2)
    locals_ = []
    for rank in (0, 1):
        stub = SimpleNamespace(world=2, rank=rank, passes=SimpleNamespace(share=False),
                               args=SimpleNamespace(max_completion_length=8))
        stub._part = lambda every, G, r, stub=stub: Learner._part(stub, every, G, r)
        denom, every = Learner._denominators(stub, batch, torch.arange(6), n_tok, trainable, lambda i: (i,))
        assert every == [0, 2, 3, 5] and denom["num_tokens"] == 21 and denom["world"] == 2
        locals_.append(denom["local_tokens"])
    # rank 0: trained [0, 3] and skipped [1] -> 1 + 4 + 2 = 7; rank 1: trained [2, 5], skipped [4] -> 3 + 6 + 5 = 14
    assert locals_ == [7, 14]
    loss, mask = torch.ones(1, 3), torch.ones(1, 3)
    halves = [algos.aggregate("bnpo", loss, mask, num_tokens=21, local_tokens=n, world=2) for n in locals_]
    close(halves[0], 3 / (7 * 2))
    close(halves[1], 3 / (14 * 2))


def test_importance_ratio_by_hand():
    logp, old = torch.tensor([[0.2, 0.4, 9.0]]), torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    close(algos.importance_ratio(logp, old, mask), [[math.exp(0.2), math.exp(0.4), math.exp(9.0)]], tol=1e-2)
    close(algos.importance_ratio(logp, old, mask, "sequence"), [[math.exp(0.3)] * 3])   # mean of 0.2 and 0.4


def test_bias_corrected_kl_keeps_the_value_on_a_first_pass_and_adds_the_ratios_gradient(tiny_dir, tmp_path):
    """TRL's use_bias_correction_kl: KL x pi/pi_old. On a batch's only pass the ratio is 1 (same loss and KL), but
    its gradient, KL x grad log pi, changes the update."""
    from aha.train.grpo import GRPOTrainer
    out = {}
    for on in (False, True):
        args = GRPOConfig(output_dir=str(tmp_path / str(on)), max_steps=1, num_generations=4,
                          per_device_train_batch_size=8, max_completion_length=8, learning_rate=1e-2, beta=0.5,
                          progress_bar=False, report_to=["none"], log_completions_steps=0, log_groups_steps=0, seed=0,
                          use_bias_correction_kl=on)
        t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args, train_dataset=PROMPTS)
        t.learner.sync_reference = lambda: None
        with torch.no_grad():  # a reference apart from the policy: a KL that is not 0
            for p in t.ref_model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        out[on] = t.step()
    assert out[True]["kl"] == out[False]["kl"] > 0 and out[True]["loss"] == out[False]["loss"]
    assert out[True]["grad_norm"] != out[False]["grad_norm"]
