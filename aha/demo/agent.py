"""`aha demo agent`: a tiny model learns to use a virtual filesystem's tools (aha.envs.filesystem).

build a model in code (its tokenizer fitted on the demonstrations) -> teach it to copy (COPY_STEPS steps, more until
its repeat loss reaches COPY_TARGET, on random tokens: strings written twice, and lists written back item by item: a
model pretrained on text can already copy what it reads, a model built in code cannot, and every task needs it:
names from the instruction, each path of a listing in turn) -> cold-start SFT on
demonstrations (whole tool-calling conversations rendered by aha's tool template) until greedy success on dev
tasks reaches sft_target
-> GRPO from that model with TRL's contract (environment_factory=FilesystemEnv, whose get_reward is the reward:
the final tree equals the reference) -> held-out greedy task success before and after, on test tasks (split by
hash) that neither stage saw, with the paired gain's bootstrap interval; and success over episodes
sampled at the GRPO temperature (the policy GRPO trains; held_out_samples episodes a task), before and after,
with its paired interval. `sft_model=RUN/sft/model` starts GRPO from an earlier run's cold start (the same seed's
is the same model on one machine), so arms that differ only in GRPO share it and skip its minutes.

The variant reads DemoConfig's shared fields: those the command line leaves unset take this variant's DEFAULTS
(below); a value given is kept, whatever it is. `grpo_config` lays any GRPOConfig setting over the demo's own
(`grpo_config='{balance_by: family}'`).
"""

from __future__ import annotations

import time
from pathlib import Path

from ..config import DemoConfig
from .default import StopAtAccuracy, finish, given_model, start

DEFAULTS = {"sft_target": 1.0, "threads": 2, "sft_examples": 8000, "sft_steps": 100, "sft_check_every": 100,
            "grpo_steps": 60, "prompts_per_step": 16}
"""This variant's values of the DemoConfig settings the command line leaves unset. The cold start is 100 SFT steps
whatever its dev success (reported at step 100): with the list warm-up, stopping at the first check past 30% dev
success stopped at step 50 on every seed, with cold starts of 39.5-59.5% held-out success, while 100 steps at a
decaying rate gave 69-80% dev success on seeds 0-3 (BENCHMARKS.md, "The agent demo's cold start learns lists").
Two threads: its steps of 128 episodes ran 1.46x faster on two, 6.8 s against 9.9 s (run its seeds side by side
with threads=1)."""
DEV_TASKS = 100
"""Train-split tasks held back from SFT and GRPO to decide when the cold start is done."""
GRPO_TASKS = 4000
"""Train-split tasks GRPO draws its prompts from (60 steps of 16 draw 960 of them, none twice)."""
MAX_TOKENS = 256
"""Episode budget (model and tool tokens after the prompt): a quarter above the longest demonstration, 200 tokens
(move every .txt with five files listed, seed 0, the demo's own tokenizer; tests/test_demo_agent.py checks it)."""
BUDGET_MARGIN = 1.25
"""How far above the longest demonstration the episode budget must be (room for a turn the model words longer)."""
VOCAB = 1024
"""The tiny tokenizer's vocabulary: merges enough to write the tool schemas in the prompt in few tokens."""
COPY_STEPS = 1000
"""Least steps of the copying warm-up (64 rows a step, repeats and lists in turn; 3-5 minutes on one thread).
Without it the cold start learns the calls' format but not to copy names: greedy dev success stayed at 0-4% over
300 SFT steps; with repeats only, 40% at step 150 (seed 0, small model), 4-9% at step 50 and 47-53% at 100 (seeds
1, 2); with lists as well, 46-60% at step 50 (seeds 0-3), and held-out create tasks of three lines 55-79% where
they were 3-7% (BENCHMARKS.md, "The agent demo's cold start learns lists")."""
COPY_TARGET = 1.0
"""The warm-up goes on past COPY_STEPS until its repeat loss (the mean over its last 50 repeat steps, nats a token)
is at most this. Copying is learned in a sudden drop whose step varies by seed: seed 0's repeat loss fell from 4.5
at step 500 to 0.7 at 900, seed 6's from 4.0 at 800 to 0.93 at 1100, so a fixed 1000 steps stopped seed 6 at 3.17,
before its drop, and its cold start reached 26-29% held-out success where the other seeds' reached 63.5-76%."""
COPY_MAX_STEPS = 3000
"""Most steps of the copying warm-up; a warm-up that ends here above COPY_TARGET is reported as not learned (printed,
and `copying_learned: false` in the summary)."""


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


