"""The escape catalogue: model-written programs that first disarm the guard's audit hook (through the garbage
collector's view of its objects, as a hostile policy would) and then try to leave the sandbox. Inside the
``namespaces`` boundary every attempt fails: reading the home directory, the run directory or the trainer's
environment, writing outside, another program, a fork bomb, a 10 GB allocation, sockets, signals to the parent,
``ctypes`` system calls, symlinks out of its own directory, writing code into another process's memory through
``/proc/<pid>/mem`` (there is none: the program is PID 1), filling ``/dev`` / ``/dev/shm`` / ``/tmp``, finding the
worker through ``/proc`` to forge its reply; and the caller scores the batch and goes on. At ``process`` a forged
reply costs its sample, never the run. What each level lets through is docs/sandbox.md's table, measured here.
Skipped, with the reason, only where the machine cannot give a level (conftest.machine_lacks: no bubblewrap, no user
namespaces, no libseccomp); where it can, a level that is not set up fails."""

from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path

import pytest
from conftest import DISARM, sandbox_at

from rlhfkit.rewards import CombinedRewards
from rlhfkit.rewards.sandbox import Limits, seccomp_filter

LIMITS = Limits(wall_s=10.0, cpu_s=5.0, memory_mb=256, output_bytes=50_000)

@pytest.fixture(scope="module")
def box():
    """The boundary; skipped only where the machine cannot give it (conftest.machine_lacks), failed where it can."""
    return sandbox_at("namespaces", LIMITS)


def attempt(box, code: str, **kw):
    r = box.run(DISARM + code, **kw)
    assert r.stdout.startswith("disarmed"), (r.stdout, r.stderr)  # the hook was off: the boundary alone held
    return r


@pytest.fixture
def canaries(tmp_path, monkeypatch):
    """A secret in the home directory, a run directory (the working directory) and the trainer's environment."""
    secret = "sk-" + secrets.token_hex(12)
    home = Path.home() / f".rlhfkit-canary-{secrets.token_hex(4)}"
    try:
        home.write_text(secret)
    except OSError:
        home = None
    run = tmp_path / "runs" / "mine"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(secret)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLHFKIT_TEST_API_KEY", secret)
    yield {"secret": secret, "home": home, "run": run, "outside": tmp_path / "outside.txt"}
    if home is not None:
        home.unlink(missing_ok=True)


def test_reading_home_run_directory_and_environment_fails(box, canaries):
    home = canaries["home"]
    code = (f"home_file = {str(home) if home else ''!r}\nrun = {str(canaries['run'])!r}\n"
            "found = []\n"
            "for path in [home_file, run + '/metrics.jsonl', os.path.expanduser('~/.ssh/id_rsa'), '/root/.ssh/id_rsa',"
            " '/etc/shadow', os.getcwd() + '/../runs/mine/metrics.jsonl']:\n"
            "    try:\n        found.append(open(path).read())\n    except OSError:\n        pass\n"
            "found.append(repr(dict(os.environ)))\n"
            "for pid in os.listdir('/proc'):\n"
            "    for what in ('environ', 'cmdline'):\n"
            "        try:\n            found.append(open(f'/proc/{pid}/{what}', 'rb').read().decode('latin-1'))\n"
            "        except OSError:\n            pass\n"
            "print(found)\n")
    r = attempt(box, code)
    assert r.returncode == 0, r.stderr
    assert canaries["secret"] not in r.stdout + r.stderr
    assert "RLHFKIT_TEST_API_KEY" not in r.stdout  # not even the name: no process it sees has the trainer's env


def test_writing_outside_its_directory_fails_and_its_directory_is_private(box, canaries):
    outside = canaries["outside"]
    code = (f"for path in [{str(outside)!r}, '/usr/owned', {str(canaries['run'] / 'metrics.jsonl')!r}, "
            f"{str(Path.home() / 'owned')!r}, '/etc/owned', '/proc/1/root/usr/owned']:\n"
            "    try:\n        open(path, 'w').write('owned')\n        print('wrote', path)\n"
            "    except OSError as exc:\n        print('refused', path, type(exc).__name__)\n"
            "open('mine.txt', 'w').write('ok')\nopen('/tmp/mine.txt', 'w').write('ok')\nprint(os.getcwd())\n")
    r = attempt(box, code)
    assert "wrote" not in r.stdout and r.stdout.count("refused") == 6, r.stdout
    assert r.stdout.strip().endswith("/sandbox")  # its own directory, writable; /tmp too
    assert not outside.exists() and (canaries["run"] / "metrics.jsonl").read_text() == canaries["secret"]
    assert not Path("/usr/owned").exists() and not (Path.home() / "owned").exists()


