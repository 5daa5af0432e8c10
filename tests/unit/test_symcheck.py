"""The maths verifier's bounded symbolic check (rewards/symcheck.py): right from many threads at once, a time-out
is "no verdict" and a crash "not equal", a helper that dies is replaced, a forked caller gets its own helper, and a
helper never outlives its caller."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlhfkit.rewards import symcheck

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the bounded check forks (POSIX only)")
SRC = str(Path(symcheck.__file__).resolve().parents[2])
TOWER = "10^{10^{10}}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_checks_from_many_threads_at_once_are_each_right():
    pairs = [(f"{n}\\sqrt{{2}}", f"\\sqrt{{{2 * n * n + 1}}}", False) for n in range(2, 6)]
    pairs += [(f"\\sqrt{{{2 * n * n}}}", f"{n}\\sqrt{{2}}", True) for n in range(2, 6)]
    got, spin = {}, threading.Event()

    def busy():  # other threads of the caller running, as torch's and a progress ticker's do
        while not spin.is_set():
            sum(range(1000))

    def one(i, pred, ref):
        got[i] = symcheck.check(pred, ref, 20.0)

    spinners = [threading.Thread(target=busy) for _ in range(2)]
    workers = [threading.Thread(target=one, args=(i, p, r)) for i, (p, r, _) in enumerate(pairs)]
    for t in spinners + workers:
        t.start()
    for t in workers:
        t.join()
    spin.set()
    assert got == {i: want for i, (_, _, want) in enumerate(pairs)}


def test_a_time_out_is_no_verdict_and_the_helper_goes_on():
    assert symcheck.check("x+1", "1+x", 20.0) is True
    pid = symcheck.helper_pid()
    t0 = time.perf_counter()
    assert symcheck.check(TOWER, "7", 1.0) is None
    assert time.perf_counter() - t0 < symcheck.GRACE_S  # the helper's own limit ended it, not the caller's grace
    assert symcheck.helper_pid() == pid and symcheck.check("2x", "x+x", 20.0) is True


def test_a_check_that_crashes_or_raises_is_not_equal_and_not_a_time_out():
    t0 = time.perf_counter()
    assert symcheck.in_child(lambda: os.kill(os.getpid(), signal.SIGKILL), 30.0) is False  # dies without a word
    assert symcheck.in_child(lambda: 1 / 0, 30.0) is False
    assert symcheck.in_child(lambda: True, 30.0) is True
    assert time.perf_counter() - t0 < 25  # answered when the child died, not at the limit
    with pytest.raises(symcheck.CheckTimeout):
        symcheck.in_child(lambda: time.sleep(30), 0.5)


def test_a_helper_that_died_is_replaced_and_the_check_answered():
    assert symcheck.check("x*2", "2*x", 20.0) is True
    pid = symcheck.helper_pid()
    os.kill(pid, signal.SIGKILL)  # our own child process
    assert symcheck.check("x*3", "3*x", 20.0) is True
    assert symcheck.helper_pid() not in (None, pid)


def _in_fork(queue):
    queue.put((symcheck.check("y+y", "2*y", 20.0), symcheck.helper_pid()))


def test_a_forked_caller_starts_its_own_helper():
    assert symcheck.check("z+z", "2*z", 20.0) is True
    parent = symcheck.helper_pid()
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_in_fork, args=(queue,))
    child.start()
    answer, child_helper = queue.get(timeout=120)
    child.join(30)
    assert answer is True and child_helper not in (None, parent)
    assert symcheck.helper_pid() == parent and symcheck.check("z*z", "z^2", 20.0) is True


def test_the_helper_exits_with_its_caller():
    code = (f"import os, sys; sys.path.insert(0, {SRC!r}); from rlhfkit.rewards import symcheck; "
            "assert symcheck.check('a+a', '2*a', 60.0) is True; print(symcheck.helper_pid(), flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True)
    pid = int(out.stdout.split()[-1])  # the caller ended without its exit handlers (as a killed process does)
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def test_what_a_check_prints_or_reads_does_not_mix_with_the_verdicts():
    code = (f"import sys; sys.path.insert(0, {SRC!r}); from rlhfkit.rewards import symcheck\n"
            "def noisy(pred, ref):\n"
            "    print('0'); sys.stdout.flush(); sys.stdin.read(); return pred == ref\n"  # a library that talks
            "symcheck.symbolic_equal = noisy\n"
            "symcheck.serve()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=180,
                          input=b'{"pred": "a", "ref": "a", "timeout": 20}\n{"pred": "a", "ref": "b", "timeout": 20}\n')
    assert proc.returncode == 0 and proc.stdout.split() == [b"ready", b"1", b"0"]


def test_a_check_cut_by_the_callers_own_limit_leaves_no_stale_answer_for_the_next():
    class Cut(BaseException):
        pass

    def alarm(signum, frame):
        raise Cut()

    assert symcheck.check("q+q", "2*q", 20.0) is True
    old = signal.signal(signal.SIGALRM, alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)  # the caller's limit, as workers.py's in-process calls have
        with pytest.raises(Cut):
            symcheck.check(TOWER, "x+1", 3.0)  # the helper answers "t" at 3 s, after the caller gave up
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    time.sleep(3.5)  # past the cut check's limit: a kept helper would have its "t" waiting now
    assert symcheck.check("q*q", "q^2", 20.0) is True and symcheck.check("q+1", "q", 20.0) is False


def test_a_fork_while_another_thread_checks_does_not_inherit_its_lock():
    assert symcheck.check("w+w", "2*w", 20.0) is True
    busy = threading.Thread(target=symcheck.check, args=(TOWER, "x+1", 2.0))  # holds the lock for ~2 s
    busy.start()
    time.sleep(0.3)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_in_fork, args=(queue,))
    child.start()  # forked while the lock is held
    try:
        answer, child_helper = queue.get(timeout=30)
    finally:
        child.join(30)
        if child.is_alive():  # a child stuck on the inherited lock: ours to end
            child.kill()
        busy.join()
    assert answer is True and child_helper is not None


def test_a_fork_between_a_checks_write_and_its_flush_sends_the_parents_helper_nothing(tmp_path):
    """A fork while another thread is between writing its request and flushing it: the child's copy of the buffer
    reached the parent's helper when the child dropped the pipe (its garbage collector flushes it), and the helper's
    answer to it waited in the parent's pipe as the next check's verdict. The child also held the helper's stdin."""
    assert symcheck.check("v+v", "2*v", 20.0) is True
    helper = symcheck._HELPER
    stdin_pipe = os.readlink(f"/proc/self/fd/{helper.proc.stdin.fileno()}")
    helper.proc.stdin.write(b'{"pred": "v", "ref": "v", "timeout": 20}\n')  # written, not yet flushed
    seen = tmp_path / "child_fds"
    pid = os.fork()
    if pid == 0:  # the child: what it holds after the fork, then its end, as a short-lived worker's
        try:
            import gc
            gc.collect()
            seen.write_text("\n".join(os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                                      if os.path.exists(f"/proc/self/fd/{fd}")))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    stray = helper._line(time.monotonic() + 3.0)
    helper.stop()  # drops the parent's own unflushed request with its helper
    assert stray is None, f"the parent's helper answered a request the child sent: {stray!r}"
    assert stdin_pipe not in seen.read_text().split("\n"), "the child still held the helper's stdin"
    assert symcheck.check("v*v", "v^2", 20.0) is True


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            pass
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table in /proc")
@pytest.mark.parametrize("how", ["stop", "killed"])
def test_a_check_running_when_its_helper_ends_ends_with_it(how):
    assert symcheck.check("v+v", "2*v", 20.0) is True
    helper = symcheck.helper_pid()
    pending = threading.Thread(target=symcheck.check, args=(TOWER, "x+1", 5.0))
    pending.start()
    deadline = time.monotonic() + 20
    while not (kids := _children(helper)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kids, "the helper forked no check"
    try:
        if how == "stop":  # the caller gives up on it (its own limit, the end of the process)
            symcheck._HELPER.stop()
        else:  # the helper killed by something else (the OOM killer)
            os.kill(helper, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(k) for k in kids), "the check computes on as an orphan"
    finally:
        for k in kids:  # our own grandchildren: ended whatever the verdict
            try:
                os.kill(k, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pending.join(90)
