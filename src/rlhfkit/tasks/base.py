"""What a built-in task declares about its data files (read by ``make_task_data`` and ``rlhfkit data make``)."""

from __future__ import annotations

from typing import NamedTuple


class DataFile(NamedTuple):
    method: str  # the task's method that makes the records: method(n, seed=...) -> list[dict]
    held_out: bool  # an evaluation file: n_eval records from another seed than the training files
    what: str  # what it holds (shown by `rlhfkit data make`)
    used_by: str  # which commands read it


EVAL_SEED_OFFSET = 10_000
