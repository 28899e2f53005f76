"""Prompts as a person reads them: the question (the last user turn), not the chat template around it."""

from __future__ import annotations

import json
import re

TURNS = (
    re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?=<\|im_end\|>|<\|im_start\|>|$)", re.S),                    # ChatML
    re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>(.*?)(?=<\|eot_id\|>|<\|start_header_id\||$)",
               re.S),                                                                                 # Llama 3
    re.compile(r"<start_of_turn>(\w+)\n(.*?)(?=<end_of_turn>|<start_of_turn>|$)", re.S),               # Gemma
)
"""(role, content) of each turn in a prompt rendered with a chat template."""
MARKER = re.compile(r"<\|[^|<>]{1,40}\|>|</?s>|\[/?INST\]")
"""A special token left in text that matches no template above."""


def _content(content) -> str:
    if isinstance(content, list):  # multi-part content: its text parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else json.dumps(content)


def prompt_text(prompt) -> str:
    """The question a prompt asks: the last user turn's text.

    E.g. "<|im_start|>user\\n1+6<|im_end|>\\n<|im_start|>assistant\\n" -> "1+6";
    [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "1+6"}] -> "1+6"; "1+6=" -> "1+6=".
    """
    if isinstance(prompt, list):
        turns = [(m.get("role"), _content(m.get("content"))) for m in prompt if isinstance(m, dict)]
    elif isinstance(prompt, str):
        turns = next(([(r, c) for r, c in p.findall(prompt)] for p in TURNS if p.search(prompt)), [])
        if not turns:
            return MARKER.sub("", prompt).strip()
    else:
        return "" if prompt is None else json.dumps(prompt)
    users = [c for r, c in turns if r == "user"]
    said = [c for _, c in turns if c.strip()]
    return MARKER.sub("", (users or said or [""])[-1]).strip()
