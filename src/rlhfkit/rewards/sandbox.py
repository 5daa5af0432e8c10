"""The sandbox that runs model-written Python: a boundary built from well-kept tools (bubblewrap's namespaces, a
seccomp filter from libseccomp, resource limits), said in one line at the start, and refused, with the real cause and
its fix, where the machine cannot give it. What each level lets through is measured by the escape tests and tabled
in ``docs/sandbox.md``.

Isolation levels (``isolation``); :meth:`Sandbox.probe` runs a probe program under the level and checks what it
sees:

- ``namespaces`` -- **the boundary** (bubblewrap's command line and why it is built so: :mod:`.boundary`). The
  program runs under bubblewrap (``bwrap``, Debian / Ubuntu / Fedora package ``bubblewrap``) in its own user, mount,
  PID, network, IPC, UTS and cgroup namespaces, with no capabilities and no way to make new user namespaces, as the
  only process there (PID 1: no process without the filter and the limits beside it). Its file system is a new root
  holding, read-only, only what Python needs (``/usr``, the ``/lib*`` and ``/bin`` links, the Python installation
  and its virtual environment wherever they are, a few files of ``/etc``), a fresh ``/proc`` of its own PID
  namespace (it sees itself only), a read-only ``/dev`` and a private writable ``/sandbox`` (its working directory,
  ``HOME`` and ``TMPDIR``) and ``/tmp``, both size-capped tmpfs that vanish with it: no home directory, no run
  directory, nothing of the trainer. Its environment is set from nothing (``--clearenv``).
- ``unshare`` -- util-linux's ``unshare``: new user, network and PID namespaces with their own ``/proc`` (no network;
  no other process visible: the program is PID 1 there too), but the file system is shared: the program can read and
  write what the trainer's user can. Not a boundary.
- ``process`` -- a child process: its own temporary directory, a scrubbed environment, the filter and limits below.
  Not a boundary: besides your files, it can reach the processes of your user (their ``/proc`` files, signals, its
  parent's memory).
- ``auto`` (the default) -- ``namespaces``, or a refusal (:class:`SandboxError`, one line naming why the boundary
  cannot be had and the fix). A weaker level is never a fallback: it runs only where the user names it
  (``reward.sandbox.isolation=unshare`` or ``process``), and the run's line says it as a warning naming what it lets
  through. As root, or with API keys in the environment, a silent fallback would hand model-written code the machine
  or the keys; without them it would still hand it the user's files.

At every level, before the program's first line (the guard, :data:`GUARD`):

- a **seccomp filter** (built by libseccomp through its ``pyseccomp`` bindings, see :func:`seccomp_filter`) refuses,
  with ``EPERM``: sockets, every new process (``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD``; ``clone3``
  answers ``ENOSYS`` so that threads fall back to ``clone``), ``execve`` / ``execveat``, ``ptrace`` and the
  cross-process memory calls, namespace and mount calls, ``bpf``, ``perf_event_open``, ``userfaultfd``,
  ``io_uring``, keyrings, module and kexec loading, ``open_by_handle_at``, and the terminal-injection ioctls; a
  system call of another architecture kills the program. The filter is a deny list (the default allows): Python and
  the libraries a program imports need a long, version-dependent list of calls, and everything that reaches outside
  the process is on the deny list;
- **limits**: ``RLIMIT_AS`` (memory: one process, as no other can be started, so this is the whole program's
  memory, threads included), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, no core files; the wall time and
  the output size are enforced from outside (the run is killed at the limit, and with it its namespaces). No cgroup
  is made: creating one needs a writable cgroup hierarchy, which containers and unprivileged users rarely have,
  and with processes refused by the filter the per-process limits bound the whole program;
- an audit hook (:pep:`578`) refuses sockets, processes, ``ctypes``, writes outside the program's directory and
  reads outside it and the system's directories. It is a guard against accidents, not part of the boundary: a
  program can disarm it from inside Python, and the escape tests (``tests/unit/test_sandbox_escapes.py``) disarm it
  first.

What crosses back: the exit status and the output, read by this process from pipes and ``wait``, and for assert tests
one ``<nonce> <index> <0|1>`` line per test on a descriptor given to the guard, parsed as fixed fields. Assert tests
run in the program's own interpreter, so a program can make its own tests pass (an object equal to everything, or
by finding the descriptor and the nonce in its memory): that is reward hacking of its own score, contained like the
rest; stdin / stdout tests are judged here, outside it. Nothing a program writes is unpickled or run anywhere.

Why bubblewrap rather than ``unshare`` with bind mounts: bubblewrap builds the new root, the read-only binds,
``/proc``, ``/dev`` and the tmpfs, drops capabilities and forbids nested user namespaces in one audited setuid-free
program (Flatpak's sandbox), where the same with ``unshare`` needs a shell script of ``mount`` calls inside the
namespace. Seen on the development machine (Debian 12, root in a VM, kernel 6.18, bubblewrap 0.8.0): user
namespaces are allowed and both work; a small program's run took 0.1 - 0.2 s under each level, mostly Python's
start (a loaded machine: not a figure of record). Why a deny-list seccomp filter loaded by the guard
rather than bubblewrap's ``--seccomp``: the filter refuses ``execve``, and bubblewrap loads its filter before it
executes Python; the guard loads it as the first thing Python runs, before the program (filters cannot be removed),
which also gives the ``unshare`` and ``process`` levels the same filter.
"""

