"""What the dashboard reads from run directories, read-only and defensively: a run being written, a torn last
line or a file that is not JSON is reported as such, never raised.

Runs are known by an id (a name, not a path); files are served only from inside a known run's directory.
Links are followed only where their real path stays inside: a run folder under the runs root that links out
of it is neither listed nor searched, and a run file that links out of its run is treated as absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from pathlib import Path

import yaml

from ..behaviour import first_fixes, phrase_pattern
from .lines import (SHOWN_CHARS, bad_line, group_problem, held_out_problem, parse_line, read_jsonl, read_metrics,
                    step_problem)
from .text import prompt_text

METRICS = "metrics.jsonl"
GROUPS = "groups.jsonl"
HELD_OUT = "held_out.jsonl"
RUN_MARKERS = ("metrics.jsonl", "config.yaml", "demo_config.yaml")
"""A directory holding one of these is a run."""
SEARCH_DEPTH = 3
"""How deep under the runs root runs are looked for (runs/demo/grpo is depth 2)."""
HEADLINE_KEYS = ("reward/mean", "eval/accuracy", "completion/len_mean", "behaviour/reflection_rate", "perf/step_s")
CONFIG_KEYS = ("model", "task", "num_generations", "learning_rate", "beta", "epsilon", "loss_type",
               "advantage_estimator", "max_steps")
_STEP_PREFIX = re.compile(rb'^\{"step": (\d+)')


class RunRegistry:
    """Run id -> directory. Fixed directories, or every run found under a root (looked up again on each list).

    A fixed directory that holds runs shows them all (`aha dashboard runs/demo` lists demo/sft and demo/grpo),
    and the directory itself when it is a run too."""

    def __init__(self, dirs: list[str | Path] | None = None, root: str | Path = "runs"):
        self.fixed = [Path(d).resolve() for d in dirs or []]
        self.root = Path(root).resolve()
        self.extra: dict[str, Path] = {}
        """Runs added while serving (playground runs)."""
        self.lock = threading.Lock()

    def runs(self) -> dict[str, Path]:
        found: dict[str, Path] = {}
        if self.fixed:
            names: set[str] = set()
            for d in self.fixed:
                name, n = d.name, 1
                while name in names:
                    n += 1
                    name = f"{d.name}-{n}"
                names.add(name)
                found.update(runs_in(d, name))
        elif self.root.is_dir():
            for d in sorted(_find_runs(self.root, SEARCH_DEPTH, self.root)):
                found[d.relative_to(self.root).as_posix()] = _real(d)
        with self.lock:
            return {**found, **self.extra}

    def empty(self) -> list[str]:
        """The fixed directories that hold no run (yet): a typo, a run not started, or a folder of something else."""
        return [str(d) for d in self.fixed if not any(is_run(p) for p in runs_in(d, d.name).values())]

    def add(self, run_id: str, path: Path) -> None:
        with self.lock:
            self.extra[run_id] = path.resolve()

    def get(self, run_id: str) -> Path | None:
        return self.runs().get(run_id)


def is_run(path: Path) -> bool:
    return any(safe_file(path, m) for m in RUN_MARKERS)


def runs_in(folder: Path, name: str) -> dict[str, Path]:
    """The runs in a folder given by name: itself when it is a run, and every run nested in it (depth
    SEARCH_DEPTH), as `name/relative/path`; links out of the folder are not followed."""
    nested = sorted(_find_runs(folder, SEARCH_DEPTH, _real(folder))) if folder.is_dir() else []
    out = {name: _real(folder)} if is_run(folder) or not nested else {}  # an empty folder is watched: a run may start
    out.update({f"{name}/{d.relative_to(folder).as_posix()}": _real(d) for d in nested})
    return out


def _real(path: Path) -> Path:
    """The path with every link followed (a link loop is left unresolved, never raised)."""
    return Path(os.path.realpath(path))


def _find_runs(root: Path, depth: int, real_root: Path) -> list[Path]:
    """Run folders under `root` as found (ids come from these); one whose real path leaves `real_root` is skipped."""
    out = []
    try:
        children = [c for c in root.iterdir() if c.is_dir() and not c.name.startswith((".", "checkpoint-"))
                    and _real(c).is_relative_to(real_root)]
    except OSError:
        return out
    for c in children:
        if is_run(c):
            out.append(c)
        if depth > 1 and c.name not in ("model", "tensorboard"):
            out.extend(_find_runs(c, depth - 1, real_root))
    return out


def safe_file(run_dir: Path, rel: str) -> Path | None:
    """The real path of `rel` inside `run_dir`, or None when it is not a file there (.., an absolute path, a link
    out)."""
    if not rel or "\x00" in rel or os.path.isabs(rel):
        return None
    target = _real(run_dir / rel)
    return target if target.is_relative_to(_real(run_dir)) and target.is_file() else None


def read_config(run_dir: Path) -> dict:
    """The run's saved config (config.yaml or demo_config.yaml); {"error": ...} when it cannot be read."""
    for name in ("config.yaml", "demo_config.yaml"):
        path = safe_file(run_dir, name)
        if path is not None:
            try:
                data = yaml.safe_load(path.read_text())
                return data if isinstance(data, dict) else {"error": f"{name} is not a mapping"}
            except (OSError, yaml.YAMLError, UnicodeDecodeError, RecursionError) as e:
                return {"error": f"{name}: {e}"}
    return {}