def success(model, tokenizer, rows: list[dict], temperature: float = 0.0, n: int = 1, seed: int = 0) -> list[float]:
    """Each task's success: the share of its n episodes (one greedy one by default) whose final tree equals the
    reference, measured as `aha eval task=filesystem` measures it (aha.eval.verdicts)."""
    from ..eval import verdicts
    from ..rollout import SamplingParams
    from ..tasks import get_task
    task = get_task("filesystem")
    right = verdicts(model, tokenizer, task, rows, n, SamplingParams(temperature, 1.0, 0, MAX_TOKENS), seed=seed)
    return [sum(v is True for v in right[i * n:(i + 1) * n]) / n for i in range(len(rows))]


def run(cfg: DemoConfig) -> dict:
    t0, out = time.perf_counter(), start(cfg)
    demos_rows, dev, grpo_rows, test = tasks(cfg)
    warm = {}
    if cfg.sft_model:
        sft_dir, sft_steps = given_model(cfg.sft_model, "sft_model"), 0
    else:
        base, demos, warm = build_model(cfg, out, demos_rows)
        sft_dir, sft_steps = cold_start(cfg, out, base, demos, dev)
    before = held_out(sft_dir, test, cfg)
    grpo_dir = train_grpo(cfg, out, sft_dir, grpo_rows, test[:cfg.eval_during])
    after = held_out(grpo_dir, test, cfg)
    summary, table = report(before, after, cfg.seed, cfg.grpo_temperature, cfg.held_out_samples)
    summary.update({**warm, "sft_steps": sft_steps, "sft_model": str(sft_dir), "grpo_steps": cfg.grpo_steps,
                    "grpo_beta": cfg.grpo_beta, "eval_problems": len(test),
                    "seconds": round(time.perf_counter() - t0, 1), "model_dir": str(grpo_dir)})
    return finish(out, summary, table)


def tasks(cfg: DemoConfig) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """The seed's tasks: the SFT demonstrations', the dev tasks that end the cold start, GRPO's (train split, none
    of them shared with SFT or dev; only grpo_families' where it names some), and the held-out test tasks; each
    split's tasks by family are printed."""
    from ..envs.filesystem import FAMILIES, make_tasks
    unknown = set(cfg.grpo_families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"grpo_families: unknown {sorted(unknown)}; the families are {', '.join(FAMILIES)}")
    n = cfg.sft_examples
    train = make_tasks("train", n + DEV_TASKS + GRPO_TASKS, cfg.seed)
    splits = {"sft": train[:n], "dev": train[n:n + DEV_TASKS],
              "grpo": [r for r in train[n + DEV_TASKS:] if r["family"] in (cfg.grpo_families or FAMILIES)],
              "test": make_tasks("test", cfg.eval_problems, cfg.seed)}
    for name, rows in splits.items():
        print(f"{name} tasks by family: " + ", ".join(f"{f} {k}" for f, k in family_counts(rows).items()))
    return splits["sft"], splits["dev"], splits["grpo"], splits["test"]


def family_counts(rows: list[dict]) -> dict[str, int]:
    """Tasks of each family, in family order."""
    from collections import Counter
    from ..envs.filesystem import FAMILIES
    counts = Counter(r["family"] for r in rows)
    return {f: counts[f] for f in FAMILIES if counts[f]}


