"""Progress with ETA: a live rich bar on a terminal, plain lines in logs and CI, and the run's closing line.

Off a terminal a line is printed every ~10% of the way, or after 30 s without one, as one record per line (never
wrapped, no ``\r``): ``[sft] 120/400 (30%) elapsed 0:00:30 eta 0:01:10 4.00 step/s loss=1.234 lr=5e-4``.
During a long step a ticker thread prints one at least every 30 s, with the phase the loop reports
(``[rollout 24/64 sequences]``). On a terminal rich redraws the line on its own thread (the clock ticks between
updates) and drops the least important pieces (other metrics, rate, bar) before the counter, the ETA, the phase and
the recipe's key metrics. Metrics are shown under short names (:func:`short_name`: ``objective/kl``, the KL summed
over an answer, -> ``seq_kl``, so that ``kl`` is per token as in TRL and in a grpo run's ``metrics.jsonl``;
``eval/loss`` -> ``eval_loss``), so an eval value is never shown under a train name.
Rate and ETA count only the steps done by this process, so a resumed run (``initial=k``) is not credited
with the steps it skipped, and come from :class:`EtaEstimator`: the recent steps' mean time (not the whole run's
average: on a machine that slows down, the average made the quickstart's ETAs 4x too low), the first step left out
once others exist (compile, warm-up, the first evaluation), and the step in progress counted by its phases.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from rich import progress as rp
from rich.console import Console
from rich.table import Column
from rich.text import Text

from .console import format_number, get_console
from .health import read_warnings
from .metrics import read_metrics, read_run_metrics

# short names of the metrics the bars show (TRL names are long); anything else: its last part, eval_ for eval/
SHORT_NAMES = {
    "objective/scores": "score", "objective/kl": "seq_kl", "objective/kl_per_token": "kl",
    "objective/entropy": "seq_ent",
    "objective/rlhf_reward": "rlhf_reward", "val/ratio": "ratio", "response/length_mean": "len",
    "policy/entropy_avg": "ent", "policy/approxkl_avg": "approxkl", "policy/clipfrac_avg": "clipfrac",
    "loss/policy_avg": "pg_loss", "loss/value_avg": "vf_loss", "val/eos_frac": "eos",
    "train/rewards/accuracies": "acc", "eval/rewards/accuracies": "eval_acc",
    "train/rewards/margins": "margin", "eval/rewards/margins": "eval_margin",
    "time/step": "step_s", "time/rollout": "rollout_s", "time/reward": "reward_s", "time/reference": "ref_s",
    "time/old_logprobs": "old_s", "time/values": "values_s", "time/update": "update_s",
    "throughput/tokens_per_s": "tok/s", "throughput/episodes_per_s": "ep/s",
    "distill/argmax_agreement": "agreement", "eval/distill/argmax_agreement": "eval_agreement",
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


class Phases(Protocol):
    """What a training loop reports about the step in progress, without knowing how it is shown: the phase it is in
    (``rollout``, ``reward``, ``update``, ``eval``), with its own count where it has one (``rollout 24/64
    sequences``, ``update 2/4``). :class:`Progress` shows it; :data:`NO_PHASES` ignores it."""

    def phase(self, name: str, total: int | None = None, unit: str = "") -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def detail(self, text: str) -> None:
        """A word on where the phase is inside its current unit (``3 ended, token 64/512``)."""


class _NoPhases:
    def phase(self, name: str, total: int | None = None, unit: str = "") -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def detail(self, text: str) -> None:
        pass


NO_PHASES: Phases = _NoPhases()


class EtaEstimator:
    """Seconds left of a run of ``total`` units (steps), from when each unit ended and the phases inside the units.

    * **Recent units, not the run's average.** The time per unit is the mean of the last ``max(window, done / 4)``
      units: a loaded machine that slows down (the quickstart's SFT went from 9.7 to 2 updates/s) or steps that grow
      (longer responses) move the estimate within a few steps; the run's average kept the early speed and gave ETAs
      4x too low.
    * **Warm-up left out.** The first unit this process did (compile, cache warm-up, the first evaluation) is left
      out as soon as a second one ended.
    * **The unit in progress, by its phases.** The phases a loop reports (:class:`Phases`: rollout, reward, update,
      ...) are timed per unit; within a unit, the part left is the typical share of the phases not yet done (the
      current one by its own count, ``update 2/4``, else by its time), so the ETA falls steadily inside a long step
      instead of standing still and jumping. Without phases: the time per unit less the time since the last ended.

    Pure bookkeeping on a clock passed in each call (tested on synthetic timings)."""

    def __init__(self, total: int, initial: int = 0, start: float = 0.0, window: int = 4,
                 earlier: float | None = None):
        self.total, self.n, self.window = total, initial, window
        self.earlier = earlier  # seconds per unit before a resume (metrics.jsonl), until this process has its own
        self.ends = [start]  # when each unit this process did ended (ends[0]: the start)
        self.sizes: list[int] = []  # units counted by each end (update(n))
        self.phases: list[dict[str, float]] = []  # seconds per phase, per unit done
        self.order: list[str] = []  # the phases of the last unit, in order
        self._current: dict[str, float] = {}
        self._phase: str | None = None
        self._phase_start = start

    def phase(self, name: str | None, now: float) -> None:
        """Phase ``name`` starts now (None: between phases); the one before is timed."""
        if self._phase is not None:
            self._current[self._phase] = self._current.get(self._phase, 0.0) + now - self._phase_start
        self._phase, self._phase_start = name, now

    def done(self, now: float, n: int = 1) -> None:
        """``n`` units ended now."""
        self.phase(None, now)
        if self._current:
            self.order = list(self._current)
        self.phases.append(self._current)
        self._current = {}
        self.ends.append(now)
        self.sizes.append(n)
        self.n += n

    def _recent(self) -> slice:
        """The units the estimate reads: the last ones, the first left out once a second ended."""
        done = len(self.sizes)
        first = 1 if done >= 2 else 0
        return slice(max(first, done - max(self.window, math.ceil(done / 4))), done)

    def per_unit(self, now: float | None = None) -> float | None:
        """Seconds per unit over the recent units (None before the first ended). At ``now``, a unit in progress that
        already took longer than that counts as one more unit of at least its time so far, so a slow step raises
        the estimate while it runs."""
        if len(self.sizes) < 2 and self.earlier is not None:  # a resumed run: the earlier units' pace, not "?"
            running = None if now is None else now - self.ends[-1]
            return max(self.earlier, running) if running is not None else self.earlier
        if not self.sizes:
            return None
        r = self._recent()
        seconds = self.ends[r.stop] - self.ends[r.start]
        units = sum(self.sizes[r])
        per = seconds / units if units else None
        running = None if now is None else now - self.ends[-1]
        if per is not None and running is not None and running > per:
            per = (seconds + running) / (units + 1)
        return per

    def _share_done(self, now: float, fraction: float | None) -> float | None:
        """The typical share of a unit's time that the phases done so far in this unit took (None: no phases)."""
        recent = [p for p in self.phases[self._recent()] if p]
        if not recent or self._phase is None and not self._current:
            return None
        mean = {k: sum(p.get(k, 0.0) for p in recent) / len(recent) for k in self.order}
        whole = sum(mean.values())
        if whole <= 0:
            return None
        done = sum(mean[k] for k in self.order if k in self._current and k != self._phase)
        if self._phase in mean:
            spent = now - self._phase_start + self._current.get(self._phase, 0.0)
            part = fraction if fraction is not None else min(spent / mean[self._phase], 1.0) if mean[self._phase] \
                else 1.0
            done += mean[self._phase] * min(max(part, 0.0), 1.0)
        return min(done / whole, 1.0)

    def eta(self, now: float, fraction: float | None = None) -> float | None:
        """Seconds left at ``now`` (None before a unit ended); ``fraction``: how far the current phase is, when it
        counts its own units."""
        left = max(self.total - self.n, 0)
        per = self.per_unit(now)
        if per is None or left == 0:
            return None if per is None else 0.0
        share = self._share_done(now, fraction)
        current = per * (1.0 - share) if share is not None else max(per - (now - self.ends[-1]), 0.0)
        return (left - 1) * per + current


class _LineColumn(rp.ProgressColumn):
    """The whole live line as one column, rendered by its :class:`Progress` at each refresh (rich refreshes on its
    own thread, so the clock ticks between updates) and fitted to the console's width there."""

    def __init__(self, owner: Progress):
        super().__init__(table_column=Column(no_wrap=True, overflow="ellipsis"))
        self.owner = owner

    def render(self, task) -> Text:
        return Text(self.owner.live_line(self.owner.console.width - 1))


class Progress:
    """Counts steps toward ``total`` and shows elapsed time, ETA, rate, the current phase (:class:`Phases`) and the
    metrics named in ``show`` (``None``: every metric passed to ``update``, in the order they first came; the first
    ``key_metrics`` of them are the recipe's key metrics, kept on a narrow terminal).

    On a terminal the live line is redrawn ``refresh_per_second`` times by rich's own thread, so elapsed / ETA and
    the phase move while a step runs. Off a terminal a plain line is printed every ``every_frac`` of the run, and a
    ticker thread prints one during a long step whenever ``every_s`` passed without a line (checked every
    ``tick_s``); it is stopped and joined by :meth:`close`."""

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
        key_metrics: int = 3,
        tick_s: float = 1.0,
        refresh_per_second: float = 4,
        earlier: float | None = None,
    ):
        self.total, self.desc, self.unit = total, desc, unit
        self._show_all = show is None
        self.show: tuple[str, ...] = () if show is None else tuple(show)
        self.key_metrics = key_metrics
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
        self._phase: tuple[str, int | None, str] | None = None  # (name, total, unit)
        self._phase_n = 0
        self._detail = ""  # inside the phase's current unit (Phases.detail)
        self._tick_s, self._refresh = tick_s, refresh_per_second
        self._eta = EtaEstimator(total, initial, self._start, earlier=earlier)
        self._lock = threading.Lock()  # the ticker thread and the loop both print lines
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- what is shown -------------------------------------------------------------------------------------
    def rate(self) -> float:
        """Units per second of this process over its recent units (0 before the first unit; :class:`EtaEstimator`)."""
        per = self._eta.per_unit(self._clock())
        return 1.0 / per if per else 0.0

    def eta(self) -> float | None:
        """Seconds left (:class:`EtaEstimator`: recent units, warm-up left out, the current unit by its phases)."""
        fraction = None
        if self._phase is not None and self._phase[1]:
            fraction = self._phase_n / self._phase[1]
        return self._eta.eta(self._clock(), fraction)

    def _metric_items(self) -> list[str]:
        return [f"{short_name(k)}={format_number(self.metrics[k])}" for k in self.show if k in self.metrics]

    def _metric_text(self) -> str:
        return " ".join(self._metric_items())

    def phase_text(self) -> str:
        """``rollout 24/64 sequences``, ``update 2/4``, ``reward`` (empty between phases)."""
        if self._phase is None:
            return ""
        name, total, unit = self._phase
        detail = f" ({self._detail})" if self._detail else ""
        if total is None:
            return name + detail
        return f"{name} {min(self._phase_n, total)}/{total}" + (f" {unit}" if unit else "") + detail

    def _stats(self) -> str:
        phase = self.phase_text()
        parts = [
            f"elapsed {format_duration(self._clock() - self._start)}",
            f"eta {format_duration(self.eta())}",
            format_rate(self.rate(), self.unit),
            f"[{phase}]" if phase else "",
            self._metric_text(),
        ]
        return " ".join(p for p in parts if p)

    def line(self) -> str:
        """The plain-text status line, e.g. ``[sft] 120/400 (30%) elapsed 0:00:30 eta 0:01:10 ...``."""
        pct = 100 * self.n / self.total if self.total else 100.0
        return f"[{self.desc}] {self.n}/{self.total} ({pct:.0f}%) {self._stats()}"

    BAR_WIDTH = 12

    def live_line(self, width: int) -> str:
        """The terminal line in at most ``width`` characters. Pieces are dropped, least important first (the other
        metrics, the rate, the percentage, the bar, the name, the elapsed time, the phase's unit), so that the
        counter, the ETA, the phase and the key metrics stay; only then is the end cut."""
        frac = self.n / self.total if self.total else 1.0
        filled = int(round(frac * self.BAR_WIDTH))
        metrics = self._metric_items()
        key, rest = metrics[: self.key_metrics], metrics[self.key_metrics:]
        phase = self.phase_text()
        short_phase = phase.rsplit(" ", 1)[0] if self._phase and self._phase[1] is not None and self._phase[2] \
            else phase
        eta = format_duration(self.eta())
        # (order on the line, drop priority: higher is dropped first, text)
        pieces = [(0, 6, self.desc), (1, 7, "━" * filled + "─" * (self.BAR_WIDTH - filled)),
                  (2, 0, f"{self.n}/{self.total}"), (3, 8, f"{100 * frac:.0f}%"),
                  (4, 5, f"{format_duration(self._clock() - self._start)}<"), (5, 0, eta),
                  (6, 9, format_rate(self.rate(), self.unit)), (7, 1, phase)]
        pieces += [(8 + i, 1, m) for i, m in enumerate(key)]
        pieces += [(20 + i, 10 + (len(rest) - i), m) for i, m in enumerate(rest)]  # the last of them first

        def render(items) -> str:
            out = ""
            for order, _, text in sorted(items):
                if not text:
                    continue
                if order == 5 and not out.endswith("<"):
                    text = f"eta {text}"  # the elapsed time was dropped
                out += ("" if out.endswith("<") else " " if out else "") + text
            return out

        items = list(pieces)
        for drop in sorted({p for _, p, _ in items if p > 1}, reverse=True):
            if len(render(items)) <= width:
                break
            items = [it for it in items if it[1] != drop]
        if len(render(items)) > width and short_phase != phase:
            items = [(o, p, short_phase if o == 7 else s) for o, p, s in items]
        text = render(items)
        return text if len(text) <= width else text[: max(width - 1, 0)] + "…"

    # -- phases (see Phases) ---------------------------------------------------------------------------------
    def phase(self, name: str, total: int | None = None, unit: str = "") -> None:
        """Enter phase ``name`` (with ``total`` units of its own, counted by :meth:`advance`)."""
        self._phase, self._phase_n, self._detail = (name, total, unit), 0, ""
        self._eta.phase(name, self._clock())

    def advance(self, n: int = 1) -> None:
        self._phase_n += n
        self._detail = ""

    def detail(self, text: str) -> None:
        """Where the phase is inside its current unit (a rollout's tokens: ``3 ended, token 64/512``), shown beside
        the phase's count until it advances."""
        self._detail = text

    # -- updating ------------------------------------------------------------------------------------------
    def update(self, n: int = 1, metrics: Mapping[str, Any] | None = None) -> None:
        """Advance by ``n`` units and remember the latest ``metrics`` (only the keys in ``show`` are shown); the
        phase of the finished step ends."""
        self.n += n
        self._phase = None
        self._eta.done(self._clock(), n)
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
            self._live.refresh()

    def _plain_due(self) -> bool:
        return (
            self.n - self._last_print_n >= self._every_n
            or self._clock() - self._last_print_t >= self._every_s
            or (self.n >= self.total and self._last_print_n < self.total)
        )

    def _print_line(self) -> None:
        with self._lock:
            self.console.print(Text(self.line()), soft_wrap=True)
            self._last_print_n, self._last_print_t = self.n, self._clock()

    def _tick(self) -> None:
        """The ticker thread (off a terminal): a line whenever ``every_s`` passed without one."""
        while not self._stop.wait(self._tick_s):
            if self._clock() - self._last_print_t >= self._every_s:
                self._print_line()

    def _refresh_live(self) -> None:
        if self._live is None:
            self._live = rp.Progress(_LineColumn(self), console=self.console, auto_refresh=True,
                                     refresh_per_second=self._refresh)
            self._task = self._live.add_task(self.desc, total=self.total, completed=self.n)
            self._live.start()
        self._live.update(self._task, completed=self.n)
        self._live.refresh()

    def close(self) -> None:
        """Stop the live bar (or the ticker), and print the last line if the plain output has not shown the final
        count."""
        if self._closed:
            return
        self._closed = True
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
        if self._live is not None:
            self._live.stop()
        elif self.is_main and not self.console.is_terminal and self.n != self._last_print_n:
            self._print_line()

    def __enter__(self) -> Progress:
        if self.is_main and self.console.is_terminal:
            self._refresh_live()
        elif self.is_main and self._every_s > 0:
            self._ticker = threading.Thread(target=self._tick, name=f"progress-{self.desc}", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def earlier_pace(run_dir: str | Path, updates_per_unit: int = 1, last: int = 16) -> float | None:
    """Seconds per unit (``updates_per_unit`` optimizer updates) of the run in ``run_dir`` before it was stopped,
    from its ``metrics.jsonl`` (each line's time and step; the median of the last ``last`` intervals, so that an
    evaluation or a save does not count): the ETA of a resumed run from its first step. None without two lines."""
    rows = [r for r in read_metrics(run_dir)
            if isinstance(r.get("time"), (int, float)) and isinstance(r.get("step"), int)]
    paces = [(b["time"] - a["time"]) / (b["step"] - a["step"]) for a, b in zip(rows, rows[1:])
             if b["step"] > a["step"] > 0 and b["time"] >= a["time"]][-last:]
    return statistics.median(paces) * updates_per_unit if paces else None


def run_summary_line(name: str, run_dir: str | Path, seconds: float | None = None, max_metrics: int = 4,
                     since: float | None = None) -> str:
    """The one line a run ends with: its key metrics from start to end, its health warnings, and the report (or the
    run directory when there is no report), e.g. ``[grpo] finished in 23 s: score 0.1 -> 0.6, seq_kl 0 -> 3.2;
    1 health warning (0 critical); report /runs/grpo/report.html``. A report older than ``since`` (a time stamp)
    is a previous run's and not named."""
    run_dir = Path(run_dir)
    first: dict[str, Any] = {}
    last: dict[str, Any] = {}
    count: dict[str, int] = {}
    moved: set[str] = set()  # metrics not 0 at every step (score 0 -> 0 in a run without a reward says nothing)
    for row in read_run_metrics(run_dir):  # rlhfkit's names: KEY_METRICS, short_name
        for k, v in row.items():
            if k in ("step", "time") or isinstance(v, bool) or not isinstance(v, (int, float)) \
                    or not math.isfinite(v):
                continue
            first.setdefault(k, v)
            last[k] = v
            count[k] = count.get(k, 0) + 1
            if v != 0:
                moved.add(k)
    keys = [k for k in KEY_METRICS if k in last and k in moved][:max_metrics]
    parts = [f"{short_name(k)} {format_number(last[k])}" if count[k] == 1  # one evaluation: shown once
             else f"{short_name(k)} {format_number(first[k])} -> {format_number(last[k])}" for k in keys]
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


MIN_HELD_OUT = 20  # below this many held-out examples an accuracy moves in steps of 1/n (+-0.1 or worse): said so


def held_out(value: float, n: int, unit: str = "example") -> str:
    """A held-out metric with the count it is over: ``0.912 on 200 pairs``, and for a split too small to measure
    (``1.000`` on one pair): ``1.000 on 1 pair (too few to measure: hold out more with data.eval_fraction or
    data.eval)``."""
    text = f"{value:.3f} on {n} {unit}{'' if n == 1 else 's'}"
    if n < MIN_HELD_OUT:
        text += f" (too few to measure, under {MIN_HELD_OUT}: hold out more with data.eval_fraction or data.eval)"
    return text


KEY_METRICS = ("objective/scores", "eval/scores", "distill/reverse_kl", "eval/distill/reverse_kl",
               "distill/argmax_agreement", "objective/kl", "train/loss", "eval/loss", "eval/accuracy",
               "eval/rewards/accuracies", "train/accuracy", "train/rewards/accuracies")
