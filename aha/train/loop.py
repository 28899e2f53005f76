"""What every training loop shares: the step loop, prompt order, optimizer, logging, evaluation, checkpoints,
resume, stop signals."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import torch

from ..config import TrainConfig, save_config
from ..config.resume import check_resume, config_record, read_saved_config
from ..data.sampler import PromptSampler, StreamSampler
from ..metrics import append_jsonl, keep_steps_through, make_logger
from ..models import interpolate_weights, save_model, weight_snapshot
from ..models.load import autocast, seed_everything
from .callbacks import Callbacks, TrainOutput, format_metrics, save_metrics
from .checkpoint import (MARKER, REFERENCE, CorruptCheckpointError, checkpoint_info, list_checkpoints, load_checkpoint,
                         save_checkpoint)
from .rundir import MODEL_FILES, check_fresh, check_inputs, check_writable, files_beside, lock_run_dir, mark_run

log = logging.getLogger("aha.train")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Signals that end a run cleanly: finish the step, write a checkpoint, exit."""
SIGNAL_EXIT_BASE = 128
"""Shell convention: a process ended by signal N exits with 128 + N (SIGINT 130, SIGTERM 143)."""
STDERR_FD = 2
"""Where the signal handler writes its one-line note."""


class Preempted(SystemExit):
    """A stop signal ended `train()`; `code` is 128 + the signal number, str() the one-line message."""

    def __init__(self, signum: int, message: str):
        super().__init__(SIGNAL_EXIT_BASE + signum)
        self.signum, self.message = signum, message

    def __str__(self) -> str:
        return self.message


HELD_OUT_LOG = "held_out.jsonl"
"""The greedy answers to the same few held-out problems at every evaluation (when the eval hook keeps them)."""


class NothingToTrainError(ValueError):
    """A resume found the run already past max_steps: nothing was trained and no file was changed."""


