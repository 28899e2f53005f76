"""A decode step's weight products on CPU: PyTorch's Linear against the same weight prepacked for oneDNN.

    .venv/bin/python benchmarks/packed_linear.py --size 30m --threads 2

For each distinct Linear shape of the model (its layers' projections and its head), a batch of `--rows` one-token
rows (what the engine's decode step multiplies, as rows finish: 16, 4, 1) times the weight: F.linear (what the
module computes) against torch.ops.mkldnn._linear_pointwise on the weight packed once
(aha.rollout.hf.packed_weights, what LayerCache decodes with on CPU), float32 and bfloat16. Prints microseconds per
call (median of 5 runs of 100 calls) and the largest difference between the two results.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def per_call_us(fn, calls: int = 100, runs: int = 5) -> float:
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="30m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 4, 1])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from aha.models.tiny import random_model
    model = random_model(a.size)
    layer = model.model.layers[0]
    shapes = {tuple(m.weight.shape): m.weight.detach() for m in
              (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.mlp.gate_proj, layer.mlp.down_proj, model.lm_head)}
    print(f"{a.size}, {a.threads} threads; weight [out, in], rows: F.linear us / prepacked us (speed-up), max |diff|")
    for dtype in (torch.float32, torch.bfloat16):
        for (n, k), w in shapes.items():
            w = w.to(dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, 16)
            cells = []
            for rows in a.rows:
                x = torch.randn(rows, 1, k, dtype=dtype)
                plain = per_call_us(lambda: F.linear(x, w))
                fast = per_call_us(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
                diff = (torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "") - F.linear(x, w)).abs().max()
                cells.append(f"{rows:2d} rows {plain:6.0f} / {fast:5.0f} ({plain / fast:.2f}x, {float(diff):.1e})")
            print(f"{str(dtype)[6:]:8s} [{n:5d}, {k:4d}]  " + "   ".join(cells), flush=True)


if __name__ == "__main__":
    main()
