"""Does `torch.compile` speed up the CPU decode step? aha's eager LayerCache against the static-shape step of
GraphCache (run eagerly, and compiled with torch.compile), every row alive, same tokens.

    .venv/bin/python benchmarks/compile_decode.py --size 30m --rows 16 --length 512

The static step attends over a power-of-two bucket of columns (unwritten ones masked), so each bucket is one
compiled graph. Each variant decodes `--length` tokens twice on one cache: the first pass includes compiling, the
second is the steady state; ms per step of each pass are printed.
"""

import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="30m")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from aha.models.tiny import random_model
    from aha.rollout.hf import GraphCache, LayerCache
    model = random_model(a.size)
    V, m, P = model.config.vocab_size, a.rows, 16
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, V, (m, P), generator=gen)
    toks = torch.randint(10, V, (a.length, m, 1), generator=gen)
    variants = {"LayerCache (eager)": lambda: LayerCache(model, torch.ones(m, P, dtype=torch.long), a.length),
                "GraphCache step (eager)": lambda: GraphCache(model, torch.ones(m, P, dtype=torch.long), a.length,
                                                              capture=False)}

    def compiled():
        cache = GraphCache(model, torch.ones(m, P, dtype=torch.long), a.length, capture=False)
        cache._step = torch.compile(cache._step, dynamic=False)
        return cache
    variants["GraphCache step (torch.compile)"] = compiled
    last = {}
    with torch.no_grad():
        for name, make in variants.items():
            cache = make()
            cache.forward(prompt, torch.arange(P).expand(m, P))
            times = []
            for rep in range(2):
                cache.end = P  # decode the same positions again (the buffers keep the prefill)
                cache._clear_tail(P)
                t = time.perf_counter()
                for s in range(a.length):
                    logits = cache.forward(toks[s], torch.full((m, 1), P + s))
                times.append((time.perf_counter() - t) / a.length * 1e3)
            last[name] = logits
            print(f"{name:32s}: first pass {times[0]:7.2f} ms/step, second {times[1]:6.2f} ms/step "
                  f"({m / times[1] * 1e3:,.0f} tokens/s)", flush=True)
    ref = last["LayerCache (eager)"]
    for name, x in last.items():
        print(f"{name:32s}: last logits max |diff| from LayerCache {float((x - ref).abs().max()):.2e}")


if __name__ == "__main__":
    main()
