"""Built-in rule rewards, usable by short name (``exact_match``, ``regex_match``, ``format``, ``length_target``) or
as ``rlhfkit.rewards.rules:<name>``.

Every reward function, built-in or user-written, has the signature::

    fn(prompts: list[str], completions: list[str], **fields) -> list[float | None]

``fields`` are the dataset's other columns, one list per column, aligned with ``completions`` (e.g.
``answer=[...]``). Options (``field``, ``pattern``, ``target``, …) come from the config's ``kwargs``. ``None``
means "no opinion on this sample": it is skipped when rewards are combined.

The patterns of ``regex_match`` and ``format`` run with the `regex <https://pypi.org/project/regex/>`_ library (a
dependency of transformers; the syntax of Python's ``re``) because it takes a time limit per match, which ``re``
cannot (its matching is C code no signal interrupts): a completion on which a pattern backtracks for longer than
``timeout_s`` (the default ``format`` pattern on a megabyte of ``</think><answer>``) scores ``None`` — that sample
alone is dropped, never the batch.
"""

from __future__ import annotations

import regex as re

from ..errors import RewardError

MATCH_TIMEOUT_S = 1.0  # default time limit of one pattern on one completion


def _column(fields: dict, field: str, fn_name: str, n: int) -> list:
    if field not in fields:
        available = ", ".join(sorted(fields)) or "none"
        raise RewardError(
            f"{fn_name} needs the dataset field {field!r}, which the prompts do not have (fields: {available})",
            where=f"reward.functions[{fn_name}]",
            fix=f"add a {field!r} column to the prompt data, or set kwargs.field to an existing column",
        )
    column = list(fields[field])
    if len(column) != n:
        raise ValueError(f"field {field!r} has {len(column)} values for {n} completions")
    return column


def _norm(text, normalize: bool, lowercase: bool) -> str:
    text = str(text)
    if normalize:
        text = text.strip()
    if lowercase:
        text = text.lower()
    return text


def exact_match(
    prompts: list[str],
    completions: list[str],
    *,
    field: str = "answer",
    normalize: bool = True,
    lowercase: bool = False,
    **fields,
) -> list[float | None]:
    """1.0 when the completion equals the row's ``field`` value, else 0.0 (``None`` where the value is missing).

    ``normalize`` strips surrounding whitespace from both sides; ``lowercase`` also ignores case.
    """
    answers = _column(fields, field, "exact_match", len(completions))
    return [
        None if a is None else float(_norm(c, normalize, lowercase) == _norm(a, normalize, lowercase))
        for c, a in zip(completions, answers)
    ]


def regex_match(
    prompts: list[str],
    completions: list[str],
    *,
    pattern: str = r"####\s*([^\n]+)",
    field: str = "answer",
    normalize: bool = True,
    lowercase: bool = False,
    timeout_s: float = MATCH_TIMEOUT_S,
    **fields,
) -> list[float | None]:
    """1.0 when the first group of ``pattern`` in the *last* match in the completion (the whole match if the pattern
    has no group) equals the row's ``field`` value, 0.0 when it differs or the pattern is not found (``None`` where
    the value is missing, or where matching took longer than ``timeout_s``). The last match, as the maths verifier
    reads the answer stated last: paying for the first of several answers pays a policy for listing many. The
    default pattern reads a GSM8K-style ``#### 42`` answer line."""
    regex = _compile(pattern, "regex_match")
    answers = _column(fields, field, "regex_match", len(completions))
    out: list[float | None] = []
    for c, a in zip(completions, answers):
        if a is None:
            out.append(None)
            continue
        try:
            m = _last_match(regex, c, timeout_s)
        except TimeoutError:
            out.append(None)
            continue
        if m is None:
            out.append(0.0)
            continue
        got = m.group(1) if regex.groups else m.group(0)
        out.append(
            float(got is not None and _norm(got, normalize, lowercase) == _norm(a, normalize, lowercase))
        )
    return out


def format_match(
    prompts: list[str],
    completions: list[str],
    *,
    pattern: str = r"<think>.*?</think>\s*<answer>.*?</answer>",
    strip: bool = True,
    timeout_s: float = MATCH_TIMEOUT_S,
    **fields,
) -> list[float | None]:
    """1.0 when the whole completion matches ``pattern`` (``re.fullmatch``, ``.`` matches newlines), else 0.0;
    ``None`` where matching took longer than ``timeout_s``. The default pattern asks for
    ``<think>…</think> <answer>…</answer>``."""
    regex = _compile(pattern, "format", re.DOTALL)
    out: list[float | None] = []
    for c in completions:
        try:
            out.append(float(regex.fullmatch(c.strip() if strip else c, timeout=timeout_s) is not None))
        except TimeoutError:
            out.append(None)
    return out


format = format_match  # the short name users write (`rlhfkit.rewards.rules:format`)


def length_target(
    prompts: list[str],
    completions: list[str],
    *,
    target: int | None = None,
    **fields,
) -> list[float]:
    """``-|len(completion) - target| / target`` with lengths in characters: 0 at the target, -1 at twice it."""
    if target is None or target <= 0:
        raise RewardError(
            f"length_target needs a positive `target` (characters), got {target!r}",
            where="reward.functions[length_target].kwargs.target",
            fix="set kwargs: {target: 200}",
        )
    return [-abs(len(c) - target) / target for c in completions]


def _last_match(regex: re.Pattern, text: str, timeout_s: float):
    """The last match of ``regex`` in ``text`` (None when there is none); ``TimeoutError`` past ``timeout_s``."""
    last = None
    for last in regex.finditer(text, timeout=timeout_s):  # noqa: B007 - only the last one is wanted
        pass
    return last


def _compile(pattern: str, fn_name: str, flags: int = 0) -> re.Pattern:
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise RewardError(
            f"bad regular expression {pattern!r}: {exc}",
            where=f"reward.functions[{fn_name}].kwargs.pattern",
            fix="write a Python `re` pattern (quote it in YAML; backslashes need single quotes)",
        ) from None


RULES = {
    "exact_match": exact_match,
    "regex_match": regex_match,
    "format": format_match,
    "length_target": length_target,
}
