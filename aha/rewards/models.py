"""Rewards that hold a model: TRL's reward model (a sequence classifier's score of prompt + completion) and a
generative judge (a causal LM asked a rubric, its reply parsed). The process reward model (prm.py) is the third.

They share one base, `ModelReward`: the model in eval mode, run without gradients on the device `to` names (the
trainer's: the policy's), `batch_size` completions per forward pass, one call at a time. Each call is bounded by
reward_timeout like every reward's (aha.rewards.scoring): a call past it is excluded and counted.

One rule for every model reward: a checkpoint whose scoring head is not in its weights is refused, naming it.
TRL loads any checkpoint with AutoModelForSequenceClassification, which starts a missing head from random values
and trains the policy on their noise; aha says so instead (docs/from-trl.md).
"""
from __future__ import annotations

import abc
import json
import re
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from .base import Reward, completion_text

WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
"""Where a sharded checkpoint lists its tensors by name."""


def weight_names(name_or_path: str) -> set[str] | None:
    """The names of the tensors a model directory (or a cached hub id) holds, read from its index or the headers of
    its safetensors files (no tensor is loaded); None where there is nothing to read."""
    from safetensors import safe_open

    from ..models.load import resolve
    path = Path(resolve(name_or_path))
    if not path.is_dir():
        from huggingface_hub import snapshot_download
        try:
            path = Path(snapshot_download(str(name_or_path), local_files_only=True))
        except Exception:  # noqa: BLE001 - not in the cache: nothing to read
            return None
    for index in WEIGHT_INDEXES:
        if (path / index).is_file():
            return set(json.loads((path / index).read_text())["weight_map"])
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    names: set[str] = set()
    for file in files:
        with safe_open(file, framework="pt") as f:
            names.update(f.keys())
    return names


def untrained_head(model, name_or_path: str) -> list[str]:
    """The parameters of `model`'s head (those outside its base model) that its checkpoint does not hold: a head
    from_pretrained initialised afresh, whose scores are noise. (A head tied to the embeddings is not a parameter
    of its own, so a causal LM with tied embeddings has nothing missing.)"""
    prefix = model.base_model_prefix + "."
    names = weight_names(name_or_path)
    if names is None:
        return []
    return sorted(n for n, _ in model.named_parameters() if not n.startswith(prefix) and n not in names)


def check_head(model, name_or_path: str, kind: str, wanted: str, what: str, hint: str) -> None:
    """Refuse a checkpoint that was saved as another kind of model than `kind` (an architecture suffix such as
    "ForSequenceClassification"), or whose head is not in its weights. `what` names the setting, `wanted` the
    model it must be, `hint` how to get one."""
    saved_as = model.config.architectures or []
    if saved_as and not any(a.endswith(kind) for a in saved_as):
        raise ValueError(f"{what} {name_or_path!r} is a {saved_as[0]}, not a {wanted} ({hint})")
    missing = untrained_head(model, name_or_path)
    if missing:
        raise ValueError(f"{what} {name_or_path!r} has no trained score head: {', '.join(missing)} not in its weights "
                         f"(a {type(model).__name__} would start it from random values); {hint}")


def load_checked(name_or_path: str, auto_class, kind: str, wanted: str, what: str, hint: str, dtype: str = "float32",
                 device: str | None = None, **extra):
    """(model, tokenizer) of a checkpoint loaded by `auto_class` and passed by check_head. Errors name `what`."""
    from ..models import load_model, load_tokenizer
    try:
        model = load_model(name_or_path, dtype, device=device, auto_class=auto_class, **extra)
        tokenizer = load_tokenizer(name_or_path)
    except (ValueError, OSError) as e:
        raise ValueError(f"{what} {name_or_path!r}: {e}") from e
    check_head(model, name_or_path, kind, wanted, what, hint)
    return model, tokenizer


