"""`aha demo [NAME]`: GRPO stories that run on a CPU in minutes, one file each, chosen by name.

    aha demo              the embedded default: a tiny model learns column addition (default.py)
    aha demo aha          the aha moment: a task where checking pays; does GRPO make the model reflect? (aha_moment.py)
    aha demo agent        an agent: a tiny model learns to use a virtual filesystem's tools (agent.py)
    aha demo process      process rewards: the default's task with each column sum rewarded as a step (process.py)

Every variant reads the one flat DemoConfig (`aha demo --help`) and writes to its own output_dir (runs/demo,
runs/demo_NAME). Adding one, say `aha demo agent`:
  1. write aha/demo/agent.py with `run(cfg: DemoConfig) -> dict` (reuse default.py's steps: start, cold_start,
     held_out, train_grpo, accuracy_report, finish; end with `finish`, which prints how to open the dashboard) and
     beside it DEFAULTS, its values of the shared settings whose DemoConfig default is None (threads, sft_target,
     the stage sizes): default.py's, or `{**default.DEFAULTS, "sft_target": 0.5}` as aha_moment.py has;
  2. add one line to VARIANTS: `"agent": Variant("agent", "one line for the listing"),`;
  3. only if it has settings of its own: add them to DemoConfig (one docstring each, naming the variant) and list
     them in the entry's `fields`, so that setting them under another variant is an error, not a silent no-op.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import NamedTuple

from ..config import DemoConfig
from .default import StopAtAccuracy  # noqa: F401  (the cold start's callback, imported from here by users)


class Variant(NamedTuple):
    module: str
    """The file under aha/demo/ whose `run(cfg)` runs it."""
    summary: str
    """One line for listings."""
    fields: tuple[str, ...] = ()
    """DemoConfig fields only this variant reads."""


VARIANTS: dict[str, Variant] = {
    "": Variant("default", "the embedded default: tiny model, cold-start SFT, GRPO, before/after table"),
    "aha": Variant("aha_moment", "the aha moment: a task where checking pays, reflection before and after GRPO",
                   fields=("reflect_share", "check_carries", "wait_reward", "sft_model", "held_out_samples")),
    "agent": Variant("agent", "an agent: a tiny model learns a virtual filesystem's tools, task success before/after",
                     fields=("grpo_temperature", "grpo_mask_truncated", "grpo_beta", "grpo_families", "grpo_config",
                             "sft_model", "held_out_samples")),
    "process": Variant("process", "process rewards: the embedded default with credit by step (or outcome, or a PRM)",
                       fields=("credit", "sft_model", "prm_model")),
}
"""Variant name ("" for plain `aha demo`) -> the file that runs it."""


def configured(cfg: DemoConfig) -> DemoConfig:
    """`cfg` with each setting left None set to its variant's default (`defaults`); a value given is kept."""
    given = {key: value for key, value in defaults(cfg.variant).items() if getattr(cfg, key) is None}
    return dataclasses.replace(cfg, **given)


def defaults(name: str) -> dict:
    """Variant `name`'s values of the DemoConfig settings whose default is None: its module's DEFAULTS (an unknown
    name: the embedded default's, so that the config builds and check_variant names the valid variants)."""
    variant = VARIANTS.get(name, VARIANTS[""])
    return importlib.import_module(f"{__name__}.{variant.module}").DEFAULTS


def check_variant(cfg: DemoConfig) -> Variant:
    """The chosen variant; an unknown name, or a setting that only another variant reads, raises."""
    if cfg.variant not in VARIANTS:
        raise ValueError(f"unknown demo '{cfg.variant}'; valid: {sorted(n for n in VARIANTS if n)} "
                         "(or none, for the embedded default)")
    mine, defaults = VARIANTS[cfg.variant], DemoConfig()
    for name, variant in VARIANTS.items():
        for key in sorted(set(variant.fields) - set(mine.fields)):
            if getattr(cfg, key) != getattr(defaults, key):
                raise ValueError(f"{key} is a setting of `{command(name)}`, not of `{command(cfg.variant)}`")
    return mine


def command(name: str) -> str:
    """The command that runs a variant: command("aha") -> "aha demo aha"; command("") -> "aha demo"."""
    return f"aha demo {name}".strip()


def run_demo(cfg: DemoConfig) -> dict:
    """Run the variant `cfg.variant` names (see VARIANTS)."""
    variant = check_variant(cfg)
    return importlib.import_module(f"{__name__}.{variant.module}").run(configured(cfg))

