"""Multi-stage pipelines (the R1 recipe): an ordered list of stages, each reading earlier outputs.

A recipe YAML has `output_dir`, an optional `eval` block (task, num_problems) run after every stage
that produces a model, and `stages`: a list of {name, type, ...config fields}. `@name` in a field
refers to an earlier stage's output (its model directory, or its data file for `sample`). A stage
that finished writes `done.json` and is skipped on the next run, so an interrupted recipe resumes.
Every stage is checked (types, keys, references, cycles, literal input paths, task names) before anything runs.
"""

from __future__ import annotations

import dataclasses
import graphlib
import json
import time
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError, EvalConfig, from_dict
from .stages import STAGES, get_stage

RECIPE_STAGES = ("tiny", "sft", "grpo", "sample", "eval")
"""Stage types a recipe may use (entries of aha.stages.STAGES)."""


def _refs(stage: dict) -> list[str]:
    return [v[1:] for v in stage.values() if isinstance(v, str) and v.startswith("@")]


def validate(recipe: dict) -> list[dict]:
    """Check the whole recipe before anything runs; return its stages with defaults filled in."""
    stages = recipe.get("stages")
    if not isinstance(stages, list) or not stages:
        raise ConfigError("a recipe needs a non-empty `stages` list")
    names = [s.get("name") for s in stages]
    if any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
        raise ConfigError(f"every stage needs a unique `name`; got {names}")
    graph = {}
    for s in stages:
        if s.get("type") not in RECIPE_STAGES:
            raise ConfigError(f"stage '{s['name']}': unknown type {s.get('type')!r}; valid: {list(RECIPE_STAGES)}")
        for ref in _refs(s):
            if ref not in names:
                raise ConfigError(f"stage '{s['name']}' uses @{ref}, which is not a stage of this recipe")
        graph[s["name"]] = set(_refs(s))
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        raise ConfigError(f"the recipe has a cycle: {' -> '.join(e.args[1])}") from None
    for i, s in enumerate(stages):
        for ref in _refs(s):
            if names.index(ref) >= i:
                raise ConfigError(f"stage '{s['name']}' uses @{ref}, which runs after it; reorder the stages")
        producer = next((p for p in reversed(stages[:i]) if STAGES[p["type"]].makes_model), None)
        cls = STAGES[s["type"]].config
        needs_model = _takes_model(cls)
        if needs_model and "model" not in s and producer is None and not recipe.get("model"):
            raise ConfigError(f"stage '{s['name']}' has no model: set `model` or add an earlier model stage")
        fields = {k: ("ref" if isinstance(v, str) and v.startswith("@") else v)
                  for k, v in s.items() if k not in ("name", "type")}
        try:  # keys and types checked now; @references stand in as the string "ref"
            from_dict(cls, {"model": "ref", **fields} if needs_model else fields)
        except (ConfigError, ValueError, TypeError) as e:
            raise ConfigError(f"stage '{s['name']}': {e}") from None
    _check_inputs(recipe, stages)
    return stages


def _takes_model(cls) -> bool:
    return "model" in {f.name for f in dataclasses.fields(cls)}


def _check_inputs(recipe: dict, stages: list[dict]) -> None:
    """Literal (non-@) inputs exist: models, dataset files, task names, and the `eval` block's keys."""
    from .models.zoo import KNOWN_MODELS, resolve_model
    from .tasks import get_task as resolve_task
    ev = recipe.get("eval") or {}
    try:
        from_dict(EvalConfig, {"model": "ref", **ev})
        if "task" in ev:
            resolve_task(ev["task"])
    except (ConfigError, ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"recipe `eval` block: {e}") from None
    for where, s in [("recipe", recipe)] + [(f"stage '{s['name']}'", s) for s in stages]:
        literal = {k: v for k, v in s.items() if isinstance(v, str) and not v.startswith("@")}
        try:
            if "model" in literal and literal["model"] not in KNOWN_MODELS:  # known names convert on first use
                resolve_model(literal["model"])
            for key in ("dataset", "mix_dataset"):
                if key in literal and not Path(literal[key]).is_file():
                    raise ValueError(f"{key} {literal[key]!r} is not a file")
            if "task" in literal and s is not recipe:
                resolve_task(literal["task"])
        except (ValueError, KeyError) as e:
            raise ConfigError(f"{where}: {e}") from None


