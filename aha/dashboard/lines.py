"""The lines of a run's JSONL files as the dashboard reads them: each parsed on its own, checked for the shape the
pages read, and, when it is not a JSON object of that shape, reported with its file, line number and reason and
skipped, so that one bad line never costs the rest of the file, its run or any other run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

SHOWN_CHARS = 200
"""How much of a bad or partial line is shown."""
SCALAR = (str, int, float, bool, type(None))
TOKEN_LISTS = ("logp", "ratio", "clip", "kl", "loss", "advantage", "model")
"""A completion's per-token values: each a list (or null where not recorded)."""
TURN_LISTS = ("calls", "tool_calls", "dropped_results")
"""An episode turn's lists of calls and results: each a list of objects when present."""
Check = Callable[[dict], "str | None"]


def parse_line(line: bytes, check: Check | None = None) -> tuple[dict | None, str | None]:
    """A line of a run file -> (its object, None), or (None, why it is skipped).

    E.g. b'{"step": 1}' -> ({"step": 1}, None); b'{"step": ' -> (None, "not JSON: Expecting value");
    b'[1]' -> (None, "not a JSON object").
    """
    try:
        row = json.loads(line)
    except RecursionError:
        return None, "not JSON: nested too deep"
    except ValueError as e:
        return None, f"not JSON: {getattr(e, 'msg', e)}"
    if not isinstance(row, dict):
        return None, "not a JSON object"
    problem = check(row) if check is not None else None
    return (None, problem) if problem else (row, None)


def bad_line(path: Path, line: int, at_byte: int, text: bytes, why: str) -> dict:
    """How a skipped line is reported: {"file", "line" (from 1), "at_byte", "error" (file, line and why), "text" (its
    start)}. E.g. {"file": "metrics.jsonl", "line": 2, "error": "metrics.jsonl line 2: not a JSON object", ...}."""
    return {"file": path.name, "line": line, "at_byte": at_byte, "error": f"{path.name} line {line}: {why}",
            "text": text[:SHOWN_CHARS].decode("utf-8", "replace")}


def lines_before(path: Path, offset: int) -> int:
    """How many lines end before byte `offset` (read in blocks: a long file is never held whole)."""
    n = 0
    with open(path, "rb") as f:
        while offset > 0 and (block := f.read(min(offset, 1 << 20))):
            n, offset = n + block.count(b"\n"), offset - len(block)
    return n


def read_jsonl(path: Path, offset: int = 0, check: Check | None = None) -> dict:
    """Whole JSON lines of `path` from byte `offset`: {"rows", "offset" (where the next read starts), "bad"
    (lines that are not a JSON object passing `check`, see bad_line), "partial" (a last line with no newline yet:
    being written, or torn), "reset" (the file shrank below `offset`, e.g. rewritten on resume: read again from 0)}."""
    out: dict = {"rows": [], "offset": offset, "bad": [], "partial": None, "reset": False}
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if offset > size:
                out["reset"], offset = True, 0
            f.seek(offset)
            data = f.read()
    except OSError as e:
        out["error"] = f"{path.name}: {e.strerror or e}"
        return out
    end = data.rfind(b"\n") + 1
    if end < len(data):
        out["partial"] = {"bytes": len(data) - end, "text": data[end:end + SHOWN_CHARS].decode("utf-8", "replace")}
    at, first = offset, None
    for k, line in enumerate(data[:end].split(b"\n")[:-1]):
        row, why = parse_line(line, check)
        if row is not None:
            out["rows"].append(row)
        elif line.strip():
            first = lines_before(path, offset) + 1 if first is None else first  # counted only for a bad line
            out["bad"].append(bad_line(path, first + k, at, line, why))
        at += len(line) + 1
    out["offset"] = offset + end
    return out


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _list_of(value, kind) -> bool:
    return isinstance(value, list) and all(isinstance(v, kind) for v in value)


def step_problem(row: dict) -> str | None:
    """Why a row belongs to no step (a metrics row is no point on the curves): its step must be an integer."""
    return None if _is_int(row.get("step")) else "step is not an integer"


def read_metrics(path: Path, offset: int = 0) -> dict:
    """read_jsonl of a metrics.jsonl: every row a step."""
    return read_jsonl(path, offset, step_problem)


def held_out_problem(row: dict) -> str | None:
    """Why a held_out.jsonl row cannot be a cell of the Aha tracker: an integer step, an id that is one value."""
    return step_problem(row) or (None if isinstance(row.get("id"), SCALAR) else "id is not a string or a number")


def group_problem(group: dict) -> str | None:
    """Why a groups.jsonl record is not of the shape the Groups and Aha pages read, or None.

    E.g. {"completions": "x", ...} -> "completions is not a list of objects"."""
    completions = group.get("completions")
    if not _list_of(completions, dict):
        return "completions is not a list of objects"
    if not _list_of(group.get("reward_names"), str):
        return "reward_names is not a list of strings"
    for i, c in enumerate(completions):
        problem = _completion_problem(c)
        if problem:
            return f"completion {i}: {problem}"
    return None


def _completion_problem(c: dict) -> str | None:
    tokens = c["tokens"] if isinstance(c.get("tokens"), dict) else {}
    turns = c["turns"] if _list_of(c.get("turns"), dict) else []
    wrong = [("text is not a string", not isinstance(c.get("text", ""), str)),
             ("rewards is not a list", not isinstance(c.get("rewards"), list)),
             ("tokens.piece is not a list of strings", not _list_of(tokens.get("piece"), str)),
             *[(f"tokens.{k} is not a list", tokens.get(k) is not None and not isinstance(tokens[k], list))
               for k in TOKEN_LISTS],
             *[(f"{k} is not a list of objects", c.get(k) is not None and not _list_of(c[k], dict))
               for k in ("steps", "turns")],
             *[(f"turns.{k} is not a list of objects", t.get(k) is not None and not _list_of(t[k], dict))
               for t in turns for k in TURN_LISTS]]
    return next((why for why, bad in wrong if bad), None)
