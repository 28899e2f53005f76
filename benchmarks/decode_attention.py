"""One decode step's attention, two ways: the batched products (aha.rollout.hf.batched_attention, what
decode_attention computes a float32 cache with) against PyTorch's SDPA (what it calls for a bfloat16 cache), in
float32 and bfloat16, over whole cache buffers with the unwritten columns masked, as the engine attends.

    .venv/bin/python benchmarks/decode_attention.py --threads 1

For each heads shape (query/key-value heads: the 4m model's 4/4, SmolLM2's 9/3), rows and filled columns: ms per
call (mean of 30 after one warm-up), and each result's relative error against a float32 SDPA reference.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from aha.rollout.hf import batched_attention  # noqa: E402


def sdpa(query, key, value, bias, scaling):
    m, H, _, D = query.shape
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias.to(key.dtype), scale=scaling,
                                         enable_gqa=H != key.shape[1])
    return out.transpose(1, 2).reshape(m, 1, H * D)


def ms(fn, repeats: int = 30) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--columns", type=int, nargs="+", default=[144, 313, 800])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads; ms per call (relative error)")
    print("| heads q/kv | rows | columns | float32 bmm | float32 SDPA | bfloat16 bmm | bfloat16 SDPA |")
    print("|---|---|---|---|---|---|---|")
    for H, Hkv, D in ((4, 4, 64), (9, 3, 64)):
        for m in a.rows:
            for S in a.columns:
                cap = S + 8  # room past the filled columns, masked
                q, k, v = torch.randn(m, H, 1, D), torch.randn(m, Hkv, cap, D), torch.randn(m, Hkv, cap, D)
                k[:, :, S:], v[:, :, S:] = 0, 0
                bias = torch.zeros(m, 1, 1, cap)
                bias[..., S:] = torch.finfo(torch.float32).min
                ref = sdpa(q, k, v, bias, D ** -0.5)
                cells = []
                for dt in (torch.float32, torch.bfloat16):
                    x = [t.to(dt) for t in (q, k, v)]
                    for fn in (batched_attention, sdpa):
                        err = float((fn(*x, bias, D ** -0.5).float() - ref).norm() / ref.norm())
                        cells.append(f"{ms(lambda: fn(*x, bias, D ** -0.5)):.3f} ({err:.0e})")
                print(f"| {H}/{Hkv} | {m} | {S} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
