"""The update phase of a GRPO step with and without `share_prompts`, on one real batch of a config's task.

    .venv/bin/python benchmarks/share_prompts.py aha/examples/grpo_smollm2_steps.yaml \
        model=smollm2-135m-instruct dtype=float32 threads=2 --rounds 3

Builds the config's trainer (its task's prompts and rewards; any key=value overrides the YAML), samples one
batch with `next_batch()`, then times `Learner.update` on that same batch, alternating off / on, after one
untimed warm-up of each. The update includes the reference pass when beta > 0 (and the old-policy pass when
num_iterations > 1); each update moves the weights, which changes nothing of the work. Reports the median
update seconds, the prompt and completion tokens of the batch, and the tokens the model actually ran with each
setting (a group's prompt once instead of G times).
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config", nargs="+", help="CONFIG.yaml [key=value ...]")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import tempfile

    import torch
    from aha.config import GRPOConfig, parse_args
    from aha.stages import grpo_trainer
    trainer = grpo_trainer(parse_args(GRPOConfig, a.config + [
        f"output_dir={tempfile.mkdtemp(prefix='aha-share-')}", "report_to=[]", "progress_bar=false", "eval_steps=0",
        "log_completions_steps=0"]))
    cfg = trainer.args
    batch, _ = trainer.next_batch()
    learner = trainer.learner
    prompt = sum(map(len, batch.prompt_ids))
    comp = sum(map(len, batch.completion_ids))
    distinct = sum(len(batch.prompt_ids[g * batch.group_size]) for g in range(len(batch.rows)))
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads, {cfg.model}, {cfg.task}, dtype {cfg.dtype}, {len(batch.rows)} prompts x {batch.group_size}, "
          f"beta {cfg.beta}, num_iterations {cfg.num_iterations}, median of {a.rounds}")
    print(f"# tokens: prompts {prompt:,} ({distinct:,} distinct), completions {comp:,} "
          f"(mean {comp / len(batch.completion_ids):.1f}, max {max(map(len, batch.completion_ids))})")
    times = {False: [], True: []}
    for r in range(a.rounds + 1):
        for share in (False, True):
            learner.args = dataclasses.replace(cfg, share_prompts=share)
            t0 = time.perf_counter()
            sums, _ = learner.update(batch)
            if r:  # round 0 warms up
                times[share].append(time.perf_counter() - t0)
            if r == a.rounds:
                print(f"# share_prompts={share}: {sums.processed:,} tokens through the policy pass")
    off, on = (statistics.median(times[s]) for s in (False, True))
    print("| share_prompts | update s (median) | speed-up |")
    print("|---|---|---|")
    print(f"| off | {off:.2f} | 1.00x |")
    print(f"| on | {on:.2f} | {off / on:.2f}x |")


if __name__ == "__main__":
    main()