def build_optimizer(cfg: TrainConfig, model, total_steps: int):
    """AdamW over trainable parameters, warmup then constant/cosine/linear. Weight decay, when set, applies to
    matrices only: biases and norm scales (1-D) are left out, as transformers' Trainer leaves them."""
    from transformers import get_scheduler
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    groups = [{"params": params}] if not cfg.weight_decay else [
        {"params": [p for p in params if p.dim() >= 2]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.learning_rate,
                            betas=(cfg.adam_beta1, cfg.adam_beta2), weight_decay=cfg.weight_decay)
    name = {"constant": "constant_with_warmup"}.get(cfg.lr_scheduler_type, cfg.lr_scheduler_type)
    warmup = cfg.warmup_steps or round(cfg.warmup_ratio * total_steps)
    sched = get_scheduler(name, opt, num_warmup_steps=warmup,
                          num_training_steps=max(total_steps, 1))
    return opt, sched


class NonFiniteError(FloatingPointError):
    """A loss or gradient norm was NaN or infinite; the weights were left as they were."""


def optimizer_step(cfg: TrainConfig, model, opt, sched, loss: float = 0.0,
                   reduce: Callable[[list, float], float] | None = None) -> float:
    """Clip, step, schedule, zero; returns the pre-clip gradient norm, or NaN for a skipped update.

    Gradients are zeroed to tensors, not None, so AdamW moves every parameter on every step even
    when a skipped batch left its gradient at 0 (as if the zero loss had been backpropagated).
    A non-finite `loss` (the summed micro-batch losses of this update) or gradient norm never
    reaches the weights: with on_nonfinite="stop" it raises NonFiniteError; with "skip" the
    gradients are zeroed, neither the optimizer (no moment update either) nor the schedule is
    stepped, and NaN is returned so the caller can count it. `reduce(params, loss)`, when given, sums
    the gradients and the loss over data-parallel ranks (and returns the summed loss) before all that.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if reduce is not None:
        loss = reduce(params, loss)
    norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")))
    bad = [f"{name} ({value})" for name, value in (("loss", loss), ("grad norm", norm)) if not math.isfinite(value)]
    if bad:
        if cfg.on_nonfinite == "stop":
            raise NonFiniteError("non-finite " + " and ".join(bad))
        opt.zero_grad(set_to_none=False)
        return math.nan
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=False)
    # autocast caches each weight's bf16/fp16 copy until its outermost context exits, and a GRPO step runs
    # several updates inside one: without this, the next minibatch's forward would see the old weights
    torch.clear_autocast_cache()
    return norm


class Trainer(abc.ABC):
    """Subclasses set model, tokenizer, optimizer, scheduler, sampler, generator and define step()."""

    args: TrainConfig
    headline: dict[str, tuple[str, str]] = {"loss": ("loss", "{:.3f}")}
    """Progress-bar label -> (metric, format)."""
    step_logs: tuple[str, ...] = (HELD_OUT_LOG,)
    """JSONL files in the run directory with a step column, cut back to the checkpoint on resume."""
    agent = None
    """The run's tools and environments (an aha.envs.Agent, GRPO's), recorded by name in each checkpoint's config."""

    def __init__(self, args: TrainConfig, eval_fn: Callable[[object, object], dict] | None,
                 callbacks: list | None = None):
        self.args = args
        self.callback_objects = list(callbacks or [])
        """transformers TrainerCallback objects (see aha.train.callbacks)."""
        args.output_dir = os.path.abspath(args.output_dir)  # once: a tool's os.chdir cannot move later writes
        self.run_dir = Path(args.output_dir)
        check_writable(self.run_dir)
        self.eval_fn = eval_fn
        self.step_count = 0
        self.saved_step: int | None = None  # step of the last checkpoint written or restored
        self.generator = torch.Generator().manual_seed(args.seed)
        self._stop_signal: int | None = None
        self.start_weights: dict | None = None
        """With weight_interpolation < 1: the weights training began from (CPU)."""

    def autocast(self):
        """The mixed-precision context of the forward passes (bf16/fp16), or a no-op."""
        return autocast(self.args, self.model)

    @abc.abstractmethod
    def step(self) -> dict[str, float]:
        """One training step; returns its metrics."""

    def after_step(self, metrics: dict[str, float], bar) -> None:
        """Hook for per-step extras (GRPO logs sample completions here)."""

    def train(self, resume_from_checkpoint: str | bool | None = None) -> TrainOutput:
        """Run to `max_steps`; resume from a checkpoint dir, or True for the latest in output_dir. Returns the last
        step's metrics (a dict) with transformers' `global_step`, `training_loss` and `metrics` beside them.

        SIGINT/SIGTERM finish the current step, write a checkpoint and raise Preempted (a
        SystemExit with code 128 + signal); a second signal raises it at once.
        """
        previous = self._install_signal_handlers()
        try:
            with lock_run_dir(self.run_dir):  # one run at a time in output_dir, until train() returns or raises
                return self._train(resume_from_checkpoint)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _train(self, resume_from_checkpoint: str | bool | None) -> TrainOutput:
        from tqdm.auto import tqdm
        logger = self._start(resume_from_checkpoint)
        bar = tqdm(total=self.max_steps, initial=self.step_count, desc=type(self).__name__,
                   disable=not self.args.progress_bar, dynamic_ncols=True)
        metrics: dict[str, float] = {}
        began, first, losses = time.perf_counter(), self.step_count, []
        try:
            while self.step_count < self.max_steps:
                metrics = self._one_step(logger, bar)
                losses.append(metrics.get("loss"))
                last = self.step_count == self.max_steps or self.callbacks.should_stop
                if self._stop_signal is not None and not last:
                    self._stop()
                if last:
                    break
            if self.start_weights is not None:
                self._interpolate(logger)
        finally:
            bar.close()
            logger.close()
        if self.saved_step != self.step_count:
            self._save()
        out = TrainOutput(metrics, self.step_count, losses, time.perf_counter() - began, self.step_count - first)
        self.callbacks.state.log_history.append({**out.metrics, "step": self.step_count})  # as transformers ends
        self.callbacks.fire("on_train_end", self.step_count, self.model)
        return out

    def _start(self, resume_from_checkpoint: str | bool | None):
        """Check the run directory, save the config, resume, open the loggers, evaluate step 0."""
        a = self.args
        if a.weight_interpolation != 1 and hasattr(self.model, "peft_config"):  # before anything is written
            raise ValueError("weight_interpolation needs full fine-tuning, not a LoRA (peft) model")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resume = resume_from_checkpoint if resume_from_checkpoint is not None else a.resume
        check_inputs(self.run_dir, self._inputs())
        if not resume:
            check_fresh(self.run_dir, a.overwrite_output_dir)
            mark_run(self.run_dir)
        if a.weight_interpolation != 1:  # before a resume loads later weights
            self.start_weights = weight_snapshot(self.model)
        if resume:
            self._resume(None if resume is True else Path(resume))
        save_config(a, self.run_dir / "config.yaml")  # after a resume: a config that cannot resume leaves the old
        if a.eval_steps and not self.eval_fn:
            log.warning("eval_steps=%d but nothing to evaluate (no task, eval_fn or eval_dataset): no eval/ metrics",
                        a.eval_steps)
        logger = make_logger(a.report_to, self.run_dir, self.saved_step if resume else None,
                             config=dataclasses.asdict(a))
        self.logger = logger
        self.callbacks = Callbacks(self.callback_objects, a, self.max_steps)
        self.callbacks.fire("on_train_begin", self.step_count, self.model)
        if self.eval_fn and a.eval_steps and self.step_count == 0:  # the starting point of the curve
            logger.log(0, self._evaluate())
        return logger

    def _one_step(self, logger, bar) -> dict[str, float]:
        """One step with everything around it: evaluation, logging, callbacks, checkpoint, progress bar."""
        a = self.args
        try:
            metrics = self.step()
        except NonFiniteError as e:
            raise NonFiniteError(
                f"step {self.step_count + 1}: {e}; no checkpoint written from this state "
                f"({self._saved_note()}); lower learning_rate, or set on_nonfinite=skip") from None
        self.step_count += 1
        last = self.step_count == self.max_steps
        if self.eval_fn and a.eval_steps and (self.step_count % a.eval_steps == 0 or last):
            metrics.update(self._evaluate())
        if self.step_count % a.logging_steps == 0 or last or (a.logging_first_step and self.step_count == 1):
            logger.log(self.step_count, metrics)
            self.callbacks.fire("on_log", self.step_count, self.model, logs=metrics)
        self.after_step(metrics, bar)
        self.callbacks.fire("on_step_end", self.step_count, self.model)
        if a.save_steps and self.step_count % a.save_steps == 0:
            self._save()
        bar.set_postfix({label: f.format(metrics[k]) for label, (k, f) in self.headline.items()
                         if k in metrics}, refresh=False)
        bar.update(1)
        return metrics

    # ------------------------------------------------------------------ transformers' Trainer methods
    @property
    def state(self):
        """transformers' TrainerState: global_step, max_steps and log_history (every logged step's metrics, then
        train()'s summary, as transformers'); a fresh one before train()."""
        if getattr(self, "callbacks", None) is None:
            from transformers import TrainerState
            return TrainerState(max_steps=self.max_steps, global_step=self.step_count)
        return self.callbacks.state

    @property
    def processing_class(self):
        """The tokenizer (transformers' name)."""
        return self.tokenizer

    def log_metrics(self, split: str, metrics: dict) -> None:
        """Print `metrics` as transformers' Trainer.log_metrics does."""
        print(format_metrics(split, metrics))

    def save_metrics(self, split: str, metrics: dict, combined: bool = True) -> None:
        """`{split}_results.json` (and all_results.json) in output_dir, as transformers' Trainer.save_metrics."""
        save_metrics(self.run_dir, split, metrics, combined)

    def save_state(self) -> None:
        """trainer_state.json in output_dir (transformers' TrainerState, with its log_history)."""
        self.state.save_to_json(str(self.run_dir / "trainer_state.json"))

    def _evaluate(self) -> dict[str, float]:
        metrics = {f"eval/{k}": v for k, v in self.eval_fn(self.model, self.tokenizer).items()}
        answers = getattr(self.eval_fn, "answers", None)
        if answers:  # the same held-out problems at every evaluation, for reading them side by side
            append_jsonl(self.run_dir / HELD_OUT_LOG, [{"step": self.step_count, **a} for a in answers])
        self.callbacks.fire("on_evaluate", self.step_count, self.model, metrics=metrics)
        return metrics

    def _interpolate(self, logger) -> None:
        """The end of training: the trained weights checkpointed as they are (a resume continues from them),
        then the model becomes start + weight_interpolation x (trained - start) and is evaluated again
        (`eval_interpolated/...`, beside the last step's `eval/...` of the trained weights)."""
        if self.saved_step != self.step_count:
            self._save()
        interpolate_weights(self.model, self.start_weights, self.args.weight_interpolation)
        self.start_weights = None  # a copy of the whole model, no longer needed
        log.info("weights interpolated: start + %g x (trained - start)", self.args.weight_interpolation)
        if self.eval_fn and self.args.eval_steps:
            logger.log(self.step_count, {f"eval_interpolated/{k}": v
                                         for k, v in self.eval_fn(self.model, self.tokenizer).items()})

    def _save(self) -> Path:
        path = self.save_checkpoint()
        self.callbacks.fire("on_save", self.step_count, self.model)
        return path

    # ------------------------------------------------------------------ signals
    def _install_signal_handlers(self) -> dict:
        """Catch SIGINT/SIGTERM for the run (main thread only: Python allows no other); return the old ones."""
        self._stop_signal = None
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self._stop_signal is not None:  # the second signal: no more waiting
            raise Preempted(signum, f"stopped at once by a second {name} during step {self.step_count + 1}; "
                                    f"steps since the last checkpoint are lost ({self._saved_note()})")
        self._stop_signal = signum
        note = f"aha: {name}: finishing step {self.step_count + 1}, then writing a checkpoint (again: stop now)\n"
        try:  # a raw write: buffered streams (logging, tqdm) are not reentrant inside a signal handler
            os.write(STDERR_FD, note.encode())
        except OSError:
            pass

    def _saved_note(self) -> str:
        return "no checkpoint yet" if self.saved_step is None else f"last checkpoint: step {self.saved_step}"

    def _stop(self) -> None:
        """After a stop signal: checkpoint this step (unless just saved) and leave."""
        path = self.run_dir / f"checkpoint-{self.step_count}"
        if self.saved_step != self.step_count:
            path = self._save()
        name = signal.Signals(self._stop_signal).name
        raise Preempted(self._stop_signal, f"stopped by {name} after step {self.step_count}; "
                                           f"checkpoint written to {path}; resume with resume=true")

    @property
    def max_steps(self) -> int:
        return self.args.max_steps

    def _state(self) -> dict:
        return {"step": self.step_count, "sampler": self.sampler.state(),
                "generator": self.generator.get_state()}

    def _load_state(self, state: dict) -> None:
        """What a subclass's `_state` adds, taken back from a restored checkpoint's `state`."""

    def _moving_reference(self):
        """The reference model when training moves it (GRPO's sync_ref_model), which a checkpoint must then hold
        for an exact resume; None when there is none or it stays the initial model (rebuilt at start-up)."""
        if not getattr(self.args, "sync_ref_model", False):
            return None
        return getattr(self, "ref_model", None)

    def save_checkpoint(self) -> Path:
        path = save_checkpoint(self.run_dir, self.step_count, self.model, self.optimizer, self.scheduler,
                               self._state(), self.args.save_total_limit, tokenizer=self.tokenizer,
                               reference=self._moving_reference(), config=config_record(self.args, self.agent))
        self.saved_step = self.step_count
        return path

    def _resume(self, path: Path | None) -> None:
        """Restore `path`, or the newest complete checkpoint that loads (a damaged one is skipped)."""
        if path is not None:
            self._restore(path)
            return
        candidates = list_checkpoints(self.run_dir)[::-1]
        for ckpt in candidates:
            try:
                self._restore(ckpt)
                return
            except CorruptCheckpointError as e:
                log.warning("%s; resuming from the previous checkpoint instead", e)
        detail = f" ({len(candidates)} damaged)" if candidates else ""
        raise FileNotFoundError(f"resume requested but no complete checkpoint in {self.run_dir}{detail}")

    def _inputs(self) -> list[tuple[str, object]]:
        """What this run reads from disk, which must not lie where it writes: the model, the dataset file, the files
        of the reward functions' modules."""
        found = [("model", self.args.model), ("model", getattr(self.model, "name_or_path", None)),
                 ("dataset", getattr(self.args, "dataset", None))]
        for fn in getattr(self, "reward_funcs", ()):
            module = sys.modules.get(getattr(fn, "__module__", None) or "")
            found.append((f"the module of reward function {getattr(fn, '__name__', fn)!r}",
                          getattr(module, "__file__", None)))
        return found

    def _check_resumable(self, path: Path) -> None:
        """Before anything is restored: the settings are the run's own (but for RESUMABLE ones), and it has steps
        left; otherwise raise, having changed nothing."""
        info = checkpoint_info(path)
        saved, where = info.get("config"), path / MARKER
        if saved is None:  # a checkpoint of an older aha: the config.yaml its run started with
            where = self.run_dir / "config.yaml"
            saved = read_saved_config(where)
        if saved is not None:
            check_resume(saved, self.args, where, self.run_dir, self.agent)
        if info["step"] > self.max_steps:
            raise NothingToTrainError(
                f"{path} is at step {info['step']}, past max_steps={self.max_steps}: nothing to train, and nothing "
                f"was changed. To train on, resume with max_steps above {info['step']}; the step-{info['step']} "
                f"model is in {path} (and in {self.run_dir / 'model'} if that run ended)")
        if info["step"] == self.max_steps:
            log.warning("%s is already at max_steps=%d: nothing to train (raise max_steps to train on)",
                        path, self.max_steps)

    def _restore(self, path: Path) -> None:
        self._check_resumable(path)
        reference = getattr(self, "ref_model", None)  # restored whenever the checkpoint holds it
        if self._moving_reference() is not None and not (path / REFERENCE).is_file():
            log.warning("%s holds no %s (written without sync_ref_model, or by an older aha): the reference "
                        "restarts from the initial model", path, REFERENCE)
        state = load_checkpoint(path, self.model, self.optimizer, self.scheduler, reference=reference)
        self.step_count = self.saved_step = state["step"]
        self.sampler = self.sampler.restored(state["sampler"])
        self.generator.set_state(state["generator"])
        self._load_state(state)
        for name in self.step_logs:
            keep_steps_through(self.run_dir / name, self.step_count)
        log.info("resumed from %s at step %d", path, self.step_count)

    def push_to_hub(self, repo_id: str | None = None, model_dir: str | Path | None = None) -> str:
        """Upload the saved model directory (save_model's, by default) to a Hub model repository."""
        from huggingface_hub import create_repo, upload_folder
        model_dir = Path(model_dir or self.run_dir / "model")
        if not (model_dir / "config.json").is_file() and not (model_dir / "adapter_config.json").is_file():
            raise FileNotFoundError(f"no saved model in {model_dir}: call save_model() first")
        repo_id = repo_id or self.args.hub_model_id or self.run_dir.name
        create_repo(repo_id, exist_ok=True, repo_type="model")
        upload_folder(repo_id=repo_id, folder_path=str(model_dir), repo_type="model",
                      commit_message=f"aha: {type(self).__name__} after {self.step_count} steps")
        return repo_id

    def save_model(self, output_dir: str | Path | None = None) -> Path:
        """Save in Hugging Face format (LoRA merged unless save_merged=false) into `output_dir`, by default the run's
        `model/`. That folder, or one absent or empty, is replaced whole (atomically); a folder holding anything
        else, such as the run's own output_dir (TRL's `trainer.save_model(args.output_dir)`), gets the model's files
        beside what it holds, each renamed into place; of the rest only an older save's weight and adapter files
        (`MODEL_FILES`) are removed, which would otherwise be loaded in place of these."""
        target = Path(os.path.abspath(output_dir)) if output_dir else self.run_dir / "model"
        if target == self.run_dir / "model" or not target.is_dir() or not any(target.iterdir()):
            return save_model(self.model, self.tokenizer, target, merge_lora=self.args.save_merged)
        with files_beside(target, replaces=MODEL_FILES) as new:
            save_model(self.model, self.tokenizer, new, merge_lora=self.args.save_merged)
        return target
