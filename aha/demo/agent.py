"""`aha demo agent`: a tiny model learns to use a virtual filesystem's tools (aha.envs.filesystem).

build a model in code (its tokenizer fitted on the demonstrations) -> teach it to copy (random token strings
written twice, COPY_STEPS steps: a model pretrained on text can already copy what it reads, a model built in code
cannot, and every task needs it: names from the instruction, paths from a listing) -> cold-start SFT on
demonstrations (whole tool-calling conversations rendered by aha's tool template) until greedy success on dev
tasks reaches sft_target
-> GRPO from that model with TRL's contract (environment_factory=FilesystemEnv, whose get_reward is the reward:
the final tree equals the reference) -> held-out greedy task success before and after, on test tasks (split by
hash) that neither stage saw, with the paired gain's bootstrap interval.

The variant reads DemoConfig's shared fields; those left at their defaults (which suit the arithmetic demo) take
the values in AGENT_DEFAULTS instead.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..config import DemoConfig
from .default import StopAtAccuracy, finish, start

AGENT_DEFAULTS = {"sft_examples": 8000, "sft_steps": 1000, "sft_target": 0.3, "sft_check_every": 50, "sft_lr": 3e-3,
                  "sft_batch": 32, "grpo_steps": 60, "grpo_lr": 5e-4, "prompts_per_step": 16, "num_generations": 8,
                  "eval_problems": 200, "eval_every": 20, "eval_during": 100}
"""This demo's settings where DemoConfig's are left at their defaults."""
DEV_TASKS = 100
"""Train-split tasks held back from SFT and GRPO to decide when the cold start is done."""
MAX_TOKENS = 192
"""Episode budget (model and tool tokens after the prompt); the longest demonstration takes about 120."""
MAX_ROUNDS = 3
"""Rounds of tool calls an episode may make (every task is solved in at most 2)."""
VOCAB = 1024
"""The tiny tokenizer's vocabulary: merges enough to write the tool schemas in the prompt in few tokens."""
COPY_STEPS = 1000
"""Steps of the copying warm-up (64 strings of 4-24 random tokens a step, about 3 minutes on one thread). Without
it the cold start learns the calls' format but not to copy names: greedy dev success stayed at 0-4% over 300 SFT
steps; with it, 40% at step 150 (seed 0, small model)."""


def settings(cfg: DemoConfig) -> dict:
    """The value of each shared setting this demo reads: the one given, else AGENT_DEFAULTS'."""
    defaults = DemoConfig()
    return {k: v if getattr(cfg, k) == getattr(defaults, k) else getattr(cfg, k) for k, v in AGENT_DEFAULTS.items()}


def demonstration(chat, schemas: list, row: dict) -> dict:
    """A task's solution as an SFT row (ToolChat.demonstration): look first (list_dir, read_file), then act on what
    was seen, then a closing reply; the model's turns are trained, the tool results only read."""
    from ..data.toolcalls import ToolCall
    messages, calls = list(row["prompt"]), row["solution"]
    first = [c for c in calls if c[0] in ("list_dir", "read_file")]
    for turn in ([first, calls[len(first):]] if first else [calls]):
        messages.append({"role": "assistant", "content": "",
                         "tool_calls": [ToolCall(name, args).message() for name, args, _ in turn]})
        messages += [{"role": "tool", "name": name, "content": str(result)} for name, _, result in turn]
    messages.append({"role": "assistant", "content": "Done."})
    return chat.demonstration(messages, len(row["prompt"]), schemas)


def success(model, tokenizer, rows: list[dict]) -> list[float]:
    """Greedy held-out episodes: 1.0 for each task whose final tree equals the reference."""
    from ..envs import Agent
    from ..envs.filesystem import FilesystemEnv
    from ..rollout.turns import greedy_episodes
    _, envs = greedy_episodes(model, tokenizer, Agent(environment_factory=FilesystemEnv), rows, MAX_TOKENS, MAX_ROUNDS)
    return [e.get_reward() for e in envs]


def run(cfg: DemoConfig) -> dict:
    from ..envs.filesystem import make_tasks
    t0, s = time.perf_counter(), settings(cfg)
    out = start(cfg)
    train = make_tasks("train", s["sft_examples"] + DEV_TASKS + 4000, cfg.seed)
    test = make_tasks("test", s["eval_problems"], cfg.seed)
    base, demos = build_model(cfg, out, train[:s["sft_examples"]])
    sft_dir, sft_steps = cold_start(cfg, s, out, base, demos, train[s["sft_examples"]:s["sft_examples"] + DEV_TASKS])
    before = held_out(sft_dir, test)
    grpo_dir = train_grpo(cfg, s, out, sft_dir, train[s["sft_examples"] + DEV_TASKS:], test[:s["eval_during"]])
    after = held_out(grpo_dir, test)
    summary, table = report(before, after, cfg.seed)
    summary.update({"sft_steps": sft_steps, "grpo_steps": s["grpo_steps"], "eval_problems": len(test),
                    "seconds": round(time.perf_counter() - t0, 1), "model_dir": str(grpo_dir)})
    return finish(out, summary, table)


def build_model(cfg: DemoConfig, out: Path, rows: list[dict]) -> tuple[Path, list[dict]]:
    """A tiny model whose tokenizer is fitted on the demonstrations, and the demonstrations themselves."""
    from ..data.toolcalls import TOOL_TEMPLATE, ToolChat
    from ..envs import Agent
    from ..envs.filesystem import FilesystemEnv
    from ..models.tiny import make_tiny, train_tokenizer
    agent = Agent(environment_factory=FilesystemEnv)
    probe = train_tokenizer(["x"])
    probe.chat_template = TOOL_TEMPLATE
    demos = [demonstration(ToolChat(probe), agent.schemas[None], r) for r in rows]
    texts = [d["prompt"] + "".join(seg["text"] for seg in d["completion"]) for d in demos]
    base = make_tiny(out / "base", texts, size=cfg.size, seed=cfg.seed, vocab_size=VOCAB)
    teach_copying(base, COPY_STEPS, cfg.seed)
    return base, demos


