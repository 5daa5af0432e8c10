"""Environments for multi-turn online RL (``env.name``): the interface and the built-in calculator. The episode
runner (``rlhfkit.envs.episodes``: ``run_episodes``, ``Episode``) is imported from its module: it needs the rollout
engines, hence torch, and importing an environment or a task (as a reward worker does for
``rlhfkit.tasks.quickstart:reward``) stays light (about 0.05 s instead of 2.5 s)."""

from .base import EnvError, Environment, environment_names, load_environment
from .calculator import CalculatorEnv, make_arithmetic_prompts, parse_tool_calls, safe_eval

__all__ = ["CalculatorEnv", "EnvError", "Environment", "environment_names", "load_environment",
           "make_arithmetic_prompts", "parse_tool_calls", "safe_eval"]
