"""The agent demo's greedy success by how many items a task names: a create task's lines of text, a delete-every-.log
or move-every-.txt task's files to act on. Cold start against GRPO, for each run directory given.

    .venv/bin/python benchmarks/agent_items.py runs/agent_ablation/s1_dynamic_sampling runs/agent_ablation/s2_balanced

Each RUN is an `aha demo agent` output directory (RUN/sft/model, and the GRPO model its summary.json names).
150 held-out tasks of each of the three families (test split, --seed), one greedy episode each, scored as the demo
scores them (the final tree equals the reference).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FAMILIES = ("create", "delete_logs", "move_txt")


def items(row: dict) -> int:
    """Lines of a create task's text; files a delete/move task acts on."""
    if row["family"] == "create":
        return row["prompt"][-1]["content"].count(";") + 1
    return sum(call[0] in ("delete", "move") for call in row["solution"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--tasks", type=int, default=150, help="held-out tasks per family")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import torch
    from aha.demo.agent import success
    from aha.envs.filesystem import make_tasks
    from aha.models import load_model, load_tokenizer
    torch.set_num_threads(a.threads)
    rows = {f: make_tasks("test", a.tasks, a.seed, families=(f,)) for f in FAMILIES}
    print("| run | model | " + " | ".join(f"{f}: success by items (tasks)" for f in FAMILIES) + " |")
    print("|---|---|" + "---|" * len(FAMILIES))
    for run in map(Path, a.runs):
        grpo = json.loads((run / "summary.json").read_text())["model_dir"]
        for name, model_dir in (("cold start", run / "sft" / "model"), ("GRPO", Path(grpo))):
            tok, model = load_tokenizer(str(model_dir)), load_model(str(model_dir)).eval()
            cells = []
            for f, rs in rows.items():
                by = collections.defaultdict(list)
                for row, ok in zip(rs, success(model, tok, rs)):
                    by[items(row)].append(ok)
                cells.append(", ".join(f"{k}: {sum(v) / len(v):.0%} ({len(v)})" for k, v in sorted(by.items())))
            print(f"| {run.name} | {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
