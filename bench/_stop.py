"""A bench's workers end with the bench: a `kill PID` of it (SIGTERM), a `timeout`, a Ctrl-C.

Python's default for SIGTERM ends a process at once, with no cleanup, so a bench stopped that way left the worker it
was waiting on running, still holding the cores or the GPU (a device call's time ran on after the call). ``run``
is ``subprocess.run`` for a bench's workers: each starts in its own process group, and on any way out of the wait
(SIGTERM, which ``run`` turns into ``SystemExit(143)``; Ctrl-C; an error) the whole group is killed, the worker's own
children with it, before the exception goes on. ``bench/learning.py`` and ``bench/gpu_suite.py`` keep their own
handlers (they also stop further seeds / mark the stopped row); this module has no torch import.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading


def _exit_on_sigterm(signum, frame):  # noqa: ARG001 - a signal handler's signature
    raise SystemExit(128 + signum)


def stop_on_sigterm() -> None:
    """SIGTERM becomes ``SystemExit(143)`` in the main thread, so ``finally`` blocks and ``run``'s cleanup run.

    Only where SIGTERM still has Python's default disposition and from the main thread (the only one that may set a
    handler): a bench with its own handler keeps it."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run(cmd, *, capture_output: bool = False, stdout=None, stderr=None, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, ...)`` (no ``timeout``, no ``check``) for a worker that must not outlive the bench."""
    stop_on_sigterm()
    if capture_output:
        stdout = stderr = subprocess.PIPE
    with subprocess.Popen(cmd, stdout=stdout, stderr=stderr, start_new_session=True, **kwargs) as proc:
        try:
            out, err = proc.communicate()
        except BaseException:
            _kill_group(proc)
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