def test_symlinks_and_links_in_its_own_directory_lead_nowhere(box, canaries):
    home = canaries["home"] or Path.home()
    code = (f"os.symlink({str(Path.home())!r}, 'home')\nos.symlink({str(canaries['run'])!r}, 'run')\n"
            f"os.symlink({str(home)!r}, 'secret')\n"
            "for path in ['home/' + os.path.basename(" + repr(str(home)) + "), 'run/metrics.jsonl', 'secret',"
            " '/proc/1/cwd/../../root/.bashrc', '/proc/self/root/etc/shadow']:\n"
            "    try:\n        print('read', path, open(path).read())\n    except OSError as exc:\n"
            "        print('refused', path, type(exc).__name__)\n"
            "for src in ['/usr/bin/env', " + repr(str(home)) + "]:\n"
            "    try:\n        os.link(src, 'hard')\n        print('linked', src)\n    except OSError as exc:\n"
            "        print('refused link', type(exc).__name__)\n"
            f"os.symlink({str(canaries['outside'])!r}, 'out')\n"
            "try:\n    open('out', 'w').write('owned')\n    print('wrote through the link')\nexcept OSError:\n"
            "    print('refused write')\n")
    r = attempt(box, code)
    assert canaries["secret"] not in r.stdout and "read " not in r.stdout and "linked" not in r.stdout, r.stdout
    assert not canaries["outside"].exists() and "refused write" in r.stdout


def test_other_programs_processes_and_a_fork_bomb_fail(box):
    code = ("import subprocess\nfor attempt in [lambda: os.execv('/bin/sh', ['sh', '-c', 'echo pwned']),\n"
            "                lambda: os.system('echo pwned'), lambda: subprocess.run(['echo', 'pwned']),\n"
            "                lambda: os.posix_spawn('/bin/echo', ['echo', 'pwned'], {}), os.fork]:\n"
            "    try:\n        print('ran', attempt())\n    except OSError as exc:\n"
            "        print('refused', type(exc).__name__)\n"
            "n = 0\nwhile n < 100000:\n    os.fork()\n    n += 1\n")
    r = attempt(box, code)
    assert "pwned" not in r.stdout and r.stdout.count("refused") == 4, r.stdout  # os.system returns 127 << 8
    assert not r.timed_out and "PermissionError" in r.stderr  # the bomb's first fork was refused, at once


def test_ten_gigabytes_threads_and_a_full_disk_end_within_the_limits(box):
    r = attempt(box, "block = bytearray(10 * 10**9)\nprint('allocated')\n")
    assert "allocated" not in r.stdout and "MemoryError" in r.stderr and not r.timed_out
    r = attempt(box, "import threading, time\nfor i in range(100000):\n"
                     "    threading.Thread(target=time.sleep, args=(0.5,), daemon=True).start()\n")
    assert "can't start new thread" in r.stderr and not r.timed_out  # bounded by the memory limit
    r = attempt(box, "for i in range(10000):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n")
    assert "No space left on device" in r.stderr  # its directory is a capped tmpfs, gone with it


def test_sockets_fail(box):
    code = ("import socket\nfor family, kind in [(socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET6,"
            " socket.SOCK_DGRAM), (socket.AF_UNIX, socket.SOCK_STREAM), (socket.AF_NETLINK, socket.SOCK_RAW)]:\n"
            "    try:\n        socket.socket(family, kind)\n        print('opened')\n    except OSError as exc:\n"
            "        print('refused', exc.errno)\n"
            "try:\n    socket.socketpair()\n    print('opened')\n"
            "except OSError as exc:\n    print('refused', exc.errno)\n")
    r = attempt(box, code)
    assert "opened" not in r.stdout and r.stdout.count("refused 1") == 5, r.stdout  # EPERM: the seccomp filter


def test_signals_to_the_parent_and_the_trainer_fail(box):
    got = []
    old = signal.signal(signal.SIGUSR1, lambda *a: got.append(a))
    try:
        code = (f"import signal\nfor pid in [{os.getpid()}, os.getppid(), -1, {os.getppid()}]:\n"
                "    try:\n        os.kill(pid, signal.SIGUSR1)\n        print('sent', pid)\n"
                "    except OSError as exc:\n        print('refused', pid, type(exc).__name__)\n")
        r = attempt(box, code)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert not got and f"refused {os.getpid()} ProcessLookupError" in r.stdout, r.stdout
    # what it could signal (its own namespace's init) is not this process nor its parent


