"""The shared rich console and ``print0`` (print on the main process only), after nanochat's helper."""

from __future__ import annotations

import sys
from functools import lru_cache

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
