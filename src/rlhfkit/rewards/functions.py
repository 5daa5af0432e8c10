"""Reward functions given by name: loading ``package.module:function`` / ``path/to/file.py:function`` / built-in
short names, and :class:`CombinedRewards`, the weighted sum of several functions with per-function metrics.

A reward function is called as ``fn(prompts, completions, **fields)`` (see :mod:`rlhfkit.rewards.rules`) and
returns one ``float`` or ``None`` per completion; ``None`` skips that function for that sample.

What a run does with what a function returns (:meth:`CombinedRewards.__call__`):

- a list of the wrong length, a non-list (a scalar, a string), a string or other non-number in the list:
  :class:`~rlhfkit.errors.RewardError` naming the function and what it returned (one line, exit 2);
- NaN or inf for a sample, or a sample no function has a value for (``None`` from every function): that sample is
  *dropped* from the step (``valid`` is False, its total is 0, counted in ``rewards/dropped``), never propagated;
- ``None`` (or NaN / inf) for every sample of a batch: ``RewardError`` (nothing to learn from, almost always a bug);
- an exception inside the function: :class:`RewardFunctionError` naming the function, the exception and the step.

The first call (on the first rollout) is the check: it raises before a trainer writes anything, when the trainer
scores its first rollout before it touches the run directory. :meth:`CombinedRewards.probe` runs the same
structural checks on dataset prompts with placeholder completions, before any weights load.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..errors import RewardError
from .rules import RULES

WHERE = "reward.functions"
FORMS = (
    "write package.module:function, path/to/file.py:function, or a built-in name (" + ", ".join(RULES) + ")"
)


class RewardFunctionError(RewardError):
    """A reward function raised an exception while scoring (named with the step, in one line)."""


def _fail(spec: str, reason: str, fix: str = FORMS) -> RewardError:
    return RewardError(f"cannot load reward function {spec!r}: {reason}", where=WHERE, fix=fix)


def _import_file(spec: str, path_text: str):
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise _fail(spec, f"file {str(path)!r} not found (relative paths start at {os.getcwd()})",
                    fix="give the path of an existing .py file, absolute or relative to the working directory")
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    name = f"_rlhfkit_reward_{resolved.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise _fail(spec, f"{str(path)!r} is not an importable Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses / pickling inside the file need their module registered
    sys.path.insert(0, str(resolved.parent))  # so the file can import its neighbours
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise _import_failed(spec, str(path), exc) from exc
    finally:
        sys.path.remove(str(resolved.parent))
    return module


def _import_failed(spec: str, what: str, exc: BaseException) -> RewardError:
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SyntaxError) and exc.lineno:
        detail = f"SyntaxError at {exc.filename}:{exc.lineno}: {exc.msg}"
    return _fail(spec, f"importing {what} failed ({detail})",
                 fix="fix the error in that module (import it in Python to see the traceback)")


def _missing(exc: ModuleNotFoundError, module: str) -> bool:
    """True when ``exc`` says ``module`` itself (or a parent package of it) does not exist."""
    return exc.name is not None and (module == exc.name or module.startswith(exc.name + "."))


def _import_module(spec: str, module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if not _missing(exc, module):
            raise _import_failed(spec, f"module {module!r}", exc) from exc
        cwd = os.getcwd()
        if cwd in sys.path or "" in sys.path:
            raise _fail(spec, f"module {module!r} not found", fix=_module_fix(module)) from None
    except Exception as exc:
        raise _import_failed(spec, f"module {module!r}", exc) from exc
    sys.path.append(cwd)  # console scripts do not put the working directory on sys.path; users expect it
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if _missing(exc, module):
            sys.path.remove(cwd)
            raise _fail(spec, f"module {module!r} not found", fix=_module_fix(module)) from None
        raise _import_failed(spec, f"module {module!r}", exc) from exc
    except Exception as exc:
        raise _import_failed(spec, f"module {module!r}", exc) from exc


def _module_fix(module: str) -> str:
    return (
        f"make {module!r} importable (install the package, or run from the directory that holds "
        f"{module.replace('.', '/')}.py), or give a file path: path/to/file.py:function"
    )


def load_reward_function(spec: str) -> Callable[..., list]:
    """The callable named by ``spec``: a built-in short name, ``package.module:function`` (dotted attributes
    allowed: ``module:Class.method``) or ``path/to/file.py:function``. Raises :class:`RewardError` naming the spec."""
    text = str(spec).strip()
    if text in RULES:
        return RULES[text]
    module_part, colon, attr = text.rpartition(":")
    if not colon or not module_part or not attr:
        close = difflib.get_close_matches(text, list(RULES), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise _fail(text, "not a built-in name and not of the form module:function", fix=hint + FORMS)
    is_file = module_part.endswith(".py") or "/" in module_part or os.sep in module_part
    module = _import_file(text, module_part) if is_file else _import_module(text, module_part)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise _fail(text, f"{module_part!r} has no attribute {part!r}",
                        fix=f"{hint}check the function name after ':'")  # fmt: skip
        obj = getattr(obj, part)
    if not callable(obj):
        raise _fail(text, f"{attr!r} is a {type(obj).__name__}, not a function",
                    fix="point at a function fn(prompts, completions, **fields) -> list[float | None]")  # fmt: skip
    return obj


# ───────────────────────────────────────────── combining ─────────────────────────────────────────────


@dataclass
class RewardFunctionSpec:
    """One reward function of a run: what to load, its weight in the total, its log name, its keyword options."""

    fn: str | Callable[..., list]
    weight: float = 1.0
    name: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


def _as_spec(item: Any) -> RewardFunctionSpec:
    if isinstance(item, RewardFunctionSpec):
        return item
    if isinstance(item, str) or callable(item):
        return RewardFunctionSpec(fn=item)
    if isinstance(item, dict):
        return RewardFunctionSpec(**item)
    if hasattr(item, "fn"):  # e.g. rlhfkit.config.RewardFunction
        return RewardFunctionSpec(
            fn=item.fn,
            weight=getattr(item, "weight", 1.0),
            name=getattr(item, "name", None),
            kwargs=dict(getattr(item, "kwargs", None) or {}),
        )
    raise TypeError(f"cannot make a reward function spec from {item!r}")


def _default_name(fn: str | Callable) -> str:
    if callable(fn):
        return getattr(fn, "__name__", type(fn).__name__)
    text = fn.strip()
    return text.rpartition(":")[2].rpartition(".")[2] or text


def _label(fn: str | Callable) -> str:
    if callable(fn):
        return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', _default_name(fn))}"
    return fn


@dataclass
class _Loaded:
    name: str
    label: str  # how the user wrote it, for error messages
    fn: Callable[..., Any]
    weight: float
    reserved: frozenset  # field names that must not be passed (the spec's kwargs, the positional names)
    accepts: frozenset | None  # named parameters, or None when the function takes **fields


def _to_float(value: Any, label: str, index: int, at: str = "") -> float | None:
    """One returned value as a float (NaN / inf kept: the caller drops those samples) or None."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        try:
            value = value.item()
        except (TypeError, ValueError):
            pass
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RewardError(
            f"function {label} returned a {type(value).__name__} ({value!r:.40}) at index {index}{at}",
            where=WHERE,
            fix="return a list with one float (or None to skip the sample) per completion",
        )
    return float(value)


