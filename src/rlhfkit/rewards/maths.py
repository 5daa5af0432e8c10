"""The maths verifier: the final answer of a completion, compared with the reference by value.

``math_answer(prompts, completions, answer=[...])`` scores 1.0 when the completion's final answer equals the row's
reference, 0.0 when it differs or no answer is found, ``None`` when the reference is missing or the symbolic check
ran out of time. ``math_format`` (a separate function, not mixed in) scores only the form: 1.0 when the completion
holds exactly one non-empty answer in the expected form.

**Finding the final answer** (``extract``: the forms accepted, default all four; of the forms found, the answer
stated *last* in the text wins, so "#### 7 ... the answer is 8" answers 8; the last number only when no other form
is found):
``boxed`` the content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces kept); ``hashes`` the rest of
the last ``#### ...`` line (GSM8K); ``answer_is`` what follows the last "the answer is" / "answer:" to the end of
its sentence; ``last_number`` the last number of the text. The reference is read the same way when it holds a
``####`` line or a ``\\boxed{}`` (a GSM8K solution can be the reference), else it is taken whole.

**Equal by value** (in this order):

1. *numbers, exactly*: integers, thousands separators (``1,234``), decimals, scientific notation (``1e3``),
   fractions ``a/b``, LaTeX ``\\frac{a}{b}`` / ``\\dfrac`` / ``\\tfrac``, a leading sign, ``$`` / ``\\(...\\)``,
   ``\\text{...}`` units and a trailing period removed; compared as :class:`fractions.Fraction`, equal within
   ``rel_tol`` (default 1e-6, so 0.333 is *not* 1/3 but 0.3333333 is). A percentage ``p%`` equals a reference of
   either ``p`` or ``p/100`` (50% = 50 = 0.5), since references write percentages both ways.
2. *expressions, symbolically*: anything else (``2\\sqrt{2}`` = ``\\sqrt{8}``, ``x+1`` = ``1+x``, ``\\pi/2``,
   intervals, sets, tuples) is parsed and compared by Hugging Face's ``math-verify`` (LaTeX and plain expressions
   through ``latex2sympy2_extended`` and SymPy), the library the Open-R1 and TRL maths rewards use: we use it for
   what it does better than a hand-written parser (LaTeX grammar, SymPy simplification, sets and intervals), and do
   the extraction ourselves (its own extraction picks the *first* match where a final answer is the *last*).
   SymPy can hang on adversarial input, inside C code that no signal interrupts (``10**10**10`` is a big-integer
   power): the check runs in a child process killed at ``timeout_s`` (and under a memory cap), forked by a
   single-threaded helper (:mod:`.symcheck`: safe from any thread of any caller); a check that times out scores
   ``None``, one that crashes 0.0; a pair is checked once per process (its verdict is cached).

**Limits** (so that no answer can stall or crash the verifier, and one bad sample costs that sample alone): finding
the answer is linear in the completion's length (a megabyte of unclosed ``\\boxed{`` takes milliseconds); an answer
or reference longer than :data:`MAX_ANSWER_CHARS` is compared as text only; numbers are compared as decimals, so a
5,000-digit reference or ``1e999999999`` needs no integer conversion; SymPy sees nothing longer than
:data:`MAX_SYMBOLIC_CHARS` (such an answer scores 0.0).

Not accepted: answers in words ("seven"), units compared across scales (``1 km`` vs ``1000 m``), approximate
answers outside ``rel_tol``, several answers where the reference has one (only the final one counts), and
equations against values (``x = 3`` vs ``3`` is equal: the right-hand side of a final ``var =`` is taken; ``3 = x``
is not).
"""

from __future__ import annotations

import decimal
import functools
import os
import re
from collections.abc import Sequence
from decimal import Decimal

from rlhfkit.rewards import symcheck