from __future__ import annotations

import base64
import errno
import functools
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from ..errors import RewardError
from ..errors import say as say_line
from . import boundary
from .boundary import INSTALL, WORKDIR, Problem, program_env, tool

ISOLATIONS = ("auto", "namespaces", "unshare", "process")
LEVELS = ("namespaces", "unshare", "process")  # strongest first
BOUNDARY = "namespaces"
#: what each weaker level lets through, for the line a run says when the user names one (docs/sandbox.md's table)
LETS_THROUGH = {
    "unshare": "it can read and write every file your user can (no network, no other process visible)",
    "process": "it can read and write every file your user can, read your processes' environments (API keys), "
               "signal them and write its parent's memory (no network)",
}
# The program is the namespace's init (PID 1), as under bubblewrap: no other process (a shell init, unfiltered) beside
# it. unshare's --kill-child ends it when unshare dies (the wall time kills unshare's process group).
#: how util-linux's unshare (2.38) reports a child killed by SIGKILL: it fails to unblock SIGKILL to die the same way
_UNSHARE_KILLED = "unshare: sigprocmask unblock failed: Invalid argument"
UNSHARE = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
GUARD_FAILED = 121  # the guard's exit code when it could not set the program's limits or filter up


class SandboxError(RewardError):
    """The sandbox cannot be set up on this machine as configured."""


@dataclass(frozen=True)
class Limits:
    """What one run may use. ``wall_s``: seconds from start to kill; ``cpu_s``: CPU seconds (``RLIMIT_CPU``);
    ``memory_mb``: address space (``RLIMIT_AS``); ``output_bytes``: stdout + stderr kept before the run is killed;
    ``file_mb``: the largest file it may write (``RLIMIT_FSIZE``); ``open_files``: ``RLIMIT_NOFILE``; ``disk_mb``:
    the size of its private directory and of its ``/tmp`` (``namespaces``: memory-backed, gone with the run)."""

    wall_s: float = 10.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    output_bytes: int = 1_000_000
    file_mb: int = 16
    open_files: int = 64
    disk_mb: int = 64


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


# ── the seccomp filter ───────────────────────────────────────────────────────────────────────────────────────────
DENIED = (
    # the network, and every other process: sockets, new processes, other programs, reading / writing processes
    "socket", "socketpair", "fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev",
    "pidfd_open", "pidfd_getfd", "kcmp",
    # namespaces, mounts, roots
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount",
    "fsconfig", "fspick", "mount_setattr",
    # the kernel's larger attack surfaces and the machine's state
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "open_by_handle_at", "name_to_handle_at", "fanotify_init", "quotactl", "swapon", "swapoff", "reboot", "acct",
    "iopl", "ioperm", "syslog", "vhangup", "lookup_dcookie", "nfsservctl",
)
CLONE_THREAD = 0x00010000
TERMINAL_IOCTLS = (0x5412, 0x541C)  # TIOCSTI (push input into a terminal), TIOCLINUX


