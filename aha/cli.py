"""The `aha` command: `aha STAGE [CONFIG.yaml] [key=value | --key value ...]`."""

from __future__ import annotations

import json
import logging
import sys


def _normalise(argv: list[str], positional: str | None = None) -> list[str]:
    """`--key value` and `--key=value` become `key=value`; bare words fill `positional` (several: a list)."""
    out, bare, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and arg not in ("--help", "-h"):
            key, eq, value = arg[2:].partition("=")
            key = key.replace("-", "_")  # the key only: `--output-dir=runs/my-run` keeps the value's dashes
            if eq:
                out.append(f"{key}={value}")
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out.append(f"{key}={argv[i + 1]}")
                i += 1
            else:
                out.append(f"{key}=true")
        elif positional and "=" not in arg and not arg.endswith((".yaml", ".yml")):
            bare.append(arg)
        else:
            out.append(arg)
        i += 1
    if bare:
        out.append(f"{positional}={bare[0] if len(bare) == 1 else json.dumps(bare)}")
    return out


def _config(cls, argv: list[str], positional: str | None = None):
    from .config import help_text, parse_args
    if "--help" in argv or "-h" in argv:
        print(help_text(cls))
        sys.exit(0)
    return parse_args(cls, _normalise(argv, positional))


def cmd_recipe(argv):
    from .recipe import run_recipe
    if not argv or argv[0] in ("--help", "-h"):
        print("usage: aha recipe RECIPE.yaml [key=value ...]   (see examples/recipe_arithmetic.yaml)")
        sys.exit(0 if argv else 2)
    return run_recipe(argv[0], argv[1:])


def cmd_models(argv):
    from .models.zoo import KNOWN_MODELS, get_model
    if len(argv) == 2 and argv[0] == "get":
        return {"path": str(get_model(argv[1]))}
    if argv[:1] == ["list"] or not argv:
        return {name: info.note for name, info in KNOWN_MODELS.items()}
    print("usage: aha models list | aha models get NAME")
    sys.exit(2)


def cmd_plot(argv):
    """Every metric of each run's metrics.jsonl in a grid: RUN_DIR/metrics.png."""
    from pathlib import Path

    from .metrics import plot_metrics
    if not argv or argv[0] in ("--help", "-h"):
        print("usage: aha plot RUN_DIR [RUN_DIR ...]   (writes RUN_DIR/metrics.png)")
        sys.exit(0 if argv else 2)
    out = {}
    for run in map(Path, argv):
        if not (run / "metrics.jsonl").is_file():
            raise FileNotFoundError(f"{run} has no metrics.jsonl")
        out[str(run)] = str(plot_metrics(run / "metrics.jsonl", None, run / "metrics.png", title=str(run)))
    return out


def cmd_examples(argv):
    """The example configs shipped with aha: listed, or copied into a directory (`aha examples DIR`)."""
    import shutil
    from pathlib import Path
    source = Path(__file__).parent / "examples"
    files = sorted(source.glob("*.yaml"))
    if argv and argv[0] in ("--help", "-h"):
        print("usage: aha examples [DIR]   (lists the example configs; with DIR, copies them there)")
        sys.exit(0)
    if not argv:
        return {"directory": str(source), "configs": [f.name for f in files]}
    target = Path(argv[0])
    target.mkdir(parents=True, exist_ok=True)
    taken = [f.name for f in files if (target / f.name).exists()]
    if taken:
        raise FileExistsError(f"{target} already has {', '.join(taken)}; nothing was copied")
    return {"copied": [str(shutil.copy(f, target / f.name)) for f in files]}


def _stage_command(name: str):
    def run(argv):
        from .stages import get_stage
        stage = get_stage(name)
        return stage.run(_config(stage.config, argv, stage.positional))
    return run


CLI_STAGES = ("demo", "train", "sft", "eval", "sample", "prm_labels", "prm", "dashboard")
"""Stages with a command of their own (the rest of aha.stages.STAGES run inside recipes)."""
COMMANDS = {**{name: _stage_command(name) for name in CLI_STAGES}, "recipe": cmd_recipe, "models": cmd_models,
            "plot": cmd_plot, "examples": cmd_examples}
USAGE = """usage: aha COMMAND [CONFIG.yaml] [key=value ...]      (aha --version: the installed version)

commands:
  demo     the embedded default: tiny model, cold-start SFT, GRPO, before/after table
           (aha demo NAME for a variant: agent, a tiny model learns a virtual filesystem's tools;
            aha: the aha moment, a task where checking pays; reflection before and after GRPO)
  train    GRPO training                 (aha train --help lists every field)
  sft      supervised fine-tuning        (aha sft --help)
  eval     accuracy, pass@k, maj@k       (aha eval MODEL --task NAME)
  sample   rejection sampling to JSONL   (aha sample MODEL --task NAME)
  prm_labels step labels for a process reward model, Math-Shepherd's way (aha prm_labels --help)
  prm      train a process reward model  (aha prm --help; GRPO uses it with prm_model=DIR)
  recipe   multi-stage pipeline          (aha recipe RECIPE.yaml)
  models   offline model zoo             (aha models get smollm2-135m-instruct)
  plot     every metric of a run         (aha plot runs/grpo -> runs/grpo/metrics.png)
  examples the example configs           (aha examples DIR copies them to DIR)
  dashboard local web app of runs        (aha dashboard [RUN_DIR ...]; default: every run under runs/)
"""


def main(argv: list[str] | None = None) -> int:
    from .config import ConfigError
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--version"], ["-V"]):
        from ._version import __version__
        print(f"aha {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(USAGE if not argv or argv[0] in ("-h", "--help") else f"unknown command '{argv[0]}'\n\n{USAGE}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not {"-h", "--help"} & set(argv):  # help stays fast: no transformers import
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()  # per-file load/save bars drown the training progress bar
    try:
        result = COMMANDS[argv[0]](argv[1:])
    except (ConfigError, ValueError, OSError, RuntimeError, FloatingPointError) as e:
        print(f"aha {argv[0]}: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        loop = sys.modules.get("aha.train.loop")  # loaded if a training run raised it; --help never imports it
        if loop is None or not isinstance(e, loop.Preempted):
            raise
        print(f"aha: {e}", file=sys.stderr)
        return e.code
    if result is not None:
        print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
