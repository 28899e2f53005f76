"""Peak memory and time of the log-prob pass (forward and backward) at a large vocabulary: aha's chunked
`TokenLogProbs` against the plain autograd formula it replaced (a float32 copy of the logits, logsumexp, gather,
softmax for the entropy).

    .venv/bin/python benchmarks/logprobs_memory.py                   # vocab 151,936, 16 x 256 tokens
    .venv/bin/python benchmarks/logprobs_memory.py --rows 16 --tokens 512 --vocab 151936

The model is the tiny body (hidden 64, 2 layers) with Qwen2's vocabulary, so the logits dominate the memory, as
they do for a 0.5B model at these lengths. Each variant runs in its own process (peak RSS is per process), in
float32 and under bf16 autocast.
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

import torch


def plain(model, prompts, comps, pad_id):
    """The formula before TokenLogProbs: every [n,T,V] intermediate kept by autograd or alive at once."""
    from aha.train.logprobs import pad_batch
    ids, attn, comp_ids, mask = pad_batch(prompts, comps, pad_id, next(model.parameters()).device)
    T = comp_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                   use_cache=False, logits_to_keep=T + 1).logits[:, :T].float()
    lse = logits.logsumexp(-1)
    logp = logits.gather(-1, comp_ids.unsqueeze(-1)).squeeze(-1) - lse
    with torch.no_grad():
        entropy = lse - (logits.softmax(-1) * logits).sum(-1)
    return logp, mask, entropy


def worker(a):
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM
    from aha.train.logprobs import completion_logprobs
    model = AutoModelForCausalLM.from_pretrained(a.model_dir)
    g = torch.Generator().manual_seed(0)
    prompts = [[5, 6, 7, 8]] * a.rows
    comps = [torch.randint(10, 400, (a.tokens,), generator=g).tolist() for _ in range(a.rows)]
    fn = plain if a.variant == "plain" else lambda *x: completion_logprobs(*x, with_entropy=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        logp, mask, ent = fn(model, prompts, comps, 0)
    (logp * mask).sum().backward()
    torch.save({"logp": logp.detach(), "entropy": ent, "lm_head_grad": model.lm_head.weight.grad}, a.save)
    print(json.dumps({"variant": a.variant, "bf16": a.bf16, "s": time.perf_counter() - t0,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "rss_before_mb": before, "logp_mean": float(logp.mean()), "entropy_mean": float(ent.mean())}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variant", choices=("aha", "plain"))
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--model-dir")
    ap.add_argument("--save", help="where the worker writes its log-probs, entropy and output-layer gradient")
    a = ap.parse_args()
    if a.variant:
        return worker(a)
    from aha.models.tiny import make_tiny
    d = str(make_tiny(tempfile.mkdtemp() + "/m", ["hello world 123"] * 50, size="tiny",
                      overrides={"vocab_size": a.vocab}))
    print(f"{a.rows} x {a.tokens} completion tokens, vocabulary {a.vocab:,}, {a.threads} threads")
    for bf16 in (False, True):
        saved = {}
        for variant in ("plain", "aha"):
            saved[variant] = f"{d}/{variant}-{bf16}.pt"
            cmd = [sys.executable, __file__, "--variant", variant, "--model-dir", d, "--rows", str(a.rows),
                   "--tokens", str(a.tokens), "--threads", str(a.threads), "--save", saved[variant]] \
                + (["--bf16"] if bf16 else [])
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if out.returncode:
                sys.exit(out.stderr[-3000:])
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{'bf16 autocast' if bf16 else 'float32':13s} {variant:5s}: peak RSS {r['peak_rss_mb']:,.0f} MB "
                  f"(model loaded: {r['rss_before_mb']:,.0f} MB), {r['s']:.1f} s forward+backward, "
                  f"mean log-prob {r['logp_mean']:.6f}, mean entropy {r['entropy_mean']:.6f}", flush=True)
        x, y = (torch.load(saved[v]) for v in ("plain", "aha"))
        print("  bit-identical to plain: " + ", ".join(f"{k} {torch.equal(x[k], y[k])}" for k in x), flush=True)


if __name__ == "__main__":
    main()
