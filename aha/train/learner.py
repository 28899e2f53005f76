"""The update box: the `Learner` that holds the policy, its reference and optimizer and applies num_iterations
passes of clipped minibatch steps to a `GRPOBatch` (batch.py), adding up `LossSums`. Every sum and denominator
counts the model's own tokens only (the batch's loss mask): tool and environment tokens are context, with no
gradient. The single-process trainer owns one Learner; the Ray layer runs one per rank (of the same class).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from contextlib import nullcontext
from typing import Callable

import torch
from torch import Tensor

from .. import algos
from ..config import GRPOConfig
from ..batch import GRPOBatch, LossSums
from .logprobs import completion_logprobs
from .loop import build_optimizer, optimizer_step
from .passes import Passes, choose, describe, device_memory, share_prompts

__all__ = ["GRPOBatch", "Learner", "LossSums"]
log = logging.getLogger("aha.train")


class PhaseClock:
    """Seconds an update spends in each phase, as perf/train_<phase>_s: old (the sampling policy's log-probs, when
    the batch is reused), reference (the reference model's log-probs, when beta > 0), policy (the loss's forward and
    backward passes) and optimizer (clipping and the optimizer step). A GPU is synchronised at each mark, so queued
    work counts in the phase that issued it."""

    def __init__(self, device: torch.device):
        self.device, self.seconds, self.last = device, {}, time.perf_counter()

    def mark(self, phase: str) -> None:
        """The time since the previous mark goes to `phase`."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
        self.last = now

    def metrics(self) -> dict[str, float]:
        return {f"perf/train_{phase}_s": s for phase, s in self.seconds.items()}


