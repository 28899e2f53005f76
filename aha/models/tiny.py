"""Tiny models built entirely in code: a BPE tokenizer trained on the task's own texts and a
randomly initialised Llama/Qwen2 causal LM, so tests, the CPU demo and benchmarks need no download.

With the default special tokens and tags the ids are fixed whatever the corpus: 0 `<|endoftext|>`
(pad), 1 `<|im_start|>`, 2 `<|im_end|>` (eos), 3 `<think>`, 4 `</think>`, 5 `<answer>`,
6 `</answer>`; there is no BOS token (ChatML needs none, as in Qwen2).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from ..fileio import atomic_directory

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN)
TAGS = ("<think>", "</think>", "<answer>", "</answer>")  # added tokens that decoding keeps

# Qwen2's pre-tokenizer split (GPT-2's, but one token per digit). Not the `tokenizers` Digits +
# ByteLevel pair: transformers 5 loads any model_type "qwen2" directory with Qwen2Tokenizer, which
# rebuilds NFC + this split + ByteLevel from vocab and merges, ignoring tokenizer.json's pipeline.
# With the same pipeline here, both archs reload to exactly the tokenizer that was trained.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
               r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

TINY_CONTEXT = 8192
"""Context of the models built in code: room for reasoning-length rollouts (4,096 new tokens after a prompt).
Positions are rotary with no learned table, so the number changes no weight and no output."""

# Shapes per named size; exact parameter counts are in build_model's docstring.
SIZES: dict[str, dict] = {
    "tiny": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    "small": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=4),
    "demo": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=4),
    "4m": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=6,
               num_attention_heads=4, num_key_value_heads=4),
    "30m": dict(hidden_size=512, intermediate_size=1792, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=8),
    "qwen2-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, rms_norm_eps=1e-6,
                       rope_theta=1_000_000.0, max_position_embeddings=32768),
}


def _archs() -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    return {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def _without(texts: Iterable[str], tokens: Sequence[str]) -> Iterator[str]:
    """The texts cut at every special token or tag: the BPE trainer would otherwise learn merges
    such as `<|` from them, wasting vocabulary on strings that are always single added tokens."""
    pattern = re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))
    for text in texts:
        yield from (piece for piece in pattern.split(text) if piece)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512,
                    special_tokens: Sequence[str] = SPECIAL_TOKENS, tags: Sequence[str] = TAGS):
    """Byte-level BPE with one token per digit, so arithmetic is not hidden inside merges. No
    unknown tokens; decode(encode(x)) == x for NFC text (any ASCII). len(result) <= vocab_size,
    fewer when the texts are too small to learn that many merges. Deterministic in the texts."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    missing = {PAD_TOKEN, EOS_TOKEN} - set(special_tokens)
    if missing:
        raise ValueError(f"special_tokens must include {sorted(missing)}")
    added = list(special_tokens) + list(tags)
    if vocab_size < 256 + len(added):
        raise ValueError(f"vocab_size {vocab_size} < 256 bytes + {len(added)} added tokens")

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),  # \p{N}: one token per digit
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=added, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_without(texts, added), trainer=trainer)

    # The trainer gives the tags fixed low ids but marks them special; unmark them so that
    # decode(..., skip_special_tokens=True) keeps <think>/<answer> in completions. The empty
    # affixes mean the same as the trainer's nulls and are what Qwen2Tokenizer rebuilds.
    spec = json.loads(tok.to_str())
    for entry in spec["added_tokens"]:
        if entry["content"] in tags:
            entry["special"] = False
    spec["model"].update(continuing_subword_prefix="", end_of_word_suffix="")
    tok = Tokenizer.from_str(json.dumps(spec))

    # <|im_start|> is special in the backend (skip_special_tokens drops it) but not listed as an
    # extra special token: transformers 5 would save that list in a form 4.x cannot read.
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token=EOS_TOKEN,
                                 pad_token=PAD_TOKEN, clean_up_tokenization_spaces=False)
    hf.chat_template = CHATML_TEMPLATE
    return hf


