"""What LayerCache gains by wiring the model's modules itself instead of calling its decoder layers.

    .venv/bin/python benchmarks/layer_wiring.py --sizes 4m 30m

The same engine generates the same completions (2 prompts x 8, up to --max-new tokens, temperature 1, the random
model's own EOS) with LayerCache and with the reference that calls the model's decoder layers over the same cache
(`ThroughTheLayers` in tests/test_rollout.py, which checks the two give equal logits), alternating the order over
--repeats runs. Prints tokens/s of each, the median ratio, and whether every sampled token was the same.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["4m", "30m"])
    ap.add_argument("--max-new", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from test_rollout import ThroughTheLayers
    from aha.models.tiny import random_model_dir
    from aha.rollout import SamplingParams, get_engine
    from aha.rollout import hf as engine_module
    from transformers import AutoModelForCausalLM, AutoTokenizer
    variants = {"model's layers": ThroughTheLayers, "LayerCache": engine_module.LayerCache}
    for size in a.sizes:
        d = random_model_dir(size)
        model, tok = AutoModelForCausalLM.from_pretrained(d).eval(), AutoTokenizer.from_pretrained(d)
        engine = get_engine("hf")(model, tok)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(10, model.config.vocab_size, (16,), generator=g).tolist() for _ in range(2)]
        engine.generate(prompts, 8, SamplingParams(1.0, 1.0, 0, 32), torch.Generator().manual_seed(1))  # warm-up
        rates, tokens = {name: [] for name in variants}, {}
        try:
            for r in range(a.repeats):
                order = list(variants) if r % 2 == 0 else list(variants)[::-1]
                for name in order:
                    engine_module.LayerCache = variants[name]
                    t0 = time.perf_counter()
                    out = engine.generate(prompts, 8, SamplingParams(1.0, 1.0, 0, a.max_new),
                                          torch.Generator().manual_seed(r))
                    rates[name].append(sum(map(len, out.completion_ids)) / (time.perf_counter() - t0))
                    tokens.setdefault(r, []).append(out.completion_ids)
        finally:
            engine_module.LayerCache = variants["LayerCache"]
        ref, lean = (statistics.median(rates[n]) for n in variants)
        print(f"{size}, {a.max_new} tokens: tokens/s through the model's layers {[round(x) for x in rates[list(variants)[0]]]}, "
              f"LayerCache {[round(x) for x in rates['LayerCache']]}; median {ref:.0f} -> {lean:.0f} = {lean / ref:.3f}x; "
              f"same tokens: {all(x == y for x, y in tokens.values())}")


if __name__ == "__main__":
    main()
