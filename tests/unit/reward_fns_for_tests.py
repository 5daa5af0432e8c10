"""Reward functions used by tests/unit/test_rewards.py (loaded as `reward_fns_for_tests:<name>` or by file path)."""

from __future__ import annotations

NOT_CALLABLE = 3


def contains_yes(prompts, completions, **fields):
    """1.0 when the completion contains "yes", else 0.0."""
    return [1.0 if "yes" in c else 0.0 for c in completions]


def half_none(prompts, completions, **fields):
    """No opinion (None) on even rows; 1.0 on odd rows."""
    return [None if i % 2 == 0 else 1.0 for i in range(len(completions))]


def only_answer(prompts, completions, answer):
    """Takes the `answer` column only (no **fields): other columns must not be passed."""
    return [float(len(a)) for a in answer]


def one_short(prompts, completions, **fields):
    return [0.0] * (len(completions) - 1)


def returns_text(prompts, completions, **fields):
    return ["good"] * len(completions)


def returns_nan(prompts, completions, **fields):
    return [float("nan")] * len(completions)


def returns_scalar(prompts, completions, **fields):
    return 1.0


def echo_pattern(prompts, completions, pattern="default", **fields):
    """1.0 when `pattern` (a kwarg, possibly shadowed by a dataset column) is "from-config"."""
    return [1.0 if pattern == "from-config" else 0.0 for _ in completions]


def returns_none(prompts, completions, **fields):
    return [None] * len(completions)


def returns_bool(prompts, completions, **fields):
    return [True] * len(completions)


def some_bad(prompts, completions, **fields):
    """[1, nan, inf, None, -inf, 2] (for 6 completions)."""
    return [1.0, float("nan"), float("inf"), None, float("-inf"), 2.0][: len(completions)]


def raises_on_b(prompts, completions, **fields):
    """1.0 per completion, but a completion "b" divides by zero."""
    if "b" in completions:
        raise ZeroDivisionError("no b allowed")
    return [1.0] * len(completions)
