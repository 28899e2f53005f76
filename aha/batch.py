"""What flows through one GRPO step: the batch of episodes (`GRPOBatch`) and what the update adds up (`LossSums`).

Token-level: every sequence carries a loss mask (1 on the tokens the model wrote, 0 on environment and tool
tokens, which are context only) and an advantage per token (an outcome reward's advantage is one value
broadcast over the sequence; process supervision gives each token its own, from the step rewards it carries). This file imports nothing of aha: the experience box (aha.rollout), the learner
and the Ray layer (aha.dist) all read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class GRPOBatch:
    """One step's episodes, prompt-major: sequences i*G .. i*G+G-1 answer prompt i. N = B*G."""

    rows: list[dict]                   # B dataset rows
    prompt_ids: list[list[int]]        # N prompt token ids (row i's repeated G times; an episode's own prompt)
    completion_ids: list[list[int]]    # N: every token after the prompt (model turns and, in episodes, tool turns)
    texts: list[str]                   # N decoded completions
    truncated: Tensor                  # [N] bool: cut by max_completion_length (or the tool-call limit) unfinished
    rewards_per_func: Tensor           # [N,F] NaN = excluded
    rewards: Tensor                    # [N] weighted sum; NaN when no function gave a value
    advantages: Tensor                 # [N] the sequence's advantage (what its tokens carry, for an outcome reward)
    versions: Tensor                   # [N] long: weight version that sampled each sequence
    behaviour_logprobs: list[Tensor] | None = None  # N x [len(completion)]: log mu(token) at sampling time (0 on tool tokens)
    loss_mask: list[Tensor] | None = None           # N x [len(completion)] long: 1 model token, 0 environment token
    token_advantages: list[Tensor] | None = None    # N x [len(completion)] float32: the advantage of each token
    episodes: list[dict] | None = None              # N turn records of multi-turn episodes (None: single turn)
    steps: list[list[tuple]] | None = None          # N x [(end char, end token, function index, score)] step rewards

    def __post_init__(self):
        if self.loss_mask is None:  # a single-turn completion: every token is the model's
            self.loss_mask = [torch.ones(len(c), dtype=torch.long) for c in self.completion_ids]
        if self.token_advantages is None:
            self.set_advantages(self.advantages)

    def set_advantages(self, advantages: Tensor) -> None:
        """Sequence advantages [N], each broadcast over its sequence's model tokens (an outcome reward's advantage;
        environment tokens carry 0, and no loss either)."""
        assert advantages.shape == (len(self.completion_ids),), advantages.shape
        self.advantages = advantages
        self.token_advantages = [a.expand(len(m)) * m.to(advantages.dtype) for a, m in zip(advantages, self.loss_mask)]

    def set_token_advantages(self, advantages: Tensor) -> None:
        """Advantages per token [N,T] (process supervision: each token its own), kept on each sequence's model
        tokens; a sequence's `advantages` entry is then its first token's (the sum of all its steps')."""
        assert advantages.dim() == 2 and advantages.shape[0] == len(self.completion_ids), advantages.shape
        self.token_advantages = [advantages[i, :len(m)] * m.to(advantages.dtype) for i, m in enumerate(self.loss_mask)]
        self.advantages = torch.stack([t[0] if len(t) else t.new_zeros(()) for t in self.token_advantages])

    @property
    def prompts(self) -> list:
        """N prompts as the policy saw them: the dataset's (text or chat messages), or an episode's own."""
        if self.episodes is not None:
            return [e["prompt"] for e in self.episodes]
        G = len(self.completion_ids) // len(self.rows)
        return [r["prompt"] for r in self.rows for _ in range(G)]

    @property
    def model_tokens(self) -> Tensor:
        """[N] tokens each sequence's model wrote (environment tokens left out)."""
        return torch.tensor([int(m.sum()) for m in self.loss_mask], dtype=torch.long)

    @property
    def version(self) -> int:
        """The oldest weight version in the batch."""
        return int(self.versions.min())

    @property
    def group_size(self) -> int:
        return len(self.completion_ids) // len(self.rows)

    def groups(self, keep: list[int]) -> "GRPOBatch":
        """The batch of groups `keep` (indices into rows), in that order."""
        G = self.group_size
        seqs = [g * G + j for g in keep for j in range(G)]

        def pick(name: str, value):
            if name == "rows":
                return [value[g] for g in keep]
            if value is None:
                return None
            return value[seqs] if isinstance(value, Tensor) else [value[i] for i in seqs]
        return GRPOBatch(**{f.name: pick(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)})

    @staticmethod
    def cat(parts: list["GRPOBatch"]) -> "GRPOBatch":
        """Batches of the same group size, one after another."""
        def join(name: str):
            values = [getattr(p, name) for p in parts]
            if name == "steps" and any(v is not None for v in values):  # a part without step rewards: none there
                values = [[[] for _ in p.completion_ids] if v is None else v for v, p in zip(values, parts)]
            if any(v is None for v in values):
                return None
            return torch.cat(values) if isinstance(values[0], Tensor) else [x for v in values for x in v]
        return GRPOBatch(**{f.name: join(f.name) for f in dataclasses.fields(GRPOBatch)})


@dataclass
class LossSums:
    """What the micro-steps of one update add up; token sums are over the model's tokens in the loss."""

    loss: float = 0.0          # sum of the aggregated micro-batch losses
    tokens: float = 0.0        # model tokens in the loss
    kl: float = 0.0            # token sum of the KL estimate
    entropy: float = 0.0       # token sum of the policy entropy
    clip_low: float = 0.0      # tokens clipped at 1 - epsilon (A < 0)
    clip_high: float = 0.0     # tokens clipped at 1 + epsilon_high (A > 0)
    processed: int = 0         # prompt + completion tokens through forward and backward
    stale_tokens: float = 0.0  # tokens sampled by older weights (off-policy)
    is_weight: float = 0.0     # token sum of their behaviour weights
    is_clipped: float = 0.0    # stale tokens whose weight hit off_policy_is_cap
    is_max: float = 0.0        # largest behaviour weight (a max, not a sum)
    fresh_tokens: float = 0.0  # tokens sampled by the current weights, with the engine's log-prob
    mismatch_kl: float = 0.0   # their token sum of the k3 estimate of KL(mu || pi), mu the engine's, pi the learner's
    mismatch_ratio: float = 0.0  # their token sum of pi / mu
    mismatch_max: float = 0.0  # their largest |log pi - log mu| (a max, not a sum)
    is_corrected: float = 0.0  # tokens whose weight vllm_importance_sampling_correction truncated or masked
    seq_masked: float = 0.0    # tokens off_policy_mask_threshold dropped
    positive_tokens: float = 0.0  # model tokens of positive episodes (positive_nll_coef)
    positive_nll: float = 0.0     # their token sum of -log pi

    MAXIMA = ("is_max", "mismatch_max")
    """Fields that are maxima: added by max, and across ranks by a MAX reduction."""

    def __add__(self, other: "LossSums") -> "LossSums":
        return LossSums(*(max(getattr(self, f.name), getattr(other, f.name)) if f.name in self.MAXIMA
                          else getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))

    def as_tensor(self) -> Tensor:
        return torch.tensor([float(getattr(self, f.name)) for f in dataclasses.fields(self)], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: Tensor) -> "LossSums":
        return cls(*t.tolist())
