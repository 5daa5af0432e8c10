"""Experiment trackers beside ``metrics.jsonl``: every tracker ``accelerate`` knows (MLflow, Comet, Aim, ClearML,
DVCLive, SwanLab, Trackio, ...) through its own tracker classes, so each comes with no code of ours; TensorBoard and
W&B stay written by :class:`~rlhfkit.track.metrics.MetricsSink` itself (it resumes their runs in place).

:func:`check_backends` is the check a run makes before anything is written: an unknown name gets a did-you-mean,
a tracker whose package is missing one line with the ``pip install`` that fixes it. It only looks the packages up
(``importlib.util.find_spec``), it imports none.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError

OWN = ("jsonl", "tensorboard", "wandb")  # written by MetricsSink
# tracker -> (module that must be importable, what to pip install)
PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "comet_ml": ("comet_ml", "comet-ml"),
    "aim": ("aim", "aim"),
    "clearml": ("clearml", "clearml"),
    "dvclive": ("dvclive", "dvclive"),
    "swanlab": ("swanlab", "swanlab"),
    "trackio": ("trackio", "trackio"),
}


def accelerate_trackers() -> dict[str, type]:
    """accelerate's tracker classes by name (``accelerate.tracking.LOGGER_TYPE_TO_CLASS``)."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    return dict(LOGGER_TYPE_TO_CLASS)


def known_backends() -> tuple[str, ...]:
    return tuple(dict.fromkeys((*OWN, *accelerate_trackers())))


def check_backends(backends: Sequence[str]) -> None:
    """Raise a one-line ``ConfigError`` (where ``track.backends``) for an unknown tracker or one whose package is
    not installed. Writes nothing, imports nothing."""
    known = known_backends()
    for name in backends:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigError(f"unknown tracker '{name}'", where="track.backends",
                              fix=f"{hint}use some of {', '.join(known)}")
        module, pip = PACKAGES.get(name, (name, name))
        if name != "jsonl" and importlib.util.find_spec(module) is None:
            raise ConfigError(f"the {name} tracker needs the {pip} package, which is not installed",
                              where="track.backends", fix=f"pip install {pip} (or drop {name} from track.backends)")


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
            if name in OWN:
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