def columns(rows: list[dict]) -> dict:
    """Rows of {"step", key: value} -> {"step": [...], "series": {key: [...]}}, None where a row lacks the key."""
    keys = sorted({k for r in rows for k, v in r.items() if k != "step" and (v is None or isinstance(v, (int, float)))})
    steps = [r.get("step") for r in rows]
    series = {k: [v if isinstance(v := r.get(k), (int, float)) and not isinstance(v, bool) else None for r in rows]
              for k in keys}
    return {"step": steps, "series": series}


def summary(run_id: str, run_dir: Path, read=read_metrics) -> dict:
    """One line of the Runs page: config highlights, steps, last value of each headline metric. `read(path,
    offset)` reads the metrics (a MetricsCache's read shares the parse with the Curves page)."""
    cfg = read_config(run_dir)
    last: dict = {}
    steps = 0
    metrics = safe_file(run_dir, METRICS)
    if metrics is not None:
        got = read(metrics, 0)
        for row in got["rows"]:
            steps = max(steps, row.get("step", 0) if isinstance(row.get("step"), int) else 0)
            last.update({k: row[k] for k in HEADLINE_KEYS if isinstance(row.get(k), (int, float))})
        if got["bad"] or got["partial"]:
            last["_note"] = f"{len(got['bad'])} bad line(s)" + (", a partial last line" if got["partial"] else "")
    return {"id": run_id, "path": str(run_dir), "config": {k: cfg[k] for k in CONFIG_KEYS if k in cfg},
            "config_error": cfg.get("error"), "steps": steps, "last": last, "stage": stage(run_dir, cfg),
            "updated": _mtime(metrics), "has_metrics": metrics is not None,
            "has_groups": safe_file(run_dir, GROUPS) is not None, "files": _files(run_dir)}


def stage(run_dir: Path, cfg: dict) -> str:
    """What kind of run this is, for the Runs page: a recipe stage's type (done.json), "demo" for the demo's folder,
    "grpo" or "sft" from the saved config's fields, else ""."""
    done = safe_file(run_dir, "done.json")
    if done is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError, RecursionError):
            return str(json.loads(done.read_text()).get("type") or "")
    if safe_file(run_dir, "demo_config.yaml"):
        return "demo"
    return "grpo" if "num_generations" in cfg else "sft" if "learning_rate" in cfg else ""


def _mtime(path: Path | None) -> float | None:
    try:
        return path.stat().st_mtime if path is not None else None
    except OSError:
        return None


DIFF_SKIPPED = ("output_dir",)
"""Config keys that differ between any two runs and say nothing about them."""


