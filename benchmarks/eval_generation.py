"""Time the sampled pass of `aha eval` (one generate call over every prompt, n samples each) on a real model.

    .venv/bin/aha models get smollm2-135m-instruct
    .venv/bin/python benchmarks/eval_generation.py --problems 16 --n 4 --batch-size 16 --max-new 256

Prints the generated tokens, tokens/s, the decode steps (counted at the engine's caches) and the rows a step decoded
on average. With more rows than --batch-size the engine decodes them batch after batch, or, with
AHA_ADMIT_FRACTION=0.25 in the environment, starts waiting rows as rows finish (`Cohorts` in aha/rollout/hf.py).
To compare with an earlier engine, run the same script with that tree first on PYTHONPATH.
"""

import argparse
import sys
import time
from pathlib import Path

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="~/.cache/aha/models/smollm2-135m-instruct")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--n", type=int, default=4, help="samples per problem")
    ap.add_argument("--batch-size", type=int, default=16, help="most rows decoded at once")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/generation.py
    from aha.eval import _generate
    from aha.models import load_model, load_tokenizer
    from aha.rollout import SamplingParams
    from aha.tasks import get_task
    from generation import count_decode_steps
    path = str(Path(a.model).expanduser())
    model, tok = load_model(path, "float32"), load_tokenizer(path)
    rows = get_task(a.task).load("test")[:a.problems]
    steps = count_decode_steps()
    t = time.perf_counter()
    _, lengths = _generate(model, tok, rows, a.n, SamplingParams(a.temperature, 1.0, 0, a.max_new), a.batch_size,
                           0, "sample", False)
    seconds = time.perf_counter() - t
    print(f"{a.task} x{len(rows)}, n={a.n}, batch {a.batch_size}, up to {a.max_new} tokens: {sum(lengths)} tokens in "
          f"{seconds:.1f} s = {sum(lengths) / seconds:.0f} tokens/s; {steps[0]} decode steps, "
          f"{sum(lengths) / steps[0]:.1f} rows a step; mean completion {sum(lengths) / len(lengths):.0f}, "
          f"{sum(n == a.max_new for n in lengths)} of {len(lengths)} at the cap")


if __name__ == "__main__":
    main()
