"""The GRPO loop: generate a group per prompt, score, group-relative advantages, clipped update.

`GRPOTrainer.step` is the whole algorithm and reads top to bottom; everything it calls is a box of
its own (rollout engine, reward scoring, algos, log-probabilities, checkpoints). What flows through
one step is a `GRPOBatch`; what the update adds up is `LossSums`.

Where this departs from the DeepSeekMath paper, by default (each a config switch):
- loss aggregation is DAPO's token mean over the batch (`loss_type="dapo"`), not the per-sequence mean;
- beta = 0: no KL term and no reference model (`beta > 0` restores both);
- a single pass over each batch (`num_iterations=1`), so the ratio is 1 and no old-policy forward runs.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import torch
from torch import Tensor

from .. import algos
from ..behaviour import behaviour_metrics
from ..config import GRPOConfig
from ..data import check_row, encode_prompt, is_stream, load_rows
from ..metrics import append_jsonl
from ..models import context_length, setup_model
from ..rewards import (check_columns, check_not_all_null, completion_text, get_reward, last_failure, reward_name,
                       score_groups)
from ..rollout import HFEngine, SamplingParams
from .logprobs import completion_logprobs
from .loop import PromptSampler, StreamSampler, Trainer, build_optimizer, optimizer_step, seed_everything
from .records import GROUPS_LOG, GroupRecorder

TIME_FLOOR_S = 1e-9
"""Lower bound on a measured duration before dividing by it (a phase that did no work)."""
COMPLETIONS_LOG = "completions.jsonl"


def disable_dropout(model) -> None:
    """Every dropout probability to 0 (modules and attention), so a sequence's log-probs are the same on
    every forward pass, as TRL's disable_dropout."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def import_reward(spec: str) -> Callable:
    """"module:function" -> the function; the module is looked up on sys.path and then in the current
    directory (so `reward_funcs=[myrew:exact]` finds ./myrew.py). Either missing is one clear error."""
    import importlib
    import os
    import sys
    module, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module.split(".")[0] or os.getcwd() in sys.path:
            raise ValueError(f"reward function {spec!r}: cannot import module {module!r}: {e}") from e
        sys.path.append(os.getcwd())
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e2:
            raise ValueError(f"reward function {spec!r}: no module {module!r} on the Python path or in the current "
                             f"directory ({os.getcwd()})") from e2
        finally:
            sys.path.remove(os.getcwd())
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ValueError(f"reward function {spec!r}: module {module!r} ({mod.__file__}) has no function {attr!r}")
    return fn


def resolve_reward_funcs(specs: list, kwargs: dict | None = None) -> list[Callable]:
    """Callables pass through; names come from aha.rewards; "module:function" is imported."""
    out = []
    for spec in specs:
        if callable(spec):
            out.append(spec)
        elif isinstance(spec, str) and ":" in spec:
            out.append(import_reward(spec))
        elif isinstance(spec, str):
            out.append(get_reward(spec, **(kwargs or {}).get(spec, {})))
        else:
            raise TypeError(f"reward function {spec!r} is neither a callable nor a name")
    return out


@dataclass
class GRPOBatch:
    """One step's rollouts, prompt-major: sequences i*G .. i*G+G-1 answer prompt i. N = B*G."""

    rows: list[dict]                   # B dataset rows
    prompt_ids: list[list[int]]        # N prompt token ids (row i's repeated G times)
    completion_ids: list[list[int]]    # N generated token ids
    texts: list[str]                   # N decoded completions
    truncated: Tensor                  # [N] bool: hit max_completion_length without EOS
    rewards_per_func: Tensor           # [N,F] NaN = excluded
    rewards: Tensor                    # [N] weighted sum; NaN when no function gave a value
    advantages: Tensor                 # [N]
    version: int                       # weight version that sampled it

    @property
    def prompts(self) -> list:
        """N prompts as the dataset gave them (text or chat messages)."""
        G = len(self.completion_ids) // len(self.rows)
        return [r["prompt"] for r in self.rows for _ in range(G)]


