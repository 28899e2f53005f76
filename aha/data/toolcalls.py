"""Tool calling through a chat template: prompts rendered with their tools' schemas, the tokens a tool message adds
to an episode, and the tool calls read back from a model turn.

A model whose own template renders a whole tool-calling conversation (user -> assistant with tool_calls -> tool)
and is prefix-preserving (appending a message never changes how the earlier ones render) keeps it, as TRL does;
any other (SmolLM2-Instruct's, the tiny models' plain ChatML) gets `TOOL_TEMPLATE`: ChatML with the tool-call format
of Hermes and Qwen2.5 (calls written as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, results
in a `tool` turn inside `<tool_response>` tags), its tools listed one per line in the system turn (name, typed
parameters, description) rather than as JSON schemas, so the prompt stays short. Calls are parsed with the
tokenizer's own `response_template` (transformers' `parse_response`) where it has one, else in that Hermes form; a
call whose JSON Python cannot read (nested past the recursion limit, an integer of more than 4,300 digits) or whose
arguments nest deeper than `MAX_ARGUMENT_DEPTH` is a malformed call.

A tool's text is the environment's, not the template's: it is tokenized as plain text, so a `<|im_end|>` a tool
writes is those characters, never the end-of-turn token (only the template's own markers are control tokens).
A result longer than `budget × L` characters (L: the most characters one token covers, aha.data.length) cannot fit
in `budget` tokens; it is cut to that before it is tokenized or logged.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .length import longest_token_chars

TOOL_TEMPLATE = (
    '{%- if tools %}'
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- 'You can call these tools:' }}"
    "{%- for tool in tools %}{%- set fn = tool['function'] if tool['function'] is defined else tool %}"
    "{{- '\\n- ' + fn['name'] + '(' }}"
    "{%- for name, p in fn['parameters']['properties'].items() %}"
    "{{- name + ': ' + (p['type'] if p['type'] is string else p['type'] | join('|')) }}"
    "{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}"
    "{{- '): ' + fn['description'] }}{%- endfor %}"
    '{{- \'\\nCall one with <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>; \' }}'
    "{{- 'its result comes back in <tool_response></tool_response>.<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    '{%- endif %}'
    '{%- for message in messages %}'
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] or [] %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- set fn = call['function'] %}"
    '{{- \'<tool_call>\\n{"name": "\' + fn[\'name\'] + \'", "arguments": \' }}'
    "{{- fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson) }}"
    "{{- '}\\n</tool_call>' }}"
    '{%- endfor %}'
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    '{%- else %}'
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    '{%- endif %}'
    '{%- endfor %}'
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""aha's tool-calling training template: ChatML, a system turn listing each tool on one line (its name, typed
parameters and description: a short prompt, for small models and short contexts), calls and results in the
Hermes / Qwen2.5 tags. Prefix-preserving by construction."""

MAX_ARGUMENT_DEPTH = 64
"""The deepest nesting of lists and objects a tool call's arguments may have: deeper ones could not be copied,
printed or logged within Python's recursion limit."""
CHARS_PER_TOKEN_UNPROVEN = 64
"""Characters per token assumed for cutting a tool result when the tokenizer has no proven bound (aha.data.length)."""
PLAIN = "AHAPLAINTEXT{}END"
"""Stands in for the k-th message's content while its place in the rendered text is found."""
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
OPEN = "<tool_call>"
_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool", "description": "A probe.", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer", "description": "A number."}}, "required": ["x"]}}}
_PROBE = [{"role": "user", "content": "probe question"},
          {"role": "assistant", "content": "", "tool_calls": [
              {"type": "function", "function": {"name": "probe_tool", "arguments": {"x": 7}}}]},
          {"role": "tool", "name": "probe_tool", "content": "probe result 41"},
          {"role": "assistant", "content": "probe answer"}]


