"""Loading reward functions by spec, without torch (worker processes import this module alone).

A spec is a built-in short name (:data:`BUILTINS`: the rules of :mod:`rlhfkit.rewards.rules` and the verifiers),
``package.module:function`` (dotted attributes allowed: ``module:Class.method``) or ``path/to/file.py:function``.
The object a spec names may also be a **class**: it is then a reward with state (a loaded model, a cache, a
connection), built once per worker process as ``Class(**kwargs)`` and called as ``obj(prompts, completions,
**fields)``; see :func:`instantiate`.

Python callables given to the API (``reward_funcs=[fn]``) become specs too (:func:`spec_of`): ``module:qualname``
when a worker process can import the same object by that name, so it runs in the workers like a file reward; else
(a function of ``__main__`` (a script's, a notebook's), a lambda, a closure) it is kept in this process under
``python:<name>`` (:data:`IN_PROCESS`) and called here, under the same time limit (:func:`is_in_process`).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import RewardError

WHERE = "reward.functions"

# short name -> "module:attribute" (imported on first use, so a worker loads only what its functions need)
BUILTINS: dict[str, str] = {
    "exact_match": "rlhfkit.rewards.rules:exact_match",
    "regex_match": "rlhfkit.rewards.rules:regex_match",
    "format": "rlhfkit.rewards.rules:format_match",
    "length_target": "rlhfkit.rewards.rules:length_target",
    "math_answer": "rlhfkit.rewards.maths:math_answer",
    "math_format": "rlhfkit.rewards.maths:math_format",
    "code_tests": "rlhfkit.rewards.code:code_tests",
    "remote_judge": "rlhfkit.rewards.remote:RemoteJudge",
    "reasoning_gym": "rlhfkit.rewards.reasoning_gym:reasoning_gym_score",
}
FORMS = (
    "write package.module:function, path/to/file.py:function, or a built-in name (" + ", ".join(BUILTINS) + ")"
)


#: callables that no worker can import, kept for calls in this process: ``python:<name>`` -> the callable
IN_PROCESS: dict[str, Callable] = {}
IN_PROCESS_PREFIX = "python:"


def importable_name(obj: Any) -> str | None:
    """``module:qualname`` when importing that module in a fresh interpreter gives back ``obj`` itself (a function
    or class defined at the top level of an importable module), else None (``__main__``, a lambda, a closure, a
    bound method, an instance)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname or module.startswith("_rlhfkit_"):
        return None
    if module not in sys.modules or getattr(sys.modules[module], "__spec__", None) is None:
        return None
    found: Any = sys.modules[module]
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"{module}:{qualname}" if found is obj else None


def spec_of(fn: Any) -> str:
    """The spec a run's config names for the callable ``fn`` (see the module docstring): ``module:qualname``, or
    ``python:<name>`` for one kept in this process (registered here; the same callable keeps its name)."""
    if isinstance(fn, str):
        return fn
    name = importable_name(fn)
    if name is not None:
        return name
    base = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    base = f"{IN_PROCESS_PREFIX}{getattr(fn, '__module__', None) or 'object'}.{base}".replace("<", "").replace(">", "")
    key, k = base, 2
    while key in IN_PROCESS and IN_PROCESS[key] is not fn:
        key, k = f"{base}_{k}", k + 1
    IN_PROCESS[key] = fn
    return key


def is_in_process(spec: Any) -> bool:
    """``spec`` names a callable kept in this process (``python:...``): called here, not in a worker."""
    return isinstance(spec, str) and spec.startswith(IN_PROCESS_PREFIX)


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
    if is_in_process(text):
        if text not in IN_PROCESS:
            raise _fail(text, "it names a Python function given to a trainer in another process",
                        fix="pass the function to the trainer again (rlhfkit.GRPOTrainer(reward_funcs=[fn])), or "
                            "move it into a file and name it as path/to/file.py:function")
        return IN_PROCESS[text]
    if text in BUILTINS:
        module, _, attr = BUILTINS[text].partition(":")
        return getattr(importlib.import_module(module), attr)
    module_part, colon, attr = text.rpartition(":")
    if not colon or not module_part or not attr:
        close = difflib.get_close_matches(text, list(BUILTINS), n=1)
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


def instantiate(obj: Callable, kwargs: dict[str, Any], label: str) -> Callable:
    """What a run calls: ``obj`` itself for a function (its ``kwargs`` bound later, per call), or ``obj(**kwargs)``
    for a class (a reward with state or an environment, built once per worker). A constructor that fails is one
    :class:`RewardError` naming the class and the exception."""
    if not isinstance(obj, type):
        return obj
    try:
        made = obj(**kwargs)
    except RewardError:
        raise
    except Exception as exc:
        raise RewardError(f"reward class {label} could not be built: {type(exc).__name__}: {exc}", where=WHERE,
                          fix="check the class's keyword arguments (kwargs) and its __init__") from None
    return made
