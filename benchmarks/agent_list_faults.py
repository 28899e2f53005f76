"""What the agent demo's list tasks fail on: each failed greedy episode's first fault, counted, for two models.

    .venv/bin/python benchmarks/agent_list_faults.py runs/demo_agent/sft/model runs/demo_agent/grpo/model --seed 0

The held-out test tasks of the two families that filter a listing (delete every .log in "tmp", move every .txt in
"notes"), greedy, with the demo's budget. A failed episode's fault is the first of: a call the chat could not parse
("malformed call": a <tool_call> that is not JSON, or has no closing tag), a call whose arguments the schema refuses
(an unexpected or a missing name), a path acted
on that the listing does not hold ("a path twice" when it was acted on before), a file of another extension, a file
of the family's extension left out; else "other" (its finish: stop or length), such as a wrong destination.
"""

import argparse
import collections

import torch

FAMILIES = {"move_txt": ".txt", "delete_logs": ".log"}


def fault(task: dict, episode: dict) -> str | None:
    """The first fault of a greedy episode, or None when it succeeded."""
    if episode["greedy_correct"]:
        return None
    results = [str(m.get("content")) for m in episode["messages"] if m.get("role") == "tool"]
    for r in results:
        if "malformed" in r or "no closing" in r:
            return "malformed call"
        if " takes (" in r:  # the schema refused the call's arguments
            return "arguments wrong (unexpected or missing)"
    calls = [c["function"] for m in episode["messages"] if m.get("role") == "assistant"
             for c in m.get("tool_calls") or []]
    paths = [c["arguments"].get("src") or c["arguments"].get("path") for c in calls
             if c["name"] in ("move", "delete") and isinstance(c["arguments"], dict)]
    files, ext = set(task["fs"]["start"]["files"]), FAMILIES[task["family"]]
    if any(p not in files for p in paths):
        return "a path twice" if len(set(paths)) < len(paths) else "a path not in the listing"
    if any(not str(p).endswith(ext) for p in paths):
        return "a file of another extension"
    if len(paths) < sum(f.endswith(ext) for f in files):
        return "a file left out"
    return f"other ({episode['finish']})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+", help="model directories (a cold start, a GRPO model, ...)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", type=int, default=200, help="held-out tasks, all families (eval_problems)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from aha.demo.agent import MAX_TOKENS
    from aha.envs.filesystem import make_tasks
    from aha.eval import evaluate
    from aha.models import load_model, load_tokenizer
    from aha.tasks import get_task
    test = [t for t in make_tasks("test", a.tasks, a.seed) if t["family"] in FAMILIES]
    for d in a.models:
        _, records = evaluate(load_model(d), load_tokenizer(d), get_task("filesystem"), test, max_new_tokens=MAX_TOKENS)
        faults = collections.Counter(fault(t, e) or "success" for t, e in zip(test, records))
        print(d, f"{len(test)} tasks:", ", ".join(f"{k} {n}" for k, n in faults.most_common()))


if __name__ == "__main__":
    main()
