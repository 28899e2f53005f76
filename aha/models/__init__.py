"""Models: load, set up and save (load.py), the offline zoo of known models (zoo.py), pad and EOS ids (tokens.py), tiny models built in code (tiny.py)."""

from .load import (DTYPES, context_length, disable_dropout, interpolate_weights, load_model, load_tokenizer,
                   save_model, setup_model, weight_snapshot)
from .tokens import ensure_pad_token, eos_ids

__all__ = ["DTYPES", "context_length", "disable_dropout", "ensure_pad_token", "eos_ids", "interpolate_weights",
           "load_model", "load_tokenizer", "save_model", "setup_model", "weight_snapshot"]
