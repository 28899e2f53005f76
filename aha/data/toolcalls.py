"""Tool calling through a chat template: prompts rendered with their tools' schemas, the tokens a tool message adds
to an episode, and the tool calls read back from a model turn.

A model whose own template renders a whole tool-calling conversation (user -> assistant with tool_calls -> tool)
and is prefix-preserving (appending a message never changes how the earlier ones render) keeps it, as TRL does;
any other (SmolLM2-Instruct's, the tiny models' plain ChatML) gets `TOOL_TEMPLATE`: ChatML with the tool-call format
of Hermes and Qwen2.5 (calls written as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, results
in a `tool` turn inside `<tool_response>` tags), its tools listed one per line in the system turn (name, typed
parameters, description) rather than as JSON schemas, so the prompt stays short. Calls are parsed with the tokenizer's own `response_template` (transformers'
`parse_response`) where it has one, else in that Hermes form.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

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
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall("", call, 'a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return ToolCall(call["name"], arguments)


class ToolChat:
    """How one tokenizer writes tool-calling conversations (see the module doc). `template_kwargs` are TRL's
    chat_template_kwargs, passed to every rendering."""

    def __init__(self, tokenizer, template_kwargs: dict | None = None):
        self.tokenizer, self.kwargs, self.template = tokenizer, dict(template_kwargs or {}), None
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
        """The tokenizer's template renders the probe conversation's tools, call and result, prefix-preserving."""
        if not getattr(self.tokenizer, "chat_template", None):
            return False
        try:
            full = self.render(_PROBE, [_PROBE_TOOL])
            parts = [self.render(_PROBE[:k], [_PROBE_TOOL]) for k in (2, 3)]
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
        full = self.encode(self.render(stand_in + tool_messages, generation_prompt=True))
        eos = [i for i, t in enumerate(prefix) if t == self.tokenizer.eos_token_id]
        prefix = prefix[:eos[-1] + 1] if eos else prefix
        if full[:len(prefix)] != prefix:
            raise ValueError("the chat template is not prefix-preserving: a tool message changed the tokens before it")
        return full[len(prefix):]

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
                return msg.get("content") or "", calls
            except Exception:  # noqa: BLE001 - e.g. malformed JSON: read it again in the Hermes form, which says why
                pass
        return parse_hermes(self.tokenizer.decode(ids, skip_special_tokens=True))
