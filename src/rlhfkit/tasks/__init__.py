"""Built-in offline tasks: deterministic data generators with a gold metric a program computes."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from .quickstart import TASK as QUICKSTART

TASKS = {"quickstart": QUICKSTART}

FILES = {
    "sft.jsonl": "sft_records",
    "preference.jsonl": "preference_records",
    "prompts.jsonl": "prompt_records",
    "unpaired.jsonl": "unpaired_records",
}


def get_task(name: str):
    if name not in TASKS:
        raise ConfigError(f"unknown task '{name}'", where="task", fix=f"use one of {', '.join(TASKS)}")
    return TASKS[name]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    tmp.replace(path)


def make_task_data(name: str, out_dir: str | Path, n: int = 2000, n_eval: int = 200, seed: int = 0) -> dict[str, Path]:
    """Write the task's files: sft / preference / prompts / unpaired (n records each) and eval files.

    ``eval_prompts.jsonl`` and ``eval_preference.jsonl`` come from another seed than the training files.
    """
    task = get_task(name)
    out = Path(out_dir)
    written = {}
    for fname, method in FILES.items():
        path = out / fname
        write_jsonl(path, getattr(task, method)(n, seed=seed))
        written[fname] = path
    written["eval_prompts.jsonl"] = out / "eval_prompts.jsonl"
    write_jsonl(written["eval_prompts.jsonl"], task.prompt_records(n_eval, seed=seed + 10_000))
    written["eval_preference.jsonl"] = out / "eval_preference.jsonl"
    write_jsonl(written["eval_preference.jsonl"], task.preference_records(n_eval, seed=seed + 10_000))
    return written