def config_diff(configs: dict[str, dict]) -> dict:
    """Run id -> config, to {"differ": {key: [each run's value]}, "same": number of equal keys, "errors": {id: ...}}.
    A key a run lacks counts as a difference (None for it)."""
    errors = {i: c["error"] for i, c in configs.items() if "error" in c}
    keys = sorted({k for c in configs.values() for k in c if k != "error"})
    values = {k: [c.get(k) for c in configs.values()] for k in keys}
    differ = {k: v for k, v in values.items() if any(x != v[0] for x in v)}
    return {"runs": list(configs), "differ": {k: v for k, v in differ.items() if k not in DIFF_SKIPPED},
            "same": len(keys) - len(differ), "errors": errors}


SERVED_FILES = {".json": "application/json", ".md": "text/plain; charset=utf-8", ".png": "image/png",
                ".yaml": "text/plain; charset=utf-8"}
"""The run files the Runs page links, each with the type it is served as: /api/file serves these types only."""
SHOWN_INLINE = (".png",)
"""Served to be shown in a tab (an image, under a sandbox); every other type is served as a download."""


def _files(run_dir: Path) -> list[str]:
    try:
        return sorted(p.name for p in run_dir.iterdir()
                      if (real := safe_file(run_dir, p.name)) is not None and real.suffix in SERVED_FILES)
    except OSError:
        return []


class GroupIndex:
    """Step -> (byte offset, line number) of its lines in groups.jsonl, extended as the file grows (each line read
    once); a line that names no step is kept as a bad line (lines.bad_line)."""

    def __init__(self):
        self.cache: dict[Path, tuple[int, int, dict[int, list[tuple[int, int]]], list[dict]]] = {}
        self.lock = threading.Lock()

    def read(self, path: Path) -> tuple[dict[int, list[tuple[int, int]]], list[dict]]:
        """(step -> [(byte offset, line number)], the bad lines of no step), read on from where the last read ended."""
        with self.lock:
            done, count, index, bad = self.cache.get(path, (0, 0, {}, []))
            try:
                if path.stat().st_size < done:
                    done, count, index, bad = 0, 0, {}, []
                with open(path, "rb") as f:
                    f.seek(done)
                    for line in f:
                        if not line.endswith(b"\n"):
                            break
                        count += 1
                        step = _step_of(line) if line.strip() else None
                        if isinstance(step, int):
                            index.setdefault(step, []).append((done, count))
                        elif step is not None:
                            bad.append(bad_line(path, count, done, line.rstrip(b"\n"), step))
                        done += len(line)
            except OSError:
                return {}, []
            self.cache[path] = (done, count, index, bad)
            return index, bad

    def steps(self, path: Path) -> dict[int, list[tuple[int, int]]]:
        return self.read(path)[0]

    def groups(self, path: Path, step: int) -> list[dict]:
        """The records of `step`; one that is not JSON or not of the pages' shape is its bad_line instead."""
        out = []
        with contextlib.suppress(OSError), open(path, "rb") as f:
            for at, n in self.steps(path).get(step, []):
                f.seek(at)
                line = f.readline().rstrip(b"\n")
                row, why = parse_line(line, group_problem)
                out.append(row if row is not None else bad_line(path, n, at, line, why))
        return out


def _step_of(line: bytes) -> int | str:
    """The step of a groups.jsonl line (read from its first bytes as json.dumps writes them), or why it has none."""
    m = _STEP_PREFIX.match(line)
    if m:
        return int(m.group(1))
    row, why = parse_line(line, step_problem)
    return row["step"] if row is not None else why


