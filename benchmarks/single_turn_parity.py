"""Single-turn runs whose metrics must not change when the step's internals do (same seed, same machine).

    .venv/bin/python benchmarks/single_turn_parity.py OUT.json            # run every case, write its metrics
    .venv/bin/python benchmarks/single_turn_parity.py NEW.json --compare OLD.json

Each case trains a tiny model built in code for 3 GRPO steps (seed 0, one thread) and keeps every metric but
the timings (`perf/*`, `dist/*busy`, `sync/seconds`) and the groups.jsonl lines. `--compare` prints each case as
"identical" or the keys that differ: the refactor of the step into typed token-level batches was
checked this way before and after.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from scripted import PARITY_CASES as CASES  # noqa: E402  (every loss type, estimator, split, stream)
from scripted import ScriptedEngine  # noqa: E402  (completions that depend only on the prompt: the same on every CPU)

TIMINGS = ("perf/", "dist/rollout_busy", "dist/reward_busy", "dist/learner_busy", "sync/seconds")


def digit_share(prompts, completions, **kw):
    """Graded reward: share of digits in the completion (spread inside every group from step 1)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def ids_mod3(prompts, completions, completion_ids, **kw):
    """Graded reward of scripted completions: their token ids' sum mod 3."""
    return [float(sum(ids) % 3) for ids in completion_ids]


def run_case(model_dir: str, out: Path, scripted: bool = False, **kw) -> dict:
    from aha.config import GRPOConfig
    from aha.train.grpo import GRPOTrainer
    prompts = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    base = dict(output_dir=str(out), max_steps=3, num_generations=4, per_device_train_batch_size=8,
                max_completion_length=12, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                log_completions_steps=1, log_groups_steps=1, seed=0)
    GRPOTrainer(model=model_dir, reward_funcs=[ids_mod3 if scripted else digit_share], args=GRPOConfig(**{**base, **kw}),
                train_dataset=prompts, engine_factory=ScriptedEngine if scripted else None).train()
    metrics = [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMINGS)}
               for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"metrics": metrics, "groups": (out / "groups.jsonl").read_text().splitlines(),
            "completions": (out / "completions.jsonl").read_text().splitlines()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--compare", help="an earlier OUT.json to compare with")
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--scripted", action="store_true", help="completions scripted, not sampled")
    a = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    from aha.models.tiny import make_tiny
    from aha.tasks import task_corpus
    from aha.tasks.arithmetic import make_addition
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_tiny(Path(tmp) / "model", task_corpus(make_addition("train", 300, seed=0))
                              + ["count the letters: aaa bbb"], size="tiny", seed=0))
        results = {name: run_case(model, Path(tmp) / name, a.scripted, **CASES[name]) for name in a.cases}
    Path(a.out).write_text(json.dumps(results, indent=1))
    if a.compare:
        old = json.loads(Path(a.compare).read_text())
        same = True
        for name, new in results.items():
            diff = [k for k in ("metrics", "groups", "completions") if new[k] != old.get(name, {}).get(k)]
            keys = sorted({k for n, o in zip(new["metrics"], old.get(name, {}).get("metrics", []))
                           for k in set(n) | set(o) if n.get(k) != o.get(k)})
            print(f"{name}: {'identical' if not diff else 'DIFFERS in ' + ', '.join(diff) + ' ' + str(keys)}")
            same &= not diff
        sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
