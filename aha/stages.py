"""Each stage as one function of its config, and the one table of stages that `aha <stage>` and the recipe use."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, NamedTuple

from . import config


def _task(name):
    from .tasks import get_task
    return get_task(name) if name else None


def _eval_hook(task, cfg):
    if not (task and cfg.eval_samples and "test" in task.splits):
        return None
    from .eval import make_eval_fn
    return make_eval_fn(task, task.load("test")[:cfg.eval_samples], getattr(cfg, "max_completion_length", None))


def run_grpo(cfg: config.GRPOConfig) -> dict:
    """GRPO from a GRPOConfig: train, save, and push when asked."""
    trainer = grpo_trainer(cfg)
    cfg = trainer.args
    if cfg.dashboard:  # served from a daemon thread: it ends with the process
        from .dashboard import serve_in_background
        print(f"aha dashboard: {serve_in_background(cfg.output_dir, cfg.dashboard_port)}", flush=True)
    metrics = trainer.train()
    trainer.save_model()
    if cfg.push_to_hub:
        metrics["hub_repo"] = trainer.push_to_hub()
    return metrics


def grpo_trainer(cfg: config.GRPOConfig):
    """The GRPOTrainer of a GRPOConfig: data and rewards from `task` unless `dataset`/`reward_funcs` say otherwise."""
    from .data import load_rows
    from .train.grpo import GRPOTrainer
    task = _task(cfg.task)
    if cfg.dataset:  # an environment's rows may hold no prompt (its reset writes it): the trainer reads those
        data = cfg.dataset if cfg.environment else load_rows(cfg.dataset, cfg.prompt_column)
    elif task:
        data = task.load("train")
    elif cfg.environment:
        data = None  # the environment owns the data, as TRL's environment_factory without a train_dataset
    else:
        raise ValueError("GRPO needs training data: set `task`, `dataset` or `environment`")
    if cfg.reward_funcs:
        rewards = cfg.reward_funcs
    elif task:
        rewards = task.rewards()
        if cfg.reward_weights is None and task.reward_weights:  # the task's weights are part of the effective config
            cfg = dataclasses.replace(cfg, reward_weights=list(task.reward_weights))
    elif cfg.environment or cfg.prm_model:
        rewards = []  # the environment's get_reward (the trainer refuses an environment without one), or the PRM's
    else:
        raise ValueError("GRPO needs reward functions: set `reward_funcs`, `task`, `prm_model` or an `environment` "
                         "with get_reward")
    eval_fn = _eval_hook(task, cfg) if cfg.eval_steps else None
    tools, environment = None, None
    if task and task.is_agent and not (cfg.tools or cfg.environment):  # an agent task brings its tools
        tools, environment = task.tools() if task.tools else [], task.environment
        if cfg.max_tool_calling_iterations is None:
            cfg = dataclasses.replace(cfg, max_tool_calling_iterations=task.max_tool_calling_iterations)
    return GRPOTrainer(model=cfg.model, reward_funcs=rewards, args=cfg, train_dataset=data, eval_fn=eval_fn,
                       tools=tools, environment_factory=environment)


def run_sft(cfg: config.SFTConfig) -> dict:
    """SFT from an SFTConfig: worked solutions of `task` (its `completion` column) or a JSONL."""
    from .data import load_rows
    from .train.sft import SFTTrainer
    task = _task(cfg.task)
    if cfg.dataset:
        data = load_rows(cfg.dataset, prompt_column=None)
    elif task and task.is_agent:
        data = demonstrations(task)
    elif task:
        data = task.load("train")
    else:
        raise ValueError("SFT needs training data: set `task` or `dataset`")
    hook = _eval_hook(task, cfg)
    trainer = SFTTrainer(model=cfg.model, args=cfg, train_dataset=data, eval_fn=hook if cfg.eval_steps else None)
    metrics = trainer.train()
    path = trainer.save_model()
    if cfg.push_to_hub:
        metrics["hub_repo"] = trainer.push_to_hub()
    if hook:
        metrics.update({f"eval/{k}": v for k, v in hook(trainer.model, trainer.tokenizer).items()})
        (Path(cfg.output_dir) / "eval.json").write_text(json.dumps(metrics, indent=2))
    return {**metrics, "model_dir": str(path)}


def demonstrations(task) -> list[dict]:
    """An agent task's training rows as worked episodes in TRL's messages format (`messages`, `tools`): the cold
    start's data."""
    if task.demonstrate is None:
        raise ValueError(f"task '{task.name}' has no demonstrations to learn from; give SFT a `dataset` of tool "
                         "conversations (e.g. one `aha sample` wrote)")
    agent = task.agent()
    return [{"messages": task.demonstrate(r), "tools": agent.schemas[agent.environment_name(r)]}
            for r in task.load("train")]


