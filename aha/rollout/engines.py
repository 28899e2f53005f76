"""Generation engines by name (`engine: hf` in the config). A new engine (vLLM, SGLang) is one new file here with
a class that implements `base.Engine` and a `for_model(model, tokenizer, max_batch)` constructor, plus one line
in ENGINES; its module is imported only when a run names it, so an engine's own package is needed only then."""

from __future__ import annotations

import importlib
from typing import Callable

ENGINES: dict[str, str] = {
    "hf": "aha.rollout.hf:HFEngine",
}
"""Engine name -> "module:Class" of an Engine with a `for_model(model, tokenizer, max_batch)` classmethod."""


def get_engine(name: str) -> Callable:
    """The `for_model` constructor of engine `name`; an unknown name raises, listing the valid ones."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine '{name}'; valid: {sorted(ENGINES)}")
    module, _, cls = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls).for_model
