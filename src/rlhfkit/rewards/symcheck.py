"""The maths verifier's symbolic checks, each bounded in time and memory, safe from any thread of any process.

SymPy can hang inside C code that no signal interrupts (``10**10**10`` is a big-integer power), so a check must run
in a process that can be killed at its limit. Forking the *caller* for each check, as :mod:`.maths` did before, is
unsafe once the caller has threads, and a training process always has them (torch's, the progress ticker's, a
user's HTTP judge): the child gets copies of the locks other threads held at the fork, can deadlock or crash, and a
crashed check read as a time-out, so a right answer scored "no verdict" (seen as segmentation faults in the test
suite, where an HTTP server thread called the verifier).

Here one helper process a calling process, started from a fresh interpreter (no threads, nothing of the caller's
state), forks a child for each check (a fork from a single-threaded process is safe), kills it at the limit
(SIGKILL), caps its address space and answers one line. Callers share it under a lock; a helper that dies or stops
answering is replaced and the check retried once; it exits when its caller does (end of its stdin). A child that dies
without an answer (a crash, the memory cap) is "not equal", as a check that raises; only the limit is "no verdict".

Why our own: :mod:`multiprocessing`'s forkserver forks from a clean process too, but it re-imports the caller's
``__main__`` in each worker, so a user's training script without a ``__main__`` guard would run again; and a
:class:`concurrent.futures.ProcessPoolExecutor` cannot kill one hung task.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

MEMORY = 1 << 30  # bytes of address space a check's child may add to the helper's
START_S = 120.0  # seconds the helper may take to start (importing SymPy on a loaded machine), outside any check's limit
GRACE_S = 10.0  # seconds past a check's limit before the helper itself counts as hung


class CheckTimeout(BaseException):  # BaseException: SymPy code that catches Exception cannot swallow it
    pass


# ─────────────────────────────────────────── the check itself ───────────────────────────────────────────


@functools.cache
def verifier():
    """math-verify, imported and used once on a trivial pair outside any time limit: importing it (SymPy, the ANTLR
    LaTeX parser) takes seconds on a loaded machine, which must not count against the first real check's limit (the
    check helper imports it before it answers "ready"; its forked checks inherit it imported)."""
    import math_verify

    for name in ("math_verify", "latex2sympy2_extended"):  # "timeout disabled" on every call: ours is around it
        logging.getLogger(name).setLevel(logging.ERROR)
    configs = [math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig()]
    math_verify.verify(math_verify.parse("$x/2$", extraction_config=configs, parsing_timeout=None),
                       math_verify.parse("$0.5 x$", extraction_config=configs, parsing_timeout=None),
                       timeout_seconds=None)
    return math_verify


def symbolic_equal(pred: str, ref: str) -> bool:
    """Whether math-verify parses both answers and finds them equal; unbounded (:func:`check` bounds it)."""
    mv = verifier()
    parse, verify = mv.parse, mv.verify
    configs = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    gold = parse(f"${ref}$", extraction_config=configs, parsing_timeout=None)
    got = parse(f"${pred}$", extraction_config=configs, parsing_timeout=None)
    if not gold or not got:
        return False
    return bool(verify(gold, got, timeout_seconds=None))


# ─────────────────────────────────────────── the child of one check ───────────────────────────────────────────


def in_child(fn, timeout_s: float) -> bool:
    """``fn()`` (a bool) in a forked child killed at ``timeout_s`` (raises :class:`CheckTimeout`), its address space
    capped at :data:`MEMORY` above this process's. A child that raises or dies without answering gives False. Call
    it from a single-threaded process (the helper); elsewhere a fork can copy another thread's held lock."""
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    with warnings.catch_warnings():  # Python 3.12+ warns about fork in a process with threads (the tests call this
        warnings.simplefilter("ignore", DeprecationWarning)  # directly, from pytest's process)
        pid = os.fork()
    if pid == 0:  # the child: compute, answer one byte, exit without running any of the parent's exit handlers
        code = b"e"
        try:
            os.close(read_fd)
            die_with(parent)
            cap_memory(MEMORY)
            code = b"1" if fn() else b"0"
        except BaseException:  # noqa: BLE001 - any failure of the check is "not equal"
            pass
        finally:
            try:
                os.write(write_fd, code)
            finally:
                os._exit(0)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], timeout_s)
        answer = os.read(read_fd, 1) if ready else None
        if not ready:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(read_fd)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    if answer is None:
        raise CheckTimeout()
    return answer == b"1"  # b"" (died without a word) and b"e" (raised) are "not equal"


def die_with(parent: int) -> None:
    """Linux: this process is killed when its parent ends (``PR_SET_PDEATHSIG``), so a check still computing when its
    helper is killed does not compute on for ever as an orphan; a parent already gone ends it now."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the helper's stop() kills its process group instead
        pass
    if os.getppid() != parent:
        os._exit(0)


def cap_memory(extra: int) -> None:
    """Limit this process's address space to what it uses now plus ``extra`` bytes (Linux; elsewhere nothing)."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = used + extra if hard == resource.RLIM_INFINITY else min(hard, used + extra)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (OSError, ValueError, ImportError):
        pass