class Learner:
    """Policy, reference, optimizer and schedule, and the GRPO update over a GRPOBatch.

    Data parallel when torch.distributed is initialised (`world` > 1): every rank walks the same
    minibatches (same generator), takes every world-th sequence of each after sorting by length, and
    the gradients (with the loss, for the non-finite check) are summed across ranks in one all-reduce
    before each optimizer step. Loss denominators count the whole minibatch, so the summed gradient is
    the one a single process computes on the same batch, up to float summation order.
    """

    def __init__(self, args: GRPOConfig, model, pad_id: int, generator: torch.Generator, total_steps: int,
                 shard: Callable | None = None):
        self.args, self.model, self.pad_id, self.generator = args, model, pad_id, generator
        self.total_steps = total_steps
        """Optimizer steps the schedule spans (a rank of the Ray layer is built with the same)."""
        self.is_peft = hasattr(model, "peft_config")
        self.ref_model = None  # with LoRA the reference is the base model with adapters disabled
        if args.beta > 0 and not self.is_peft:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.sharded = shard is not None
        """FSDP2: parameters (and the reference) sharded over the ranks by `shard(module)`."""
        for module in (model, self.ref_model) if self.sharded else ():
            if module is not None:
                shard(module)
        self.optimizer, self.scheduler = build_optimizer(args, model, total_steps)
        dist = torch.distributed
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.version = 0
        """GRPO steps applied to the weights: the version rollouts sampled with the current weights carry."""
        self.recorder = None
        """A train.records.GroupRecorder that keeps per-token values of the groups it wants, or None."""
        device = next(model.parameters()).device
        self.memory = device_memory(device)
        """The device's total bytes, which the automatic passes (aha.train.passes) are sized to: the smallest
        rank's, so that every rank cuts a batch alike (FSDP's collectives need as many passes on each)."""
        if self.world > 1:
            least = torch.tensor([float(self.memory)], dtype=torch.float64)
            dist.all_reduce(least, op=dist.ReduceOp.MIN)
            self.memory = int(least.item())
        self.passes = Passes(args.max_tokens_per_micro_batch or 0, bool(args.share_prompts))
        """How the batch being trained is cut into forward/backward passes (chosen per batch by `update`)."""
        self.share = args.share_prompts
        """Whether passes share prompts: as set, or decided on the first batch (None until then)."""
        self.entropy_on = args.entropy_coef != 0 or args.use_adaptive_entropy
        """Whether the loss has an entropy bonus (loss - coef x H): for the whole run, even at coefficient 0."""
        self.entropy_coef = args.entropy_coef
        """The bonus's coefficient: entropy_coef, moved after every optimizer step under adaptive control."""
        self.last_entropy = math.inf
        """The last optimizer step's mean entropy over the tokens its policy loss used (inf before the first)."""
        self._window = [0.0, 0.0]
        """That entropy's sum and token count over the current optimizer step's passes."""
        self.surrogate_params = {k: getattr(args, k) for k in algos.SurrogateParams._fields
                                 if k.startswith(("sapo_", "vespo_"))}
        """The soft surrogates' numbers (the clip's are passed on their own)."""
        rule = describe(args, self.memory, device)
        if rule and self.rank == 0:
            log.info("%s", rule)

    # ------------------------------------------------------------------ the update
    def update(self, batch: GRPOBatch) -> tuple[LossSums, dict[str, float]]:
        """num_iterations passes of minibatch updates over the batch; token sums and loss-side metrics."""
        a, N = self.args, len(batch.completion_ids)
        mb = a.per_device_train_batch_size * a.gradient_accumulation_steps
        keep = ~batch.truncated if a.mask_truncated_completions else torch.ones(N, dtype=torch.bool)  # [N]
        n_tok = batch.model_tokens * keep                                            # [N] model tokens in the loss
        reused = a.num_iterations > 1 or N > mb  # a later optimizer step sees weights that moved since sampling
        clock = PhaseClock(next(self.model.parameters()).device)
        if self.share is None:
            self.share = share_prompts(a, batch)
            if self.rank == 0:
                log.info("share_prompts: %s for this run (decided on its first batch)", "on" if self.share else "off")
        self.passes = choose(a, batch, self.model, self.memory, clock.device.type, self.share)
        old = self.frozen_logprobs(batch, reference=False) if reused else None
        clock.mark("old")
        ref = self.frozen_logprobs(batch, reference=True) if a.beta > 0 else None
        clock.mark("reference")
        trainable = keep & (n_tok > 0)                                               # [N]
        positive = trainable & (batch.rewards >= a.positive_reward) if a.positive_nll_coef else trainable & False  # [N]
        if a.skip_zero_advantage and a.beta == 0 and a.top_entropy_quantile >= 1.0 and not self.entropy_on:
            trainable &= torch.tensor([bool(t.any()) for t in batch.token_advantages], dtype=torch.bool) | positive
            # such sequences add exactly 0 to loss and gradient (the entropy quantile is taken over a pass's tokens,
            # so it needs them all; an entropy bonus, or a positive episode's NLL, has a gradient on every token)
        order_key = self._order_key(batch)
        reduce = self._all_reduce if self.world > 1 else None
        sums, grad_norms, skipped, loss_tokens, control = LossSums(), [], 0, 0, []
        self.model.train()
        for _ in range(a.num_iterations):
            order = torch.randperm(N, generator=self.generator)
            for s in range(0, N, mb):
                part = order[s:s + mb]
                denom, every = self._denominators(batch, part, n_tok, trainable, order_key)
                nll = (positive, int(n_tok[part][positive[part]].sum()))  # the step's positive tokens: its NLL's count
                coef = algos.applied_entropy_coef(self.entropy_coef, a.use_adaptive_entropy, self.last_entropy,
                                                  a.entropy_target)
                groups = self.micro_batches(batch, self._part(every, batch.group_size, self.rank))  # little padding
                # sharded ranks must all run as many forward/backward passes as the busiest one (FSDP collectives)
                passes = max(len(self.micro_batches(batch, self._part(every, batch.group_size, r)))
                             for r in range(self.world)) if self.sharded else len(groups)
                minibatch = LossSums()
                for m in range(passes):
                    minibatch = minibatch + (self._micro_step(batch, groups[m], keep, old, ref, denom, coef, nll)
                                             if m < len(groups) else self._idle_step(batch, every[0]))
                clock.mark("policy")
                norm = optimizer_step(a, self.model, self.optimizer, self.scheduler, minibatch.loss, reduce)
                clock.mark("optimizer")
                control += [self._entropy_control(coef)] if self.entropy_on else []
                if math.isnan(norm):  # skipped (on_nonfinite=skip): its statistics describe no update
                    skipped += 1
                else:
                    sums, grad_norms = sums + minibatch, grad_norms + [norm]
                    loss_tokens += denom["num_tokens"]
        self.version += 1
        self.sync_reference()
        sums, metrics = self._metrics(self._gather(sums), grad_norms, skipped, trainable, ref is not None, loss_tokens,
                                      positive)
        chosen = {"perf/pass_tokens": float(self.passes.tokens), "perf/share_prompts": float(self.passes.share)}
        entropy = {k: sum(c[k] for c in control) / len(control) for k in control[0]} if control else {}
        return sums, {**metrics, **clock.metrics(), **chosen, **entropy}

    def _denominators(self, batch: GRPOBatch, part: Tensor, n_tok: Tensor, trainable: Tensor,
                      order_key: Callable) -> tuple[dict, list[int]]:
        """A minibatch's algos.Denominators (fixed before its passes; the tokens of sequences skipped for a zero
        advantage count, as in TRL, which trains on them) and its trainable sequences sorted for cutting passes. This
        rank's local batch (bnpo's) is its share of the trainable sequences and its share of the skipped ones."""
        every = sorted(part[trainable[part]].tolist(), key=order_key)
        idle = sorted(part[~trainable[part]].tolist(), key=order_key)
        local = self._part(every, batch.group_size, self.rank) + self._part(idle, batch.group_size, self.rank)
        denom = dict(num_sequences=len(part), num_tokens=int(n_tok[part].sum()), max_len=self.args.max_completion_length,
                     local_tokens=int(n_tok[local].sum()) if local else 0, world=self.world)
        return denom, every

    def _entropy_control(self, applied: float) -> dict[str, float]:
        """After an optimizer step: its mean entropy over the tokens its policy loss used (every rank's), and under
        adaptive control the coefficient moved for the next step (algos.adaptive_entropy_coef, as TRL)."""
        a, (total, count), self._window = self.args, self._window, [0.0, 0.0]
        if self.world > 1:
            both = torch.tensor([total, count], dtype=torch.float64)
            torch.distributed.all_reduce(both)
            total, count = both.tolist()
        entropy = total / count if count else math.nan
        if a.use_adaptive_entropy and count:  # a step that trained no token measured nothing
            self.entropy_coef = algos.adaptive_entropy_coef(self.entropy_coef, entropy, a.entropy_target,
                                                            a.entropy_coef_delta, a.entropy_coef_min, a.entropy_coef_max)
            self.last_entropy = entropy
        return {"entropy_coef": self.entropy_coef, "entropy/applied_coef": applied, "entropy/policy_tokens": entropy}

    def _order_key(self, batch: GRPOBatch) -> Callable[[int], tuple]:
        """Sort key of sequence i for cutting passes: its length (little padding); with share_prompts, whole
        groups first (one prompt forward each), ordered by their longest sequence."""
        seq_len = [len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids)]
        if not self.passes.share:
            return lambda i: (seq_len[i],)
        G = batch.group_size
        longest = [max(seq_len[g * G:g * G + G]) for g in range(len(seq_len) // G)]
        return lambda i: (longest[i // G], i // G, seq_len[i])

    def _part(self, every: list[int], G: int, rank: int) -> list[int]:
        """Rank `rank`'s share of a minibatch's sorted sequences: every world-th one; with share_prompts every
        world-th group, whole, so that a prompt runs on one rank only."""
        if self.world == 1:
            return every
        if not self.passes.share:
            return every[rank::self.world]
        ours = set(list(dict.fromkeys(i // G for i in every))[rank::self.world])
        return [i for i in every if i // G in ours]

    def micro_batches(self, batch: GRPOBatch, ids: list[int]) -> list[list[int]]:
        """`ids` (sorted by length) cut into forward/backward passes: per_device_train_batch_size sequences each,
        and with a token budget (max_tokens_per_micro_batch, or aha's choice) no more padded tokens than that (a
        longer sequence goes alone)."""
        size, budget, share = self.args.per_device_train_batch_size, self.passes.tokens, self.passes.share
        out, cur, width_p, width_c, heads = [], [], 0, 0, set()
        for i in ids:
            prompt = tuple(batch.prompt_ids[i])
            p, c = max(width_p, len(prompt)), max(width_c, len(batch.completion_ids[i]))
            rows, u = len(cur) + 1, len(heads | {prompt}) if share else 0
            padded = u * p + rows * (c + 1) if share else rows * (p + c)  # as completion_logprobs pads the pass
            if cur and (len(cur) == size or budget and padded > budget):
                out.append(cur)
                cur, p, c, heads = [], len(prompt), len(batch.completion_ids[i]), set()
            cur, width_p, width_c = cur + [i], p, c
            heads.add(prompt)
        return out + [cur] if cur else out

    def _metrics(self, sums: LossSums, grad_norms: list[float], skipped: int, trainable: Tensor,
                 with_kl: bool, loss_tokens: int, positive: Tensor) -> tuple[LossSums, dict[str, float]]:
        """Token means: clip/* over every completion token in the loss (a skipped sequence's advantage is 0, so
        none of its tokens is clipped), as TRL counts them; entropy, kl and offpolicy/* over the tokens trained on;
        with positive_nll_coef, positive/nll over the positive episodes' tokens and positive/frac, their share of the
        batch's episodes (`positive` [N])."""
        steps, per_token = len(grad_norms), sums.tokens or math.nan  # nothing trained: NaN, not 0
        in_loss = loss_tokens if sums.tokens else math.nan  # nothing trained: no update to describe
        metrics = {"loss": sums.loss / steps if steps else math.nan, "entropy": sums.entropy / per_token,
                   "clip/low": sums.clip_low / in_loss, "clip/high": sums.clip_high / in_loss,
                   "grad_norm": sum(grad_norms) / steps if steps else math.nan,
                   "train/nonfinite_skipped": float(skipped), "train/trained_frac": trainable.float().mean().item()}
        if with_kl:
            metrics["kl"] = sums.kl / per_token
        if sums.stale_tokens:
            metrics.update({"offpolicy/is_weight_mean": sums.is_weight / sums.stale_tokens,
                            "offpolicy/is_weight_max": sums.is_max,
                            "offpolicy/is_clipped_frac": sums.is_clipped / sums.stale_tokens,
                            "offpolicy/stale_token_frac": sums.stale_tokens / per_token})
        if sums.fresh_tokens or not sums.tokens:  # the engine's log-probs against the learner's, same weights
            fresh = sums.fresh_tokens or math.nan  # nothing trained: nothing measured, NaN
            metrics.update({"mismatch/kl": sums.mismatch_kl / fresh,
                            "mismatch/is_ratio_mean": sums.mismatch_ratio / fresh,
                            "mismatch/logp_diff_max": sums.mismatch_max if sums.fresh_tokens else math.nan})
        if self.args.vllm_importance_sampling_correction:
            metrics["mismatch/corrected_frac"] = sums.is_corrected / per_token
        if self.args.off_policy_mask_threshold is not None:
            metrics["offpolicy/seq_masked_frac"] = sums.seq_masked / per_token
        if self.args.positive_nll_coef:
            metrics.update({"positive/nll": sums.positive_nll / sums.positive_tokens if sums.positive_tokens
                            else math.nan, "positive/frac": positive.float().mean().item()})
        return sums, metrics

    def _idle_step(self, batch: GRPOBatch, i: int) -> LossSums:
        """A sharded rank with no sequence left in this minibatch still joins its peers' collectives: one
        forward and backward that add exactly zero to every gradient."""
        logp, _, _ = self._logprobs(self.model, [batch.prompt_ids[i]], [batch.completion_ids[i]])
        (logp.sum() * 0.0).backward()
        return LossSums()

    def _all_reduce(self, params: list[Tensor], loss: float) -> float:
        """Sum every gradient and the loss over ranks in one collective; returns the summed loss. Sharded
        (FSDP2) gradients were already summed by the backward's reduce-scatter: only the loss is."""
        if self.sharded:
            total = torch.tensor([loss], dtype=torch.float64)
            torch.distributed.all_reduce(total)
            return float(total)
        flat = torch.cat([p.grad.reshape(-1).float() for p in params] + [torch.tensor([loss])])
        torch.distributed.all_reduce(flat)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        return float(flat[-1])

    def _gather(self, sums: LossSums) -> LossSums:
        """Every rank's sums added (the largest behaviour weight: the max), so metrics describe the whole batch."""
        if self.world == 1:
            return sums
        total = sums.as_tensor()
        peak = torch.tensor([getattr(sums, name) for name in LossSums.MAXIMA], dtype=torch.float64)
        torch.distributed.all_reduce(total)
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
        out = LossSums.from_tensor(total)
        for name, value in zip(LossSums.MAXIMA, peak.tolist()):
            setattr(out, name, value)
        return out

    def _micro_step(self, batch: GRPOBatch, ids: list[int], keep: Tensor, old: list[Tensor] | None,
                    ref: list[Tensor] | None, denom: dict, entropy_coef: float,
                    nll: tuple[Tensor, int]) -> LossSums:
        """Forward, loss and backward for the sequences `ids`; returns their token sums. `nll`: which of the batch's
        sequences are positive [N] and the minibatch's positive tokens (positive_nll_coef's term)."""
        a = self.args
        p, comps = [batch.prompt_ids[i] for i in ids], [batch.completion_ids[i] for i in ids]
        logp, mask, ent = self._logprobs(self.model, p, comps, with_entropy=True)    # [n,T]
        T = logp.shape[1]

        def stack(seqs):  # per-sequence 1-D values (log-probs, masks, advantages) -> [n,T], 0 past each end
            return torch.stack([torch.nn.functional.pad(x, (0, T - len(x))) for x in seqs]).to(logp.device)

        old_lp = stack([old[i] for i in ids]) if old is not None else logp.detach()  # [n,T]
        model_tok = stack([batch.loss_mask[i] for i in ids]).to(mask.dtype)          # [n,T] 0 on tool tokens
        mask = mask * model_tok * keep[ids].to(mask.device).unsqueeze(-1)            # [n,T] the tokens in the loss
        adv = stack([batch.token_advantages[i] for i in ids])                        # [n,T]
        kind = algos.get_loss_type(a.loss_type)
        loss_tok, clip = algos.policy_loss(logp, old_lp, adv, mask, a.epsilon, a.epsilon_high,
                                           a.importance_sampling_level, a.delta, kind.surrogate,
                                           **self.surrogate_params)                   # [n,T]
        kept = mask
        if a.top_entropy_quantile < 1.0:  # the policy term on high-entropy tokens only; KL still on all
            kept = algos.high_entropy_mask(ent, mask, a.top_entropy_quantile)        # [n,T]
            loss_tok = loss_tok * kept
        behav = None if batch.behaviour_logprobs is None else stack([batch.behaviour_logprobs[i] for i in ids])  # [n,T]
        w, off = self._behaviour(behav, old_lp, mask, batch.versions[ids] < self.version)
        if w is not None:  # pi_prox/mu: tokens sampled by older weights, or the engine-learner mismatch
            loss_tok = loss_tok * w
        if a.off_policy_mask_threshold is not None:  # the sampling policy: the engine's log-probs where recorded
            seq_keep = algos.off_policy_sequence_mask(adv, logp, old_lp if behav is None else behav, mask,
                                                      a.off_policy_mask_threshold)  # [n,T]
            loss_tok = loss_tok * seq_keep
            off.seq_masked = float(((1 - seq_keep) * mask).sum())
        kl_sum, kl = 0.0, None
        if ref is not None:
            kl = algos.kl_penalty(a.kl_estimator, logp, stack([ref[i] for i in ids]))  # [n,T]
            if a.use_bias_correction_kl:  # TRL's: the estimate weighted by pi/pi_old, its gradient included
                kl = kl * algos.importance_ratio(logp, old_lp, mask, a.importance_sampling_level)  # [n,T]
            loss_tok = loss_tok + a.beta * kl                                         # [n,T]
            kl_sum = float((kl.detach() * mask).sum())
        loss = algos.aggregate(kind.aggregation, loss_tok, mask, **denom)
        if self.entropy_on:  # loss - coef x H, H the mean entropy of the tokens the policy loss uses
            loss = loss - entropy_coef * algos.entropy_bonus(ent, mask, kept, denom["num_tokens"])
            self._window = [self._window[0] + float((ent.detach() * kept).sum()), self._window[1] + float(kept.sum())]
        loss, pos = self._positive_term(loss, logp, mask, nll[0][ids], nll[1])
        if self.recorder is not None and self.recorder.wants(self.version + 1):  # groups.jsonl: this update's values
            self.recorder.capture(ids, [len(c) for c in comps], logp, loss_tok, clip, kl, mask,
                                  lambda t: algos.aggregate(kind.aggregation, t, mask, **denom))
        loss.backward()
        return pos + off + LossSums(loss=float(loss.detach()), tokens=float(mask.sum()), kl=kl_sum,
                                    entropy=float((ent.detach() * mask).sum()),
                                    clip_low=float((clip["clip/low"] * mask).sum()),
                                    clip_high=float((clip["clip/high"] * mask).sum()),
                                    processed=sum(map(len, {tuple(q) for q in p} if self.passes.share else p))
                                    + sum(map(len, comps)))

    def _positive_term(self, loss: Tensor, logp: Tensor, mask: Tensor, rows: Tensor, tokens: int
                       ) -> tuple[Tensor, LossSums]:
        """loss + positive_nll_coef x this pass's part of the NLL over the positive rows' tokens (`rows` [n] bool,
        `tokens` the minibatch's positive tokens), and their sums; the loss unchanged when the coefficient is 0."""
        coef = self.args.positive_nll_coef
        if not coef:
            return loss, LossSums()
        rows = rows.to(logp.device)                                                   # [n]
        on = mask * rows.unsqueeze(-1)                                                # [n,T] positive tokens
        return (loss + coef * algos.positive_nll(logp, mask, rows, tokens),
                LossSums(positive_tokens=float(on.sum()), positive_nll=float(-(logp.detach() * on).sum())))

    def _behaviour(self, behav: Tensor | None, prox: Tensor, mask: Tensor, stale: Tensor
                   ) -> tuple[Tensor | None, LossSums]:
        """The behaviour weight pi_prox/mu of each token, [n,T] (None: 1 everywhere), and its sums, by one formula
        (algos.behaviour_weights): with vllm_importance_sampling_correction every token's, by its mode and bounds; else
        the stale tokens' only (sampled by older weights, `stale` [n]), truncated at off_policy_is_cap. The mismatch of
        the tokens sampled by the current weights (engine against learner, same weights) is measured either way."""
        a = self.args
        if behav is None:
            if a.vllm_importance_sampling_correction:
                raise ValueError(f"vllm_importance_sampling_correction needs the engine's log-probs, and engine "
                                 f"{a.engine!r} recorded none")
            return None, LossSums()
        on = mask.bool()                                                              # [n,T]
        stale_tok = on & stale.to(on.device).unsqueeze(-1)                            # [n,T]
        fresh = on & ~stale_tok                                                       # [n,T]
        diff = (prox - behav)[fresh]                                                  # [k] log pi - log mu
        sums = LossSums(fresh_tokens=float(fresh.sum()), mismatch_kl=float(algos.kl_k3(behav, prox)[fresh].sum()),
                        mismatch_ratio=float(diff.clamp(-algos.LOG_RATIO_CLAMP, algos.LOG_RATIO_CLAMP).exp().sum()),
                        mismatch_max=float(diff.abs().max()) if diff.numel() else 0.0)
        if a.vllm_importance_sampling_correction:
            w, hit = algos.behaviour_weights(prox, behav, on, a.vllm_importance_sampling_mode,
                                             a.vllm_importance_sampling_clip_min, a.vllm_importance_sampling_clip_max)
            sums.is_corrected = float(hit.sum())
        elif bool(stale_tok.any()):
            w, hit = algos.behaviour_weights(prox, behav, stale_tok, "token_truncate", None, a.off_policy_is_cap)
        else:
            return None, sums
        if bool(stale_tok.any()):
            sums = sums + LossSums(stale_tokens=float(stale_tok.sum()), is_weight=float(w[stale_tok].sum()),
                                   is_clipped=float(hit[stale_tok].sum()), is_max=float(w[stale_tok].max()))
        return w, sums

    def _logprobs(self, model, prompts, comps, with_entropy=False):
        return completion_logprobs(model, prompts, comps, self.pad_id, self.args.temperature, with_entropy,
                                   self.passes.share)

    @torch.no_grad()
    def frozen_logprobs(self, batch: GRPOBatch, reference: bool) -> list[Tensor]:
        """Per-sequence log-probs under the current weights (old policy) or the reference."""
        model, ctx = self.model, nullcontext()
        if reference:
            model = self.ref_model if self.ref_model is not None else self.model
            ctx = self.model.disable_adapter() if self.is_peft else nullcontext()
        N, order = len(batch.completion_ids), range(len(batch.completion_ids))  # prompt-major: groups together
        if self.passes.tokens:  # sorted, so that passes under the budget pad little
            order = sorted(order, key=self._order_key(batch))
        out = [None] * N
        with ctx:
            for ids in self.micro_batches(batch, list(order)):
                lp, mask, _ = self._logprobs(model, [batch.prompt_ids[i] for i in ids],
                                             [batch.completion_ids[i] for i in ids])
                for row, i in enumerate(ids):
                    out[i] = lp[row, :int(mask[row].sum())].cpu()
        return out

    @torch.no_grad()
    def sync_reference(self) -> None:
        """TR-DPO's reference update, as TRL's sync_ref_model: every ref_model_sync_steps steps
        ref <- alpha * policy + (1 - alpha) * ref."""
        a = self.args
        if not a.sync_ref_model or self.ref_model is None or self.version % a.ref_model_sync_steps:
            return
        for ref, policy in zip(self.ref_model.parameters(), self.model.parameters()):
            ref.mul_(1 - a.ref_model_mixup_alpha).add_(policy.detach(), alpha=a.ref_model_mixup_alpha)

    # ------------------------------------------------------------------ state, for weight sync and checkpoints
    def trainable_state(self) -> dict[str, Tensor]:
        """The parameters the optimizer moves (all of them, or the LoRA adapters), whole, on the CPU: views of
        the live weights on a CPU model (callers serialise or copy them; none keeps them across a step).
        Sharded, every rank must call it (the shards are gathered)."""
        return {n: _whole(p.detach()).cpu() for n, p in self.model.named_parameters() if p.requires_grad}

    def reference_state(self) -> dict[str, Tensor] | None:
        """Every reference parameter, whole, on the CPU, when training moves the reference (sync_ref_model);
        None when it stays the initial model. Sharded, every rank must call it."""
        if not self.args.sync_ref_model or self.ref_model is None:
            return None
        return {n: _whole(p.detach()).cpu() for n, p in self.ref_model.named_parameters()}

    def state(self) -> dict:
        """Weights, optimizer (keyed by parameter name, whole), schedule, version, RNG, and with sync_ref_model the
        reference's weights: what a checkpoint needs. With several ranks every one calls it; the copies are identical."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        optimizer = get_optimizer_state_dict(self.model, self.optimizer,
                                             options=StateDictOptions(full_state_dict=True))
        state = {"weights": self.trainable_state(), "optimizer": optimizer, "scheduler": self.scheduler.state_dict(),
                 "version": self.version, "generator": self.generator.get_state(), "entropy": self.entropy_state(),
                 "share": self.share}
        reference = self.reference_state()
        if reference is not None:
            state["reference"] = reference
        return state

    @torch.no_grad()
    def load_state(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        whole = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(self.model, state["weights"], options=whole)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=whole)
        if state.get("reference") is not None and self.ref_model is not None:
            set_model_state_dict(self.ref_model, state["reference"], options=whole)
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = state["version"]
        self.generator.set_state(state["generator"])
        self.load_entropy_state(state.get("entropy"))
        self.share = state.get("share", self.share)  # share_prompts: auto, as rank 0 (or a checkpoint) decided it

    def entropy_state(self) -> dict[str, float]:
        """The entropy bonus's controller: its coefficient and the last step's entropy (TRL saves the same pair)."""
        return {"entropy_coef": self.entropy_coef, "last_entropy": self.last_entropy}

    def load_entropy_state(self, state: dict | None) -> None:
        """Restore `entropy_state()`; None (a checkpoint of an older aha) keeps the configured start."""
        if state is not None:
            self.entropy_coef, self.last_entropy = state["entropy_coef"], state["last_entropy"]


def _whole(p: Tensor) -> Tensor:
    """A parameter as one tensor: an FSDP2 shard (DTensor) gathered, anything else as it is."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p
