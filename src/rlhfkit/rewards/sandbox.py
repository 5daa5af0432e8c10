"""A subprocess sandbox for running model-written Python: its own temporary directory, no network, wall-time,
CPU-time, memory, file-size and output limits, a scrubbed environment, and the test results reported on a private
channel.

What each run gets (:meth:`Sandbox.run`):

- a fresh directory under the system's temp dir as its working directory (removed afterwards), an environment with
  only ``PATH``, ``HOME`` / ``TMPDIR`` (= that directory) and ``LANG``, ``python -I`` (no ``PYTHON*`` variables, no
  user site, not the trainer's ``sys.path``), stdin from the test or ``/dev/null``;
- ``isolation="namespaces"`` (chosen by ``auto`` where ``unshare`` works, as it does for an unprivileged user on most
  Linux systems): the program runs in new user, network and PID namespaces (``unshare -rn --pid --fork
  --kill-child``): there is no network interface but a downed loopback, and when the run ends every process it
  started dies with it. ``isolation="process"``: no namespaces; the process group is killed at the end;
- limits set by the guard on itself before the program starts: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``,
  ``RLIMIT_FSIZE`` (largest file written), ``RLIMIT_NOFILE``, no core files; the wall time and the output size are
  enforced by the caller, which kills the run at the limit;
- an audit hook (:pep:`578`) installed before the program's first line refuses: sockets, ``fork`` / ``exec`` /
  ``system`` / ``posix_spawn`` / ``subprocess``, ``ctypes`` and ``_posixsubprocess``, signals to other processes,
  opening for writing, creating, renaming or removing anything outside the run's directory, and reading files outside
  the run's directory, the Python installation and the system directories (``/usr``, ``/lib*``, ``/etc``, ``/dev``,
  ``/proc``, ``/sys``): the trainer's working and run directories are not readable.

What it does **not** protect against: this is a guard against ordinary and accidental harm (a loop, a leak, a fork,
a stray write, a network call in generated code), not a security boundary against a determined attacker. An audit
hook can be defeated from inside Python (e.g. by a C extension that makes system calls directly, or by corrupting
the interpreter's memory); without namespaces, a program that escapes the hook has the trainer's user's rights:
network, files, processes. Even with namespaces, the file system is shared (no mount namespace or seccomp filter:
what the hook does not catch can write where the user can), and CPU / memory use across processes is not capped by
a cgroup. A program can also read or forge what the guard reports if it inspects the guard's memory (a random nonce
makes forging by printing impossible, not by introspection). For untrusted code at scale, run the trainer in a
container or VM, or use a remote execution service as a remote judge.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from ..errors import RewardError

ISOLATIONS = ("auto", "namespaces", "process")
UNSHARE = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"]


class SandboxError(RewardError):
    """The sandbox cannot be set up on this machine as configured."""


@dataclass(frozen=True)
class Limits:
    """What one run may use. ``wall_s``: seconds from start to kill; ``cpu_s``: CPU seconds (``RLIMIT_CPU``);
    ``memory_mb``: address space (``RLIMIT_AS``); ``output_bytes``: stdout + stderr kept before the run is killed;
    ``file_mb``: the largest file it may write (``RLIMIT_FSIZE``); ``open_files``: ``RLIMIT_NOFILE``."""

    wall_s: float = 10.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    output_bytes: int = 1_000_000
    file_mb: int = 16
    open_files: int = 64


@dataclass
class RunResult:
    """What one run did: ``returncode`` (negative: killed by that signal), ``stdout`` / ``stderr`` (text, at most
    ``output_bytes`` together), ``passed`` (per test, for runs with tests), ``timed_out``, ``output_capped``,
    ``seconds`` of wall time."""

    returncode: int | None
    stdout: str
    stderr: str
    passed: list[bool]
    timed_out: bool
    output_capped: bool
    seconds: float

    @property
    def reason(self) -> str:
        if self.timed_out:
            return "timed out"
        if self.output_capped:
            return "printed more than the output limit"
        if self.returncode is not None and self.returncode < 0:
            return f"killed by signal {-self.returncode}"
        last = self.stderr.strip().splitlines()[-1:] or [""]
        return f"exit code {self.returncode}" + (f" ({last[0][:200]})" if last[0] else "")


# The guard: the first code the sandboxed interpreter runs. It takes its settings from argv, sets the limits, installs
# the audit hook, then runs the program (and its assert tests, reporting each on the private fd with the nonce).
GUARD = r'''
def _guard(argv):
    import json, os, resource, sys
    cfg = json.loads(argv.pop(1))
    del argv[1:]
    home = os.path.realpath(cfg["dir"])

    def limit(what, value):
        try:
            resource.setrlimit(what, (value, value))
        except (ValueError, OSError):
            pass

    limit(resource.RLIMIT_AS, cfg["memory"])
    limit(resource.RLIMIT_CPU, cfg["cpu"])
    limit(resource.RLIMIT_FSIZE, cfg["fsize"])
    limit(resource.RLIMIT_NOFILE, cfg["nofile"])
    limit(resource.RLIMIT_CORE, 0)
    report = os.fdopen(cfg["fd"], "w", buffering=1) if cfg["fd"] is not None else None
    nonce, tests = cfg["nonce"], cfg["tests"]
    with open(os.path.join(home, "solution.py")) as fh:
        source = fh.read()
    readable = tuple(os.path.realpath(p) for p in cfg["read"]) + (home,)

    def inside(path, roots):
        try:
            p = os.path.realpath(os.fsdecode(path))
        except Exception:
            return False
        return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)

    blocked = {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "os.fork", "os.forkpty",
               "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "os.kill", "os.killpg",
               "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "os.setsid", "pty.spawn", "os.chroot",
               "resource.setrlimit", "resource.prlimit", "sys.addaudithook"}
    writes = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link",
              "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "os.mkfifo", "os.mknod"}
    listings = {"os.listdir", "os.scandir"}
    no_import = {"ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "_multiprocessing"}
    for name in no_import:
        sys.modules.pop(name, None)
    armed = []

    def hook(event, args):
        if not armed:
            return
        if event in blocked:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0].split(".")[0] in no_import:
            raise ImportError(f"sandbox: import of {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or bool(
                flags is not None and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if not inside(path, (home,) if writing else readable):
                raise PermissionError(f"sandbox: {'writing' if writing else 'reading'} {path!r} is not allowed")
        elif event in writes or event in listings:
            roots = readable if event in listings else (home,)
            for path in args[:2]:
                if isinstance(path, (str, bytes, os.PathLike)) and not inside(path, roots):
                    raise PermissionError(f"sandbox: {event} on {path!r} is not allowed")

    sys.addaudithook(hook)
    sys.setrecursionlimit(10_000)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    del cfg
    armed.append(True)
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
        loaded = True
    except BaseException:
        if not tests:
            raise
        loaded = False
    for i, test in enumerate(tests):
        ok = False
        if loaded:
            try:
                exec(compile(test, f"test_{i}", "exec"), namespace)
                ok = True
            except BaseException:
                ok = False
        if report is not None:
            report.write(f"{nonce} {i} {int(ok)}\n")


import sys as _sys

_guard(_sys.argv)
del _guard, _sys
'''


def _read_roots() -> list[str]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, "/usr", "/lib", "/lib64", "/etc",
             "/dev", "/proc", "/sys", "/bin", "/sbin", "/opt/conda"}
    roots |= {p for p in sys.path if p and os.path.isdir(p) and ("site-packages" in p or "lib/python" in p)}
    return sorted(r for r in roots if r and os.path.exists(r))


class Sandbox:
    """Runs Python programs under :class:`Limits` (module docstring). ``isolation``: ``auto`` (namespaces where
    ``unshare`` works, else process), ``namespaces`` (required: :class:`SandboxError` at :meth:`probe` when it does
    not work) or ``process``."""

    def __init__(self, limits: Limits | None = None, isolation: str = "auto", python: str | None = None):
        if isolation not in ISOLATIONS:
            raise SandboxError(f"unknown sandbox isolation {isolation!r}", where="reward.sandbox.isolation",
                               fix="use " + ", ".join(ISOLATIONS))
        self.limits = limits or Limits()
        self.requested = isolation
        self.python = python or sys.executable
        self.isolation: str | None = None  # decided by probe()

    def probe(self) -> str:
        """Decide the isolation and check that a program runs under it: prints 6 and is scored; a program that
        opens a socket fails. Raises :class:`SandboxError` (one line) when the sandbox cannot be set up."""
        if self.isolation is not None:
            return self.isolation
        candidates = ["namespaces", "process"] if self.requested == "auto" else [self.requested]
        why = []
        for isolation in candidates:
            if isolation == "namespaces" and shutil.which("unshare") is None:
                why.append("namespaces: `unshare` not found")
                continue
            self.isolation = isolation
            try:
                ok = self.run("print(2 * 3)\n", tests=["assert 1 + 1 == 2"], limits=Limits(wall_s=30, cpu_s=10))
                net = self.run("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n",
                               limits=Limits(wall_s=30, cpu_s=10))
            except OSError as exc:
                ok = net = None
                why.append(f"{isolation}: {exc}")
            if ok is not None and ok.stdout.strip() == "6" and ok.passed == [True] and net.returncode != 0:
                return isolation
            if ok is not None:
                why.append(f"{isolation}: a probe program {ok.reason}")
            self.isolation = None
        raise SandboxError("the code sandbox cannot be set up (" + "; ".join(why) + ")",
                           where="reward.sandbox.isolation",
                           fix="set reward.sandbox.isolation=process where user namespaces are disabled, or enable "
                               "them (sysctl kernel.unprivileged_userns_clone=1)")

    def run(self, code: str, *, stdin: str | None = None, tests: list[str] | None = None,
            limits: Limits | None = None) -> RunResult:
        """Run ``code`` (then each of ``tests``, a Python snippet such as an assert, in the program's namespace)
        under the limits; never raises for what the program does."""
        if self.isolation is None:
            self.probe()
        lim = limits or self.limits
        home = tempfile.mkdtemp(prefix="rlhfkit-sandbox-")
        read_fd, write_fd = os.pipe() if tests else (None, None)
        try:
            with open(os.path.join(home, "solution.py"), "w") as fh:
                fh.write(code)
            nonce = secrets.token_hex(16)
            cfg = {"dir": home, "memory": lim.memory_mb << 20, "cpu": max(1, int(lim.cpu_s + 0.999)),
                   "fsize": lim.file_mb << 20, "nofile": lim.open_files, "fd": write_fd, "nonce": nonce,
                   "tests": list(tests or []), "read": _read_roots()}
            argv = [self.python, "-I", "-c", GUARD, json.dumps(cfg)]
            if self.isolation == "namespaces":
                argv = UNSHARE + argv
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, cwd=home, env=env, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    pass_fds=(write_fd,) if write_fd is not None else ())
            if write_fd is not None:
                os.close(write_fd)
                write_fd = None
            out, err, report, timed_out, capped = _collect(proc, stdin, read_fd, lim)
            seconds = time.perf_counter() - t0
        finally:
            for fd in (read_fd, write_fd):
                if fd is not None:
                    os.close(fd)
            shutil.rmtree(home, ignore_errors=True)
        passed = [False] * len(tests or [])
        for line in report.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit() and int(parts[1]) < len(passed):
                passed[int(parts[1])] = parts[2] == "1"
        return RunResult(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), passed,
                         timed_out, capped, seconds)


def _collect(proc: subprocess.Popen, stdin: str | None, report_fd: int | None, lim: Limits):
    """Read stdout / stderr / the report until the program ends, the wall time passes or the output passes its cap
    (then the whole process group is killed)."""
    sel = selectors.DefaultSelector()
    chunks: dict[object, list[bytes]] = {proc.stdout: [], proc.stderr: [], "report": []}
    sel.register(proc.stdout, selectors.EVENT_READ, proc.stdout)
    sel.register(proc.stderr, selectors.EVENT_READ, proc.stderr)
    if report_fd is not None:
        sel.register(report_fd, selectors.EVENT_READ, "report")
    if stdin:
        try:
            proc.stdin.write(stdin.encode())
        except (BrokenPipeError, OSError):
            pass
        finally:
            with _quiet():
                proc.stdin.close()
    deadline = time.perf_counter() + lim.wall_s
    size, timed_out, capped = 0, False, False
    while sel.get_map():
        left = deadline - time.perf_counter()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            fd = key.fileobj if key.data != "report" else report_fd
            data = os.read(fd if isinstance(fd, int) else fd.fileno(), 65536)
            if not data:
                sel.unregister(key.fileobj)
                continue
            chunks[key.data].append(data)
            if key.data != "report":
                size += len(data)
                if size > lim.output_bytes:
                    capped = True
        if capped:
            break
    sel.close()
    _kill_group(proc)
    out, err = b"".join(chunks[proc.stdout]), b"".join(chunks[proc.stderr])
    return (out[: lim.output_bytes], err[: max(0, lim.output_bytes - len(out))],
            b"".join(chunks["report"]).decode("ascii", "replace"), timed_out, capped)


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with _quiet():
            os.killpg(proc.pid, signal.SIGKILL)
    with _quiet():
        proc.wait(timeout=10)
    for stream in (proc.stdout, proc.stderr):
        with _quiet():
            stream.close()


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], Exception)
