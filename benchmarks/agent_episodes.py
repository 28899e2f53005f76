"""Greedy held-out episodes of an `aha demo agent` run's cold start and GRPO model, side by side.

    .venv/bin/python benchmarks/agent_episodes.py runs/demo_agent --seed 0 [--show 6]

Runs both models (RUN/sft/model, RUN/grpo/model) on the demo's held-out test tasks of that seed
(--tasks, 200), greedy, with the demo's budget, and prints for each: success overall and by task family,
calls per episode, how episodes ended
(stop: the model ended its turn; length: the token budget), and each call outcome's count; then how many tasks
GRPO lost and won, by family, and the first --show lost tasks' conversations.
"""

import argparse
import collections
import json

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", type=int, default=200, help="held-out tasks, as the demo's eval_problems")
    ap.add_argument("--show", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from aha.demo.agent import MAX_TOKENS, mean_of
    from aha.envs.filesystem import make_tasks
    from aha.eval import evaluate
    from aha.models import load_model, load_tokenizer
    from aha.tasks import get_task
    test, res = make_tasks("test", a.tasks, a.seed), {}
    for name in ("sft", "grpo"):
        d = f"{a.run}/{name}/model"
        _, records = evaluate(load_model(d), load_tokenizer(d), get_task("filesystem"), test, max_new_tokens=MAX_TOKENS)
        res[name] = (records, [float(r["greedy_correct"]) for r in records])  # aha eval's greedy episodes
        eps, won = res[name]
        families = [t["family"] for t in test]
        outcomes = sum((collections.Counter(e["outcomes"]) for e in eps), collections.Counter())
        by_family = {f: round(mean_of(won, families, f), 2) for f in sorted(set(families))}
        print(name, "success", sum(won) / len(won), by_family,
              "calls", round(sum(e["calls"] for e in eps) / len(eps), 2),
              "finish", dict(collections.Counter(e["finish"] for e in eps)), "outcomes", dict(outcomes))
    lost = [i for i in range(len(test)) if res["sft"][1][i] == 1 and res["grpo"][1][i] == 0]
    gained = [i for i in range(len(test)) if res["sft"][1][i] == 0 and res["grpo"][1][i] == 1]
    print("lost", len(lost), dict(collections.Counter(test[i]["family"] for i in lost)),
          "won", len(gained), dict(collections.Counter(test[i]["family"] for i in gained)))
    for i in lost[:a.show]:
        print("\nTASK", test[i]["fs"]["instruction"], test[i]["fs"]["start"]["files"])
        for name in ("sft", "grpo"):
            e = res[name][0][i]
            turns = [(m.get("role"), (m.get("content") or "")[:60],
                      [c["function"]["name"] + json.dumps(c["function"]["arguments"])[:70]
                       for c in m.get("tool_calls", [])]) for m in e["messages"]]
            print(" ", name, e["finish"], turns)


if __name__ == "__main__":
    main()