# ─────────────────────────────────────────── the helper process ───────────────────────────────────────────


def serve() -> None:
    """The helper's loop: one JSON request a line ``{"pred", "ref", "timeout"}`` on stdin -> one line ``1`` / ``0`` /
    ``t`` (past the limit) on stdout; ``ready`` first, once SymPy is imported; returns at the end of its input. The
    protocol runs on private copies of fds 0 and 1, which become /dev/null and stderr: nothing a library prints or
    reads, here or in a check's child, can mix with a verdict."""
    inp, out = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    verifier()  # imported (once) before any check's clock starts; each child inherits it
    out.write(b"ready\n")
    out.flush()
    for line in inp:
        req = json.loads(line)
        pair = functools.partial(symbolic_equal, req["pred"], req["ref"])
        try:
            verdict = b"1" if in_child(pair, req["timeout"]) else b"0"
        except CheckTimeout:
            verdict = b"t"
        out.write(verdict + b"\n")
        out.flush()


class _Helper:
    """This process's helper, started on first use; shared by its threads under a lock; a forked child forgets it
    (:meth:`forget`, registered with ``os.register_at_fork``) and starts its own."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.buf = b""

    def check(self, pred: str, ref: str, timeout_s: float) -> bool | None:
        request = (json.dumps({"pred": pred, "ref": ref, "timeout": timeout_s}) + "\n").encode()
        with self.lock:
            for _ in range(2):  # a helper that died or hung is replaced once
                proc = self._running()
                try:
                    proc.stdin.write(request)
                    proc.stdin.flush()
                    line = self._line(time.monotonic() + timeout_s + GRACE_S)
                except (OSError, ValueError):
                    line = None
                except BaseException:  # the caller's own time limit (a timer signal) cut the exchange: the answer
                    self.stop()  # still on its way would be read as the next check's, so this helper goes
                    raise
                if line in (b"1", b"0"):
                    return line == b"1"
                if line == b"t":
                    return None
                self.stop()
            return None

    def _running(self) -> subprocess.Popen:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        root = str(Path(__file__).resolve().parents[2])  # the directory that holds the rlhfkit package
        code = f"import sys; sys.path.insert(0, {root!r}); from rlhfkit.rewards.symcheck import serve; serve()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     start_new_session=True)  # its stderr is ours: a failed start says why
        self.buf = b""
        try:
            ready = self._line(time.monotonic() + START_S)
        except BaseException:  # cut by the caller's own limit while starting: no half-started helper is kept
            self.stop()
            raise
        if ready != b"ready":
            self.stop()
            raise RuntimeError(f"the maths verifier's check process ({sys.executable}) did not start within "
                               f"{START_S:.0f} s (its error, if any, is above); is math-verify installed?")
        return self.proc

    def _line(self, deadline: float) -> bytes | None:
        """The helper's next line, or None at its end of output or past ``deadline``."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def stop(self) -> None:
        proc, self.proc, self.buf = self.proc, None, b""
        if proc is None:
            return
        for close in (proc.stdin.close, proc.stdout.close):
            try:
                close()
            except OSError:
                pass
        try:  # the helper leads its own process group (start_new_session): it and a check it is running
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait()

    def forget(self) -> None:
        """In a forked child: the parent's helper and lock are not this process's (the lock may have been held by
        another thread at the fork); start afresh. The child's copies of the parent's pipes to its helper are
        pointed at /dev/null, not closed: closing (or the garbage collector's close) flushes the child's copy of the
        request buffer, and a fork between another thread's write and its flush would then send the parent's helper
        that request twice, its second answer read by the parent as its next check's verdict. Nor does the child
        hold the helper's stdin open after the parent has gone."""
        proc = self.proc
        self.lock, self.proc, self.buf = threading.Lock(), None, b""
        if proc is None:
            return
        try:
            null = os.open(os.devnull, os.O_RDWR)
        except OSError:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                os.dup2(null, stream.fileno())
            except (OSError, ValueError):
                pass
        os.close(null)


_HELPER = _Helper()
atexit.register(_HELPER.stop)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_HELPER.forget)


def check(pred: str, ref: str, timeout_s: float) -> bool | None:
    """Whether ``pred`` and ``ref`` are equal by math-verify, within ``timeout_s`` of wall time: True / False, or
    None past the limit (or when the helper died or hung twice: no verdict rather than a wrong one). RuntimeError
    when no helper starts."""
    return _HELPER.check(pred, ref, timeout_s)


def helper_pid() -> int | None:
    """The pid of this process's helper, if one runs (tests)."""
    proc = _HELPER.proc
    return proc.pid if proc is not None and proc.poll() is None else None