def reflection_by_step(path: Path | None, phrases: list[str], index: GroupIndex) -> tuple[list[dict], list[dict]]:
    """For each recorded step: recorded completions, how many hold a reflection phrase, and the first one; and the
    bad lines of the file (by line number), whose completions are not counted."""
    pattern, out, bad = phrase_pattern(phrases), [], []
    if path is None or not path.is_file():
        return out, bad
    steps, bad = index.read(path)
    for step in sorted(steps):
        groups = index.groups(path, step)
        bad = bad + [g for g in groups if "error" in g]
        texts = [c.get("text", "") for g in groups if "error" not in g for c in g["completions"]]
        hits = [t for t in texts if pattern.search(t)]
        out.append({"step": step, "completions": len(texts), "reflective": len(hits),
                    "example": hits[0][:SHOWN_CHARS] if hits else None})
    return out, sorted(bad, key=lambda b: b["line"])


class MetricsCache:
    """The parsed rows of each metrics file up to the byte offset read so far, so that opening a long run again
    parses only what was appended since (a file that shrank, rewritten on resume, is read afresh)."""

    def __init__(self):
        self.cache: dict[Path, tuple[int, list[dict], list[dict]]] = {}
        self.lock = threading.Lock()

    def read(self, path: Path, offset: int) -> dict:
        """As read_metrics(path, offset); served from the cache when `offset` is 0."""
        if offset:
            return read_metrics(path, offset)
        with self.lock:
            done, rows, bad = self.cache.get(path, (0, [], []))
            got = read_metrics(path, done)
            if got["reset"]:
                done, rows, bad = 0, [], []
                got = read_metrics(path, 0)
            rows, bad = rows + got["rows"], bad + got["bad"]
            self.cache[path] = (got["offset"], rows, bad)
            return {**got, "rows": rows, "bad": bad, "reset": False}


def held_out_table(path: Path | None) -> dict:
    """held_out.jsonl -> {"steps": [...], "problems": [{id, prompt, answer, by_step: {step: {greedy, correct}}}]},
    the same problems answered at each evaluation, side by side."""
    got = read_jsonl(path, 0, held_out_problem) if path is not None and path.is_file() else {"rows": [], "bad": []}
    steps, problems = set(), {}
    for row in got["rows"]:
        steps.add(row["step"])
        key = str(row.get("id"))
        entry = problems.setdefault(key, {"id": row.get("id"), "prompt": row.get("prompt"), "answer": row.get("answer"),
                                          "prompt_text": prompt_text(row.get("prompt")), "by_step": {}})
        entry["by_step"][str(row["step"])] = {"greedy": row.get("greedy"), "correct": row.get("correct")}
    return {"steps": sorted(steps), "problems": list(problems.values()), "bad": got["bad"]}


def aha_moments(path: Path | None) -> dict:
    """held_out.jsonl -> the problems a reflection fixed (aha.behaviour.first_fixes: the first evaluation whose
    greedy answer is right through a "wait" after an earlier evaluation answered it wrong), each with the last wrong
    answer before it. {"checked": whether the answers say what their reflection did (runs of `aha demo aha`),
    "moments": [{id, prompt_text, answer, step, before: {step, greedy}, after: {step, greedy}}] by step, the first
    being the run's aha moment}.

    E.g. problem 7 answered "5" at step 0 and "so 3 check: ... wait 4" (right) at step 10 -> one moment at step 10.
    """
    rows = read_jsonl(path, 0, held_out_problem)["rows"] if path is not None and path.is_file() else []
    rows = sorted((r for r in rows if isinstance(r.get("step"), int) and "id" in r), key=lambda r: r["step"])
    by_problem: dict = {}
    for r in rows:
        by_problem.setdefault(r["id"], []).append(r)
    moments = []
    for key, step in sorted(first_fixes(rows).items(), key=lambda kv: kv[1]):
        after = next(r for r in by_problem[key] if r["step"] == step)
        before = [r for r in by_problem[key] if r["step"] < step and not r.get("correct")][-1]
        moments.append({"id": key, "prompt_text": prompt_text(after.get("prompt")), "answer": after.get("answer"),
                        "step": step, "before": {"step": before["step"], "greedy": before.get("greedy")},
                        "after": {"step": step, "greedy": after.get("greedy")}})
    return {"checked": any("corrects" in r for r in rows), "moments": moments}
