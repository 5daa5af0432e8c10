"""A bench's workers end with the bench: a `kill PID` of it (SIGTERM), a `timeout`, a Ctrl-C.

Python's default for SIGTERM ends a process at once, with no cleanup, so a bench stopped that way left the worker it
was waiting on running, still holding the cores or the GPU. ``run`` is ``subprocess.run`` for a bench's workers: on
any way out of the wait (SIGTERM, which ``run`` turns into ``SystemExit(143)``; Ctrl-C; an error) the worker and
every process below it are killed before the exception goes on. The worker stays in the bench's process group, so
what stops that group whole (a terminal's Ctrl-C, ``bench/gpu_suite.py``'s budget, which runs ``vs_trl.py`` in a
row) still reaches it: a group of its own would hide it from them. ``bench/learning.py`` and ``bench/gpu_suite.py``
keep their own handlers (they also start no further seed / mark the stopped row). No torch import here.
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


def _tree(root: int) -> list[int]:
    """``root`` and every process below it, from /proc's parent links (Linux; elsewhere just ``root``)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [root]
    for name in entries:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    """Freeze the worker's tree (so none of it starts a process that escapes), look again, kill all of it."""
    frozen: set[int] = set()
    for _ in range(2):
        for pid in _tree(proc.pid):
            if pid not in frozen:
                frozen.add(pid)
                try:
                    os.kill(pid, signal.SIGSTOP)
                except (ProcessLookupError, PermissionError):
                    pass
    for pid in frozen:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def run(cmd, *, capture_output: bool = False, stdout=None, stderr=None, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, ...)`` (no ``timeout``, no ``check``) for a worker that must not outlive the bench."""
    stop_on_sigterm()
    if capture_output:
        stdout = stderr = subprocess.PIPE
    with subprocess.Popen(cmd, stdout=stdout, stderr=stderr, **kwargs) as proc:
        try:
            out, err = proc.communicate()
        except BaseException:
            _kill_tree(proc)
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