EXTRACTORS = ("boxed", "hashes", "answer_is", "last_number")
MAX_ANSWER_CHARS = 10_000  # an extracted answer (or reference) longer than this is compared as text only
MAX_SYMBOLIC_CHARS = 1_000  # nothing longer reaches SymPy (such an answer is not equal)
# exact comparisons, and 60 significant digits for the tolerance checks of fractions (1/3 against 0.3333333)
_CONTEXT = decimal.Context(prec=60, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, traps=[decimal.InvalidOperation])

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+"
_NUMBER_RE = re.compile(rf"(?:{_NUMBER})(?:\s*/\s*(?:{_NUMBER}))?\s*%?")
_HASHES_RE = re.compile(r"####\s*([^\n]*)")
# no capture of the rest of the line here: a lookahead capture on each of 70,000 matches of a megabyte without a
# newline reads the rest of the text each time (quadratic); the last match's line is read once (_answer_is)
_ANSWER_IS_RE = re.compile(r"(?:the\s+(?:final\s+)?answer\s+is|answer\s*:)\s*:?\s*", re.IGNORECASE)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_RE = re.compile(r"[{}]")


# ─────────────────────────────────────────────── extraction ───────────────────────────────────────────────


def _boxed(text: str) -> tuple[int, str] | None:
    """(position, content) of the last ``\\boxed{...}`` with balanced braces (None when absent or unclosed). One pass
    over the braces pairs each ``{`` with its ``}``, so a megabyte of unclosed boxes is linear, not quadratic."""
    boxes = [m for m in _BOX_RE.finditer(text)]
    if not boxes:
        return None
    closing: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_RE.finditer(text, boxes[0].end() - 1):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            closing[stack.pop()] = m.start()
    for m in reversed(boxes):
        end = closing.get(m.end() - 1)
        if end is not None:
            return m.start(), text[m.end(): end]
    return None


def _last(regex: re.Pattern, text: str) -> re.Match | None:
    last = None
    for last in regex.finditer(text):  # noqa: B007 - only the last one is wanted, without a list of every match
        pass
    return last


def _last_match(regex: re.Pattern, text: str) -> tuple[int, str] | None:
    m = _last(regex, text)
    return None if m is None else (m.start(), m.group(1))


def _answer_is(text: str) -> tuple[int, str] | None:
    """(position, what follows) of the last "the answer is" / "answer:", up to the end of its line."""
    m = _last(_ANSWER_IS_RE, text)
    if m is None:
        return None
    end = text.find("\n", m.end())
    return m.start(), text[m.end(): end if end >= 0 else len(text)]


def _last_number(text: str) -> str | None:
    m = _last(_NUMBER_RE, text)
    return None if m is None else m.group(0)


def _find(how: str, text: str) -> tuple[int, str] | None:
    """(position, answer) of the last answer stated in form ``how`` in ``text``."""
    if how == "boxed":
        return _boxed(text)
    if how == "hashes":
        return _last_match(_HASHES_RE, text)
    if how == "answer_is":  # up to the end of its sentence
        found = _answer_is(text)
        return None if found is None else (found[0], re.split(r"\.\s", found[1] + " ", maxsplit=1)[0])
    raise ValueError(f"unknown extractor {how!r} (choose from {', '.join(EXTRACTORS)})")


def extract_answer(text: str, extract: Sequence[str] = EXTRACTORS) -> str | None:
    """The final answer of ``text`` (module docstring): of the forms in ``extract``, the answer stated *last* in the
    text; the last number only when no other form of ``extract`` is found. None when there is none."""
    found = [f for how in extract if how != "last_number" and (f := _find(how, text)) and f[1].strip()]
    if found:
        return max(found, key=lambda f: f[0])[1].strip()
    if "last_number" in extract:
        got = _last_number(text)
        return got.strip() if got else None
    return None


def reference_answer(ref) -> str | None:
    """The reference as a string; a GSM8K-style solution (``#### n``) or a boxed one is reduced to its answer."""
    if ref is None:
        return None
    text = str(ref)
    if "####" in text or _BOX_RE.search(text):
        return extract_answer(text, ("boxed", "hashes")) or text.strip()
    return text.strip()


# ─────────────────────────────────────────────── comparison ───────────────────────────────────────────────

