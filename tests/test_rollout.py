"""The generation engine against a cache-free reference: full forward passes, greedy argmax."""

import os
import subprocess
import sys

import pytest
import torch

from aha.rollout import HFEngine, SamplingParams
from aha.rollout import hf as engine_module
from aha.models.tiny import build_model, train_tokenizer

PROMPTS = [[5, 9, 14, 3], [7], [21, 8, 8, 30, 2, 11, 4]]  # unequal lengths: left padding in the batch
T = 12


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["the quick brown fox jumps over the lazy dog 0123456789"] * 20)


def model_of(tok, arch):
    # a wide init makes logits peaky, so float rounding between cache layouts cannot flip an argmax
    return build_model(tok, "tiny", arch, seed=3, overrides={"initializer_range": 0.3}).eval()


@torch.no_grad()
def reference_greedy(model, prompt, steps):
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@torch.no_grad()
def reference_greedy_until_a_tie(model, prompt, steps, tie: float):
    """reference_greedy's tokens up to the first step whose top two logits are within `tie` of each other (there
    rounding may order them either way, and a cache's kernels round otherwise than a full recompute's)."""
    ids = list(prompt)
    for _ in range(steps):
        top = model(torch.tensor([ids])).logits[0, -1].float().topk(2)
        if float(top.values[0] - top.values[1]) <= tie:
            break
        ids.append(int(top.indices[0]))
    return ids[len(prompt):]


def cut_at(seq, eos):
    for i, t in enumerate(seq):
        if t in eos:
            return seq[:i + 1], False
    return seq, True


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("layer_cache, chunk", [(True, 256), (True, 2), (False, 256)])
def test_greedy_matches_full_recompute_with_eos_and_groups(tok, arch, layer_cache, chunk, monkeypatch):
    """chunk=2: the layer cache starts with two free columns and grows several times during the run; there every
    float32 product is prepacked, however small."""
    monkeypatch.setattr(engine_module, "CACHE_CHUNK", chunk)
    if chunk == 2:
        monkeypatch.setattr(engine_module, "PACK_MIN_FLOAT32", 0)
        monkeypatch.setattr(engine_module, "PACK_MIN_INPUTS", 0)
    model = model_of(tok, arch)
    assert engine_module.LayerCache.supports(model, 64)
    if not layer_cache:
        monkeypatch.setattr(engine_module.LayerCache, "supports", staticmethod(lambda m, n: False))
    ref = [reference_greedy(model, p, T) for p in PROMPTS]
    # two EOS tokens taken from the middle of the reference outputs: some rows stop early, some
    # never stop, so finished rows are dropped mid-generation (cache compaction) and others run on
    eos = {ref[0][4], ref[2][7]}
    want = [cut_at(r, eos) for r in ref]
    assert any(t for _, t in want) and any(not t for _, t in want)
    n = 3
    out = HFEngine(model, sorted(eos), tok.pad_token_id).generate(
        PROMPTS, n, SamplingParams(temperature=0, max_new_tokens=T))
    assert out.completion_ids == [w[0] for w in want for _ in range(n)]
    assert out.truncated == [w[1] for w in want for _ in range(n)]


def test_layer_cache_logits_match_the_model(tok):
    """Prefill and decode logits of the layer cache equal a plain forward over the whole sequence."""
    model = model_of(tok, "llama")
    ids = torch.tensor([[0, 0, 5, 9, 14], [7, 3, 2, 8, 6]])                  # row 0 left-padded
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    cache = engine_module.LayerCache(model, mask, 2)
    with torch.no_grad():
        got = cache.forward(ids, (mask.cumsum(-1) - 1).clamp(min=0))
        nxt = torch.tensor([[4], [12]])
        got2 = cache.forward(nxt, mask.sum(-1, keepdim=True))
        full_ids, full_mask = torch.cat([ids, nxt], 1), torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
        want = model(input_ids=full_ids, attention_mask=full_mask,
                     position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0)).logits
    torch.testing.assert_close(got, want[:, -2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got2, want[:, -1], atol=1e-5, rtol=1e-5)


class ThroughTheLayers(engine_module.LayerCache):
    """The reference: the model's own decoder layers called with this cache (their attention calls `update`)."""

    def _logits(self, ids, pos, bias):
        from aha.models.load import cache_arg
        h = self.decoder.embed_tokens(ids)
        rotary = self.decoder.rotary_emb(h, pos)
        for layer in self.decoder.layers:
            h = layer(h, attention_mask=bias, position_ids=pos, use_cache=True, position_embeddings=rotary,
                      **{cache_arg(layer): self})
            h = h[0] if isinstance(h, tuple) else h
        return self.lm.lm_head(self.decoder.norm(h[:, -1])).float()


def grouped_query_model(arch):
    """A tiny model of each LayerCache architecture with 4 query heads sharing 2 key/value heads."""
    import transformers
    config_cls, model_cls = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                             "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
                             "mistral": ("MistralConfig", "MistralForCausalLM")}[arch]
    config = getattr(transformers, config_cls)(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                               max_position_embeddings=64, sliding_window=None)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(config).eval()


