"""Training a process reward model: token classification (0 bad, 1 good) at the end of every step, the loss on
those tokens only, in TRL's PRMTrainer format (aha.rewards.prm builds the inputs; a step's label sits on its
separator). Training starts from a causal LM checkpoint (a fresh two-label score head) or from a PRM."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..config import PRMConfig
from ..data import load_rows
from ..models import disable_dropout, setup_model
from ..models.load import training_precision
from ..rewards.prm import GOOD, SEPARATOR_KEY, STEP_SEPARATOR, load_prm, prm_inputs, step_logits
from .loop import PromptSampler, Trainer, build_optimizer, optimizer_step, seed_everything

LABELS_STATS = "stats.json"
"""The file beside `aha prm_labels`'s data.jsonl that records the step separator the labels were split by."""

Example = tuple[list[int], list[int], list[int]]
"""(input ids, label positions, labels) of one row."""


def labels_separator(dataset: str | None) -> str | None:
    """The step separator `aha prm_labels` recorded beside `dataset` (its stats.json), or None."""
    stats = Path(dataset).parent / LABELS_STATS if isinstance(dataset, str) and dataset else None
    if stats is None or not stats.is_file():
        return None
    try:
        return json.loads(stats.read_text()).get("step_separator")
    except (ValueError, AttributeError):
        return None


def checked_row(i: int, row: dict) -> dict:
    """Row i, or an error naming it and what is wrong (TRL's stepwise supervision: prompt, completions, labels)."""
    prompt, steps, labels = row.get("prompt"), row.get("completions"), row.get("labels")
    if not isinstance(prompt, str):
        raise ValueError(f"PRM row {i}: 'prompt' must be text (TRL's stepwise-supervision format), got {prompt!r:.80}")
    if not (isinstance(steps, list) and steps and all(isinstance(s, str) for s in steps)):
        raise ValueError(f"PRM row {i}: 'completions' must be a non-empty list of step strings, got {steps!r:.80}")
    if not (isinstance(labels, list) and len(labels) == len(steps) and all(isinstance(v, bool) for v in labels)):
        raise ValueError(f"PRM row {i}: 'labels' must be one true/false per step ({len(steps)} steps), "
                         f"got {labels!r:.80}")
    return row


def held_out_split(rows: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out): a seeded `fraction` of the distinct prompts, with all their rows, is held out (so no
    held-out step shares a prompt with a trained one)."""
    prompts = sorted({r["prompt"] for r in rows})
    random.Random(seed).shuffle(prompts)
    held = set(prompts[:math.ceil(fraction * len(prompts))] if fraction else [])
    if held and len(held) == len(prompts):
        raise ValueError(f"eval_fraction {fraction} holds out all {len(prompts)} prompts; lower it or add rows")
    return [r for r in rows if r["prompt"] not in held], [r for r in rows if r["prompt"] in held]


def tokenize_rows(tokenizer, rows: list[dict], separator: str, max_length: int, last_only: bool) -> list[Example]:
    """Each row as PRM inputs (aha.rewards.prm.prm_inputs); a row over max_length is an error, not cut."""
    out = []
    for i, row in enumerate(rows):
        ids, positions = prm_inputs(tokenizer, row["prompt"], row["completions"], separator)
        if len(ids) > max_length:
            raise ValueError(f"PRM row {i} has {len(ids)} tokens, over max_length {max_length}")
        labels = [int(v) for v in row["labels"]]
        out.append((ids, positions[-1:], labels[-1:]) if last_only else (ids, positions, labels))
    return out


def step_predictions(model, part: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits at every labelled step of `part` [S, 2] and the labels [S]."""
    logits = torch.cat(step_logits(model, [e[0] for e in part], [e[1] for e in part], pad_id))   # [S, 2]
    labels = torch.tensor([v for e in part for v in e[2]], device=logits.device)               # [S]
    return logits, labels


