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

import inspect
import math
import queue
import threading
import time
from typing import Callable

import torch
from torch import Tensor

from .. import algos
from ..behaviour import behaviour_metrics
from ..config import GRPOConfig
from ..data import PromptTooLong, check_row, encode_prompt, has_columns, is_stream, load_rows
from ..metrics import append_jsonl
from ..models import context_length, setup_model
from ..rewards import (check_columns, check_not_all_null, completion_text, get_reward, last_failure,
                       merge_reward_metrics, reward_name, score_groups)
from ..rewards.scoring import needed_columns
from ..rollout import HFEngine, SamplingParams
from .learner import GRPOBatch, Learner, LossSums
from .loop import PromptSampler, StreamSampler, Trainer, seed_everything
from .records import GROUPS_LOG, GroupRecorder

__all__ = ["GRPOTrainer", "GRPOBatch", "LossSums", "Learner"]

TIME_FLOOR_S = 1e-9
"""Lower bound on a measured duration before dividing by it (a phase that did no work)."""
COMPLETIONS_LOG = "completions.jsonl"
SCORER_GRACE_S = 30.0
"""With stream_rewards, how long past its reward calls' own bound (groups x functions x reward_timeout) the
scoring thread may take after generation ends before the step fails."""


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
    """Callables pass through; names come from aha.rewards, built with their `kwargs[name]`; "module:function" is
    imported. A `kwargs` entry that no name uses, or that is not a mapping, is an error."""
    names = {spec for spec in specs if isinstance(spec, str) and ":" not in spec}
    for name, given in (kwargs or {}).items():
        if name not in names:
            raise ValueError(f"reward_kwargs has {name!r}, but no reward function is built by that name (by name: "
                             f"{sorted(names) or 'none; a task builds its own rewards, set reward_funcs to choose'})")
        if not isinstance(given, dict):
            raise ValueError(f"reward_kwargs[{name!r}] must be a mapping of argument -> value, got {given!r}")
    out = []
    for spec in specs:
        if isinstance(spec, torch.nn.Module) or isinstance(spec, str) and "/" in spec and ":" not in spec:
            raise TypeError(f"reward function {spec if isinstance(spec, str) else type(spec).__name__!r}: aha takes "
                            "no reward models (TRL's model-id reward); wrap yours in a function "
                            "f(prompts, completions, **kw) -> list[float] that runs it")
        if callable(spec):
            out.append(spec)
        elif isinstance(spec, str) and ":" in spec:
            out.append(import_reward(spec))
        elif isinstance(spec, str):
            out.append(get_reward(spec, **(kwargs or {}).get(spec, {})))
        else:
            raise TypeError(f"reward function {spec!r} is neither a callable nor a name")
    return out


