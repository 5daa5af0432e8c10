"""Sample tables: every logged (prompt, response, score) goes to ``samples.jsonl`` and a few to the console."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .console import get_console
from .jsonl import JsonlWriter, read_jsonl, to_json_value


def read_samples(run_dir: str | Path) -> list[dict]:
    """Every record of ``run_dir/samples.jsonl`` in file order ([] when there is none)."""
    return read_jsonl(Path(run_dir) / "samples.jsonl")


def shorten(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, ending with an ellipsis when it was cut."""
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


class SampleLogger:
    """Appends generated samples to ``run_dir/samples.jsonl`` and prints the first ``max_rows`` as a table.

    ``is_main=False`` makes ``log`` a no-op. Texts in the table are cut to ``max_chars``; the file keeps them whole.
    """

    def __init__(
        self,
        run_dir: str | Path,
        is_main: bool = True,
        max_rows: int = 8,
        console: Console | None = None,
        max_chars: int = 200,
        resume_step: int | None = None,
        staged: bool = False,
    ):
        self.run_dir = Path(run_dir)
        self.is_main = is_main
        self.max_rows = max_rows
        self.max_chars = max_chars
        self.console = console
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
        if self.max_rows > 0 and rows:
            (self.console or get_console()).print(self._table(step, rows[: self.max_rows], len(rows)))

    def _table(self, step: int, rows: list[dict], n_total: int) -> Table:
        keys = [k for k in rows[0] if k != "step" and not (k == "score" and rows[0][k] is None)]
        shown = f"{len(rows)} of {n_total}" if n_total > len(rows) else f"{n_total}"
        table = Table(title=f"samples at step {step} ({shown})", show_lines=True)
        for key in keys:
            table.add_column(key, overflow="fold", justify="right" if key == "score" else "left")
        for row in rows:  # Text(...) so brackets in model output are never read as rich markup
            table.add_row(*(Text(shorten(_cell(row[k]), self.max_chars)) for k in keys))
        return table

    def commit(self) -> None:
        if self._writer is not None:
            self._writer.commit()

    def discard(self) -> None:
        if self._writer is not None:
            self._writer.discard()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> SampleLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