def _at(step: int | None) -> str:
    return "" if step is None else f" at step {step}"


class RewardScores(NamedTuple):
    """What :class:`CombinedRewards` returns for a batch of B completions.

    total: [B] float32, the weighted sum (0 where not ``valid``); per_function: {name: [B] float32, NaN where the
    function gave None}; metrics: ``rewards/<name>/mean`` (over valid samples with a value), ``rewards/none_frac``,
    ``rewards/dropped`` (number of samples dropped); valid: [B] bool, False for the samples dropped from the step.
    """

    total: torch.Tensor
    per_function: dict[str, torch.Tensor]
    metrics: dict[str, float]
    valid: torch.Tensor


class CombinedRewards:
    """The weighted sum of reward functions, skipping ``None`` values and dropping samples without a finite value.

    ``total[b] = sum_f weight_f * r_f[b]`` over the functions with a value for sample ``b`` (a ``None`` contributes
    nothing). Sample ``b`` is dropped (``valid[b]`` False, total 0) when a function returned NaN / inf for it or no
    function gave it a value; see the module docstring for every other case.
    """

    def __init__(self, specs: Sequence[RewardFunctionSpec | str | dict | Any]):
        specs = [_as_spec(s) for s in specs]
        if not specs:
            raise ValueError("CombinedRewards needs at least one reward function")
        self.functions: list[_Loaded] = []
        taken: set[str] = set()
        for spec in specs:
            label = _label(spec.fn)
            fn = spec.fn if callable(spec.fn) else load_reward_function(spec.fn)
            try:
                weight = float(spec.weight)
            except (TypeError, ValueError):
                weight = float("nan")
            if not math.isfinite(weight):
                raise RewardError(
                    f"function {label} has weight {spec.weight!r}", where=WHERE, fix="use a finite number"
                )
            kwargs = dict(spec.kwargs or {})
            if kwargs:
                _check_kwargs(label, fn, kwargs)
                fn = functools.partial(fn, **kwargs)
            if spec.name:
                name = spec.name
                if name in taken:
                    raise RewardError(f"two reward functions are named {name!r}", where=WHERE,
                                      fix="give each function its own `name`")  # fmt: skip
            else:
                base = name = _default_name(spec.fn)
                k = 2
                while name in taken:
                    name, k = f"{base}_{k}", k + 1
            taken.add(name)
            self.functions.append(
                _Loaded(
                    name=name,
                    label=label,
                    fn=fn,
                    weight=weight,
                    reserved=frozenset(kwargs) | {"prompts", "completions"},
                    accepts=_named_params(fn),
                )
            )

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.functions]

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], rows: Sequence[dict], *, step: int | None = None,
        allow_all_dropped: bool = False,
    ) -> RewardScores:
        """Score ``completions`` -> :class:`RewardScores` (total, per_function, metrics, valid).

        ``rows`` are the dataset records of the prompts (their columns become the functions' ``**fields``);
        ``step`` (optional) is named in errors. Raises :class:`RewardError` / :class:`RewardFunctionError` as the
        module docstring says (``allow_all_dropped``: a batch without any valid sample is returned, not an error —
        for evaluation, whose batches may be a single prompt); never returns a non-finite total.
        """
        B = len(completions)
        if len(prompts) != B or len(rows) != B:
            raise ValueError(f"got {len(prompts)} prompts, {B} completions and {len(rows)} rows")
        outputs = self._call_each(prompts, completions, rows, step)
        total = torch.zeros(B, dtype=torch.float32)
        covered = torch.zeros(B, dtype=torch.bool)
        finite = torch.ones(B, dtype=torch.bool)
        per_function: dict[str, torch.Tensor] = {}
        for f, values in zip(self.functions, outputs):
            present = torch.tensor([v is not None for v in values], dtype=torch.bool)
            scores = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float32)
            per_function[f.name] = scores
            bad = present & ~torch.isfinite(scores)
            finite &= ~bad
            total += f.weight * torch.where(present & ~bad, scores, torch.zeros_like(scores))
            covered |= present
        valid = covered & finite
        if B and not valid.any() and not allow_all_dropped:
            what = ", ".join(f"{f.label} -> {_summary(v)}" for f, v in zip(self.functions, outputs))
            raise RewardError(f"no completion of the batch{_at(step)} got a finite reward ({what})", where=WHERE,
                              fix="return a float for (most) completions; None only for those a function cannot "
                                  "judge")
        total = torch.where(valid, total, torch.zeros_like(total))
        metrics: dict[str, float] = {}
        for f in self.functions:
            scores = per_function[f.name]
            kept = valid & ~torch.isnan(scores)
            if kept.any():
                metrics[f"rewards/{f.name}/mean"] = float(scores[kept].mean())
        metrics["rewards/none_frac"] = float((~covered).float().mean()) if B else 0.0
        metrics["rewards/dropped"] = float((~valid).sum())
        return RewardScores(total, per_function, metrics, valid)

    def probe(self, prompts: Sequence[str], rows: Sequence[dict], completions: Sequence[str] | None = None) -> None:
        """Structural check before any weights load: each function is called on dataset prompts with placeholder
        completions (default: the empty string) and must return a list of one number / None per completion.
        Wrong length, a non-list, strings, a :class:`RewardError` raised by the function (a built-in rule missing
        an option): :class:`RewardError`. Other exceptions and None / NaN are *not* errors here
        (a function may legitimately fail on a placeholder); the first real rollout checks those."""
        completions = list(completions) if completions is not None else [""] * len(prompts)
        for f in self.functions:
            try:
                out = f.fn(list(prompts), list(completions), **self._fields(f, rows))
            except RewardError:  # a built-in rule's own one-line complaint (a missing option): answer it now
                raise
            except Exception:  # judged on the first rollout, where the completions are real
                continue
            self._validate(f.label, out, len(completions), "on a probe with placeholder completions")

    @staticmethod
    def _fields(f: _Loaded, rows: Sequence[dict]) -> dict[str, list]:
        """The dataset columns ``f`` takes, as lists over ``rows`` (missing values None)."""
        names: dict[str, None] = {}
        for row in rows:
            names.update(dict.fromkeys(row))
        return {k: [row.get(k) for row in rows] for k in names
                if k not in f.reserved and (f.accepts is None or k in f.accepts)}

    def _call_each(self, prompts, completions, rows, step: int | None) -> list[list[float | None]]:
        outputs = []
        for f in self.functions:
            try:
                out = f.fn(list(prompts), list(completions), **self._fields(f, rows))
            except RewardError:
                raise
            except Exception as exc:
                detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise RewardFunctionError(
                    f"reward function {f.label} raised {type(exc).__name__}{': ' + detail if detail else ''}"
                    f"{_at(step)}", where=WHERE,
                    fix="fix the function (call it on these completions in Python to see the traceback), or "
                        "return None for completions it cannot judge") from exc
            outputs.append(self._validate(f.label, out, len(completions), _at(step).strip()))
        return outputs

    @staticmethod
    def _validate(label: str, out: Any, n: int, when: str = "") -> list[float | None]:
        at = f" {when}" if when else ""
        if isinstance(out, torch.Tensor) or type(out).__module__ == "numpy":
            out = out.tolist() if hasattr(out, "tolist") else out
        if not isinstance(out, (list, tuple)):
            raise RewardError(
                f"function {label} returned a {type(out).__name__} ({out!r:.40}), not a list{at}",
                where=WHERE,
                fix="return a list with one float (or None) per completion",
            )
        if len(out) != n:
            raise RewardError(
                f"function {label} returned {len(out)} values for {n} completions{at}",
                where=WHERE,
                fix="return exactly one value per completion (None to skip one)",
            )
        return [_to_float(v, label, i, at) for i, v in enumerate(out)]


def _summary(values: list[float | None]) -> str:
    """What a function returned for a batch, in a few words: "None x 8", "nan x 3, None x 5"."""
    counts: dict[str, int] = {}
    for v in values:
        key = "None" if v is None else ("a number" if math.isfinite(v) else repr(v))
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{k} x {n}" for k, n in counts.items())


def _check_kwargs(label: str, fn: Callable, kwargs: dict) -> None:
    """The configured ``kwargs`` must be parameters of ``fn`` (unless it takes ``**kwargs``): a misspelt option is
    answered when the run starts, not as a TypeError on the first rollout."""
    accepted = _named_params(fn)
    if accepted is None:
        return
    for key in kwargs:
        if key not in accepted:
            close = difflib.get_close_matches(key, sorted(accepted - {"prompts", "completions"}), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise RewardError(f"function {label} has no parameter {key!r} (given in kwargs)", where=WHERE,
                              fix=f"{hint}pass only the function's own keyword arguments")


def _named_params(fn: Callable) -> frozenset | None:
    """Keyword-passable parameter names of ``fn``, or ``None`` when it takes ``**kwargs`` (or cannot be inspected)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
