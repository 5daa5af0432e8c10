"""metrics.jsonl: valid JSON with NaN, flushed per line, resume truncation, no-op off the main process."""

import json
import math

import pytest
import torch

from rlhfkit.errors import UserError
from rlhfkit.track import MetricsSink, read_metrics


def test_lines_are_valid_json_including_nan_and_tensors(tmp_path):
    sink = MetricsSink(tmp_path)
    sink.log(
        {"loss": torch.tensor(1.5), "lr": 5e-4, "bad": float("nan"), "big": float("-inf"), "n": 3}, step=1
    )
    # flushed per line: readable before close
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    sink.close()
    assert len(lines) == 1
    row = json.loads(lines[0], parse_constant=lambda c: pytest.fail(f"bare {c} is not JSON"))
    assert list(row)[:2] == ["step", "time"]
    assert row["step"] == 1 and row["loss"] == 1.5 and row["n"] == 3 and isinstance(row["time"], float)
    back = read_metrics(tmp_path)[0]
    assert math.isnan(back["bad"]) and back["big"] == -math.inf and back["lr"] == 5e-4


def test_appends_across_sinks_and_truncates_on_resume(tmp_path):
    with MetricsSink(tmp_path) as sink:
        for step in range(1, 6):
            sink.log({"loss": float(step)}, step)
    # crashed after step 5, resuming from the checkpoint at step 3: steps 4 and 5 are logged again
    with MetricsSink(tmp_path, resume_step=3) as sink:
        for step in (4, 5, 6):
            sink.log({"loss": 10.0 + step}, step)
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in rows] == [1.0, 2.0, 3.0, 14.0, 15.0, 16.0]


def test_torn_last_line_is_skipped_and_not_glued(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "time": 0, "loss": 1}\n{"step": 2, "ti')
    with MetricsSink(tmp_path) as sink:
        sink.log({"loss": 3.0}, 3)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 3]


def test_not_main_writes_nothing(tmp_path):
    run = tmp_path / "run"
    with MetricsSink(run, backends=("jsonl", "tensorboard", "wandb"), is_main=False) as sink:
        sink.log({"loss": 1.0}, 1)
    assert not run.exists()
    assert read_metrics(run) == []


def test_reserved_name_and_unknown_backend(tmp_path):
    with MetricsSink(tmp_path) as sink, pytest.raises(ValueError, match="reserved"):
        sink.log({"step": 1.0}, 1)
    with pytest.raises(UserError, match="track.backends"):
        MetricsSink(tmp_path, backends=("jsonl", "mlflow"))


def test_wandb_missing_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(UserError, match="pip install wandb"):
        MetricsSink(tmp_path, backends=("wandb",))


def test_tensorboard_writes_event_file(tmp_path):
    pytest.importorskip("tensorboard")
    with MetricsSink(tmp_path, backends=("jsonl", "tensorboard")) as sink:
        sink.log({"loss": torch.tensor(0.5), "note": "text is skipped"}, 1)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert read_metrics(tmp_path)[0]["note"] == "text is skipped"
