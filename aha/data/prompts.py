"""Prompt templates: a question -> chat messages (for instruct models) or a plain string (base models).

R1-Zero trains a base model on a plain prompt that asks for `<think>` reasoning `</think>` then
`<answer>` final answer `</answer>`; an instruct model gets the same request as chat messages, which
`encode_prompt` later renders through the model's own chat template. A template also writes worked
solutions in its answer style, so few-shot turns and SFT targets match what the verifiers expect.

A plain-string prompt has no end-of-turn token: a base model that has answered often goes on with the next
turn ("\n\nUser: ... Assistant: ..." and a second answer). `PromptTemplate.stop` names that next-turn label, and
a task with such a template cuts every completion there before any verifier reads it (`aha.tasks.base.Task`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

R1_SYSTEM = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and "
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>."
)
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
STYLES = ("r1", "boxed", "plain")


@dataclass(frozen=True)
class PromptTemplate:
    """How a question becomes a prompt.

    Example: get_template("plain", chat=False)("1+1") -> 'User: 1+1\\nAssistant:'.

    A plain-string template (chat=False) ends the prompt with `assistant_prefix` and has no end-of-turn token, so
    a base model may go on past its answer into a new turn of its own ("\\n\\nUser: ...\\nAssistant: ...", with
    a second answer). Its completions are therefore cut at the next turn label, `stop` ("\\nUser:"), before they
    are scored, in training, evaluation and rejection sampling alike (`Task.stop`). Generation itself still runs
    to EOS or the token budget: the cut is on the text only.
    """

    system: str | None = None
    """System prompt: a system message (chat) or the first paragraph (plain string)."""
    instruction: str | None = None
    """Appended to every question after a blank line, few-shot questions included."""
    shots: tuple[tuple[str, str], ...] = ()
    """Few-shot (question, answer text) pairs, shown as earlier user/assistant turns."""
    chat: bool = True
    """True: a list of chat messages; False: one plain string for a base model."""
    style: str = "plain"
    """How answers are written: r1 (<think></think><answer></answer>), boxed (\\boxed{}) or plain (#### n)."""
    user_prefix: str = "User: "
    assistant_prefix: str = "Assistant:"
    """Plain-string turn labels; the prompt ends with assistant_prefix, so the model writes the answer."""

    def __post_init__(self):
        if self.style not in STYLES:
            raise ValueError(f"unknown answer style '{self.style}'; valid: {list(STYLES)}")
        shots = tuple(tuple(s) for s in self.shots)
        if any(len(s) != 2 or not all(isinstance(x, str) for x in s) for s in shots):
            raise ValueError("shots must be (question, answer text) pairs of strings")
        object.__setattr__(self, "shots", shots)

    @property
    def stop(self) -> tuple[str, ...]:
        """Where a completion of a plain-string prompt ends: the next user turn's label on a new line, which also
        catches the blank line the template puts between turns. () for chat templates (the model's chat template
        ends a turn with its own end-of-turn token) and for a template without a user label."""
        label = self.user_prefix.strip()
        return () if self.chat or not label else (f"\n{label}",)

    def cut(self, text: str) -> str:
        """`text` up to the first of `stop`: the completion a verifier reads.

        Example: get_template("plain_base").cut("#### 18\\n\\nUser: next?\\nAssistant: #### 3") -> '#### 18'.
        """
        return cut_at(text, self.stop)

    def user_text(self, question: str) -> str:
        return f"{question}\n\n{self.instruction}" if self.instruction else question

    def render(self, question: str) -> str | list[dict]:
        turns = [*self.shots, (question, None)]
        if self.chat:
            msgs = [{"role": "system", "content": self.system}] if self.system else []
            for q, a in turns:
                msgs.append({"role": "user", "content": self.user_text(q)})
                if a is not None:
                    msgs.append({"role": "assistant", "content": a})
            return msgs
        parts = [self.system] if self.system else []
        for q, a in turns:
            turn = f"{self.user_prefix}{self.user_text(q)}\n{self.assistant_prefix}"
            parts.append(turn if a is None else f"{turn} {a}")
        return "\n\n".join(parts)

    __call__ = render

    def answer(self, reasoning: str, final: str) -> str:
        """A worked solution in this style, for few-shot turns and SFT targets.

        Example (r1): answer("2+2=4", "4") -> '<think>\\n2+2=4\\n</think>\\n<answer>4</answer>'.
        """
        reasoning = reasoning.strip()
        if self.style == "r1":
            return f"<think>\n{reasoning}\n</think>\n<answer>{final}</answer>"
        if self.style == "boxed":
            return f"{reasoning}\nThe final answer is $\\boxed{{{final}}}$."
        return f"{reasoning}\n#### {final}"


def cut_at(text: str, stop: tuple[str, ...]) -> str:
    """`text` up to the earliest of the `stop` strings (all of it when none occurs), trailing whitespace removed
    when it was cut.

    >>> cut_at("<answer>18</answer>\\n\\nUser: next\\nAssistant: <answer>3</answer>", ("\\nUser:",))
    '<answer>18</answer>'
    """
    ends = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return text[:min(ends)].rstrip() if ends else text


TEMPLATES: dict[str, PromptTemplate] = {
    "r1": PromptTemplate(system=R1_SYSTEM, style="r1"),
    "boxed": PromptTemplate(instruction=BOXED_INSTRUCTION, style="boxed"),
    "plain": PromptTemplate(),
}
TEMPLATES.update({f"{name}_base": replace(t, chat=False) for name, t in list(TEMPLATES.items())})
"""`*_base`: the same prompts as one plain string, for base models with no chat template (R1-Zero); their
completions are cut at the next turn label (`PromptTemplate.stop`) before they are scored."""


def get_template(template: str | PromptTemplate = "r1", **overrides) -> PromptTemplate:
    """A registered template by name (or a template as is), with fields replaced, e.g. chat=False, shots=[...]."""
    if isinstance(template, PromptTemplate):
        base = template
    elif template in TEMPLATES:
        base = TEMPLATES[template]
    else:
        raise ValueError(f"unknown prompt template '{template}'; valid: {sorted(TEMPLATES)}")
    return replace(base, **overrides) if overrides else base
