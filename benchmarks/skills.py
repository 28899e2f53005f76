"""What training cost or gave: greedy held-out accuracy of a base model and trained models on several tasks.

    .venv/bin/python benchmarks/skills.py smollm2-135m-instruct runs/grpo_smollm2_mix/model
    .venv/bin/python benchmarks/skills.py BASE TRAINED --tasks chat_add chat_sub chat_mul --dtype bfloat16

The first model is the reference. For every task and model: accuracy with its Wilson 95% interval, and for
each later model the change on the same problems with its paired bootstrap 95% interval, called "gain" or
"fell" only when that interval excludes 0 ("=" otherwise). Evaluated greedy, in `--dtype` (float32 by default,
whatever dtype trained the model), on each task's held-out split. Writes the table and a JSON next to it
when --out is given; a model's results already in that JSON (same model name, task and dtype) are reused, so
adding a trained model does not re-evaluate the base (after retraining a model in place, use a new --out).

With --spread the trained models are runs of one setting that differ only in the seed, and a second table gives,
per task, min / median / max of their changes, the mean change with its Student t 95% interval over seeds, and
how many runs gained, stayed within their interval or fell:

    .venv/bin/python benchmarks/skills.py smollm2-135m-instruct runs/s0/model runs/s1/model runs/s2/model --spread
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

TASKS = ["chat_add", "chat_sub", "chat_mul", "chat_max", "chat_next", "chat_steps"]


def accuracy_table(models: list[str], tasks: list[str], dtype: str = "float32", batch_size: int = 256,
                   known: dict | None = None) -> tuple[str, dict]:
    from aha.eval import evaluate
    from aha.models import load_model, load_tokenizer
    from aha.stats import paired_gain, verdict
    from aha.tasks import get_task
    known, results = known or {}, {}
    for m in models:
        model = tok = None
        for name in tasks:
            if known.get(name, {}).get(m, {}).get("dtype") == dtype:
                results.setdefault(name, {})[m] = known[name][m]
                continue
            if model is None:
                model, tok = load_model(m, dtype), load_tokenizer(m)
            task = get_task(name)
            t0 = time.perf_counter()
            summary, records = evaluate(model, tok, task, task.load("test"), batch_size=batch_size)
            results.setdefault(name, {})[m] = {"dtype": dtype, "accuracy": summary["accuracy"],
                                               "ci95": summary["accuracy_ci95"],
                                               "correct": [float(r["greedy_correct"]) for r in records],
                                               "seconds": round(time.perf_counter() - t0, 1)}
    head = "| task | n | " + " | ".join(models) + " |\n|---|---|" + "---|" * len(models) + "\n"
    lines = []
    for name, per in results.items():
        ref = per[models[0]]
        cells = [f"{ref['accuracy']:.1%} [{ref['ci95'][0]:.1%}, {ref['ci95'][1]:.1%}]"]
        for m in models[1:]:
            r = per[m]
            change, ci = paired_gain(ref["correct"], r["correct"])
            r["change"], r["change_ci95"] = change, list(ci)
            r["verdict"] = verdict(ci)
            cells.append(f"{r['accuracy']:.1%} [{r['ci95'][0]:.1%}, {r['ci95'][1]:.1%}]; "
                         f"{100 * change:+.1f} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}] {r['verdict']}")
        lines.append(f"| {name} | {len(ref['correct'])} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n", results


def spread_table(models: list[str], results: dict) -> str:
    """Per task, the trained models' changes against the first model, taken as seeds of one setting."""
    from aha.stats import seed_interval
    lines = ["| task | base | change min / median / max, points | mean change [95% CI over seeds] "
             "| runs gain / = / fell |", "|---|---|---|---|---|"]
    for name, per in results.items():
        runs = [per[m] for m in models[1:]]
        changes = [100 * r["change"] for r in runs]
        lo, hi = seed_interval(changes)
        verdicts = [r["verdict"] for r in runs]
        lines.append(f"| {name} | {per[models[0]]['accuracy']:.1%} | {min(changes):+.1f} / "
                     f"{statistics.median(changes):+.1f} / {max(changes):+.1f} | {statistics.mean(changes):+.1f} "
                     f"[{lo:+.1f}, {hi:+.1f}] | {verdicts.count('gain')} / {verdicts.count('=')} / "
                     f"{verdicts.count('fell')} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+", help="the reference (base) first, then trained models")
    ap.add_argument("--tasks", nargs="+", default=TASKS)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write skills.md and skills.json into this directory")
    ap.add_argument("--spread", action="store_true", help="the trained models are seeds of one setting: add a "
                    "table of the spread of their changes (needs two or more)")
    a = ap.parse_args()
    if a.spread and len(a.models) < 3:
        ap.error("--spread needs the base and at least two trained models")
    torch.set_num_threads(a.threads)
    path = Path(a.out, "skills.json") if a.out else None
    known = json.loads(path.read_text()) if path and path.is_file() else {}
    table, results = accuracy_table(a.models, a.tasks, a.dtype, known=known)
    if a.spread:
        table += "\n" + spread_table(a.models, results)
    print(table)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "skills.md").write_text(table)
        for name, per in results.items():  # keep the models and tasks of earlier calls too
            known.setdefault(name, {}).update(per)
        (out / "skills.json").write_text(json.dumps(known, indent=1))


if __name__ == "__main__":
    main()
