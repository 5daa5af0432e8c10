"""bench/_stop.py: a bench's workers end with the bench (a `kill PID`, a Ctrl-C), their own children with them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import import_bench, running, sleeper_with_child

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _stand_in_bench(tmp_path: Path, own_group: bool = False) -> tuple[subprocess.Popen, list[int]]:
    """A bench that waits on a worker through ``_stop.run``; the worker starts a child of its own, writes both pids
    and sleeps. Returns the bench (still waiting) and the two pids."""
    pids = tmp_path / "pids"
    worker = sleeper_with_child(tmp_path / "worker.py", pids)
    program = (f"import sys\nsys.path.insert(0, {str(BENCH)!r})\nimport _stop\n"
               f"_stop.run([sys.executable, {str(worker)!r}], capture_output=True, text=True)\n")
    bench = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=own_group)
    deadline = time.monotonic() + 60
    while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline and bench.poll() is None:
        time.sleep(0.05)
    assert pids.exists() and pids.read_text(), bench.communicate(timeout=30)[0]
    return bench, [int(x) for x in pids.read_text().split()]


def _leftover(pids: list[int]) -> list[int]:
    time.sleep(0.5)
    left = [pid for pid in pids if running(pid)]
    for pid in left:  # harmless if the check fails: only this test's own stand-ins
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, -signal.SIGINT)])
def test_a_stopped_bench_takes_its_worker_and_the_workers_children_with_it(tmp_path, sig, code):
    """Python's default SIGTERM ends a process with no cleanup: a bare `kill PID` of a bench (vs_trl, distill,
    real_shapes, trl_port, vlm, ...) left the worker it waited on running, holding the cores or the GPU. Ctrl-C
    (here SIGINT to the bench alone, as a kill -INT of its pid) goes the same way."""
    bench, pids = _stand_in_bench(tmp_path)
    bench.send_signal(sig)
    output = bench.communicate(timeout=60)[0]
    assert not _leftover(pids), f"the worker's processes outlived the bench: {output}"
    assert bench.returncode == code, output
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in output


def test_a_bench_whose_group_is_killed_takes_its_worker_with_it(tmp_path):
    """What stops a bench's process group whole (gpu_suite's budget, which runs vs_trl.py in a row, with SIGKILL)
    reaches the worker: it stays in the bench's group (a group of its own would outlive the kill)."""
    bench, pids = _stand_in_bench(tmp_path, own_group=True)
    os.killpg(bench.pid, signal.SIGKILL)
    bench.communicate(timeout=60)
    assert not _leftover(pids), "the worker outlived its bench's process group"


def test_run_returns_what_subprocess_run_returns(tmp_path):
    _stop = import_bench("_stop")
    cmd = [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"]
    got, want = _stop.run(cmd, capture_output=True, text=True), subprocess.run(cmd, capture_output=True, text=True)
    assert (got.args, got.returncode, got.stdout, got.stderr) == (want.args, 3, "out\n", "err\n")
    with (tmp_path / "log").open("w") as f:
        assert _stop.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode == 3
    assert sorted((tmp_path / "log").read_text().split()) == ["err", "out"]


# Scripts whose subprocesses are not workers to stop with them (a pip download, git queries), or that stop their own
# (learning.py: its handler also starts no further seed; gpu_suite.py: it also marks the stopped row).
OWN_OR_SHORT = {"gpu_wheels.py", "learning.py", "gpu_suite.py"}


def test_every_bench_waits_on_its_workers_through_stop():
    """The class, not the five instances: a bench script that starts a worker with subprocess does it through
    ``_stop.run`` (or is named above, with why)."""
    direct = [f"{p.name}:{n}" for p in sorted(BENCH.glob("*.py")) if p.name not in OWN_OR_SHORT | {"_stop.py"}
              for n, line in enumerate(p.read_text().splitlines(), 1)
              if re.search(r"\bsubprocess\.(run|Popen|call|check_call|check_output)\(", line)]
    assert not direct, f"workers started outside bench/_stop.run: {direct}"
