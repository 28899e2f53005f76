"""Checkpoints that resume exactly and never look complete when they are not.

A checkpoint is written into a hidden temporary directory and renamed into place in one step
(`atomic_directory`), so a crash mid-write leaves only the temporary directory. Its marker file is
written last, after every other file is on disk, and `list_checkpoints` only lists directories
that have it. Every file is loaded with `weights_only=True`: tensors and plain values, no code.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from ..fileio import atomic_directory, fsync_tree, remove_directory

_NAME = re.compile(r"^checkpoint-(\d+)$")
MARKER = "trainer_state.json"
"""Written last: a checkpoint directory without it is incomplete and ignored."""
FILES = ("trainable.pt", "optimizer.pt", "scheduler.pt", "state.pt")
"""What a complete checkpoint holds besides the marker."""
REFERENCE = "reference.pt"
"""The reference model's weights, only when training moves it (GRPO's sync_ref_model); otherwise the reference
is the initial model, rebuilt at start-up, and the checkpoint does not hold it."""
_NUMPY_GENERATOR = "MT19937"


class CorruptCheckpointError(ValueError):
    """A checkpoint file is missing, truncated or not a plain tensor file; names the file."""


def rng_state() -> dict:
    """Python, NumPy and torch RNG states as tensors and plain values (loadable with weights_only)."""
    version, keys, gauss = random.getstate()
    _, np_keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": {"version": version, "keys": torch.tensor(keys, dtype=torch.int64), "gauss": gauss},
             "numpy": {"keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["keys"].tolist()), py["gauss"]))
    np.random.set_state((_NUMPY_GENERATOR, npy["keys"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(output_dir: str | Path, step: int, model, optimizer, scheduler,
                    state: dict, keep: int = 2, tokenizer=None, reference=None, config: dict | None = None) -> Path:
    """Write checkpoint-<step>: trainable weights, optimiser, scheduler, RNGs and `state`, (with a
    tokenizer) the model as `from_pretrained` loads it, or the LoRA adapter, as TRL's checkpoints hold, and
    (with `reference`, a module) every parameter of the reference model as REFERENCE. `config` (plain values:
    the run's settings, which a resume is checked against) goes into the marker."""
    output_dir = Path(output_dir)
    final = output_dir / f"checkpoint-{step}"
    for stale in output_dir.glob(".checkpoint-*"):  # left by a save or delete that was killed
        shutil.rmtree(stale, ignore_errors=True)
    with atomic_directory(final) as tmp:
        weights = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
        torch.save(weights, tmp / "trainable.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save({"rng": rng_state(), **state}, tmp / "state.pt")
        if reference is not None:
            torch.save({n: p.detach().cpu() for n, p in reference.named_parameters()}, tmp / REFERENCE)
        if tokenizer is not None:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
        fsync_tree(tmp)  # every file on disk before the marker says the checkpoint is complete
        (tmp / MARKER).write_text(json.dumps({"step": step, **({"config": config} if config else {})}))
    for old in list_checkpoints(output_dir)[:-keep] if keep > 0 else []:
        remove_directory(old)
    return final


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints (those with the marker), oldest first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir()
             if (m := _NAME.match(p.name)) and (p / MARKER).is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def checkpoint_info(path: str | Path) -> dict:
    """The marker's contents: {"step": N} and, from an aha that stores it, {"config": the run's settings}."""
    marker = Path(path) / MARKER
    if not marker.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER})")
    try:
        info = json.loads(marker.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError(f"cannot read checkpoint file {marker}: {e}") from e
    if not isinstance(info, dict) or not isinstance(info.get("step"), int):
        raise CorruptCheckpointError(f"checkpoint file {marker} has no step")
    return info


def _load(file: Path):
    """torch.load with weights_only=True; any failure is one CorruptCheckpointError naming the file."""
    if not file.is_file():
        raise CorruptCheckpointError(f"checkpoint file {file} is missing")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - truncation and foreign pickles raise many types
        reason = (str(e).strip().splitlines() or [""])[0]
        raise CorruptCheckpointError(f"cannot load checkpoint file {file} (tensors and plain values only): "
                                     f"{type(e).__name__}: {reason}") from e


def load_checkpoint(path: str | Path, model, optimizer, scheduler, reference=None) -> dict:
    """Restore weights, optimiser, scheduler and RNGs in place; return the saved `state`. With `reference`
    (the reference model) and a REFERENCE file in the checkpoint, restore the reference's weights too; a
    checkpoint without one (written with a fixed reference) leaves it as it is, the initial model.

    Every file is read before anything is restored, so a damaged checkpoint leaves the model,
    optimiser and RNGs untouched and the caller can fall back to an older one.
    """
    path = Path(path)
    if not (path / MARKER).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER})")
    weights, opt_state, sched_state, state = (_load(path / name) for name in FILES)
    ref_weights = _load(path / REFERENCE) if reference is not None and (path / REFERENCE).is_file() else None
    params = dict(model.named_parameters())
    missing = [n for n in weights if n not in params]
    if missing:
        raise ValueError(f"checkpoint {path} has weights the model lacks: {missing[:5]}")
    wrong = [f"{n} {tuple(w.shape)} (the model's: {tuple(params[n].shape)})" for n, w in weights.items()
             if w.shape != params[n].shape]
    if wrong:  # checked before anything is copied: a checkpoint of another model leaves this one as it was
        raise ValueError(f"checkpoint {path} is of another model: {', '.join(wrong[:3])}")
    ref_params = dict(reference.named_parameters()) if ref_weights is not None else {}
    if ref_weights is not None and ref_weights.keys() != ref_params.keys():
        raise ValueError(f"checkpoint {path / REFERENCE} does not match the reference model: "
                         f"{sorted(ref_weights.keys() ^ ref_params.keys())[:5]}")
    with torch.no_grad():
        for n, w in weights.items():
            params[n].copy_(w)
        for n, w in (ref_weights or {}).items():
            ref_params[n].copy_(w)
    optimizer.load_state_dict(opt_state)
    scheduler.load_state_dict(sched_state)
    set_rng_state(state.pop("rng"))
    return state