def run_tiny(cfg: config.TinyConfig) -> dict:
    """A tiny model built in code, its tokenizer fitted on the task's training text."""
    from .models.tiny import make_tiny
    from .tasks import get_task
    path = make_tiny(cfg.output_dir, tiny_corpus(get_task(cfg.task)), size=cfg.size, seed=cfg.seed)
    return {"model_dir": str(path)}


def tiny_corpus(task, rows: int = 2000) -> list[str]:
    """The text a tiny model's tokenizer is fitted on: the task's training text (aha.tasks.task_corpus), and for an
    agent task with demonstrations, `rows` of them rendered as aha's tool template writes them (tool list, calls,
    results), so the episodes' words are in the vocabulary."""
    from .tasks import task_corpus
    if task.demonstrate is None:
        return task_corpus(task.load("train"))
    from .data.toolcalls import TOOL_TEMPLATE, ToolChat
    from .models.tiny import train_tokenizer
    probe = train_tokenizer(["x"])
    probe.chat_template = TOOL_TEMPLATE
    chat = ToolChat(probe)
    return task_corpus(task.load("train")) + [chat.render(d["messages"], d["tools"]) for d in demonstrations(task)[:rows]]


def run_eval(cfg: config.EvalConfig) -> dict:
    from .eval import run_eval as run
    return run(cfg)


def run_sample(cfg: config.SampleConfig) -> dict:
    from .sample import run_sample as run
    return run(cfg)


def run_prm_labels(cfg: config.PRMLabelsConfig) -> dict:
    from .prm_labels import run_prm_labels as run
    return run(cfg)


def run_prm(cfg: config.PRMConfig) -> dict:
    """A process reward model from step labels: train, save (model/, with its step separator), held-out step
    accuracy (eval.json)."""
    from .train.prm import PRMTrainer
    trainer = PRMTrainer(args=cfg)
    metrics = trainer.train()
    path = trainer.save_model()
    if cfg.push_to_hub:
        metrics["hub_repo"] = trainer.push_to_hub()
    if trainer.eval_fn:
        metrics.update({f"eval/{k}": v for k, v in trainer.eval_fn(trainer.model, trainer.tokenizer).items()})
        (Path(cfg.output_dir) / "eval.json").write_text(json.dumps(metrics, indent=2))
    return {**metrics, "model_dir": str(path)}


def run_demo(cfg: config.DemoConfig) -> dict:
    from .demo import run_demo as run
    return run(cfg)


def run_dashboard(cfg: config.DashboardConfig) -> dict:
    """Serve the dashboard until interrupted (Ctrl-C)."""
    import uvicorn

    from .dashboard import build_app
    app, url = build_app(cfg), f"http://{cfg.host}:{cfg.port}"
    print(f"aha dashboard: {url}  (Ctrl-C stops it)", flush=True)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning")
    return {"url": url, "stopped": True}


class Stage(NamedTuple):
    config: type
    run: Callable[..., dict]
    summary: str
    """One line for `aha --help`."""
    makes_model: bool = False
    """Its output is a model directory (the recipe evaluates it and hands it to the next stage)."""
    positional: str | None = None
    """A config key that a bare command-line word fills (`aha eval MODEL`)."""
    reads_as: str | None = None
    """What a later stage's `@name` of it reads when it makes no policy model: "data file" (its data.jsonl) or
    "process reward model" (its model/); the kinds of aha.recipe.REF_KINDS."""


STAGES: dict[str, Stage] = {
    "demo": Stage(config.DemoConfig, run_demo, "the embedded default: tiny model, cold-start SFT, GRPO, before/after",
                  positional="variant"),
    "train": Stage(config.GRPOConfig, run_grpo, "GRPO training", makes_model=True),
    "grpo": Stage(config.GRPOConfig, run_grpo, "GRPO training (the name recipes use)", makes_model=True),
    "sft": Stage(config.SFTConfig, run_sft, "supervised fine-tuning", makes_model=True),
    "eval": Stage(config.EvalConfig, run_eval, "accuracy, pass@k, maj@k", positional="model"),
    "sample": Stage(config.SampleConfig, run_sample, "rejection sampling to JSONL", positional="model",
                    reads_as="data file"),
    "prm_labels": Stage(config.PRMLabelsConfig, run_prm_labels, "step labels by continuations (Math-Shepherd) to JSONL",
                        reads_as="data file"),
    "prm": Stage(config.PRMConfig, run_prm, "a process reward model trained on step labels",
                 reads_as="process reward model"),
    "tiny": Stage(config.TinyConfig, run_tiny, "a tiny model built in code", makes_model=True),
    "dashboard": Stage(config.DashboardConfig, run_dashboard, "the local web dashboard of runs", positional="runs"),
}
"""Stage name -> its config class and runner: the command line and the recipe dispatch through this table."""


def get_stage(name: str) -> Stage:
    if name not in STAGES:
        raise ValueError(f"unknown stage '{name}'; valid: {sorted(STAGES)}")
    return STAGES[name]
