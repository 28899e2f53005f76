"""Load policy models and tokenizers: hub id (from the local cache), local directory or short name."""

from __future__ import annotations

import copy
import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SAFE_WEIGHTS = "model.safetensors"
"""The single-file weights name transformers writes and reads."""


def resolve(name_or_path: str) -> str:
    """A local directory for a known short name or directory; a cached hub id passes through."""
    from .zoo import resolve_model
    return resolve_model(name_or_path)


def load_tokenizer(name_or_path: str):
    """Tokenizer with a pad token (EOS when the model has none) and left padding for generation."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(resolve(name_or_path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(name_or_path: str, dtype: str = "float32", attn_implementation: str | None = None,
               gradient_checkpointing: bool = False, device: str | None = None):
    """A transformers causal LM, on `device` (default: CUDA when present, else CPU)."""
    from transformers import AutoModelForCausalLM
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype '{dtype}'; valid: {sorted(DTYPES)}")
    kwargs = {"dtype": DTYPES[dtype]}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    path = resolve(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except Exception as e:  # noqa: BLE001 - a damaged weights file surfaces as many exception types
        if not Path(path).is_dir():
            raise
        weights = Path(path) / SAFE_WEIGHTS
        source = weights if weights.is_file() else path
        reason = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"cannot load model from {source}: {type(e).__name__}: {reason}") from e
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False  # generation passes use_cache=True explicitly
    return model


def eos_ids(model, tokenizer) -> list[int]:
    """Every token that ends a completion: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
    return sorted(i for i in ids if i is not None)


def context_length(model) -> int | None:
    """The model's maximum sequence length, when its config states one."""
    return getattr(model.config, "max_position_embeddings", None)


def save_model(model, tokenizer, path: str | Path, merge_lora: bool = True) -> Path:
    """Save so that transformers and vLLM load it: LoRA merged into the weights, or as an adapter.

    Written into a hidden temporary directory and renamed into place, so `path` is always either
    the previous model or the new one, never a mix or a half-written file.
    """
    path = Path(path)
    if hasattr(model, "peft_config") and merge_lora:
        model = copy.deepcopy(model).merge_and_unload()
    with atomic_directory(path) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return path


# ---------------------------------------------------------------- crash-safe directories
TMP_SUFFIX, ASIDE_SUFFIX = ".tmp", ".old"
"""Hidden siblings `.NAME.tmp` (being written) and `.NAME.old` (being replaced or deleted)."""


class DiskFullError(OSError):
    """ENOSPC while writing a run artefact; names what was being written."""

    def __init__(self, path: str | Path):
        super().__init__(errno.ENOSPC, f"no space left on device while writing {path}")

    def __str__(self) -> str:
        return self.strerror


def fsync_dir(path: str | Path) -> None:
    """Make renames and new entries in `path` durable (a file's fsync does not cover its name)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """Flush every file under `path`, then the directories that name them."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(root)


def _sibling(path: Path, suffix: str) -> Path:
    return path.parent / f".{path.name}{suffix}"


def remove_directory(path: Path) -> None:
    """Rename aside, then delete: a crash mid-delete leaves only a hidden directory behind."""
    aside = _sibling(path, ASIDE_SUFFIX)
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(path, aside)
    fsync_dir(path.parent)
    shutil.rmtree(aside, ignore_errors=True)


@contextmanager
def atomic_directory(final: str | Path) -> Iterator[Path]:
    """Yield a hidden temporary directory next to `final`; on success make it `final` atomically.

    Every file is fsynced before the rename. An existing `final` is renamed aside, the new one
    renamed in, then the old deleted, so at every instant `final` is either absent, the old
    directory or the new one. On any error the temporary directory is removed; running out of
    space raises DiskFullError naming `final`.
    """
    final = Path(final)
    tmp = _sibling(final, TMP_SUFFIX)
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)  # left by an earlier crash
    try:
        tmp.mkdir()
        yield tmp
        fsync_tree(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC and not isinstance(e, DiskFullError):
            raise DiskFullError(final) from e
        raise
    if final.exists():
        aside = _sibling(final, ASIDE_SUFFIX)
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(tmp, final)
        fsync_dir(final.parent)
