"""The GRPO loop: generate a group per prompt, score, group-relative advantages, clipped update.

`GRPOTrainer.step` is the whole algorithm and reads top to bottom; everything it calls is a box of
its own: the experience box (aha.rollout.experience: engine, scoring, advantages), the learner (learner.py:
log-probabilities, the clipped update), checkpoints. What flows through one step is a `GRPOBatch`
(batch.py); what the update adds up is `LossSums`. With workers (args.distributed), the same calls go to the
Ray pipeline built from the experience box and the learner.

Where this departs from the DeepSeekMath paper, by default (each a config switch):
- loss aggregation is DAPO's token mean over the batch (`loss_type="dapo"`), not the per-sequence mean;
- beta = 0: no KL term and no reference model (`beta > 0` restores both);
- a single pass over each batch (`num_iterations=1`), so the ratio is 1 and no old-policy forward runs.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch
from torch import Tensor

from ..behaviour import behaviour_metrics
from ..config import GRPOConfig
from ..data import PromptTooLong, encode_prompt, load_rows
from ..envs import Agent
from ..envs.base import PLACEHOLDER_PROMPT
from ..metrics import append_jsonl
from ..models import context_length, disable_dropout, setup_model
from ..rewards import REWARDS, check_columns, completion_text, get_reward, reward_name, score_groups
from ..rewards.models import ModelReward, SequenceClassifierReward, is_reward_model
from ..rewards.prm import PRMReward
from ..rollout import SamplingParams
from ..rollout.experience import Experience, episode_inputs
from ..rollout.turns import greedy_episodes
from ..rollout.prompts import PromptSource
from ..batch import GRPOBatch, LossSums
from .learner import Learner
from .loop import Trainer, seed_everything
from .records import GROUPS_LOG, GroupRecorder
from .callbacks import TrainOutput

__all__ = ["GRPOTrainer", "GRPOBatch", "LossSums", "Learner"]

TIME_FLOOR_S = 1e-9
"""Lower bound on a measured duration before dividing by it (a phase that did no work)."""
COMPLETIONS_LOG = "completions.jsonl"


def import_reward(spec: str, what: str = "reward function") -> Callable:
    """"module:function" -> the function (or class); the module is looked up on sys.path and then in the current
    directory (so `reward_funcs=[myrew:exact]` finds ./myrew.py; `tools` and `environment` too). Either missing is
    one clear error that names `what` was asked for."""
    import importlib
    import os
    import sys
    module, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module.split(".")[0] or os.getcwd() in sys.path:
            raise ValueError(f"{what} {spec!r}: cannot import module {module!r}: {e}") from e
        sys.path.append(os.getcwd())
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e2:
            raise ValueError(f"{what} {spec!r}: no module {module!r} on the Python path or in the current "
                             f"directory ({os.getcwd()})") from e2
        finally:
            sys.path.remove(os.getcwd())
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ValueError(f"{what} {spec!r}: module {module!r} ({mod.__file__}) has no function {attr!r}")
    return fn


def make_agent(args: GRPOConfig, tools: list | None, environment_factory) -> Agent | None:
    """The run's tools and environments (TRL's `tools=` and `environment_factory=`, else the config's
    module:function names), or None for a run without them."""
    tools = list(tools) if tools is not None else [import_reward(t, "tool") for t in args.tools]
    if environment_factory is None and args.environment:
        environment_factory = import_reward(args.environment, "environment")
    if not tools and environment_factory is None:
        return None
    return Agent(tools, environment_factory, args.tool_timeout)


def resolve_reward_funcs(specs: list, kwargs: dict | None = None, processing_classes=None) -> list[Callable]:
    """Callables pass through; names come from aha.rewards, built with their `kwargs[name]`; "module:function" is
    imported; a model (a hub id "org/name", a directory or a sequence-classification module) is TRL's reward
    model, read with its entry of `processing_classes` (TRL's reward_processing_classes: one tokenizer, or one
    per function; None: the model's own). A `kwargs` entry that no name uses, or that is not a mapping, is an error."""
    names = {spec for spec in specs if isinstance(spec, str) and ":" not in spec}
    for name, given in (kwargs or {}).items():
        if name not in names:
            raise ValueError(f"reward_kwargs has {name!r}, but no reward function is built by that name (by name: "
                             f"{sorted(names) or 'none; a task builds its own rewards, set reward_funcs to choose'})")
        if not isinstance(given, dict):
            raise ValueError(f"reward_kwargs[{name!r}] must be a mapping of argument -> value, got {given!r}")
    tokenizers = ([None] * len(specs) if processing_classes is None else list(processing_classes)
                  if isinstance(processing_classes, (list, tuple)) else [processing_classes])
    if len(tokenizers) != len(specs):
        raise ValueError(f"{len(tokenizers)} reward_processing_classes for {len(specs)} reward functions (one per "
                         "function; entries for functions that are not models are ignored)")
    out = []
    for spec, tokenizer in zip(specs, tokenizers):
        if is_reward_model(spec) and not (isinstance(spec, str) and spec in REWARDS):
            out.append(SequenceClassifierReward(spec, tokenizer))
        elif callable(spec):
            out.append(spec)
        elif isinstance(spec, str) and ":" in spec:
            out.append(import_reward(spec))
        elif isinstance(spec, str):
            out.append(get_reward(spec, **(kwargs or {}).get(spec, {})))
        else:
            raise TypeError(f"reward function {spec!r} is neither a callable nor a name")
    return out


class GRPOTrainer(Trainer):
    """TRL-style entry point: `GRPOTrainer(model, reward_funcs, args, train_dataset).train()`; an agent's with
    `tools=[...]` and/or `environment_factory=...` (aha.envs, TRL's contract)."""

    headline = {"reward": ("reward/mean", "{:.3f}"), "len": ("completion/len_mean", "{:.0f}"),
                "acc": ("eval/accuracy", "{:.2f}"), "s/step": ("perf/step_s", "{:.2f}")}
    step_logs = Trainer.step_logs + (COMPLETIONS_LOG, GROUPS_LOG)

    def __init__(self, model, reward_funcs=None, args: GRPOConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, callbacks=None, peft_config=None,
                 eval_fn: Callable[[object, object], dict] | None = None, engine_factory: Callable | None = None,
                 tools: list[Callable] | None = None, environment_factory=None, reward_processing_classes=None):
        args = args or GRPOConfig()
        super().__init__(args, eval_fn, callbacks)
        seed_everything(args.seed)
        self.agent = make_agent(args, tools, environment_factory)
        self.reward_funcs, self.reward_weights = self._rewards(reward_funcs, reward_processing_classes)  # [F]
        self.prompts = PromptSource(self._training_rows(train_dataset), self._prompt_column(), args.seed,
                                    args.shuffle_dataset, self.reward_funcs, args.balance_by)
        self.streaming = self.prompts.streaming

        self.model, self.tokenizer = setup_model(args, model, processing_class, peft_config)
        for held in (f for f in self.reward_funcs if isinstance(f, ModelReward)):  # a PRM, reward model or judge
            held.to(next(self.model.parameters()).device)
        if args.disable_dropout:
            disable_dropout(self.model)
        if args.sync_ref_model and hasattr(self.model, "peft_config"):
            raise ValueError("sync_ref_model needs a separate reference model; with LoRA the reference is the "
                             "base model with adapters disabled")
        if self.agent is None:  # an agent's prompts are encoded per episode, after its environment's reset
            self.prompts.encode_with(self._encode)
        self._max_steps = args.max_steps or self._steps_for_epochs()  # a set max_steps wins, as in TRL
        self.learner = Learner(args, self.model, self.tokenizer.pad_token_id, self.generator,
                               args.optimizer_steps_per_step * self._max_steps)
        self.ref_model, self.optimizer, self.scheduler = (self.learner.ref_model, self.learner.optimizer,
                                                          self.learner.scheduler)
        self.experience = Experience(args, self.model, self.tokenizer, self.prompts, self.reward_funcs,
                                     self.reward_weights, self.generator, self._max_steps, engine_factory, self.agent)
        if eval_dataset is not None:
            self.eval_fn = self._reward_eval(load_rows(eval_dataset, args.prompt_column), eval_fn)
        self.last_batch: GRPOBatch | None = None
        """The latest step's rollouts, for logging completions."""
        self.recorder = GroupRecorder(self.run_dir, args.log_groups_steps, args.log_groups_max,
                                      args.log_groups_max_mb, args.num_generations, last_step=self._max_steps)
        self.learner.recorder = self.recorder  # groups.jsonl takes the update's own per-token values
        self.rollouts, self.updates = self.experience, self.learner
        """Where the step's batch comes from and where it is trained: this process's experience box and learner,
        or with workers (args.distributed) the Ray pipeline built from the two, which answers both calls."""
        self.pipeline = None
        if args.distributed:
            from ..dist import Pipeline
            self.pipeline = self.rollouts = self.updates = Pipeline(self.experience, self.learner)

    def _rewards(self, reward_funcs, processing_classes=None) -> tuple[list[Callable], torch.Tensor]:
        """The reward functions, then the PRM of prm_model (weight prm_weight), then each environment class's
        get_reward (weight 1: reward_weights weigh the reward_funcs only, as TRL's), and their weights [F]."""
        a = self.args
        given = [] if reward_funcs is None else reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        funcs = resolve_reward_funcs(given, a.reward_kwargs, processing_classes)
        held = [reward_name(f) for f in funcs if isinstance(f, ModelReward)]
        if held and a.num_reward_workers:
            raise ValueError(f"reward model {held[0]} runs in the driver on the policy's device, as prm_model does: "
                             "set num_reward_workers=0 (reward workers are one-CPU actors without a GPU, and each "
                             "would hold its own copy of the model)")
        w = a.reward_weights or [1.0] * len(funcs)
        if len(w) != len(funcs):
            raise ValueError(f"{len(w)} reward_weights for {len(funcs)} reward functions" + (
                " (the PRM's weight is prm_weight, not one of them)" if a.prm_model else ""))
        self.prm = PRMReward(a.prm_model, a.prm_step_separator, a.prm_batch_size) if a.prm_model else None
        """The process reward model of prm_model, run on the policy's device; None without one."""
        prm, prm_w = ([self.prm], [a.prm_weight]) if self.prm else ([], [])
        env_rewards = self.agent.rewards if self.agent is not None else []
        if not funcs and not env_rewards and not prm:
            raise ValueError("no reward functions given" + (
                " (and no environment defines get_reward)" if self.agent is not None else ""))
        return funcs + prm + env_rewards, torch.tensor(w + prm_w + [1.0] * len(env_rewards), dtype=torch.float32)

    def _training_rows(self, train_dataset):
        """The dataset; with an environment that owns its data and none given, one prompt's worth of placeholder
        rows (an empty user message: reset writes the prompt), drawn again every step, as TRL's."""
        if train_dataset is not None or self.agent is None or not self.agent.has_environments:
            return train_dataset
        if self.agent.multi:
            raise ValueError("a dict of environment factories needs a train_dataset whose `environment` column "
                             "routes each row to one (or pass a single factory)")
        if self.args.num_train_epochs is not None and not self.args.max_steps:
            raise ValueError("the environment owns the data (no train_dataset): set max_steps, not num_train_epochs")
        return [{"prompt": list(PLACEHOLDER_PROMPT)} for _ in range(self.args.prompts_per_step)]

    def _prompt_column(self) -> str | None:
        """An environment may write the whole prompt in reset: then a row needs none (TRL's placeholder stands in)."""
        environments = self.agent is not None and self.agent.has_environments
        return None if environments and self.args.prompt_column == "prompt" else self.args.prompt_column

    @property
    def max_steps(self) -> int:
        return self._max_steps

    @property
    def engine(self):
        """The experience box's generation engine (it samples with the policy's weights)."""
        return self.experience.generation.engine

    @engine.setter
    def engine(self, engine) -> None:
        self.experience.generation.engine = engine

    @property
    def sampler(self):
        """The order prompts are drawn in (the experience box's)."""
        return self.prompts.sampler

    @sampler.setter
    def sampler(self, sampler) -> None:
        self.prompts.sampler = sampler

    @property
    def rows(self):
        """The training rows (a stream's: only those read and not yet drawn)."""
        return self.prompts.rows

    @property
    def prompt_ids(self):
        return self.prompts.prompt_ids

    def trainer_state(self, step: int):
        """The transformers TrainerState reward functions get at GRPO step `step` (see Experience.trainer_state)."""
        return self.experience.trainer_state(step)

    def _steps_for_epochs(self) -> int:
        """TRL's num_train_epochs: steps of B prompts that make that many passes over the prompts."""
        if self.streaming:
            raise ValueError("num_train_epochs needs a dataset of known length; with a streaming dataset set max_steps")
        return max(1, math.ceil(self.args.num_train_epochs * len(self.prompts) / self.args.prompts_per_step))

    def _encode(self, i: int, row: dict) -> list[int]:
        """Prompt token ids of dataset row i. An empty prompt, one too long for the context (refused untokenized
        when its length in characters proves it: aha.data.length) or text the tokenizer cannot take is an error."""
        ctx, m = context_length(self.model), self.args.max_completion_length
        too_long = f"with max_completion_length {m} it exceeds the model's context of {ctx}"
        try:
            ids = encode_prompt(self.tokenizer, row["prompt"], max_tokens=ctx - m if ctx else None,
                                template_kwargs=self.args.chat_template_kwargs)
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

    # ------------------------------------------------------------------ the step
    def step(self) -> dict[str, float]:
        """One GRPO step: B prompts -> B*G episodes -> rewards -> advantages -> update -> new weights."""
        t0 = time.perf_counter()
        with self.autocast():
            batch, metrics = self.rollouts.next_batch(self.step_count)
            t1 = time.perf_counter()
            sums, update_metrics = self.updates.update(batch)
        metrics.update(self.rollouts.publish(self.step_count + 1))  # the weights after this step: version step + 1
        t2 = time.perf_counter()

        lengths = batch.model_tokens.float()                                         # [N] the model's tokens
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
        """This step's batch from the experience box (as `step` gets it), without training on it."""
        return self.rollouts.next_batch(self.step_count)

    def train(self, resume_from_checkpoint: str | bool | None = None) -> TrainOutput:
        try:
            return super().train(resume_from_checkpoint)
        finally:  # with workers: the final weights come home; actors (and a Ray started here) end
            self.rollouts.close()

    def _state(self) -> dict:
        state = super()._state()
        state["sampler"] = self.rollouts.sampler_state()  # prompts of steps in flight are drawn again after a resume
        state["entropy"] = self.learner.entropy_state()  # the adaptive entropy coefficient, as TRL's checkpoints hold it
        state["share_prompts"] = self.learner.share  # share_prompts: auto, as decided on the run's first batch
        return state

    def _load_state(self, state: dict) -> None:
        self.learner.load_entropy_state(state.get("entropy"))
        if self.args.share_prompts is None:  # the run's own decision, not one taken again on the next batch
            self.learner.share = state.get("share_prompts")

    def save_checkpoint(self):
        self.rollouts.pull()  # with remote learners: their weights, optimizer and schedule
        return super().save_checkpoint()

    def _evaluate(self) -> dict[str, float]:
        self.rollouts.pull()
        return super()._evaluate()

    def _restore(self, path) -> None:
        super()._restore(path)
        self.learner.version = self.step_count
        self.rollouts.restored(self.step_count)

    def _reward_eval(self, rows: list[dict], eval_fn: Callable | None) -> Callable:
        """An eval hook for `eval_dataset`: greedy completions (an agent's: greedy episodes) scored with the reward
        functions (`eval/reward/mean`, `eval/reward/<name>/mean`), beside what `eval_fn` reports."""
        check_columns(self.reward_funcs, {k: None for k in rows[0]})
        a = self.args
        ids = None if self.agent else [encode_prompt(self.tokenizer, r["prompt"], template_kwargs=a.chat_template_kwargs)
                                        for r in rows]
        greedy = SamplingParams(0.0, 1.0, 0, a.max_completion_length)

        def evaluate(model, tokenizer) -> dict[str, float]:
            if self.agent is None:
                out = self.engine.generate(ids, 1, greedy)
            else:
                out, envs = greedy_episodes(model, tokenizer, self.agent, rows, a.max_completion_length,
                                            a.max_tool_calling_iterations, a.chat_template_kwargs)
                out.environments = envs if self.agent.has_environments else None
            texts = tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
            rpf, scored = score_groups(self.reward_funcs, rows, texts, 1, out.completion_ids,
                                       timeout_s=a.reward_timeout, episodes=episode_inputs(out))  # [E,F]
            total = self.experience.combine(rpf)                                     # [E]
            metrics = {k: v for k, v in scored.items() if k.endswith("/mean")}            # reward/<name>/mean
            metrics["reward/mean"] = total[total.isfinite()].mean().item() if total.isfinite().any() else math.nan
            return {**(eval_fn(model, tokenizer) if eval_fn else {}), **metrics}
        return evaluate

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
        if not n or b is None or self.step_count % n and self.step_count != self.max_steps:  # the last step too
            return
        names, prompts, G = [reward_name(f) for f in self.reward_funcs], b.prompts, self.args.num_generations
        nan_to_none = lambda v: None if v != v else float(v)  # noqa: E731
        rows = [{"step": self.step_count, "group": i // G, "prompt": prompts[i], "answer": b.rows[i // G].get("answer"),
                 "completion": b.texts[i],
                 "rewards": dict(zip(names, map(nan_to_none, b.rewards_per_func[i].tolist()))),
                 "reward": nan_to_none(b.rewards[i]), "advantage": float(b.advantages[i])} for i in range(len(b.texts))]
        append_jsonl(self.run_dir / COMPLETIONS_LOG, rows)
        self.logger.log_table(self.step_count, "completions", rows)
        shown = self.args.num_completions_to_print
        for i in range(len(b.texts) if shown is None else min(shown, len(b.texts))):
            bar.write(f"[step {self.step_count}] reward={float(b.rewards[i]):.3f} | {b.texts[i][:200]!r}")
