"""TRL 1.16's built-in reward functions (``trl.rewards``) by the same names and signatures, on rlhfkit's own verifiers:
a TRL script's ``from trl.rewards import accuracy_reward`` becomes ``from rlhfkit.rewards import accuracy_reward`` and
the script runs as written (torch-free: the reward workers import it).

* :func:`accuracy_reward` ``(completions, solution, log_extra=None, **kwargs)``: 1.0 when the completion's final answer
  equals the row's ``solution`` by value, 0.0 when not, None when the solution has no answer to compare with (TRL
  skips those samples too). rlhfkit's maths verifier (:mod:`rlhfkit.rewards.maths`: ``\\boxed{}``, ``####``, "the
  answer is", numbers, fractions, LaTeX normalised, SymPy in a killed child), not TRL's ``math_verify``: the verdicts
  agree on numbers and plain LaTeX answers; on unusual LaTeX they can differ (docs/coming-from-trl.md). It logs
  TRL's ``solution``, ``gold_parsed`` and ``answer_parsed`` columns through ``log_extra``.
* :func:`think_format_reward` ``(completions, **kwargs)``: 1.0 when the completion opens with one ``<think>`` ...
  ``</think>`` block, else 0.0 (TRL's pattern).
* :func:`get_soft_overlong_punishment` ``(max_completion_len, soft_punish_cache)``: DAPO's soft length penalty over
  ``completion_ids`` (0 up to ``max - cache`` tokens, then linear to -1 at ``max``, -1 beyond).

Completions come as TRL passes them: text, or for conversational data a list of one assistant message.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .maths import answers_equal, extract_answer, reference_answer


def _text(completion) -> str:
    if isinstance(completion, list) and completion and isinstance(completion[0], dict):
        return str(completion[0].get("content", ""))
    return str(completion)


def accuracy_reward(completions: list, solution: list[str], log_extra: Callable | None = None,
                    **kwargs) -> list[float | None]:
    """See the module docstring."""
    rewards: list[float | None] = []
    golds: list[str] = []
    answers: list[str] = []
    for completion, sol in zip(completions, solution, strict=True):
        gold = reference_answer(sol)
        if gold and len(gold) > 64:  # a worked solution: its final answer
            gold = extract_answer(gold)
        if not gold:  # nothing to compare with: skipped, as TRL does
            rewards.append(None)
            golds.append("[unparseable]")
            answers.append("[skipped]")
            continue
        got = extract_answer(_text(completion))
        same = answers_equal(got, gold) if got is not None else False
        rewards.append(None if same is None else float(same))
        golds.append(gold)
        answers.append(got if got is not None else "[unparseable]")
    if log_extra is not None:
        log_extra("solution", [str(s) for s in solution])
        log_extra("gold_parsed", golds)
        log_extra("answer_parsed", answers)
    return rewards


_THINK = re.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", re.DOTALL | re.MULTILINE)


def think_format_reward(completions: list, **kwargs) -> list[float]:
    """See the module docstring."""
    return [1.0 if _THINK.match(_text(c)) else 0.0 for c in completions]


class _SoftOverlong:
    """A picklable reward (a worker process imports it by reference): see :func:`get_soft_overlong_punishment`."""

    __name__ = "soft_overlong_punishment"

    def __init__(self, max_completion_len: int, soft_punish_cache: int):
        self.max_len, self.cache = int(max_completion_len), int(soft_punish_cache)

    def __call__(self, completion_ids: list[list[int]], **kwargs) -> list[float]:
        out = []
        for ids in completion_ids:
            n = len(ids)
            if n <= self.max_len - self.cache:
                out.append(0.0)
            elif n <= self.max_len:
                out.append((self.max_len - self.cache - n) / self.cache)
            else:
                out.append(-1.0)
        return out


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> Callable:
    """See the module docstring (DAPO, eq. 13)."""
    if not 0 < soft_punish_cache <= max_completion_len:
        raise ValueError(f"soft_punish_cache must be in (0, {max_completion_len}], got {soft_punish_cache}")
    return _SoftOverlong(max_completion_len, soft_punish_cache)