def _output(stage_dir: Path, kind: str) -> str:
    if kind == "sample":
        return str(stage_dir / "data.jsonl")
    return str(stage_dir if kind == "tiny" else stage_dir / "model")


def _run_stage(kind: str, fields: dict[str, Any], stage_dir: Path) -> dict:
    """Run a stage into its directory; a training stage left unfinished by an earlier run starts over
    there (overwrite_output_dir) unless the recipe says resume: true for it."""
    stage = get_stage(kind)
    values = {**fields, "output_dir": str(stage_dir)}
    if "overwrite_output_dir" in {f.name for f in dataclasses.fields(stage.config)}:
        values.setdefault("overwrite_output_dir", not values.get("resume", False))
    return stage.run(from_dict(stage.config, values))


def run_recipe(path: str, overrides: list[str] | None = None) -> dict:
    """Run (or resume) a recipe; returns and writes the per-stage evaluation summary."""
    from .eval import run_eval
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"recipe not found: {path}")
    recipe = yaml.safe_load(p.read_text()) or {}
    for o in overrides or []:
        key, _, value = o.partition("=")
        recipe[key] = yaml.safe_load(value)
    stages = validate(recipe)
    root = Path(recipe.get("output_dir", "runs/recipe"))
    root.mkdir(parents=True, exist_ok=True)
    ev = recipe.get("eval") or {}
    outputs: dict[str, str] = {}
    model = recipe.get("model")
    table = []
    t0 = time.perf_counter()
    for s in stages:
        name, kind = s["name"], s["type"]
        stage_dir = root / name
        done = stage_dir / "done.json"
        fields = {k: (outputs[v[1:]] if isinstance(v, str) and v.startswith("@") else v)
                  for k, v in s.items() if k not in ("name", "type")}
        if _takes_model(STAGES[kind].config):
            fields.setdefault("model", model)
        if done.is_file():
            print(f"[recipe] {name}: already complete, skipped")
            record = json.loads(done.read_text())
        else:
            print(f"[recipe] {name}: running {kind}")
            t = time.perf_counter()
            result = _run_stage(kind, fields, stage_dir)
            record = {"stage": name, "type": kind, "seconds": round(time.perf_counter() - t, 1),
                      "result": {k: v for k, v in result.items() if isinstance(v, (int, float, str))}}
            if STAGES[kind].makes_model and ev:
                summary = run_eval(EvalConfig(model=_output(stage_dir, kind), output_dir=str(stage_dir / "eval"),
                                              progress_bar=False, **ev))
                record["eval"] = {k: summary[k] for k in ("accuracy", "accuracy_ci95", "format_frac", "len_mean")
                                  if k in summary}
            done.write_text(json.dumps(record, indent=2))
        outputs[name] = _output(stage_dir, kind)
        if STAGES[kind].makes_model:
            model = outputs[name]
        table.append(record)
    summary = {"output_dir": str(root), "seconds": round(time.perf_counter() - t0, 1), "stages": table}
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    md = ["| stage | type | held-out accuracy [95% CI] | format | mean length | seconds |", "|---|---|---|---|---|---|"]
    for r in table:
        e = r.get("eval") or ({"accuracy": r["result"].get("accuracy")} if r["type"] == "eval" else {})
        cell = lambda k, f: f.format(e[k]) if e.get(k) is not None else "–"  # noqa: E731
        acc = cell("accuracy", "{:.1%}") + (" [{:.1%}, {:.1%}]".format(*e["accuracy_ci95"]) if e.get("accuracy_ci95") else "")
        md.append(f"| {r['stage']} | {r['type']} | {acc} | {cell('format_frac', '{:.1%}')} "
                  f"| {cell('len_mean', '{:.1f}')} | {r['seconds']} |")
    (root / "summary.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return summary
