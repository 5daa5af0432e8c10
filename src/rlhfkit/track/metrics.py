"""The metrics sink: ``metrics.jsonl`` always, TensorBoard and Weights & Biases when asked, and any other tracker
accelerate knows (MLflow, Comet, Aim, ...) through :mod:`rlhfkit.track.trackers`.

One line per ``log`` call: ``{"step": 12, "time": 1712345678.9, "loss": 1.23, ...}``. The file is opened in
append mode and flushed every line; a resumed run passes ``resume_step=N`` so lines past step N (logged after
the checkpoint it resumes from) are dropped first and no step appears twice. ``staged=True`` (what a run uses)
writes beside the earlier file and swaps it in with the first line (see :class:`~rlhfkit.track.jsonl.JsonlWriter`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import files
from ..errors import UserError
from .jsonl import JsonlWriter, StagedFile, read_jsonl, to_json_value
from .trackers import AccelerateTrackers, check_backends

BACKENDS = ("jsonl", "tensorboard", "wandb")  # written here; the others through accelerate (trackers.py)
_RESERVED = ("step", "time")


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Every record of ``run_dir/metrics.jsonl`` in file order (NaN / inf restored as floats; [] if none), under the
    names the run wrote (TRL's for the recipes TRL has: :mod:`rlhfkit.track.names`)."""
    return read_jsonl(Path(run_dir) / "metrics.jsonl")


def run_recipe_of(run_dir: str | Path) -> str | None:
    """The recipe of the run in ``run_dir`` (its ``config.yaml``'s ``recipe:`` line), None when unknown."""
    import re

    try:
        with open(Path(run_dir) / "config.yaml", encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return None
    m = re.search(r"^recipe: *([\w-]+)", head, re.M)
    return m.group(1) if m else None


def read_run_metrics(run_dir: str | Path, recipe: str | None = None) -> list[dict]:
    """:func:`read_metrics` under rlhfkit's names (:func:`rlhfkit.track.names.internal`, the recipe read from the
    run's ``config.yaml`` unless given): what the report and the closing line read."""
    from .names import internal

    recipe = recipe or run_recipe_of(run_dir)
    return [internal(recipe, row) for row in read_metrics(run_dir)]


def _config_dict(config: Any) -> dict | None:
    if config is None:
        return None
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return dict(config)


class MetricsSink(StagedFile):
    """Writes scalar metrics per step to the run directory and the chosen backends.

    ``is_main=False`` (non-zero ranks of a multi-process run) makes every method a no-op.
    """

    def __init__(
        self,
        run_dir: str | Path,
        backends: Sequence[str] = ("jsonl",),
        is_main: bool = True,
        config: Mapping | Any | None = None,
        resume_step: int | None = None,
        staged: bool = False,
        on_first_line: Callable[[], None] | None = None,
        wandb_rename: Callable[[Mapping], dict] | None = None,
    ):
        if is_main:  # unknown name or missing package: one line, before anything is written
            check_backends(backends)
        self.run_dir = Path(run_dir)
        self.is_main = is_main
        self._writer: JsonlWriter | None = None
        self._tb = None
        self._wandb = None
        self._others: AccelerateTrackers | None = None
        self._wandb_rename = wandb_rename  # TRL's recipes: transformers' train/ and eval/ prefixes (track/names.py)
        if not is_main:
            return
        files.make_dirs(self.run_dir)
        if "tensorboard" in backends:  # optional backends first: a missing package fails before any write
            self._tb = _open_tensorboard(self.run_dir / "tb", resume_step)
        if "wandb" in backends:
            self._wandb = _open_wandb(self.run_dir, _config_dict(config))
        if any(b not in BACKENDS for b in backends):
            self._others = AccelerateTrackers(self.run_dir, backends, config)
        # always: the report and resume read it. staged: an earlier run's file is replaced only after the first line
        self._writer = JsonlWriter(self.run_dir / "metrics.jsonl", keep_until=resume_step, staged=staged)
        self._on_first_line = on_first_line

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` (floats, ints or 1-element tensors) at ``step``."""
        if not self.is_main:
            return
        clash = [k for k in _RESERVED if k in metrics]
        if clash:
            raise ValueError(f"metric names {clash} are reserved by the metrics file")
        values = {k: to_json_value(v) for k, v in metrics.items()}
        self._writer.write({"step": int(step), "time": round(time.time(), 3), **values})
        if self._on_first_line is not None:
            callback, self._on_first_line = self._on_first_line, None
            callback()
        scalars = {k: _as_float(v) for k, v in metrics.items()}
        scalars = {k: v for k, v in scalars.items() if v is not None}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, global_step=step)
        if self._wandb is not None:
            self._wandb.log(self._wandb_rename(scalars) if self._wandb_rename else scalars, step=step)
        if self._others is not None:
            self._others.log(scalars, step)

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """A table of text (samples) to the trackers that show one: W&B (``wandb.Table``), TensorBoard (a markdown
        table under the Text tab), and accelerate's trackers with ``log_table``. ``metrics.jsonl`` keeps scalars
        only (the samples have ``samples.jsonl``)."""
        if not self.is_main:
            return
        if self._tb is not None:
            self._tb.add_text(name, markdown_table(columns, rows), global_step=step)
        if self._wandb is not None:
            import wandb

            self._wandb.log({name: wandb.Table(columns=columns, data=rows)}, step=step)
        if self._others is not None:
            self._others.log_table(name, columns, rows, step)

    def close(self) -> None:
        super().close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._others is not None:
            self._others.finish()
            self._others = None

    def __enter__(self) -> MetricsSink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    """A markdown table (TensorBoard renders it), ``|`` and newlines in cells escaped."""
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(map(cell, columns)) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def _as_float(value: Any) -> float | None:
    """The value as a float for scalar backends, or None when it is not a scalar number."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # more than one element
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _open_tensorboard(log_dir: Path, resume_step: int | None):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise UserError(
            "the tensorboard backend needs the tensorboard package",
            where="track.backends",
            fix="pip install tensorboard or remove it",
        ) from err
    purge = None if resume_step is None else resume_step + 1  # drop events logged after the checkpoint
    return SummaryWriter(log_dir=str(log_dir), purge_step=purge)


def _open_wandb(run_dir: Path, config: dict | None):
    try:
        import wandb
    except ImportError as err:
        raise UserError(
            "the wandb backend needs the wandb package",
            where="track.backends",
            fix="pip install wandb or remove it",
        ) from err
    id_file = run_dir / "wandb_id.txt"  # the same W&B run continues when this run resumes
    run_id = id_file.read_text().strip() if id_file.exists() else wandb.util.generate_id()
    files.write_atomic(id_file, run_id)
    return wandb.init(
        project=os.environ.get("WANDB_PROJECT", "rlhfkit"),
        name=run_dir.name,
        dir=str(run_dir),
        config=config,
        id=run_id,
        resume="allow",
    )
