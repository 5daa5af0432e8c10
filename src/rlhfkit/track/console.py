"""The shared rich console, ``print0`` (print on the main process only, after nanochat's helper), the short form
of a number every printed line uses (:func:`format_number`: progress bars, health warnings, the closing line), and
:func:`silence_libraries`: the Hugging Face libraries' own warnings and progress bars off while rlhfkit prints."""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from rich.console import Console


def _stdout_is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        return False


@lru_cache(maxsize=1)
def get_console() -> Console:
    """The one console everything in rlhfkit prints to: stdout; off a TTY no colours and no wrapping (a log keeps
    one message per line, however long)."""
    tty = _stdout_is_tty()
    return Console(stderr=False, no_color=not tty, soft_wrap=not tty)


def print0(*args, is_main: bool = True, console: Console | None = None, **kwargs) -> None:
    """Print through the shared console, only on the main process (no-op when ``is_main`` is False)."""
    if not is_main:
        return
    kwargs.setdefault("soft_wrap", True)  # log files keep one message per line
    (console or get_console()).print(*args, **kwargs)


def format_number(value: Any) -> str:
    """Short form of a metric: 4 significant digits, exponent form for very small or large numbers."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, (bool, int)) or not isinstance(value, float):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        mantissa, exponent = f"{value:.3e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return f"{value:.4g}"


_LIBRARIES = r"(transformers|peft|accelerate|torch|huggingface_hub|datasets)(\.|$)"


def silence_libraries() -> Callable[[], None]:
    """Offline by default; no progress bars, advisory messages or Future / Deprecation warnings from transformers,
    peft, accelerate, torch, the Hub and datasets (rlhfkit's console says what a run does). Returns a function that
    restores the libraries' verbosity, progress bars and the warning filters as they were (the Python API restores
    them after a run; the CLI's process just ends)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    filters = list(warnings.filters)
    warnings.filterwarnings("ignore", category=FutureWarning, module=_LIBRARIES)
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=_LIBRARIES)
    undo: list[Callable[[], None]] = []
    try:
        from transformers.utils import logging as hf_logging

        level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        undo.append(lambda: (hf_logging.set_verbosity(level), bars and hf_logging.enable_progress_bar()))
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    try:
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

        hub_off = are_progress_bars_disabled()
        disable_progress_bars()
        undo.append(lambda: hub_off or enable_progress_bars())
    except ImportError:  # pragma: no cover
        pass
    try:
        import datasets

        ds_level, ds_bars = datasets.logging.get_verbosity(), datasets.is_progress_bar_enabled()
        datasets.logging.set_verbosity_error()
        datasets.disable_progress_bars()
        undo.append(lambda: (datasets.logging.set_verbosity(ds_level), ds_bars and datasets.enable_progress_bars()))
    except ImportError:  # pragma: no cover
        pass

    def restore() -> None:
        warnings.filters[:] = filters
        for fn in undo:
            fn()

    return restore
