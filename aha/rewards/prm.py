"""A learned process reward model (PRM) as a step reward: P(good) of each reasoning step of a completion.

The PRM is what TRL's `PRMTrainer` trains and `aha prm` writes: an `AutoModelForTokenClassification` with two
labels (0 bad, 1 good). Its input is the prompt's text, then each step followed by the step separator (TRL's
default "\\n"), every piece tokenized on its own; a step's label is read at its last token, the separator's.
`aha prm` also writes the separator into the model's config.json (`step_separator`), where the reward finds it.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import torch

from .base import Reward, completion_text
from .steps import delimited_ends

STEP_SEPARATOR = "\n"
"""TRL's default step separator (PRMConfig.step_separator)."""
SEPARATOR_KEY = "step_separator"
"""The key of a PRM's config.json that holds the separator it was trained with."""
GOOD = 1
"""The label of a good step (TRL's labels: True -> 1)."""
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
"""Where a sharded checkpoint lists its tensors by name."""


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


def padded(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [n, L] and their attention mask [n, L]."""
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], device=device)        # [n, L]
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)  # [n, L]
    return ids, mask


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


def weight_names(name_or_path: str) -> set[str] | None:
    """The names of the tensors a model directory (or a cached hub id) holds, read from its index or the headers of
    its safetensors files (no tensor is loaded); None where there is nothing to read."""
    from safetensors import safe_open

    from ..models.load import resolve
    path = Path(resolve(name_or_path))
    if not path.is_dir():
        from huggingface_hub import snapshot_download
        try:
            path = Path(snapshot_download(str(name_or_path), local_files_only=True))
        except Exception:  # noqa: BLE001 - not in the cache: nothing to read
            return None
    for index in WEIGHT_INDEXES:
        if (path / index).is_file():
            return set(json.loads((path / index).read_text())["weight_map"])
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    names: set[str] = set()
    for file in files:
        with safe_open(file, framework="pt") as f:
            names.update(f.keys())
    return names


def untrained_head(model, name_or_path: str) -> list[str]:
    """The parameters of `model`'s head (those outside its base model) that its checkpoint does not hold: a head
    from_pretrained initialised afresh, whose scores are noise. Every reward that holds a model checks this."""
    prefix = model.base_model_prefix + "."
    names = weight_names(name_or_path)
    if names is None:
        return []
    return sorted(n for n, _ in model.named_parameters() if not n.startswith(prefix) and n not in names)


class PRMReward(Reward):
    """A PRM's P(good) of each step, as a step reward: per completion a list of (end, score), `end` the offset in
    the completion's text just after the step. Splits by `step_separator` (default: the one in the PRM's config,
    else TRL's "\\n"); runs the PRM without gradients on `device`, `batch_size` completions per forward pass.
    Steps past the PRM's context get no score (the list stops before them)."""

    name = "prm"

    def __init__(self, model: str, step_separator: str | None = None, batch_size: int = 16,
                 device: str | None = None, dtype: str = "float32"):
        super().__init__()
        self.path, self.batch_size = model, batch_size
        self.model, self.tokenizer = load_prm(model, dtype, device, what="prm_model")
        self.model.eval()
        saved_as = self.model.config.architectures or []
        if saved_as and not any(a.endswith("ForTokenClassification") for a in saved_as):
            raise ValueError(f"prm_model {model!r} is a {saved_as[0]}, not a token-classification PRM (train one from "
                             "step labels with `aha prm`)")
        missing = untrained_head(self.model, model)
        if missing:
            raise ValueError(f"prm_model {model!r} has no trained score head: {', '.join(missing)} not in its weights "
                             f"(a {type(self.model).__name__} would start it from random values); train a PRM from "
                             "step labels with `aha prm`")
        if self.model.config.num_labels != 2:
            raise ValueError(f"prm_model {model!r} has {self.model.config.num_labels} labels; a PRM has 2 (bad, good)")
        self.step_separator = step_separator or getattr(self.model.config, SEPARATOR_KEY, None) or STEP_SEPARATOR
        self.context = getattr(self.model.config, "max_position_embeddings", None)
        self._lock = threading.Lock()  # one forward pass at a time (streamed rewards call from helper threads)

    def to(self, device) -> "PRMReward":
        """Run the PRM on `device` (the trainer's: the policy's)."""
        self.model.to(device)
        return self

    def _encode(self, prompt: Any, completion: Any) -> tuple[list[int], list[int], list[int]]:
        """(ids, label positions, step ends) of one completion; steps past the context are left out."""
        steps = split_steps(completion_text(completion), self.step_separator)
        ids, positions = prm_inputs(self.tokenizer, prompt_text(self.tokenizer, prompt), [s for s, _ in steps],
                                    self.step_separator)
        kept = [i for i, p in enumerate(positions) if self.context is None or p < self.context]
        return ids[:self.context], [positions[i] for i in kept], [steps[i][1] for i in kept]

    @torch.no_grad()
    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[list[tuple[int, float]]]:
        encoded = [self._encode(p, c) for p, c in zip(prompts, completions)]
        out: list[list[tuple[int, float]]] = [[] for _ in encoded]
        todo = [i for i, (_, positions, _) in enumerate(encoded) if positions]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        with self._lock:
            for s in range(0, len(todo), self.batch_size):
                part = todo[s:s + self.batch_size]
                logits = step_logits(self.model, [encoded[i][0] for i in part], [encoded[i][1] for i in part], pad)
                for i, row in zip(part, logits):
                    good = torch.softmax(row.float(), dim=-1)[:, GOOD].tolist()          # [steps]
                    out[i] = list(zip(encoded[i][2], good))
        self.count("prm_steps", sum(len(o) for o in out))
        return out
