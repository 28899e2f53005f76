"""Multi-stage pipelines (the R1 recipe): an ordered list of stages, each reading earlier outputs.

A recipe YAML has `output_dir`, an optional `eval` block (task, num_problems) run after every stage
that produces a model, and `stages`: a list of {name, type, ...config fields}. `@name` in a field
refers to an earlier stage's output (its model directory, or its data file for `sample`). A stage
that finished writes `done.json` and is skipped on the next run, so an interrupted recipe resumes.
Every stage is checked (types, keys, references and the kind of output each names, cycles, literal input
paths, task names) before anything runs; so are the top-level keys, in the file and as `key=value` overrides.
"""

from __future__ import annotations

import dataclasses
import graphlib
import json
import time
from pathlib import Path
from typing import Any

from .config import ConfigError, EvalConfig, from_dict
from .config.parse import check_names, check_yaml_text, did_you_mean, load_yaml, override_value
from .fileio import atomic_write
from .stages import STAGES, get_stage

RECIPE_STAGES = ("tiny", "sft", "grpo", "sample", "eval", "prm_labels", "prm")
"""Stage types a recipe may use (entries of aha.stages.STAGES)."""


RECIPE_KEYS = ("output_dir", "model", "eval", "stages")
"""The keys of a recipe's top level, in the file or as `key=value` after it (stage fields go in a stage)."""
TEXT_KEYS = ("output_dir", "model")
"""Top-level keys whose `key=value` override is kept as written (`output_dir=0123` is not octal 83)."""

REF_KINDS = {"model": "model", "dataset": "data file", "mix_dataset": "data file", "prm_model": "process reward model"}
"""Fields that take `@stage`, and the kind of output that stage must make."""


def _makes(kind: str) -> str:
    """What a stage type's output is: a model, a data file, a process reward model, or nothing a later stage can
    read (eval)."""
    if STAGES[kind].makes_model:
        return "model"
    return STAGES[kind].reads_as or "nothing to read"


def _refs(stage: dict) -> list[str]:
    return [v[1:] for v in stage.values() if isinstance(v, str) and v.startswith("@")]


def _check_key(key: Any) -> None:
    if key in RECIPE_KEYS:
        return
    if not isinstance(key, str):
        raise ConfigError(f"recipe keys are names; got {key!r}")
    in_stage = any(key in {f.name for f in dataclasses.fields(STAGES[t].config)} for t in RECIPE_STAGES)
    hint = "; it is a stage field: set it in a stage" if in_stage else did_you_mean(key, RECIPE_KEYS)
    raise ConfigError(f"unknown recipe key '{key}' (a recipe has {', '.join(RECIPE_KEYS)}){hint}")


def _check_ref_kinds(stages: list[dict]) -> None:
    """`model: @x` names a stage that makes a model, `dataset: @x` / `mix_dataset: @x` a sample or prm_labels stage,
    `prm_model: @x` a prm stage."""
    kinds = {s["name"]: s["type"] for s in stages}

    def takes(kind: str) -> str:
        makers = [t for t in RECIPE_STAGES if _makes(t) == kind]
        return f"a {', '.join(makers[:-1])} or {makers[-1]} stage" if len(makers) > 1 else f"a {makers[0]} stage"
    for s in stages:
        for key, value in s.items():
            if not (isinstance(value, str) and value.startswith("@")):
                continue
            ref = value[1:]
            if key not in REF_KINDS:
                raise ConfigError(f"stage '{s['name']}': {key}: {value} names a stage's output, which only "
                                  f"{', '.join(list(REF_KINDS)[:-1])} and {list(REF_KINDS)[-1]} take")
            made, want = _makes(kinds[ref]), REF_KINDS[key]
            if made != want:
                article = "an" if kinds[ref][0] in "aeiou" else "a"
                makes = "makes no model" if made == "nothing to read" else f"makes a {made}"
                raise ConfigError(f"stage '{s['name']}': {key}: {value} is {article} {kinds[ref]} stage, which "
                                  f"{makes}; {key} takes {takes(want)}")


def _check_top(recipe: dict, numbers: dict[tuple, str], where: str) -> None:
    """The recipe's own keys: a mapping of RECIPE_KEYS, text where text is due, `eval` a mapping."""
    if not isinstance(recipe, dict):
        raise ConfigError(f"{where}: a recipe is a mapping (output_dir, model, eval, stages); "
                          f"got a {type(recipe).__name__}")
    for key in recipe:
        _check_key(key)
    for key in TEXT_KEYS:
        if (key,) in numbers and not isinstance(recipe.get(key), str):
            raise ConfigError(f"{where}: {key}: YAML reads {numbers[(key,)]} as the number {recipe[key]!r}, but "
                              f'{key} is text; quote it to keep it as written: {key}: "{numbers[(key,)]}"')
        if recipe.get(key) is not None and (not isinstance(recipe[key], str) or not recipe[key]):
            raise ConfigError(f"recipe {key}: expected a non-empty string, got {recipe[key]!r}")
    if recipe.get("eval") is not None and not isinstance(recipe["eval"], dict):
        raise ConfigError(f"recipe `eval` block: expected a mapping of EvalConfig fields, got {recipe['eval']!r}")
    per_stage = sorted({"model", "output_dir"} & set(recipe.get("eval") or {}))
    if per_stage:
        raise ConfigError(f"recipe `eval` block: {', '.join(per_stage)} cannot be set there: each model stage is "
                          "evaluated on its own model, into its own eval/ folder")


