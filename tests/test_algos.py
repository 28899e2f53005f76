"""The maths of aha.algos on tiny tensors, expected values worked out by hand in the comments."""

import math
import statistics

import pytest
import torch

from aha import algos

ATOL = 1e-6
nan = float("nan")


def adv(name, rewards, G):
    """Advantages [N] through the one public entry point."""
    return algos.compute_advantages(name, rewards, G)[0]


def close(a, b, atol=ATOL):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32),
                               atol=atol, rtol=0)


# ------------------------------------------------------------------ advantages
def test_grpo_advantages_by_hand():
    # group 1: [1,0,0,1], mean 0.5, unbiased std sqrt(4*0.25/3) = 0.577350 -> +-0.5/(0.577350+1e-4)
    # group 2: [2,2,2,2], std 0 -> all zero (no signal)
    a_ = adv("grpo", torch.tensor([1.0, 0, 0, 1, 2, 2, 2, 2]), 4)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # 0.865876
    close(a_, [a, -a, -a, a, 0, 0, 0, 0])


def test_dr_grpo_advantages_by_hand():
    # no std division: r - mean = [0.5, -0.5, -0.5, 0.5]
    close(adv("dr_grpo", torch.tensor([1.0, 0, 0, 1]), 4), [0.5, -0.5, -0.5, 0.5])