@dataclass
class LossSums:
    """What the micro-steps of one update add up; token sums are over completion tokens in the loss."""

    loss: float = 0.0          # sum of the aggregated micro-batch losses
    tokens: float = 0.0        # completion tokens in the loss
    kl: float = 0.0            # token sum of the KL estimate
    entropy: float = 0.0       # token sum of the policy entropy
    clip_low: float = 0.0      # tokens clipped at 1 - epsilon (A < 0)
    clip_high: float = 0.0     # tokens clipped at 1 + epsilon_high (A > 0)
    processed: int = 0         # prompt + completion tokens through forward and backward

    def __add__(self, other: "LossSums") -> "LossSums":
        return LossSums(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))


class GRPOTrainer(Trainer):
    """TRL-style entry point: `GRPOTrainer(model, reward_funcs, args, train_dataset).train()`."""

    headline = {"reward": ("reward/mean", "{:.3f}"), "len": ("completion/len_mean", "{:.0f}"),
                "acc": ("eval/accuracy", "{:.2f}"), "s/step": ("perf/step_s", "{:.2f}")}
    step_logs = Trainer.step_logs + (COMPLETIONS_LOG, GROUPS_LOG)

    def __init__(self, model, reward_funcs, args: GRPOConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, callbacks=None, peft_config=None,
                 eval_fn: Callable[[object, object], dict] | None = None):
        args = args or GRPOConfig()
        super().__init__(args, eval_fn, callbacks)
        seed_everything(args.seed)
        self.reward_funcs = resolve_reward_funcs(
            reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs], args.reward_kwargs)
        if not self.reward_funcs:
            raise ValueError("no reward functions given")
        w = args.reward_weights or [1.0] * len(self.reward_funcs)
        if len(w) != len(self.reward_funcs):
            raise ValueError(f"{len(w)} reward_weights for {len(self.reward_funcs)} reward functions")
        self.reward_weights = torch.tensor(w, dtype=torch.float32)                  # [F]
        self.streaming = is_stream(train_dataset)
        if self.streaming:  # rows arrive as training reads them (StreamSampler); the first one is checked now
            first = check_row(next(iter(train_dataset), None) or {}, 0, args.prompt_column)
            self.rows: dict[int, dict] | list[dict] = {}
            check_columns(self.reward_funcs, {k: None for k in first})
        else:
            self.rows = load_rows(train_dataset, args.prompt_column)
            check_columns(self.reward_funcs, {k: None for k in self.rows[0]})
            check_not_all_null(self.reward_funcs, self.rows)

        self.model, self.tokenizer = setup_model(args, model, processing_class, peft_config)
        if args.disable_dropout:
            disable_dropout(self.model)
        self.is_peft = hasattr(self.model, "peft_config")
        if args.sync_ref_model and self.is_peft:
            raise ValueError("sync_ref_model needs a separate reference model; with LoRA the reference is the "
                             "base model with adapters disabled")
        self.ref_model = None  # with LoRA the reference is the base model with adapters disabled
        if args.beta > 0 and not self.is_peft:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.prompt_ids = {} if self.streaming else self._encode_all()
        self._max_steps = self._steps_for_epochs() if args.num_train_epochs else args.max_steps
        self.optimizer, self.scheduler = build_optimizer(
            args, self.model, args.optimizer_steps // args.max_steps * self._max_steps)
        self.engine = HFEngine.for_model(self.model, self.tokenizer, args.generation_max_batch)
        self.sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.max_completion_length)
        self.sampler = (StreamSampler(train_dataset, args.seed, self._admit, shuffle=args.shuffle_dataset)
                        if self.streaming else PromptSampler(len(self.rows), args.seed, shuffle=args.shuffle_dataset))
        if eval_dataset is not None:
            self.eval_fn = self._reward_eval(load_rows(eval_dataset, args.prompt_column), eval_fn)
        self.last_batch: GRPOBatch | None = None
        """The latest step's rollouts, for logging completions."""
        self.fail_streak = {reward_name(f): 0 for f in self.reward_funcs}
        """Consecutive steps on which each reward function raised or timed out."""
        self.recorder = GroupRecorder(self.run_dir, args.log_groups_steps, args.log_groups_max,
                                      args.log_groups_max_mb, args.num_generations)

    @property
    def max_steps(self) -> int:
        return self._max_steps

    def _steps_for_epochs(self) -> int:
        """TRL's num_train_epochs: steps of B prompts that make that many passes over the prompts."""
        if self.streaming:
            raise ValueError("num_train_epochs needs a dataset of known length; with a streaming dataset set max_steps")
        return max(1, math.ceil(self.args.num_train_epochs * len(self.rows) / self.args.prompts_per_step))

    def _encode_all(self) -> list[list[int]]:
        return [self._encode(i, r) for i, r in enumerate(self.rows)]

    def _encode(self, i: int, row: dict) -> list[int]:
        """Prompt token ids of dataset row i; an empty prompt or one too long for the context is an error."""
        ids, ctx = encode_prompt(self.tokenizer, row["prompt"]), context_length(self.model)
        if len(ids) == 0:
            raise ValueError(f"dataset row {i}: the prompt is empty")
        if ctx and len(ids) + self.args.max_completion_length > ctx:
            raise ValueError(f"prompt {i} has {len(ids)} tokens; with max_completion_length "
                             f"{self.args.max_completion_length} it exceeds the model's context of {ctx}")
        return ids

    def _admit(self, i: int, row) -> None:
        """A row read from a streaming dataset: checked, encoded, kept until its step is done."""
        self.rows[i] = check_row(row, i, self.args.prompt_column)
        self.prompt_ids[i] = self._encode(i, self.rows[i])

    # ------------------------------------------------------------------ the step
    def step(self) -> dict[str, float]:
        """One GRPO step: B prompts -> B*G completions -> rewards -> advantages -> update -> new weights."""
        t0 = time.perf_counter()
        with self.autocast():
            batch, metrics = self.rollout(self.sampler.take(self.args.prompts_per_step))
            if self.streaming:  # the batch holds what it needs: a stream's rows are not kept
                self.rows.clear()
                self.prompt_ids.clear()
            t1 = time.perf_counter()
            sums, update_metrics = self.update(batch)
        self._sync_reference()
        self.engine.update_weights(self.model, self.step_count + 1)
        t2 = time.perf_counter()

        lengths = torch.tensor([len(c) for c in batch.completion_ids], dtype=torch.float32)  # [N]
        t_gen = metrics.pop("perf/generate_s")
        metrics.update(update_metrics)
        metrics.update({
            "completion/len_mean": lengths.mean().item(), "completion/len_min": lengths.min().item(),
            "completion/len_max": lengths.max().item(),
            "completion/truncated_frac": batch.truncated.float().mean().item(),
            "lr": self.scheduler.get_last_lr()[0],
            "perf/step_s": t2 - t0, "perf/generate_s": t_gen, "perf/train_s": t2 - t1,
            "perf/gen_tokens_per_s": lengths.sum().item() / max(t_gen, TIME_FLOOR_S),
            "perf/train_tokens_per_s": sums.processed / max(t2 - t1, TIME_FLOOR_S) if sums.processed else math.nan,
        })
        metrics.update(self._behaviour(batch, lengths))
        self.last_batch = batch
        return metrics

    @torch.no_grad()
    def _sync_reference(self) -> None:
        """TR-DPO's reference update, as TRL's sync_ref_model: every ref_model_sync_steps steps
        ref <- alpha * policy + (1 - alpha) * ref."""
        a = self.args
        if not a.sync_ref_model or self.ref_model is None or (self.step_count + 1) % a.ref_model_sync_steps:
            return
        for ref, policy in zip(self.ref_model.parameters(), self.model.parameters()):
            ref.mul_(1 - a.ref_model_mixup_alpha).add_(policy.detach(), alpha=a.ref_model_mixup_alpha)

    def rollout(self, idx: list[int]) -> tuple[GRPOBatch, dict[str, float]]:
        """Generate G completions for each of the B prompts `idx`, score them, group advantages."""
        a, G = self.args, self.args.num_generations
        rows = [self.rows[i] for i in idx]                                           # B
        t0 = time.perf_counter()
        out = self.engine.generate([self.prompt_ids[i] for i in idx], G, self.sampling, self.generator)
        t_gen = time.perf_counter() - t0
        texts = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)  # N
        state = SimpleNamespace(global_step=self.step_count, max_steps=self.max_steps)  # TRL's TrainerState fields
        rpf, metrics = score_groups(self.reward_funcs, rows, texts, G, out.completion_ids, state,
                                    a.reward_timeout)                                # [N,F]
        self._check_failures(metrics)
        rewards = self._combine(rpf)                                                 # [N]
        ok = rewards[torch.isfinite(rewards)]
        advantages, adv_metrics = algos.compute_advantages(a.advantage_estimator, rewards, G)  # [N]
        metrics.update(adv_metrics)
        metrics.update({"reward/mean": ok.mean().item() if len(ok) else float("nan"),
                        "reward/std": ok.std().item() if len(ok) > 1 else float("nan"),
                        "reward/excluded_frac": 1 - len(ok) / len(rewards), "perf/generate_s": t_gen})
        batch = GRPOBatch(rows=rows, prompt_ids=[self.prompt_ids[i] for i in idx for _ in range(G)],
                          completion_ids=out.completion_ids, texts=texts, truncated=torch.tensor(out.truncated),
                          rewards_per_func=rpf, rewards=rewards, advantages=advantages, version=out.version)
        return batch, metrics

    def _reward_eval(self, rows: list[dict], eval_fn: Callable | None) -> Callable:
        """An eval hook for `eval_dataset`: greedy completions scored with the reward functions
        (`eval/reward/mean`, `eval/reward/<name>/mean`), beside what `eval_fn` reports."""
        check_columns(self.reward_funcs, {k: None for k in rows[0]})
        ids = [encode_prompt(self.tokenizer, r["prompt"]) for r in rows]
        greedy = SamplingParams(0.0, 1.0, 0, self.args.max_completion_length)

        def evaluate(model, tokenizer) -> dict[str, float]:
            out = self.engine.generate(ids, 1, greedy)
            texts = tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
            rpf, scored = score_groups(self.reward_funcs, rows, texts, 1, out.completion_ids,
                                       timeout_s=self.args.reward_timeout)            # [E,F]
            total = self._combine(rpf)                                               # [E]
            metrics = {k: v for k, v in scored.items() if k.endswith("/mean")}            # reward/<name>/mean
            metrics["reward/mean"] = total[total.isfinite()].mean().item() if total.isfinite().any() else math.nan
            return {**(eval_fn(model, tokenizer) if eval_fn else {}), **metrics}
        return evaluate

    def _check_failures(self, metrics: dict[str, float]) -> None:
        """A reward function that fails step after step is a bug, not noise: stop instead of training on nothing."""
        for name in self.fail_streak:
            self.fail_streak[name] = self.fail_streak[name] + 1 if metrics[f"reward/{name}/failed"] else 0
            if self.args.reward_fail_steps and self.fail_streak[name] >= self.args.reward_fail_steps:
                raise RuntimeError(f"reward function {name} raised or timed out on {self.fail_streak[name]} "
                                   f"consecutive steps (last: {last_failure(name)!r}); fix it, or set "
                                   "reward_fail_steps=0 to train on without it") from last_failure(name)

    def _combine(self, rpf: Tensor) -> Tensor:
        """Weighted sum over functions, NaN ignored; NaN only when no function gave a value."""
        finite = torch.isfinite(rpf)                                                 # [N,F]
        total = (torch.where(finite, rpf, torch.zeros_like(rpf)) * self.reward_weights).sum(-1)  # [N]
        return torch.where(finite.any(-1), total, torch.full_like(total, float("nan")))  # [N]

    # ------------------------------------------------------------------ the update
    def update(self, batch: GRPOBatch) -> tuple[LossSums, dict[str, float]]:
        """num_iterations passes of minibatch updates over the batch; token sums and loss-side metrics."""
        a, N = self.args, len(batch.completion_ids)
        micro, mb = a.per_device_train_batch_size, a.per_device_train_batch_size * a.gradient_accumulation_steps
        keep = ~batch.truncated if a.mask_truncated_completions else torch.ones(N, dtype=torch.bool)  # [N]
        n_tok = torch.tensor([len(c) for c in batch.completion_ids]) * keep          # [N]
        old = self._frozen_logprobs(batch, reference=False) if a.num_iterations > 1 else None
        ref = self._frozen_logprobs(batch, reference=True) if a.beta > 0 else None
        trainable = keep & (n_tok > 0)                                               # [N]
        if a.skip_zero_advantage and a.beta == 0:
            trainable &= batch.advantages != 0   # such sequences add exactly 0 to loss and gradient
        seq_len = [len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids)]
        sums, grad_norms, skipped = LossSums(), [], 0
        self.model.train()
        for _ in range(a.num_iterations):
            order = torch.randperm(N, generator=self.generator)
            for s in range(0, N, mb):
                part = order[s:s + mb]
                denom = dict(num_sequences=int(keep[part].sum()), num_tokens=int(n_tok[part].sum()),
                             max_len=a.max_completion_length)
                live = sorted(part[trainable[part]].tolist(), key=seq_len.__getitem__)
                minibatch = LossSums()
                for m in range(0, len(live), micro):  # length-sorted micro-batches: little padding
                    minibatch = minibatch + self._micro_step(batch, live[m:m + micro], keep, old, ref, denom)
                norm = optimizer_step(a, self.model, self.optimizer, self.scheduler, minibatch.loss)
                if math.isnan(norm):  # skipped (on_nonfinite=skip): its statistics describe no update
                    skipped += 1
                else:
                    sums, grad_norms = sums + minibatch, grad_norms + [norm]
        steps, per_token = len(grad_norms), sums.tokens or math.nan  # nothing trained: NaN, not 0
        metrics = {"loss": sums.loss / steps if steps else math.nan, "entropy": sums.entropy / per_token,
                   "clip/low": sums.clip_low / per_token, "clip/high": sums.clip_high / per_token,
                   "grad_norm": sum(grad_norms) / steps if steps else math.nan,
                   "train/nonfinite_skipped": float(skipped), "train/trained_frac": trainable.float().mean().item()}
        if ref is not None:
            metrics["kl"] = sums.kl / per_token
        return sums, metrics

    def _micro_step(self, batch: GRPOBatch, ids: list[int], keep: Tensor, old: list[Tensor] | None,
                    ref: list[Tensor] | None, denom: dict) -> LossSums:
        """Forward, loss and backward for the sequences `ids`; returns their token sums."""
        a = self.args
        p, c = [batch.prompt_ids[i] for i in ids], [batch.completion_ids[i] for i in ids]
        logp, mask, ent = self._logprobs(self.model, p, c, with_entropy=True)        # [n,T]
        T = logp.shape[1]

        def stack(seqs):  # per-sequence 1-D log-probs -> [n,T]
            return torch.stack([torch.nn.functional.pad(x, (0, T - len(x))) for x in seqs]).to(logp.device)

        old_lp = stack([old[i] for i in ids]) if old is not None else logp.detach()  # [n,T]
        mask = mask * keep[ids].to(mask.device).unsqueeze(-1)                        # [n,T]
        loss_tok, clip = algos.policy_loss(logp, old_lp, batch.advantages[ids].to(logp.device), mask,
                                           a.epsilon, a.epsilon_high, a.importance_sampling_level, a.delta)  # [n,T]
        if a.top_entropy_quantile < 1.0:  # the policy term on high-entropy tokens only; KL still on all
            loss_tok = loss_tok * algos.high_entropy_mask(ent, mask, a.top_entropy_quantile)  # [n,T]
        kl_sum = 0.0
        if ref is not None:
            kl = algos.kl_penalty(a.kl_estimator, logp, stack([ref[i] for i in ids]))  # [n,T]
            loss_tok = loss_tok + a.beta * kl                                         # [n,T]
            kl_sum = float((kl.detach() * mask).sum())
        loss = algos.aggregate(a.loss_type, loss_tok, mask, **denom)
        if self.recorder.wants(self.step_count + 1):  # groups.jsonl: this update's own per-token values
            self.recorder.capture(ids, logp, loss_tok, clip, kl if ref is not None else None, mask,
                                  lambda t: algos.aggregate(a.loss_type, t, mask, **denom))
        loss.backward()
        return LossSums(loss=float(loss.detach()), tokens=float(mask.sum()), kl=kl_sum,
                        entropy=float((ent * mask).sum()), clip_low=float((clip["clip/low"] * mask).sum()),
                        clip_high=float((clip["clip/high"] * mask).sum()),
                        processed=sum(map(len, p)) + sum(map(len, c)))

    def _behaviour(self, batch: GRPOBatch, lengths: Tensor) -> dict[str, float]:
        """behaviour/* metrics (aha.behaviour); correct = correct_reward's value >= correct_threshold."""
        names = [reward_name(f) for f in self.reward_funcs]
        name = self.args.correct_reward or names[0]
        if name not in names:
            raise ValueError(f"correct_reward {name!r} is not one of the reward functions {names}")
        values = batch.rewards_per_func[:, names.index(name)].tolist()                # [N]
        correct = [None if v != v else v >= self.args.correct_threshold for v in values]
        return behaviour_metrics([completion_text(p) for p in batch.prompts], batch.texts,
                                 [int(n) for n in lengths.tolist()], correct, self.args.reflection_phrases)

    def _logprobs(self, model, prompts, comps, with_entropy=False):
        return completion_logprobs(model, prompts, comps, self.tokenizer.pad_token_id,
                                   self.args.temperature, with_entropy)

    @torch.no_grad()
    def _frozen_logprobs(self, batch: GRPOBatch, reference: bool) -> list[Tensor]:
        """Per-sequence log-probs under the current weights (old policy) or the reference."""
        micro = self.args.per_device_train_batch_size
        model, ctx = self.model, nullcontext()
        if reference:
            model = self.ref_model if self.ref_model is not None else self.model
            ctx = self.model.disable_adapter() if self.is_peft else nullcontext()
        out = []
        with ctx:
            for s in range(0, len(batch.completion_ids), micro):
                lp, mask, _ = self._logprobs(model, batch.prompt_ids[s:s + micro], batch.completion_ids[s:s + micro])
                out += [lp[i, :int(mask[i].sum())].cpu() for i in range(len(lp))]
        return out

    # ------------------------------------------------------------------ logging
    def after_step(self, metrics, bar) -> None:
        """Every log_groups_steps: the first groups with per-token values to groups.jsonl (train/records.py).
        Every log_completions_steps: the whole step's groups to completions.jsonl (prompt, gold answer when the
        rows have one, each completion with its per-function rewards, total reward and advantage), and the first
        num_completions_to_print completions to the terminal."""
        n, b = self.args.log_completions_steps, self.last_batch
        if b is not None:
            self.recorder.write(self.step_count, b, self.tokenizer, [reward_name(f) for f in self.reward_funcs])
        if not n or self.step_count % n or b is None:
            return
        names, prompts, G = [reward_name(f) for f in self.reward_funcs], b.prompts, self.args.num_generations
        nan_to_none = lambda v: None if v != v else float(v)  # noqa: E731
        rows = [{"step": self.step_count, "group": i // G, "prompt": prompts[i], "answer": b.rows[i // G].get("answer"),
                 "completion": b.texts[i],
                 "rewards": dict(zip(names, map(nan_to_none, b.rewards_per_func[i].tolist()))),
                 "reward": nan_to_none(b.rewards[i]), "advantage": float(b.advantages[i])} for i in range(len(b.texts))]
        append_jsonl(self.run_dir / COMPLETIONS_LOG, rows)
        self.logger.log_table(self.step_count, "completions", rows)
        for i in range(min(self.args.num_completions_to_print, len(b.texts))):
            bar.write(f"[step {self.step_count}] reward={float(b.rewards[i]):.3f} | {b.texts[i][:200]!r}")