def teach_copying(model_dir: Path, steps: int, seed: int, batch: int = 64, lr: float = 1e-3) -> list[float]:
    """Train the model in `model_dir` (in place) to repeat what it read: each sequence is a string of 4-24 tokens
    drawn uniformly from the vocabulary (special tokens aside) followed by the same string, with the loss on the
    repeat. The per-step losses."""
    import random

    import torch

    from ..models import load_model, load_tokenizer
    model, tok = load_model(str(model_dir)), load_tokenizer(str(model_dir))
    vocab = sorted(set(range(len(tok))) - set(tok.all_special_ids))
    rng, opt, losses = random.Random(f"copy-{seed}"), torch.optim.AdamW(model.parameters(), lr=lr), []
    device = next(model.parameters()).device
    model.train()
    for _ in range(steps):
        n = rng.randint(4, 24)
        head = torch.tensor([rng.choices(vocab, k=n) for _ in range(batch)], device=device)
        ids = torch.cat([head, head], 1)
        logits = model(input_ids=ids).logits[:, n - 1:-1]                             # predicts the repeat
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, n:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.save_pretrained(model_dir)
    return losses


def cold_start(cfg: DemoConfig, s: dict, out: Path, base: Path, demos: list[dict], dev: list[dict]) -> tuple[Path, int]:
    """SFT on the demonstrations until greedy success on the dev tasks reaches sft_target (checked every
    sft_check_every steps), or sft_steps."""
    from ..config import SFTConfig
    from ..train.sft import SFTTrainer
    args = SFTConfig(output_dir=str(out / "sft"), model=str(base), learning_rate=s["sft_lr"], max_steps=s["sft_steps"],
                     per_device_train_batch_size=s["sft_batch"], warmup_steps=10, seed=cfg.seed, max_length=2048,
                     progress_bar=cfg.progress_bar, report_to=["jsonl"], eval_steps=s["sft_check_every"],
                     overwrite_output_dir=True)
    evaluate = lambda model, tok: {"accuracy": sum(success(model, tok, dev)) / len(dev)}  # noqa: E731
    sft = SFTTrainer(args=args, train_dataset=demos, eval_fn=evaluate, callbacks=[StopAtAccuracy(s["sft_target"])])
    sft.train()
    return sft.save_model(), sft.step_count


def train_grpo(cfg: DemoConfig, s: dict, out: Path, sft_dir: Path, train: list[dict], during: list[dict]) -> Path:
    """GRPO with TRL's environment contract: FilesystemEnv's get_reward is the reward."""
    from .. import GRPOConfig, GRPOTrainer
    from ..envs.filesystem import FilesystemEnv
    G = s["num_generations"]
    args = GRPOConfig(output_dir=str(out / "grpo"), learning_rate=s["grpo_lr"], max_steps=s["grpo_steps"],
                      warmup_steps=5, lr_scheduler_type="cosine", num_generations=G,
                      per_device_train_batch_size=s["prompts_per_step"] * G, max_completion_length=MAX_TOKENS,
                      max_tool_calling_iterations=MAX_ROUNDS, temperature=cfg.grpo_temperature, seed=cfg.seed,
                      share_prompts=True, mask_truncated_completions=cfg.grpo_mask_truncated,
                      eval_steps=s["eval_every"], log_completions_steps=0, progress_bar=cfg.progress_bar,
                      overwrite_output_dir=True)
    evaluate = lambda model, tok: {"accuracy": sum(success(model, tok, during)) / len(during)}  # noqa: E731
    trainer = GRPOTrainer(model=str(sft_dir), args=args, train_dataset=[{k: r[k] for k in ("prompt", "fs", "id")}
                                                                         for r in train],
                          environment_factory=FilesystemEnv, eval_fn=evaluate)
    trainer.train()
    return trainer.save_model()


def held_out(model_dir: Path, test: list[dict]) -> dict:
    from ..models import load_model, load_tokenizer
    from ..stats import wilson
    correct = success(load_model(str(model_dir)), load_tokenizer(str(model_dir)), test)
    return {"accuracy": sum(correct) / len(correct), "accuracy_ci95": list(wilson(int(sum(correct)), len(correct))),
            "correct": correct}


def report(before: dict, after: dict, seed: int) -> tuple[dict, str]:
    from ..stats import is_gain, paired_gain
    gain, ci = paired_gain(before["correct"], after["correct"], seed=seed)
    summary = {"sft_success": before["accuracy"], "sft_success_ci95": before["accuracy_ci95"],
               "grpo_success": after["accuracy"], "grpo_success_ci95": after["accuracy_ci95"],
               "gain_points": 100 * gain, "gain_points_ci95": [100 * ci[0], 100 * ci[1]], "gain_significant": is_gain(ci)}
    row = lambda r: f"{r['accuracy']:.1%} [{r['accuracy_ci95'][0]:.1%}, {r['accuracy_ci95'][1]:.1%}]"  # noqa: E731
    table = (f"| model | held-out task success (virtual filesystem) [95% CI] |\n|---|---|\n"
             f"| SFT (cold start on demonstrations) | {row(before)} |\n| SFT + GRPO | {row(after)} |\n\n"
             f"GRPO gain: {100 * gain:+.1f} points, paired bootstrap 95% CI [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}] "
             f"over {len(before['correct'])} tasks{'' if is_gain(ci) else ' (inside the noise: not a gain)'}\n")
    return summary, table
