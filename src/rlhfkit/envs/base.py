"""The environment interface of multi-turn online RL, its registry, and loading user environments.

An environment drives one episode (a fresh instance per episode, so it may keep state)::

    env = Env(**kwargs)
    messages = env.reset(row)                      # the conversation the model first answers
    new_messages, reward, done = env.step(messages, completion)   # after each assistant turn

``row`` is the prompt record (its ``prompt`` messages and every other field of the data file); ``completion`` is
the text of the model's turn (special tokens dropped); ``new_messages`` (tool results, user replies) are appended
after the assistant turn, ``reward`` is the turn's reward (the episode's return is the sum), ``done`` ends the
episode. An optional ``metrics() -> dict[str, float]`` is averaged over episodes and logged as ``env/<name>``.

A single-turn reward function is the trivial environment (one turn, reward at the end), which is what the online
loop does without ``env.name``.
"""

from __future__ import annotations

import difflib
from typing import Any, Protocol, runtime_checkable

from ..errors import EnvError

WHERE = "env.name"
FORMS = "write a built-in name ({names}), package.module:Class or path/to/file.py:Class"


@runtime_checkable
class Environment(Protocol):
    def reset(self, row: dict) -> list[dict]: ...

    def step(self, messages: list[dict], completion: str) -> tuple[list[dict], float, bool]: ...


def _builtin() -> dict[str, type]:
    from .calculator import CalculatorEnv
    from .openenv import OpenEnvAdapter

    return {"calculator": CalculatorEnv, "openenv": OpenEnvAdapter}


def environment_names() -> tuple[str, ...]:
    return tuple(_builtin())


def load_environment(spec: str) -> type:
    """The environment class named by ``spec``: a built-in name, ``package.module:Class`` or ``file.py:Class``
    (loaded as reward functions are). Raises :class:`EnvError` naming the spec."""
    from ..errors import RewardError
    from ..rewards.functions import load_reward_function

    text = str(spec).strip()
    builtin = _builtin()
    if text in builtin:
        return builtin[text]
    if ":" not in text:
        close = difflib.get_close_matches(text, list(builtin), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise EnvError(f"unknown environment {text!r}", where=WHERE, fix=hint + FORMS.format(names=", ".join(builtin)))
    try:
        obj = load_reward_function(text)  # the same import rules (module or file, cwd on the path, one-line errors)
    except RewardError as exc:
        prefix = f"cannot load reward function {text!r}: "
        reason = exc.message[len(prefix):] if exc.message.startswith(prefix) else exc.message
        fix = (exc.fix or "").replace("function", "Class")
        raise EnvError(f"cannot load environment {text!r}: {reason}", where=WHERE, fix=fix) from None
    if not isinstance(obj, type) or not callable(getattr(obj, "reset", None)) or not callable(getattr(obj, "step",
                                                                                                       None)):
        raise EnvError(f"{text!r} is not a class with reset(row) and step(messages, completion)", where=WHERE,
                       fix="point at a class, see rlhfkit.envs.base.Environment")
    return obj


def make_environment(cls: type, kwargs: dict[str, Any], spec: str):
    try:
        return cls(**kwargs)
    except Exception as exc:
        raise EnvError(f"environment {spec!r} could not be created: {type(exc).__name__}: {exc}", where="env.kwargs",
                       fix="check the keyword arguments against the environment's __init__") from None
