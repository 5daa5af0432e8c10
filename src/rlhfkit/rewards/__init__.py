"""Rewards: reward-model scoring (re-tokenising text when the reward tokenizer differs from the policy's), built-in
rule rewards and verifiers (maths answers, code run against tests in a sandbox, remote judges), user functions given
as ``package.module:function``, combined by weight and run in worker processes under a time limit, and the reward
lint.

Names are imported on first use (PEP 562), so a worker process that imports :mod:`rlhfkit.rewards.workers` does not
import torch or the reward model's code.
"""

from __future__ import annotations

import importlib

_NAMES = {
    "BUILTINS": "loading",
    "load_reward_function": "loading",
    "RewardFunctionError": "loading",
    "RULES": "rules",
    "exact_match": "rules",
    "format_match": "rules",
    "length_target": "rules",
    "regex_match": "rules",
    "CombinedRewards": "functions",
    "RewardFunctionSpec": "functions",
    "RewardScores": "functions",
    "RewardModelScorer": "model",
    "conversation_ids": "model",
    "max_input_length": "model",
    "same_tokenizer": "model",
    "WorkerPool": "workers",
    "Worker": "workers",
    "CallTimeout": "workers",
    "CallFailed": "workers",
    "math_answer": "maths",
    "math_format": "maths",
    "code_tests": "code",
    "RemoteJudge": "remote",
    "lint_rewards": "lint",
    "accuracy_reward": "trl_rewards",  # TRL's trl.rewards, by the same names (a TRL script's import changed only)
    "think_format_reward": "trl_rewards",
    "get_soft_overlong_punishment": "trl_rewards",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'rlhfkit.rewards' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return __all__
