"""Profile GRPO steps at the vs_trl.py settings (4m model by default): top entries by cumulative time.

    .venv/bin/python benchmarks/profile_step.py                    # aha, cProfile, 1 warm-up + 3 profiled steps
    .venv/bin/python benchmarks/profile_step.py --torch            # also torch.profiler's op table
    .venv/bin/python benchmarks/profile_step.py --framework trl    # the same for TRL's GRPOTrainer
    .venv/bin/python benchmarks/profile_step.py --torch --max-completion-length 512   # at reasoning length

Writes the tables to --out (default benchmarks/results/profile_step_<framework>_<size>.txt) as well as to
stdout; BENCHMARKS.md's "top entries before and after" come from here. Same model, prompts, reward and
settings as vs_trl.py (one generation round of 2 prompts x 8 per step, 64 new tokens, beta 0.04, fp32, CPU).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import vs_trl  # noqa: E402  (model, prompts, reward and the two trainers' settings)


class Profilers:
    """cProfile, and optionally torch.profiler, switched on and off around the profiled steps."""

    def __init__(self, use_torch: bool):
        self.cprofile = cProfile.Profile()
        self.torch = None
        if use_torch:
            from torch.profiler import ProfilerActivity, profile
            self.torch = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
        self._torch_on = False

    def start(self):
        """cProfile covers exactly the profiled steps; torch.profiler runs from the first start to finish()
        (re-entering it would discard the earlier steps)."""
        if self.torch is not None and not self._torch_on:
            self.torch.__enter__()
            self._torch_on = True
        self.cprofile.enable()

    def stop(self):
        self.cprofile.disable()

    def finish(self):
        if self._torch_on:
            self.torch.__exit__(None, None, None)
            self._torch_on = False


def profile_aha(model_dir: str, steps: int, lr: float, threads: int, prof: Profilers) -> list[float]:
    from aha.train.grpo import GRPOTrainer
    with tempfile.TemporaryDirectory(prefix="profile_aha_") as out_dir:
        cfg = vs_trl.aha_config(out_dir, steps + 1, lr, vs_trl.SEED, threads)
        trainer = GRPOTrainer(model=model_dir, reward_funcs=[vs_trl.vowel_frac], args=cfg,
                              train_dataset=vs_trl.prompts())
        trainer.step()  # warm-up, not profiled
        times = []
        for _ in range(steps):
            prof.start()
            t0 = time.perf_counter()
            trainer.step()
            times.append(time.perf_counter() - t0)
            prof.stop()
    return times


def profile_trl(model_dir: str, steps: int, lr: float, threads: int, prof: Profilers) -> list[float]:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer
    times = []

    class Switch(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step >= 1:  # step 0 is the warm-up
                prof.start()
                self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step >= 2:  # global_step was already incremented
                times.append(time.perf_counter() - self.t0)
                prof.stop()
            if state.global_step == state.max_steps:
                prof.finish()  # before TRL's end-of-training work

    with tempfile.TemporaryDirectory(prefix="profile_trl_") as out_dir:
        cfg = vs_trl.trl_config(out_dir, steps + 1, lr, vs_trl.SEED)
        trainer = GRPOTrainer(model=model_dir, reward_funcs=[vs_trl.vowel_frac], args=cfg,
                              train_dataset=Dataset.from_list(vs_trl.prompts()),
                              processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[Switch()])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    return times


def report(prof: Profilers, times: list[float], title: str, top: int) -> str:
    buf = io.StringIO()
    buf.write(f"{title}\n")
    buf.write(f"profiled steps: {len(times)}; seconds per step under the profiler: "
              f"{' '.join(f'{t:.3f}' for t in times)}; load average {os.getloadavg()[0]:.2f}\n\n")
    for sort in ("cumulative", "tottime"):
        buf.write(f"=== cProfile: top {top} by {sort} time (all profiled steps together) ===\n")
        pstats.Stats(prof.cprofile, stream=buf).strip_dirs().sort_stats(sort).print_stats(top)
    if prof.torch is not None:
        buf.write(f"=== torch.profiler: top {top} ops by self CPU time ===\n")
        buf.write(prof.torch.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
        buf.write("\n")
    return buf.getvalue()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--framework", choices=("aha", "trl"), default="aha")
    p.add_argument("--size", choices=vs_trl.SIZES, default="4m")
    p.add_argument("--steps", type=int, default=3, help="profiled steps (after one unprofiled warm-up step)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--max-completion-length", type=int, default=vs_trl.MAX_COMPLETION_LENGTH,
                   help="generation budget per completion (vs_trl.py's option of the same name)")
    p.add_argument("--micro-batch-tokens", type=vs_trl.token_budget, default=vs_trl.MICRO_BATCH_TOKENS,
                   help="aha's max_tokens_per_micro_batch (vs_trl.py's option of the same name)")
    p.add_argument("--torch", action="store_true", help="also run torch.profiler and print its op table")
    p.add_argument("--out", help="text file for the tables (default benchmarks/results/profile_step_<fw>_<size>.txt)")
    args = p.parse_args(argv)
    vs_trl.MAX_COMPLETION_LENGTH = args.max_completion_length
    vs_trl.MICRO_BATCH_TOKENS = args.micro_batch_tokens
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else HERE / "results" / (
        f"profile_step_{args.framework}_{args.size}"
        + (f"_{args.max_completion_length}" if args.max_completion_length != 64 else "") + ".txt")
    out.parent.mkdir(parents=True, exist_ok=True)
    prof = Profilers(args.torch)
    with tempfile.TemporaryDirectory(prefix="profile_model_") as tmp:
        info = vs_trl.build_model(args.size, Path(tmp) / f"model-{args.size}")
        run = profile_aha if args.framework == "aha" else profile_trl
        times = run(info["path"], args.steps, args.lr, args.threads, prof)
        prof.finish()
    title = (f"{args.framework} GRPO step, {args.size} model ({info['params']:,} parameters), "
             f"{vs_trl.COMPLETIONS_PER_STEP} completions x {vs_trl.MAX_COMPLETION_LENGTH} tokens, "
             f"beta {vs_trl.BETA}, {args.threads} threads, torch {torch.__version__}")
    text = report(prof, times, title, args.top)
    print(text)
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
