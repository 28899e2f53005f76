"""Checkpoints that resume exactly and never look complete when they are not.

A checkpoint is written into a hidden temporary directory and renamed into place in one step, so
a crash mid-write leaves only the temporary directory, which `latest_checkpoint` ignores.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

_NAME = re.compile(r"^checkpoint-(\d+)$")


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(output_dir: str | Path, step: int, model, optimizer, scheduler,
                    state: dict, keep: int = 2) -> Path:
    """Write checkpoint-<step>: trainable weights, optimiser, scheduler, RNGs and `state`."""
    output_dir = Path(output_dir)
    final, tmp = output_dir / f"checkpoint-{step}", output_dir / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    torch.save(weights, tmp / "trainable.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save({"rng": rng_state(), **state}, tmp / "state.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))
    for f in tmp.iterdir():  # data on disk before the rename makes it visible
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(output_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir()
             if (m := _NAME.match(p.name)) and (p / "trainer_state.json").is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def load_checkpoint(path: str | Path, model, optimizer, scheduler) -> dict:
    """Restore weights, optimiser, scheduler and RNGs in place; return the saved `state`."""
    path = Path(path)
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no trainer_state.json)")
    weights = torch.load(path / "trainable.pt", map_location="cpu")
    params = dict(model.named_parameters())
    missing = [n for n in weights if n not in params]
    if missing:
        raise ValueError(f"checkpoint {path} has weights the model lacks: {missing[:5]}")
    with torch.no_grad():
        for n, w in weights.items():
            params[n].copy_(w)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu"))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu"))
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    set_rng_state(state.pop("rng"))
    return state
