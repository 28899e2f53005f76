"""Flat dataclass configs: YAML files plus `key=value` overrides, `--help` from field docstrings.

Each stage has one flat dataclass whose fields carry a one-line docstring (a string literal right
after the field). `parse_args(Cls, argv)` reads `[CONFIG.yaml] [key=value ...]`, checks every key
and type, and returns the instance; unknown keys get a "did you mean" suggestion.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import json
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .trl import translate




def field_docs(cls) -> dict[str, str]:
    """Field name -> the docstring literal written right after it in the class body."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """Check `value` against the field's type hint; accept ints for floats and scalars for lists."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(name, value, arg)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{name}: bad value {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{name}: {value!r} is not one of {list(args)}")
        return value
    if origin in (list, tuple):
        items = value if isinstance(value, (list, tuple)) else [value]
        return [_coerce(name, v, args[0] if args else Any) for v in items]
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        return value
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected true/false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads "1e-6" as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    return value


def _check_key(cls, key: str) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    if key not in names:
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"unknown config key '{key}' for {cls.__name__}{hint}")


def checked(cls):
    """Class decorator (after @dataclass): the one validation path for Python, YAML and the command line.

    `cls(learning_rat=1)` raises a ConfigError that suggests `learning_rate` instead of Python's bare
    TypeError, and `cls(report_to="none")` is coerced and type-checked like `report_to=none` on the
    command line, so a wrong value fails here, before any model is loaded.
    """
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        hints = typing.get_type_hints(type(self))
        kwargs = translate(kwargs, {f.name for f in dataclasses.fields(type(self))})  # TRL's names
        for key in kwargs:
            _check_key(type(self), key)
        init(self, *args, **{k: _coerce(k, v, hints[k]) for k, v in kwargs.items()})

    cls.__init__ = __init__
    return cls


def from_dict(cls, values: dict[str, Any]):
    """Build `cls` from a flat mapping, checking names and types."""
    return cls(**values)


def parse_args(cls, argv: list[str]):
    """`[CONFIG.yaml] [key=value ...]` -> an instance of `cls` (later values win)."""
    values: dict[str, Any] = {}
    for arg in argv:
        if "=" in arg:
            key, _, raw = arg.partition("=")
            values[key.strip()] = yaml.safe_load(raw) if raw != "" else ""
        elif arg.endswith((".yaml", ".yml")):
            path = Path(arg)
            if not path.is_file():
                raise ConfigError(f"config file not found: {arg}")
            loaded = yaml.safe_load(path.read_text()) or {}
            if not isinstance(loaded, dict):
                raise ConfigError(f"{arg}: expected a mapping of key: value at the top level")
            values.update(loaded)
        else:
            raise ConfigError(f"cannot read argument {arg!r}: expected CONFIG.yaml or key=value")
    return from_dict(cls, values)


def _type_name(hint: Any) -> str:
    """`Literal['a', 'b']` -> "one of a, b"; `Optional[int]` -> "int or null"; `list[str]` -> "list of str"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None)) + (
            " or null" if type(None) in args else "")
    if origin in (list, tuple):
        return "list of " + _type_name(args[0]) if args else "list"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def help_text(cls) -> str:
    """Every field with its type, default and docstring."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    lines = [f"{cls.__name__} fields (set in YAML or as key=value):", ""]
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "required")
        hint = _type_name(hints[f.name])
        lines.append(f"  {f.name} ({hint}, default {json.dumps(default, default=str)})")
        lines.append(f"      {docs.get(f.name, '')}")
    return "\n".join(lines)


def save_config(cfg, path: Path) -> None:
    """Write the effective config as YAML (what the run actually used)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
