"""Append-only JSON-lines files that survive crashes and resumes (shared by metrics and samples).

Non-finite floats are written as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (bare ``NaN`` is not
valid JSON) and turned back into floats by :func:`read_jsonl`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from .. import files
from ..files import fsync_dir  # noqa: F401  (re-exported: the run's files fsync through here)

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def to_json_value(value: Any) -> Any:
    """A JSON-safe copy of one logged value: tensors / numpy scalars via ``.item()``, NaN / inf as strings."""
    if hasattr(value, "item") and callable(value.item):  # torch.Tensor, numpy scalar / array
        if getattr(value, "ndim", 0) == 0 or getattr(value, "numel", lambda: 2)() == 1:
            value = value.item()
        else:
            value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    return value


def _from_json_value(value: Any) -> Any:
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    return value


def read_jsonl(path: str | Path) -> list[dict]:
    """All well-formed records of a JSON-lines file ([] when missing); a torn last line is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # torn line left by a crash
                continue
            if isinstance(row, dict):
                rows.append({k: _from_json_value(v) for k, v in row.items()})
    return rows


def truncate_after_step(path: Path, step: int) -> None:
    """Rewrite ``path`` keeping only records with ``step <= step`` (a resumed run must not duplicate steps)."""
    if not path.exists():
        return
    files.write_atomic(path, "".join(_kept_lines(path, step)))


def _kept_lines(path: Path, step: int) -> list[str]:
    """The well-formed lines of ``path`` whose ``step <= step``."""
    kept = []
    if not path.exists():
        return kept
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
    return kept


class JsonlWriter:
    """Appends one JSON object per line and flushes it, so a crash loses at most the line being written.

    ``keep_until=N``: the lines past step N are dropped first (a resumed run must not duplicate steps; -1 drops
    every line). ``staged=True``: the earlier file is left untouched; the writer appends to ``<name>.new`` (a copy of
    the lines kept) until :meth:`commit` swaps it in (an atomic rename), or :meth:`discard` removes it — so a run that
    fails before its first line leaves an earlier run's file byte-identical.
    """

    def __init__(self, path: Path, keep_until: int | None = None, staged: bool = False):
        files.make_dirs(path.parent)
        self.path, self.staged = path, staged
        self._target = path.with_name(path.name + ".new") if staged else path
        files.refuse_link(path)  # never read nor replace through a link planted under the file's name
        if staged:  # a new file (O_EXCL | O_NOFOLLOW) holding the lines kept
            if keep_until is not None:
                kept = "".join(_kept_lines(path, keep_until)).encode("utf-8")
            else:
                kept = path.read_bytes() if path.exists() else b""
            with files.writing(self._target, need=len(kept), cleanup=[self._target]):
                with files.open_new(self._target, "wb") as f:
                    f.write(kept)
        elif keep_until is not None:
            truncate_after_step(path, keep_until)
        self._file = files.open_append(self._target)
        if self._file.tell() > 0 and not self._ends_with_newline():
            self._file.write("\n")  # close a torn line from a crash; read_jsonl skips it

    def _ends_with_newline(self) -> bool:
        fd = self._file.fileno()  # opened read-write by files.open_append
        return os.pread(fd, 1, os.fstat(fd).st_size - 1) == b"\n"

    def write(self, record: dict) -> None:
        """Append one line; a full disk (or any OS error) is one line naming the file, not a traceback (the run
        keeps everything up to its newest checkpoint)."""
        try:
            line = json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
            self._file.write(line)
            self._file.flush()
        except OSError as err:
            raise files.write_failed(self.path, err, len(line.encode())) from None

    def commit(self) -> None:
        """Swap the staged file in place of the earlier one (durably); later lines append to it."""
        if not self.staged:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        files.replace(self._target, self.path)  # the open handle follows the renamed file
        fsync_dir(self.path.parent)
        self.staged, self._target = False, self.path

    def discard(self) -> None:
        """Close; a staged file that was never committed is removed (the earlier file stays as it was)."""
        self.close()
        if self.staged:
            files.remove_quietly(self._target)
            self.staged = False

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class StagedFile:
    """``commit`` / ``discard`` / ``close`` of a run file written through an optional :class:`JsonlWriter`
    (``self._writer``; None on the processes that write nothing): what the metrics sink, the sample logger and the
    health monitor share, so the run's lifecycle (``train.lifecycle.session``) treats them alike."""

    _writer: JsonlWriter | None = None

    def commit(self) -> None:
        """Staged: swap the new file in place of the earlier run's."""
        if self._writer is not None:
            self._writer.commit()

    def discard(self) -> None:
        """Staged and never committed: remove the new file (closing it), leave the earlier one as it was."""
        if self._writer is not None:
            self._writer.discard()
        self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
