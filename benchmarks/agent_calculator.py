"""SmolLM2-135M-Instruct and the calculator: multiplications it gets wrong without tools, held-out accuracy of the
base model without tools, the base with the calculator's tools, and the model after GRPO with the tools.

    .venv/bin/python benchmarks/agent_calculator.py --out runs/agent_calculator            # defaults below
    .venv/bin/python benchmarks/agent_calculator.py --steps 0 --test 50                    # the base only

Every figure is greedy accuracy on the same held-out questions (aha.envs.calculator, split by hash) with its Wilson
95% interval; the differences are paired, with bootstrap 95% intervals. GRPO runs with TRL's `tools=` contract,
rewarded for the right final number (1.0) and, as shaping for a model that has never written a tool call, for an
episode in which a call ran (0.2).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def greedy_without_tools(model, tok, rows: list[dict], max_new_tokens: int) -> list[float]:
    """The base answering in one turn, no tools offered (the prompt asks for the number only), scored as `aha eval`
    scores a task."""
    from aha.envs.calculator import final_answer
    from aha.eval import verdicts
    from aha.rollout import SamplingParams
    from aha.tasks import Task
    plain = [{**r, "prompt": [{"role": "user", "content": r["id"] + " Give the number."}]} for r in rows]
    task = Task("calculator_no_tools", load=lambda *a, **k: plain, rewards=lambda: [final_answer],
                correct=lambda: final_answer)
    return [float(v is True) for v in verdicts(model, tok, task, plain, 1, SamplingParams(0.0, 1.0, 0, max_new_tokens))]


def greedy_with_tools(model, tok, rows: list[dict], max_new_tokens: int, rounds: int) -> list[float]:
    """Greedy episodes with the calculator's tools: `aha eval task=calculator`'s path."""
    import dataclasses

    from aha.eval import verdicts
    from aha.rollout import SamplingParams
    from aha.tasks import get_task
    task = dataclasses.replace(get_task("calculator"), max_tool_calling_iterations=rounds)
    return [float(v is True) for v in verdicts(model, tok, task, rows, 1, SamplingParams(0.0, 1.0, 0, max_new_tokens))]


def used_a_tool(completions, **kwargs) -> list[float]:
    """Shaping for a model that has never called a tool: 1.0 for an episode with a call that ran (weight 0.2)."""
    return [float(any(m["role"] == "tool" and not m["content"].startswith("{'error'") for m in c)) for c in completions]


def summary(name: str, correct: list[float]) -> dict:
    from aha.stats import wilson
    lo, hi = wilson(int(sum(correct)), len(correct))
    return {"arm": name, "accuracy": sum(correct) / len(correct), "ci95": [lo, hi], "n": len(correct)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/agent_calculator")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--test", type=int, default=100)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per GRPO step (B)")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--max-new", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    a = parser.parse_args()
    import torch

    from aha import GRPOConfig, GRPOTrainer
    from aha.envs.calculator import TOOLS, final_answer, make_tasks
    from aha.models import load_model, load_tokenizer
    from aha.models.zoo import KNOWN_MODELS, get_model
    from aha.stats import paired_gain
    torch.set_num_threads(a.threads)
    path = str(get_model(a.model)) if a.model in KNOWN_MODELS else a.model
    test, out, t0 = make_tasks("test", a.test, 0), Path(a.out), time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_model(path), load_tokenizer(path)
    arms = {"base, no tools": greedy_without_tools(model, tok, test, a.max_new),
            "base, tools": greedy_with_tools(model, tok, test, a.max_new, a.rounds)}
    if a.steps:
        args = GRPOConfig(output_dir=str(out / "grpo"), max_steps=a.steps, learning_rate=a.lr, num_generations=a.generations,
                          per_device_train_batch_size=a.prompts * a.generations, max_completion_length=a.max_new,
                          max_tool_calling_iterations=a.rounds, share_prompts=True, log_completions_steps=1,
                          reward_weights=[1.0, 0.2],
                          overwrite_output_dir=True, report_to=["jsonl"], seed=0)
        trainer = GRPOTrainer(model=path, tools=TOOLS, reward_funcs=[final_answer, used_a_tool], args=args,
                              train_dataset=make_tasks("train", a.steps * a.prompts, 0))
        trainer.train()
        arms["GRPO, tools"] = greedy_with_tools(trainer.model, trainer.tokenizer, test, a.max_new, a.rounds)
    result = {"model": a.model, "args": vars(a), "arms": [summary(k, v) for k, v in arms.items()],
              "seconds": round(time.perf_counter() - t0, 1)}
    names = list(arms)
    result["paired"] = [{"a": x, "b": y, "gain_points": 100 * g, "ci95": [100 * lo, 100 * hi]}
                        for x, y in zip(names, names[1:]) for g, (lo, hi) in [paired_gain(arms[x], arms[y])]]
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
