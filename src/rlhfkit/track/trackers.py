"""Experiment trackers beside ``metrics.jsonl``: every tracker ``accelerate`` knows (MLflow, Comet, Aim, ClearML,
DVCLive, SwanLab, Trackio, ...) through its own tracker classes, so each comes with no code of ours; TensorBoard and
W&B stay written by :class:`~rlhfkit.track.metrics.MetricsSink` itself (it resumes their runs in place).

:func:`check_backends` (it lives in :mod:`rlhfkit.config.checks`, the tracker names in :mod:`rlhfkit.config.choices`,
and is re-exported here) is the check a config build and a run's sink make before anything is written: an unknown
name gets a did-you-mean, a tracker whose package is missing one line with the ``pip install`` that fixes it. It
only looks the packages up (``importlib.util.find_spec``), it imports none.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config.checks import check_backends as check_backends  # re-exported: the check lives with the config's
from ..config.choices import OWN_TRACKERS
from ..config.choices import known_backends as known_backends


def accelerate_trackers() -> dict[str, type]:
    """accelerate's tracker classes by name (``accelerate.tracking.LOGGER_TYPE_TO_CLASS``)."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    return dict(LOGGER_TYPE_TO_CLASS)


def flat_config(config: Any) -> dict[str, bool | str | float | int | None]:
    """The config as ``{"optim.lr": 1e-5, ...}`` with scalar values (lists and dicts as their text), as trackers'
    hyper-parameter tables want it."""
    if config is None:
        return {}
    tree = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, Mapping) and node:
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif node is None or isinstance(node, (bool, str, int, float)):
            out[prefix] = node
        else:
            out[prefix] = str(node)

    walk("", tree)
    return out


class AccelerateTrackers:
    """The trackers in ``names`` that ``MetricsSink`` does not write itself, made from accelerate's classes: started,
    given the flat config, then sent every scalar line (``log``) and sample table (``log_table``, where the
    tracker has one). MLflow logs to ``$MLFLOW_TRACKING_URI`` when set, else ``run_dir/mlruns``."""

    def __init__(self, run_dir: str | Path, names: Sequence[str], config: Any = None):
        run_dir = Path(run_dir)
        classes = accelerate_trackers()
        self.trackers = []
        for name in names:
            if name in OWN_TRACKERS:
                continue
            cls = classes[name]
            if name == "mlflow":
                tracker = cls(experiment_name=os.environ.get("MLFLOW_EXPERIMENT_NAME", "rlhfkit"),
                              logging_dir=os.environ.get("MLFLOW_TRACKING_URI", str(run_dir / "mlruns")),
                              run_name=run_dir.name)
            elif getattr(cls, "requires_logging_directory", False):
                tracker = cls(run_dir.name, logging_dir=str(run_dir / name))
            else:
                tracker = cls(run_dir.name)
            tracker.start()
            if config is not None:
                tracker.store_init_configuration(flat_config(config))
            self.trackers.append(tracker)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for tracker in self.trackers:
            tracker.log(dict(scalars), step=step)

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        for tracker in self.trackers:
            if hasattr(tracker, "log_table"):
                tracker.log_table(name, columns=columns, data=rows, step=step)

    def finish(self) -> None:
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
