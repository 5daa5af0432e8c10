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
    kept = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


class JsonlWriter:
    """Appends one JSON object per line and flushes it, so a crash loses at most the line being written."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")
        if self._file.tell() > 0 and not self._ends_with_newline():
            self._file.write("\n")  # close a torn line from a crash; read_jsonl skips it

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
