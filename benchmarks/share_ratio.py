"""When does running each group's prompt once pay? Forward + backward of the policy's log-probs over one GRPO batch
of fixed lengths, with `share_prompts` off and on, for several prompt and completion lengths.

    .venv/bin/python benchmarks/share_ratio.py --threads 1                     # 4m model, 2 prompts x 8
    .venv/bin/python benchmarks/share_ratio.py --size 30m --lengths 64:256 193:260

Random token ids on the tiny model of --size (benchmarks/vs_trl.py's, random weights): the work depends on the
lengths only. Each (prompt, completion) length pair runs off / on alternately, --rounds times after one warm-up
each, one pass over the whole batch (max_tokens_per_micro_batch: 0); reports the median seconds and on/off.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="4m")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lengths", nargs="+", default=["16:64", "64:64", "64:256", "193:260", "32:512", "128:128"],
                    help="PROMPT:COMPLETION token lengths")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import torch
    import vs_trl
    from aha.train.logprobs import completion_logprobs
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(vs_trl.build_model(a.size, Path(tempfile.mkdtemp()))["path"])
    rng = random.Random(0)
    print(f"# {a.size}, {a.prompts} prompts x {a.group}, {torch.get_num_threads()} threads, median of {a.rounds}")
    print("| prompt | completion | off s | on s | off / on |\n|---|---|---|---|---|")
    for pair in a.lengths:
        P, T = map(int, pair.split(":"))
        prompts = [p for p in ([rng.randrange(7, 500) for _ in range(P)] for _ in range(a.prompts))
                   for _ in range(a.group)]
        comps = [[rng.randrange(7, 500) for _ in range(T)] for _ in prompts]
        times = {False: [], True: []}
        for r in range(a.rounds + 1):
            for share in (False, True):
                t0 = time.perf_counter()
                logp, mask, _ = completion_logprobs(model, prompts, comps, 0, share_prompts=share)
                (logp * mask).sum().backward()
                model.zero_grad(set_to_none=True)
                if r:
                    times[share].append(time.perf_counter() - t0)
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(f"| {P} | {T} | {off:.3f} | {on:.3f} | {off / on:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
