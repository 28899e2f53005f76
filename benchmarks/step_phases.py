"""Where the time of aha's GRPO steps goes, step by step: generation, reference log-probs, forward/backward,
optimizer, Python's garbage collector and (on CUDA) the caching allocator's calls to the driver. Each phase is
timed between device synchronisations, so queued GPU work is charged to the phase that queued it.

    python benchmarks/step_phases.py --device cuda --size qwen2-0.5b --bf16 --max-completion-length 512
    python benchmarks/step_phases.py --size 4m --steps 4 --max-completion-length 64     # CPU

The settings are vs_trl.py's (2 prompts x 8 completions a step, beta 0.04, float32 weights, optional bf16
autocast). It runs --steps steps with Python's garbage collector on, then --steps-no-gc with it off (--gc-off-first:
the other way round), so what a collection landing inside a step costs shows as the difference.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import vs_trl  # noqa: E402  (the shared model, prompts, reward and config)

ALLOCATOR = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="4m", choices=vs_trl.SIZES)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast over float32 weights")
    ap.add_argument("--max-completion-length", type=int, default=vs_trl.MAX_COMPLETION_LENGTH)
    ap.add_argument("--steps", type=int, default=6, help="steps with the garbage collector on")
    ap.add_argument("--steps-no-gc", type=int, default=4, help="steps with it off")
    ap.add_argument("--gc-off-first", action="store_true", help="the steps without the collector first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the per-step records here")
    a = ap.parse_args(argv)
    vs_trl.DEVICE, vs_trl.BF16, vs_trl.MAX_COMPLETION_LENGTH = a.device, a.bf16, a.max_completion_length

    import torch
    import aha.train.learner as learner_mod
    from aha.train.grpo import GRPOTrainer
    torch.set_num_threads(a.threads)
    cuda = a.device.startswith("cuda")
    phases: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            vs_trl.sync()
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                vs_trl.sync()
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    gc_start: list[float] = []

    def on_gc(phase, info):
        if phase == "start":
            gc_start.append(time.perf_counter())
        elif gc_start:
            phases[f"gc{info['generation']}"] = phases.get(f"gc{info['generation']}", 0.0) \
                + time.perf_counter() - gc_start.pop()

    with tempfile.TemporaryDirectory(prefix="step_phases_") as tmp:
        model = vs_trl.build_model(a.size, Path(tmp) / "model")
        cfg = vs_trl.aha_config(str(Path(tmp) / "out"), a.steps + a.steps_no_gc, 1e-5, vs_trl.SEED, a.threads)
        trainer = GRPOTrainer(model=model["path"], reward_funcs=[vs_trl.vowel_frac], args=cfg,
                              train_dataset=vs_trl.prompts())
        learner = trainer.learner
        trainer.engine.generate = timed("generate", trainer.engine.generate)
        learner.frozen_logprobs = timed("reference", learner.frozen_logprobs)
        learner._micro_step = timed("forward_backward", learner._micro_step)
        learner_mod.optimizer_step = timed("optimizer", learner_mod.optimizer_step)
        gc.callbacks.append(on_gc)
        records = []
        parts = [[True] * a.steps, [False] * a.steps_no_gc]
        gc_on = sum(parts[::-1] if a.gc_off_first else parts, [])
        for i, on in enumerate(gc_on):
            if i == 0 or on != gc_on[i - 1]:  # each part starts from a collected heap
                gc.collect()
                gc.enable() if on else gc.disable()
            phases.clear()
            before = torch.cuda.memory_stats() if cuda else {}
            vs_trl.sync()
            t = time.perf_counter()
            m = trainer.step()
            vs_trl.sync()
            wall = time.perf_counter() - t
            trainer.step_count += 1
            after = torch.cuda.memory_stats() if cuda else {}
            rec = {"step": i, "gc": on, "step_s": wall, "train_s": m["perf/train_s"],
                   **{k: round(v, 4) for k, v in phases.items()},
                   **{k: after.get(k, 0) - before.get(k, 0) for k in ALLOCATOR if cuda}}
            records.append(rec)
            print(json.dumps(rec), flush=True)
        gc.enable()
    for on in (True, False):
        rs = [r for r in records[1:] if r["gc"] == on]  # the first step (warm-up) left out
        if rs:
            keys = [k for k in rs[0] if k not in ("step", "gc")]
            print(f"median, steps 2+ with gc {'on' if on else 'off'} ({len(rs)} steps): "
                  + ", ".join(f"{k} {statistics.median(r.get(k, 0) for r in rs):.3f}" for k in keys))
    if a.json:
        Path(a.json).write_text(json.dumps({"argv": sys.argv[1:], "device": a.device, "records": records}, indent=1))


if __name__ == "__main__":
    main()
