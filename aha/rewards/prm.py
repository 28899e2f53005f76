"""A learned process reward model (PRM) as a step reward: P(good) of each reasoning step of a completion.

The PRM is what TRL's `PRMTrainer` trains and `aha prm` writes: an `AutoModelForTokenClassification` with two
labels (0 bad, 1 good). Its input is the prompt's text, then each step followed by the step separator (TRL's
default "\\n"), every piece tokenized on its own; a step's label is read at its last token, the separator's.
`aha prm` also writes the separator into the model's config.json (`step_separator`), where the reward finds it.
"""
from __future__ import annotations

from typing import Any

import torch

from .base import completion_text
from .models import ModelReward, check_head, padded
from .steps import delimited_ends

STEP_SEPARATOR = "\n"
"""TRL's default step separator (PRMConfig.step_separator)."""
SEPARATOR_KEY = "step_separator"
"""The key of a PRM's config.json that holds the separator it was trained with."""
GOOD = 1
"""The label of a good step (TRL's labels: True -> 1)."""


def prompt_text(tokenizer, prompt: Any) -> str:
    """A prompt as the PRM reads it: a string as it is; chat messages through the tokenizer's chat template with
    the assistant's turn opened, as the policy saw them (aha.data.encode_prompt).

    Example: [{"role": "user", "content": "3+4"}] with ChatML ->
    '<|im_start|>user\\n3+4<|im_end|>\\n<|im_start|>assistant\\n'.
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return completion_text(prompt)


def split_steps(text: str, separator: str) -> list[tuple[str, int]]:
    """The steps of a completion's text and where each ends (aha.rewards.steps.delimited_ends: the offset just after
    its last character; empty steps skipped; the last step ends at the text's end).

    Example: split_steps("<think>7+5=12 4+8+1=13</think>", " ") -> [('<think>7+5=12', 13), ('4+8+1=13</think>', 30)].
    """
    steps, start = [], 0
    for end in delimited_ends(text, separator):
        steps.append((text[start:end].rsplit(separator, 1)[-1], end))
        start = end
    return steps


def prm_inputs(tokenizer, prompt: str, steps: list[str], separator: str) -> tuple[list[int], list[int]]:
    """Input ids and the position of each step's label, as TRL's PRMTrainer.tokenize_row builds them: the BOS token
    (when the tokenizer has one), the prompt, then every step followed by the separator, each tokenized without
    special tokens; a step's label sits on its last token (the separator's last)."""
    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    ids, sep, positions = bos + encode(prompt), encode(separator), []
    for step in steps:
        ids += encode(step) + sep
        positions.append(len(ids) - 1)
    return ids, positions


def step_logits(model, rows: list[list[int]], positions: list[list[int]], pad_id: int) -> list[torch.Tensor]:
    """The PRM's two logits at each row's label positions: one [steps, 2] tensor per row (one forward pass)."""
    from ..models.load import attention_kernels
    device = next(model.parameters()).device
    ids, mask = padded(rows, pad_id, device)
    with attention_kernels(device):
        logits = model(input_ids=ids, attention_mask=mask).logits                              # [n, L, 2]
    return [logits[i, torch.tensor(p, dtype=torch.long, device=device)] for i, p in enumerate(positions)]


def load_prm(name_or_path: str, dtype: str = "float32", device: str | None = None, what: str = "PRM"):
    """(model, tokenizer) of a token-classification model with two labels: a PRM, or a causal LM checkpoint whose
    new score head training will fit. Errors name `what` and the path."""
    from transformers import AutoModelForTokenClassification

    from ..models import load_model, load_tokenizer
    try:
        model = load_model(name_or_path, dtype, device=device, auto_class=AutoModelForTokenClassification,
                           num_labels=2)
        return model, load_tokenizer(name_or_path)
    except (ValueError, OSError) as e:
        raise ValueError(f"{what} {name_or_path!r}: {e}") from e


class PRMReward(ModelReward):
    """A PRM's P(good) of each step, as a step reward: per completion a list of (end, score), `end` the offset in
    the completion's text just after the step. Splits by `step_separator` (default: the one in the PRM's config,
    else TRL's "\\n"); runs the PRM on `device`, `batch_size` completions per forward pass (aha.rewards.models:
    eval mode, no gradient, one call at a time). Steps past the PRM's context get no score (the list stops
    before them)."""

    name = "prm"

    def __init__(self, model: str, step_separator: str | None = None, batch_size: int = 16,
                 device: str | None = None, dtype: str = "float32"):
        self.path = model
        prm, tokenizer = load_prm(model, dtype, device, what="prm_model")
        check_head(prm, model, "ForTokenClassification", "token-classification PRM", "prm_model",
                   "train a PRM from step labels with `aha prm`")
        if prm.config.num_labels != 2:
            raise ValueError(f"prm_model {model!r} has {prm.config.num_labels} labels; a PRM has 2 (bad, good)")
        super().__init__(prm, tokenizer, batch_size)
        self.step_separator = step_separator or getattr(prm.config, SEPARATOR_KEY, None) or STEP_SEPARATOR
        self.context = getattr(prm.config, "max_position_embeddings", None)

    def _encode(self, prompt: Any, completion: Any) -> tuple[list[int], list[int], list[int]]:
        """(ids, label positions, step ends) of one completion; steps past the context are left out."""
        steps = split_steps(completion_text(completion), self.step_separator)
        ids, positions = prm_inputs(self.tokenizer, prompt_text(self.tokenizer, prompt), [s for s, _ in steps],
                                    self.step_separator)
        kept = [i for i, p in enumerate(positions) if self.context is None or p < self.context]
        return ids[:self.context], [positions[i] for i in kept], [steps[i][1] for i in kept]

    def score(self, prompts: list, completions: list) -> list[list[tuple[int, float]]]:
        encoded = [self._encode(p, c) for p, c in zip(prompts, completions)]
        out: list[list[tuple[int, float]]] = [[] for _ in encoded]
        todo = [i for i, (_, positions, _) in enumerate(encoded) if positions]
        for part in self.batches(len(todo)):
            rows = [todo[j] for j in part]
            logits = step_logits(self.model, [encoded[i][0] for i in rows], [encoded[i][1] for i in rows], self.pad_id)
            for i, row in zip(rows, logits):
                good = torch.softmax(row.float(), dim=-1)[:, GOOD].tolist()              # [steps]
                out[i] = list(zip(encoded[i][2], good))
        self.count("prm_steps", sum(len(o) for o in out))
        return out
