"""aha: GRPO on verifiable rewards for Hugging Face causal LMs, with a TRL-style API."""

from ._version import __version__  # noqa: F401  (its own module: what records it imports no trainer)
from .config import GRPOConfig, SFTConfig

__all__ = ["GRPOConfig", "GRPOTrainer", "SFTConfig", "SFTTrainer"]


def __getattr__(name: str):
    """The trainers import torch and transformers, so they load on first use: `aha --help` stays fast."""
    if name == "GRPOTrainer":
        from .train.grpo import GRPOTrainer
        return GRPOTrainer
    if name == "SFTTrainer":
        from .train.sft import SFTTrainer
        return SFTTrainer
    raise AttributeError(f"module 'aha' has no attribute {name!r}")
