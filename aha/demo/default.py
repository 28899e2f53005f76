"""The embedded default: GRPO visibly teaching a tiny model column addition, offline, on a CPU.

build a model in code -> cold-start SFT on a few worked solutions -> GRPO (public API) ->
held-out greedy accuracy before and after, a plot, summary.json and verdicts.json.
The steps are functions of their own (cold_start, held_out, train_grpo, accuracy_report) so that every
variant of the demo runs them the same way.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..config import DemoConfig, GRPOConfig, SFTConfig, save_config

DEFAULTS = {"sft_target": 0.25, "threads": 1, "sft_examples": 2000, "sft_steps": 400, "sft_check_every": 10,
            "grpo_steps": 200, "prompts_per_step": 32}
"""This variant's values of the DemoConfig settings the command line leaves unset. One thread: these tiny models are
bound by per-op overhead, and one thread is immune to oversubscription when the machine is shared. 2000 worked
solutions keep the cold start imperfect; 200 GRPO steps: at 120, one seed of ten gained only 8.5 points
(BENCHMARKS.md)."""
DEV_PROBLEMS = 100
"""Train-split problems held back from SFT and GRPO to decide when the cold start is done."""


class StopAtAccuracy:
    """A transformers-style callback: ends training once the logged eval/accuracy reaches `target`."""

    def __init__(self, target: float):
        self.target = target

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and logs.get("eval/accuracy", -1.0) >= self.target:
            control.should_training_stop = True


def start(cfg: DemoConfig) -> Path:
    """Threads set, output_dir made, the effective config saved: how every variant begins."""
    import torch
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "demo_config.yaml")
    return out


def run(cfg: DemoConfig, rewards: list | None = None, summary: dict | None = None, **settings) -> dict:
    """The embedded default. Another variant on the same task passes its own `rewards` and GRPOConfig `settings`
    (aha demo process), and keys for summary.json; with `sft_model` set, its cold start is reused."""
    from ..models.tiny import make_tiny
    from ..tasks import get_task, task_corpus

    t0 = time.perf_counter()
    out = start(cfg)
    task = get_task("arithmetic")
    train = task.load("train", 6000, cfg.seed)
    test = task.load("test", cfg.eval_problems, cfg.seed)

    # 1-2. a model built in code (tokenizer trained on the task's own text), cold-start SFT on a few worked
    #      solutions (or an earlier run's cold start, so that arms differing only in GRPO share it)
    if cfg.sft_model:
        sft_dir, sft_steps = given_model(cfg.sft_model, "sft_model"), 0
    else:
        base = make_tiny(out / "base", task_corpus(train), size=cfg.size, seed=cfg.seed)
        sft_dir, sft_steps = cold_start(cfg, out, base, task, train)
    before = held_out(cfg, task, test, sft_dir)

    # 3. GRPO from the SFT checkpoint, through the public trainer API, on train problems SFT never saw
    grpo_dir = train_grpo(cfg, out, sft_dir, task, train, rewards or task.rewards(), test, **settings)
    after = held_out(cfg, task, test, grpo_dir)

    # 4. what a person looks at: table, plot, summary; each held-out problem's greedy verdict before and after
    #    (verdicts.json), for paired differences between runs
    (out / "verdicts.json").write_text(json.dumps({"sft": before["correct"], "grpo": after["correct"]}))
    return report(out, before, after, len(test), cfg, grpo_dir, time.perf_counter() - t0, sft_steps,
                  sft_model=str(sft_dir), **(summary or {}))


def cold_start(cfg: DemoConfig, out: Path, base: Path, task, train: list) -> tuple[Path, int]:
    """SFT on the first `sft_examples` worked solutions until greedy accuracy on the next DEV_PROBLEMS train
    problems (trained on by neither stage) reaches sft_target: a tiny model's accuracy jumps within tens of
    steps at a point that moves with the seed, so a fixed step count starts GRPO anywhere from 10% to 45%.
    Returns the saved model's directory and the steps taken."""
    from ..eval import make_eval_fn
    from ..train.sft import SFTTrainer
    dev = train[cfg.sft_examples:cfg.sft_examples + DEV_PROBLEMS]
    sft_args = SFTConfig(output_dir=str(out / "sft"), model=str(base), learning_rate=cfg.sft_lr,
                         max_steps=cfg.sft_steps, per_device_train_batch_size=cfg.sft_batch,
                         warmup_steps=10, seed=cfg.seed, progress_bar=cfg.progress_bar, report_to=["jsonl"],
                         eval_steps=cfg.sft_check_every if cfg.sft_target else 0,
                         overwrite_output_dir=True)  # the demo owns its output_dir: a second run replaces the first
    sft = SFTTrainer(args=sft_args, train_dataset=train[:cfg.sft_examples], eval_fn=make_eval_fn(task, dev),
                     callbacks=[StopAtAccuracy(cfg.sft_target)] if cfg.sft_target else None)
    sft.train()
    return sft.save_model(), sft.step_count


def given_model(path: str, key: str) -> Path:
    """A saved model a setting names (an earlier run's, to share it between arms); not one: ValueError."""
    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"{key}={path} is not a saved model (no config.json)")
    return Path(path)


