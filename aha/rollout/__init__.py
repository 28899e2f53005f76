"""Generation: the Engine interface and its records (base.py), and the in-process engine (hf.py)."""

from .base import Engine, Rollout, SamplingParams
from .hf import HFEngine, sample_tokens

__all__ = ["Engine", "HFEngine", "Rollout", "SamplingParams", "sample_tokens"]
