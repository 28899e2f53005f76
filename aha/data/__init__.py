"""Datasets as lists of row dicts, and prompts as token ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .length import PromptTooLong, longest_token_chars, tokens_over


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
    for i, line in enumerate(text.split("\n"), 1):  # not splitlines(): JSON strings may hold U+2028, U+0085
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


def check_text(value, where: str) -> None:
    """Raise when a string in `value` (or in its lists and dicts: chat messages) holds a lone surrogate, which
    JSON can write ("\\ud800") but which is not text: no tokenizer takes it, and UTF-8 cannot encode it."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str) and not v.isascii():
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"{where}: character {e.start} is a lone surrogate {v[e.start]!r}, not valid "
                                 "Unicode text, which no tokenizer can take (a JSON \\ud800-style escape without "
                                 "its other half?)") from None
        elif isinstance(v, dict):
            stack.extend(reversed(v.values()))  # reversed: the first bad string is the one named
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))


def has_columns(row: dict, i: int, columns: tuple[str, ...]) -> dict:
    """The row, or an error naming row i and the first of `columns` it lacks (a missing gold answer would
    otherwise only be counted as a data error, step after step)."""
    for col in columns:
        if col not in row:
            raise ValueError(f"dataset row {i} has no '{col}' column; its columns: {sorted(row)}")
    return row


def check_row(row, i: int, prompt_column: str | None, required: tuple[str, ...] = ()) -> dict:
    """The row, with `prompt` copied from prompt_column; a bad row (not a mapping, a column missing, text that is
    not valid Unicode) is an error naming it and the column."""
    if not isinstance(row, dict):
        raise ValueError(f"dataset row {i} is a {type(row).__name__}, not a mapping of column -> value: {row!r:.60}")
    for col, value in row.items():
        check_text(value, f"dataset row {i}, column '{col}'")
    has_columns(row, i, ((prompt_column,) if prompt_column else ()) + tuple(required))
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


def encode_prompt(tokenizer, prompt, max_tokens: int | None = None, template_kwargs: dict | None = None) -> list[int]:
    """Prompt token ids: chat prompts through the model's chat template (which writes its own special tokens;
    `template_kwargs` are TRL's chat_template_kwargs), strings with the tokenizer's special tokens (a Llama-style
    BOS), as TRL tokenizes them.

    With max_tokens, a text whose length in characters already proves it longer is refused (PromptTooLong)
    without being tokenized: a 10 MB line would take tens of seconds and gigabytes to count exactly."""
    if is_conversational(prompt):
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False, **(template_kwargs or {}))
        kwargs = {"add_special_tokens": False}  # the template wrote them
    elif isinstance(prompt, str):
        text, kwargs = prompt, {}
    else:
        raise TypeError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
    if max_tokens is not None:
        at_least = tokens_over(tokenizer, text, max_tokens)
        if at_least is not None:
            raise PromptTooLong(f"at least {at_least} tokens ({len(text)} characters; no token of this tokenizer "
                                f"covers more than {longest_token_chars(tokenizer)})")
    return tokenizer(text, **kwargs)["input_ids"]