class PlainKernels(engine_module.LayerCache):
    """LayerCache with the model's own Linear modules and attention function instead of its CPU kernels."""

    def __init__(self, *args):
        super().__init__(*args)
        self.cpu_kernels, self.packed = False, {}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("autocast", [False, True])
def test_layer_cache_computes_what_the_model_layers_compute(arch, autocast, monkeypatch):
    """LayerCache wires the model's modules as its decoder layers do: with the model's own Linear modules and
    attention, prefill and decode logits are equal to the last bit to those of the model's own layers over the
    same cache (grouped-query heads, Qwen2's biases, Qwen3's q/k norms; under bf16 autocast too, keys and values
    cached in bf16). With the CPU kernels (prepacked weights, decode_attention) they agree to float32 rounding,
    and under autocast to bf16 rounding (every product prepacked here, however small; the attention SDPA's)."""
    monkeypatch.setattr(engine_module, "PACK_MIN_FLOAT32", 0)
    monkeypatch.setattr(engine_module, "PACK_MIN_INPUTS", 0)
    model = grouped_query_model(arch)
    packs = 4 * model.config.num_hidden_layers + 1 if engine_module.onednn_bf16() or not autocast else 0
    ids, mask = torch.tensor([[0, 0, 5, 9, 14], [7, 3, 2, 8, 6]]), torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    logits = {}
    for name, cls in (("kernels", engine_module.LayerCache), ("plain", PlainKernels), ("layers", ThroughTheLayers)):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            cache = cls(model, mask, 8)
            assert cache.k[0].dtype == (torch.bfloat16 if autocast else torch.float32)
            assert len(cache.packed) == (0 if cls is PlainKernels else packs)
            out = [cache.forward(ids, (mask.cumsum(-1) - 1).clamp(min=0))]
            pos = mask.sum(-1, keepdim=True)
            for t in range(6):
                out.append(cache.forward(torch.tensor([[4 + t], [12 + t]]), pos + t))
        logits[name] = torch.stack(out)
    assert logits["plain"].abs().max() > 0
    assert torch.equal(logits["plain"], logits["layers"])
    diff = float((logits["kernels"] - logits["plain"]).norm() / logits["plain"].norm())
    if autocast:  # bf16 products prepacked and SDPA: bf16 rounding at most (bit-equal on machine E)
        assert diff < 2**-8, diff
    else:  # prepacked products and decode_attention's batched products: another float32 summation
        assert 0 < diff < 1e-6, diff


