"""Progress with ETA: a live rich bar on a terminal, plain lines in logs and CI.

Off a terminal a line is printed every ~10% of the way, or after 30 s without one:
``[sft] 120/400 (30%) elapsed 0:00:30 eta 0:01:10 4.00 step/s loss=1.234 lr=5e-4``.
Rate and ETA count only the steps done by this process, so a resumed run (``initial=k``) is not credited
with the steps it skipped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from rich import progress as rp
from rich.console import Console
from rich.text import Text

from .console import get_console


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


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    return str(timedelta(seconds=int(seconds)))


def format_rate(rate: float, unit: str) -> str:
    """``4.00 step/s``, or ``12.5 s/step`` when a unit takes longer than a second."""
    if rate <= 0:
        return f"? {unit}/s"
    return f"{rate:.2f} {unit}/s" if rate >= 1 else f"{1 / rate:.1f} s/{unit}"


class Progress:
    """Counts steps toward ``total`` and shows elapsed time, ETA, rate and the metrics named in ``show``."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "step",
        show: Sequence[str] = (),
        is_main: bool = True,
        console: Console | None = None,
        initial: int = 0,
        every_frac: float = 0.1,
        every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total, self.desc, self.unit, self.show = total, desc, unit, tuple(show)
        self.is_main = is_main
        self.console = console or get_console()
        self.n = self.initial = initial
        self.metrics: dict[str, Any] = {}
        self._every_n = max(1, math.ceil(total * every_frac))
        self._every_s = every_s
        self._clock = clock
        self._start = clock()
        self._last_print_n, self._last_print_t = initial, self._start
        self._live: rp.Progress | None = None
        self._task = None
        self._closed = False

    # -- what is shown -------------------------------------------------------------------------------------
    def rate(self) -> float:
        """Units per second done by this process since it started (0 before the first unit)."""
        elapsed = self._clock() - self._start
        return (self.n - self.initial) / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float | None:
        rate = self.rate()
        return max(self.total - self.n, 0) / rate if rate > 0 else None

    def _stats(self) -> str:
        parts = [
            f"elapsed {format_duration(self._clock() - self._start)}",
            f"eta {format_duration(self.eta())}",
            format_rate(self.rate(), self.unit),
        ]
        parts += [f"{k}={format_number(self.metrics[k])}" for k in self.show if k in self.metrics]
        return " ".join(parts)

    def line(self) -> str:
        """The plain-text status line, e.g. ``[sft] 120/400 (30%) elapsed 0:00:30 eta 0:01:10 ...``."""
        pct = 100 * self.n / self.total if self.total else 100.0
        return f"[{self.desc}] {self.n}/{self.total} ({pct:.0f}%) {self._stats()}"

    # -- updating ------------------------------------------------------------------------------------------
    def update(self, n: int = 1, metrics: Mapping[str, Any] | None = None) -> None:
        """Advance by ``n`` units and remember the latest ``metrics`` (only the keys in ``show`` are shown)."""
        self.n += n
        if metrics:
            self.metrics.update(metrics)
        if not self.is_main:
            return
        if self.console.is_terminal:
            self._refresh_live()
        elif self._plain_due():
            self._print_line()

    def set_description(self, desc: str) -> None:
        self.desc = desc
        if self._live is not None:
            self._live.update(self._task, description=desc)

    def _plain_due(self) -> bool:
        return (
            self.n - self._last_print_n >= self._every_n
            or self._clock() - self._last_print_t >= self._every_s
            or (self.n >= self.total and self._last_print_n < self.total)
        )

    def _print_line(self) -> None:
        self.console.print(Text(self.line()), soft_wrap=True)
        self._last_print_n, self._last_print_t = self.n, self._clock()

    def _refresh_live(self) -> None:
        if self._live is None:
            self._live = rp.Progress(
                rp.TextColumn("{task.description}", style="bold", markup=False),
                rp.BarColumn(),
                rp.MofNCompleteColumn(),
                rp.TaskProgressColumn(),
                rp.TextColumn("{task.fields[stats]}", markup=False),  # metric text is never markup
                console=self.console,
            )
            self._task = self._live.add_task(self.desc, total=self.total, completed=self.n, stats="")
            self._live.start()
        self._live.update(self._task, completed=self.n, stats=self._stats())

    def close(self) -> None:
        """Stop the live bar, or print the last line if the plain output has not shown the final count."""
        if self._closed:
            return
        self._closed = True
        if self._live is not None:
            self._live.stop()
        elif self.is_main and not self.console.is_terminal and self.n != self._last_print_n:
            self._print_line()

    def __enter__(self) -> Progress:
        if self.is_main and self.console.is_terminal:
            self._refresh_live()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