def build_model(cfg: DemoConfig, out: Path, rows: list[dict]) -> tuple[Path, list[dict], dict]:
    """A tiny model whose tokenizer is fitted on the demonstrations, the demonstrations themselves, and what the
    copying warm-up reached."""
    from ..models.tiny import make_tiny
    demos = demonstrations(rows)
    base = make_tiny(out / "base", demo_texts(demos), size=cfg.size, seed=cfg.seed, vocab_size=VOCAB)
    losses = teach_copying(base, COPY_STEPS, cfg.seed, target=COPY_TARGET, most=COPY_MAX_STEPS)
    warm = {"copying_steps": len(losses), "copying_repeat_loss": round(warm_up_loss(losses), 3),
            "copying_list_loss": round(warm_up_loss(losses, kind=1), 3),
            "copying_learned": warm_up_loss(losses) <= COPY_TARGET}
    print(f"copying warm-up: {len(losses)} steps; mean loss over each kind's last 50, repeats "
          f"{warm['copying_repeat_loss']:.3f}, lists {warm['copying_list_loss']:.3f}")
    if not warm["copying_learned"]:
        print(f"WARNING: the copying warm-up did not learn to copy in {len(losses)} steps (repeat loss "
              f"{warm['copying_repeat_loss']:.3f} > {COPY_TARGET}): expect a weak cold start on this seed")
    return base, demos, warm


def demonstrations(rows: list[dict]) -> list[dict]:
    """Each task's demonstration (`demonstration`), rendered with aha's tool template."""
    from ..data.toolcalls import TOOL_TEMPLATE, ToolChat
    from ..envs import Agent
    from ..envs.filesystem import FilesystemEnv
    from ..models.tiny import train_tokenizer
    schemas = Agent(environment_factory=FilesystemEnv).schemas[None]
    probe = train_tokenizer(["x"])
    probe.chat_template = TOOL_TEMPLATE
    chat = ToolChat(probe)
    return [demonstration(chat, schemas, r) for r in rows]


def demo_texts(demos: list[dict]) -> list[str]:
    """The demonstrations' whole texts: what the model's tokenizer is fitted on."""
    return [d["prompt"] + "".join(seg["text"] for seg in d["completion"]) for d in demos]


def episode_tokens(tokenizer, demo: dict) -> int:
    """What a demonstration takes of the episode budget: the tokens after its prompt (each turn and each run of
    tool results tokenized on its own, as the turn loop splices them) and the closing end-of-turn token."""
    return sum(len(tokenizer(seg["text"], add_special_tokens=False)["input_ids"]) for seg in demo["completion"]) + 1


