"""Verifiers: reward functions with TRL's signature `fn(prompts, completions, **columns) -> list[float | None]`.

None means "not applicable / could not be computed": the trainer excludes and counts it. Configurable rewards
are small classes; `get_reward(name, **kwargs)` builds one by name, and `require_format=True` gates any of
them on the R1 format. `score_groups` runs a set of them on n completions per dataset row.
"""
from __future__ import annotations

from typing import Any, Callable

from .base import Reward, completion_text
from .calculator_steps import CalculatorStepsReward
from .code_tests import CodeReward, code_reward, extract_program, parse_tests
from .countdown import CountdownReward, countdown_reward, countdown_value
from .countdown import CountdownStepsReward
from .episode import CutAsFailure, EndedReward, ProgressReward, ToolEfficiency, ToolErrorPenalty
from .format import FormatGated, FormatReward, format_ok, format_reward
from .language import LanguageConsistencyReward, language_consistency_reward
from .length import LengthPenalty, SoftOverlongReward, length_penalty_reward, soft_overlong_reward
from .maths import MathReward, answers_equal, extract_answer, math_reward
from .models import JudgeReward, ModelReward, SequenceClassifierReward
from .sandbox import Limits, SandboxResult, isolation, run_tests
from .scoring import (check_columns, check_not_all_null, merge_reward_metrics, reward_name, score_completions,
                      score_groups)

REWARDS: dict[str, type | Callable] = {
    "math": MathReward,
    "format": FormatReward,
    "countdown": CountdownReward,
    "countdown_steps": CountdownStepsReward,
    "calculator_steps": CalculatorStepsReward,
    "code": CodeReward,
    "soft_overlong": SoftOverlongReward,
    "length_penalty": LengthPenalty,
    "language_consistency": LanguageConsistencyReward,
    "episode_ended": EndedReward,
    "tool_errors": ToolErrorPenalty,
    "tool_efficiency": ToolEfficiency,
    "cut_as_failure": CutAsFailure,
    "progress": ProgressReward,
}


def get_reward(name: str, require_format: bool = False, **kwargs: Any) -> Callable:
    """A configured reward by registry name; `require_format` wraps it in `FormatGated`.

    >>> get_reward("math", answer_column="solution").required_columns
    ('solution',)
    """
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; valid names: {', '.join(sorted(REWARDS))}")
    try:
        reward = REWARDS[name](**kwargs)
    except TypeError as e:  # an argument the reward does not take, or of the wrong kind
        raise ValueError(f"reward {name!r} with reward_kwargs {kwargs}: {e}") from e
    return FormatGated(reward) if require_format else reward


__all__ = [
    "REWARDS", "get_reward", "score_completions", "score_groups", "check_columns", "check_not_all_null",
    "merge_reward_metrics", "reward_name", "Reward", "completion_text",
    "MathReward", "math_reward", "extract_answer", "answers_equal",
    "FormatReward", "FormatGated", "format_reward", "format_ok",
    "CountdownReward", "countdown_reward", "countdown_value",
    "CountdownStepsReward", "CalculatorStepsReward",
    "SoftOverlongReward", "LengthPenalty", "soft_overlong_reward", "length_penalty_reward",
    "LanguageConsistencyReward", "language_consistency_reward",
    "CodeReward", "code_reward", "extract_program", "parse_tests",
    "EndedReward", "ToolErrorPenalty", "ToolEfficiency", "CutAsFailure",
    "Limits", "SandboxResult", "isolation", "run_tests",
    "ModelReward", "SequenceClassifierReward", "JudgeReward",
]
