"""Rewards: reward-model scoring (re-tokenising text when the reward tokenizer differs from the policy's), built-in
rule rewards, and user functions given as ``package.module:function``, combined by weight."""

from .functions import CombinedRewards, RewardFunctionError, RewardFunctionSpec, RewardScores, load_reward_function
from .model import RewardModelScorer, conversation_ids, max_input_length, same_tokenizer
from .rules import RULES, exact_match, format_match, length_target, regex_match

__all__ = [
    "RULES",
    "CombinedRewards",
    "RewardFunctionError",
    "RewardFunctionSpec",
    "RewardModelScorer",
    "RewardScores",
    "conversation_ids",
    "exact_match",
    "format_match",
    "length_target",
    "load_reward_function",
    "max_input_length",
    "regex_match",
    "same_tokenizer",
]
