"""A step's rollout (generation + scoring) with and without `stream_rewards`, for verifiers of several costs.

    .venv/bin/python benchmarks/stream_rewards.py                       # 4m model, 4 prompts x 8, up to 256 tokens
    .venv/bin/python benchmarks/stream_rewards.py --reward-ms 0 5 20 --rounds 3 --threads 2

The reward is vowel_frac (benchmarks/vs_trl.py) plus a wait of --reward-ms per completion: a verifier that runs
elsewhere (unit tests in a sandbox process, a remote checker), so its time is waiting, not Python work on this
process. The random model's own EOS ends its completions anywhere from a few tokens to the cap; a group is
finished only when its longest row is, so how far apart groups finish (and so what can overlap) depends on
--n and --max-new. Each cell is the median over --rounds of `trainer.next_batch()`
(the rollout without the update), alternating off / on, after one untimed warm-up; the streamed run reports
how much of its scoring was left after generation ended (rollout - `perf/generate_s`) and how much there
was in all (`perf/reward_s`). Same seed both ways: the completions and rewards are identical (tests/test_grpo.py).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="4m")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--reward-ms", type=float, nargs="+", default=[0.0, 5.0, 20.0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import torch
    from aha.config import GRPOConfig
    from aha.train.grpo import GRPOTrainer
    from benchmarks.vs_trl import build_model, prompts, vowel_frac
    torch.set_num_threads(a.threads)
    tmp = Path(tempfile.mkdtemp(prefix="aha-stream-"))
    model = build_model(a.size, tmp / "model")["path"]
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {a.threads} threads, "
          f"{a.size}, {a.prompts} prompts x {a.n}, up to {a.max_new} tokens, median of {a.rounds}")
    print("| max new tokens | verifier ms per completion | stream_rewards | rollout s | generation ends at s "
          "| scoring after it s | scoring in all s | mean completion |")
    print("|---|---|---|---|---|---|---|---|")
    for ms in a.reward_ms:
        def reward(prompts=None, completions=None, **kw):
            time.sleep(ms / 1000 * len(completions))
            return vowel_frac(prompts, completions)
        runs = {False: [], True: []}
        for r in range(a.rounds + 1):
            for stream in (False, True):
                cfg = GRPOConfig(output_dir=str(tmp / "run"), num_generations=a.n, seed=r, stream_rewards=stream,
                                 per_device_train_batch_size=a.prompts * a.n, max_completion_length=a.max_new,
                                 temperature=1.0, report_to=[], progress_bar=False, log_completions_steps=0,
                                 threads=a.threads, dtype="float32")
                trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=prompts())
                t0 = time.perf_counter()
                batch, m = trainer.next_batch()
                wall = time.perf_counter() - t0
                if r:  # round 0 warms up
                    runs[stream].append((wall, m["perf/generate_s"], wall - m["perf/generate_s"], m["perf/reward_s"],
                                         sum(map(len, batch.completion_ids)) / len(batch.completion_ids)))
        for stream in (False, True):
            cells = [statistics.median(x) for x in zip(*runs[stream])]
            print(f"| {a.max_new:,} | {ms:g} | {'on' if stream else 'off'} | {cells[0]:.2f} | {cells[1]:.2f} | {cells[2]:.2f} | "
                  f"{cells[3]:.2f} | {cells[4]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
