"""The GRPO loop: generate a group per prompt, score, group-relative advantages, clipped update.

`GRPOTrainer.step` is the whole algorithm and reads top to bottom; everything it calls is a box of
its own (rollout engine, reward scoring, algos, log-probabilities, checkpoints).
"""

from __future__ import annotations

import copy
import math
import time
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Callable

import torch

from .. import algos
from ..data import encode_prompt, is_conversational, load_rows
from ..metrics import append_jsonl
from ..models import context_length, eos_ids
from ..rewards import check_columns, get_reward, reward_name, score_completions
from ..rollout import HFEngine, SamplingParams
from .common import build_optimizer, completion_logprobs, optimizer_step, seed_everything, setup_model
from .config import GRPOConfig
from .loop import PromptSampler, Trainer


COMPLETIONS_LOG = "completions.jsonl"


def resolve_reward_funcs(specs: list, kwargs: dict | None = None) -> list[Callable]:
    """Callables pass through; names come from aha.rewards; "module:function" is imported."""
    out = []
    for spec in specs:
        if callable(spec):
            out.append(spec)
        elif isinstance(spec, str) and ":" in spec:
            import importlib
            module, _, attr = spec.partition(":")
            out.append(getattr(importlib.import_module(module), attr))
        elif isinstance(spec, str):
            out.append(get_reward(spec, **(kwargs or {}).get(spec, {})))
        else:
            raise TypeError(f"reward function {spec!r} is neither a callable nor a name")
    return out


