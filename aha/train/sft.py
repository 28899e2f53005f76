"""Supervised fine-tuning with the loss on completion tokens only (cold start, rejection sampling). A tool
conversation in TRL's messages format (assistant `tool_calls`, `tool` messages, a `tools` column of schemas) is
rendered as the turn loop renders episodes, and only the assistant's tokens are in the loss."""

from __future__ import annotations

import json
import math
import time
from typing import Callable

import torch

from .. import algos
from ..config import SFTConfig
from ..data import encode_prompt, is_conversational, load_rows
from ..data.toolcalls import ToolChat
from ..models import setup_model
from .logprobs import completion_logprobs
from .loop import PromptSampler, Trainer, build_optimizer, optimizer_step, seed_everything


def split_example(row: dict, cfg: SFTConfig) -> tuple[object, str | list]:
    """(prompt, completion) from prompt/completion columns or a messages conversation. A completion is text, or a
    list of {"text", "train"} segments: an agent's demonstration, whose tool turns (train false) are read, not
    learned."""
    if cfg.prompt_column in row and cfg.completion_column in row:
        comp = row[cfg.completion_column]
        if is_conversational(comp):
            comp = comp[-1]["content"]
        return row[cfg.prompt_column], comp
    msgs = row.get(cfg.messages_column)
    if is_conversational(msgs) and msgs[-1]["role"] == "assistant":
        return msgs[:-1], msgs[-1]["content"]
    raise ValueError(f"an SFT row needs '{cfg.prompt_column}' and '{cfg.completion_column}' columns, "
                     f"or a '{cfg.messages_column}' conversation ending with an assistant turn; "
                     f"got columns {sorted(row)}")


def is_tool_conversation(row: dict, cfg: SFTConfig) -> bool:
    """A row in TRL's tool-calling messages format: a conversation with assistant `tool_calls` or `tool` messages."""
    msgs = row.get(cfg.messages_column)
    return is_conversational(msgs) and any(m.get("tool_calls") or m.get("role") == "tool" for m in msgs)


def tool_example(chat: ToolChat, i: int, row: dict, cfg: SFTConfig) -> tuple[str, list]:
    """A tool conversation (its `tools` column: the schemas it was shown, or their JSON text as some datasets store
    them) -> (prompt text, segments), rendered by
    ToolChat.demonstration, the template the turn loop renders episodes with: the messages before the first
    assistant turn are the prompt; every assistant turn is trained, the tool results only read."""
    msgs = row[cfg.messages_column]
    first = next((k for k, m in enumerate(msgs) if m.get("role") == "assistant"), None)
    if first is None or first == 0 or msgs[-1].get("role") != "assistant":
        raise ValueError(f"SFT row {i}: a tool conversation needs a prompt before its first assistant turn and must "
                         f"end with an assistant turn; got roles {[m.get('role') for m in msgs]}")
    tools = row.get("tools")
    demo = chat.demonstration(msgs, first, json.loads(tools) if isinstance(tools, str) else tools)  # JSON text too
    return demo["prompt"], demo["completion"]


def checked_example(i: int, example: tuple[object, str | list], cfg: SFTConfig) -> tuple[object, str | list]:
    """Row i's (prompt, completion), or an error naming the row and column when either is not text."""
    prompt, completion = example
    if not (isinstance(prompt, str) and prompt or is_conversational(prompt)):
        raise ValueError(f"SFT row {i}: the prompt ({cfg.prompt_column!r}) must be a non-empty string or a list of "
                         f"chat messages, got {prompt!r}")
    if isinstance(completion, list) and completion and all(
            isinstance(s, dict) and isinstance(s.get("text"), str) and isinstance(s.get("train"), bool)
            for s in completion):
        return prompt, completion
    if not isinstance(completion, str) or not completion:
        raise ValueError(f"SFT row {i}: the completion ({cfg.completion_column!r}, or the conversation's last "
                         f"assistant turn) must be a non-empty string, got {completion!r}")
    return prompt, completion