def padded(rows: list[list[int]], pad_id: int, device, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded ids [n, L] and their attention mask [n, L]: right-padded, or left-padded for generation."""
    width = max(map(len, rows))
    pads = [[pad_id] * (width - len(r)) for r in rows]
    ids = [p + r if left else r + p for r, p in zip(rows, pads)]
    mask = [[0] * len(p) + [1] * len(r) if left else [1] * len(r) + [0] * len(p) for r, p in zip(rows, pads)]
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device)                # [n, L] each


class ModelReward(Reward):
    """Base of the rewards that hold a model: `score(prompts, completions)` runs under torch.inference_mode, in
    the attention kernels of aha's own forward passes, one call at a time (streamed rewards call from helper
    threads); `batches(n)` cuts a call into forward passes of `batch_size`."""

    def __init__(self, model, tokenizer, batch_size: int = 16):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"{self.name}: batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        self._lock = threading.Lock()

    def to(self, device) -> "ModelReward":
        """Run the model on `device` (the trainer's: the policy's)."""
        self.model.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def batches(self, n: int) -> Iterator[range]:
        """The forward passes of n inputs: ranges of at most batch_size."""
        return (range(s, min(s + self.batch_size, n)) for s in range(0, n, self.batch_size))

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list:
        from ..models.load import attention_kernels
        with self._lock, torch.inference_mode(), attention_kernels(self.device):
            return self.score(prompts, completions)

    @abc.abstractmethod
    def score(self, prompts: list, completions: list) -> list:
        """One value per completion (a list of (end, score) steps for a step reward)."""


def model_name(model, fallback: str) -> str:
    """A reward model's name for metrics, as TRL's: the last part of its model id or directory."""
    return Path(str(getattr(model, "name_or_path", "") or "")).name or fallback


def tokenizer_of(model, tokenizer, what: str):
    """The tokenizer given, else the one saved beside the model (TRL's reward_processing_classes default)."""
    from ..models import load_tokenizer
    from ..models.tokens import ensure_pad_token
    if tokenizer is not None:
        return ensure_pad_token(tokenizer)
    source = getattr(model, "name_or_path", "")
    if not source:
        raise ValueError(f"{what} {type(model).__name__} was built in memory and names no tokenizer: pass its "
                         "tokenizer in reward_processing_classes")
    return load_tokenizer(source)


def reward_text(tokenizer, prompt: Any, completion: Any, template_kwargs: dict | None = None) -> str:
    """What TRL's reward model reads: prompt + completion, a conversation's through the tokenizer's chat template.

    Example: ("2+2=", " 4") -> "2+2= 4"; with ChatML, ([user "2+2"], [assistant "4"]) ->
    '<|im_start|>user\\n2+2<|im_end|>\\n<|im_start|>assistant\\n4<|im_end|>\\n'.
    """
    if isinstance(prompt, list):
        messages = prompt + (completion if isinstance(completion, list) else
                             [{"role": "assistant", "content": completion_text(completion)}])
        return tokenizer.apply_chat_template(messages, tokenize=False, **(template_kwargs or {}))
    return prompt + completion_text(completion)


class SequenceClassifierReward(ModelReward):
    """TRL's reward model: a sequence classifier with one label whose logit scores prompt + completion
    (reward_text), read at the last token that is not padding. `model` is a model id, a directory or a loaded
    `*ForSequenceClassification` module; `tokenizer` its tokenizer (TRL's reward_processing_classes; default:
    the one saved beside it)."""

    name = "reward_model"

    def __init__(self, model, tokenizer=None, batch_size: int = 16, dtype: str = "float32",
                 device: str | None = None, template_kwargs: dict | None = None):
        from transformers import AutoModelForSequenceClassification
        kind, wanted = "ForSequenceClassification", "sequence-classification reward model"
        hint = "train a reward model, e.g. with TRL's RewardTrainer, or wrap yours in a reward function"
        if isinstance(model, str):
            model, saved = load_checked(model, AutoModelForSequenceClassification, kind, wanted, "reward model", hint,
                                        dtype, device)
            tokenizer = tokenizer or saved
        elif not type(model).__name__.endswith(kind):
            raise TypeError(f"reward model {type(model).__name__}: not a {wanted} (a *{kind} module, a model id or "
                            "a directory); wrap other models in a reward function f(prompts, completions, **kw)")
        if model.config.num_labels != 1:
            raise ValueError(f"reward model {model_name(model, type(model).__name__)!r} has "
                             f"{model.config.num_labels} labels; a reward model has 1 (its score)")
        super().__init__(model, tokenizer_of(model, tokenizer, "reward model"), batch_size)
        self.__name__ = model_name(model, self.name)
        self.template_kwargs = template_kwargs or {}
        self.model.config.pad_token_id = self.tokenizer.pad_token_id  # the last non-pad token is where it reads

    def score(self, prompts: list, completions: list) -> list[float]:
        texts = [reward_text(self.tokenizer, p, c, self.template_kwargs) for p, c in zip(prompts, completions)]
        out: list[float] = []
        for part in self.batches(len(texts)):
            rows = [self.tokenizer(texts[i], add_special_tokens=False)["input_ids"] for i in part]
            ids, mask = padded(rows, self.pad_id, self.device)
            out += self.model(input_ids=ids, attention_mask=mask).logits[:, 0].float().tolist()   # [n]
        return out


JUDGE_PROMPT = ("Rate the response to the request below from 0 (useless) to 10 (perfect): is it correct, "
                "helpful and no longer than it needs to be? Reply with the number only.\n\n"
                "Request:\n{prompt}\n\nResponse:\n{completion}")
"""The judge's default rubric: `{prompt}` and `{completion}` are the texts of the request and the response."""
JUDGE_SCALE = 10.0
"""The top of the default rubric's scale; the default parser divides by it, so rewards lie in [0, 1]."""
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def first_number(reply: str, scale: float = JUDGE_SCALE) -> float | None:
    """The judge's default parser: the first number in its reply over `scale`; None (no reward: excluded and
    counted) when there is none or it lies outside [0, scale].

    >>> first_number(" 7/10"), first_number("Score: 10"), first_number("great"), first_number("12")
    (0.7, 1.0, None, None)
    """
    found = NUMBER.search(reply)
    value = float(found.group()) if found else None
    return value / scale if value is not None and 0 <= value <= scale else None


class JudgeReward(ModelReward):
    """A generative judge: a causal LM asked `prompt` (a rubric with `{prompt}` and `{completion}`, default
    JUDGE_PROMPT) as one user message through its chat template (the raw text when it has none), answering
    greedily in at most `max_new_tokens`; `parse(reply)` turns the reply into a reward, or None where it gives
    none (default first_number: 0-10 over 10). A reply that parses to nothing is counted as `unparsed`."""

    name = "judge"

    def __init__(self, model, tokenizer=None, prompt: str = JUDGE_PROMPT, parse: Callable[[str], float | None] =
                 first_number, max_new_tokens: int = 8, batch_size: int = 16, dtype: str = "float32",
                 device: str | None = None):
        from transformers import AutoModelForCausalLM
        if "{completion}" not in prompt:
            raise ValueError("judge prompt must contain {completion} (and may contain {prompt}): the text it rates")
        if isinstance(model, str):
            model, saved = load_checked(model, AutoModelForCausalLM, "ForCausalLM", "causal language model",
                                        "judge model", "a judge answers in text: give it a causal LM", dtype, device)
            tokenizer = tokenizer or saved
        elif not hasattr(model, "generate"):
            raise TypeError(f"judge model {type(model).__name__}: not a causal language model (it cannot generate)")
        super().__init__(model, tokenizer_of(model, tokenizer, "judge model"), batch_size)
        self.prompt, self.parse, self.max_new_tokens = prompt, parse, max_new_tokens

    def judge_ids(self, prompt: Any, completion: Any) -> list[int]:
        """The token ids the judge reads for one completion: the filled rubric, opened for its answer."""
        text = self.prompt.format(prompt=completion_text(prompt), completion=completion_text(completion))
        if getattr(self.tokenizer, "chat_template", None):
            return list(self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                           add_generation_prompt=True, return_dict=False))
        return self.tokenizer(text)["input_ids"]

    def score(self, prompts: list, completions: list) -> list[float | None]:
        rows = [self.judge_ids(p, c) for p, c in zip(prompts, completions)]
        replies: list[str] = []
        for part in self.batches(len(rows)):
            ids, mask = padded([rows[i] for i in part], self.pad_id, self.device, left=True)
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=self.max_new_tokens,
                                      do_sample=False, pad_token_id=self.pad_id)                  # [n, L + new]
            replies += self.tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
        values = [self.parse(r) for r in replies]
        self.count("unparsed", sum(v is None for v in values))
        return values


def is_reward_model(spec: Any) -> bool:
    """Is a reward_funcs entry TRL's reward model: a torch module, or a string that names a model (a hub id
    "org/name" or a directory) rather than a function ("module:function")?"""
    if isinstance(spec, torch.nn.Module):
        return True
    return isinstance(spec, str) and ":" not in spec and ("/" in spec or Path(spec).is_dir())