class PRMTrainer(Trainer):
    """Cross-entropy of each step's label at its last token, averaged over the labelled steps of a batch."""

    headline = {"loss": ("loss", "{:.3f}"), "acc": ("step_accuracy", "{:.2f}"),
                "held-out": ("eval/step_accuracy", "{:.2f}")}

    def __init__(self, model=None, args: PRMConfig | None = None, train_dataset=None, eval_dataset=None,
                 processing_class=None, callbacks=None):
        args = args or PRMConfig()
        super().__init__(args, None, callbacks)
        seed_everything(args.seed)
        data = train_dataset if train_dataset is not None else args.dataset or None
        rows = [checked_row(i, r) for i, r in enumerate(load_rows(data, prompt_column=None))]
        if eval_dataset is None:
            rows, held = held_out_split(rows, args.eval_fraction, args.seed)
        else:
            held = [checked_row(i, r) for i, r in enumerate(load_rows(eval_dataset, prompt_column=None))]
        self.separator = args.step_separator or labels_separator(args.dataset) or STEP_SEPARATOR
        if model is None or isinstance(model, str):
            model, processing_class = load_prm(model or args.model, training_precision(args.dtype, args.bf16)[0],
                                               what="PRM start model")
        self.model, self.tokenizer = setup_model(args, model, processing_class)
        disable_dropout(self.model)  # as TRL's PRMConfig.disable_dropout
        self.model.config.update({SEPARATOR_KEY: self.separator, "id2label": {0: "bad", GOOD: "good"},
                                  "label2id": {"bad": 0, "good": GOOD}})  # saved with every checkpoint and the PRM
        tokenize = lambda r, last: tokenize_rows(self.tokenizer, r, self.separator, args.max_length, last)  # noqa: E731
        self.examples = tokenize(rows, args.train_on_last_step_only)
        self.held = tokenize(held[:args.eval_samples or None], False)
        self.eval_fn = self.evaluate_steps if self.held else None
        self.batch = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self._max_steps = args.max_steps or math.ceil(args.num_train_epochs * len(self.examples) / self.batch)
        self.optimizer, self.scheduler = build_optimizer(args, self.model, self._max_steps)
        self.sampler = PromptSampler(len(self.examples), args.seed)

    @property
    def max_steps(self) -> int:
        return self._max_steps

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    def step(self) -> dict[str, float]:
        a, t0 = self.args, time.perf_counter()
        idx = sorted(self.sampler.take(self.batch), key=lambda i: len(self.examples[i][0]))
        total = sum(len(self.examples[i][2]) for i in idx)  # one denominator for all micro-batches: labelled steps
        self.model.train()
        loss_sum, right = 0.0, 0
        for s in range(0, len(idx), a.per_device_train_batch_size):
            part = [self.examples[i] for i in idx[s:s + a.per_device_train_batch_size]]
            with self.autocast():
                logits, labels = step_predictions(self.model, part, self.pad_id)             # [S, 2], [S]
            loss = F.cross_entropy(logits.float(), labels, reduction="sum") / max(total, 1)
            loss.backward()
            loss_sum += float(loss.detach())
            right += int((logits.argmax(-1) == labels).sum())
        grad_norm = optimizer_step(a, self.model, self.optimizer, self.scheduler, loss_sum)
        return {"loss": loss_sum, "step_accuracy": right / max(total, 1), "grad_norm": grad_norm,
                "lr": self.scheduler.get_last_lr()[0], "perf/step_s": time.perf_counter() - t0,
                "train/nonfinite_skipped": float(math.isnan(grad_norm))}

    @torch.no_grad()
    def evaluate_steps(self, model, tokenizer) -> dict[str, float]:
        """Every held-out step: accuracy of argmax against its label, the loss, the mean P(good) of good and of bad
        steps, and the accuracy of always answering the more common label (what the PRM has to beat)."""
        model.eval()
        size, parts = self.args.per_device_train_batch_size, []
        for s in range(0, len(self.held), size):
            with self.autocast():
                parts.append(step_predictions(model, self.held[s:s + size], self.pad_id))
        logits, labels = (torch.cat(t).cpu() for t in zip(*parts))                             # [S, 2], [S]
        logits, y = logits.float(), labels.bool()
        p = torch.softmax(logits, -1)[:, GOOD]                                                  # [S]
        mean = lambda v: v.mean().item() if len(v) else math.nan  # noqa: E731
        good_share = y.float().mean().item()
        return {"step_accuracy": (logits.argmax(-1) == labels).float().mean().item(),
                "loss": F.cross_entropy(logits, labels).item(),
                "p_good/good_steps": mean(p[y]), "p_good/bad_steps": mean(p[~y]),
                "majority_accuracy": max(good_share, 1 - good_share), "steps": float(len(y))}
