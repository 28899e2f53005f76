"""Generation engines behind one small interface: token ids in, completion token ids out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingParams:
    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int = 256


@dataclass
class Rollout:
    """Completions for prompts repeated n times, prompt-major: rows i*n .. i*n+n-1 share prompt i."""
    completion_ids: list[list[int]]
    """Generated tokens, ending with the EOS token when the model stopped on its own."""
    truncated: list[bool]
    """True when the completion hit max_new_tokens without an EOS."""
    decode_steps: int = 0
    """Forward passes spent decoding (for throughput metrics)."""


from .hf import HFEngine  # noqa: E402

__all__ = ["HFEngine", "Rollout", "SamplingParams"]