def test_ctypes_system_calls_fail(box):
    code = ("libc = ctypes.CDLL(None, use_errno=True)\n"
            "import platform\nnr = {'x86_64': {'fork': 57, 'socket': 41, 'ptrace': 101, 'unshare': 272, 'mount': 165},"
            " 'aarch64': {'socket': 198, 'ptrace': 117, 'unshare': 97, 'mount': 40}}[platform.machine()]\n"
            "for name, n in nr.items():\n"
            "    args = {'socket': (2, 1, 0), 'ptrace': (16, 1, 0, 0), 'unshare': (0x10000000,),"
            " 'mount': (0, 0, 0, 0, 0)}.get(name, ())\n"
            "    print(name, libc.syscall(n, *args), ctypes.get_errno())\n"
            "print('fork()', libc.fork(), ctypes.get_errno())\n")
    r = attempt(box, code)
    lines = r.stdout.splitlines()[1:]
    assert lines and all(line.split()[1:] == ["-1", "1"] for line in lines), r.stdout  # -1, EPERM


def test_finding_the_worker_through_proc_to_forge_its_reply_fails(box, tmp_path):
    # the program looks for its reward worker among the processes it can see, and writes a pickled reply into every
    # pipe of theirs it can open; the batch is scored as if it had not tried
    marker = tmp_path / "payload-ran"
    attack = DISARM + (
        "import pickle, struct\n"
        "class Evil:\n    def __reduce__(self):\n        return (open, (" + repr(str(marker)) + ", 'w'))\n"
        "payload = pickle.dumps(('ok', Evil()))\nframe = struct.pack('!i', len(payload)) + payload\n"
        "seen = []\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit() and p != str(os.getpid())]:\n"
        "    cmd = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
        "    seen.append(cmd.split(b'\\0')[0][-20:])\n"
        "    if b'_child_main' in cmd or b'rlhfkit' in cmd:\n        seen.append(b'WORKER')\n"
        "    for fd in os.listdir(f'/proc/{pid}/fd'):\n"
        "        try:\n            os.write(os.open(f'/proc/{pid}/fd/{fd}', os.O_WRONLY | os.O_NONBLOCK), frame)\n"
        "        except OSError:\n            pass\n"
        "print(seen)\n"
        "def add(a, b):\n    return a + b\n")
    good = "def add(a, b):\n    return a + b\n"
    rows = [{"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}] * 4
    spec = {"fn": "code_tests", "kwargs": {"isolation": "namespaces", "wall_s": 10.0, "memory_mb": 256}}
    with CombinedRewards([spec], workers=2, timeout_s=120) as combo:
        combo.probe(["p"] * 4, rows)
        out = combo(["p"] * 4, [f"```python\n{attack}```", f"```python\n{good}```", f"```python\n{attack}```",
                                "```python\ndef add(a, b):\n    return a - b\n```"], rows)
    assert out.total.tolist() == [1.0, 1.0, 1.0, 0.0]  # its own tests: what the attack's add earns, nothing more
    assert out.metrics["rewards/code_tests/errors"] == 0 and out.valid.all()
    assert not marker.exists()
    r = box.run(attack)  # on its own: what it saw
    assert "disarmed" in r.stdout and "WORKER" not in r.stdout and r.stdout.count("b'") == 0, r.stdout  # no one


# The shape of the /proc/1/mem injection: a program opens the memory of every other process it can see for writing
# (bubblewrap's init was one: same user in the namespace, no ptrace call needed) and writes there; here it writes back
# the bytes it read (harmless to any process it reaches) and reports every process's seccomp mode and memory limit.
INJECT = """
import json
found = {}
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    status = open(f'/proc/{pid}/status').read()
    limits = open(f'/proc/{pid}/limits').read()
    found[pid] = {'seccomp': next(x.split()[1] for x in status.splitlines() if x.startswith('Seccomp:')),
                  'as': next(x.split()[3] for x in limits.splitlines() if x.startswith('Max address space')),
                  'wrote': False}
    if pid == str(os.getpid()):
        continue
    try:
        start = int(next(x for x in open(f'/proc/{pid}/maps') if ' r-xp ' in x).split('-')[0], 16)
        fd = os.open(f'/proc/{pid}/mem', os.O_RDWR)
        same = os.pread(fd, 64, start)
        found[pid]['wrote'] = os.pwrite(fd, same, start) == len(same)
    except (OSError, StopIteration):
        pass
print(json.dumps(found))
"""


def test_no_process_without_the_filter_and_the_limits_is_there_to_inject_code_into(box):
    r = attempt(box, INJECT)
    found = json.loads(r.stdout.splitlines()[-1])
    assert not any(p["wrote"] for p in found.values()), found  # no other process's memory was writable
    # every process in the boundary (the program alone, as PID 1) has the filter and the memory limit
    assert list(found) == ["1"] and found["1"]["seccomp"] == "2" and int(found["1"]["as"]) == LIMITS.memory_mb << 20


def test_dev_and_dev_shm_cannot_fill_the_machines_memory_and_tmp_is_capped():
    box = sandbox_at("namespaces", Limits(wall_s=10.0, cpu_s=5.0, memory_mb=256, disk_mb=8))
    r = attempt(box, "for path in ['/dev/shm/fill', '/dev/fill', '/tmp/fill', 'fill']:\n"
                     "    try:\n        with open(path, 'wb') as fh:\n"
                     "            for i in range(16):\n                fh.write(b'x' * (1 << 20))\n"
                     "                fh.flush()\n        print('filled', path)\n"
                     "    except OSError as exc:\n        print('refused', path, exc.strerror)\n"
                     "open('/dev/null', 'w').write('the device nodes still work')\n")
    assert r.returncode == 0, r.stderr
    refused = dict(line.split(" ", 2)[1:] for line in r.stdout.splitlines() if line.startswith("refused"))
    assert set(refused) == {"/dev/shm/fill", "/dev/fill", "/tmp/fill", "fill"}, r.stdout  # 16 MiB into each: none
    assert refused["/dev/shm/fill"] == refused["/dev/fill"] == "Read-only file system"
    assert refused["/tmp/fill"] == refused["fill"] == "No space left on device"  # disk_mb=8


FILTERED = {  # what the seccomp filter refuses at every level (never run without it: a real fork bomb otherwise)
    "fork": "os.fork()",
    "exec": "os.execv('/bin/sh', ['sh', '-c', 'echo pwned'])",
    "socket": "import socket\nsocket.socket()",
    "ctypes fork": "ctypes.CDLL(None, use_errno=True).fork() == -1 or print('forked')\nraise PermissionError",
}


@pytest.mark.skipif(seccomp_filter()[0] is None, reason=f"no seccomp filter here: {seccomp_filter()[1]}")
@pytest.mark.parametrize("level", ["unshare", "process"])
def test_the_seccomp_filter_holds_at_the_weaker_levels_too(level):
    box = sandbox_at(level, LIMITS)
    for name, code in FILTERED.items():
        r = attempt(box, code)
        assert "PermissionError" in r.stderr and "pwned" not in r.stdout and "forked" not in r.stdout, (name, r)


# docs/sandbox.md's table, measured: each row's attempt (True: it got through), run after the hook is disarmed
ROWS = {
    "read a file of your user": "lambda: open(SECRET).read() == 'sk-fake-table'",
    "write a file outside its directory": "lambda: open(OUTSIDE, 'w').write('x') == 1",
    "read another process's environment": "lambda: b'RLHFKIT_FAKE_KEY' in open(f'/proc/{VICTIM}/environ', 'rb').read()",
    "signal another process of your user": "lambda: os.kill(TARGET, 15) is None",
    "open another process's memory for writing": "lambda: os.close(os.open(f'/proc/{os.getppid()}/mem', os.O_RDWR))"
                                                 " is None",
    "see the trainer's environment variables": "lambda: 'RLHFKIT_FAKE_KEY' in os.environ",
    "open a socket": "lambda: __import__('socket').socket() is not None",
    "start a process or another program": "lambda: (lambda pid: os._exit(0) if pid == 0 else True)(os.fork())",
    "fill memory through `/dev` or `/dev/shm`": "lambda: open('/dev/shm/fill', 'w').write('x') == 1",
    "rename the machine": None,  # never run (module docstring of docs/sandbox.md's table)
}
TRY_ROWS = ("import json\nresults = {}\nfor name, attempt in ROWS.items():\n    try:\n"
            "        results[name] = bool(attempt())\n    except Exception:\n        results[name] = False\n"
            "print(json.dumps(results))\n")


def docs_table() -> dict[str, dict[str, bool | None]]:
    """docs/sandbox.md's table: row -> level -> True (yes), False (no), None (not run)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "sandbox.md").read_text()
    lines = [line for line in text.split("## What each level lets through")[1].split("\n## ")[0].splitlines()
             if line.startswith("| ")]
    levels = [cell.strip().strip("`") for cell in lines[0].strip("|").split("|")[1:]]
    out = {}
    for line in lines[2:]:
        first, *cells = [c.strip() for c in line.strip("|").split("|")]
        key = next(k for k in ROWS if first.startswith(k))
        out[key] = {lv: None if "not run" in c else c.startswith("**yes**") for lv, c in zip(levels, cells)}
    assert set(out) == set(ROWS) and levels == ["namespaces", "unshare", "process"]
    return out


@pytest.mark.skipif(seccomp_filter()[0] is None, reason="the table assumes the seccomp filter")
@pytest.mark.parametrize("level", ["namespaces", "unshare", "process"])
def test_what_each_level_lets_through_is_this_table(level, tmp_path, monkeypatch):
    import subprocess

    box = sandbox_at(level, LIMITS)
    expected = {row: by_level[level] for row, by_level in docs_table().items()}
    yama = Path("/proc/sys/kernel/yama/ptrace_scope")
    if level == "process" and yama.exists() and int(yama.read_text()) > 0:
        expected["open another process's memory for writing"] = False  # Yama: only a parent may, not a child
    secret, outside = tmp_path / "secret", tmp_path / f"outside-{level}"
    secret.write_text("sk-fake-table")
    secret.chmod(0o600)
    monkeypatch.setenv("RLHFKIT_FAKE_KEY", "sk-fake-trainer")
    fake_env = {"PATH": os.environ["PATH"], "RLHFKIT_FAKE_KEY": "sk-fake-victim"}
    victim = subprocess.Popen(["sleep", "60"], env=fake_env)  # processes of this user the program may reach
    target = subprocess.Popen(["sleep", "60"], env=fake_env)
    try:
        rows = "{" + ", ".join(f"{k!r}: {v}" for k, v in ROWS.items() if expected[k] is not None) + "}"
        code = (f"import os\nSECRET, OUTSIDE = {str(secret)!r}, {str(outside)!r}\nVICTIM, TARGET = {victim.pid}, "
                f"{target.pid}\nROWS = {rows}\n" + TRY_ROWS)
        r = attempt(box, code)
        got = json.loads(r.stdout.splitlines()[-1])
        assert got == {k: v for k, v in expected.items() if v is not None}, (level, r.stderr[-500:])
        assert outside.exists() == got["write a file outside its directory"]
        assert (target.poll() is not None) == got["signal another process of your user"]
    finally:
        for p in (victim, target):
            p.kill()
            p.wait()


# At `process` the program can reach its worker (its parent): it writes a forged reply into every pipe of the worker's
# it can open, then defines the solution as if nothing happened
FORGE = DISARM + '''
import json, struct
def frame(message):
    data = json.dumps(message).encode()
    return struct.pack("!i", len(data)) + data
FORGED = {
    "user_error": frame({"s": "user_error", "n": None, "cls": "RewardError", "message": "forged", "where": None,
                         "fix": None}),
    "ok": frame({"s": "ok", "n": None, "v": [1.0] * 8}),
    "cut": struct.pack("!i", 1000) + b'{"s": "ok"',
}[KIND]
parent = os.getppid()
for fd in os.listdir(f"/proc/{parent}/fd"):
    try:
        os.write(os.open(f"/proc/{parent}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK), FORGED)
    except OSError:
        pass
def add(a, b):
    return a + b
'''


def test_at_process_level_a_forged_reply_on_the_workers_pipe_costs_its_sample_not_the_run(monkeypatch):
    from rlhfkit.rewards import workers

    sandbox_at("process", LIMITS)
    monkeypatch.setattr(workers, "FRAME_S", 0.3)  # a cut frame is seen stalled after this (2 s by default)
    good = "def add(a, b):\n    return a + b\n"
    completions = [f"```python\n{FORGE.replace('KIND', repr(kind))}```" for kind in ("user_error", "ok", "cut")]
    completions = [completions[0], good, completions[1], good, completions[2], good]
    rows = [{"tests": ["assert add(1, 2) == 3"]}] * 6
    spec = {"fn": "code_tests", "kwargs": {"isolation": "process", "wall_s": 10.0, "memory_mb": 256}}
    with CombinedRewards([spec], workers=2, timeout_s=60) as combo:
        out = combo(["p"] * 6, completions, rows, step=1)  # never a RewardError "forged" nor a hang
        assert out.valid.tolist() == [False, True] * 3 and out.total.tolist() == [0.0, 1.0] * 3
        assert out.metrics["rewards/code_tests/errors"] == 3.0  # each forgery: its own sample, its worker restarted
        again = combo(["p"] * 2, [completions[1]] * 2, rows[:2])  # no reply left over to shift the next call's
        assert again.total.tolist() == [1.0, 1.0] and again.valid.all()