_WRAPPERS = (("\\(", "\\)"), ("\\[", "\\]"))
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_FRAC_RE = re.compile(rf"^\\[dt]?frac\s*\{{\s*({_NUMBER})\s*\}}\s*\{{\s*({_NUMBER})\s*\}}$")
_FRAC_SHORT_RE = re.compile(r"^\\[dt]?frac\s*(\d)\s*(\d)$")
_UNIT_RE = re.compile(r"units?|dollars?|cents?|cm|m|km|kg|g|s|hours?|minutes?|days?|years?")


def normalize(text: str) -> str:
    """Surface forms that never change a value removed: math delimiters, ``\\left`` / ``\\right``, spacing macros,
    ``\\dfrac`` / ``\\tfrac``, a trailing period, ``\\text{..}`` wrappers, a leading ``var =``, degree signs. Linear
    in the length (string methods, no anchored regex scanned from every position)."""
    s = str(text).strip().strip("$").strip()
    for left, right in _WRAPPERS:
        s = s.removeprefix(left).removesuffix(right).strip()
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "").replace("\\ ", " ")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("^\\circ", "").replace("°", "")
    s = s.replace("\\%", "%").replace("\\$", "")
    s = _TEXT_RE.sub(r"\1", s).strip()
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # "x = 3" -> "3"
    return s.rstrip(".").strip()


def _plain_number(s: str) -> Decimal | None:
    """The exact value of a plain number as a :class:`~decimal.Decimal`: no integer conversion, so neither 5,000
    digits (Python's 4,300-digit limit on ``int(str)``) nor ``1e999999999`` (a big-integer power) costs anything."""
    if not re.fullmatch(_NUMBER, s):
        return None
    try:
        return Decimal(s.replace(",", "").replace("+", ""))
    except decimal.InvalidOperation:
        return None


def _ratio(num: Decimal | None, den: Decimal | None) -> Decimal | None:
    if num is None or den is None or not den:
        return None
    try:
        return _CONTEXT.divide(num, den)
    except (decimal.InvalidOperation, ArithmeticError):
        return None


def as_number(text: str) -> tuple[Decimal, bool] | None:
    """``(value, is_percent)`` when ``text`` is a plain number, a fraction or a percentage, else None."""
    s = normalize(text)
    percent = s.endswith("%")
    s = s.rstrip("%").strip()
    head, _, unit = s.rpartition(" ")
    if head.strip() and _UNIT_RE.fullmatch(unit):  # "18 dollars"
        s = head.strip()
    m = _FRAC_RE.match(s) or _FRAC_SHORT_RE.match(s)
    if m:
        value = _ratio(_plain_number(m.group(1)), _plain_number(m.group(2)))
    elif "/" in s:
        num_text, _, den_text = s.partition("/")
        value = _ratio(_plain_number(num_text.strip()), _plain_number(den_text.strip()))
    else:
        value = _plain_number(s)
    return None if value is None else (value, percent)


def _close(a: Decimal, b: Decimal, rel_tol: float) -> bool:
    """Equal within ``rel_tol``, except two whole numbers: those are equal only exactly (1000001 is not 1000000, and a
    5,000-digit answer with its last digit wrong is wrong)."""
    if a == b:  # exact, whatever the digits
        return True
    if _whole(a) and _whole(b):
        return False
    try:
        return _CONTEXT.abs(_CONTEXT.subtract(a, b)) <= _CONTEXT.multiply(Decimal(rel_tol), max(abs(a), abs(b)))
    except ArithmeticError:  # beyond even MAX_EMAX: not equal
        return False


def _whole(x: Decimal) -> bool:
    return x.is_finite() and (x.as_tuple().exponent >= 0 or x == x.to_integral_value(context=_CONTEXT))


def numbers_equal(pred: tuple[Decimal, bool], ref: tuple[Decimal, bool], rel_tol: float) -> bool:
    (p, p_pct), (r, r_pct) = pred, ref
    candidates = [(p, r)]
    if p_pct and not r_pct:
        candidates.append((p.scaleb(-2), r))
    if r_pct and not p_pct:
        candidates.append((p, r.scaleb(-2)))
    return any(_close(a, b, rel_tol) for a, b in candidates)


