"""Trackers beside metrics.jsonl: accelerate's classes for MLflow and the rest, a missing package caught in one line
before anything is written, sample tables to TensorBoard and the trackers that take tables."""

import importlib.util

import pytest

from rlhfkit.cli import main
from rlhfkit.errors import ConfigError
from rlhfkit.track import MetricsSink, SampleLogger, read_metrics
from rlhfkit.track.metrics import markdown_table
from rlhfkit.track.trackers import check_backends, flat_config

REAL_FIND_SPEC = importlib.util.find_spec


def _installed(monkeypatch, *names):
    """Pretend exactly ``names`` (and the real tensorboard) are importable."""
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda m: object() if m in names else (REAL_FIND_SPEC(m) if m == "tensorboard" else None))


class FakeTracker:
    """Stands in for accelerate.tracking.MLflowTracker (same constructor keywords); records every call."""

    name, requires_logging_directory = "mlflow", False
    made: list["FakeTracker"] = []

    def __init__(self, experiment_name=None, logging_dir=None, run_name=None):
        self.args = {"experiment_name": experiment_name, "logging_dir": logging_dir, "run_name": run_name}
        self.calls = []
        FakeTracker.made.append(self)

    def start(self):
        self.calls.append(("start",))

    def store_init_configuration(self, values):
        self.calls.append(("config", values))

    def log(self, values, step=None):
        self.calls.append(("log", values, step))

    def log_table(self, name, columns=None, data=None, step=None):
        self.calls.append(("table", name, columns, data, step))

    def finish(self):
        self.calls.append(("finish",))


def test_unknown_tracker_gets_did_you_mean_and_missing_package_the_pip_line(monkeypatch):
    _installed(monkeypatch)
    with pytest.raises(ConfigError) as err:
        check_backends(["jsonl", "tensorbaord"])
    assert "unknown tracker 'tensorbaord'" in str(err.value) and "did you mean 'tensorboard'?" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check_backends(["comet_ml"])
    assert str(err.value) == ("track.backends: the comet_ml tracker needs the comet-ml package, which is not installed"
                              " (fix: pip install comet-ml (or drop comet_ml from track.backends))")
    check_backends(["jsonl", "tensorboard"])  # installed here: no error


def test_missing_tracker_writes_nothing(tmp_path, monkeypatch):
    _installed(monkeypatch)
    with pytest.raises(ConfigError, match="pip install mlflow"):
        MetricsSink(tmp_path / "run", backends=("jsonl", "mlflow"))
    assert not (tmp_path / "run").exists()


def test_cli_rejects_a_missing_tracker_before_the_run_directory_exists(tmp_path, monkeypatch, capsys):
    import rlhfkit.config.aliases

    monkeypatch.setattr(rlhfkit.config.aliases, "_ALIASES_LOGGED", set())  # an earlier test may have logged report_to
    _installed(monkeypatch)
    out = tmp_path / "run"
    assert main(["sft", f"output_dir={out}", "model.name=tiny:hidden=32,layers=1", "data.train=x.jsonl",
                 "report_to=mlflow"]) == 2
    (error,) = capsys.readouterr().err.splitlines()  # one line: alias notices are printed only for a valid config
    assert error.startswith("error: track.backends: the mlflow tracker needs the mlflow package")
    assert not out.exists()


def test_accelerate_tracker_gets_config_scalars_tables_and_finish(tmp_path, monkeypatch):
    import accelerate.tracking

    _installed(monkeypatch, "mlflow")
    monkeypatch.setitem(accelerate.tracking.LOGGER_TYPE_TO_CLASS, "mlflow", FakeTracker)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    FakeTracker.made.clear()
    config = {"optim": {"lr": 1e-5, "betas": [0.9, 0.99]}, "output_dir": str(tmp_path)}
    with MetricsSink(tmp_path, backends=("jsonl", "mlflow"), config=config) as sink:
        sink.log({"loss": 1.5, "note": "text"}, 3)
        with SampleLogger(tmp_path, max_rows=0, sink=sink) as samples:
            samples.log(3, ["p"], ["r"], [0.5])
    (tracker,) = FakeTracker.made
    assert tracker.args == {"experiment_name": "rlhfkit", "logging_dir": str(tmp_path / "mlruns"),
                            "run_name": tmp_path.name}
    assert tracker.calls == [
        ("start",),
        ("config", {"optim.lr": 1e-5, "optim.betas": "[0.9, 0.99]", "output_dir": str(tmp_path)}),
        ("log", {"loss": 1.5}, 3),  # scalars only
        ("table", "samples", ["prompt", "response", "score"], [["p", "r", 0.5]], 3),
        ("finish",),
    ]
    assert read_metrics(tmp_path)[0]["note"] == "text"  # metrics.jsonl still keeps everything


def test_sample_table_goes_to_tensorboard_text(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsSink(tmp_path, backends=("jsonl", "tensorboard")) as sink:
        with SampleLogger(tmp_path, max_rows=0, sink=sink) as samples:
            samples.log(7, ["say | hi"], ["hi\nthere"], [1.0])
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    (event,) = acc.Tensors("samples/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 7 and text == markdown_table(["prompt", "response", "score"], [["say | hi", "hi\nthere", 1.0]])


def test_markdown_table_and_flat_config_hand_values():
    assert markdown_table(["a", "b"], [["x|y", "1\n2"]]) == "| a | b |\n|---|---|\n| x\\|y | 1<br>2 |"
    assert flat_config({"a": {"b": 1, "c": None}, "d": [1], "e": {}}) == {"a.b": 1, "a.c": None, "d": "[1]",
                                                                          "e": "{}"}