def build_config(tokenizer, size: str = "tiny", arch: str = "llama", overrides: dict | None = None):
    """The transformers config of a named size; `overrides` wins over the size's shapes. A larger
    vocab_size is allowed (padded embeddings, as real checkpoints have), a smaller one not."""
    if size not in SIZES:
        raise ValueError(f"unknown size '{size}'; valid: {sorted(SIZES)}")
    if arch not in _archs():
        raise ValueError(f"unknown arch '{arch}'; valid: {sorted(_archs())}")
    kwargs = dict(vocab_size=len(tokenizer), max_position_embeddings=TINY_CONTEXT, tie_word_embeddings=True,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    kwargs.update(SIZES[size])
    kwargs.update(overrides or {})
    if kwargs["vocab_size"] < len(tokenizer):
        raise ValueError(f"vocab_size {kwargs['vocab_size']} < len(tokenizer) {len(tokenizer)}")
    config_cls, _ = _archs()[arch]
    return config_cls(**kwargs)


def num_params(config) -> int:
    """Unique parameters (tied embeddings counted once), built on the meta device: no memory."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def build_model(tokenizer, size: str = "tiny", arch: str = "llama", seed: int = 0,
                overrides: dict | None = None):
    """A randomly initialised float32 causal LM on the CPU; the same seed gives the same weights
    and the global RNG is left as it was. Tied embeddings, so counts depend on the vocab; at
    vocab 512 (train_tokenizer's default, when the texts are rich enough to reach it):

        size         llama         qwen2 (adds q/k/v biases)
        tiny         131,392       131,648       hidden 64, 2 layers: for unit tests
        small        918,656       920,192       hidden 128, 4 layers: the CPU demo
        demo         3,541,248     3,544,320     hidden 256, 4 layers: a larger CPU model
        4m           4,066,560     4,071,168     hidden 256, 6 layers: benchmarks
        30m          30,679,552    30,691,840    hidden 512, 8 layers: benchmarks
        qwen2-0.5b   358,329,216   358,356,864   Qwen2-0.5B shapes, for GPU throughput

    With Qwen2-0.5B's real vocab, overrides={"vocab_size": 151936}, qwen2 has 494,032,768.
    """
    from transformers import GenerationConfig
    config = build_config(tokenizer, size, arch, overrides)
    _, model_cls = _archs()[arch]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id,
                                               eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    return model.eval()


def _fix_tokenizer_config(config_file: Path) -> None:
    """Two transformers-5 quirks: it names the generic class TokenizersBackend, unknown to 4.x
    (e.g. beside vLLM), where PreTrainedTokenizerFast means the same to both; and Qwen2Tokenizer
    defaults a missing unk_token to <|endoftext|>, so say there is none."""
    config = json.loads(config_file.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.setdefault("unk_token", None)
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def save_pretrained_dir(model, tokenizer, path: str | os.PathLike) -> Path:
    """A normal Hugging Face model directory, written beside `path` and renamed into place, so a
    reader never sees a half-written one (aha.fileio.atomic_directory)."""
    with atomic_directory(path) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp, save_jinja_files=False)  # template in tokenizer_config
        _fix_tokenizer_config(tmp / "tokenizer_config.json")
    return path


def make_tiny(path: str | os.PathLike, texts: Iterable[str], size: str = "tiny",
              arch: str = "llama", vocab_size: int = 512, seed: int = 0,
              overrides: dict | None = None) -> Path:
    """Tokenizer + model + directory in one call, for tests and the demo."""
    tokenizer = train_tokenizer(texts, vocab_size)
    model = build_model(tokenizer, size, arch, seed, overrides)
    return save_pretrained_dir(model, tokenizer, path)


def random_model_dir(size: str, arch: str = "llama", overrides: dict | None = None) -> Path:
    """A new temporary directory holding a random model of `size` (config `overrides` applied) and its 512-token
    tokenizer trained on short sums: what the speed benchmarks decode with."""
    import tempfile
    texts = [f"{i} plus {i * 7} is {i * 8}" for i in range(500)]
    return make_tiny(tempfile.mkdtemp() + "/m", texts, size=size, arch=arch, overrides=overrides)


def random_model(size: str, arch: str = "llama", overrides: dict | None = None):
    """`random_model_dir`'s model as transformers loads it from disk, in eval mode."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(random_model_dir(size, arch, overrides)).eval()
