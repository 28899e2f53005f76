"""The held-out table of a finished (or running) `aha recipe` run: each evaluated stage's greedy success with its
Wilson 95% interval, by family where the task has families, its wall time, and its paired change (bootstrap 95%
interval over the same problems) against the stage it is compared with.

    .venv/bin/python benchmarks/recipe_table.py runs/smollm2_agent/filesystem --against cold_start
    .venv/bin/python benchmarks/recipe_table.py runs/smollm2_agent/calculator --against cold_start

A stage's results are its eval/ folder (a model stage, evaluated by the recipe's `eval` block) or its own folder
(an `eval` stage); every stage compared must have evaluated the same problems (checked by id). The paired change
of a stage is against `--against` (default: the previous evaluated stage), the change "outside its interval" when
the interval excludes 0. Seconds: the training steps' own (the sum of metrics.jsonl's perf/step_s, where the stage
trains), the stage's (loading, training, saving and the evaluation after it; a stage resumed after it had finished
counts only the resumed run) and its evaluation's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aha.stats import paired_gain, wilson  # noqa: E402


def stages(root: Path) -> list[dict]:
    """The run's evaluated stages in recipe order (summary.json's, or the finished stages' done.json by time)."""
    done = sorted(root.glob("*/done.json"), key=lambda p: p.stat().st_mtime)
    out = []
    for path in done:
        record = json.loads(path.read_text())
        folder = path.parent / "eval" if (path.parent / "eval" / "per_problem.jsonl").is_file() else path.parent
        if not (folder / "per_problem.jsonl").is_file():
            continue  # a stage that makes no model (rejection sampling)
        results = json.loads((folder / "results.json").read_text())["summary"]
        problems = [json.loads(x) for x in (folder / "per_problem.jsonl").read_text().splitlines()]
        metrics = path.parent / "metrics.jsonl"
        steps = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
        out.append({"stage": record["stage"], "seconds": record["seconds"], "summary": results,
                    "train_s": sum(m.get("perf/step_s", 0) for m in steps if "step" in m) if steps else None,
                    "ids": [p["id"] for p in problems], "correct": [float(p["greedy_correct"]) for p in problems]})
    return out


def table(rows: list[dict], against: str | None) -> str:
    families = sorted(k.split("/", 1)[1] for k in rows[0]["summary"] if k.startswith("accuracy/")
                      and not k.endswith("_ci95"))
    head = ["stage", "greedy success [95% CI]", "paired change, points [95% CI]", "calls / episode",
            *families, "steps s", "stage s", "eval s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_name = {r["stage"]: r for r in rows}
    for i, r in enumerate(rows):
        n, k = len(r["correct"]), int(sum(r["correct"]))
        lo, hi = wilson(k, n)
        ref = by_name.get(against) if against else (rows[i - 1] if i else None)
        change = ""
        if ref is not None and ref is not r:
            if ref["ids"] != r["ids"]:
                raise SystemExit(f"{r['stage']} and {ref['stage']} evaluated different problems")
            d, (dlo, dhi) = paired_gain(ref["correct"], r["correct"])
            change = f"{100 * d:+.1f} [{100 * dlo:+.1f}, {100 * dhi:+.1f}] vs {ref['stage']}"
        s = r["summary"]
        cells = [r["stage"], f"{k}/{n} = {100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]", change,
                 f"{s.get('tools/calls_per_episode', 0):.2f}",
                 *[f"{100 * s[f'accuracy/{f}']:.0f}" for f in families],
                 "" if r["train_s"] is None else f"{r['train_s']:.0f}", f"{r['seconds']:.0f}",
                 f"{s.get('seconds', 0):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="the recipe's output_dir")
    p.add_argument("--against", help="the stage every change is measured against (default: the previous one)")
    a = p.parse_args(argv)
    rows = stages(Path(a.run))
    if not rows:
        raise SystemExit(f"{a.run}: no evaluated stage yet")
    print(table(rows, a.against))


if __name__ == "__main__":
    main()
