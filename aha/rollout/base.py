"""What every generation engine takes and returns, and the interface the trainer (and rollout workers) use."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager, Protocol, runtime_checkable

import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int = 256
    logprobs: bool = False
    """Also return each sampled token's log-probability under the tempered policy (the behaviour policy)."""


@dataclass
class Rollout:
    """Completions for prompts repeated n times, prompt-major: rows i*n .. i*n+n-1 share prompt i."""

    completion_ids: list[list[int]]
    """Generated tokens, ending with the EOS token when the model stopped on its own."""
    truncated: list[bool]
    """True when the completion hit max_new_tokens without an EOS."""
    version: int = 0
    """Weight version the engine sampled with (see Engine.update_weights)."""
    logprobs: list[list[float]] | None = None
    """With SamplingParams.logprobs: log pi(token | prefix) of each generated token, logits / temperature (0 on an
    episode's tool tokens)."""
    # An agent's episodes (aha.rollout.turns) carry more: completion_ids are then every token after the prompt,
    # the model's turns and the tool turns between them.
    loss_mask: list[list[int]] | None = None
    """Episodes: 1 on each token the model wrote, 0 on the tokens a tool or environment added (None: all 1)."""
    prompt_ids: list[list[int]] | None = None
    """Episodes: each one's own prompt ids (its environment's reset may change its prompt)."""
    episodes: list[dict] | None = None
    """Episodes: each one's prompt messages, turns (token spans, texts, tool calls and outcomes) and finish."""
    environments: list | None = None
    """Episodes: each one's environment, a live object of this process (dropped before a rollout leaves it)."""


GroupCallback = Callable[[int, Rollout], None]
"""on_group(i, rollout): prompt i's n completions (a Rollout of n rows) are finished."""

TurnCallback = Callable[[list[int], Rollout], list[tuple[list[int], int] | None]]
"""on_turn_end(rows, turns): the turns of output rows `rows` (a Rollout of those rows, in that order) ended at one
decode step; for each, (its next context, the most new tokens of its next turn) to go on in the running batch, or
None where the row is done."""


@runtime_checkable
class Engine(Protocol):
    """A generation engine: token ids in, a Rollout out. HFEngine implements it in-process; another
    engine (vLLM, a remote rollout worker) implements the same three members."""

    version: int
    """Weight version: 0 at start, set by each update_weights."""

    def generate(self, prompt_ids: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None, on_group: GroupCallback | None = None) -> Rollout:
        """n completions of each prompt, prompt-major. An engine that can tell when one prompt's n completions are
        all finished calls `on_group(i, rollout_of_those_n)` then, from the thread it generates on, so they can be
        scored while the others still decode (optional: the trainer asks only engines whose `generate` takes it)."""

    def update_weights(self, model, version: int) -> None:
        """Sample from `model`'s current weights from now on, tagged `version`."""

    # Optional: keep_caches() -> a context manager within which each generate call keeps its rows' key/value caches
    # for the next call, whose contexts extending them prefill only what was added (HFEngine.keep_caches).
    # Optional: generate(..., on_turn_end=, limits=) -> each row's turns decoded in one call, a row whose turn ends
    # going on with its next context (a TurnCallback) while the others decode (HFEngine.generate; aha.rollout.turns).


def keeping_caches(engine: Engine) -> ContextManager:
    """`engine.keep_caches()` where the engine has it (an optional member), else a context that does nothing."""
    keep = getattr(engine, "keep_caches", None)
    return keep() if keep is not None else nullcontext()