def validate(recipe: dict, numbers: dict[tuple, str] | None = None, where: str = "recipe") -> list[dict]:
    """Check the whole recipe before anything runs; return its stages with defaults filled in.

    `numbers` (from config.parse.load_yaml) lets a text field refuse a value YAML read as a number.
    """
    numbers = numbers or {}
    _check_top(recipe, numbers, where)
    stages = recipe.get("stages")
    if not isinstance(stages, list) or not stages:
        raise ConfigError("a recipe needs a non-empty `stages` list")
    for i, s in enumerate(stages):
        if not isinstance(s, dict):
            raise ConfigError(f"stage {i + 1} of the recipe is not a mapping of name, type and config fields; "
                              f"got {s!r}")
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
    _check_ref_kinds(stages)
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
            check_names(fields)
            from_dict(cls, {"model": "ref", **fields} if needs_model else fields)
        except (ConfigError, ValueError, TypeError) as e:
            raise ConfigError(f"stage '{s['name']}': {e}") from None
        check_yaml_text(cls, fields, numbers, f"stage '{s['name']}'", ("stages", i))
    if isinstance(recipe.get("eval"), dict):
        check_yaml_text(EvalConfig, recipe["eval"], numbers, "recipe `eval` block", ("eval",))
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
            for key in ("model", "prm_model"):
                if literal.get(key) and literal[key] not in KNOWN_MODELS:  # known names convert on first use
                    resolve_model(literal[key])
            for key in ("dataset", "mix_dataset"):
                if key in literal and not Path(literal[key]).is_file():
                    raise ValueError(f"{key} {literal[key]!r} is not a file")
            if "task" in literal and s is not recipe:
                resolve_task(literal["task"])
        except (ValueError, KeyError) as e:
            raise ConfigError(f"{where}: {e}") from None


def _output(stage_dir: Path, kind: str) -> str:
    if _makes(kind) == "data file":
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


def _read_done(done: Path, name: str) -> dict:
    """A finished stage's record; a file that is not one (torn by a crash or a bad disk) is named."""
    try:
        record = json.loads(done.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        record = e
    if not isinstance(record, dict) or not isinstance(record.get("result"), dict):
        why = record if isinstance(record, Exception) else "not a stage record"
        raise ValueError(f"{done}: unreadable ({why}); delete it to run stage '{name}' again") from None
    return record


def _override(recipe: dict, numbers: dict[tuple, str], overrides: list[str]) -> dict[tuple, str]:
    """Apply `key=value` overrides to `recipe` in place; returns load_yaml's number texts updated to match."""
    for o in overrides:
        key, eq, value = o.partition("=")
        if not eq:
            raise ConfigError(f"cannot read argument {o!r}: expected key=value (one of {', '.join(RECIPE_KEYS)})")
        _check_key(key)
        numbers = {k: v for k, v in numbers.items() if k[0] != key}  # the override replaces the file's value
        if key in TEXT_KEYS:
            recipe[key] = override_value(key, value, text=True)
        else:
            recipe[key], given = load_yaml(value, o)
            numbers.update({(key, *k): v for k, v in given.items()})
    return numbers


def run_recipe(path: str, overrides: list[str] | None = None) -> dict:
    """Run (or resume) a recipe; returns and writes the per-stage evaluation summary."""
    from .eval import run_eval
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"recipe not found: {path}")
    recipe, numbers = load_yaml(p.read_text(), path)
    recipe = {} if recipe is None else recipe
    if not isinstance(recipe, dict):
        validate(recipe, where=path)  # names the problem
    numbers = _override(recipe, numbers, overrides or [])
    stages = validate(recipe, numbers, path)
    root = Path(recipe.get("output_dir") or "runs/recipe")
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
            record = _read_done(done, name)
            print(f"[recipe] {name}: already complete, skipped")
        else:
            print(f"[recipe] {name}: running {kind}")
            t = time.perf_counter()
            result = _run_stage(kind, fields, stage_dir)
            record = {"stage": name, "type": kind, "seconds": round(time.perf_counter() - t, 1),
                      "result": {k: v for k, v in result.items() if isinstance(v, (int, float, str))}}
            if STAGES[kind].makes_model and ev:
                summary = run_eval(EvalConfig(**{"progress_bar": False, **ev, "model": _output(stage_dir, kind),
                                                 "output_dir": str(stage_dir / "eval")}))
                record["eval"] = {k: summary[k] for k in summary if k in ("accuracy", "accuracy_ci95", "format_frac",
                                                                          "len_mean") or k.startswith("accuracy/")}
            atomic_write(done, json.dumps(record, indent=2))  # the marker: all or nothing, never torn
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
