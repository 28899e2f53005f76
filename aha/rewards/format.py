"""The R1 format: the whole completion is `<think>…</think>` then `<answer>…</answer>`, nothing after.
Also a gate that pays a correctness reward only when the format is right, so the policy cannot skip it."""
from __future__ import annotations

from typing import Any, Callable

from .base import Reward, completion_text
from .steps import is_steps

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def format_ok(text: str, think_in_prompt: bool = False) -> bool:
    """True when `text` is exactly one think block then one non-empty answer block (whitespace between and
    around is allowed). With `think_in_prompt` the prompt already opened `<think>`, as R1-style templates do.

    >>> format_ok("<think>2+2=4</think>\\n<answer>4</answer>")
    True
    >>> format_ok("<think>hm</think><answer>4</answer> and also 5")
    False
    """
    if not isinstance(text, str):
        return False
    if think_in_prompt:
        text = "<think>" + text
    text = text.strip()
    if any(text.count(tag) != 1 for tag in _TAGS):
        return False
    think, think_end, ans, ans_end = (text.index(tag) for tag in _TAGS)
    return (think == 0 and think < think_end < ans < ans_end and text.endswith("</answer>")
            and not text[think_end + len("</think>"):ans].strip()
            and bool(text[ans + len("<answer>"):ans_end].strip()))


class FormatReward(Reward):
    """1.0 when the completion has the R1 format (see `format_ok`), else 0.0.

    >>> FormatReward()(None, ["<think>a</think><answer>b</answer>", "b"])
    [1.0, 0.0]
    """

    name = "format"

    def __init__(self, think_in_prompt: bool = False):
        super().__init__()
        self.think_in_prompt = think_in_prompt

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        return [float(format_ok(completion_text(c), self.think_in_prompt)) for c in completions]


class FormatGated(Reward):
    """`inner`'s reward where the format is right, 0.0 where it is not (step rewards: each step 0.0; None stays
    None). Keeps `inner`'s name, columns and metrics, so it drops into a config in place of the bare reward.

    >>> from aha.rewards.maths import MathReward
    >>> FormatGated(MathReward())(None, ["<think>.</think><answer>4</answer>", "4"], answer=["4", "4"])
    [1.0, 0.0]
    """

    def __init__(self, inner: Callable[..., list], think_in_prompt: bool = False):
        self.name = getattr(inner, "__name__", type(inner).__name__)
        super().__init__()
        self.inner = inner
        self.think_in_prompt = think_in_prompt
        self.required_columns = tuple(getattr(inner, "required_columns", ()))

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list:
        values = self.inner(prompts, completions, **kwargs)
        return [v if v is None or format_ok(completion_text(c), self.think_in_prompt) else _zero(v, completion_text(c))
                for v, c in zip(values, completions)]

    def pop_metrics(self) -> dict[str, float]:
        pop = getattr(self.inner, "pop_metrics", None)
        return pop() if callable(pop) else {}


def _zero(value: Any, text: str) -> Any:
    """A gated-off value: 0.0, or for step rewards each step at 0.0 (none written: one at the text's end).

    >>> _zero(0.7, "x"), _zero([(2, 1.0), (5, 1.0)], "hello"), _zero([], "hey")
    (0.0, [(2, 0.0), (5, 0.0)], [(3, 0.0)])
    """
    if not is_steps(value):
        return 0.0
    return [(end, 0.0) for end, _ in value] or [(len(text), 0.0)]


format_reward = FormatReward()
