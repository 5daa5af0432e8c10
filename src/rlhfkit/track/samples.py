"""Sample tables: every logged (prompt, response, score) goes to ``samples.jsonl`` and a few to the console.

On a terminal the few are a compact table (no lines between rows, texts cut to ``max_chars``); off a terminal
(logs, CI) a header line then one line per sample, ``  [score] prompt -> response``, newlines shown as ``⏎``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .console import get_console
from .jsonl import JsonlWriter, StagedFile, read_jsonl, to_json_value


def read_samples(run_dir: str | Path) -> list[dict]:
    """Every record of ``run_dir/samples.jsonl`` in file order ([] when there is none)."""
    return read_jsonl(Path(run_dir) / "samples.jsonl")


def shorten(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, ending with an ellipsis when it was cut."""
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


class SampleLogger(StagedFile):
    """Appends generated samples to ``run_dir/samples.jsonl`` and prints the first ``max_rows`` as a table.

    ``is_main=False`` makes ``log`` a no-op. Texts in the table are cut to ``max_chars``; the file keeps them whole.
    With ``sink`` (a :class:`~rlhfkit.track.metrics.MetricsSink`) every logged step's table also goes to its
    trackers (``sink.log_table("samples", ...)``), whole.
    """

    def __init__(
        self,
        run_dir: str | Path,
        is_main: bool = True,
        max_rows: int = 8,
        console: Console | None = None,
        max_chars: int = 80,
        resume_step: int | None = None,
        staged: bool = False,
        sink: Any = None,
    ):
        self.run_dir = Path(run_dir)
        self.is_main = is_main
        self.max_rows = max_rows
        self.max_chars = max_chars
        self.console = console
        self.sink = sink  # a MetricsSink: the table also goes to TensorBoard / W&B / accelerate trackers
        self._writer: JsonlWriter | None = None
        if is_main:
            # staged: an earlier run's file is replaced only when the run commits (see JsonlWriter)
            self._writer = JsonlWriter(self.run_dir / "samples.jsonl", keep_until=resume_step, staged=staged)

    def log(
        self,
        step: int,
        prompts: Sequence[str],
        responses: Sequence[str],
        scores: Sequence[float] | None = None,
        extra: Mapping[str, Sequence[Any]] | None = None,
    ) -> None:
        """Record one line per sample: ``{"step", "prompt", "response", "score", **extra}``."""
        if not self.is_main:
            return
        columns = {"prompt": prompts, "response": responses, "score": scores, **(extra or {})}
        lengths = {k: len(v) for k, v in columns.items() if v is not None}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"sample columns differ in length: {lengths}")
        rows = []
        for i in range(len(prompts)):
            row = {"step": int(step)}
            row.update({k: (to_json_value(v[i]) if v is not None else None) for k, v in columns.items()})
            self._writer.write(row)
            rows.append(row)
        if self.sink is not None and rows:
            keys = [k for k in rows[0] if k != "step"]
            self.sink.log_table("samples", keys, [[row[k] for k in keys] for row in rows], step)
        if self.max_rows > 0 and rows:
            console = self.console or get_console()
            if console.is_terminal and console.width >= self.min_table_width(rows):
                console.print(self._table(step, rows[: self.max_rows], len(rows)))
            else:
                for line in self._lines(step, rows[: self.max_rows], len(rows)):
                    console.print(Text(line), soft_wrap=True)

    def min_table_width(self, rows: list[dict]) -> int:
        """The narrowest terminal the table is drawn on: the texts' columns 16 characters each, the others their
        header's (at most 12), padding and rule; a narrower one gets the plain lines (they fold at any width)."""
        keys = self._keys(rows)
        return sum(16 if k in ("prompt", "response") else min(len(k), 12) for k in keys) + 3 * len(keys) + 2

    def _keys(self, rows: list[dict]) -> list[str]:
        return [k for k in rows[0] if k != "step" and not (k == "score" and rows[0][k] is None)]

    def _title(self, step: int, n_shown: int, n_total: int) -> str:
        shown = f"{n_shown} of {n_total}" if n_total > n_shown else f"{n_total}"
        return f"samples at step {step} ({shown})"

    def _table(self, step: int, rows: list[dict], n_total: int) -> Table:
        keys = self._keys(rows)
        # every column at least its header's width (a header never breaks mid-word), the texts sharing the rest; the
        # head's rule is the table's own width, in ASCII where the terminal cannot draw box characters (safe_box)
        table = Table(title=self._title(step, len(rows), n_total), box=box.SIMPLE_HEAD, padding=(0, 1),
                      safe_box=True, title_justify="left")
        for key in keys:
            text = key in ("prompt", "response")
            table.add_column(key, overflow="fold", justify="right" if key == "score" else "left",
                             min_width=min(len(key), 12), ratio=2 if key == "response" else 1 if text else None,
                             no_wrap=key == "score")
        for row in rows:  # Text(...) so brackets in model output are never read as rich markup
            table.add_row(*(Text(shorten(_one_line(_cell(row[k])), self.max_chars)) for k in keys))
        return table

    def _lines(self, step: int, rows: list[dict], n_total: int) -> list[str]:
        """Off a terminal: the title, then ``  [score] prompt -> response (key=value ...)`` per sample."""
        keys = [k for k in self._keys(rows) if k not in ("prompt", "response", "score")]
        out = [self._title(step, len(rows), n_total) + ":"]
        for row in rows:
            score = f"[{_cell(row['score'])}] " if row.get("score") is not None else ""
            text = shorten(_one_line(_cell(row.get("prompt"))), self.max_chars // 2)
            text += " -> " + shorten(_one_line(_cell(row.get("response"))), self.max_chars)
            extra = " ".join(f"{k}={shorten(_one_line(_cell(row[k])), 20)}" for k in keys)
            out.append(f"  {score}{text}" + (f" ({extra})" if extra else ""))
        return out

    def __enter__(self) -> SampleLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _one_line(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\n", "⏎").replace("\r", "⏎")


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
