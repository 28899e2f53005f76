"""The maths of GRPO and its variants, as pure functions over tensors.

Shape letters: B prompts, G completions per prompt, N = B*G sequences, T completion tokens.
Every variant is a registry entry; an unknown name raises an error listing the valid ones.
Nothing here knows about models, configs or I/O.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
from torch import Tensor

ADV_EPS = 1e-4
"""Added to the std before dividing rewards by it, so a near-constant group cannot blow up."""
LOG_RATIO_CLAMP = 20.0
"""|log ratio| cap before `exp`: e^20 ~ 5e8 is already far outside any clip range."""


def _registry(kind: str):
    table: dict[str, Callable] = {}

    def register(name: str):
        def wrap(fn):
            table[name] = fn
            return fn
        return wrap

    def get(name: str) -> Callable:
        if name not in table:
            raise ValueError(f"unknown {kind} '{name}'; valid: {sorted(table)}")
        return table[name]

    return table, register, get


ADVANTAGES, _register_adv, get_advantage = _registry("advantage estimator")
KL_ESTIMATORS, _register_kl, get_kl = _registry("KL estimator")
AGGREGATIONS, _register_agg, get_aggregation = _registry("loss aggregation")
RATIOS, _register_ratio, get_ratio = _registry("importance_sampling_level")


# ---------------------------------------------------------------- advantages
class GroupStats(NamedTuple):
    """Rewards of each group with the statistics every estimator reads, computed once per batch.

    NaN marks a reward that could not be computed: it is left out of its group's statistics.
    """

    r: Tensor      # [B,G] rewards, NaN -> 0
    valid: Tensor  # [B,G] finite rewards
    count: Tensor  # [B,1] valid rewards per group
    mean: Tensor   # [B,1] mean of the valid rewards
    std: Tensor    # [B,1] unbiased (n-1) std of the valid rewards, as torch.std and TRL use; exactly 0 when equal
    equal: Tensor  # [B,1] every valid reward of the group is the same value (no signal: advantage exactly 0)


def group_stats(rewards: Tensor, group_size: int) -> GroupStats:
    """GroupStats for rewards [N] laid out prompt-major (rows i*G .. i*G+G-1 share a prompt)."""
    assert rewards.dim() == 1 and rewards.numel() % group_size == 0, (rewards.shape, group_size)
    r = rewards.view(-1, group_size)                                  # [B,G]
    valid = torch.isfinite(r)                                         # [B,G]
    r = torch.where(valid, r, torch.zeros_like(r))                    # [B,G]
    count = valid.sum(-1, keepdim=True)                               # [B,1]
    mean = r.sum(-1, keepdim=True) / count.clamp(min=1)               # [B,1]
    sq = ((r - mean) ** 2 * valid).sum(-1, keepdim=True)              # [B,1]
    std = (sq / (count - 1).clamp(min=1)).sqrt()                      # [B,1]
    # Equal values are compared, not their float std: [1.6]*8 has a float32 mean != 1.6, std 1.3e-7.
    hi = torch.where(valid, r, torch.full_like(r, -torch.inf)).amax(-1, keepdim=True)  # [B,1]
    lo = torch.where(valid, r, torch.full_like(r, torch.inf)).amin(-1, keepdim=True)   # [B,1]
    equal = (hi == lo) | (count < 2)                                  # [B,1]
    std = torch.where(equal, torch.zeros_like(std), std)              # [B,1]
    return GroupStats(r, valid, count, mean, std, equal)


def top_std_groups(rewards: Tensor, group_size: int, keep: float) -> Tensor:
    """RAGEN's rollout filter (arXiv 2504.20073): the indices, in batch order, of the ceil(keep * B) groups whose
    rewards [N] spread most (group_stats' std: 0 for a group whose valid rewards are equal or fewer than two), ties
    kept in batch order.
    Example, G=2: rewards [1, 0, 1, 1, 0, 0.5], keep 0.5 -> std [0.707, 0, 0.354] -> 2 groups: [0, 2]."""
    std = group_stats(rewards, group_size).std.squeeze(-1)            # [B]
    k = math.ceil(keep * std.numel())
    order = torch.argsort(-std, stable=True)                          # [B] largest spread first
    return order[:k].sort().values                                    # [k]


@_register_adv("grpo")
def grpo_advantages(g: GroupStats, eps: float) -> Tensor:
    """(r - group mean) / (group std + eps), as in DeepSeekMath."""
    return (g.r - g.mean) / (g.std + eps)                             # [B,G]


@_register_adv("dr_grpo")
def dr_grpo_advantages(g: GroupStats, eps: float) -> Tensor:
    """r - group mean, no std division (Dr. GRPO: the std term biases toward easy/hard prompts)."""
    return g.r - g.mean                                               # [B,G]


@_register_adv("batch")
def batch_advantages(g: GroupStats, eps: float) -> Tensor:
    """(r - group mean) / (batch std + eps): REINFORCE++-style normalisation over the whole batch, the std of
    the centred rewards that are trained on (a group with fewer than two valid rewards is not)."""
    used = g.valid & (g.count >= 2)                                   # [B,G]
    centred = (g.r - g.mean) * used                                   # [B,G]
    n = used.sum().clamp(min=2)
    batch_std = ((centred - centred.sum() / n) ** 2 * used).sum().div(n - 1).sqrt()
    return centred / (batch_std + eps)                                # [B,G]


@_register_adv("batch_rewards")
def batch_reward_advantages(g: GroupStats, eps: float) -> Tensor:
    """(r - group mean) / (std of the batch's rewards + eps): TRL's scale_rewards="batch" (the std of the raw
    rewards, not of the centred ones), over the rewards that are trained on."""
    _, batch_std = _batch_moments(g.r, g.valid & (g.count >= 2))
    return (g.r - g.mean) / (batch_std + eps)                         # [B,G]


def _batch_moments(r: Tensor, used: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and unbiased std of the rewards `used` [B,G] of a batch (their count clamped to 2: with fewer, no group
    has two valid rewards, and every advantage is 0 anyway)."""
    n = used.sum().clamp(min=2)
    mean = (r * used).sum() / n
    return mean, ((r - mean) ** 2 * used).sum().div(n - 1).sqrt()


@_register_adv("gdpo")
def gdpo_batch_advantages(g: GroupStats, eps: float) -> Tensor:
    """(r - batch mean) / (batch std + eps) over every valid reward of the batch: GDPO's normalisation of the summed
    group-normalised rewards (multi_objective_aggregation=normalize_then_sum selects it, as TRL's). Those sums have
    group means of 0, so a group whose sums are equal has them at 0 and loses nothing to aha's rule that such a
    group gets advantage 0. Example: rewards [1, -1, 0.5, -0.5] -> mean 0, std 0.9129 -> [1.095, -1.095, 0.548, -0.548]."""
    mean, std = _batch_moments(g.r, g.valid)
    return (g.r - mean) / (std + eps)                                 # [B,G]


@_register_adv("rloo")
def rloo_advantages(g: GroupStats, eps: float) -> Tensor:
    """r_i - mean of the other valid rewards of the group (leave-one-out baseline)."""
    others = (g.r.sum(-1, keepdim=True) - g.r) / (g.count - 1).clamp(min=1)  # [B,G]
    return g.r - others                                               # [B,G]


@_register_adv("grpo_process")
def grpo_process_advantages(g: GroupStats, eps: float) -> Tensor:
    """Process supervision (DeepSeekMath) where each completion has one step, its outcome reward, at its last
    token: exactly grpo. With step rewards the trainer calls `process_advantages` instead."""
    return grpo_advantages(g, eps)                                    # [B,G]


OBJECTIVES, _register_objectives, get_objectives = _registry("multi_objective_aggregation")


@_register_objectives("sum_then_normalize")
def sum_then_normalize(rewards_per_func: Tensor, group_size: int, eps: float = ADV_EPS) -> Tensor:
    """TRL's default: each function's rewards [N,F] as they are; the advantage estimator normalises their weighted
    sum."""
    return rewards_per_func


@_register_objectives("normalize_then_sum")
def normalize_then_sum(rewards_per_func: Tensor, group_size: int, eps: float = ADV_EPS) -> Tensor:
    """GDPO (arXiv 2601.05242), TRL's normalize_then_sum: each function's rewards [N,F] normalised within each group
    over its valid values, (r - mean) / (std + eps) as grpo (exactly 0 where they are all equal; NaN, left out of the
    weighted sum, where fewer than two). Their weighted sum then goes to the gdpo estimator (batch normalisation), so
    a function with a large scale or spread no longer drowns the others.
    Example, G=2: function 1 [1, 0], function 2 [5, 5] -> [[0.707, 0], [-0.707, 0]]."""
    N, F = rewards_per_func.shape
    g = group_stats(rewards_per_func.T.reshape(-1), group_size)          # [F*B,G] each function's groups
    z = torch.where(g.equal, torch.zeros_like(g.r), grpo_advantages(g, eps))
    z = torch.where(g.valid & (g.count >= 2), z, torch.full_like(z, float("nan")))
    return z.reshape(F, N).T                                          # [N,F]


def is_process(name: str) -> bool:
    """Whether advantage estimator `name` gives each token its own advantage from step rewards."""
    return get_advantage(name) is grpo_process_advantages


def process_advantages(outcome: Tensor, last: Tensor, seq: Tensor, token: Tensor, score: Tensor, length: int,
                       group_size: int, eps: float = ADV_EPS) -> tuple[Tensor, dict[str, float]]:
    """Token advantages [N,T] by process supervision (Shao et al. 2024, DeepSeekMath, section 4.1.3).

    A step j of completion i scores r(i,j) and ends at token index(i,j). Each group's steps form one pool R (its
    completions' step rewards, and each completion's outcome reward as one more step ending at its last token,
    index `last`), normalised together with the outcome estimator's conventions (group_stats: unbiased std,
    exactly 0 when every value is equal or fewer than two are valid; `eps` added to the std):
        r~(i,j) = (r(i,j) - mean(R)) / (std(R) + eps)
    and a token's advantage is the sum over the steps ending at or after it:
        A(i,t) = sum over j with index(i,j) >= t of r~(i,j).
    `outcome` [N] is NaN where a completion has no outcome reward; steps are given as S triples (`seq` [S] the
    completion, `token` [S] its end token, `score` [S] the reward, finite). Several steps ending on one token
    add up. With no step at all this is exactly grpo's advantage on every token up to the last (tested).

    Example, G=2: outcome [1, 0] at tokens [2, 1], one step of completion 0 scoring 1 at token 0. Pool
    {1, 0, 1}: mean 2/3, std 0.577 -> r~ = +0.577 (outcome 0), -1.155 (outcome 1), +0.577 (step):
    A(0) = [1.155, 0.577, 0.577], A(1) = [-1.155, -1.155, 0].
    """
    N = outcome.numel()
    S = seq.numel()
    assert outcome.shape == (N,) and last.shape == (N,) and N % group_size == 0, (outcome.shape, last.shape)
    assert token.shape == (S,) and score.shape == (S,), (seq.shape, token.shape, score.shape)
    B, G = N // group_size, group_size
    group = torch.div(seq, G, rounding_mode="floor")                  # [S]
    count = torch.bincount(group, minlength=B)                        # [B] steps per group
    order = torch.argsort(group, stable=True)                         # [S]
    rank = torch.empty_like(seq)                                      # [S] a step's place in its group's pool
    rank[order] = torch.arange(S) - (count.cumsum(0) - count)[group[order]]
    P = G + int(count.max()) if S else G                              # pool width: the outcomes, then the steps
    pool = torch.full((B, P), float("nan"), dtype=outcome.dtype)      # [B,P]
    pool[:, :G] = outcome.view(B, G)
    pool[group, G + rank] = score.to(outcome.dtype)
    g = group_stats(pool.reshape(-1), P)
    norm = torch.where(g.valid & ~g.equal, grpo_advantages(g, eps), torch.zeros_like(g.r))  # [B,P]
    dense = torch.zeros(N, length, dtype=outcome.dtype)               # [N,T] r~ placed on each step's end token
    has = torch.isfinite(outcome)                                     # [N]
    idx = torch.arange(N)[has]
    dense.index_put_((idx, last[has]), norm[:, :G].reshape(-1)[has], accumulate=True)
    dense.index_put_((seq, token), norm[group, G + rank], accumulate=True)
    adv = dense.flip(-1).cumsum(-1).flip(-1)                          # [N,T] sum over steps ending at or after t
    metrics = {"reward/zero_std_frac": g.equal.float().mean().item(), "reward/group_std_mean": g.std.mean().item()}
    return adv, metrics


@_register_adv("gigpo")
def gigpo_episode_advantages(g: GroupStats, eps: float) -> Tensor:
    """GiGPO's episode level (Feng et al. 2025, arXiv 2505.10978): grpo's advantage of each whole episode. On an
    agent's episodes the trainer adds the step level (`gigpo_advantages`); on anything else this is grpo."""
    return grpo_advantages(g, eps)                                    # [B,G]


def is_turn_level(name: str) -> bool:
    """Whether advantage estimator `name` credits an agent's turns one by one (gigpo)."""
    return get_advantage(name) is gigpo_episode_advantages


GIGPO_GAMMA = 0.95
"""GiGPO's discount of later turns' rewards in a turn's return (the paper's)."""
GIGPO_OMEGA = 1.0
"""GiGPO's weight of the step-level advantage beside the episode-level one (the paper's)."""


def gigpo_advantages(rewards: Tensor, turn_episode: Tensor, turn_reward: Tensor, anchor: Tensor, turn_start: Tensor,
                     turn_end: Tensor, length: int, group_size: int, gamma: float = GIGPO_GAMMA,
                     omega: float = GIGPO_OMEGA, eps: float = ADV_EPS) -> tuple[Tensor, dict[str, float]]:
    """Token advantages [N,T] by GiGPO (Feng et al. 2025, arXiv 2505.10978): each token of turn t of episode i gets
        A(i,t) = A_E(i) + omega * A_S(i,t)
    A_E: grpo's advantage of the episode's reward R(i) in its group (`rewards` [N], NaN: excluded, A_E 0).
    A_S: the turns of one group's episodes that act from one anchor state (`anchor` [S]: equal ids, one state) form
    a step group; a turn's return is its discounted reward-to-go within its episode,
        G(i,t) = sum over k >= t of gamma^(k-t) r(i,k)          (r = `turn_reward` [S])
    and A_S(i,t) = (G(i,t) - mean of its step group) / (std + eps), with grpo's conventions (0 in a group of one, or
    of equal returns). A return that is not finite (a NaN turn reward at or after t, or an excluded episode) leaves
    its turn out of its step group: A_S 0. Turns are given as S rows in episode order (`turn_episode` [S] their
    episode, `turn_start`, `turn_end` [S] their token span, end exclusive); tokens outside every turn (tool results)
    get A_E alone.

    Example, G=2, sparse rewards (r on an episode's last turn): episode 0 two turns, rewards [0, 1], R = 1; episode 1
    one turn, reward 0, R = 0. A_E = [+0.707, -0.707]. Both first turns act from the prompt (one anchor): returns
    gamma * 1 = 0.95 and 0 -> A_S = [+0.707, -0.707]; episode 0's second turn is alone in its step group: A_S = 0.
    So episode 0's first turn 1.414, its second 0.707; episode 1's turn -1.414.
    """
    N, S = rewards.numel(), turn_episode.numel()
    assert rewards.shape == (N,) and N % group_size == 0, (rewards.shape, group_size)
    for t in (turn_reward, anchor, turn_start, turn_end):
        assert t.shape == (S,), (t.shape, S)
    episode_adv, metrics = compute_advantages("grpo", rewards, group_size, eps)   # [N]
    returns = torch.zeros(S, dtype=torch.float32)                     # [S] discounted reward-to-go
    for s in reversed(range(S)):
        later = s + 1 < S and turn_episode[s + 1] == turn_episode[s]
        returns[s] = float(turn_reward[s]) + (gamma * returns[s + 1] if later else 0.0)
    returns[~torch.isfinite(rewards[turn_episode])] = float("nan")  # an excluded episode's turns: no return
    keys = [(int(e) // group_size, int(a)) for e, a in zip(turn_episode, anchor)]  # step group: prompt group, anchor
    members: dict[tuple, list[int]] = {}
    for s, key in enumerate(keys):
        members.setdefault(key, []).append(s)
    width = max((len(m) for m in members.values()), default=1)
    pool = torch.full((len(members), width), float("nan"))            # [K,P] each step group's returns
    where = {}
    for k, turns in enumerate(members.values()):
        for p, s in enumerate(turns):
            pool[k, p], where[s] = returns[s], (k, p)
    g = group_stats(pool.reshape(-1), width)
    step = torch.where(g.valid & ~g.equal, grpo_advantages(g, eps), torch.zeros_like(g.r))  # [K,P]
    adv = episode_adv[:, None].repeat(1, length)                      # [N,T]
    for s in range(S):
        adv[turn_episode[s], turn_start[s]:turn_end[s]] += omega * step[where[s]]
    grouped = sum(len(m) for m in members.values() if len(m) > 1)
    metrics.update({"gigpo/step_groups": float(len(members)), "gigpo/grouped_turn_frac": grouped / S if S else 0.0})
    return adv, metrics


def compute_advantages(name: str, rewards: Tensor, group_size: int,
                       eps: float = ADV_EPS) -> tuple[Tensor, dict[str, float]]:
    """Advantages [N] for rewards [N] (NaN = excluded) plus group metrics.

    An excluded reward, every member of a group with fewer than two valid rewards, and every member of a
    group whose valid rewards are all equal gets advantage exactly 0, under every estimator.
    Example: "grpo", rewards [1, 0, 0, 1], G=4 -> mean 0.5, std 0.577 -> [0.866, -0.866, -0.866, 0.866];
    rewards [1.6] * 4 -> [0, 0, 0, 0] (float32 alone would give -0.0012 each).
    """
    estimator = get_advantage(name)
    g = group_stats(rewards, group_size)
    keep = g.valid & ~g.equal                                         # [B,G]
    adv = torch.where(keep, estimator(g, eps), torch.zeros_like(g.r)).reshape(-1)  # [N]
    metrics = {
        "reward/zero_std_frac": g.equal.float().mean().item(),
        "reward/group_std_mean": g.std.mean().item(),
    }
    return adv, metrics


# ---------------------------------------------------------------- policy loss
@_register_ratio("token")
def token_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """PPO/GRPO: each token has its own ratio pi/pi_old."""
    return log_ratio                                                  # [N,T]


@_register_ratio("sequence")
def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """GSPO: one ratio per sequence, the geometric mean of its token ratios, on every token.

    Example: token log-ratios [0.2, 0.4] -> 0.3 on both tokens.
    """
    per_seq = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # [N,1]
    return per_seq.expand_as(log_ratio)                               # [N,T]


# TRL's one `loss_type` name sets two things aha keeps apart: the per-token surrogate (what each token's loss is,
# SURROGATES) and the aggregation (how a batch's token losses become one number, AGGREGATIONS). LOSS_TYPES maps
# each TRL name to its pair.
SURROGATES, _register_surrogate, get_surrogate = _registry("policy-loss surrogate")
LOSS_TYPES, _, get_loss_type = _registry("loss_type")


class LossType(NamedTuple):
    """A TRL loss_type as aha's (surrogate, aggregation) pair."""

    surrogate: str    # a SURROGATES name
    aggregation: str  # an AGGREGATIONS name


LOSS_TYPES.update({
    "grpo": LossType("clip", "grpo"), "dapo": LossType("clip", "dapo"), "dr_grpo": LossType("clip", "dr_grpo"),
    "bnpo": LossType("clip", "bnpo"), "luspo": LossType("clip", "luspo"), "cispo": LossType("cispo", "dapo"),
    "sapo": LossType("sapo", "grpo"), "vespo": LossType("vespo", "dapo"),
})


class SurrogateParams(NamedTuple):
    """The surrogates' numbers, TRL's names and defaults; each surrogate reads its own."""

    epsilon: float = 0.2                  # clip: ratio >= 1 - epsilon
    epsilon_high: float | None = None     # clip: ratio <= 1 + epsilon_high (None: epsilon); cispo: eps_max
    delta: float | None = None            # clip: cap on the unclipped ratio
    sapo_temperature_pos: float = 1.0     # sapo: gate temperature where A > 0
    sapo_temperature_neg: float = 1.05    # sapo: gate temperature where A <= 0
    vespo_k_pos: float = 2.0              # vespo: power k where A >= 0
    vespo_lambda_pos: float = 3.0         # vespo: decay lambda where A >= 0
    vespo_k_neg: float = 3.0              # vespo: power k where A < 0
    vespo_lambda_neg: float = 2.0         # vespo: decay lambda where A < 0


class PolicyTerms(NamedTuple):
    """What a surrogate reads."""

    logp: Tensor       # [N,T] log pi(token), with gradient
    log_ratio: Tensor  # [N,T] log pi/pi_old per token
    ratio: Tensor      # [N,T] pi/pi_old at the importance_sampling_level (log clamped before exp)
    adv: Tensor        # [N,1] or [N,T] advantages
    mask: Tensor       # [N,T] float, the tokens in the loss


VESPO_LOG_W_MIN = math.log(1e-8)
"""Lower clamp of VESPO's sequence log-weight (its reference implementation's)."""
VESPO_LAMBDA_MIN = 1e-4
"""Smallest VESPO decay lambda."""


@_register_surrogate("clip")
def clip_surrogate(t: PolicyTerms, p: SurrogateParams) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's clipped surrogate (grpo, dapo, dr_grpo, bnpo, luspo):
        loss = -min(r' A, clip(r, 1 - epsilon, 1 + epsilon_high) A),   r' = min(r, delta) (INTELLECT-2's two-sided
    clip; r' = r without delta). Its weight on grad log pi is -A r where the unclipped term is the min, else 0.
    Example: r 1.5, A +1, epsilon 0.2 -> -min(1.5, 1.2) = -1.2 (weight 0), counted as clipped high."""
    eps_high = p.epsilon if p.epsilon_high is None else p.epsilon_high
    clipped = t.ratio.clamp(1 - p.epsilon, 1 + eps_high)              # [N,T]
    unclipped = t.ratio.clamp(max=p.delta) if p.delta is not None else t.ratio  # [N,T]
    loss = -torch.min(unclipped * t.adv, clipped * t.adv)             # [N,T]
    return loss, (t.ratio < 1 - p.epsilon) & (t.adv < 0), (t.ratio > 1 + eps_high) & (t.adv > 0)


@_register_surrogate("cispo")
def cispo_surrogate(t: PolicyTerms, p: SurrogateParams) -> tuple[Tensor, Tensor, Tensor]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE with the importance weight clipped and its gradient stopped,
        loss = -sg(min(r, eps_max)) A log pi,   eps_max = epsilon_high (ScaleRL, arXiv 2510.13786, uses 5),
    so every token keeps a gradient, weight -A min(r, eps_max) on grad log pi, where PPO's clip drops it.
    Example: r 6, eps_max 5, A +1, log pi -0.5 -> loss -5 x 1 x -0.5 = 2.5, weight -5, counted as clipped high."""
    eps_max = p.epsilon if p.epsilon_high is None else p.epsilon_high
    weight = t.ratio.clamp(max=eps_max).detach()                      # [N,T]
    return -weight * t.adv * t.logp, torch.zeros_like(t.mask, dtype=torch.bool), (t.ratio > eps_max) & (t.adv > 0)


@_register_surrogate("sapo")
def sapo_surrogate(t: PolicyTerms, p: SurrogateParams) -> tuple[Tensor, Tensor, Tensor]:
    """SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347): a smooth gate in place of the hard clip,
        loss = -(4 / tau) sigmoid(tau (r - 1)) A,   tau = sapo_temperature_pos where A > 0, else sapo_temperature_neg.
    Its weight on grad log pi is -A r 4 s (1 - s), s = sigmoid(tau (r - 1)): -A at r = 1, fading smoothly as r
    leaves 1 (faster for a larger tau). Nothing is clipped.
    Example: r 1, A +1, tau 1 -> loss -4 x 0.5 = -2, weight -1; r 2 -> weight -2 x 4 x 0.731 x 0.269 = -1.573."""
    tau = torch.where(t.adv > 0, p.sapo_temperature_pos, p.sapo_temperature_neg)  # [N,1] or [N,T]
    none = torch.zeros_like(t.mask, dtype=torch.bool)
    return -torch.sigmoid(tau * (t.ratio - 1)) * 4 / tau * t.adv, none, none


@_register_surrogate("vespo")
def vespo_surrogate(t: PolicyTerms, p: SurrogateParams) -> tuple[Tensor, Tensor, Tensor]:
    """VESPO (arXiv 2602.10693): REINFORCE with one weight per sequence, a Gamma-shaped function of the sequence's
    importance ratio w = prod_t r_t (log w: the sum of its tokens' log-ratios, each clamped to +-20, then clamped to
    [log 1e-8, 20]), stopped-gradient:
        phi(w) = exp(lambda + k log w - lambda w)  (phi(1) = 1),   loss = -sg(phi(w)) A log pi,
    (k, lambda) = (vespo_k_pos, vespo_lambda_pos) where A >= 0, else (vespo_k_neg, vespo_lambda_neg); lambda >= 1e-4.
    Weight on grad log pi: -A phi(w). The ratio is always the sequence product (importance_sampling_level aside).
    Example: log w 0 -> phi 1; log w 0.1, k 2, lambda 3 -> phi = exp(3 + 0.2 - 3 e^0.1) = 0.8909."""
    with torch.no_grad():
        log_w = (t.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) * t.mask).sum(-1, keepdim=True)  # [N,1]
        log_w = log_w.clamp(VESPO_LOG_W_MIN, LOG_RATIO_CLAMP)                              # [N,1]
        nonneg = t.adv >= 0                                                                # [N,1] or [N,T]
        k = torch.where(nonneg, p.vespo_k_pos, p.vespo_k_neg)
        lam = torch.where(nonneg, p.vespo_lambda_pos, p.vespo_lambda_neg).clamp(min=VESPO_LAMBDA_MIN)
        phi = torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(0.0, 0.0, 0.0)    # [N,1] or [N,T]
    none = torch.zeros_like(t.mask, dtype=torch.bool)
    return -phi * t.adv * t.logp, none, none


def importance_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, level: str = "token") -> Tensor:
    """pi/pi_old [N,T] per token or per sequence (`level`, a RATIOS entry, over the tokens of `mask`), the log
    clamped to +-LOG_RATIO_CLAMP before exp; differentiable in `logp` (1 in value on a batch's first pass, where
    old_logp is logp itself). Example: log-ratios [0.2, 0.4], sequence level -> e^0.3 = 1.3499 on both tokens."""
    log_ratio = get_ratio(level)(logp - old_logp, mask.to(logp.dtype))  # [N,T]
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                epsilon: float = 0.2, epsilon_high: float | None = None,
                level: str = "token", delta: float | None = None, surrogate: str = "clip", **params
                ) -> tuple[Tensor, dict[str, Tensor]]:
    """A surrogate's loss per token, [N,T], and clip indicators and ratios for metrics and records.

    `advantages` is per token, [N,T], or per sequence, [N] (the same value on each of its tokens). The ratio is
    pi/pi_old per token or per sequence (`level`, a RATIOS entry), over the tokens of `mask`. `surrogate` is a
    SURROGATES name; `params` are SurrogateParams fields beyond the clip's (sapo_temperature_pos, vespo_k_pos, ...).
    Example (clip): ratio 1.5, A=+1, eps 0.2 -> loss -min(1.5, 1.2) = -1.2, counted as clipped high.
    """
    N, T = logp.shape
    assert old_logp.shape == (N, T) and mask.shape == (N, T) and advantages.shape in ((N,), (N, T))
    mask = mask.to(logp.dtype)                                        # [N,T]
    ratio = importance_ratio(logp, old_logp, mask, level)             # [N,T]
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # [N,1] or [N,T]
    terms = PolicyTerms(logp, logp - old_logp, ratio, adv, mask)
    loss, low, high = get_surrogate(surrogate)(terms, SurrogateParams(epsilon, epsilon_high, delta, **params))
    stats = {
        "clip/low": low.to(logp.dtype),                               # [N,T]
        "clip/high": high.to(logp.dtype),                             # [N,T]
        "ratio": ratio.detach(),                                      # [N,T] what the surrogate used
    }
    return loss, stats


IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""How a behaviour weight is taken (TRL's vllm_importance_sampling_mode): per token or one per sequence (the product
of its tokens' ratios), and out-of-bounds weights truncated to the bounds or masked to 0."""


def behaviour_weights(prox_logp: Tensor, behav_logp: Tensor, mask: Tensor, mode: str = "token_truncate",
                      low: float | None = None, high: float | None = None) -> tuple[Tensor, Tensor]:
    """The weight pi_prox / mu of the tokens of `mask`, [N,T] (exactly 1 elsewhere, no gradient), and where it fell
    outside [low, high] (a None bound: none on that side).

    mu is the policy as the engine that sampled the token saw it (`behav_logp`, recorded at sampling time), pi_prox
    the learner's log-probs at the weights the update starts from (`prox_logp`). One formula for two corrections:
    tokens sampled by older weights (decoupled PPO, Hilton et al. 2022, as AReaL; token_truncate at
    off_policy_is_cap, truncated IS as verl's TIS) and the engine-learner mismatch of tokens sampled by the current
    weights (TRL's vllm_importance_sampling_correction: `mode` from IS_MODES). A sequence mode's ratio is
    exp(sum over its tokens of log pi_prox - log mu), the same on each of its tokens; truncate clamps the ratio to
    the bounds, mask sets it to 0 outside them. Log-ratios are clamped to +-LOG_RATIO_CLAMP before exp.
    Example: token ratios [2.0, 0.5, 3.0], high 2.5 -> token_truncate [2.0, 0.5, 2.5], token_mask [2.0, 0.5, 0];
    sequence ratio 2 x 0.5 x 3 = 3.0 -> sequence_truncate 2.5 on each, sequence_mask 0 on each.
    """
    N, T = prox_logp.shape
    assert behav_logp.shape == (N, T) and mask.shape == (N, T), (prox_logp.shape, behav_logp.shape, mask.shape)
    if mode not in IS_MODES:
        raise ValueError(f"unknown importance sampling mode '{mode}'; valid: {sorted(IS_MODES)}")
    level, _, constraint = mode.partition("_")
    mask = mask.bool()                                                                 # [N,T]
    log_rho = torch.where(mask, prox_logp - behav_logp, torch.zeros_like(prox_logp))   # [N,T] 0 outside the mask
    if level == "sequence":
        log_rho = log_rho.sum(-1, keepdim=True).expand(N, T)                           # [N,T]
    rho = torch.exp(log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).detach()         # [N,T]
    lo, hi = -math.inf if low is None else low, math.inf if high is None else high
    outside = mask & ((rho < lo) | (rho > hi))                                         # [N,T]
    kept = rho.clamp(lo, hi) if constraint == "truncate" else rho.masked_fill(outside, 0.0)  # [N,T]
    return torch.where(mask, kept, torch.ones_like(kept)), outside


def off_policy_sequence_mask(adv: Tensor, logp: Tensor, sampled_logp: Tensor, mask: Tensor, threshold: float
                             ) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556, eq. 9; TRL's off_policy_mask_threshold): a token
    is dropped (0) where its advantage is negative and its sequence's mean of log mu - log pi over the tokens of
    `mask` (mu the sampling policy, pi the current one, no gradient) exceeds `threshold`; else kept (1). [N,T].
    Example: log mu - log pi [0.6, 0.8] -> mean 0.7 > 0.5: dropped where A < 0, kept where A >= 0."""
    N, T = logp.shape
    assert sampled_logp.shape == (N, T) and mask.shape == (N, T)
    mask = mask.to(logp.dtype)                                                          # [N,T]
    kl = ((sampled_logp - logp.detach()) * mask).sum(-1, keepdim=True)                # [N,1]
    kl = kl / mask.sum(-1, keepdim=True).clamp(min=1)                                   # [N,1] the sequence's mean
    keep = (adv >= 0) | (kl <= threshold)                                               # [N,1] or [N,T]
    return keep.to(logp.dtype).expand(N, T)                                             # [N,T]


# ---------------------------------------------------------------- KL to the reference
@_register_kl("k1")
def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """log(pi/ref): unbiased, high variance, can be negative per token."""
    return logp - ref_logp


@_register_kl("k2")
def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """0.5 * log(pi/ref)^2: low variance, biased, always >= 0."""
    return 0.5 * (logp - ref_logp) ** 2


@_register_kl("k3")
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """ref/pi - 1 - log(ref/pi), written expm1(x) - x with x clamped: unbiased and >= 0.

    Example: logp=0, ref_logp=log(0.5) -> x=log 0.5 -> 0.5-1+0.693 = 0.1931.
    """
    x = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.expm1(x) - x


def kl_penalty(name: str, logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token KL estimate [N,T] between the policy and the reference."""
    assert logp.shape == ref_logp.shape, (logp.shape, ref_logp.shape)
    return get_kl(name)(logp, ref_logp)


# ---------------------------------------------------------------- aggregation
# Each rule is "sum of masked token losses in this micro-batch / a denominator fixed for the whole
# optimizer batch", so micro-batches (gradient accumulation) add up to the full-batch loss exactly.
class Denominators(NamedTuple):
    """One optimizer step's counts, fixed before its forward/backward passes."""

    num_sequences: int  # sequences in the step's minibatch (every rank's)
    num_tokens: int     # their tokens in the loss (every rank's)
    max_len: int        # max_completion_length
    local_tokens: int   # tokens in the loss of this rank's share of the minibatch (= num_tokens on one process)
    world: int          # data-parallel ranks whose gradients are summed


@_register_agg("grpo")
def agg_sequence_mean(loss: Tensor, mask: Tensor, d: Denominators) -> Tensor:
    """Token mean within each sequence, then mean over sequences (GRPO paper)."""
    per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)       # [N]
    return per_seq.sum() / max(d.num_sequences, 1)


@_register_agg("dapo")
def agg_token_mean(loss: Tensor, mask: Tensor, d: Denominators) -> Tensor:
    """Token mean over the whole batch (DAPO): long sequences weigh in proportion to length."""
    return (loss * mask).sum() / max(d.num_tokens, 1)


@_register_agg("bnpo")
def agg_local_token_mean(loss: Tensor, mask: Tensor, d: Denominators) -> Tensor:
    """Token mean over this rank's share of the batch, averaged over ranks (TRL's bnpo, normalised by the local
    batch): sum / (local tokens x ranks), as the ranks' gradients are summed. On one process exactly dapo."""
    return (loss * mask).sum() / max(d.local_tokens * d.world, 1)


@_register_agg("dr_grpo")
def agg_fixed_length(loss: Tensor, mask: Tensor, d: Denominators) -> Tensor:
    """Token sum / (sequences * a fixed max length) (Dr. GRPO): no length bias."""
    return (loss * mask).sum() / max(d.num_sequences * d.max_len, 1)


@_register_agg("luspo")
def agg_sequence_sum(loss: Tensor, mask: Tensor, d: Denominators) -> Tensor:
    """Token sum within each sequence, then mean over sequences (LUSPO, arXiv 2602.05261: GSPO's sequence loss scaled
    by the sequence's length, against its length bias). It is dr_grpo x max_len. TRL's luspo with token-level
    ratios also averages over padding positions; aha's sums masked tokens only."""
    return (loss * mask).sum() / max(d.num_sequences, 1)


def aggregate(name: str, loss: Tensor, mask: Tensor, num_sequences: int | None = None,
              num_tokens: int | None = None, max_len: int | None = None, local_tokens: int | None = None,
              world: int = 1) -> Tensor:
    """Scalar loss from per-token values [n,T]; totals default to this batch's own (local_tokens to num_tokens)."""
    assert loss.shape == mask.shape and loss.dim() == 2, (loss.shape, mask.shape)
    mask = mask.to(loss.dtype)
    num_tokens = int(mask.sum().item()) if num_tokens is None else num_tokens
    return get_aggregation(name)(loss, mask, Denominators(
        loss.shape[0] if num_sequences is None else num_sequences, num_tokens,
        loss.shape[1] if max_len is None else max_len, num_tokens if local_tokens is None else local_tokens, world))


# ---------------------------------------------------------------- token selection
def high_entropy_mask(entropy: Tensor, mask: Tensor, keep_quantile: float) -> Tensor:
    """1.0 on the tokens whose entropy is in the top `keep_quantile` share of the masked tokens, else 0.0
    ("Beyond the 80/20 rule": train the policy loss on high-entropy forking tokens only; 1.0 keeps every
    token, 0.0 only the highest). Example: entropies [1, 2, 3, 4], keep 0.5 -> [0, 0, 1, 1]."""
    assert entropy.shape == mask.shape and entropy.dim() == 2, (entropy.shape, mask.shape)
    valid = mask.bool()                                               # [n,T]
    if keep_quantile >= 1.0 or not valid.any():
        return valid.to(entropy.dtype)
    threshold = torch.quantile(entropy[valid].float(), 1.0 - keep_quantile)
    return (valid & (entropy >= threshold)).to(entropy.dtype)         # [n,T]


# ---------------------------------------------------------------- entropy control
def entropy_bonus(entropy: Tensor, mask: Tensor, kept: Tensor, num_tokens: int) -> Tensor:
    """This pass's part of an optimizer step's mean per-token entropy H, the term of loss - entropy_coef x H (TRL's
    entropy bonus: H is a plain token mean whatever the loss_type, so the coefficient means the same for each).

    H is over the tokens the policy loss uses: `mask` [n,T] (in the loss) times `kept` [n,T] (top_entropy_quantile's
    selection, or `mask` itself). A pass adds its mean over its kept tokens times its share of the step's
    `num_tokens`, so the passes of a step add up to sum(entropy x mask) / num_tokens exactly when every token is kept,
    and with top_entropy_quantile < 1 to the step's mean up to each pass keeping its own share (ties, rounding).
    Example: entropies [1, 3] and [2] in passes of a 3-token step, all kept -> 2/3 x 2 + 1/3 x 2 = 2.
    """
    assert entropy.shape == mask.shape == kept.shape and entropy.dim() == 2, (entropy.shape, mask.shape, kept.shape)
    share = mask.sum() / max(num_tokens, 1)
    return share * (entropy * kept).sum() / kept.sum().clamp(min=1)


def positive_nll(logp: Tensor, mask: Tensor, positive: Tensor, num_tokens: int) -> Tensor:
    """This pass's part of an optimizer step's mean negative log-likelihood over its positive episodes' tokens, the
    term of loss + positive_nll_coef x NLL (VAPO's positive-example LM loss, arXiv 2504.05118): -sum(logp x mask)
    over the positive rows, over `num_tokens`, the step's positive tokens (so a step's passes add up to its mean).
    logp, mask [n,T]; positive [n] bool. Example: positive rows of log-probs [-1, -3] and [-2] in passes of a 3-token
    step -> 4/3 + 2/3 = 2."""
    assert logp.shape == mask.shape and logp.dim() == 2, (logp.shape, mask.shape)
    assert positive.shape == logp.shape[:1], (positive.shape, logp.shape)
    return -(logp * mask * positive.to(logp.dtype).unsqueeze(-1)).sum() / max(num_tokens, 1)


def adaptive_entropy_coef(coef: float, entropy: float, target: float, delta: float, low: float, high: float) -> float:
    """Adaptive entropy control (Skywork-OR1, arXiv 2505.22312), as TRL: after each optimizer step the coefficient
    rises by `delta` when that step's entropy is at or below `target` and falls by it otherwise, kept in [low, high].
    Example: coef 0.01, entropy 0.1, target 0.2, delta 0.005 -> 0.015; entropy 0.3 -> 0.005."""
    return min(coef + delta, high) if entropy <= target else max(coef - delta, low)


def applied_entropy_coef(coef: float, adaptive: bool, last_entropy: float, target: float) -> float:
    """The coefficient an optimizer step applies: `coef`; under adaptive control only while the previous step's
    entropy was at or below `target` (before any step it is taken as infinite: no bonus), else 0."""
    return coef if not adaptive or last_entropy <= target else 0.0