def held_out(cfg: DemoConfig, task, test: list, model_dir: Path, **evaluate_kwargs) -> dict:
    """aha.eval.evaluate's summary of a saved model on the held-out problems, with each problem's greedy verdict
    (`correct`, for the paired gain) and its records (`records`)."""
    from ..eval import evaluate
    from ..models import load_model, load_tokenizer
    model, tok = load_model(str(model_dir)), load_tokenizer(str(model_dir))
    summary, records = evaluate(model, tok, task, test, progress=cfg.progress_bar, **evaluate_kwargs)
    return {**summary, "correct": [float(r["greedy_correct"]) for r in records], "records": records}


def train_grpo(cfg: DemoConfig, out: Path, sft_dir: Path, task, train: list, rewards: list, test: list,
               eval_fn=None, **overrides) -> Path:
    """GRPO from the cold-start model on the train problems neither SFT nor the dev check saw; held-out accuracy
    on test[:eval_during] every eval_every steps (or `eval_fn`). `overrides` replace GRPOConfig values."""
    from ..eval import make_eval_fn
    from ..train.grpo import GRPOTrainer
    G = cfg.num_generations
    grpo_args = GRPOConfig(**{
        "output_dir": str(out / "grpo"), "learning_rate": cfg.grpo_lr, "max_steps": cfg.grpo_steps,
        "warmup_steps": 5, "lr_scheduler_type": "cosine",
        "num_generations": G, "per_device_train_batch_size": cfg.prompts_per_step * G,
        "max_completion_length": task.max_completion_length, "temperature": 1.0, "beta": 0.0,
        "reward_weights": task.reward_weights, "eval_steps": cfg.eval_every, "seed": cfg.seed,
        "log_completions_steps": 0, "progress_bar": cfg.progress_bar, "overwrite_output_dir": True,
        "share_prompts": False,  # as its recorded runs (aha would share its prompts: the same sums in another order)
        **overrides})
    trainer = GRPOTrainer(model=str(sft_dir), reward_funcs=rewards, args=grpo_args,
                          train_dataset=train[cfg.sft_examples + DEV_PROBLEMS:],
                          eval_fn=eval_fn or make_eval_fn(task, test[:cfg.eval_during]))
    trainer.train()
    return trainer.save_model()


def accuracy_report(before: dict, after: dict, n_test: int, seed: int) -> tuple[dict, str]:
    """The before/after accuracy summary (summary.json's first keys) and its markdown table."""
    from ..stats import is_gain, paired_gain
    gain, gain_ci = paired_gain(before["correct"], after["correct"], seed=seed)
    summary = {"sft_accuracy": before["accuracy"], "sft_accuracy_ci95": before["accuracy_ci95"],
               "grpo_accuracy": after["accuracy"], "grpo_accuracy_ci95": after["accuracy_ci95"],
               "gain_points": 100 * gain, "gain_points_ci95": [100 * gain_ci[0], 100 * gain_ci[1]],
               "gain_significant": is_gain(gain_ci),
               "sft_format_frac": before["format_frac"], "grpo_format_frac": after["format_frac"],
               "sft_len_mean": before["len_mean"], "grpo_len_mean": after["len_mean"]}
    ci = lambda r: f"{r['accuracy']:.1%} [{r['accuracy_ci95'][0]:.1%}, {r['accuracy_ci95'][1]:.1%}]"  # noqa: E731
    table = (f"| model | held-out greedy accuracy [95% CI] | format | mean length |\n|---|---|---|---|\n"
             f"| SFT (cold start) | {ci(before)} | {before['format_frac']:.1%} | {before['len_mean']:.1f} |\n"
             f"| SFT + GRPO | {ci(after)} | {after['format_frac']:.1%} | {after['len_mean']:.1f} |\n\n"
             f"GRPO gain: {100 * gain:+.1f} points, paired bootstrap 95% CI [{100 * gain_ci[0]:+.1f}, "
             f"{100 * gain_ci[1]:+.1f}] over {n_test} problems"
             f"{'' if is_gain(gain_ci) else ' (inside the noise: not a gain)'}\n")
    return summary, table


def finish(out: Path, summary: dict, table: str) -> dict:
    """summary.json and results.md written, the table printed, and how to look at the run."""
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "results.md").write_text(table)
    print("\n" + table)
    root = "" if out.parent == Path("runs") else f" runs_root={out.parent}"
    print(f"See the run (curves, groups token by token, the aha tracker, Learn GRPO): aha dashboard{root}\n"
          "then open http://127.0.0.1:8765")
    return summary


def report(out: Path, before: dict, after: dict, n_test: int, cfg: DemoConfig, grpo_dir: Path, seconds: float,
           sft_steps: int, **extra) -> dict:
    """summary.json (with `extra`'s keys), results.md and demo.png in `out`; the table printed."""
    from ..metrics import plot_metrics
    plot = plot_metrics(out / "grpo" / "metrics.jsonl",
                        ["reward/mean", "eval/accuracy", "completion/len_mean", "perf/step_s"],
                        out / "demo.png", title="GRPO on column addition (held-out accuracy in eval/)")
    summary, table = accuracy_report(before, after, n_test, cfg.seed)
    summary.update({"eval_problems": n_test, "sft_steps": sft_steps, "steps": cfg.grpo_steps,
                    "seconds": round(seconds, 1), "model_dir": str(grpo_dir), "plot": str(plot), **extra})
    return finish(out, summary, table)