@functools.lru_cache(maxsize=1)
def seccomp_filter() -> tuple[bytes | None, str]:
    """The filter of the module docstring as a compiled BPF program (``struct sock_filter`` array) for this machine's
    architecture, and ``""``; or ``(None, why)`` where libseccomp or its bindings are missing. Built with libseccomp
    (the library behind the filters of systemd, Docker and Flatpak) through ``pyseccomp``, its ctypes bindings on
    PyPI: the architecture check, the ABI aliases (x32) and the argument comparisons are libseccomp's, not ours."""
    try:
        import pyseccomp as sc
    except ImportError as exc:
        return None, f"libseccomp or its Python bindings are missing ({exc})"
    except (OSError, RuntimeError) as exc:  # pyseccomp raises RuntimeError when libseccomp.so is not found
        return None, f"libseccomp is missing ({exc})"
    try:
        f = sc.SyscallFilter(sc.ALLOW)  # the default; a call of another architecture: libseccomp's KILL
        for name in DENIED:
            try:
                f.add_rule(sc.ERRNO(errno.EPERM), name)
            except OSError:  # not a system call of this architecture (fork on arm64, iopl off x86)
                pass
        f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))  # flags: arg 0 on
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # x86-64 / arm64; glibc's threads fall back to clone
        for request in TERMINAL_IOCTLS:
            f.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
        with tempfile.TemporaryFile() as fh:
            f.export_bpf(fh)
            fh.seek(0)
            program = fh.read()
    except (OSError, ValueError, RuntimeError) as exc:
        return None, f"libseccomp could not build the filter ({exc})"
    if not program or len(program) % 8:
        return None, "libseccomp built an empty filter"
    return program, ""


# ── the guard: the first code the sandboxed interpreter runs ─────────────────────────────────────────────────────
# It reads its settings and the program from the descriptor named in argv, sets the limits, loads the seccomp
# filter, installs the audit hook, then runs the program (and its assert tests, reporting each on the report
# descriptor with the nonce). Any failure to set a limit or the filter up ends it with GUARD_FAILED before the
# program's first line.
GUARD = r'''
def _guard(argv):
    import json, os, resource, sys
    fd = int(argv.pop(1))
    del argv[1:]
    with os.fdopen(fd, "rb") as fh:
        cfg = json.loads(fh.read())
    home = cfg["dir"]
    os.chdir(home)

    def fail(what):
        os.write(2, ("sandbox: " + what + "\n").encode())
        os._exit(GUARD_FAILED)

    for what, value in (("AS", cfg["memory"]), ("CPU", cfg["cpu"]), ("FSIZE", cfg["fsize"]),
                        ("NOFILE", cfg["nofile"]), ("CORE", 0)):
        try:
            resource.setrlimit(getattr(resource, "RLIMIT_" + what), (value, value))
        except (ValueError, OSError) as exc:
            fail(f"RLIMIT_{what} could not be set ({exc})")
    if cfg["seccomp"]:
        import base64, ctypes

        program = base64.b64decode(cfg["seccomp"])

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(program, len(program))
        prog = SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
        # PR_SET_NO_NEW_PRIVS = 38, then PR_SET_SECCOMP = 22 with SECCOMP_MODE_FILTER = 2
        if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
            fail(f"the seccomp filter could not be loaded (errno {ctypes.get_errno()})")
        del libc, buf, prog, SockFprog
    report = os.fdopen(cfg["fd"], "w", buffering=1) if cfg["fd"] is not None else None
    nonce, tests, source = cfg["nonce"], cfg["tests"], cfg["code"]
    home = os.path.realpath(home)
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
'''.replace("GUARD_FAILED", str(GUARD_FAILED))

