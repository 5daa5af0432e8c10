"""Reward functions given by name: loading ``package.module:function`` / ``path/to/file.py:function`` / built-in
short names, and :class:`CombinedRewards`, the weighted sum of several functions with per-function metrics.

A reward function is called as ``fn(prompts, completions, **fields)`` (see :mod:`rlhfkit.rewards.rules`) and
returns one ``float`` or ``None`` per completion; ``None`` skips that function for that sample.
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
from typing import Any

import torch

from ..errors import RewardError
from .rules import RULES

WHERE = "reward.functions"
FORMS = (
    "write package.module:function, path/to/file.py:function, or a built-in name (" + ", ".join(RULES) + ")"
)


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


def _to_float(value: Any, label: str, index: int) -> float | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        try:
            value = value.item()
        except (TypeError, ValueError):
            pass
    if not isinstance(value, numbers.Real):
        raise RewardError(
            f"function {label} returned a {type(value).__name__} ({value!r:.40}) at index {index}",
            where=WHERE,
            fix="return a list with one float (or None to skip the sample) per completion",
        )
    out = float(value)
    if not math.isfinite(out):
        raise RewardError(
            f"function {label} returned {out} at index {index}",
            where=WHERE,
            fix="return a finite float, or None to skip the sample",
        )
    return out


class CombinedRewards:
    """The weighted sum of reward functions, skipping ``None`` values.

    ``total[b] = sum_f weight_f * r_f[b]`` over the functions with a value for sample ``b`` (a ``None`` contributes
    nothing); a sample with no value from any function gets 0 and counts in ``rewards/none_frac``.
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
        self, prompts: Sequence[str], completions: Sequence[str], rows: Sequence[dict]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, float]]:
        """Score ``completions`` -> ``(total [B] float32, {name: [B] float32 with NaN where None}, metrics)``.

        ``rows`` are the dataset records of the prompts (their columns become the functions' ``**fields``).
        """
        B = len(completions)
        if len(prompts) != B or len(rows) != B:
            raise ValueError(f"got {len(prompts)} prompts, {B} completions and {len(rows)} rows")
        columns: dict[str, list] = {}
        for row in rows:
            for key in row:
                columns.setdefault(key, [])
        for key in columns:
            columns[key] = [row.get(key) for row in rows]

        total = torch.zeros(B, dtype=torch.float32)
        covered = torch.zeros(B, dtype=torch.bool)
        per_function: dict[str, torch.Tensor] = {}
        metrics: dict[str, float] = {}
        for f in self.functions:
            fields = {
                k: v
                for k, v in columns.items()
                if k not in f.reserved and (f.accepts is None or k in f.accepts)
            }
            try:
                out = f.fn(list(prompts), list(completions), **fields)
            except RewardError:
                raise
            except Exception as exc:
                if hasattr(exc, "add_note"):
                    exc.add_note(f"(raised by reward function {f.label})")
                raise
            values = self._validate(f.label, out, B)
            present = torch.tensor([v is not None for v in values], dtype=torch.bool)
            scores = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float32)
            per_function[f.name] = scores
            total += f.weight * torch.where(present, scores, torch.zeros_like(scores))
            covered |= present
            if present.any():
                metrics[f"rewards/{f.name}/mean"] = float(scores[present].mean())
        metrics["rewards/none_frac"] = float((~covered).float().mean()) if B else 0.0
        return total, per_function, metrics

    @staticmethod
    def _validate(label: str, out: Any, n: int) -> list[float | None]:
        if isinstance(out, torch.Tensor) or type(out).__module__ == "numpy":
            out = out.tolist() if hasattr(out, "tolist") else out
        if not isinstance(out, (list, tuple)):
            raise RewardError(
                f"function {label} returned a {type(out).__name__}, not a list",
                where=WHERE,
                fix="return a list with one float (or None) per completion",
            )
        if len(out) != n:
            raise RewardError(
                f"function {label} returned {len(out)} values for {n} completions",
                where=WHERE,
                fix="return exactly one value per completion (None to skip one)",
            )
        return [_to_float(v, label, i) for i, v in enumerate(out)]


def _named_params(fn: Callable) -> frozenset | None:
    """Keyword-passable parameter names of ``fn``, or ``None`` when it takes ``**kwargs`` (or cannot be inspected)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
