"""aha: GRPO on verifiable rewards for Hugging Face causal LMs, with a TRL-style API."""

from .train.config import GRPOConfig, SFTConfig
from .train.grpo import GRPOTrainer
from .train.sft import SFTTrainer

__version__ = "0.1.0"
__all__ = ["GRPOConfig", "GRPOTrainer", "SFTConfig", "SFTTrainer"]
