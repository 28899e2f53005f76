"""The training phase of a `vs_trl.py` result as a fraction of this machine's measured matmul peak.

    .venv/bin/python benchmarks/train_roofline.py benchmarks/results/vs_trl_512_4m.json

For each trainer in the result, the useful FLOPs of a step's training phase are counted on its real (unpadded)
tokens: the policy's forward and backward (6 per matmul weight per token), the reference model's forward when
beta > 0 (2 more), and attention's score and value products (4 x hidden per token per layer per position seen,
forward; three times that with the backward). That over the phase's measured seconds is the achieved rate; the
peak is `torch.mm` on the model's own weight shapes at the same thread count (the best of several token
counts), timed here, so run it on the machine that produced the result, alone. A result from `--device cuda`
is measured against `torch.mm` on the GPU, in bfloat16 when the timing ran under bf16 autocast, and against a
square 8192 product (the chip's practical peak); that fraction is the training phase's model FLOPs
utilisation (MFU).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def mm_gflops(shapes: list[tuple[int, int]], tokens: int, trials: int = 20, device: str = "cpu",
              dtype: torch.dtype = torch.float32) -> float:
    """GFLOP/s of [tokens, in] @ [in, out] over every weight shape: the fastest of `trials` passes after one
    untimed pass (a peak, so a slow spell of a shared machine does not lower it)."""
    xs = {i: torch.randn(tokens, i, device=device, dtype=dtype) for i, _ in shapes}
    ws = [torch.randn(i, o, device=device, dtype=dtype) for i, o in shapes]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    best = float("inf")
    for trial in range(trials + 1):
        sync()
        t0 = time.perf_counter()
        for w in ws:
            xs[w.shape[0]] @ w
        sync()
        if trial:
            best = min(best, time.perf_counter() - t0)
    return sum(2 * tokens * i * o for i, o in shapes) / best / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", help="a vs_trl.py JSON result")
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 8192],
                    help="token counts the peak is measured at (the best counts)")
    a = ap.parse_args()
    report = json.loads(Path(a.result).read_text())
    settings = report["settings"]
    threads, device = settings["threads"], settings.get("device", "cpu")
    dtype = torch.bfloat16 if device != "cpu" and settings.get("bf16_mixed_precision_timing") else torch.float32
    torch.set_num_threads(threads)
    from transformers import AutoModelForCausalLM
    from benchmarks.vs_trl import COMPLETIONS_PER_STEP, build_model

    for size, timing in report["timing"].items():
        with tempfile.TemporaryDirectory() as tmp:  # the very model vs_trl.py timed (same builder, same seed)
            model = AutoModelForCausalLM.from_pretrained(build_model(size, Path(tmp))["path"])
        shapes = [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)]
        weights = sum(i * o for i, o in shapes)
        cfg = model.config
        peak = max(mm_gflops(shapes, t, device=device, dtype=dtype) for t in a.tokens)
        where = f"on {threads} threads" if device == "cpu" else f"on {torch.cuda.get_device_name()}"
        print(f"{size}: {weights:,} matmul weights, hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers; "
              f"torch.mm peak {peak:.0f} GFLOP/s {str(dtype)[6:]} {where} (best of {a.tokens} tokens)")
        square = mm_gflops([(8192, 8192)], 8192, trials=10, device=device, dtype=dtype) if device != "cpu" else None
        if square:
            print(f"  square 8192 product: {square:.0f} GFLOP/s")
        passes = 8 if settings["beta"] > 0 else 6
        for fw in ("aha", "trl"):
            if fw not in timing:
                continue
            steps = [r for r in timing[fw]["records"] if r.get("train_tokens")][1:]  # first step is warm-up
            flops = []
            for r in steps:
                tokens = r["train_tokens"]
                prompt = tokens / COMPLETIONS_PER_STEP - r["completion_len"]
                seen = prompt + r["completion_len"] / 2      # mean positions a completion token attends to
                attn = 4 * cfg.hidden_size * cfg.num_hidden_layers * seen * tokens * (passes / 2)
                flops.append((passes * weights * tokens + attn) / r["train_s"] / 1e9)
            rate = statistics.median(flops)
            mfu = f", {100 * rate / square:.1f}% of the square product (MFU)" if square else ""
            print(f"  {fw}: training phase {rate:.1f} GFLOP/s useful = {100 * rate / peak:.0f}% of the matmul peak"
                  f"{mfu} (median of {len(flops)} steps, train {statistics.median(r['train_s'] for r in steps):.2f} s)")


if __name__ == "__main__":
    main()
