"""Progress with ETA: a live rich bar on a terminal, plain lines in logs and CI, and the run's closing line.

Off a terminal a line is printed every ~10% of the way, or after 30 s without one, as one record per line (never
wrapped, no ``\r``): ``[sft] 120/400 (30%) elapsed 0:00:30 eta 0:01:10 4.00 step/s loss=1.234 lr=5e-4``.
On a terminal the bar shows the counter and ``elapsed<eta`` before the metrics, and cuts the metrics (never the
counter) to the console's width. Metrics are shown under short names (:func:`short_name`: ``objective/kl`` ->
``kl``, ``eval/loss`` -> ``eval_loss``), so an eval value is never shown under a train name.
Rate and ETA count only the steps done by this process, so a resumed run (``initial=k``) is not credited
with the steps it skipped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from rich import progress as rp
from rich.console import Console
from rich.table import Column
from rich.text import Text

from .console import format_number, get_console
from .health import read_warnings
from .metrics import read_metrics

# short names of the metrics the bars show (TRL names are long); anything else: its last part, eval_ for eval/
SHORT_NAMES = {
    "objective/scores": "score", "objective/kl": "kl", "objective/entropy": "seq_ent",
    "objective/rlhf_reward": "rlhf_reward", "val/ratio": "ratio", "response/length_mean": "len",
    "policy/entropy_avg": "ent", "policy/approxkl_avg": "approxkl", "policy/clipfrac_avg": "clipfrac",
    "loss/policy_avg": "pg_loss", "loss/value_avg": "vf_loss", "val/eos_frac": "eos",
    "train/rewards/accuracies": "acc", "eval/rewards/accuracies": "eval_acc",
    "train/rewards/margins": "margin", "eval/rewards/margins": "eval_margin",
}


def short_name(key: str) -> str:
    """The name a metric is shown under: ``SHORT_NAMES``, else its last part (``eval_`` + it for ``eval/...``)."""
    if key in SHORT_NAMES:
        return SHORT_NAMES[key]
    tail = key.rsplit("/", 1)[-1]
    return f"eval_{tail}" if key.startswith("eval/") else tail


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
    """Counts steps toward ``total`` and shows elapsed time, ETA, rate and the metrics named in ``show`` (``None``:
    every metric passed to ``update``, in the order they first came)."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "step",
        show: Sequence[str] | None = (),
        is_main: bool = True,
        console: Console | None = None,
        initial: int = 0,
        every_frac: float = 0.1,
        every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total, self.desc, self.unit = total, desc, unit
        self._show_all = show is None
        self.show: tuple[str, ...] = () if show is None else tuple(show)
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

    def _metric_text(self) -> str:
        return " ".join(f"{short_name(k)}={format_number(self.metrics[k])}" for k in self.show if k in self.metrics)

    def _stats(self) -> str:
        parts = [
            f"elapsed {format_duration(self._clock() - self._start)}",
            f"eta {format_duration(self.eta())}",
            format_rate(self.rate(), self.unit),
            self._metric_text(),
        ]
        return " ".join(p for p in parts if p)

    def _live_stats(self, budget: int) -> str:
        """``elapsed<eta rate metrics`` in at most ``budget`` characters: the metrics are cut, never the time."""
        head = f"{format_duration(self._clock() - self._start)}<{format_duration(self.eta())} " \
               f"{format_rate(self.rate(), self.unit)}"
        metrics = self._metric_text()
        room = budget - len(head) - 1
        if metrics and room > 1:
            head += " " + (metrics if len(metrics) <= room else metrics[: room - 1] + "…")
        return head

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
            if self._show_all:
                self.show += tuple(k for k in metrics if k not in self.show)
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

    BAR_WIDTH = 12

    def _refresh_live(self) -> None:
        if self._live is None:
            no_wrap = Column(no_wrap=True, overflow="ellipsis")
            self._live = rp.Progress(
                rp.TextColumn("{task.description}", style="bold", markup=False),
                rp.BarColumn(bar_width=self.BAR_WIDTH),
                rp.MofNCompleteColumn(),
                rp.TaskProgressColumn(),
                rp.TextColumn("{task.fields[stats]}", markup=False, table_column=no_wrap),  # never markup
                console=self.console,
            )
            self._task = self._live.add_task(self.desc, total=self.total, completed=self.n, stats="")
            self._live.start()
        # what the other columns take: description, bar, "n/total", " 100%", and the gaps between columns
        used = len(self.desc) + self.BAR_WIDTH + 2 * len(str(self.total)) + 1 + 4 + 4
        self._live.update(self._task, completed=self.n, stats=self._live_stats(self.console.width - used - 1))

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


def run_summary_line(name: str, run_dir: str | Path, seconds: float | None = None, max_metrics: int = 4,
                     since: float | None = None) -> str:
    """The one line a run ends with: its key metrics from start to end, its health warnings, and the report (or the
    run directory when there is no report), e.g. ``[grpo] finished in 23 s: score 0.1 -> 0.6, kl 0 -> 3.2;
    1 health warning (0 critical); report /runs/grpo/report.html``. A report older than ``since`` (a time stamp)
    is a previous run's and not named."""
    run_dir = Path(run_dir)
    first: dict[str, Any] = {}
    last: dict[str, Any] = {}
    for row in read_metrics(run_dir):
        for k, v in row.items():
            if k in ("step", "time") or isinstance(v, bool) or not isinstance(v, (int, float)) \
                    or not math.isfinite(v):
                continue
            first.setdefault(k, v)
            last[k] = v
    keys = [k for k in KEY_METRICS if k in last][:max_metrics]
    parts = [f"{short_name(k)} {format_number(first[k])} -> {format_number(last[k])}" for k in keys]
    took = f" in {format_duration(seconds)}" if seconds is not None else ""
    line = f"[{name}] finished{took}" + (": " + ", ".join(parts) if parts else "")
    warns = read_warnings(run_dir)
    if warns:
        crit = sum(w.get("severity") == "critical" for w in warns)
        line += f"; {len(warns)} health warning{'s' if len(warns) > 1 else ''} ({crit} critical, warnings.jsonl)"
    report = run_dir / "report.html"
    fresh = report.is_file() and (since is None or report.stat().st_mtime >= since)
    line += f"; report {report.resolve()}" if fresh else f"; run directory {run_dir.resolve()}"
    return line


KEY_METRICS = ("objective/scores", "eval/scores", "objective/kl", "train/loss", "eval/loss", "eval/accuracy",
               "eval/rewards/accuracies", "train/accuracy", "train/rewards/accuracies")