@dataclass
class ToolCall:
    """One call a model turn asked for. `error` is set when the call could not be read (malformed JSON, no name)."""

    name: str
    arguments: Any = None
    error: str | None = None

    def message(self) -> dict:
        """The call as an assistant message's tool_calls entry (TRL's form)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    """A model turn's text -> (its content before the first call, its calls), in the Hermes / Qwen2.5 form.

    >>> parse_hermes('Let me add.\\n<tool_call>\\n{"name": "add", "arguments": {"a": 1, "b": 2}}\\n</tool_call>')
    ('Let me add.', [ToolCall(name='add', arguments={'a': 1, 'b': 2}, error=None)])
    """
    start = text.find(OPEN)
    content = text if start < 0 else text[:start].rstrip("\n")
    calls = [_read_call(m.group(1)) for m in CALL.finditer(text)]
    if text.count(OPEN) > len(calls):
        calls.append(ToolCall("", text[text.rfind(OPEN):], "a <tool_call> with no closing </tool_call>"))
    return content, calls


def _read_call(body: str) -> ToolCall:
    """The JSON object inside <tool_call></tool_call>: {"name": str, "arguments": object or its JSON text}."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall("", body.strip(), f"malformed tool call JSON ({e.msg} at character {e.pos})")
    except (ValueError, RecursionError) as e:  # an integer past Python's 4,300 digits; nesting past the stack
        return ToolCall("", body.strip(), f"malformed tool call JSON ({type(e).__name__}: {str(e)[:100]})")
    if depth(call, MAX_ARGUMENT_DEPTH + 1) > MAX_ARGUMENT_DEPTH + 1:  # the call's object, then its arguments
        return too_deep(body.strip())
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall("", call, 'a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            inner = json.loads(arguments)
        except (ValueError, RecursionError):
            inner = arguments
        if too_deep_arguments(inner):
            return too_deep(body.strip())
        arguments = inner
    return ToolCall(call["name"], arguments)


def depth(value: Any, limit: int) -> int:
    """How deep lists and dicts nest in `value` (0 for a scalar), counted level by level (no recursion) and only
    up to limit + 1.

    >>> depth({"a": [1, {"b": []}]}, 64)
    4
    """
    deepest, level = 0, [value]
    while deepest <= limit:
        containers = [x for x in level if isinstance(x, (list, tuple, dict))]
        if not containers:
            break
        deepest += 1
        level = [v for x in containers for v in (x.values() if isinstance(x, dict) else x)]
    return deepest


def too_deep_arguments(arguments: Any) -> bool:
    return depth(arguments, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH


def too_deep(text: str) -> ToolCall:
    return ToolCall("", text, f"malformed tool call: its arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels")


class ToolChat:
    """How one tokenizer writes tool-calling conversations (see the module doc). `template_kwargs` are TRL's
    chat_template_kwargs, passed to every rendering."""

    def __init__(self, tokenizer, template_kwargs: dict | None = None):
        self.tokenizer, self.kwargs, self.template = tokenizer, dict(template_kwargs or {}), None
        specials = {t.content: i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special}
        self.specials = specials
        """A special token's text -> its id: the control tokens only the template may write."""
        self.special_text = re.compile("(" + ("|".join(map(re.escape, sorted(specials, key=len, reverse=True)))
                                              or "(?!)") + ")")
        self.template = None if self._own_template_works() else TOOL_TEMPLATE
        """None: the tokenizer's own template; else aha's TOOL_TEMPLATE."""
        self.parses = self.template is None and getattr(tokenizer, "response_template", None) is not None
        """Tool calls are read by transformers' parse_response (the tokenizer's own response_template)."""

    def render(self, messages: list[dict], tools: list | None = None, generation_prompt: bool = False,
               template: str | None = None) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation_prompt,
                                                  chat_template=template or self.template, **self.kwargs)

    def _own_template_works(self) -> bool:
        """The tokenizer's template renders the probe conversation's tools, call and result, prefix-preserving, and
        writes a tool message's content where it can be tokenized as plain text (encode_plain)."""
        if not getattr(self.tokenizer, "chat_template", None):
            return False
        try:
            full = self.render(_PROBE, [_PROBE_TOOL])
            parts = [self.render(_PROBE[:k], [_PROBE_TOOL]) for k in (2, 3)]
            self.encode_plain(_PROBE[:3], range(2, 3))
        except Exception:  # noqa: BLE001 - a template that cannot render tools does not support them
            return False
        return (full.count("probe_tool") >= 2 and "probe result 41" in full and "7" in full
                and full.startswith(parts[1]) and parts[1].startswith(parts[0]))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[dict], tools: list | None) -> list[int]:
        """An episode's prompt: the chat messages with the tools' schemas, ending with the assistant's header."""
        return self.encode(self.render(messages, tools, generation_prompt=True))

    def tool_suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        """The tokens that follow a model turn ending with its end-of-turn token: the tool messages, then the next
        assistant header. Rendered after a stand-in turn and cut at its last end-of-turn token, as TRL does."""
        stand_in = [{"role": "user", "content": "dummy"},
                    {"role": "assistant", "content": "", "tool_calls": [ToolCall(tool_messages[0]["name"], {}).message()]}]
        prefix = self.encode(self.render(stand_in))
        full = self.encode_plain(stand_in + tool_messages, range(len(stand_in), len(stand_in) + len(tool_messages)))
        eos_id = self.tokenizer.eos_token_id
        eos = [i for i, t in enumerate(prefix) if t == eos_id]
        prefix = prefix[:eos[-1] + 1] if eos else prefix
        if full[:len(prefix)] != prefix:
            raise ValueError("the chat template is not prefix-preserving: a tool message changed the tokens before it")
        return full[len(prefix):]

    def encode_plain(self, messages: list[dict], plain: range) -> list[int]:
        """The tokens of `messages` rendered with the next assistant header, the contents of messages[k] for k in
        `plain` tokenized as plain text: a special token's text written there is its characters, never its id. The
        text is split at the template's own special tokens (as the tokenizer splits it) and every other span is
        tokenized with special tokens off, so text without special tokens gets the tokens it always had."""
        marked = [{**m, "content": PLAIN.format(k)} if k in plain else m for k, m in enumerate(messages)]
        whole = self.render(marked, generation_prompt=True)
        pieces = re.split(PLAIN.format(r"(\d+)"), whole)  # template text, k, template text, k, ...
        if sorted(int(k) for k in pieces[1::2]) != list(plain):
            raise ValueError("the chat template does not write each tool message's content once")
        real, where = self.render(messages, generation_prompt=True), range(1, len(pieces), 2)
        written = {j: messages[int(pieces[j])]["content"] for j in where}  # as given: what most templates write
        if "".join(written.get(j, p) for j, p in enumerate(pieces)) != real:
            written = {j: self._written(messages, marked, whole, int(pieces[j])) for j in where}
            if "".join(written.get(j, p) for j, p in enumerate(pieces)) != real:
                raise ValueError("the chat template renders tool messages' contents depending on each other")
        spans, controls = [""], []  # plain text, control token, plain text, ...
        for j, piece in enumerate(pieces):
            for i, part in enumerate([written[j]] if j in written else self.special_text.split(piece)):
                if i % 2:  # a control token the template wrote
                    spans, controls = spans + [""], controls + [self.specials[part]]
                else:
                    spans[-1] += part
        plain = self.tokenizer(spans, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return [t for k, span in enumerate(plain) for t in span + controls[k:k + 1]]

    def _written(self, messages: list[dict], marked: list[dict], whole: str, k: int) -> str:
        """How the template writes messages[k]'s content (quoted as JSON, say): rendered alone among stand-ins."""
        one = self.render([messages[k] if i == k else m for i, m in enumerate(marked)], generation_prompt=True)
        before, after = whole.split(PLAIN.format(k))
        if not (one.startswith(before) and one.endswith(after) and len(one) >= len(before) + len(after)):
            raise ValueError("the chat template renders a tool message's content differently beside others")
        return one[len(before):len(one) - len(after)]

    def fit(self, text: str, tokens: int) -> tuple[str, bool]:
        """`text`, or its first tokens × L characters when it has more (then it cannot fit in `tokens` tokens: see
        the module doc; L characters at least), and whether it was cut. Nothing is tokenized."""
        limit = max(tokens, 1) * (longest_token_chars(self.tokenizer) or CHARS_PER_TOKEN_UNPROVEN)
        return (text, False) if len(text) <= limit else (text[:limit], True)

    def demonstration(self, messages: list[dict], prompt_messages: int, tools: list | None) -> dict:
        """A whole tool-calling conversation as an SFT row: the prompt (its first `prompt_messages` messages, with
        the assistant header) as text, and the rest as segments: each assistant turn with its end-of-turn token
        (trained), each run of tool messages with the next assistant header (read, not trained). The last turn's
        end-of-turn token is the EOS the SFT trainer appends."""
        done = self.render(messages[:prompt_messages], tools, generation_prompt=True)
        prompt, segments, i, eot = done, [], prompt_messages, "<|im_end|>"
        while i < len(messages):
            turn = self.render(messages[:i + 1], tools)[len(done):]
            j = next((k for k in range(i + 1, len(messages)) if messages[k]["role"] != "tool"), len(messages))
            text = turn[:turn.rindex(eot) + (len(eot) if j > i + 1 else 0)]
            segments.append({"text": text, "train": True})
            if j == i + 1:
                break
            after = self.render(messages[:j], tools, generation_prompt=True)
            segments.append({"text": after[len(done) + len(text):], "train": False})
            done, i = after, j
        return {"prompt": prompt, "completion": segments}

    def parse(self, ids: list[int], prefix_ids: list[int], tools: list | None) -> tuple[str, list[ToolCall]]:
        """A model turn's token ids -> (content, calls)."""
        if self.parses:
            try:
                msg = self.tokenizer.parse_response(ids, prefix=prefix_ids, tools=tools)
                calls = [ToolCall(c["function"]["name"], c["function"].get("arguments", {}))
                         for c in msg.get("tool_calls") or []]
                return msg.get("content") or "", [too_deep(c.name) if too_deep_arguments(c.arguments) else c
                                                  for c in calls]
            except Exception:  # noqa: BLE001 - e.g. malformed JSON: read it again in the Hermes form, which says why
                pass
        return parse_hermes(self.tokenizer.decode(ids, skip_special_tokens=True))
