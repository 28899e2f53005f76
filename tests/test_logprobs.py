"""Completion log-probs: the shared-prompt pass equals the one pass per sequence, values and gradients."""

import pytest
import torch

from aha.models.tiny import build_model, train_tokenizer
from aha.train import logprobs as lp_mod
from aha.train.logprobs import completion_logprobs


def _groups(seed: int, sizes=(4, 3, 1), prompt_len=(2, 9), comp_len=(1, 7)):
    """Prompts of different lengths, each repeated for its group's completions of different lengths."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda lo, hi: torch.randint(7, 100, (int(torch.randint(lo, hi, (1,), generator=g)),),  # noqa: E731
                                        generator=g).tolist()
    prompts, comps = [], []
    for size in sizes:
        p = draw(*prompt_len)
        for _ in range(size):
            prompts.append(p)
            comps.append(draw(*comp_len))
    return prompts, comps


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_shared_prompts_give_the_same_logprobs_entropy_and_gradient(arch):
    tok = train_tokenizer(["What is 12 + 7 - 3? Answer: 16. The quick brown fox."] * 50)
    model = build_model(tok, "tiny", arch=arch).train()
    prompts, comps = _groups(seed=1)
    out = []
    for share in (False, True):
        model.zero_grad()
        logp, mask, ent = completion_logprobs(model, prompts, comps, 0, temperature=0.7, with_entropy=True,
                                              share_prompts=share)
        (logp * mask).sum().backward()
        out.append((logp * mask, ent * mask, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (a, ea, ga), (b, eb, gb) = out
    assert a.shape == b.shape and int(mask.sum()) == sum(map(len, comps))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    torch.testing.assert_close(ea, eb, rtol=0, atol=1e-5)
    assert max(g.abs().max().item() for g in ga.values()) > 1.0  # a real gradient
    for n in ga:  # a shared prompt's gradient is the sum over its rows: the same up to summation order
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-4, atol=1e-5)


def test_each_distinct_prompt_runs_once_and_one_token_prompts_fall_back(monkeypatch):
    tok = train_tokenizer(["What is 12 + 7 - 3? Answer: 16. The quick brown fox."] * 50)
    model = build_model(tok, "tiny")
    widths = []
    real = model.forward
    monkeypatch.setattr(model, "forward", lambda **k: widths.append(tuple(k["input_ids"].shape)) or real(**k))
    prompts, comps = _groups(seed=2, sizes=(4, 4), prompt_len=(5, 6), comp_len=(3, 4))  # 2 prompts of 5 tokens
    with torch.no_grad():
        completion_logprobs(model, prompts, comps, 0, share_prompts=True)
        assert widths == [(2, 4), (8, 1 + 3)]  # 2 prompts less their last token; then last token + completion
        widths.clear()
        completion_logprobs(model, [[9]] * 2, [[10, 11]] * 2, 0, share_prompts=True)  # nothing to cache
        assert widths == [(2, 1 + 2)]
        widths.clear()
        completion_logprobs(model, [[9, 8], [9, 7]], [[10]] * 2, 0, share_prompts=True)  # no prompt repeats
        assert widths == [(2, 2 + 1)]
    assert lp_mod.cache_arg(model) in ("cache", "past_key_values")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_match_log_softmax_in_float64(dtype, monkeypatch):
    """The chunked log-prob function against log_softmax in float64 on the same logit values: log-probs,
    entropy and the gradient, with a temperature, over several chunks and a last partial one."""
    monkeypatch.setattr(lp_mod, "CHUNK_ELEMENTS", 3 * 50)  # 3 positions per chunk; 21 positions
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 7, 50, generator=g) * 3).to(dtype).requires_grad_()
    ids = torch.randint(0, 50, (3, 7), generator=g)
    w = torch.randn(3, 7, generator=g)
    logp, ent = lp_mod.TokenLogProbs.apply(x, ids, 0.7, True)
    (logp * w).sum().backward()
    ref_x = x.detach().double().requires_grad_()
    ls = (ref_x / 0.7).log_softmax(-1)
    ref = ls.gather(-1, ids[..., None]).squeeze(-1)
    (ref * w.double()).sum().backward()
    assert logp.dtype == ent.dtype == torch.float32 and x.grad.dtype == dtype
    assert logp.requires_grad and ent.requires_grad  # an entropy bonus differentiates it (tests/test_entropy.py)
    torch.testing.assert_close(logp.double(), ref.detach(), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(ent.double(), -(ls.exp() * ls).sum(-1).detach(), atol=1e-5, rtol=1e-6)
    grad_tol = 1e-6 if dtype == torch.float32 else 2**-8  # the gradient is written in the logits' dtype
    torch.testing.assert_close(x.grad.double(), ref_x.grad, atol=grad_tol, rtol=grad_tol)
    _, none = lp_mod.TokenLogProbs.apply(x, ids, 1.0, False)
    assert none.numel() == 0


def test_attention_kernels_leave_out_cudnn_on_cuda_only():
    from aha.models.load import attention_kernels
    flags = lambda: (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),  # noqa: E731
                     torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    before = flags()
    with attention_kernels("cuda"):
        assert flags() == (False, True, True, True)
    assert flags() == before
    with attention_kernels(torch.device("cpu")):
        assert flags() == before


@pytest.mark.parametrize("share", [False, True])
def test_training_and_sampling_attention_runs_without_cudnn(share, monkeypatch):
    """Every attention call of the log-prob pass and of the engine's prefill runs inside attention_kernels
    (forced to its CUDA choice here, so that the CPU shows it); decode steps, whose shapes repeat, keep PyTorch's
    choice. share: the shared-prompt pass and LayerCache."""
    from aha.models import eos_ids
    from aha.models.load import attention_kernels
    from aha.rollout import SamplingParams
    from aha.rollout import hf
    tok = train_tokenizer(["What is 12 + 7 - 3? Answer: 16. The quick brown fox."] * 50)
    model = build_model(tok, "tiny")
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: seen.append(torch.backends.cuda.cudnn_sdp_enabled()) or sdpa(*a, **k))
    for module in (lp_mod, hf):
        monkeypatch.setattr(module, "attention_kernels", lambda device: attention_kernels("cuda"))
    prompts, comps = _groups(seed=3, sizes=(2, 2))
    completion_logprobs(model, prompts, comps, 0, share_prompts=share)
    training, seen[:] = list(seen), []
    engine = hf.HFEngine(model, eos_ids(model, tok), tok.pad_token_id, layer_cache=share)
    engine.generate([prompts[0], prompts[2]], 2, SamplingParams(1.0, 1.0, 0, 4), torch.Generator().manual_seed(0))
    layers = model.config.num_hidden_layers
    prefill, decode = seen[:layers], seen[layers:]  # the prefill's call per layer, then the decode steps'
    assert len(training) >= layers and len(prefill) == layers and not any(training + prefill)
    assert all(decode) and (decode or share)  # HFCache decodes through SDPA, LayerCache on a CPU does not
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored


@pytest.mark.parametrize("arch", ["gpt2", "gemma2"])
def test_shared_prompts_work_beyond_the_llama_layout(arch):
    """share_prompts is on by default wherever prompts repeat, so it must hold for models that keep transformers'
    own caches: GPT-2's, and Gemma 2's with a sliding window shorter than the prompts."""
    import transformers
    torch.manual_seed(0)
    model = (transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2,
                                                                  n_positions=64)) if arch == "gpt2" else
             transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
                 vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16, sliding_window=4))).eval()  # no dropout; gradients still flow
    prompts = [[5, 6, 7, 8, 9, 10]] * 3 + [[11, 12, 13, 14, 15]] * 3
    comps = [[20, 21, 22], [23, 24], [25, 26, 27, 28], [20], [21, 22], [30, 31, 32, 33, 34, 35, 36]]
    out = []
    for share in (False, True):
        model.zero_grad()
        logp, mask, _ = completion_logprobs(model, prompts, comps, 0, share_prompts=share)
        (logp * mask).sum().backward()
        out.append((logp * mask, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (a, ga), (b, gb) = out
    assert a.abs().max() > 1.0  # real log-probs
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-4, atol=1e-5)
