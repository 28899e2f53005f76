"""What one decode step of aha's engine costs as the filled length grows, with every row alive.

    .venv/bin/python benchmarks/decode_step.py --size 30m --rows 16 --length 1024
    .venv/bin/python benchmarks/decode_step.py --size 30m --rows 16 8 4 2 1 --length 1024 [--autocast]

Prefills `--rows` copies of a 16-token prompt into a LayerCache with room for `--length` more tokens, then
decodes one token per row per step and prints the mean ms per step over each block of 128 positions, next to
what the attention of one layer costs alone at that length (F.scaled_dot_product_attention on the engine's
own tensors, and on bfloat16 copies of them; and the engine's own decode_attention over its buffers) and what the
machine's memory streams (a 256 MB sum). Rows never finish here, so the curve
isolates the cost that grows with length from the batch shrinking as rows end (benchmarks/generation.py
measures both together).

With several `--rows` (one run each, the attention-alone timings left out) it fits every block's mean step to
    ms per step = F + c * rows + b * rows * columns
(columns: the cache's columns a decode step reads, its capacity): F is what a step costs whatever the batch (the
weights, streamed once per step, and the per-step Python and operator calls), c the cost of one more row, b one
more row-column of keys and values (b's bytes over b is the rate the cache streams at). Those three give the
rate of any mix of rows and lengths, for instance a rollout whose rows end at their own lengths.
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
    ap.add_argument("--rows", type=int, nargs="+", default=[16], help="one or more batch sizes")
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, help="key/value heads (default: the size's; fewer: a smaller cache)")
    ap.add_argument("--autocast", action="store_true", help="decode under bf16 autocast (bf16 cache and products)")
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
    V, block, blocks = model.config.vocab_size, 128, []
    for m in a.rows:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast):
            cache = LayerCache(model, torch.ones(m, 16, dtype=torch.long), a.length)
            gen = torch.Generator().manual_seed(0)
            cache.forward(torch.randint(10, V, (m, 16), generator=gen), torch.arange(16).expand(m, 16))
            pos, tok = torch.full((m, 1), 16), torch.randint(10, V, (m, 1), generator=gen)
            t, columns = time.perf_counter(), []
            for s in range(1, a.length + 1):
                columns.append(cache.k[0].shape[2])
                cache.forward(tok, pos)
                pos = pos + 1
                if s % block:
                    continue
                step_ms = (time.perf_counter() - t) / block * 1e3
                blocks.append((m, sum(columns) / block, step_ms))
                print(f"rows {m:2d}, positions {s - block + 17:5d}-{s + 16:5d}: {step_ms:6.1f} ms/step "
                      f"({m / step_ms * 1e3:5.0f} tokens/s) reading {blocks[-1][1]:.0f} columns", end="")
                if len(a.rows) == 1:
                    print("; " + alone(cache, model, m, decode_attention), end="")
                print(flush=True)
                t, columns = time.perf_counter(), []
    if len(a.rows) > 1:
        X = torch.tensor([[1.0, m, m * cols] for m, cols, _ in blocks], dtype=torch.float64)
        y = torch.tensor([ms for *_, ms in blocks], dtype=torch.float64)
        F, c, b = torch.linalg.lstsq(X, y[:, None]).solution.squeeze(-1).tolist()
        rms = float((X @ torch.tensor([F, c, b], dtype=torch.float64) - y).pow(2).mean().sqrt())
        kv = 2 * len(cache.k) * cache.k[0].shape[1] * cache.k[0].shape[-1] * cache.k[0].element_size()
        print(f"fit over {len(blocks)} blocks: ms per step = {F:.2f} + {c:.3f} x rows + {b * 1e6:.1f}e-6 x rows x "
              f"columns (rms error {rms:.2f} ms); a row-column is {kv / 1e3:.0f} KB of keys and values, read at "
              f"{kv / b / 1e6:.1f} GB/s")


def alone(cache, model, m, decode_attention) -> str:
    """What one layer's attention costs alone at the cache's filled length, three ways."""
    q = torch.randn(m, model.config.num_attention_heads, 1, cache.k[0].shape[-1])
    k, v = cache.k[0][:, :, :cache.end].contiguous(), cache.v[0][:, :, :cache.end].contiguous()
    attn_ms = attention_ms(q, k, v)
    bf16_ms = attention_ms(*(x.to(torch.bfloat16) for x in (q, k, v)))
    bias = cache.bias[:, None, None, :]
    own_ms = call_ms(lambda: decode_attention(q, cache.k[0], cache.v[0], bias, q.shape[-1] ** -0.5))
    mb = 2 * k.numel() * k.element_size() / 1e6
    return (f"one layer's attention alone at {cache.end}: {own_ms:.2f} ms in the engine's decode_attention over "
            f"its {cache.k[0].shape[2]} columns, {attn_ms:.2f} ms in SDPA over the filled ones, {mb:.0f} MB of keys "
            f"and values ({mb / attn_ms:.1f} GB/s), x {len(cache.k)} layers; SDPA in bfloat16 {bf16_ms:.2f} ms")


if __name__ == "__main__":
    main()
