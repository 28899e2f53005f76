"""Tools as TRL takes them: plain sync or async functions, or an environment's public methods, with type hints and
a Google-style docstring; the schema the model sees is transformers' `get_json_schema` of each.

Calling one never raises and never hangs. What the model gets back is always a tool message: the result as text
(`str()` of a value that is not a string, as TRL does), or TRL's error form `{'error': '...'}` when the call was
malformed, named no tool of the episode, had arguments the schema refuses (a missing or unexpected name, a value of
the wrong type), raised, returned something `str()` cannot take, or ran past `tool_timeout` (a sync tool runs on a
daemon thread that is abandoned then; an async one is cancelled). Each outcome is counted (`OUTCOMES`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from ..data.toolcalls import ToolCall
from ..rewards.deadline import RewardTimeout
from ..rewards.scoring import call_on_thread, start_async

OUTCOMES = ("ok", "malformed", "unknown", "bad_arguments", "raised", "bad_result", "timeout")
"""What a call can come to; all but ok and timeout count in tools/errors."""
JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer(),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, (list, tuple)),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}
"""A JSON-schema type -> whether a value is of it (a whole float is an integer, as JSON writes 3.0)."""


def tool_schema(fn: Callable) -> dict:
    """The JSON schema the model is shown (transformers' get_json_schema); a tool without type hints or a Google
    docstring is an error naming it."""
    from transformers.utils import get_json_schema
    try:
        return get_json_schema(fn)
    except Exception as e:  # DocstringParsingException, TypeHintParsingException
        raise ValueError(f"tool {getattr(fn, '__name__', fn)!r}: {e} (a tool needs type hints and a Google-style "
                         "docstring with an Args: section, as TRL and transformers require)") from e


def error_message(text: str) -> str:
    """A failed call's tool message, in TRL's form: str({'error': text})."""
    return str({"error": text})


@dataclass
class ToolResult:
    name: str
    content: str         # the tool message's text: what the model reads next
    outcome: str         # one of OUTCOMES
    non_string: bool = False  # the tool returned a value that is not a string (given to the model as its str())

    def message(self) -> dict:
        return {"role": "tool", "name": self.name, "content": self.content}


def check_arguments(schema: dict, arguments: Any) -> tuple[dict | None, str | None]:
    """(the arguments to call with, None) or (None, why the schema refuses them). Whole floats given for integer
    parameters become ints."""
    if not isinstance(arguments, dict):
        return None, f"arguments must be a JSON object, got {type(arguments).__name__} {arguments!r:.60}"
    params = schema["function"].get("parameters", {})
    props, name = params.get("properties", {}), schema["function"]["name"]
    extra = [k for k in arguments if k not in props]
    missing = [k for k in params.get("required", []) if k not in arguments]
    if extra or missing:
        return None, (f"{name} takes ({', '.join(props)})" + (f"; unexpected {extra}" if extra else "")
                      + (f"; missing {missing}" if missing else ""))
    out = {}
    for key, value in arguments.items():
        kinds = props[key].get("type", [])
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if props[key].get("nullable"):
            kinds.append("null")
        if kinds and not any(JSON_TYPES.get(k, lambda v: True)(value) for k in kinds):
            return None, f"argument {key!r} of {name} must be {' or '.join(kinds)}, got {type(value).__name__} {value!r:.40}"
        out[key] = int(value) if kinds == ["integer"] and isinstance(value, float) else value
    return out, None


class Toolbox:
    """The tools of one episode by name (standalone tools, then its environment's methods), each call bounded by
    `timeout_s`."""

    def __init__(self, tools: list[Callable], timeout_s: float, schemas: list[dict] | None = None):
        self.tools = {fn.__name__: fn for fn in tools}
        self.schemas = schemas if schemas is not None else [tool_schema(fn) for fn in tools]
        self.by_name = {s["function"]["name"]: s for s in self.schemas}
        self.timeout_s = timeout_s

    def call(self, call: ToolCall) -> ToolResult:
        """The tool message for one call (see the module doc); never raises."""
        if call.error is not None:
            return ToolResult(call.name or "invalid", error_message(call.error), "malformed")
        if call.name not in self.tools:
            return ToolResult(call.name, error_message(f"Tool {call.name} not found. Available: {sorted(self.tools)}"),
                              "unknown")
        kwargs, why = check_arguments(self.by_name[call.name], call.arguments)
        if why is not None:
            return ToolResult(call.name, error_message(why), "bad_arguments")
        outcome = self._run(self.tools[call.name], kwargs)
        if isinstance(outcome, RewardTimeout):
            return ToolResult(call.name, error_message(f"{call.name} ran past tool_timeout={self.timeout_s:g} s"),
                              "timeout")
        if isinstance(outcome, BaseException):
            return ToolResult(call.name, error_message(str(outcome) or type(outcome).__name__), "raised")
        if isinstance(outcome, str):
            return ToolResult(call.name, outcome, "ok")
        try:
            return ToolResult(call.name, str(outcome), "ok", non_string=True)
        except Exception as e:  # noqa: BLE001 - a result whose __str__ raises
            return ToolResult(call.name, error_message(f"{call.name} returned a {type(outcome).__name__} that "
                                                       f"cannot be written as text ({e})"), "bad_result")

    def _run(self, fn: Callable, kwargs: dict) -> Any:
        """fn(**kwargs): its value, what it raised, or RewardTimeout past the limit."""
        if inspect.iscoroutinefunction(fn):
            return start_async([(fn, kwargs)], self.timeout_s)()[0]
        return call_on_thread(fn, self.timeout_s, kwargs, name="aha-tool-call")
