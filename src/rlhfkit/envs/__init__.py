"""Environments for multi-turn online RL (``env.name``): the interface, the built-in calculator, episode rollout."""

from .base import EnvError, Environment, environment_names, load_environment
from .calculator import CalculatorEnv, make_arithmetic_prompts, parse_tool_calls, safe_eval
from .episodes import Episode, run_episodes

__all__ = ["CalculatorEnv", "EnvError", "Environment", "Episode", "environment_names", "load_environment",
           "make_arithmetic_prompts", "parse_tool_calls", "run_episodes", "safe_eval"]
