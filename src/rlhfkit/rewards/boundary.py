"""The ``namespaces`` level of :mod:`rlhfkit.rewards.sandbox`: bubblewrap's command line for one run, for a Python
wherever it lives, and, where the boundary cannot be set up, the real cause and its fix.

**Where Python lives.** The new root holds, read-only, ``/usr``, the ``/lib*`` and ``/bin`` links, a few files of
``/etc``, and the Python that runs the program: its installation and its virtual environment, wherever they are (a
venv under ``/tmp`` as CI clones and tox make, a Python under the home directory as pyenv, conda and uv install it, a
system Python). The private, size-capped ``/tmp`` is mounted *before* those binds, so a venv under ``/tmp`` is bound
inside it rather than hidden by it; an installation that holds the home or the working directory (a Python in
``~``) is bound by its ``bin`` and ``lib*`` only, so the rest of the home stays out of view. A relative Python path
is made absolute first (the sandbox's working directory is not the trainer's).

**The program is the only process in its namespaces** (``--as-pid-1``: no bubblewrap init beside it). The seccomp
filter refuses every new process, so no process without the filter and the limits exists there for the program to
reach: not through ``/proc/<pid>/mem`` (an init that shares the program's user in the namespace can be opened
read-write and made to run injected code, unfiltered and unlimited), nor by signals or ``/proc`` files. Chosen over
the other ways to close that hole because it holds by construction and asks nothing of the machine: hiding other
processes (``hidepid``) needs ``/proc`` mount options bubblewrap does not pass, Yama's ``ptrace_scope`` is a
machine-wide setting, and a filter on bubblewrap's init depends on its version. What an init changes: signals sent
from inside its namespace without a handler are ignored (a program's ``raise(SIGSEGV)`` on itself does nothing;
``RLIMIT_FSIZE``'s ``SIGXFSZ`` becomes the ``EFBIG`` error), while the kernel's fatal signals (a fault, the
``SIGKILL`` of ``RLIMIT_CPU``'s hard limit) and the ``SIGKILL`` sent when bubblewrap dies (``--die-with-parent``:
how the wall time ends it) still end it.

**Nothing fills the machine's memory past the limits**: ``/sandbox`` and ``/tmp`` are tmpfs capped at ``disk_mb``
each, and ``/dev`` (bubblewrap's own tmpfs holding the device nodes, ``/dev/shm`` inside it) is remounted read-only
(the nodes stay usable: writing to ``/dev/null`` is writing to a device, not to the file system).

**When it cannot be set up**, :func:`unavailable` says why in a few words, with the fix for that cause: bubblewrap
missing or too old, user namespaces refused by the kernel or the container (the message bubblewrap gave, and the
setting that allows them), or this Python's layout not bound (a bug to report, with the path).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import NamedTuple

WORKDIR = "/sandbox"  # the program's directory inside the namespaces
INSTALL = {"bubblewrap": "apt-get install bubblewrap (Fedora: dnf install bubblewrap)",
           "libseccomp": "apt-get install libseccomp2 and pip install pyseccomp (an rlhfkit dependency)",
           "unshare": "apt-get install util-linux"}
USERNS_FIX = ("allow unprivileged user namespaces: `sysctl -w kernel.unprivileged_userns_clone=1` (Debian), "
              "`sysctl -w user.max_user_namespaces=15000` where it is 0, on Ubuntu 24.04+ "
              "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (or an AppArmor profile for bwrap); in a "
              "container, run it with `--security-opt seccomp=unconfined --security-opt apparmor=unconfined`, or run "
              "the trainer in a VM")


class Problem(NamedTuple):
    """Why a level cannot be set up here (a few words) and the fix for that cause."""

    cause: str
    fix: str


def tool(name: str) -> str:
    """A tool's full path as this process's PATH finds it (the runs start it with a minimal environment)."""
    return shutil.which(name) or name


def program_env(home: str) -> dict[str, str]:
    """The whole environment of a sandboxed program (nothing of the trainer's)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}


@functools.lru_cache(maxsize=1)
def bwrap_options() -> str:
    """bubblewrap's ``--help`` (its options differ by version: ``--disable-userns`` is 0.8's, ``--size`` 0.5's)."""
    try:
        return subprocess.run([tool("bwrap"), "--help"], capture_output=True, text=True, timeout=10, env={}).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def bwrap_version() -> str:
    try:
        out = subprocess.run([tool("bwrap"), "--version"], capture_output=True, text=True, timeout=10, env={})
    except (OSError, subprocess.SubprocessError):
        return "bubblewrap"
    return out.stdout.strip() or "bubblewrap"


def prefix_of(python: str) -> str:
    """The installation a Python executable belongs to (``.../bin/python3`` -> ``...``), its link followed."""
    return os.path.dirname(os.path.dirname(os.path.realpath(python)))


def python_binds(python: str) -> list[str]:
    """The directories bound read-only for Python: its installation and virtual environment (module docstring)."""
    guarded = {os.path.realpath(os.path.expanduser("~")), os.path.realpath(os.getcwd()), "/"}
    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                                           prefix_of(python), os.path.dirname(os.path.dirname(python)))}
    out: set[str] = set()
    for root in roots:
        if not os.path.isdir(root) or root == "/usr" or root.startswith("/usr/"):
            continue
        if any(g == root or g.startswith(root.rstrip("/") + "/") for g in guarded):
            out |= {os.path.join(root, d) for d in ("bin", "lib", "lib64") if os.path.isdir(os.path.join(root, d))}
        else:
            out.add(root)
    return sorted(out)