def tokenize_example(tokenizer, prompt, completion: str | list) -> tuple[list[int], list[int], list[int]]:
    """Prompt ids, completion ids ending with EOS so the model learns to stop, and the completion's loss mask
    (segments tokenized one by one: cut at special tokens, as an episode's are, they give the same ids)."""
    segments = [{"text": completion, "train": True}] if isinstance(completion, str) else completion
    comp, mask = [], []
    for seg in segments:
        ids = tokenizer(seg["text"], add_special_tokens=False)["input_ids"]
        comp, mask = comp + ids, mask + [int(seg["train"])] * len(ids)
    return encode_prompt(tokenizer, prompt), comp + [tokenizer.eos_token_id], mask + [1]


class SFTTrainer(Trainer):
    """Cross-entropy on completion tokens, averaged over all completion tokens of a batch."""

    headline = {"loss": ("loss", "{:.3f}"), "s/step": ("perf/step_s", "{:.2f}")}

    def __init__(self, model=None, args: SFTConfig | None = None, train_dataset=None,
                 processing_class=None, callbacks=None, peft_config=None,
                 eval_fn: Callable[[object, object], dict] | None = None):
        args = args or SFTConfig()
        super().__init__(args, eval_fn, callbacks)
        seed_everything(args.seed)
        rows = load_rows(train_dataset, prompt_column=None)
        self.model, self.tokenizer = setup_model(args, model, processing_class, peft_config)
        chat = ToolChat(self.tokenizer)
        self.examples = [tokenize_example(self.tokenizer, *checked_example(i, tool_example(chat, i, r, args)
                                          if is_tool_conversation(r, args) else split_example(r, args), args))
                         for i, r in enumerate(rows)]
        for i, (p, c, _) in enumerate(self.examples):
            if len(p) + len(c) > args.max_length:
                raise ValueError(f"example {i} has {len(p) + len(c)} tokens, over max_length {args.max_length}")
        self.batch = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self._max_steps = args.max_steps or math.ceil(args.num_train_epochs * len(rows) / self.batch)
        self.optimizer, self.scheduler = build_optimizer(args, self.model, self._max_steps)
        self.sampler = PromptSampler(len(self.examples), args.seed)

    @property
    def max_steps(self) -> int:
        return self._max_steps

    def step(self) -> dict[str, float]:
        a, t0 = self.args, time.perf_counter()
        idx = sorted(self.sampler.take(self.batch), key=lambda i: sum(map(len, self.examples[i][:2])))
        total = sum(sum(self.examples[i][2]) for i in idx)  # one denominator for all micro-batches: trained tokens
        self.model.train()
        loss_sum, tokens = 0.0, 0
        for s in range(0, len(idx), a.per_device_train_batch_size):
            part = [self.examples[i] for i in idx[s:s + a.per_device_train_batch_size]]
            with self.autocast():
                logp, mask, _ = completion_logprobs(self.model, [p for p, _, _ in part], [c for _, c, _ in part],
                                                    self.tokenizer.pad_token_id)      # [n,T]
            trained = torch.tensor([m + [0] * (mask.shape[1] - len(m)) for _, _, m in part], device=mask.device)
            loss = algos.aggregate("dapo", -logp, mask * trained, num_tokens=total)  # token mean over the batch
            loss.backward()
            loss_sum += float(loss.detach())
            tokens += sum(len(p) + len(c) for p, c, _ in part)
        grad_norm = optimizer_step(a, self.model, self.optimizer, self.scheduler, loss_sum)
        dt = time.perf_counter() - t0
        return {"loss": loss_sum, "grad_norm": grad_norm, "lr": self.scheduler.get_last_lr()[0],
                "perf/step_s": dt, "perf/train_tokens_per_s": tokens / dt,
                "train/nonfinite_skipped": float(math.isnan(grad_norm))}
