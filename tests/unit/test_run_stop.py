"""Stopping a run (``train/lifecycle/stop.py``): the SIGTERM / SIGUSR1 handler, a stop at a step boundary of the
supervised
loop with a checkpoint there and a bit-exact resume, and every early end (a signal, a failure after the first
metrics line) closing the run's files and writing the report with the cause at its top. A toy torch model, as in
test_loop.py: each test well under a second or two."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from test_loop import _job

import rlhfkit.train.supervised.loop as loop
from rlhfkit.config import build_config
from rlhfkit.errors import Stopped
from rlhfkit.track.metrics import read_run_metrics as read_metrics  # rlhfkit's names (the run writes TRL's)
from rlhfkit.train.lifecycle.checkpoint import list_checkpoints
from rlhfkit.train.lifecycle.run import start_run
from rlhfkit.train.lifecycle.stop import StopControl, exit_code
from rlhfkit.train.supervised.loop import train_supervised


def test_exit_codes_are_128_plus_the_signal():
    assert exit_code("SIGTERM") == 143 and exit_code("SIGUSR1") == 138


def test_handler_notes_a_signal_in_the_loop_and_stops_at_once_outside_it():
    before = signal.getsignal(signal.SIGUSR1)
    stop = StopControl()
    stop.install()
    try:
        with pytest.raises(Stopped) as err:  # not armed (loading): at once, like Ctrl-C
            os.kill(os.getpid(), signal.SIGUSR1)
        assert (err.value.exit_code, err.value.message) == (138, "stopped by SIGUSR1 before the first update")
        assert not err.value.names_checkpoint  # the CLI adds the last checkpoint
        stop.arm(True)
        os.kill(os.getpid(), signal.SIGTERM)  # armed: noted, the loop goes on to its step boundary
        assert stop.signal == "SIGTERM" and stop.armed
        with pytest.raises(Stopped) as err:  # a second signal does not wait
            os.kill(os.getpid(), signal.SIGTERM)
        assert err.value.exit_code == 143
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is before


def _cfg(tmp_path, name: str, *overrides: str):
    return build_config("sft", {}, [f"output_dir={tmp_path / name}", "optim.lr=1e-2", "optim.warmup_steps=2",
                                    "train.max_steps=6", "train.batch_size=8", "train.save_every=4",
                                    "train.mixed_precision='no'", *overrides])


def _toy(cfg):
    with start_run(cfg) as run:
        job = _job()
        train_supervised(run, job)
    return job


def test_sigterm_stops_after_the_update_with_a_checkpoint_and_resumes_bit_exact(tmp_path, monkeypatch):
    straight = _toy(_cfg(tmp_path, "straight"))
    real, calls = loop.clip_and_step, []

    def signalled_in_update_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of update 3
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "clip_and_step", signalled_in_update_3)
    cfg = _cfg(tmp_path, "stopped")
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as err:
        _toy(cfg)
    assert err.value.exit_code == 143
    assert err.value.message == "stopped by SIGTERM at step 3; checkpoint-3 saved; rerun the same command to resume"
    assert len(calls) == 3  # update 3 finished, no update 4
    out = tmp_path / "stopped"
    assert sorted(s for s, _ in list_checkpoints(out)) == [3]
    assert [x["step"] for x in read_metrics(out) if "train/loss" in x] == [1, 2, 3]
    assert "stopped by SIGTERM at step 3" in (out / "report.html").read_text()
    assert signal.getsignal(signal.SIGTERM) is before  # the run's handler is gone with the run
    monkeypatch.setattr(loop, "clip_and_step", real)
    resumed = _toy(cfg)
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert [x["step"] for x in read_metrics(out) if "train/loss" in x] == [1, 2, 3, 4, 5, 6]


def test_a_signal_at_a_periodic_checkpoint_writes_no_second_one(tmp_path, monkeypatch):
    real, calls = loop.clip_and_step, []

    def signalled_in_update_4(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGUSR1)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "clip_and_step", signalled_in_update_4)
    with pytest.raises(Stopped, match="stopped by SIGUSR1 at step 4; checkpoint-4 saved") as err:
        _toy(_cfg(tmp_path, "at4"))
    assert err.value.exit_code == 138
    assert sorted(s for s, _ in list_checkpoints(tmp_path / "at4")) == [4]


def test_a_failure_after_the_first_line_closes_the_files_and_writes_the_report(tmp_path, monkeypatch):
    real, calls, sinks = loop.clip_and_step, [], []

    def fails_in_update_3(accelerator, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("disk on fire")
        return real(accelerator, *args, **kwargs)

    monkeypatch.setattr(loop, "clip_and_step", fails_in_update_3)
    real_log = loop.Run.log

    def log(self, metrics, step):
        sinks.append(self.sink)
        return real_log(self, metrics, step)

    monkeypatch.setattr(loop.Run, "log", log)
    with pytest.raises(ValueError, match="disk on fire"):
        _toy(_cfg(tmp_path, "failed"))
    out = tmp_path / "failed"
    assert [x["step"] for x in read_metrics(out) if "train/loss" in x] == [1, 2]
    assert sinks and sinks[-1]._writer._file.closed  # metrics.jsonl closed
    assert "failed: ValueError: disk on fire" in (out / "report.html").read_text()


def test_should_stop_and_local_failures():
    from types import SimpleNamespace

    one, two = SimpleNamespace(num_processes=1), SimpleNamespace(num_processes=2)
    stop = StopControl()
    assert not stop.should_stop(one) and not stop.should_stop(one, last=True)
    stop.signal = "SIGTERM"  # a signal: stop before the last step, but let the last step finish and save
    assert stop.should_stop(one) and not stop.should_stop(one, last=True)
    stop.signal = None

    def boom():
        raise RuntimeError("health: critical")

    with pytest.raises(RuntimeError):  # one process: raised at once
        stop.local(one, boom)
    assert stop.local(one, lambda x: x + 1, 1) == 2 and stop.error is None
    stop.local(two, boom)  # several processes: noted, every rank stops at the next check, the last step included
    assert isinstance(stop.error, RuntimeError) and stop.should_stop(one, last=True)


def test_a_second_signal_in_the_loop_says_it_was_a_second_signal():
    stop = StopControl()
    stop.install()
    try:
        stop.arm(True)
        os.kill(os.getpid(), signal.SIGTERM)  # noted
        with pytest.raises(Stopped) as err:
            os.kill(os.getpid(), signal.SIGUSR1)
        assert err.value.message == ("stopped by SIGUSR1 at a second signal (the first, SIGTERM, was waiting for the "
                                     "step to end)")
        assert err.value.exit_code == 138 and not err.value.names_checkpoint
    finally:
        stop.uninstall()


def _stop_two_ranks(monkeypatch, error, other):
    """StopControl.stop on rank 0 of two (a fake accelerator; the gather returns this rank's reason and ``other``):
    the updates ``save`` was called for, and what it raised."""
    from types import SimpleNamespace

    import accelerate.utils

    monkeypatch.setattr(accelerate.utils, "gather_object", lambda why: [*why, other])
    stop, saves = StopControl(), []
    stop.error = error
    with pytest.raises(BaseException) as err:  # Stopped is a KeyboardInterrupt
        stop.stop(SimpleNamespace(num_processes=2, process_index=0), 3, lambda: saves.append(3))
    return saves, err.value


def test_a_critical_health_stop_saves_no_checkpoint_under_several_processes(monkeypatch):
    from rlhfkit.track import CriticalHealthStop

    calm = (1, None, None, 0, False)
    health = CriticalHealthStop("stopped on a critical health warning: KL 80", where="step 3", fix="lower optim.lr")
    saves, err = _stop_two_ranks(monkeypatch, health, calm)  # the main rank: its own error, nothing saved
    assert err is health and saves == []
    line = ("rank 0 failed", (0, None, health.one_line(), 2, True))  # the other rank: one line, exit 2, nothing saved
    saves, err = _stop_two_ranks(monkeypatch, None, line[1])
    assert isinstance(err, Stopped) and err.exit_code == 2 and saves == []
    assert line[0] in err.message and "step 3 not saved (a critical health warning)" in err.message
    saves, err = _stop_two_ranks(monkeypatch, RuntimeError("reward server down"), calm)  # any other failure: saved
    assert isinstance(err, RuntimeError) and saves == [3]


def test_a_critical_health_stop_saves_no_checkpoint_with_one_process(tmp_path, monkeypatch):
    from rlhfkit.track import CriticalHealthStop, HealthMonitor
    from rlhfkit.track.health import CRITICAL, HealthWarning

    real = HealthMonitor.evaluate

    def critical_at_4(self, metrics, step, texts=None):
        out = real(self, metrics, step, texts)
        return [*out, HealthWarning(step, "kl_blowup", CRITICAL, "optim.lr", "KL 80")] if step == 4 else out

    monkeypatch.setattr(HealthMonitor, "evaluate", critical_at_4)
    with pytest.raises(CriticalHealthStop, match="KL 80"):  # at step 4, a periodic checkpoint step (save_every=4)
        _toy(_cfg(tmp_path, "health", "track.stop_on_critical=true"))
    assert list_checkpoints(tmp_path / "health") == []


def test_callbacks_hear_of_steps_and_can_ask_for_a_stop(tmp_path):
    # the Python API's callbacks (train/lifecycle/run.py): a plain function is an on_step callback; True asks for a
    # stop at the
    # next step boundary, which exits with code 0 (no signal); eval metrics also reach on_eval
    from types import SimpleNamespace

    from rlhfkit.train.lifecycle.run import Run, with_callbacks
    from rlhfkit.train.lifecycle.stop import exit_code

    heard = []

    def watch(step, metrics):
        heard.append((step, dict(metrics)))
        return step >= 2

    class Evals:
        def on_eval(self, step, metrics):
            heard.append(("eval", metrics))

    with with_callbacks([watch, Evals()]):
        run = Run(cfg=None, accelerator=SimpleNamespace(is_main_process=True), run_dir=tmp_path)
    assert Run(cfg=None, accelerator=None, run_dir=tmp_path).callbacks == ()  # outside the context: none
    run.log({"loss": 1.0}, 1)
    assert run.stop.signal is None
    run.log({"loss": 0.5, "eval/loss": 0.7}, 2)
    assert heard == [(1, {"loss": 1.0}), (2, {"loss": 0.5, "eval/loss": 0.7}), ("eval", {"eval/loss": 0.7})]
    assert run.stop.signal == "a callback (watch)" and exit_code(run.stop.signal) == 0
    assert exit_code("SIGTERM") == 143