@functools.lru_cache(maxsize=4096)
def _symbolic_verdict(pred: str, ref: str, timeout_s: float | None) -> bool | None:
    """True / False, or None past ``timeout_s``; cached: the answers of a group repeat, and a pathological pair must
    not cost its time limit twice. Without a limit (or without ``fork``: Windows) the check runs here, unbounded."""
    if timeout_s and hasattr(os, "fork"):
        return symcheck.check(pred, ref, timeout_s)
    try:
        return symcheck.symbolic_equal(pred, ref)
    except Exception:  # a parse the library could not finish: not equal
        return False


def answers_equal(pred: str, ref: str, *, rel_tol: float = 1e-6, timeout_s: float | None = 5.0) -> bool | None:
    """True when ``pred`` and ``ref`` (answers already extracted) are equal by value (module docstring); None when
    the symbolic check ran past ``timeout_s``."""
    if len(pred) > MAX_ANSWER_CHARS or len(ref) > MAX_ANSWER_CHARS:  # text only: no parse of a megabyte
        return pred.strip() == ref.strip()
    p_num, r_num = as_number(pred), as_number(ref)
    if p_num is not None and r_num is not None:
        return numbers_equal(p_num, r_num, rel_tol)
    p, r = normalize(pred), normalize(ref)
    if p == r:
        return True
    if (p_num is None) != (r_num is None) and re.fullmatch(r"[-+\d.,/%\s]*", p + r):
        return False  # one side a number, the other digits that do not parse: no algebra can make them equal
    if len(p) > MAX_SYMBOLIC_CHARS or len(r) > MAX_SYMBOLIC_CHARS:
        return False
    return _symbolic_verdict(p, r, timeout_s)


# ─────────────────────────────────────────────── rewards ───────────────────────────────────────────────


def _references(fields: dict, field: str, n: int) -> list:
    from .rules import _column

    return _column(fields, field, "math_answer", n)


def math_answer(
    prompts: list[str],
    completions: list[str],
    *,
    field: str = "answer",
    extract: Sequence[str] = EXTRACTORS,
    rel_tol: float = 1e-6,
    timeout_s: float | None = 5.0,
    **fields,
) -> list[float | None]:
    """1.0 when the completion's final answer equals the row's ``field`` by value, 0.0 when not (or none is found),
    None when the reference is missing or the symbolic check timed out. See the module docstring for what is
    accepted; ``extract`` chooses and orders the ways the final answer is found."""
    _check_extract(extract)
    refs = _references(fields, field, len(completions))
    out: list[float | None] = []
    for completion, ref in zip(completions, refs):
        ref_text = reference_answer(ref)
        if ref_text is None:
            out.append(None)
            continue
        got = extract_answer(completion, extract)
        if got is None:
            out.append(0.0)
            continue
        same = answers_equal(got, ref_text, rel_tol=rel_tol, timeout_s=timeout_s)
        out.append(None if same is None else float(same))
    return out


def math_format(
    prompts: list[str],
    completions: list[str],
    *,
    form: str = "boxed",
    **fields,
) -> list[float]:
    """Partial credit for the form alone: 1.0 when the completion holds exactly one answer in ``form`` (``boxed``,
    ``hashes`` or ``answer_is``) and it is not empty, else 0.0. Whether the answer is right is ``math_answer``'s
    business; weigh this one low (e.g. 0.1), or a policy learns the form without the maths."""
    _check_extract([form])
    if form == "last_number":
        raise _option_error("form", form, "boxed, hashes or answer_is (a number has no form)")
    out = []
    for c in completions:
        if form == "boxed":
            count = len(_BOX_RE.findall(c))
        else:
            count = len((_HASHES_RE if form == "hashes" else _ANSWER_IS_RE).findall(c))
        got = extract_answer(c, (form,))
        out.append(float(count == 1 and got is not None and normalize(got) != ""))
    return out


def _check_extract(extract: Sequence[str]) -> None:
    if isinstance(extract, str) or not extract or any(e not in EXTRACTORS for e in extract):
        raise _option_error("extract", extract, "a list of " + ", ".join(EXTRACTORS))


def _option_error(key: str, value, choices: str):
    from ..errors import RewardError

    return RewardError(f"math verifier option {key}={value!r} is not valid", where=f"reward.functions.kwargs.{key}",
                       fix=f"use {choices}")

