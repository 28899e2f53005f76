"""Configs: every stage's flat dataclass (schema.py) and reading them from YAML and `key=value` (parse.py)."""

from .parse import ConfigError, field_docs, from_dict, help_text, parse_args, save_config
from .schema import (DashboardConfig, DemoConfig, EvalConfig, GenerationConfig, GRPOConfig, PRMConfig, PRMLabelsConfig,
                     SampleConfig, SFTConfig, TinyConfig, TrainConfig)

__all__ = ["ConfigError", "field_docs", "from_dict", "help_text", "parse_args", "save_config", "DashboardConfig", "DemoConfig",
           "EvalConfig", "GenerationConfig", "GRPOConfig", "PRMConfig", "PRMLabelsConfig", "SampleConfig", "SFTConfig",
           "TinyConfig", "TrainConfig"]