class GRPOTrainer(Trainer):
    """TRL-style entry point: `GRPOTrainer(model, reward_funcs, args, train_dataset).train()`."""

    headline = {"reward": ("reward/mean", "{:.3f}"), "len": ("completion/len_mean", "{:.0f}"),
                "acc": ("eval/accuracy", "{:.2f}"), "s/step": ("perf/step_s", "{:.2f}")}
    step_logs = (COMPLETIONS_LOG,)

    def __init__(self, model, reward_funcs, args: GRPOConfig | None = None, train_dataset=None,
                 processing_class=None, peft_config=None,
                 eval_fn: Callable[[object, object], dict] | None = None):
        args = args or GRPOConfig()
        super().__init__(args, eval_fn)
        seed_everything(args.seed)
        self.reward_funcs = resolve_reward_funcs(
            reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs], args.reward_kwargs)
        if not self.reward_funcs:
            raise ValueError("no reward functions given")
        w = args.reward_weights or [1.0] * len(self.reward_funcs)
        if len(w) != len(self.reward_funcs):
            raise ValueError(f"{len(w)} reward_weights for {len(self.reward_funcs)} reward functions")
        self.reward_weights = torch.tensor(w, dtype=torch.float32)
        self.rows = load_rows(train_dataset, args.prompt_column)
        check_columns(self.reward_funcs, {k: None for k in self.rows[0]})

        self.model, self.tokenizer = setup_model(args, model, processing_class, peft_config)
        self.is_peft = hasattr(self.model, "peft_config")
        self.ref_model = None  # with LoRA the reference is the base model with adapters disabled
        if args.beta > 0 and not self.is_peft:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.prompt_ids = self._encode_all()

        self.total_optimizer_steps = args.max_steps * args.num_iterations * (
            args.generation_batch_size // (args.per_device_train_batch_size * args.gradient_accumulation_steps))
        self.optimizer, self.scheduler = build_optimizer(args, self.model, self.total_optimizer_steps)
        self.engine = HFEngine(self.model, eos_ids(self.model, self.tokenizer),
                               self.tokenizer.pad_token_id, args.generation_max_batch)
        self.sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.max_completion_length)
        self.sampler = PromptSampler(len(self.rows), args.seed)

    # ------------------------------------------------------------------ set-up helpers
    def _encode_all(self) -> list[list[int]]:
        ids = [encode_prompt(self.tokenizer, r["prompt"]) for r in self.rows]
        ctx = context_length(self.model)
        if ctx:
            for i, p in enumerate(ids):
                if len(p) + self.args.max_completion_length > ctx:
                    raise ValueError(
                        f"prompt {i} has {len(p)} tokens; with max_completion_length "
                        f"{self.args.max_completion_length} it exceeds the model's context of {ctx}")
        if any(len(p) == 0 for p in ids):
            raise ValueError("the dataset has an empty prompt")
        return ids

    # ------------------------------------------------------------------ the step
    def step(self) -> dict[str, float]:
        """One GRPO step: B prompts -> B*G completions -> rewards -> advantages -> update."""
        a, G = self.args, self.args.num_generations
        t0 = time.perf_counter()
        idx = self.sampler.take(a.prompts_per_step)                                  # B prompts
        rows = [self.rows[i] for i in idx]
        prompt_ids = [self.prompt_ids[i] for i in idx for _ in range(G)]             # N
        rollout = self.engine.generate([self.prompt_ids[i] for i in idx], G, self.sampling, self.generator)
        comp_ids = rollout.completion_ids                                            # N
        t_gen = time.perf_counter() - t0

        rewards_per_func, metrics = self._score(rows, comp_ids)                     # [N,F]
        rewards = self._combine(rewards_per_func)                                    # [N]
        ok = rewards[torch.isfinite(rewards)]
        metrics.update({"reward/mean": ok.mean().item() if len(ok) else float("nan"),
                        "reward/std": ok.std().item() if len(ok) > 1 else float("nan"),
                        "reward/excluded_frac": 1 - len(ok) / len(rewards)})
        advantages, adv_metrics = algos.compute_advantages(a.advantage_estimator, rewards, G)  # [N]
        metrics.update(adv_metrics)
        keep = torch.ones(len(comp_ids), dtype=torch.bool)                           # [N]
        if a.mask_truncated_completions:
            keep &= ~torch.tensor(rollout.truncated)
        t1 = time.perf_counter()
        metrics.update(self._update(prompt_ids, comp_ids, advantages, keep))
        t_train = time.perf_counter() - t1

        lengths = torch.tensor([len(c) for c in comp_ids], dtype=torch.float32)
        gen_tokens = float(lengths.sum())
        metrics.update({
            "completion/len_mean": lengths.mean().item(), "completion/len_min": lengths.min().item(),
            "completion/len_max": lengths.max().item(),
            "completion/truncated_frac": sum(rollout.truncated) / len(comp_ids),
            "lr": self.scheduler.get_last_lr()[0],
            "perf/step_s": time.perf_counter() - t0, "perf/generate_s": t_gen, "perf/train_s": t_train,
            "perf/gen_tokens_per_s": gen_tokens / max(t_gen, 1e-9),
        })
        metrics["perf/train_tokens_per_s"] = metrics.pop("_train_tokens") / max(t_train, 1e-9)
        self._last_batch = (rows, comp_ids, rewards_per_func, rewards, advantages)
        return metrics

    def _score(self, rows: list[dict], comp_ids: list[list[int]]) -> tuple[torch.Tensor, dict]:
        """Rewards [N,F] (NaN = excluded) and per-function statistics."""
        G = self.args.num_generations
        texts = self.tokenizer.batch_decode(comp_ids, skip_special_tokens=True)
        prompts = [r["prompt"] for r in rows for _ in range(G)]
        completions = ([[{"role": "assistant", "content": t}] for t in texts]
                       if is_conversational(rows[0]["prompt"]) else texts)
        columns = {k: [r.get(k) for r in rows for _ in range(G)] for k in rows[0] if k != "prompt"}
        state = SimpleNamespace(global_step=self.step_count, max_steps=self.max_steps)  # TRL's TrainerState fields
        rpf, metrics = score_completions(self.reward_funcs, prompts, completions, columns,
                                         completion_ids=comp_ids, trainer_state=state)
        self._last_texts = (prompts, texts)
        for j, fn in enumerate(self.reward_funcs):
            col = rpf[:, j]
            ok = col[torch.isfinite(col)]
            name = reward_name(fn)
            metrics[f"reward/{name}/mean"] = ok.mean().item() if len(ok) else float("nan")
            metrics[f"reward/{name}/std"] = ok.std().item() if len(ok) > 1 else float("nan")
        return rpf, metrics

    def _combine(self, rpf: torch.Tensor) -> torch.Tensor:
        """Weighted sum over functions, NaN ignored; NaN only when no function gave a value."""
        finite = torch.isfinite(rpf)                                                 # [N,F]
        total = (torch.where(finite, rpf, torch.zeros_like(rpf)) * self.reward_weights).sum(-1)
        return torch.where(finite.any(-1), total, torch.full_like(total, float("nan")))  # [N]

    def _logprobs(self, model, prompts, comps, with_entropy=False):
        return completion_logprobs(model, prompts, comps, self.tokenizer.pad_token_id,
                                   self.args.temperature, with_entropy)

    @torch.no_grad()
    def _frozen_logprobs(self, prompts, comps, reference: bool) -> list[torch.Tensor]:
        """Per-sequence log-probs under the current weights (old policy) or the reference."""
        a = self.args
        ctx = nullcontext()
        model = self.model
        if reference:
            model = self.ref_model if self.ref_model is not None else self.model
            ctx = self.model.disable_adapter() if self.is_peft else nullcontext()
        out = []
        with ctx:
            for s in range(0, len(prompts), a.per_device_train_batch_size):
                lp, mask, _ = self._logprobs(model, prompts[s:s + a.per_device_train_batch_size],
                                             comps[s:s + a.per_device_train_batch_size])
                out += [lp[i, :int(mask[i].sum())].cpu() for i in range(len(lp))]
        return out

    def _update(self, prompts, comps, advantages, keep) -> dict[str, float]:
        """num_iterations passes of minibatch updates; returns loss-side metrics."""
        a, N = self.args, len(comps)
        micro, mb = a.per_device_train_batch_size, a.per_device_train_batch_size * a.gradient_accumulation_steps
        n_tok = torch.tensor([len(c) for c in comps]) * keep                         # [N]
        old = self._frozen_logprobs(prompts, comps, reference=False) if a.num_iterations > 1 else None
        ref = self._frozen_logprobs(prompts, comps, reference=True) if a.beta > 0 else None
        trainable = keep & (n_tok > 0)
        if a.skip_zero_advantage and a.beta == 0:
            trainable &= advantages != 0   # such sequences add exactly 0 to loss and gradient
        sums = {"loss": 0.0, "tokens": 0.0, "kl": 0.0, "entropy": 0.0, "clip/low": 0.0, "clip/high": 0.0}
        grad_norms, train_tokens, skipped = [], 0, 0
        self.model.train()
        for _ in range(a.num_iterations):
            order = torch.randperm(N, generator=self.generator)
            for s in range(0, N, mb):
                batch = order[s:s + mb]
                denom = dict(num_sequences=int(keep[batch].sum()), num_tokens=int(n_tok[batch].sum()),
                             max_len=a.max_completion_length)
                live = sorted(batch[trainable[batch]].tolist(), key=lambda i: len(prompts[i]) + len(comps[i]))
                before = dict(sums)
                for m in range(0, len(live), micro):  # length-sorted micro-batches: little padding
                    train_tokens += self._micro_step(live[m:m + micro], prompts, comps, advantages, keep,
                                                     old, ref, denom, sums)
                norm = optimizer_step(a, self.model, self.optimizer, self.scheduler, sums["loss"] - before["loss"])
                if math.isnan(norm):  # skipped (on_nonfinite=skip): its statistics describe no update
                    sums.update(before)
                    skipped += 1
                else:
                    grad_norms.append(norm)
        steps, tokens = len(grad_norms), sums.pop("tokens")
        out = {k: v / max(tokens, 1) for k, v in sums.items() if k != "loss"}
        out["loss"] = sums["loss"] / steps if steps else math.nan
        if ref is None:
            out.pop("kl")
        out["grad_norm"] = sum(grad_norms) / steps if steps else math.nan
        out["train/nonfinite_skipped"] = float(skipped)
        out["train/trained_frac"] = float(trainable.float().mean())
        out["_train_tokens"] = train_tokens
        return out

    def _micro_step(self, ids, prompts, comps, advantages, keep, old, ref, denom, sums) -> int:
        """Forward, loss and backward for one micro-batch; adds token-summed stats to `sums`."""
        a = self.args
        p, c = [prompts[i] for i in ids], [comps[i] for i in ids]
        logp, mask, ent = self._logprobs(self.model, p, c, with_entropy=True)          # [n,T]
        T = logp.shape[1]

        def stack(seqs):  # per-sequence 1-D log-probs -> [n,T]
            return torch.stack([torch.nn.functional.pad(x, (0, T - len(x))) for x in seqs]).to(logp.device)

        old_lp = stack([old[i] for i in ids]) if old is not None else logp.detach()   # [n,T]
        mask = mask * keep[ids].to(mask.device).unsqueeze(-1)                         # [n,T]
        loss_tok, clip = algos.policy_loss(logp, old_lp, advantages[ids].to(logp.device), mask,
                                           a.epsilon, a.epsilon_high, a.importance_sampling_level, a.delta)
        if ref is not None:
            kl = algos.kl_penalty(a.kl_estimator, logp, stack([ref[i] for i in ids]))  # [n,T]
            loss_tok = loss_tok + a.beta * kl
            sums["kl"] += float((kl.detach() * mask).sum())
        loss = algos.aggregate(a.loss_type, loss_tok, mask, **denom)
        loss.backward()
        sums["loss"] += float(loss.detach())
        sums["entropy"] += float((ent * mask).sum())
        for k, v in clip.items():
            sums[k] += float((v * mask).sum())
        sums["tokens"] += float(mask.sum())
        return sum(map(len, p)) + sum(map(len, c))

    def after_step(self, metrics, bar) -> None:
        """Append a few completions with their rewards to completions.jsonl and the terminal."""
        n = self.args.log_completions_steps
        if not n or self.step_count % n:
            return
        rows, comp_ids, rpf, rewards, adv = self._last_batch
        prompts, texts = self._last_texts
        names = [reward_name(f) for f in self.reward_funcs]
        shown = range(min(self.args.num_completions_to_print, len(texts)))
        append_jsonl(self.run_dir / COMPLETIONS_LOG, [
            {"step": self.step_count, "prompt": prompts[i], "completion": texts[i],
             "rewards": dict(zip(names, [None if v != v else float(v) for v in rpf[i].tolist()])),
             "advantage": float(adv[i])} for i in shown])
        for i in shown:
            bar.write(f"[step {self.step_count}] reward={float(rewards[i]):.3f} | {texts[i][:200]!r}")