def teach_copying(model_dir: Path, steps: int, seed: int, batch: int = 64, lr: float = 1e-3,
                  target: float | None = None, most: int | None = None) -> list[float]:
    """Train the model in `model_dir` (in place) to copy what it read, on random tokens drawn uniformly from the
    vocabulary (special tokens aside), so that only copying predicts them; steps alternate two kinds (`copy_rows`,
    `list_rows`): a string repeated right after itself, and a list written back item by item, each item wrapped
    alike (as a tool call wraps each path of a listing), only the items of a chosen tag, then an end marker.
    `steps` steps, then on while the repeat loss (`warm_up_loss`) is above `target`, up to `most` steps in all.
    The per-step losses (on what copying predicts)."""
    import random

    import torch

    from ..models import load_model, load_tokenizer
    model, tok = load_model(str(model_dir)), load_tokenizer(str(model_dir))
    vocab = sorted(set(range(len(tok))) - set(tok.all_special_ids))
    rng, opt, losses = random.Random(f"copy-{seed}"), torch.optim.AdamW(model.parameters(), lr=lr), []
    device = next(model.parameters()).device
    model.train()
    most = most or steps if target is not None else steps
    while len(losses) < steps or (len(losses) < most and warm_up_loss(losses) > target):
        rows = [(list_rows if len(losses) % 2 else copy_rows)(rng, vocab) for _ in range(batch)]
        width = max(len(ids) for ids, _ in rows)
        ids = torch.tensor([i + [i[0]] * (width - len(i)) for i, _ in rows], device=device)
        target_ids = torch.tensor([[t if m else -100 for t, m in zip(i, ms)] + [-100] * (width - len(i))
                                   for i, ms in rows], device=device)
        logits = model(input_ids=ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target_ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.save_pretrained(model_dir)
    return losses


def warm_up_loss(losses: list[float], kind: int = 0, window: int = 50) -> float:
    """The mean loss over the last `window` steps of one kind of the warm-up (0: repeats, on even steps; 1: lists)."""
    last = losses[kind::2][-window:]
    return sum(last) / len(last) if last else float("inf")


def copy_rows(rng, vocab: list[int]) -> tuple[list[int], list[bool]]:
    """A string of 4-24 tokens followed by itself; the loss on the repeat."""
    head = rng.choices(vocab, k=rng.randint(4, 24))
    return head + head, [False] * len(head) + [True] * len(head)


def list_rows(rng, vocab: list[int]) -> tuple[list[int], list[bool]]:
    """A header (a wrapper's opening and closing, a chosen tag, an end marker), random filler, a list of 1-5 items
    (1-6 tokens and a tag each, one a line), filler again; then `written_list`. Every written token follows from
    what was read (the loss is on them, not on the filler); the items all bear the chosen tag a third of the time,
    each at random otherwise."""
    opening, closing = rng.choices(vocab, k=rng.randint(2, 6)), rng.choices(vocab, k=rng.randint(1, 4))
    chosen, other, line, end = rng.sample(vocab, 4)
    every = rng.random() < 1 / 3
    items = [(rng.choices(vocab, k=rng.randint(1, 6)), chosen if every or rng.random() < 0.5 else other)
             for _ in range(rng.randint(1, 5))]
    read = opening + closing + [chosen, end] + rng.choices(vocab, k=rng.randint(0, 20))
    for item, tag in items:
        read += item + [tag, line]
    read += rng.choices(vocab, k=rng.randint(0, 20))
    written = written_list(opening, closing, chosen, end, items)
    return read + written, [False] * len(read) + [True] * len(written)


def written_list(opening: list[int], closing: list[int], chosen: int, end: int, items: list) -> list[int]:
    """Each (item, tag) of the chosen tag, in order, between opening and closing; then the end marker."""
    return [t for item, tag in items if tag == chosen for t in opening + item + closing] + [end]


def cold_start(cfg: DemoConfig, out: Path, base: Path, demos: list[dict], dev: list[dict]) -> tuple[Path, int]:
    """SFT on the demonstrations until greedy success on the dev tasks reaches sft_target (checked every
    sft_check_every steps), or sft_steps."""
    from ..config import SFTConfig
    from ..train.sft import SFTTrainer
    args = SFTConfig(output_dir=str(out / "sft"), model=str(base), learning_rate=cfg.sft_lr, max_steps=cfg.sft_steps,
                     per_device_train_batch_size=cfg.sft_batch, warmup_steps=10, lr_scheduler_type="linear",
                     seed=cfg.seed, max_length=2048, progress_bar=cfg.progress_bar, report_to=["jsonl"],
                     eval_steps=cfg.sft_check_every, overwrite_output_dir=True)
    evaluate = lambda model, tok: {"accuracy": sum(success(model, tok, dev)) / len(dev)}  # noqa: E731
    sft = SFTTrainer(args=args, train_dataset=demos, eval_fn=evaluate, callbacks=[StopAtAccuracy(cfg.sft_target)])
    sft.train()
    return sft.save_model(), sft.step_count


def grpo_args(cfg: DemoConfig, out: Path):
    """The GRPOConfig of the demo's GRPO stage: its own settings, then `grpo_config`'s over them."""
    from .. import GRPOConfig
    from ..tasks import get_task
    G, task = cfg.num_generations, get_task("filesystem")
    own = dict(output_dir=str(out / "grpo"), learning_rate=cfg.grpo_lr, max_steps=cfg.grpo_steps, warmup_steps=5,
               lr_scheduler_type="cosine", num_generations=G, per_device_train_batch_size=cfg.prompts_per_step * G,
               max_completion_length=MAX_TOKENS, max_tool_calling_iterations=task.max_tool_calling_iterations,
               temperature=cfg.grpo_temperature, seed=cfg.seed, share_prompts=True,
               mask_truncated_completions=cfg.grpo_mask_truncated, beta=cfg.grpo_beta, eval_steps=cfg.eval_every,
               log_completions_steps=0, progress_bar=cfg.progress_bar, overwrite_output_dir=True)
    return GRPOConfig(**{**own, **cfg.grpo_config})


def train_grpo(cfg: DemoConfig, out: Path, sft_dir: Path, train: list[dict], during: list[dict]) -> Path:
    """GRPO with TRL's environment contract: FilesystemEnv's get_reward is the reward, beside any reward_funcs
    grpo_config names (aha.rewards: episode_ended, tool_errors, tool_efficiency, cut_as_failure, progress, ...)."""
    from .. import GRPOTrainer
    from ..envs.filesystem import FilesystemEnv
    args = grpo_args(cfg, out)
    evaluate = lambda model, tok: {"accuracy": sum(success(model, tok, during)) / len(during)}  # noqa: E731
    trainer = GRPOTrainer(model=str(sft_dir), reward_funcs=list(args.reward_funcs) or None, args=args,
                          train_dataset=[{k: r[k] for k in ("prompt", "fs", "id", "family")} for r in train],
                          environment_factory=FilesystemEnv, eval_fn=evaluate)
    trainer.train()
    return trainer.save_model()


def held_out(model_dir: Path, test: list[dict], cfg: DemoConfig) -> dict:
    """Each test task's greedy success, and its success over held_out_samples episodes at the GRPO temperature."""
    from ..models import load_model, load_tokenizer
    model, tokenizer = load_model(str(model_dir)), load_tokenizer(str(model_dir))
    k = cfg.held_out_samples
    return {"greedy": success(model, tokenizer, test), "family": [r["family"] for r in test],
            "sampled": success(model, tokenizer, test, cfg.grpo_temperature, k, cfg.seed) if k else None}


def report(before: dict, after: dict, seed: int, temperature: float, samples: int) -> tuple[dict, str]:
    """The summary (greedy success, the headline, with Wilson intervals; with `samples` episodes a task, sampled
    success too, with bootstrap intervals over tasks; each gain paired by task) and its results table."""
    from ..stats import bootstrap, is_gain, paired_gain, wilson
    kinds = [("greedy", "success", "", lambda x: wilson(int(sum(x)), len(x)))]
    if samples:
        kinds.append(("sampled", "sampled_success", "sampled_", lambda x: bootstrap(x, seed=seed)))
    summary, lines = {"sampled_episodes_per_task": samples, "sampled_temperature": temperature}, []
    head, rows = "| model | held-out task success, greedy [95% CI] |", {"sft": "", "grpo": ""}
    for kind, key, prefix, interval in kinds:
        gain, ci = paired_gain(before[kind], after[kind], seed=seed)
        for stage, r in (("sft", before), ("grpo", after)):
            value, (lo, hi) = sum(r[kind]) / len(r[kind]), interval(r[kind])
            summary.update({f"{stage}_{key}": value, f"{stage}_{key}_ci95": [lo, hi]})
            rows[stage] += f" {value:.1%} [{lo:.1%}, {hi:.1%}] |"
        summary.update({f"{prefix}gain_points": 100 * gain, f"{prefix}gain_points_ci95": [100 * ci[0], 100 * ci[1]],
                        f"{prefix}gain_significant": is_gain(ci)})
        lines.append(f"GRPO gain, {kind}: {100 * gain:+.1f} points, paired bootstrap 95% CI [{100 * ci[0]:+.1f}, "
                     f"{100 * ci[1]:+.1f}] over {len(before[kind])} tasks{'' if is_gain(ci) else ' (not a gain)'}")
    if samples:
        head += f" sampled: {samples} episodes a task at temperature {temperature:g} [95% CI] |"
    summary["greedy_success_by_family"] = {f: [mean_of(r["greedy"], r["family"], f) for r in (before, after)]
                                           for f in sorted(set(before["family"]))}
    table = (f"{head}\n|{'---|' * head.count(' |')}\n| SFT (cold start on demonstrations) |{rows['sft']}\n"
             f"| SFT + GRPO |{rows['grpo']}\n\n" + "\n".join(lines) + "\n\nGreedy success by task family, SFT -> "
             "SFT + GRPO: " + ", ".join(f"{f} {a:.0%} -> {b:.0%}" for f, (a, b) in
                                         summary["greedy_success_by_family"].items()) + "\n")
    return summary, table


def mean_of(values: list[float], labels: list[str], label: str) -> float:
    """The mean of the values whose label is `label`."""
    mine = [v for v, x in zip(values, labels) if x == label]
    return sum(mine) / len(mine)
