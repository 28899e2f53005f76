"""Rollouts: the Engine interface and its records (base.py), engines by name (engines.py, the in-process hf.py),
the prompts a run draws (prompts.py), the turn loop of an agent's episodes (turns.py) and the experience box that
turns prompts into a scored, token-level batch (experience.py)."""

from .base import Engine, Rollout, SamplingParams
from .engines import ENGINES, get_engine

__all__ = ["ENGINES", "Engine", "HFEngine", "Rollout", "SamplingParams", "get_engine", "sample_tokens"]


def __getattr__(name: str):
    """The hf engine imports transformers' model code, so it loads on first use: a config names an engine
    without loading one."""
    if name in ("HFEngine", "sample_tokens"):
        from . import hf
        return getattr(hf, name)
    raise AttributeError(f"module 'aha.rollout' has no attribute {name!r}")