def bwrap_argv(python: str, disk_mb: int) -> list[str]:
    """bubblewrap's arguments for one run (the module docstring; :mod:`rlhfkit.rewards.sandbox` for the rest). Where
    this bubblewrap lacks ``--disable-userns`` the seccomp filter alone refuses new namespaces; where it lacks
    ``--size`` the private directories are uncapped tmpfs (each file still capped by ``file_mb``)."""
    known = bwrap_options()
    argv = [tool("bwrap"), "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--as-pid-1", "--die-with-parent", "--new-session", "--clearenv", "--uid",
            "65534", "--gid", "65534", "--hostname", "sandbox"]
    if "--disable-userns" in known:
        argv.append("--disable-userns")
    if os.geteuid() == 0:
        argv += ["--cap-drop", "ALL"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{top}"
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives"):
        argv += ["--ro-bind-try", path, path]
    size = ["--size", str(disk_mb << 20)] if "--size" in known else []
    argv += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", WORKDIR, *size, "--tmpfs", "/tmp"]
    for path in python_binds(python):  # after the private /tmp: a venv under /tmp is bound inside it, not hidden
        argv += ["--ro-bind", path, path]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR]
    for key, value in program_env(WORKDIR).items():
        argv += ["--setenv", key, value]
    return argv + ["--"]


def unavailable(python: str) -> Problem | None:
    """Why ``namespaces`` cannot be set up on this machine, whatever rlhfkit's mounts (bubblewrap missing or too old,
    user namespaces refused), with the fix; None when a minimal bubblewrap sandbox runs ``python`` here."""
    if shutil.which("bwrap") is None:
        return Problem("bubblewrap (bwrap) is not installed", INSTALL["bubblewrap"])
    if "--as-pid-1" not in bwrap_options():
        return Problem(f"{bwrap_version()} is too old (it lacks --as-pid-1)",
                       f"install bubblewrap 0.3 or newer ({INSTALL['bubblewrap']})")
    argv = [tool("bwrap"), "--unshare-user", "--unshare-pid", "--unshare-net", "--die-with-parent", "--ro-bind", "/",
            "/", "--proc", "/proc", "--dev", "/dev", "--", python, "-I", "-S", "-c", "pass"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError) as exc:
        return Problem(f"bubblewrap could not be run ({type(exc).__name__}: {exc})", INSTALL["bubblewrap"])
    if r.returncode == 0:
        return None
    said = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1][:200]
    if not os.path.exists(python):
        return Problem(f"the Python {python} does not exist ({said})", "give the path of a Python executable")
    return Problem(f"bubblewrap cannot create user namespaces here ({said})", USERNS_FIX)


def unshare_unavailable() -> Problem | None:
    """Why the ``unshare`` level cannot be set up here (util-linux's ``unshare`` missing, user namespaces refused)."""
    if shutil.which("unshare") is None:
        return Problem("`unshare` not found", INSTALL["unshare"])
    try:
        r = subprocess.run([tool("unshare"), "--user", "--map-root-user", "--pid", "--fork", "true"],
                           capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError) as exc:
        return Problem(f"`unshare` could not be run ({type(exc).__name__}: {exc})", INSTALL["unshare"])
    if r.returncode != 0:
        said = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1][:200]
        return Problem(f"`unshare` cannot create user namespaces here ({said})", USERNS_FIX)
    return None


def layout_problem(python: str, reason: str) -> Problem:
    """A probe that failed under the full sandbox where a minimal one works: rlhfkit's mounts miss what this Python
    needs. Names the layout, so that the report says where the Python and its installation are."""
    return Problem(f"the probe program failed under bubblewrap ({reason}) although a minimal bubblewrap sandbox works "
                   f"here: the sandbox's mounts miss what this Python needs ({python}, installed in "
                   f"{prefix_of(python)}; binds {', '.join(python_binds(python)) or 'none'})",
                   "report it as an rlhfkit bug with this line; meanwhile a Python under /usr (a system or "
                   "distribution Python) is always bound")
