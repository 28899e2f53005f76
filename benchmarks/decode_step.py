"""What one decode step of aha's engine costs as the filled length grows, with every row alive.

    .venv/bin/python benchmarks/decode_step.py --size 30m --rows 16 --length 1024

Prefills `--rows` copies of a 16-token prompt into a LayerCache with room for `--length` more tokens, then
decodes one token per row per step and prints the mean ms per step over each block of 128 positions, next to
what the attention of one layer costs alone at that length (F.scaled_dot_product_attention on the engine's
own tensors, and on bfloat16 copies of them; and the engine's own decode_attention over its buffers) and what the
machine's memory streams (a 256 MB sum). Rows never finish here, so the curve
isolates the cost that grows with length from the batch shrinking as rows end (benchmarks/generation.py
measures both together).
"""

import argparse
import time

import torch
import torch.nn.functional as F


def call_ms(fn, repeats: int = 10) -> float:
    """Mean ms of one call (after one untimed call)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats * 1e3


def attention_ms(q, k, v) -> float:
    """One decode-shaped scaled_dot_product_attention call over the filled columns."""
    return call_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="30m")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, help="key/value heads (default: the size's; fewer: a smaller cache)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from aha.models.tiny import random_model
    from aha.rollout.hf import LayerCache, decode_attention
    model = random_model(a.size, overrides={"num_key_value_heads": a.kv_heads} if a.kv_heads else None)
    x = torch.randn(64 * 2**20)
    x.sum()
    t = time.perf_counter()
    for _ in range(5):
        x.sum()
    print(f"memory: a 256 MB sum streams at {5 * x.nbytes / (time.perf_counter() - t) / 1e9:.1f} GB/s")
    V, m, block = model.config.vocab_size, a.rows, 128
    cache = LayerCache(model, torch.ones(m, 16, dtype=torch.long), a.length)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        cache.forward(torch.randint(10, V, (m, 16), generator=gen), torch.arange(16).expand(m, 16))
        pos, tok = torch.full((m, 1), 16), torch.randint(10, V, (m, 1), generator=gen)
        t = time.perf_counter()
        for s in range(1, a.length + 1):
            cache.forward(tok, pos)
            pos = pos + 1
            if s % block == 0:
                step_ms = (time.perf_counter() - t) / block * 1e3
                q = torch.randn(m, model.config.num_attention_heads, 1, cache.k[0].shape[-1])
                k, v = cache.k[0][:, :, :cache.end].contiguous(), cache.v[0][:, :, :cache.end].contiguous()
                attn_ms = attention_ms(q, k, v)
                bf16_ms = attention_ms(*(x.to(torch.bfloat16) for x in (q, k, v)))
                bias = cache.bias[:, None, None, :]
                own_ms = call_ms(lambda: decode_attention(q, cache.k[0], cache.v[0], bias, q.shape[-1] ** -0.5))
                mb = 2 * k.numel() * k.element_size() / 1e6
                print(f"positions {s - block + 17:5d}-{s + 16:5d}: {step_ms:6.1f} ms/step ({m / step_ms * 1e3:5.0f} "
                      f"tokens/s); one layer's attention alone at {cache.end}: {own_ms:.2f} ms in the engine's "
                      f"decode_attention over its {cache.k[0].shape[2]} columns, {attn_ms:.2f} ms in SDPA over the "
                      f"filled ones, {mb:.0f} MB of keys and values ({mb / attn_ms:.1f} GB/s), x {len(cache.k)} "
                      f"layers; SDPA in bfloat16 {bf16_ms:.2f} ms")
                t = time.perf_counter()


if __name__ == "__main__":
    main()
