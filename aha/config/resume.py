"""What a resumed run may change: a short table of settings that are honoured (and recorded in config.yaml);
every other setting that differs from the run's own is refused, naming each key with its old and new value.

The run's own settings are the config its checkpoint was written with (or, for a checkpoint of an older aha, the
run's config.yaml). Effective values are compared, after aha derived what it derives (generation_batch_size from
the batch sizes, reward_weights from the task), so a value aha re-derives from unchanged settings compares equal,
and one re-derived from a changed setting is named only through that setting.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml

from .errors import ConfigError

RESUMABLE = frozenset({
    # how long it trains (the learning-rate schedule stretches or shrinks to the new length from the current step)
    "max_steps", "num_train_epochs",
    # how often and where it logs, evaluates and saves; how it is started
    "logging_steps", "logging_first_step", "eval_steps", "save_steps", "save_total_limit", "save_merged", "report_to",
    "run_name",
    "logging_dir", "progress_bar", "log_completions_steps", "num_completions_to_print", "log_groups_steps",
    "log_groups_max", "log_groups_max_mb", "push_to_hub", "hub_model_id", "dashboard", "dashboard_port",
    "output_dir", "resume", "overwrite_output_dir",
    # how it runs, not what it computes: time limits, failure policy, threads, memory
    "reward_timeout", "tool_timeout", "reward_fail_steps", "on_nonfinite", "threads", "gradient_checkpointing",
    "max_tokens_per_micro_batch", "share_prompts", "generation_max_batch", "dist_timeout", "max_worker_restarts", "ray_address",
})
"""Settings a resumed run may change. Anything else (learning_rate, weight_decay, num_generations, task, seed,
the model, ...) shapes what the checkpoint holds or how it continues, and must stay as the run had it."""
DERIVED = {"generation_batch_size": ("per_device_train_batch_size", "gradient_accumulation_steps"),
           "reward_weights": ("task", "reward_funcs")}
"""Values aha derives when they are not set -> what they are derived from: when that differs too, the derived value
is its consequence and not listed on its own."""
INPUTS = ("model", "task", "dataset", "reward_funcs", "reward_kwargs")
"""Inputs that Python code may pass as objects instead (model=, train_dataset=, reward_funcs=): compared only when
both runs name them in the config."""


def config_record(cfg, agent=None) -> dict:
    """The config as plain JSON values, as a checkpoint stores it and as it is compared. With `agent` (the run's
    aha.envs.Agent) `tools` and `environment` are what the run uses, by name, however they were given: the config's
    module:function names or, from Python, the objects themselves."""
    record = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    if agent is not None:
        factories = agent.factories or {}
        record["tools"] = [qualified_name(t) for t in agent.tools]
        record["environment"] = ({k: qualified_name(f) for k, f in factories.items()} if agent.multi else
                                 qualified_name(factories[None]) if factories else None)
    return record


def qualified_name(obj) -> str:
    """"module:qualname" of a function or class (of its class, for another callable object).

    >>> qualified_name(json.dumps)
    'json:dumps'
    """
    target = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{target.__module__}:{target.__qualname__}"


def read_saved_config(path: Path) -> dict | None:
    """A run's config.yaml as a mapping, or None when it is missing or unreadable (nothing to compare with)."""
    try:
        saved = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return json.loads(json.dumps(saved, default=str)) if isinstance(saved, dict) else None


def _same(key: str, old, new) -> bool:
    if old == new:
        return True
    if key == "model" or key == "dataset":  # one local path spelt two ways
        return Path(str(old)).exists() and Path(str(old)).resolve() == Path(str(new)).resolve()
    return False


def resume_changes(saved: dict, cfg, agent=None) -> list[str]:
    """`key: old -> new` for every setting of `cfg` (with `agent`'s tools and environments, see config_record) that
    differs from `saved` and may not change on resume."""
    changed = {}
    for key, new in config_record(cfg, agent).items():
        if key in RESUMABLE or key not in saved:  # a key an older aha did not have
            continue
        old = saved[key]
        if key in INPUTS and (old in (None, "", [], {}) or new in (None, "", [], {})):
            continue
        if not _same(key, old, new):
            changed[key] = f"{key}: {old!r} -> {new!r}"
    return [text for key, text in changed.items() if not set(DERIVED.get(key, ())) & changed.keys()]


def check_resume(saved: dict, cfg, where: Path, run_dir: Path, agent=None) -> None:
    """Refuse to resume with settings the run did not have (other than RESUMABLE), naming each."""
    changed = resume_changes(saved, cfg, agent)
    if changed:
        raise ConfigError(
            f"cannot resume {run_dir} with other settings than its own ({where}): {'; '.join(changed)}. A resume may "
            "change how long the run trains and how it logs, evaluates and saves (aha.config.resume.RESUMABLE), "
            f"nothing else: start from the run's own config (aha train {run_dir / 'config.yaml'} resume=true "
            "max_steps=...), or start a new run in another output_dir")
