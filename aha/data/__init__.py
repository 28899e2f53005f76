"""Datasets as lists of row dicts, and prompts as token ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def is_conversational(prompt: Any) -> bool:
    """A chat prompt is a list of {"role", "content"} messages."""
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte {e.object[e.start]:#x} at offset {e.start})") from None
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not valid JSON ({e.msg})") from None
    return rows


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    from ..fileio import atomic_write
    return atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows))


def is_stream(dataset) -> bool:
    """A dataset read as it is iterated (`datasets.IterableDataset`, `load_dataset(..., streaming=True)`):
    no length, possibly endless."""
    return (hasattr(dataset, "__iter__") and not hasattr(dataset, "__len__")
            and not isinstance(dataset, (str, bytes, Path, dict)))


def check_row(row, i: int, prompt_column: str | None, required: tuple[str, ...] = ()) -> dict:
    """The row, with `prompt` copied from prompt_column; a bad row is an error naming it."""
    if not isinstance(row, dict):
        raise ValueError(f"dataset row {i} is a {type(row).__name__}, not a mapping of column -> value: {row!r:.60}")
    for col in ((prompt_column,) if prompt_column else ()) + tuple(required):
        if col not in row:
            raise ValueError(f"dataset row {i} has no '{col}' column; its columns: {sorted(row)}")
    if prompt_column:
        prompt = row[prompt_column]
        if not (isinstance(prompt, str) or is_conversational(prompt)):
            raise ValueError(f"dataset row {i}: '{prompt_column}' must be a string or a list of chat messages, "
                             f"got {type(prompt).__name__} {prompt!r:.60}")
        if not prompt:
            raise ValueError(f"dataset row {i}: '{prompt_column}' is empty")
    return {**row, "prompt": row[prompt_column]} if prompt_column not in (None, "prompt") else row


def load_rows(dataset, prompt_column: str | None = "prompt", required: tuple[str, ...] = ()) -> list[dict]:
    """A `datasets.Dataset`, a list of dicts or a JSONL path -> list of dicts.

    With a prompt_column, every row gets a `prompt` key copied from it (None: no prompt needed).
    """
    if dataset is None:
        raise ValueError("no training data: pass train_dataset=... or set `task` or `dataset`")
    if isinstance(dataset, (str, Path)):
        rows = read_jsonl(dataset)
    elif isinstance(dataset, list):
        rows = dataset
    elif isinstance(getattr(dataset, "column_names", None), dict):  # datasets.DatasetDict: a split was forgotten
        raise ValueError(f"the dataset has splits {sorted(dataset.column_names)}: pass one, e.g. dataset['train'] "
                         "or load_dataset(..., split='train')")
    elif hasattr(dataset, "column_names") and hasattr(dataset, "__getitem__"):  # datasets.Dataset
        rows = [dict(r) for r in dataset]
    else:
        raise TypeError(f"unsupported dataset type {type(dataset).__name__}: use a datasets.Dataset, a list "
                        "of dicts or a JSONL path (a streaming dataset is read lazily by GRPOTrainer)")
    if len(rows) == 0:
        raise ValueError("the training dataset is empty")
    return [check_row(r, i, prompt_column, required) for i, r in enumerate(rows)]


def encode_prompt(tokenizer, prompt) -> list[int]:
    """Prompt token ids: chat prompts through the model's chat template (which writes its own special tokens),
    strings with the tokenizer's special tokens (a Llama-style BOS), as TRL tokenizes them."""
    if is_conversational(prompt):
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    if isinstance(prompt, str):
        return tokenizer(prompt)["input_ids"]
    raise TypeError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
