"""Generation throughput of aha's rollout engine vs `model.generate` on the same prompts.

    .venv/bin/python benchmarks/generation.py --size 4m --prompts 2 --n 8 --max-new 64
    .venv/bin/python benchmarks/generation.py --size 4m --max-new 256 --cache hf   # the HFCache path
    python benchmarks/generation.py --device cuda --size qwen2-0.5b --arch qwen2 --vocab-size 151936 \
        --dtype bfloat16 --max-new 64 256 1024 --json gen.json                     # on a GPU

On a CUDA device aha-layer decodes with CUDA graphs (GraphCache) and aha-eager is the same engine without
them. Both sample B*G sequences at temperature 1 with a KV cache. aha prefills each prompt once and
shares its cache among its G samples, and drops finished rows; `generate` decodes all rows until
the longest ends. Tokens/s counts generated tokens (up to and including EOS). With a vocabulary far
larger than the tokenizer's (--vocab-size 151936 on the 512-token tokenizer), EOS is one token in
151,936 under random weights, so nearly every row runs to the cap: no rows to drop, the case least
favourable to aha.

Besides tokens/s it prints the useful GFLOP/s (weight products plus attention over each token's positions) and the
least memory traffic per generated token (every weight a product uses, once per decode step, spread over the step's
rows, plus the keys and values of the positions each token attends to), with the rate the run streamed that at:
on a CPU a decode step is bound by memory, so that traffic sets how fast any length can go.
"""

import argparse
import contextlib
import json
import statistics
import time

import torch