# What a probe program reports about the place it runs in (trusted code, run like a program under the guard): every
# process it sees, with its seccomp mode (``2``: a filter), so that a process without the filter beside it is seen.
_PROBE = r'''
import json, os


def seccomp(pid):
    try:
        status = open(f"/proc/{pid}/status").read()
    except OSError:
        return "?"
    return next((line.split()[1] for line in status.splitlines() if line.startswith("Seccomp:")), "0")


procs = {p: seccomp(p) for p in os.listdir("/proc") if p.isdigit()}
try:
    interfaces = [line.split(":")[0].strip() for line in open("/proc/self/net/dev").read().splitlines()[2:]]
except OSError:
    interfaces = []
print(json.dumps({"six": 2 * 3, "seccomp": seccomp("self"), "procs": procs, "interfaces": interfaces,
                  "canary": os.path.exists(CANARY), "env": sorted(os.environ)}))
'''


def _read_roots(python: str) -> list[str]:
    """What the guard's audit hook lets a program read besides its directory (the system's and Python's)."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, "/usr", "/lib", "/lib64", "/etc",
             "/dev", "/proc", "/sys", "/bin", "/sbin", "/opt/conda", boundary.prefix_of(python)}
    roots |= {p for p in sys.path if p and os.path.isdir(p) and ("site-packages" in p or "lib/python" in p)}
    return sorted(r for r in roots if r and os.path.exists(r))


class Sandbox:
    """Runs Python programs under :class:`Limits` at an isolation level (module docstring). ``isolation``: ``auto``
    (``namespaces`` or a refusal), or one level by name (:class:`SandboxError` at :meth:`probe`, naming the cause and
    its fix, when it does not work here). ``python``: the interpreter that runs the programs (default: this one)."""

    def __init__(self, limits: Limits | None = None, isolation: str = "auto", python: str | None = None):
        if isolation not in ISOLATIONS:
            raise SandboxError(f"unknown sandbox isolation {isolation!r}", where="reward.sandbox.isolation",
                               fix="use " + ", ".join(ISOLATIONS))
        self.limits = limits or Limits()
        self.requested = isolation
        self.python = os.path.abspath(python or sys.executable)  # the runs' working directory is not this one
        self.isolation: str | None = None  # decided by probe()

    # ── deciding the level ───────────────────────────────────────────────────────────────────────────────────
    def probe(self) -> str:
        """Decide the isolation and check that a program runs under it and sees what it should (module docstring).
        Raises :class:`SandboxError` (one line: the cause and its fix) when it cannot be set up; ``auto`` is
        ``namespaces`` or that refusal, never a weaker level."""
        if self.isolation is not None:
            return self.isolation
        level = BOUNDARY if self.requested == "auto" else self.requested
        problem = self._check(level)
        if problem is None:
            self.isolation = level
            return level
        if self.requested == "auto":
            raise SandboxError(f"model-written code runs only inside the namespaces boundary unless you name a weaker "
                               f"level, and it cannot be set up here: {problem.cause}",
                               where="reward.sandbox.isolation",
                               fix=f"{problem.fix}; or accept a weaker level by naming it: reward.sandbox.isolation="
                                   "unshare (the program can read and write your files) or process (your files and "
                                   "processes too; see docs/sandbox.md)")
        raise SandboxError(f"the code sandbox cannot be set up with isolation {level} ({problem.cause})",
                           where="reward.sandbox.isolation", fix=problem.fix)

    def _check(self, level: str) -> Problem | None:
        """None when ``level`` works here, else why not and the fix (:class:`~.boundary.Problem`)."""
        program, why_not = seccomp_filter()
        if level == "namespaces":
            blocked = boundary.unavailable(self.python)
            if blocked is not None:
                return blocked
            if program is None:
                return Problem(why_not, INSTALL["libseccomp"])
        if level == "unshare" and (blocked := boundary.unshare_unavailable()) is not None:
            return blocked
        if not os.path.exists(self.python):
            return Problem(f"the Python {self.python} does not exist", "give the path of a Python executable")
        home = tempfile.mkdtemp(prefix="rlhfkit-canary-")
        canary = os.path.join(home, "canary")
        try:
            with open(canary, "w") as fh:
                fh.write("the trainer's")
            code = "CANARY = " + repr(canary) + "\n" + _PROBE
            try:
                r = self._run(level, code, None, ["assert 1 + 1 == 2"], Limits(wall_s=30, cpu_s=10))
            except OSError as exc:
                return Problem(f"{type(exc).__name__}: {exc}", "check that the Python of the trainer runs")
        finally:
            shutil.rmtree(home, ignore_errors=True)
        try:
            seen = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            seen = {}
        if seen.get("six") != 6 or r.passed != [True]:
            if r.returncode == GUARD_FAILED:  # the program started: the kernel refused a limit or the filter
                return Problem(f"a probe program {r.reason}", "check that the kernel allows seccomp filters (Seccomp "
                               "in /proc/self/status) and that the container lets a process lower its limits")
            if level == "namespaces":
                return boundary.layout_problem(self.python, r.reason)
            return Problem(f"a probe program {r.reason}", "check that the Python of the trainer runs")
        if program is not None and seen["seccomp"] != "2":
            return Problem("the seccomp filter was not in force", INSTALL["libseccomp"])
        if level in ("namespaces", "unshare") and (len(seen["procs"]) != 1 or set(seen["interfaces"]) - {"lo"}):
            return Problem(f"the program saw the processes {seen['procs']} (and their seccomp modes) and the network "
                           f"interfaces {seen['interfaces']}, where it should see itself only",
                           "report it as an rlhfkit bug with this line")
        if level == "namespaces" and (seen["canary"] or set(seen["env"]) - {*program_env(WORKDIR), "PWD"}):
            return Problem("the program saw the trainer's files or environment", "report it as an rlhfkit bug")
        return None

    def summary(self) -> str:
        """One line: the level in force and what it gives; a weaker level (named by the user) as a warning saying
        what it lets through."""
        level = self.isolation or self.probe()
        filtered = seccomp_filter()[0] is not None
        extra = ", seccomp filter" if filtered else ", NO seccomp filter (" + INSTALL["libseccomp"] + ")"
        if level == "namespaces":
            return (f"[sandbox] model-written code runs in namespaces ({boundary.bwrap_version()}: its own mount, PID, "
                    f"network and user namespaces, a read-only system and a private directory{extra}, limits)")
        return (f"[sandbox] warning: model-written code runs under {level}, as reward.sandbox.isolation names it"
                f"{extra}, limits): not a boundary: {LETS_THROUGH[level]}; see docs/sandbox.md")

    # ── running ──────────────────────────────────────────────────────────────────────────────────────────────
    def run(self, code: str, *, stdin: str | None = None, tests: list[str] | None = None,
            limits: Limits | None = None) -> RunResult:
        """Run ``code`` (then each of ``tests``, a Python snippet such as an assert, in the program's namespace)
        under the limits; never raises for what the program does."""
        if self.isolation is None:
            self.probe()
        return self._run(self.isolation, code, stdin, tests, limits or self.limits)

    def _run(self, level: str, code: str, stdin: str | None, tests: list[str] | None, lim: Limits) -> RunResult:
        scratch = tempfile.mkdtemp(prefix="rlhfkit-sandbox-")  # this side's files; the program's too, below
        home = WORKDIR if level == "namespaces" else os.path.join(scratch, "work")
        if level != "namespaces":
            os.mkdir(home, 0o700)
        report_r, report_w = os.pipe() if tests else (None, None)
        cfg_fd = None
        try:
            nonce = secrets.token_hex(16)
            program, _ = seccomp_filter()
            cfg = {"dir": home, "memory": lim.memory_mb << 20, "cpu": max(1, int(lim.cpu_s + 0.999)),
                   "fsize": lim.file_mb << 20, "nofile": lim.open_files, "fd": report_w, "nonce": nonce,
                   "tests": list(tests or []), "read": _read_roots(self.python), "code": code,
                   "seccomp": base64.b64encode(program).decode() if program is not None else None}
            path = os.path.join(scratch, "cfg.json")  # read by the guard through a descriptor, gone before it runs
            with open(path, "w") as fh:
                json.dump(cfg, fh)
            cfg_fd = os.open(path, os.O_RDONLY)
            os.unlink(path)
            argv = [self.python, "-I", "-c", GUARD, str(cfg_fd)]
            if level == "namespaces":
                argv, env, cwd = boundary.bwrap_argv(self.python, lim.disk_mb) + argv, {"PATH": "/usr/bin:/bin"}, \
                    scratch
            else:
                argv = [tool("unshare"), *UNSHARE[1:], *argv] if level == "unshare" else argv
                env, cwd = program_env(home), home
            fds = (cfg_fd,) + ((report_w,) if report_w is not None else ())
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    pass_fds=fds)
            for fd in fds:
                os.close(fd)
            cfg_fd = report_w = None
            out, err, report, timed_out, capped = _collect(proc, stdin, report_r, lim)
            seconds = time.perf_counter() - t0
        finally:
            for fd in (report_r, report_w, cfg_fd):
                if fd is not None:
                    os.close(fd)
            shutil.rmtree(scratch, ignore_errors=True)
        passed = [False] * len(tests or [])
        for line in report.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit() and int(parts[1]) < len(passed):
                passed[int(parts[1])] = parts[2] == "1"
        code_, stderr = proc.returncode, err.decode("utf-8", "replace")
        if level == "namespaces" and code_ is not None and code_ > 128:  # bubblewrap's 128 + signal
            code_ = -(code_ - 128)
        if level == "unshare" and code_ == 1 and stderr.rstrip().endswith(_UNSHARE_KILLED):
            code_, stderr = -signal.SIGKILL, stderr.rstrip()[: -len(_UNSHARE_KILLED)].rstrip()
        return RunResult(code_, out.decode("utf-8", "replace"), stderr, passed, timed_out, capped, seconds)


def announce(isolation: str = "auto", require_boundary: bool = False, say=None) -> str:
    """The trainer's side, once per run before any weights load: decide the level (:meth:`Sandbox.probe`: ``auto`` is
    ``namespaces`` or a refusal), say it in one line (``say``; a warning saying what it lets through when the user
    named a weaker level) and return it, to be handed to the workers. ``require_boundary``: a weaker level named is
    refused too (:class:`SandboxError`, one line)."""
    box = Sandbox(isolation=isolation)
    if require_boundary and isolation not in ("auto", BOUNDARY):
        raise SandboxError(f"a boundary is required, but reward.sandbox.isolation names {isolation}, which is not one "
                           f"({LETS_THROUGH.get(isolation, '')})", where="reward.sandbox.require_boundary",
                           fix="set reward.sandbox.isolation=auto or namespaces (bubblewrap: "
                               f"{INSTALL['bubblewrap']})")
    level = box.probe()
    (say or say_line)(box.summary())
    return level


def _collect(proc: subprocess.Popen, stdin: str | None, report_fd: int | None, lim: Limits):
    """Read stdout / stderr / the report until the program ends, the wall time passes or the output passes its cap
    (then the whole process group is killed)."""
    sel = selectors.DefaultSelector()
    chunks: dict[object, list[bytes]] = {proc.stdout: [], proc.stderr: [], "report": []}
    sel.register(proc.stdout, selectors.EVENT_READ, proc.stdout)
    sel.register(proc.stderr, selectors.EVENT_READ, proc.stderr)
    if report_fd is not None:
        sel.register(report_fd, selectors.EVENT_READ, "report")
    if stdin:  # fed from a thread: a program that never reads a large input must not stall this loop's clock
        threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True).start()
    deadline = time.perf_counter() + lim.wall_s
    size, report_size, timed_out, capped = 0, 0, False, False
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
            if key.data == "report":
                report_size += len(data)
                if report_size <= 1 << 20:  # a program writing to the report past any honest size: ignored
                    chunks["report"].append(data)
                continue
            chunks[key.data].append(data)
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


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError, ValueError):  # the program ended (or was killed) before reading it all
        pass
    finally:
        with _quiet():
            pipe.close()


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the run: its process group (under ``namespaces`` bubblewrap, whose death kills the namespaces' every
    process; under ``unshare`` its ``--kill-child``)."""
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
