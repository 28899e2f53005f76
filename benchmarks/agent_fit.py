"""Can GRPO fit a few fixed list tasks, and does what it learns carry to tasks it never met?

    .venv/bin/python benchmarks/agent_fit.py runs/demo_agent/sft/model --seed 12 --steps 40 --out runs/fit12

The agent demo's GRPO (its settings, `aha demo agent`'s train_grpo) from a cold start, on `--tasks` fixed train tasks
of the two families that filter a listing (delete every .log, move every .txt), drawn again every step, where the
demo draws each GRPO task once. Prints the greedy success on those tasks every 10 steps (the run's eval/accuracy),
the reward of its episodes, and the cold start's and the fitted model's greedy held-out success by family on the
seed's 200 test tasks (the demo's). A diagnostic of whether GRPO's step can raise these tasks at all, and how far a
gain on seen tasks reaches unseen ones.
"""

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cold_start", help="a cold start's model directory (an agent demo run's sft/model)")
    ap.add_argument("--seed", type=int, default=0, help="the demo seed whose tasks to use")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from aha.config import DemoConfig
    from aha.demo import agent
    from aha.envs.filesystem import make_tasks
    out, skip = Path(a.out), agent.DEFAULTS["sft_examples"] + agent.DEV_TASKS  # the demo's GRPO pool
    pool = make_tasks("train", skip + 12 * a.tasks, a.seed)[skip:]
    rows = [r for r in pool if r["family"] in ("delete_logs", "move_txt")][:a.tasks]
    cfg = DemoConfig(variant="agent", seed=a.seed, threads=a.threads, grpo_steps=a.steps, prompts_per_step=a.tasks,
                     grpo_lr=a.lr, progress_bar=False, eval_every=10, held_out_samples=0, output_dir=str(out))
    fitted = agent.train_grpo(cfg, out, Path(a.cold_start), rows * a.steps, rows)
    metrics = [json.loads(line) for line in open(out / "grpo" / "metrics.jsonl")]
    print("greedy success on the fitted tasks by step:",
          ", ".join(f"{m['step']}: {m['eval/accuracy']:.0%}" for m in metrics if "eval/accuracy" in m))
    print("episode reward by step:", " ".join(f"{m['reward/FilesystemEnv/mean']:.2f}" for m in metrics
                                              if "reward/FilesystemEnv/mean" in m))
    test = make_tasks("test", 200, a.seed)
    for name, d in (("cold start", a.cold_start), ("fitted", fitted)):
        r = agent.held_out(Path(d), test, cfg)  # greedy only (held_out_samples=0), as the demo scores it
        s = r["greedy"]
        print(f"held-out greedy, {name}: {sum(s) / len(s):.1%}; " + ", ".join(
            f"{f} {agent.mean_of(s, r['family'], f):.0%}" for f in sorted(set(r["family"]))))


if __name__ == "__main__":
    main()
