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


def did_you_mean(key: str, names) -> str:
    """"; did you mean 'x'?" for the closest of `names`, or ""."""
    close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else ""


def _unknown_keys(cls, keys) -> list[str]:
    """One message per key that is not a field of `cls`, with the closest field name."""
    names = [f.name for f in dataclasses.fields(cls)]
    return [f"unknown config key '{key}' for {cls.__name__}{did_you_mean(key, names)}" for key in keys
            if key not in names]


def report(problems: list[str]) -> None:
    """Raise one ConfigError for every problem found in a config (none: nothing)."""
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} config keys are not taken:\n  " + "\n  ".join(problems))


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
        kwargs, refused = translate(kwargs, {f.name for f in dataclasses.fields(type(self))})  # TRL's names
        report(refused + _unknown_keys(type(self), kwargs))
        init(self, *args, **{k: _coerce(k, v, hints[k]) for k, v in kwargs.items()})

    cls.__init__ = __init__
    return cls


def from_dict(cls, values: dict[str, Any]):
    """Build `cls` from a flat mapping, checking names and types."""
    check_names(values)
    return cls(**values)


def check_names(values: dict) -> None:
    """Every key is a name (YAML reads `1: x` with the int key 1)."""
    for key in values:
        if not isinstance(key, str):
            raise ConfigError(f"config keys are names; got {key!r}")


def load_yaml(text: str, where: str) -> tuple[Any, dict[tuple, str]]:
    """Parse YAML text from `where` (a file or a `key=value` override, named in the error).

    Returns the data and, for every scalar YAML read as a number because it was not quoted, its
    path (keys and list indices) -> its text as written, so a text field can refuse `0123` (83).
    """
    loader = yaml.SafeLoader(text)  # one parse: the node tree gives both the data and each number's text
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML{_yaml_problem(e)}") from None
    finally:
        loader.dispose()
    return data, dict(_number_texts(node))


def _yaml_problem(e: yaml.YAMLError) -> str:
    """" at line 3, column 1: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence
    that starts at line 2)" from PyYAML's several-line message."""
    if not isinstance(e, yaml.MarkedYAMLError):
        return f": {e}"
    mark, out = e.problem_mark, ""
    if mark is not None:
        out += f" at line {mark.line + 1}, column {mark.column + 1}"
    out += f": {e.problem or e}"
    if e.context:
        started = f" that starts at line {e.context_mark.line + 1}" if e.context_mark is not None else ""
        out += f" ({e.context}{started})"
    return out


_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def _number_texts(node, path: tuple = ()):
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                yield from _number_texts(value, path + (key.value,))
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            yield from _number_texts(value, path + (i,))
    elif isinstance(node, yaml.ScalarNode) and node.tag in _NUMBER_TAGS and node.style is None:
        yield path, node.value


def _is_text(hint: Any) -> bool:
    """The field is `str` or `Optional[str]`."""
    if hint is str:
        return True
    return (typing.get_origin(hint) in (typing.Union, types.UnionType)
            and set(typing.get_args(hint)) == {str, type(None)})


def _text_fields(cls) -> set[str]:
    hints = typing.get_type_hints(cls)
    return {f.name for f in dataclasses.fields(cls) if _is_text(hints[f.name])}


def check_yaml_text(cls, values: dict, numbers: dict[tuple, str], where: str, path: tuple = ()) -> None:
    """Refuse a value YAML read as a number (`0123` is 83, `12:30` is 750, `1_000` is 1000) for a text
    field of `cls`: `numbers` is load_yaml's, `path` where `values` sits in that document."""
    text = _text_fields(cls)
    for key, value in values.items():
        raw = numbers.get(path + (key,))
        if key in text and raw is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ConfigError(f"{where}: {key}: YAML reads {raw} as the number {value!r}, but {key} is text; "
                              f'quote it to keep it as written: {key}: "{raw}"')


def override_value(key: str, raw: str, text: bool) -> Any:
    """The value of a `key=raw` override. A text field (`text`) keeps `raw` as written (`output_dir=0123`
    is "0123", not YAML's octal 83; `run_name=12:30` is not 750), except a quoted value (the text inside),
    `null`/`~` (None) and true/false/yes/no (a boolean, which the field refuses: `--output_dir` with no
    value arrives as `output_dir=true`). Any other field's value is read as YAML (`[a, b]`, `{k: v}`, 1e-6)."""
    if raw == "":
        return ""
    if text and not (len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\""):
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            return raw
        return value if value is None or isinstance(value, bool) else raw
    return load_yaml(raw, f"{key}={raw}")[0]


def parse_args(cls, argv: list[str]):
    """`[CONFIG.yaml] [key=value ...]` -> an instance of `cls` (later values win)."""
    values: dict[str, Any] = {}
    text = _text_fields(cls)
    for arg in argv:
        if "=" in arg:
            key, _, raw = arg.partition("=")
            key = key.strip()
            values[key] = override_value(key, raw, key in text)
        elif arg.endswith((".yaml", ".yml")):
            path = Path(arg)
            if not path.is_file():
                raise ConfigError(f"config file not found: {arg}")
            loaded, numbers = load_yaml(path.read_text(), arg)
            loaded = {} if loaded is None else loaded
            if not isinstance(loaded, dict):
                raise ConfigError(f"{arg}: expected a mapping of key: value at the top level")
            try:
                check_names(loaded)
            except ConfigError as e:
                raise ConfigError(f"{arg}: {e}") from None
            check_yaml_text(cls, loaded, numbers, arg)
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