def test_rloo_advantages_by_hand():
    # r_i - mean(others): 1 - (0+0+1)/3 = 2/3 ; 0 - (1+0+1)/3 = -2/3
    close(adv("rloo", torch.tensor([1.0, 0, 0, 1]), 4), [2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_batch_advantages_by_hand():
    # groups [1,0] and [3,3]: centred [0.5,-0.5,0,0]; batch std (n-1) = sqrt(0.5/3) = 0.408248
    a_ = adv("batch", torch.tensor([1.0, 0, 3, 3]), 2)
    a = 0.5 / (math.sqrt(0.5 / 3) + 1e-4)  # 1.224445
    close(a_, [a, -a, 0, 0])


def test_batch_reward_std_advantages_by_hand():
    # TRL's scale_rewards="batch": groups [0,1] and [10,11], centred [-0.5,0.5,-0.5,0.5]; the std of the rewards
    # themselves: mean 5.5, squares 30.25+20.25+20.25+30.25 = 101, /3 -> sqrt(33.667) = 5.802298
    a = 0.5 / (math.sqrt(101 / 3) + 1e-4)  # 0.086172
    close(adv("batch_rewards", torch.tensor([0.0, 1, 10, 11]), 2), [-a, a, -a, a])


@pytest.mark.parametrize("name", ["batch", "batch_rewards"])
def test_a_group_left_out_does_not_move_the_batch_std(name):
    # [1, NaN] has one valid reward, so it is not trained on: the other group's advantages are those of a batch
    # without it (its 1 must not join the batch std)
    alone = adv(name, torch.tensor([nan, nan, 0.0, 1]), 2)
    with_lone = adv(name, torch.tensor([1.0, nan, 0.0, 1]), 2)
    close(with_lone, alone)
    a = 0.5 / (math.sqrt(0.5) + 1e-4)  # [0,1] alone: centred +-0.5, either std sqrt(0.5 / 1) -> 0.707007
    close(alone, [0, 0, -a, a])


def test_excluded_rewards_leave_group_statistics():
    # [1, NaN, 0, 1]: valid 3, mean 2/3, deviations 1/3,-2/3,1/3 -> var (6/9)/2 = 1/3, std 0.577350
    a_ = adv("grpo", torch.tensor([1.0, nan, 0, 1]), 4)
    s = math.sqrt(1 / 3) + 1e-4
    close(a_, [(1 / 3) / s, 0.0, (-2 / 3) / s, (1 / 3) / s])
    # a group with a single valid reward has no baseline: all zero, and no NaN leaks out
    for name in algos.ADVANTAGES:
        out = adv(name, torch.tensor([nan, nan, 1.0, nan]), 4)
        close(out, [0, 0, 0, 0])


def test_advantages_match_a_python_loop():
    g = torch.Generator().manual_seed(0)
    r = torch.randint(0, 4, (6 * 5,), generator=g).float()
    G = 5
    expect_grpo, expect_rloo = [], []
    for b in range(6):
        grp = r[b * G:(b + 1) * G].tolist()
        mu, sd = statistics.mean(grp), statistics.stdev(grp)
        expect_grpo += [(x - mu) / (sd + algos.ADV_EPS) if len(set(grp)) > 1 else 0.0 for x in grp]
        expect_rloo += [x - (sum(grp) - x) / (G - 1) for x in grp]
    close(adv("grpo", r, G), expect_grpo, atol=1e-5)
    close(adv("rloo", r, G), expect_rloo, atol=1e-5)


def test_compute_advantages_metrics():
    # groups [1,1] (std 0) and [0,1] (std 0.7071): half the groups carry no signal
    adv, m = algos.compute_advantages("grpo", torch.tensor([1.0, 1, 0, 1]), 2)
    assert m["reward/zero_std_frac"] == 0.5
    close(m["reward/group_std_mean"], math.sqrt(0.5) / 2)
    assert adv.shape == (4,)


@pytest.mark.parametrize("name", sorted(algos.ADVANTAGES))
def test_a_group_of_equal_rewards_gets_exactly_zero_advantage(name):
    # [1.6]*8 in float32: the mean is 1.6000001 (1.6 is not exact), so r - mean = -1.19e-7 and the unbiased std
    # is 1.27e-7; (r - mean) / (std + 1e-4) = -0.0012 on every member, a push down on a solved group.
    r = torch.tensor([1.6] * 8 + [1.0, 0.0] * 4)                       # [N=16], B=2, G=8
    adv, m = algos.compute_advantages(name, r, 8)
    assert torch.equal(adv[:8], torch.zeros(8))                       # exactly 0, not ~1e-3
    assert adv[8:].max() - adv[8:].min() > 0.1                        # the other group keeps its signal (gdpo's
    # baseline is the batch mean, which the equal group moves: its members differ by the same amount all the same)
    assert m["reward/zero_std_frac"] == 0.5                           # the equal group is counted
    assert algos.group_stats(r, 8).std[0, 0] == 0


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'grpoo'.*'dr_grpo'.*'rloo'"):
        algos.compute_advantages("grpoo", torch.zeros(4), 2)
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k4'.*'k1', 'k2', 'k3'"):
        algos.kl_penalty("k4", torch.zeros(1, 1), torch.zeros(1, 1))
    with pytest.raises(ValueError, match=r"unknown loss aggregation 'ppo'.*'bnpo'.*'dapo'"):
        algos.aggregate("ppo", torch.zeros(1, 1), torch.ones(1, 1))


def test_shape_asserts():
    with pytest.raises(AssertionError):
        adv("grpo", torch.zeros(5), 2)  # 5 rewards cannot form groups of 2


# ------------------------------------------------------------------ policy loss
def _loss(log_ratio, adv, **kw):
    lr = torch.tensor([log_ratio])
    return algos.policy_loss(lr, torch.zeros_like(lr), torch.tensor(adv), torch.ones_like(lr), **kw)


def test_ratio_one_gives_minus_advantage():
    loss, clip = _loss([0.0, 0.0], [2.0])
    close(loss, [[-2.0, -2.0]])
    assert clip["clip/low"].sum() == 0 and clip["clip/high"].sum() == 0


def test_clipping_by_hand():
    # ratio 1.5, A=+1, eps .2: -min(1.5, 1.2) = -1.2, clipped high
    loss, clip = _loss([math.log(1.5)], [1.0])
    close(loss, [[-1.2]])
    assert clip["clip/high"].item() == 1 and clip["clip/low"].item() == 0
    # ratio 0.5, A=-1: -min(-0.5, -0.8) = 0.8, clipped low
    loss, clip = _loss([math.log(0.5)], [-1.0])
    close(loss, [[0.8]])
    assert clip["clip/low"].item() == 1 and clip["clip/high"].item() == 0
    # ratio 0.5, A=+1: -min(0.5, 0.8) = -0.5, the unclipped term wins: not a clip event
    loss, clip = _loss([math.log(0.5)], [1.0])
    close(loss, [[-0.5]])
    assert clip["clip/low"].item() == 0


def test_clip_higher_and_delta():
    # epsilon_high .28: ratio 1.5, A=+1 -> -1.28
    close(_loss([math.log(1.5)], [1.0], epsilon_high=0.28)[0], [[-1.28]])
    # ratio 1.5, A=-1: plain -min(-1.5,-1.2) = 1.5; with delta 1.3 the ratio is capped: 1.3
    close(_loss([math.log(1.5)], [-1.0])[0], [[1.5]])
    close(_loss([math.log(1.5)], [-1.0], delta=1.3)[0], [[1.3]])


def test_sequence_level_ratio_is_geometric_mean():
    # token log ratios [log 2, 0] -> sequence ratio exp(log2/2) = sqrt 2 = 1.414214
    # A=-1, clip [0.5, 1.5]: -min(-1.414214, -1.414214) = 1.414214 on both tokens
    loss, _ = _loss([math.log(2.0), 0.0], [-1.0], epsilon=0.5, level="sequence")
    close(loss, [[math.sqrt(2), math.sqrt(2)]])
    # masked second token: mean over the first only -> ratio 2, clipped at 1.2 for A=+1
    lr = torch.tensor([[math.log(2.0), 5.0]])
    loss, _ = algos.policy_loss(lr, torch.zeros_like(lr), torch.tensor([1.0]), torch.tensor([[1.0, 0.0]]),
                                level="sequence")
    close(loss[0, 0], -1.2)


def test_policy_gradients_token_vs_sequence():
    # unclipped, A=1, old=logp: token loss -ratio_t, per-sequence mean over 2 tokens -> d/dlogp_t = -1/2
    # sequence level: -exp(mean log ratio) -> d/dlogp_t = -ratio/2 = -1/2 at ratio 1 as well
    for level in ("token", "sequence"):
        logp = torch.zeros(1, 2, requires_grad=True)
        loss, _ = algos.policy_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 2), level=level)
        algos.aggregate("grpo", loss, torch.ones(1, 2)).backward()
        close(logp.grad, [[-0.5, -0.5]])


