"""The shared rich console, ``print0`` (print on the main process only, after nanochat's helper), and the short form
of a number every printed line uses (:func:`format_number`: progress bars, health warnings, the closing line)."""

from __future__ import annotations

import math
import sys
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
