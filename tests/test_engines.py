"""Engines by name (aha/rollout/engines.py): the registry's constructor and the options an engine takes through it."""

import pytest
import torch


@pytest.fixture(scope="module")
def model_and_tok(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    return AutoModelForCausalLM.from_pretrained(tiny_dir).eval(), AutoTokenizer.from_pretrained(tiny_dir)


def test_an_unknown_engine_names_the_valid_ones():
    from aha.rollout import get_engine
    with pytest.raises(ValueError, match=r"unknown engine 'vllm'; valid: \['hf'\]"):
        get_engine("vllm")


def test_the_hf_engine_takes_its_own_options_through_the_registry(model_and_tok):
    from aha.models import eos_ids
    from aha.rollout import HFEngine, get_engine
    model, tok = model_and_tok
    plain = get_engine("hf")(model, tok, 4)
    assert isinstance(plain, HFEngine) and plain.max_batch == 4 and plain.layer_cache is True
    assert plain.eos.tolist() == eos_ids(model, tok) and plain.pad == tok.pad_token_id
    tuned = get_engine("hf")(model, tok, 8, eos_token_ids=[5, 3], layer_cache=False, cuda_graphs=False)
    assert tuned.eos.tolist() == [3, 5] and tuned.layer_cache is False and tuned.cuda_graphs is False
    with pytest.raises(TypeError, match="layer_cahce"):
        get_engine("hf")(model, tok, 8, layer_cahce=False)


def test_no_eos_runs_every_row_to_the_budget(model_and_tok):
    from aha.rollout import SamplingParams, get_engine
    model, tok = model_and_tok
    prompt = tok("3 plus 4 is", add_special_tokens=False)["input_ids"]
    out = get_engine("hf")(model, tok, eos_token_ids=[]).generate([prompt], 4, SamplingParams(1.0, 1.0, 0, 6),
                                                                   torch.Generator().manual_seed(0))
    assert [len(c) for c in out.completion_ids] == [6, 6, 6, 6]
