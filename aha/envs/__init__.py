"""Environments and tools with TRL's contract (base.py, tools.py), and the built-in environments, each a task with
a train/test split by hash: a calculator (calculator.py), a virtual filesystem (filesystem.py) and run_python in
aha's sandbox (python.py)."""

from .base import Agent, EnvironmentReward, methods
from .tools import OUTCOMES, Toolbox, tool_schema

__all__ = ["Agent", "EnvironmentReward", "OUTCOMES", "Toolbox", "methods", "tool_schema"]