def count_decode_steps() -> list[int]:
    """[steps]: from now on, every decode step of aha's engine (a cache forward of one new token per row) adds 1.
    The caches an earlier engine lacks (run with its tree on PYTHONPATH) are skipped."""
    from aha.rollout import hf
    steps = [0]
    for cls in [getattr(hf, c) for c in ("LayerCache", "GraphCache", "HFCache", "Cohorts") if hasattr(hf, c)]:
        def counted(self, ids, pos, forward=cls.forward):
            steps[0] += ids.shape[1] == 1
            return forward(self, ids, pos)
        cls.forward = counted
    return steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="4m")
    ap.add_argument("--arch", default="llama", choices=("llama", "qwen2"))
    ap.add_argument("--vocab-size", type=int, help="model vocabulary (default: the tokenizer's 512)")
    ap.add_argument("--kv-heads", type=int,
                    help="key/value heads (grouped-query attention; default: the size's, 8 of 8 for 30m): fewer "
                         "heads, a smaller cache for each decode step to read")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-batch", type=int, default=512,
                    help="most rows decoded at once (generation_max_batch): aha's engine starts waiting rows as rows "
                         "finish with AHA_ADMIT_FRACTION set, else in the next batch; `model.generate` runs the "
                         "prompts in batches of that many rows")
    ap.add_argument("--max-new", type=int, nargs="+", default=[64], help="one or more generation lengths")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="weights and cache dtype")
    ap.add_argument("--cache", choices=("layer", "hf"), default="layer",
                    help="aha's KV cache: preallocated per-layer buffers, or transformers' DynamicCache")
    ap.add_argument("--eos-bias", type=float, default=0.0,
                    help="add this many mean output-weight rows to EOS's (negative: rows run to the cap)")
    ap.add_argument("--only", choices=("aha", "generate", "both", "aha-layer", "aha-eager"), default="both",
                    help="which engines to time (aha-layer / aha-eager: one of aha's two on a GPU)")
    ap.add_argument("--warmup-new", type=int, help="tokens of the untimed warm-up run (default: --max-new)")
    ap.add_argument("--autocast", action="store_true",
                    help="under torch.autocast to bfloat16, as `dtype: auto` trains and samples where bf16 is native")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from aha.rollout import SamplingParams, get_engine
    from aha.models.tiny import random_model_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer
    overrides = {k: v for k, v in (("vocab_size", a.vocab_size), ("num_key_value_heads", a.kv_heads)) if v} or None
    d = random_model_dir(a.size, a.arch, overrides)
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=getattr(torch, a.dtype)).to(a.device).eval()
    if a.eos_bias:
        with torch.no_grad():
            model.lm_head.weight[tok.eos_token_id] += a.eos_bias * model.lm_head.weight.mean(0)
    prompts = [tok(f"question {i}: what is {i} plus {i}?", add_special_tokens=False)["input_ids"] for i in range(a.prompts)]
    cuda = a.device.startswith("cuda")
    engines = {graphs: get_engine("hf")(model, tok, a.max_batch, layer_cache=a.cache == "layer", cuda_graphs=graphs)
               for graphs in (True, False)}
    steps = count_decode_steps()

    cfg = model.config
    weights = 2 * sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    if cfg.tie_word_embeddings:
        weights += 2 * model.lm_head.weight.numel()  # the head's product, its weight counted once as the embedding
    per_position = 4 * cfg.num_attention_heads * (getattr(cfg, "head_dim", None) or cfg.hidden_size
                                                   // cfg.num_attention_heads) * cfg.num_hidden_layers

    def useful_flops(lengths) -> float:
        """Weight products plus attention over the positions each generated token sees (its prompt and the
        tokens before it, itself included): what a token costs in arithmetic, growing with its position."""
        total = 0
        for i, n in enumerate(lengths):
            first = len(prompts[i // a.n]) + 1                                    # positions the first token sees
            total += n * weights + per_position * (n * first + n * (n - 1) // 2)
        return total

    itemsize = 2 if a.autocast or a.dtype == "bfloat16" else 4  # bytes of a weight or cached element decode reads
    column = itemsize * 2 * cfg.num_key_value_heads * (getattr(cfg, "head_dim", None) or cfg.hidden_size
                                                   // cfg.num_attention_heads) * cfg.num_hidden_layers

    def bytes_read(lengths, decode_steps) -> float:
        """The least memory traffic of the decode steps: each step reads every weight a product uses once, and each
        row its cache's filled columns (keys and values of every layer). Rows end at their own lengths, so a step
        of the tail spreads the weights over fewer tokens, while each token reads a longer cache."""
        cache = sum(column * (n * len(prompts[i // a.n]) + n * (n - 1) // 2) for i, n in enumerate(lengths))
        return decode_steps * weights / 2 * itemsize + cache

    def run_aha(seed, max_new, graphs=True):
        steps[0] = 0
        out = engines[graphs].generate(prompts, a.n, SamplingParams(1.0, 1.0, 0, max_new),
                                       torch.Generator().manual_seed(seed))
        return [len(c) for c in out.completion_ids], steps[0]

    def run_hf(seed, max_new):
        torch.manual_seed(seed)
        lengths, decode_steps, per = [], 0, max(1, a.max_batch // a.n)
        for i in range(0, len(prompts), per):
            enc = tok.pad([{"input_ids": p} for p in prompts[i:i + per]], return_tensors="pt",
                          padding_side="left").to(a.device)
            with torch.no_grad():
                out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                     max_new_tokens=max_new, num_return_sequences=a.n,
                                     pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            gen = out[:, enc["input_ids"].shape[1]:].cpu()
            part = [min(int((row == tok.eos_token_id).nonzero()[0]) + 1 if (row == tok.eos_token_id).any()
                        else max_new, max_new) for row in gen]
            lengths, decode_steps = lengths + part, decode_steps + max(part)  # every row until the longest ends
        return lengths, decode_steps

    runs = {"aha": ((f"aha-{a.cache}", run_aha),), "generate": (("generate", run_hf),)}
    if cuda and a.cache == "layer":  # on a GPU aha-layer replays CUDA graphs; aha-eager is the same without them
        runs["aha"] += (("aha-eager", lambda seed, max_new: run_aha(seed, max_new, graphs=False)),)
    context = torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16) if a.autocast else contextlib.nullcontext()
    results = []
    for max_new in a.max_new:
        for name, fn in runs.get(a.only) or [r for r in runs["aha"] + runs["generate"] if a.only in ("both", r[0])]:
            try:
                with context:
                    fn(0, a.warmup_new or max_new)  # warm-up
                    rates, tokens, flops, rows, traffic = [], [], [], [], []
                    for r in range(a.repeats):
                        if cuda:
                            torch.cuda.synchronize()
                        t = time.perf_counter()
                        lengths, decode_steps = fn(r + 1, max_new)
                        if cuda:
                            torch.cuda.synchronize()
                        seconds = time.perf_counter() - t
                        rates.append(sum(lengths) / seconds)
                        tokens.append(sum(lengths))
                        flops.append(useful_flops(lengths) / seconds)
                        rows.append(sum(lengths) / decode_steps)  # the live rows of a mean decode step
                        traffic.append(bytes_read(lengths, decode_steps) / sum(lengths))
            except Exception as e:  # noqa: BLE001 - one engine failing must not hide the others' figures
                print(f"{name} max_new={max_new} FAILED: {type(e).__name__}: {e}", flush=True)
                results.append({"engine": name, "max_new": max_new, "error": f"{type(e).__name__}: {e}"})
                continue
            results.append({"engine": name, "max_new": max_new, "median_tokens_per_s": statistics.median(rates),
                            "rates": rates, "mean_len": statistics.fmean(tokens) / (a.prompts * a.n),
                            "median_useful_gflops": statistics.median(flops) / 1e9,
                            "tokens_per_decode_step": statistics.fmean(rows),
                            "least_mb_read_per_token": statistics.fmean(traffic) / 1e6,
                            "implied_gb_per_s": statistics.median(r * b for r, b in zip(rates, traffic)) / 1e9})
            print(f"{name:9s} {a.device} threads={a.threads} size={a.size}"
                  f"{f' kv_heads={a.kv_heads}' if a.kv_heads else ''} {a.dtype} B={a.prompts} G={a.n} "
                  f"{f'max_batch={a.max_batch} ' if a.max_batch < a.prompts * a.n else ''}"
                  f"max_new={max_new}{' autocast-bf16' if a.autocast else ''}: median "
                  f"{statistics.median(rates):,.0f} tokens/s over {a.repeats} runs (mean length "
                  f"{results[-1]['mean_len']:.0f}, {statistics.fmean(rows):.1f} tokens per decode step; "
                  f"{statistics.median(flops) / 1e9:.1f} useful GFLOP/s; at least "
                  f"{results[-1]['least_mb_read_per_token']:.1f} MB read per token, "
                  f"{results[-1]['implied_gb_per_s']:.1f} GB/s)", flush=True)
    if a.json:
        settings = {k: v for k, v in vars(a).items() if k != "json"}
        if cuda:
            settings["gpu"] = torch.cuda.get_device_name()
        with open(a.json, "w") as f:
            json.dump({"settings": settings, "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
