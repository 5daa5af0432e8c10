"""Built-in offline tasks: deterministic data generators with a gold metric a program computes (``shapes``: a
visual one, for vision-language models: its files name the pictures it writes beside them)."""

from __future__ import annotations

import json
from pathlib import Path

from .. import files
from ..errors import ConfigError
from .arithmetic import TASK as ARITHMETIC
from .base import EVAL_SEED_OFFSET, DataFile
from .calculator import TASK as CALCULATOR
from .quickstart import TASK as QUICKSTART
from .shapes import TASK as SHAPES

TASKS = {"quickstart": QUICKSTART, "calculator": CALCULATOR, "arithmetic": ARITHMETIC, "shapes": SHAPES}


def get_task(name: str):
    if name not in TASKS:
        raise ConfigError(f"unknown task '{name}'", where="task", fix=f"use one of {', '.join(TASKS)}")
    return TASKS[name]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    files.make_dirs(path.parent)
    files.write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows), fix="rerun")


def make_task_data(name: str, out_dir: str | Path, n: int = 2000, n_eval: int = 200, seed: int = 0) -> dict[str, Path]:
    """Write the task's files (``task.FILES``): n records per training file, n_eval per held-out file (those from
    another seed than the training files). Returns {file name: path}."""
    task = get_task(name)
    out = Path(out_dir)
    written = {}
    for fname, spec in task.FILES.items():
        count, file_seed = (n_eval, seed + EVAL_SEED_OFFSET) if spec.held_out else (n, seed)
        written[fname] = out / fname
        files_too = {"out": out} if getattr(task, "writes_files", False) else {}  # e.g. its images
        write_jsonl(written[fname], getattr(task, spec.method)(count, seed=file_seed, **files_too))
    return written


__all__ = ["TASKS", "DataFile", "get_task", "make_task_data", "write_jsonl"]