def test_lora_model_uses_the_layer_cache_with_its_adapters(tok):
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(model_of(tok, "llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # nonzero adapters, so ignoring them would change the output
            torch.nn.init.normal_(p, std=0.5)
    assert engine_module.LayerCache.supports(model, 64)
    out = HFEngine(model, [], tok.pad_token_id).generate(PROMPTS, 1, SamplingParams(temperature=0, max_new_tokens=T))
    assert out.completion_ids == [reference_greedy(model, p, T) for p in PROMPTS]


def test_sliding_window_and_unknown_architectures_fall_back(tok):
    model = model_of(tok, "qwen2")
    model.config.use_sliding_window, model.config.sliding_window = True, 8
    assert not engine_module.LayerCache.supports(model, 64)
    model.config.model_type = "gpt2"
    model.config.use_sliding_window = False
    assert not engine_module.LayerCache.supports(model, 64)


def test_top_k_one_and_tiny_top_p_are_greedy(tok):
    model = model_of(tok, "llama")
    engine = HFEngine(model, [], tok.pad_token_id)
    greedy = engine.generate(PROMPTS, 2, SamplingParams(temperature=0, max_new_tokens=T)).completion_ids
    g = torch.Generator().manual_seed(0)
    for params in (SamplingParams(temperature=1.0, top_k=1, max_new_tokens=T),
                   SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=T)):
        assert engine.generate(PROMPTS, 2, params, g).completion_ids == greedy


@pytest.mark.parametrize("probs, top_p, kept", [
    ([0.25, 0.25, 0.25, 0.25], 0.5, 2),   # 0.25 + 0.25 reaches 0.5: two tokens, as HF's TopPLogitsWarper keeps
    ([0.5, 0.25, 0.125, 0.125], 0.5, 1),  # the top token alone reaches it
    ([0.5, 0.3, 0.2], 0.8, 2),
    ([0.5, 0.3, 0.2], 0.81, 3),
])
def test_top_p_keeps_the_smallest_set_reaching_p(probs, top_p, kept):
    logits = torch.log(torch.tensor([probs]))
    draws = engine_module.sample_tokens(logits.expand(4000, -1), SamplingParams(temperature=1.0, top_p=top_p),
                                        torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == set(range(kept))


def test_a_sliding_window_prompt_that_joins_a_batch_is_decoded_with_its_window(monkeypatch):
    """A later, longer prompt of the same call passes the window: the whole call decodes through the model's own
    cache (which applies the window), never a LayerCache cohort (which has none)."""
    import transformers
    cfg = transformers.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                     max_position_embeddings=256, initializer_range=0.3, sliding_window=8)
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(cfg).eval()
    prompts, params = [[5], [9], [21, 8, 8, 30, 12, 11, 4, 17, 40, 33]], SamplingParams(temperature=0, max_new_tokens=7)
    alone = [HFEngine(model, [58], 0).generate([p], 1, params).completion_ids[0] for p in prompts]
    monkeypatch.setattr(engine_module, "ADMIT_FRACTION", 0.25)
    assert HFEngine(model, [58], 0, max_batch=2).generate(prompts, 1, params).completion_ids == alone


def test_a_prompt_past_the_context_is_an_error(tok):
    model = model_of(tok, "llama")
    ctx = model.config.max_position_embeddings
    engine = HFEngine(model, [], tok.pad_token_id)
    with pytest.raises(ValueError, match=rf"a prompt of 3 tokens \+ max_new_tokens {ctx - 2} exceeds the model's "
                                         rf"context of {ctx} tokens"):
        engine.generate([[5, 6], [5, 6, 7]], 1, SamplingParams(temperature=0, max_new_tokens=ctx - 2))
    assert len(engine.generate([[5, 6, 7]], 1, SamplingParams(temperature=0, max_new_tokens=ctx - 3))
               .completion_ids[0]) <= ctx - 3


def test_sampling_follows_the_temperature_scaled_distribution():
    """With logits log([0.5, 0.3, 0.2]) and temperature 1, the token frequencies over 20k draws are
    those probabilities (standard error ~0.0035, so 0.02 is a > 5-sigma bound)."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).expand(20000, 3)
    draws = engine_module.sample_tokens(logits, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=3).float() / len(draws)
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.02, rtol=0)
    # temperature 0.5 squares the probabilities before renormalising: [25, 9, 4] / 38
    draws = engine_module.sample_tokens(logits, SamplingParams(temperature=0.5), torch.Generator().manual_seed(1))
    freq = torch.bincount(draws, minlength=3).float() / len(draws)
    torch.testing.assert_close(freq, torch.tensor([25, 9, 4]) / 38, atol=0.02, rtol=0)



@torch.no_grad()
def test_layer_cache_memory_follows_the_filled_length_not_the_budget(tok):
    """Prefill and 40 decode steps with a budget of 64 or of 4,096 tokens: the same logits, and buffers
    of at most CACHE_CHUNK columns past the prompt, so no allocation or copy scales with max_new_tokens."""
    model = model_of(tok, "llama")
    L = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (L - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in PROMPTS])
    logits, caps = {}, {}
    for budget in (64, 4096):
        cache = engine_module.LayerCache(model, mask, budget)
        out = [cache.forward(ids, (mask.cumsum(-1) - 1).clamp(min=0))]
        pos = mask.sum(-1, keepdim=True)
        for t in range(40):
            out.append(cache.forward(out[-1].argmax(-1, keepdim=True), pos + t))
        logits[budget], caps[budget] = torch.stack(out), cache.k[0].shape[2]
    torch.testing.assert_close(logits[64], logits[4096], rtol=0, atol=0)
    assert caps == {64: L + 64, 4096: L + engine_module.CACHE_CHUNK}


@pytest.mark.parametrize("amx", [True, False])
def test_cpu_autocast_decodes_from_a_bf16_cache_with_bf16_products(tok, amx, monkeypatch):
    """Under bf16 autocast on CPU the layer cache holds bf16 keys and values (what autocast's attention reads in
    the trainer) and its prepacked products are bf16, as autocast's Linear; greedy tokens equal a full recompute
    under the same autocast up to the first tie of two logits in bf16 (with ATen and oneDNN at AVX2, the first
    prompt's fifth token is one: 6.094 and 6.094). Both decode attentions: SDPA (a CPU with AMX) and the batched
    products over the whole buffers, whose unwritten columns are zeros."""
    flags = frozenset({"avx512_bf16", "amx_bf16"} if amx else {"avx512_bf16"})
    monkeypatch.setattr(engine_module, "cpu_flags", lambda: flags)
    model = model_of(tok, "llama")
    mask = torch.ones(2, 3, dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = [reference_greedy_until_a_tie(model, p, T, tie=0.0625) for p in PROMPTS]  # 2 bf16 steps at 4-8
        got = HFEngine(model, [], tok.pad_token_id).generate(PROMPTS, 2, SamplingParams(temperature=0, max_new_tokens=T))
        cache = engine_module.LayerCache(model, mask, T)
    plain = engine_module.LayerCache(model, mask, T)
    assert {cache.k[0].dtype, cache.v[0].dtype} == {torch.bfloat16} and plain.k[0].dtype == torch.float32
    products = 4 * model.config.num_hidden_layers + 1  # qkv, o, gate/up, down; the head
    if not engine_module.onednn_bf16():  # an AVX2-only CPU: none (the test below)
        products = 0
    assert len(cache.packed) == products and {p[2] for p in cache.packed.values()} <= {torch.bfloat16}
    assert plain.packed == {}  # float32 weights this small multiply faster unpacked
    assert cache.whole is not amx and plain.whole is False
    if not amx:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            cache.forward(torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.arange(3).expand(2, 3))  # prefill
            step = cache.forward(torch.tensor([[5], [6]]), torch.tensor([[3], [3]]))         # decode, whole buffers
        assert cache.end == 4 < cache.k[0].shape[2] and bool(step.isfinite().all())
        assert all(bool((x[:, :, cache.end:] == 0).all()) for x in cache.k + cache.v)
    assert [ids[:len(w)] for ids, w in zip(got.completion_ids, (w for w in want for _ in range(2)))] == \
        [w for w in want for _ in range(2)]
    assert sum(map(len, want)) >= T, want  # most tokens compared, not a vacuous prefix


@pytest.mark.parametrize("flags", [{"avx512_bf16", "amx_bf16"}, {"avx512_bf16"}])
def test_bf16_decode_attention_takes_the_kernel_measured_faster_on_the_cpu(flags, monkeypatch):
    """A bf16 cache's decode token attends through PyTorch's SDPA on a CPU with AMX and through the batched products
    elsewhere (`sdpa_decodes_bf16`: SDPA was 1.05-3.8x as fast on an Intel CPU with AMX, 2.5-18x slower on an AMD Zen 5
    without it); either within bf16 rounding of a float32 SDPA, the masked columns unread."""
    monkeypatch.setattr(engine_module, "cpu_flags", lambda: frozenset(flags))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 1, 64, generator=g)
    k, v = (torch.randn(3, 2, 40, 64, generator=g) for _ in range(2))   # 2 key/value heads for 4 query heads
    bias = torch.zeros(3, 1, 1, 40)
    bias[0, ..., :7] = torch.finfo(torch.float32).min
    kb, vb = k.bfloat16(), v.bfloat16()
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.bfloat16(), kb, vb, attn_mask=bias.bfloat16(),
                                                            scale=0.125, enable_gqa=True)
    sdpa = sdpa.transpose(1, 2).reshape(3, 1, 256).float()
    products = engine_module.batched_attention(q.bfloat16(), kb, vb, bias, 0.125).float()
    assert not torch.equal(sdpa, products)  # the two kernels round differently: the check below tells them apart
    got = engine_module.decode_attention(q, kb, vb, bias, 0.125)
    assert got.dtype == torch.float32 and torch.equal(got, sdpa if "amx_bf16" in flags else products)
    exact = torch.nn.functional.scaled_dot_product_attention(q, kb.float(), vb.float(), attn_mask=bias, scale=0.125,
                                                             enable_gqa=True).transpose(1, 2).reshape(3, 1, 256)
    torch.testing.assert_close(got, exact, rtol=2 ** -6, atol=2 ** -6)


@pytest.mark.parametrize("layer_cache, max_batch", [(True, 512), (True, 3), (False, 512)])
def test_each_group_is_reported_once_as_it_finishes(tok, layer_cache, max_batch, monkeypatch):
    """on_group(i, rollout): every prompt once, its n rows exactly as in the returned rollout, in the order the
    groups finish (a group that stops early is handed over while the others decode); max_batch=3 with n=3 puts
    one prompt per chunk, so the chunk offsets are checked too."""
    model = model_of(tok, "llama")
    if not layer_cache:
        monkeypatch.setattr(engine_module.LayerCache, "supports", staticmethod(lambda m, n: False))
    ref = [reference_greedy(model, p, T) for p in PROMPTS]
    eos = {ref[0][4], ref[2][7]}
    finish = [len(c) if not t else T for c, t in (cut_at(r, eos) for r in ref)]  # decode steps each group takes
    assert len(set(finish)) > 1
    n, calls = 3, []
    out = HFEngine(model, sorted(eos), tok.pad_token_id, max_batch=max_batch).generate(
        PROMPTS, n, SamplingParams(temperature=0, max_new_tokens=T), on_group=lambda i, r: calls.append((i, r)))
    assert sorted(i for i, _ in calls) == list(range(len(PROMPTS)))
    for i, r in calls:
        assert r.completion_ids == out.completion_ids[i * n:(i + 1) * n]
        assert r.truncated == out.truncated[i * n:(i + 1) * n]
    if max_batch == 512:  # one batch: reported in the order they finish
        assert [finish[i] for i, _ in calls] == sorted(finish)


def test_a_generate_call_prepacks_the_weights_once_for_all_its_chunks(tok, monkeypatch):
    """max_batch=3 with n=3: three chunks of one prompt each share one set of prepacked weights (a copy of the
    model's products, built once per call, not per chunk), and decode what one batch of all three decodes."""
    monkeypatch.setattr(engine_module, "PACK_MIN_FLOAT32", 0)
    monkeypatch.setattr(engine_module, "PACK_MIN_INPUTS", 0)
    calls, pack = [], engine_module.packed_weights
    monkeypatch.setattr(engine_module, "packed_weights", lambda lm: calls.append(lm) or pack(lm))
    model, params = model_of(tok, "llama"), SamplingParams(temperature=0, max_new_tokens=T)
    chunked = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, max_batch=3).generate(PROMPTS, 3, params)
    assert len(calls) == 1 and len(pack(model)) > 0
    whole = HFEngine(model, [tok.eos_token_id], tok.pad_token_id).generate(PROMPTS, 3, params)
    assert len(calls) == 2
    assert chunked.completion_ids == whole.completion_ids


@pytest.mark.parametrize("layer_cache, chunk, cohorts, admit", [
    (True, 256, 4, 0.0), (True, 2, 4, 0.0), (True, 256, 1, 0.0), (False, 256, 4, 0.0), (True, 256, 4, 1.0)])
def test_waiting_rows_join_the_batch_as_rows_finish(tok, layer_cache, chunk, cohorts, admit, monkeypatch):
    """max_batch=5 with n=2: the first batch holds two prompts (4 rows). With the layer cache one row of the third
    prompt joins at once as a cohort of its own, and its second row joins when the first prompt's rows end with
    EOS (with chunk=2 the caches grow during the run; with one cohort at most, each joining row is merged into
    the running rows' cache, its columns right-aligned to theirs); the transformers cache, and the layer cache with
    admission off (ADMIT_FRACTION 1, the default), start the third prompt in a new batch once the first two are
    done. Either way every row decodes the full-recompute reference, no step decodes more than 5 rows, and each
    group is reported once, as in the returned rollout."""
    monkeypatch.setattr(engine_module, "CACHE_CHUNK", chunk)
    monkeypatch.setattr(engine_module, "ADMIT_FRACTION", admit)
    monkeypatch.setattr(engine_module, "MAX_COHORTS", cohorts)
    model = model_of(tok, "llama")
    if not layer_cache:
        monkeypatch.setattr(engine_module.LayerCache, "supports", staticmethod(lambda m, n: False))
    ref = [reference_greedy(model, p, T) for p in PROMPTS]
    eos = {ref[0][4], ref[2][7]}
    want = [cut_at(r, eos) for r in ref]
    assert not want[0][1] and want[1][1] and len(want[0][0]) < T  # prompt 0 ends early, prompt 1 runs to the cap
    steps, joins = [], []
    for cls in (engine_module.LayerCache, engine_module.HFCache, engine_module.Cohorts):
        monkeypatch.setattr(cls, "forward", lambda self, ids, pos, f=cls.forward: steps.append(
            (len(ids), len(getattr(self, "parts", [self])))) or f(self, ids, pos))
    start = engine_module.Cohorts.admit
    monkeypatch.setattr(engine_module.Cohorts, "admit", lambda self, ids, mask, pos, counts, kept: joins.append(
        (ids.shape[1], counts.tolist(), [len(p.bias) for p in self.parts])) or start(self, ids, mask, pos, counts,
                                                                                   kept))
    calls = []
    out = HFEngine(model, sorted(eos), tok.pad_token_id, max_batch=5).generate(
        PROMPTS, 2, SamplingParams(temperature=0, max_new_tokens=T), on_group=lambda i, r: calls.append((i, r)))
    assert out.completion_ids == [c for c, _ in want for _ in range(2)]
    assert out.truncated == [t for _, t in want for _ in range(2)]
    assert max(m for m, _ in steps) <= 5 and sorted(i for i, _ in calls) == [0, 1, 2]
    for i, r in calls:
        assert r.completion_ids == out.completion_ids[2 * i:2 * i + 2]
    if layer_cache and admit < 1 and cohorts > 1:  # the third prompt's two rows joined one at a time, as cohorts
        assert joins == [(7, [1], [4]), (7, [1], [2, 1])]
        assert (5, 2) in steps and (4, 3) in steps  # 4 + 1 rows in two cohorts; 2 + 1 + 1 rows in three
    elif layer_cache and admit < 1:  # the same joins, each merged at once into the one cohort
        assert joins == [(7, [1], [4]), (7, [1], [3])] and (5, 1) in steps and max(c for _, c in steps) == 1
    else:  # two batches: the third prompt is prefilled after the first two prompts' rows are all done
        assert joins == [] and steps[0] == (2, 1) and steps.index((1, 1)) == T  # prefill, T - 1 steps, its prefill


def test_a_bad_admit_fraction_is_an_error_that_names_it():
    env = {**os.environ, "AHA_ADMIT_FRACTION": "half"}
    out = subprocess.run([sys.executable, "-c", "import aha.rollout.hf"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0 and "AHA_ADMIT_FRACTION='half': expected a number from 0 to 1" in out.stderr


@pytest.mark.parametrize("arch, autocast", [("llama", False), ("qwen2", False), ("qwen2", True)])
@torch.no_grad()
def test_graph_cache_static_step_matches_the_layer_cache(tok, arch, autocast):
    """GraphCache's static decode step (written at a column tensor, attending over a power-of-two bucket with
    the unwritten columns masked; here run eagerly, as on a CPU) gives LayerCache's logits, across the
    128-column bucket into the capacity bucket and with each prompt's cache shared by 2 samples."""
    model = model_of(tok, arch)
    L, steps = max(map(len, PROMPTS)), 140
    ids = torch.tensor([[0] * (L - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in PROMPTS])
    logits, tokens = {}, None
    for name, make in (("layer", engine_module.LayerCache),
                       ("graph", lambda *a: engine_module.GraphCache(*a, capture=False))):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):  # float32 cache, bf16 keys written
            cache = make(model, mask, steps)
            first = cache.forward(ids, (mask.cumsum(-1) - 1).clamp(min=0))
            cache.repeat(2)
            out = [first.repeat_interleave(2, 0)]
            pos = mask.sum(-1, keepdim=True).repeat_interleave(2, 0)
            tokens = tokens or [None] * steps  # the graph cache is fed the layer cache's greedy tokens
            for t in range(steps):
                tokens[t] = out[-1].argmax(-1, keepdim=True) if tokens[t] is None else tokens[t]
                out.append(cache.forward(tokens[t], pos + t))
        logits[name] = torch.stack(out)
    assert cache.bucket == cache.k[0].shape[2] == L + steps  # past 128 the bucket is the capacity
    if autocast:  # bf16 products and attention: the norm of the difference within bf16 rounding (2^-7 relative:
        # bf16 SDPA's sums over the bucket's masked columns round otherwise than over the filled ones at short
        # lengths, 0.2-0.6% of the logits here; a wrong column or mask moves them by their own size)
        diff = (logits["graph"] - logits["layer"]).norm() / logits["layer"].norm()
        assert diff < 2**-7, float(diff)
    else:
        torch.testing.assert_close(logits["graph"], logits["layer"], atol=1e-5, rtol=1e-5)


def test_bf16_decoding_on_a_cpu_without_onednn_bf16_products():
    """oneDNN refuses bf16 products on a CPU with AVX2 only: in a fresh process with oneDNN and ATen capped at AVX2,
    the bf16 cases of the two tests above pass (no weight prepacked under bf16 autocast; the engine's logits those
    of the model's own layers to bf16 rounding, its greedy tokens a full recompute's), where prepacking raised."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    tests = [f"{__file__}::{name}" for name in ("test_layer_cache_computes_what_the_model_layers_compute",
                                                "test_cpu_autocast_decodes_from_a_bf16_cache_with_bf16_products")]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider", *tests,
                          "-k", "True or bf16"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "\n6 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]


def cuda(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test))


@cuda
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_cuda_graph_engine_matches_the_eager_engine(tok, arch):
    """On a GPU: graph-replayed decoding gives the eager LayerCache's greedy tokens (float32), sampling with the
    caller's CPU generator is reproducible by seed, and bf16 autocast decodes."""
    model = model_of(tok, arch).cuda()
    params = SamplingParams(temperature=0, max_new_tokens=150)
    eager = HFEngine(model, [], tok.pad_token_id, cuda_graphs=False).generate(PROMPTS, 2, params)
    engine = HFEngine(model, [], tok.pad_token_id)
    assert engine.generate(PROMPTS, 2, params).completion_ids == eager.completion_ids
    sampled = SamplingParams(temperature=1.0, max_new_tokens=40)
    runs = [engine.generate(PROMPTS, 4, sampled, torch.Generator().manual_seed(7)).completion_ids for _ in range(2)]
    assert runs[0] == runs[1] and len(set(map(tuple, runs[0]))) > 1
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = engine.generate(PROMPTS, 2, sampled, torch.Generator().manual_seed(7))
    assert [len(c) for c in out.completion_ids] == [40] * 6


@cuda
def test_grpo_trains_on_cuda_in_bf16(tiny_dir, tmp_path):
    from aha.config import GRPOConfig
    from aha.train.grpo import GRPOTrainer
    prompts = [{"prompt": f"{a}+{b}="} for a in range(10) for b in range(3)]
    digits = lambda completions, **kw: [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]  # noqa: E731
    args = GRPOConfig(output_dir=str(tmp_path / "run"), max_steps=2, num_generations=4, per_device_train_batch_size=8,
                      max_completion_length=16, learning_rate=1e-2, beta=0.04, bf16=True, progress_bar=False,
                      report_to=[], log_completions_steps=0, seed=0)
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digits], args=args, train_dataset=prompts)
    assert next(t.model.parameters()).device.type == "cuda"
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    metrics = t.train()
    assert all(torch.isfinite(torch.tensor(metrics[k])) for k in ("loss", "kl", "grad_norm", "reward/mean"))
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters())
