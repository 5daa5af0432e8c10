"""Resuming SFT on the tiny model gives the run that never stopped: the same final weights, the same losses, no
step logged twice. The crash is simulated in-process (an exception inside an update) and for real (SIGKILL of a
training process, resumed by this one)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import sft_overrides
from safetensors.torch import load_file

import rlhfkit.train.supervised.loop as loop
from rlhfkit.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.track.metrics import read_run_metrics as read_metrics  # rlhfkit's names (the run writes TRL's)
from rlhfkit.train.lifecycle.checkpoint import list_checkpoints
from rlhfkit.train.supervised.sft import run_sft

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("ddp_sft_script.py")
N = 10  # checkpoints every N // 2 updates; runs stop after N + 2 and resume from checkpoint-N
# 190 training records: 11 updates of 8 x 2 accumulated micro-batches per epoch, so the run crosses an epoch
SETTINGS = ["data.limit=200", "train.epochs=1", "train.batch_size=8", "train.grad_accum=2", f"train.max_steps={2 * N}",
            f"train.save_every={N // 2}", f"train.eval_every={N // 2}", "optim.warmup_steps=2"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread here and in the killed process: the same arithmetic, and no oversubscribed cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def sft(task_data: Path, out: Path, *extra: str) -> dict:
    return run_sft(build_config("sft", {}, [*sft_overrides(task_data, out), *SETTINGS, *extra]))


class CountUpdates:
    """Wraps ``loop.clip_and_step``: counts optimizer updates, raises inside update ``crash_at``."""

    def __init__(self, monkeypatch, crash_at: int | None = None):
        self.real, self.n, self.crash_at = loop.clip_and_step, 0, crash_at
        monkeypatch.setattr(loop, "clip_and_step", self)

    def __call__(self, *args, **kwargs):
        self.n += 1
        if self.n == self.crash_at:
            raise KeyboardInterrupt(f"crash in update {self.n}")
        return self.real(*args, **kwargs)


def max_weight_diff(a: Path, b: Path) -> float:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    return max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)


def losses(run_dir: Path) -> dict[int, float]:
    return {x["step"]: x["train/loss"] for x in read_metrics(run_dir) if "train/loss" in x}


def assert_each_step_once(run_dir: Path, last: int = 2 * N) -> None:
    """One line per step (0..last); train/loss at 1..last; eval at 0, every N // 2 updates and at the end."""
    lines = read_metrics(run_dir)
    assert [x["step"] for x in lines] == list(range(last + 1))
    assert sorted(losses(run_dir)) == list(range(1, last + 1))
    assert [x["step"] for x in lines if "eval/loss" in x] == [0, *range(N // 2, last + 1, N // 2)]


def copy_without_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    (dst / "model.safetensors").unlink()  # the resumed run must write its own
    return dst


@pytest.fixture(scope="module")
def straight(task_data, tmp_path_factory) -> Path:
    """The run that never stops: 2N updates, checkpoints at N/2, N, 3N/2 (the newest two kept)."""
    out = tmp_path_factory.mktemp("straight")
    sft(task_data, out)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{N}", f"checkpoint-{3 * N // 2}"]
    assert_each_step_once(out)
    return out


def test_resume_after_a_crash_matches_the_straight_run(task_data, straight, tmp_path, monkeypatch):
    out = tmp_path / "crashed"
    CountUpdates(monkeypatch, crash_at=N + 3)  # dies inside update N + 3: checkpoint-N is the newest
    with pytest.raises(KeyboardInterrupt):
        sft(task_data, out)
    assert max(losses(out)) == N + 2 and not (out / "model.safetensors").exists()

    updates = CountUpdates(monkeypatch)
    sft(task_data, out)  # resume=auto
    assert updates.n == N  # it went on from checkpoint-N, it did not start over
    assert max_weight_diff(out, straight) < 1e-5
    assert_each_step_once(out)  # the lines of updates N+1, N+2 logged before the crash were dropped
    assert losses(out)[2 * N] == pytest.approx(losses(straight)[2 * N], abs=1e-6)
    assert losses(out) == pytest.approx(losses(straight), abs=1e-6)


def test_resume_after_sigkill_matches_the_straight_run(task_data, straight, tmp_path):
    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLHFKIT_TEST_SLOW_AFTER": str(N)}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(out), str(task_data / "sft.jsonl"), *SETTINGS],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # kill it in the middle of the run: checkpoint-N written and update N + 2 logged (0.3 s per update from here)
        deadline = time.monotonic() + 150
        while not ((out / f"checkpoint-{N}").is_dir() and max(losses(out), default=0) >= N + 2):
            assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stdout.read()}"
            assert time.monotonic() < deadline, "no checkpoint within 150 s"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert not (out / "model.safetensors").exists()  # it really died before the end
    assert sorted(s for s, _ in list_checkpoints(out)) == [N // 2, N]
    # the killed process ran the same configuration as the straight run (but for its directory)
    assert (out / "config.yaml").read_text().replace(str(out), "OUT") == \
        (straight / "config.yaml").read_text().replace(str(straight), "OUT")

    sft(task_data, out)  # a second process (this one) resumes from checkpoint-N
    assert max_weight_diff(out, straight) < 1e-5
    assert_each_step_once(out)
    assert losses(out) == pytest.approx(losses(straight), abs=1e-6)


def test_resume_never_starts_over(task_data, straight, tmp_path):
    out = copy_without_model(straight, tmp_path / "never")
    sft(task_data, out, "train.resume=never", "train.max_steps=4")
    # from scratch: the first losses of the straight run (warm-up 2, linear decay: the same LR for these 4 updates)
    assert losses(out) == pytest.approx({k: losses(straight)[k] for k in range(1, 5)}, abs=1e-6)
    assert [x["step"] for x in read_metrics(out)] == [0, 1, 2, 3, 4]  # the first attempt's lines are gone
    assert not list(out.glob("checkpoint-*"))  # the old run's checkpoints cannot be resumed by mistake later


def test_resume_from_a_given_checkpoint(task_data, straight, tmp_path, monkeypatch):
    out = copy_without_model(straight, tmp_path / "path")
    assert (out / f"checkpoint-{3 * N // 2}").is_dir()  # auto would take this one
    updates = CountUpdates(monkeypatch)
    sft(task_data, out, f"train.resume={out / f'checkpoint-{N}'}")
    assert updates.n == N
    assert max_weight_diff(out, straight) < 1e-5
    assert_each_step_once(out)
    state = json.loads((out / f"checkpoint-{3 * N // 2}" / "state.json").read_text())
    assert state["step"] == 3 * N // 2 and state["micro"] == 2 * (3 * N // 2)  # 2 micro-batches per update


def test_resume_from_a_bad_path_is_a_config_error(task_data, tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint at") as err:
        sft(task_data, tmp_path / "bad", f"train.resume={tmp_path / 'checkpoint-7'}")
    assert err.value.where == "train.resume"
