"""Generation engines by name (`engine: hf` in the config). A new engine (vLLM, SGLang) is one new file here with
a class that implements `base.Engine` and a `for_model(model, tokenizer, max_batch, **options)` constructor, plus
one line in ENGINES; its module is imported only when a run names it, so an engine's own package is needed only then.

Every stage builds its engine as `get_engine(name)(model, tokenizer, max_batch)`; `options` are the engine's own
keyword arguments (hf: eos_token_ids, layer_cache, cuda_graphs), which only benchmarks of the engine itself pass,
and an option the engine does not take is a TypeError naming it. Outside aha/rollout/ no engine is built any
other way (tests/test_layout.py)."""

from __future__ import annotations

import importlib
from typing import Callable

ENGINES: dict[str, str] = {
    "hf": "aha.rollout.hf:HFEngine",
}
"""Engine name -> "module:Class" of an Engine with a `for_model(model, tokenizer, max_batch, **options)` classmethod."""


def get_engine(name: str) -> Callable:
    """The `for_model` constructor of engine `name`; an unknown name raises, listing the valid ones."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine '{name}'; valid: {sorted(ENGINES)}")
    module, _, cls = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls).for_model
