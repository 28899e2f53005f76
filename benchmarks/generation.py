"""Generation throughput of aha's rollout engine vs `model.generate` on the same prompts.

    .venv/bin/python benchmarks/generation.py --size 4m --prompts 2 --n 8 --max-new 64
    .venv/bin/python benchmarks/generation.py --size 4m --max-new 256 --cache hf   # the HFCache path

Both sample B*G sequences at temperature 1 with a KV cache. aha prefills each prompt once and
shares its cache among its G samples, and drops finished rows; `generate` decodes all rows until
the longest ends. Tokens/s counts generated tokens (up to and including EOS).
"""

import argparse
import contextlib
import statistics
import tempfile
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="4m")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", choices=("layer", "hf"), default="layer",
                    help="aha's KV cache: preallocated per-layer buffers, or transformers' DynamicCache")
    ap.add_argument("--eos-bias", type=float, default=0.0,
                    help="add this many mean output-weight rows to EOS's (negative: rows run to the cap)")
    ap.add_argument("--only", choices=("aha", "generate", "both"), default="both")
    ap.add_argument("--warmup-new", type=int, help="tokens of the untimed warm-up run (default: --max-new)")
    ap.add_argument("--autocast", action="store_true",
                    help="under torch.autocast to bfloat16, as `dtype: auto` trains and samples where bf16 is native")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from aha.models import eos_ids
    from aha.rollout import HFEngine, SamplingParams
    from aha.models.tiny import make_tiny
    from transformers import AutoModelForCausalLM, AutoTokenizer
    texts = [f"{i} plus {i * 7} is {i * 8}" for i in range(500)]
    d = make_tiny(tempfile.mkdtemp() + "/m", texts, size=a.size)
    tok, model = AutoTokenizer.from_pretrained(d), AutoModelForCausalLM.from_pretrained(d).eval()
    if a.eos_bias:
        with torch.no_grad():
            model.lm_head.weight[tok.eos_token_id] += a.eos_bias * model.lm_head.weight.mean(0)
    prompts = [tok(f"question {i}: what is {i} plus {i}?", add_special_tokens=False)["input_ids"] for i in range(a.prompts)]
    engine = HFEngine(model, eos_ids(model, tok), tok.pad_token_id, layer_cache=a.cache == "layer")
    def run_aha(seed, max_new=a.max_new):
        out = engine.generate(prompts, a.n, SamplingParams(1.0, 1.0, 0, max_new), torch.Generator().manual_seed(seed))
        return sum(map(len, out.completion_ids))

    def run_hf(seed, max_new=a.max_new):
        torch.manual_seed(seed)
        enc = tok.pad([{"input_ids": p} for p in prompts], return_tensors="pt", padding_side="left")
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new,
                                 num_return_sequences=a.n, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        gen = out[:, enc["input_ids"].shape[1]:]
        return int(sum(min(int((row == tok.eos_token_id).nonzero()[0]) + 1 if (row == tok.eos_token_id).any() else max_new, max_new) for row in gen))

    runs = {"aha": ((f"aha-{a.cache}", run_aha),), "generate": (("generate", run_hf),)}
    context = torch.autocast("cpu", dtype=torch.bfloat16) if a.autocast else contextlib.nullcontext()
    for name, fn in runs.get(a.only, runs["aha"] + runs["generate"]):
        with context:
            fn(0, a.warmup_new or a.max_new)  # warm-up
            rates = []
            for r in range(a.repeats):
                t = time.perf_counter()
                n_tok = fn(r + 1)
                rates.append(n_tok / (time.perf_counter() - t))
        print(f"{name:9s} threads={a.threads} size={a.size} B={a.prompts} G={a.n} max_new={a.max_new}"
              f"{' autocast-bf16' if a.autocast else ''}: "
              f"median {statistics.median(rates):,.0f} tokens/s over {a.repeats} runs")


if __name__ == "__main__":
    main()
