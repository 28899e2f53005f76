"""Tiny models built in code: tokenizer properties, save/reload round trip, sizes, determinism."""

import json
import os
import random

import pytest
import torch

from aha.models.tiny import (SIZES, build_config, build_model, make_tiny, num_params, save_pretrained_dir,
                      train_tokenizer)


def _texts(n=400, seed=0):
    """Arithmetic chats in the demo's format, plus some prose for word merges."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        out.append(f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n"
                   f"<think>\n{a} + {b} = {a + b}\n</think>\n<answer>{a + b}</answer><|im_end|>\n")
    return out + ["The quick brown fox jumps over the lazy dog, then reasons step by step."] * 20


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(_texts())


def test_digits_are_single_tokens(tok):
    assert tok.tokenize("12345") == ["1", "2", "3", "4", "5"]
    assert tok.tokenize(" 2024") == ["Ġ", "2", "0", "2", "4"]


def test_special_and_tag_ids_are_fixed(tok):
    expected = ["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                "<think>", "</think>", "<answer>", "</answer>"]
    assert tok.convert_ids_to_tokens(list(range(7))) == expected
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (None, 2, 0)
    for tag_id, tag in enumerate(expected[3:], start=3):
        assert tok.encode(tag, add_special_tokens=False) == [tag_id]
    assert len(tok) <= 512


@pytest.mark.parametrize("text", [
    "<think>\nLet me add 17 + 25.\n</think>\n<answer>42</answer>",
    "  two spaces, tab\tand\n\nblank line  ",
    "x=3.14159;y=-0042 (00) ",
    "<answer> 7 </answer><think></think>",
])
def test_decode_encode_round_trip(tok, text):
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_skip_special_tokens_keeps_tags(tok):
    ids = tok.encode("<|im_start|>assistant\n<think>1</think><answer>2</answer><|im_end|>")
    kept = "assistant\n<think>1</think><answer>2</answer>"
    assert tok.decode(ids, skip_special_tokens=True) == kept


def test_chat_template_renders_chatml(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    no_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert no_prompt == rendered.removesuffix("<|im_start|>assistant\n")


def test_tokenizer_training_is_deterministic(tok):
    again = train_tokenizer(_texts())
    assert again.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_saved_dir_reloads_identically(tok, arch, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = build_model(tok, "tiny", arch)
    path = save_pretrained_dir(model, tok, tmp_path / "model")
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in path.iterdir()}
    tok_config = json.loads((path / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == tok.chat_template
    gen = json.loads((path / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (2, 0)

    model2 = AutoModelForCausalLM.from_pretrained(path)
    tok2 = AutoTokenizer.from_pretrained(path)
    # transformers 5 loads model_type qwen2 with Qwen2Tokenizer, which rebuilds the pipeline itself
    assert json.loads(tok2.backend_tokenizer.to_str()) == json.loads(tok.backend_tokenizer.to_str())
    assert (tok2.bos_token_id, tok2.eos_token_id, tok2.pad_token_id) == (None, 2, 0)
    assert tok2.chat_template == tok.chat_template
    assert model2.lm_head.weight is model2.get_input_embeddings().weight  # tied

    texts = ["<think>12 + 30 = 42</think>", "<answer>7</answer>"]
    batch = tok2(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        torch.testing.assert_close(model2(**batch).logits, model(**batch).logits)


def test_save_replaces_existing_dir_and_leaves_no_temp(tok, tmp_path):
    path = make_tiny(tmp_path / "m", _texts(50), seed=0)
    first = (path / "model.safetensors").read_bytes()
    make_tiny(tmp_path / "m", _texts(50), seed=1)
    assert (path / "model.safetensors").read_bytes() != first
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_same_seed_same_weights_other_seed_differs(tok):
    state = torch.get_rng_state()
    a, b, c = (build_model(tok, "tiny", seed=s).state_dict() for s in (0, 0, 1))
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].ndim == 2)


def test_the_long_context_changes_no_weight_and_no_output(tok):
    """The models built in code take 4,096-token rollouts; rotary positions make the context length a
    bound only: the same weights and bitwise the same logits as with a 512-token context."""
    from aha.models.tiny import TINY_CONTEXT
    long, short = (build_model(tok, "tiny", seed=0, overrides=dict(max_position_embeddings=n))
                   for n in (TINY_CONTEXT, 512))
    assert long.config.max_position_embeddings >= 4096 + 256
    assert all(torch.equal(a, b) for a, b in zip(long.state_dict().values(), short.state_dict().values()))
    ids = torch.randint(4, len(tok), (2, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(long(ids).logits, short(ids).logits)


# (low, high) per size at vocab 512; exact counts are in build_model's docstring
RANGES = {"tiny": (0.1e6, 0.2e6), "small": (0.8e6, 1.0e6), "demo": (3e6, 5e6), "4m": (3.5e6, 4.5e6), "30m": (27e6, 33e6),
          "qwen2-0.5b": (340e6, 370e6)}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_named_sizes_in_range(tok, arch):
    assert set(RANGES) == set(SIZES)
    for size, (low, high) in RANGES.items():
        assert low <= num_params(build_config(tok, size, arch, {"vocab_size": 512})) <= high, size


def test_num_params_matches_a_real_model(tok):
    model = build_model(tok, "tiny", "qwen2")
    assert num_params(model.config) == sum(p.numel() for p in model.parameters())


def test_qwen2_half_billion_shapes(tok):
    config = build_config(tok, "qwen2-0.5b", "qwen2", {"vocab_size": 151936})
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.intermediate_size) == (896, 24, 14, 2, 4864)
    assert num_params(config) == 494_032_768  # Qwen2-0.5B's published count


def test_bad_names_list_the_valid_ones(tok):
    with pytest.raises(ValueError, match="valid:.*demo"):
        build_config(tok, "huge")
    with pytest.raises(ValueError, match="valid:.*qwen2"):
        build_config(tok, "tiny", "gpt2")
    with pytest.raises(ValueError, match="vocab_size"):
        build_config(tok, "tiny", overrides={"vocab_size": 10})


def test_dtype_auto_is_bfloat16_only_where_native(monkeypatch):
    import torch
    from aha.models import load
    native = load.native_bf16("cpu")
    flags = open("/proc/cpuinfo").read().split()
    capped = os.environ.get("ATEN_CPU_CAPABILITY", "").lower() in ("default", "avx", "avx2")  # run as AVX2-only
    assert native == (not capped and any(f in flags for f in load.BF16_CPU_FLAGS))  # this CPU, from its flags
    assert load.resolve_dtype("auto", "cpu") == (torch.bfloat16 if native else torch.float32)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # torch told to run as a CPU without AVX-512
    assert load.resolve_dtype("auto", "cpu") == torch.float32
    monkeypatch.setattr(load, "native_bf16", lambda device=None: True)
    assert load.resolve_dtype("auto", "cpu") == torch.bfloat16 and load.resolve_dtype("float16") == torch.float16


def test_dtype_auto_trains_float32_weights_with_a_bf16_forward_only_where_native(monkeypatch, tmp_path):
    """auto never trains bfloat16 weights (whose small updates are lost): mixed precision where the CPU or GPU
    computes bfloat16 natively, plain float32 elsewhere."""
    import torch
    from aha.config import SFTConfig
    from aha.models import load
    from aha.train.loop import autocast
    native = load.native_bf16("cpu")
    assert load.training_precision("auto", False, "cpu") == ("float32", native)
    assert load.training_precision("bfloat16", False, "cpu") == ("bfloat16", False)
    assert load.training_precision("float32", True, "cpu") == ("float32", True)
    cfg, model = SFTConfig(output_dir=str(tmp_path), dtype="auto"), torch.nn.Linear(2, 2)
    monkeypatch.setattr(load, "native_bf16", lambda device=None: True)
    with autocast(cfg, model):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    monkeypatch.setattr(load, "native_bf16", lambda device=None: False)
    assert load.training_precision("auto", False, "cpu") == ("float32", False)
    with autocast(cfg, model):
        assert not torch.is_autocast_enabled("cpu")