class GRPOTrainer(Trainer):
    """TRL-style entry point: `GRPOTrainer(model, reward_funcs, args, train_dataset).train()`."""

    headline = {"reward": ("reward/mean", "{:.3f}"), "len": ("completion/len_mean", "{:.0f}"),
                "acc": ("eval/accuracy", "{:.2f}"), "s/step": ("perf/step_s", "{:.2f}")}
    step_logs = Trainer.step_logs + (COMPLETIONS_LOG, GROUPS_LOG)

    def __init__(self, model, reward_funcs, args: GRPOConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, callbacks=None, peft_config=None,
                 eval_fn: Callable[[object, object], dict] | None = None, engine_factory: Callable | None = None):
        args = args or GRPOConfig()
        super().__init__(args, eval_fn, callbacks)
        seed_everything(args.seed)
        self.reward_funcs = resolve_reward_funcs(
            reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs], args.reward_kwargs)
        if not self.reward_funcs:
            raise ValueError("no reward functions given")
        self.required_columns = tuple(dict.fromkeys(c for f in self.reward_funcs for c in needed_columns(f)))
        """Dataset columns the reward functions read: every row must have each (checked once per row, at load)."""
        w = args.reward_weights or [1.0] * len(self.reward_funcs)
        if len(w) != len(self.reward_funcs):
            raise ValueError(f"{len(w)} reward_weights for {len(self.reward_funcs)} reward functions")
        self.reward_weights = torch.tensor(w, dtype=torch.float32)                  # [F]
        self.streaming = is_stream(train_dataset)
        self.rows: dict[int, dict] | list[dict] = self._read_rows(train_dataset)

        self.model, self.tokenizer = setup_model(args, model, processing_class, peft_config)
        if args.disable_dropout:
            disable_dropout(self.model)
        if args.sync_ref_model and hasattr(self.model, "peft_config"):
            raise ValueError("sync_ref_model needs a separate reference model; with LoRA the reference is the "
                             "base model with adapters disabled")
        self.prompt_ids = {} if self.streaming else self._encode_all()
        self._max_steps = args.max_steps or self._steps_for_epochs()  # a set max_steps wins, as in TRL
        self.learner = Learner(args, self.model, self.tokenizer.pad_token_id, self.generator,
                               args.optimizer_steps_per_step * self._max_steps)
        self.ref_model, self.optimizer, self.scheduler = (self.learner.ref_model, self.learner.optimizer,
                                                          self.learner.scheduler)
        self.engine_factory = engine_factory or HFEngine.for_model
        """(model, tokenizer, max_batch) -> an Engine; rollout workers build theirs with it too."""
        self.engine = self.engine_factory(self.model, self.tokenizer, args.generation_max_batch)
        self.sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.max_completion_length,
                                       logprobs=args.max_staleness > 0)
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
        self.learner.recorder = self.recorder  # groups.jsonl takes the update's own per-token values
        self.pipeline = None
        """With args.distributed: the Ray layer (rollout workers, reward workers, learners, scheduler)."""
        if args.distributed:
            from ..dist import Pipeline
            self.pipeline = Pipeline(self)

    @property
    def max_steps(self) -> int:
        return self._max_steps

    def _read_rows(self, train_dataset) -> dict[int, dict] | list[dict]:
        """The training rows, checked against the reward functions' columns: every row has each column they read
        (a row without one would only be counted in `reward/data_errors`). A streaming dataset's rows arrive as
        training reads them (StreamSampler): none is kept now, the first is checked now, each one as it is read."""
        if not self.streaming:
            rows = load_rows(train_dataset, self.args.prompt_column)
            check_columns(self.reward_funcs, {k: None for k in rows[0]})
            rows = [has_columns(r, i, self.required_columns) for i, r in enumerate(rows)]
            check_not_all_null(self.reward_funcs, rows)
            return rows
        if iter(train_dataset) is train_dataset:
            raise ValueError(f"train_dataset is a {type(train_dataset).__name__}, which can be read only once, and "
                             "training reads its rows again every epoch: pass a list, a datasets.Dataset, or "
                             "datasets.IterableDataset.from_generator(a function that makes the generator)")
        first = check_row(next(iter(train_dataset), None) or {}, 0, self.args.prompt_column)
        check_columns(self.reward_funcs, {k: None for k in first})
        return {}

    def trainer_state(self, step: int):
        """The transformers TrainerState a reward function gets as `trainer_state` at GRPO step `step`, as TRL
        passes it (global_step, max_steps, epoch: passes over the prompts so far; None for a streaming dataset)."""
        from transformers import TrainerState
        epoch = None if self.streaming else step * self.args.prompts_per_step / len(self.rows)
        return TrainerState(global_step=step, max_steps=self.max_steps, epoch=epoch)

    def _steps_for_epochs(self) -> int:
        """TRL's num_train_epochs: steps of B prompts that make that many passes over the prompts."""
        if self.streaming:
            raise ValueError("num_train_epochs needs a dataset of known length; with a streaming dataset set max_steps")
        return max(1, math.ceil(self.args.num_train_epochs * len(self.rows) / self.args.prompts_per_step))

    def _encode_all(self) -> list[list[int]]:
        return [self._encode(i, r) for i, r in enumerate(self.rows)]

    def _encode(self, i: int, row: dict) -> list[int]:
        """Prompt token ids of dataset row i. An empty prompt, one too long for the context (refused untokenized
        when its length in characters proves it: aha.data.length) or text the tokenizer cannot take is an error."""
        ctx, m = context_length(self.model), self.args.max_completion_length
        too_long = f"with max_completion_length {m} it exceeds the model's context of {ctx}"
        try:
            ids = encode_prompt(self.tokenizer, row["prompt"], max_tokens=ctx - m if ctx else None)
        except PromptTooLong as e:
            raise ValueError(f"prompt {i} has {e}; {too_long}") from None
        except TypeError as e:  # e.g. "TextEncodeInput must be Union[...]"
            raise ValueError(f"dataset row {i}: the tokenizer cannot take column '{self.args.prompt_column}' "
                             f"({type(e).__name__}: {e})") from e
        if len(ids) == 0:
            raise ValueError(f"dataset row {i}: the prompt is empty")
        if ctx and len(ids) + m > ctx:
            raise ValueError(f"prompt {i} has {len(ids)} tokens; {too_long}")
        return ids

    def _admit(self, i: int, row) -> None:
        """A row read from a streaming dataset: checked (the reward functions' columns too), encoded, kept until
        its step is done."""
        self.rows[i] = check_row(row, i, self.args.prompt_column, self.required_columns)
        self.prompt_ids[i] = self._encode(i, self.rows[i])

    # ------------------------------------------------------------------ the step
    def step(self) -> dict[str, float]:
        """One GRPO step: B prompts -> B*G completions -> rewards -> advantages -> update -> new weights."""
        t0 = time.perf_counter()
        with self.autocast():
            batch, metrics = self.pipeline.next_batch() if self.pipeline else self.next_batch()
            t1 = time.perf_counter()
            sums, update_metrics = (self.pipeline or self.learner).update(batch)
        if self.pipeline:
            metrics.update(self.pipeline.publish())
        else:
            self.engine.update_weights(self.model, self.learner.version)
        t2 = time.perf_counter()

        lengths = torch.tensor([len(c) for c in batch.completion_ids], dtype=torch.float32)  # [N]
        t_gen = metrics.pop("perf/generate_s")
        metrics.update(update_metrics)
        metrics.update({
            "completion/len_mean": lengths.mean().item(), "completion/len_min": lengths.min().item(),
            "completion/len_max": lengths.max().item(),
            "completion/truncated_frac": batch.truncated.float().mean().item(),
            "lr": metrics.pop("lr") if "lr" in metrics else self.scheduler.get_last_lr()[0],
            "perf/step_s": t2 - t0, "perf/generate_s": t_gen, "perf/train_s": t2 - t1,
            "perf/gen_tokens_per_s": lengths.sum().item() / max(t_gen, TIME_FLOOR_S),
            "perf/train_tokens_per_s": sums.processed / max(t2 - t1, TIME_FLOOR_S) if sums.processed else math.nan,
        })
        metrics.update(self._behaviour(batch, lengths))
        self.last_batch = batch
        return metrics

    def next_batch(self) -> tuple[GRPOBatch, dict[str, float]]:
        """This process's rollouts for one step (the Ray layer has its own, with the same `assemble`)."""
        def sample(k: int) -> list[tuple[GRPOBatch, dict[str, float]]]:
            return [self.rollout(self.sampler.take(k))]
        t0 = time.perf_counter()
        batch, metrics = self.assemble(sample(self.args.prompts_per_step), sample)
        if self.streaming:  # the batch holds what it needs: a stream's rows are not kept
            self.rows.clear()
            self.prompt_ids.clear()
        metrics["perf/generate_s"] = time.perf_counter() - t0 - metrics.pop("perf/score_s")
        return batch, metrics

    def assemble(self, parts: list[tuple[GRPOBatch, dict[str, float]]],
                 more: Callable[[int], list[tuple[GRPOBatch, dict[str, float]]]]) -> tuple[GRPOBatch, dict[str, float]]:
        """Scored groups -> the step's training batch with its advantages. With dynamic_sampling (DAPO), groups
        whose rewards have no spread (they give no policy gradient) are dropped and `more(k)` samples k more
        prompts, at most dynamic_sampling_max_rounds times; surplus groups are left out, and a batch still short
        after the last round is filled with groups without spread (as if dynamic sampling were off for them).
        Reward metrics describe every group sampled this step; `sampling/*` counts what was dropped."""
        a, B = self.args, self.args.prompts_per_step
        batch, rounds = GRPOBatch.cat([b for b, _ in parts]), 0
        keep = list(range(len(batch.rows)))
        while a.dynamic_sampling:
            keep = self._spread_groups(batch)
            if len(keep) >= B or rounds == a.dynamic_sampling_max_rounds:
                break
            rounds += 1
            new = more(B - len(keep))
            parts, batch = parts + new, GRPOBatch.cat([batch] + [b for b, _ in new])
        metrics = merge_reward_metrics(self.reward_funcs, [m for _, m in parts], batch.rewards_per_func)
        self._check_failures(metrics)
        ok = batch.rewards[torch.isfinite(batch.rewards)]
        metrics.update({"reward/mean": ok.mean().item() if len(ok) else float("nan"),
                        "reward/std": ok.std().item() if len(ok) > 1 else float("nan"),
                        "reward/excluded_frac": 1 - len(ok) / len(batch.rewards)})
        if a.dynamic_sampling:
            kept = set(keep)
            chosen = (keep + [g for g in range(len(batch.rows)) if g not in kept])[:B]
            metrics.update({"sampling/dropped_groups": float(len(batch.rows) - B), "sampling/rounds": float(rounds),
                            "sampling/groups": float(min(len(keep), B))})
            batch = batch.groups(chosen)
        batch.advantages, adv_metrics = algos.compute_advantages(a.advantage_estimator, batch.rewards,
                                                                 a.num_generations)  # [N]
        return batch, {**metrics, **adv_metrics}

    def _spread_groups(self, batch: GRPOBatch) -> list[int]:
        """Groups with at least two rewards that differ: the ones that carry a learning signal."""
        g = algos.group_stats(batch.rewards, batch.group_size)
        return ((g.count.squeeze(-1) >= 2) & (g.std.squeeze(-1) > 0)).nonzero().squeeze(-1).tolist()

    def rollout(self, idx: list[int]) -> tuple[GRPOBatch, dict[str, float]]:
        """Generate G completions for each of the B prompts `idx` and score them (advantages: `assemble`).
        `perf/score_s` is the scoring time left after generation ended; `perf/reward_s` all of it."""
        rows, prompts = [self.rows[i] for i in idx], [self.prompt_ids[i] for i in idx]
        if (self.args.stream_rewards and len(idx) > 1
                and "on_group" in inspect.signature(self.engine.generate).parameters):  # an optional Engine argument
            return self._streamed_rollout(rows, prompts)
        out = self.engine.generate(prompts, self.args.num_generations, self.sampling, self.generator)
        t0 = time.perf_counter()
        batch, metrics = self.score(rows, prompts, out)
        scoring = time.perf_counter() - t0
        return batch, {**metrics, "perf/score_s": scoring, "perf/reward_s": scoring}

    def _streamed_rollout(self, rows: list[dict], prompts: list[list[int]]) -> tuple[GRPOBatch, dict[str, float]]:
        """`rollout` with each group scored on a helper thread while this thread decodes the rest. The decode stays
        here: torch's small CPU ops ran about 1.45x slower on a thread other than the main one (BENCHMARKS.md)."""
        finished: queue.Queue = queue.Queue()
        parts: list = [None] * len(rows)
        result: dict = {"scoring": 0.0}

        def score_groups_as_they_come() -> None:
            try:
                while (item := finished.get()) is not None:  # the end mark always comes: put in a finally below
                    t0 = time.perf_counter()
                    i, group = item
                    parts[i] = self.score([rows[i]], [prompts[i]], group)
                    result["scoring"] += time.perf_counter() - t0
            except BaseException as e:  # re-raised on the calling thread
                result["error"] = e

        scorer = threading.Thread(target=score_groups_as_they_come, daemon=True, name="aha-score")
        scorer.start()
        try:
            self.engine.generate(prompts, self.args.num_generations, self.sampling, self.generator,
                                 on_group=lambda i, r: finished.put((i, r)))
        finally:
            finished.put(None)
        end = time.perf_counter()
        scorer.join(timeout=len(rows) * max(len(self.reward_funcs), 1) * self.args.reward_timeout + SCORER_GRACE_S)
        if scorer.is_alive():
            raise TimeoutError(f"scoring {len(rows)} groups did not end within reward_timeout="
                               f"{self.args.reward_timeout} s per call and group ({SCORER_GRACE_S:g} s of grace)")
        if "error" in result:
            raise result["error"]
        if any(p is None for p in parts):
            raise RuntimeError(f"the engine reported no finished completions for prompts "
                               f"{[i for i, p in enumerate(parts) if p is None]}")
        batch = GRPOBatch.cat([b for b, _ in parts])
        metrics = merge_reward_metrics(self.reward_funcs, [m for _, m in parts], batch.rewards_per_func)
        return batch, {**metrics, "perf/score_s": time.perf_counter() - end, "perf/reward_s": result["scoring"]}

    def score(self, rows: list[dict], prompt_ids: list[list[int]], out, texts: list[str] | None = None
              ) -> tuple[GRPOBatch, dict[str, float]]:
        """A Rollout of G completions per row -> the scored GRPOBatch (advantages 0 until `assemble`)."""
        texts = texts if texts is not None else self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
        state = self.trainer_state(self.step_count)
        rpf, metrics = score_groups(self.reward_funcs, rows, texts, self.args.num_generations, out.completion_ids,
                                    state, self.args.reward_timeout)                # [N,F]
        return self.make_batch(rows, prompt_ids, out, texts, rpf), metrics

    def make_batch(self, rows: list[dict], prompt_ids: list[list[int]], out, texts: list[str], rpf: Tensor) -> GRPOBatch:
        G, N = self.args.num_generations, len(texts)
        behaviour = None if out.logprobs is None else [torch.tensor(x, dtype=torch.float32) for x in out.logprobs]
        return GRPOBatch(rows=rows, prompt_ids=[p for p in prompt_ids for _ in range(G)],
                         completion_ids=out.completion_ids, texts=texts, truncated=torch.tensor(out.truncated),
                         rewards_per_func=rpf, rewards=self._combine(rpf), advantages=torch.zeros(N),
                         versions=torch.full((N,), out.version, dtype=torch.long), behaviour_logprobs=behaviour)

    def train(self, resume_from_checkpoint: str | bool | None = None) -> dict[str, float]:
        try:
            return super().train(resume_from_checkpoint)
        finally:
            if self.pipeline:  # the final weights come home; actors (and a Ray started here) end
                self.pipeline.close()

    def _state(self) -> dict:
        state = super()._state()
        if self.pipeline:  # prompts of steps already in flight are drawn again after a resume
            state["sampler"] = self.pipeline.sampler_state()
        return state

    def save_checkpoint(self):
        if self.pipeline:
            self.pipeline.pull()
        return super().save_checkpoint()

    def _evaluate(self) -> dict[str, float]:
        if self.pipeline:
            self.pipeline.pull()
        return super()._evaluate()

    def _restore(self, path) -> None:
        super()._restore(path)
        self.learner.version = self.step_count
        self.engine.update_weights(self.model, self.step_count)
        if self.pipeline:
            self.pipeline.restored()

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
        from ..rewards.scoring import NoUsableValue
        for name in self.fail_streak:
            self.fail_streak[name] = self.fail_streak[name] + 1 if metrics[f"reward/{name}/failed"] else 0
            if self.args.reward_fail_steps and self.fail_streak[name] >= self.args.reward_fail_steps:
                last = last_failure(name)  # an exit (SystemExit, KeyboardInterrupt) from a reward counts as a raise
                what = "gave no usable value" if isinstance(last, NoUsableValue) else "raised or timed out"
                raise RuntimeError(f"reward function {name} {what} on {self.fail_streak[name]} consecutive steps "
                                   f"(last: {last!r}); fix it, or set reward_fail_steps=0 to train on without it"
                                   ) from last

    def _combine(self, rpf: Tensor) -> Tensor:
        """Weighted sum over functions, NaN ignored; NaN only when no function gave a value."""
        finite = torch.isfinite(rpf)                                                 # [N,F]
        total = (torch.where(finite, rpf, torch.zeros_like(rpf)) * self.reward_weights).sum(-1)  # [N]
        return torch.where(finite.any(-1), total, torch.full_like(total, float("nan")))  # [N]

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