def test_log_ratio_is_clamped_before_exp():
    loss, _ = _loss([500.0], [-1.0])  # exp(500) would be inf; clamped at e^20
    assert torch.isfinite(loss).all()
    torch.testing.assert_close(loss, torch.tensor([[math.exp(algos.LOG_RATIO_CLAMP)]]), rtol=1e-6, atol=0)


# ------------------------------------------------------------------ KL
def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([[0.0]]), torch.tensor([[math.log(0.5)]])
    close(algos.kl_penalty("k1", logp, ref), [[0.693147]])          # log(1/0.5)
    close(algos.kl_penalty("k2", logp, ref), [[0.240227]])          # 0.5 * 0.693147^2
    close(algos.kl_penalty("k3", logp, ref), [[0.193147]])          # 0.5 - 1 + 0.693147


def test_k3_is_stable_and_nonnegative():
    logp = torch.tensor([[0.0, 0.0, -100.0, 0.0]])
    ref = torch.tensor([[1e-9, -1e-9, 0.0, -100.0]])
    k3 = algos.kl_penalty("k3", logp, ref)
    assert torch.isfinite(k3).all() and (k3 >= 0).all()
    close(k3[0, :2], [0.0, 0.0])                                     # x^2/2 ~ 5e-19
    # clamped at x = 20 (float32 spacing there is 32, so compare relatively)
    torch.testing.assert_close(k3[0, 2], torch.tensor(math.expm1(20.0) - 20.0), rtol=1e-6, atol=0)


# ------------------------------------------------------------------ aggregation
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_aggregation_by_hand():
    close(algos.aggregate("grpo", LOSS, MASK), 3.0)                  # mean(2, 4)
    close(algos.aggregate("dapo", LOSS, MASK), 2.5)                  # (1+2+3+4)/4
    close(algos.aggregate("dr_grpo", LOSS, MASK, max_len=4), 1.25)   # 10/(2*4)


def test_aggregation_of_an_empty_mask_is_zero_not_nan():
    for name in algos.AGGREGATIONS:
        close(algos.aggregate(name, LOSS, torch.zeros_like(MASK)), 0.0)


def test_micro_batches_add_up_to_the_full_batch():
    g = torch.Generator().manual_seed(1)
    loss = torch.randn(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    totals = dict(num_sequences=6, num_tokens=int(mask.sum()), max_len=5)
    for name in algos.AGGREGATIONS:
        full = algos.aggregate(name, loss, mask, **totals)
        parts = sum(algos.aggregate(name, loss[i:i + 2], mask[i:i + 2], **totals) for i in range(0, 6, 2))
        close(parts, full, atol=1e-6)


def test_high_entropy_mask_by_hand():
    # masked tokens [1, 2, 3, 4] (the 9 is padding): keep 0.5 -> 50% quantile 2.5 -> tokens 3 and 4
    ent = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    close(algos.high_entropy_mask(ent, mask, 0.5), [[0, 0, 0], [1, 1, 0]])
    close(algos.high_entropy_mask(ent, mask, 0.0), [[0, 0, 0], [0, 1, 0]])   # only the highest
    close(algos.high_entropy_mask(ent, mask, 1.0), mask.float())              # every token


def test_behaviour_weights_hand_computed():
    """w = min(pi_prox / mu, cap) on stale tokens, exactly 1 elsewhere; the cap is reported where it bit."""
    prox = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.5, 0.5, 0.5]]))
    behav = torch.log(torch.tensor([[0.25, 0.4, 0.3], [0.1, 0.1, 0.1]]))
    stale = torch.tensor([[True, True, True], [False, False, False]])
    w, capped = algos.behaviour_weights(prox, behav, stale, high=2.5)
    # row 0: 0.5/0.25 = 2.0; 0.2/0.4 = 0.5; 0.9/0.3 = 3.0 -> capped at 2.5. Row 1 was sampled by the current weights.
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 2.5], [1.0, 1.0, 1.0]]), rtol=0, atol=1e-6)
    assert capped.tolist() == [[False, False, True], [False, False, False]]
    assert not w.requires_grad
