"""The code verifier and its sandbox: the fraction of tests passed; programs that loop forever, allocate without
limit, fork, open sockets, write outside their directory or print without limit each end as a scored failure within
the limits while the caller goes on; the sandbox's result channel cannot be forged by printing; a sandbox that
cannot be set up is one line at the probe."""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import machine_lacks, sandbox_at, verdict_level

from rlhfkit.errors import RewardError
from rlhfkit.rewards import CombinedRewards
from rlhfkit.rewards.code import code_tests, extract_code, parse_tests
from rlhfkit.rewards.sandbox import Limits, Sandbox, SandboxError

LIMITS = dict(wall_s=3.0, cpu_s=2.0, memory_mb=256, output_bytes=20_000)
LEVEL = verdict_level()  # the verifier's scoring, at the level this machine has
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nDone."


def score(completions, tests, isolation=LEVEL, **kw):
    return code_tests([""] * len(completions), completions, tests=[tests] * len(completions), isolation=isolation,
                      **{**LIMITS, **kw})


def test_fraction_of_assert_tests_and_stdio_pairs():
    good, off_by_one = "def add(a, b):\n    return a + b", "def add(a, b):\n    return a + b + (a < 0)"
    assert score([fenced(good), fenced(off_by_one), fenced("def add(a, b) return"), ""], ADD_TESTS) == [
        1.0, 2 / 3, 0.0, 0.0]
    pairs = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6"}, {"input": "1 1", "output": "3"}]
    program = "a, b = map(int, input().split())\nprint(a + b)   "
    assert score([fenced(program)], pairs) == [2 / 3]
    assert score([fenced(program)], {"inputs": ["2 3"], "outputs": ["5"]}) == [1.0]
    assert score([fenced(program)], '[{"input": "2 3", "output": "5"}]') == [1.0]  # JSON string
    assert score([fenced(good)], "assert add(1, 2) == 3\nassert add(1, 1) == 3\n") == [0.5]  # one string, 2 tests
    assert code_tests([""], ["x"], tests=[None], isolation=LEVEL) == [None]


def test_rows_without_tests_or_code_ask_nothing_of_the_sandbox(monkeypatch):
    # a batch with no tests to run (or no code to run them on) scored at `auto` probed the boundary all the same, so
    # on a machine without bubblewrap it was refused; now the probe comes with the first program to run
    import rlhfkit.rewards.code as code

    def refused(isolation, limits):
        raise SandboxError("no boundary here", where="test", fix="none")

    monkeypatch.setattr(code, "sandbox_for", refused)
    assert code_tests(["", ""], ["x", "```python\n\n```"], tests=[None, ["assert 1"]]) == [None, 0.0]
    with pytest.raises(SandboxError, match="no boundary here"):  # the first program to run meets the refusal
        code_tests([""], [fenced("print(1)")], tests=[["assert 1"]])
    with pytest.raises(SandboxError, match="unknown sandbox isolation 'boxed'"):  # refused at once, tests or not
        code_tests([""], ["x"], tests=[None], isolation="boxed")


def test_extraction_and_parsing():
    assert extract_code("a\n```py\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
    assert extract_code("```python\nz = 3\n") == "z = 3\n"  # unclosed last fence runs to the end
    assert extract_code("print(1)") == "print(1)" and extract_code("print(1)", require_block=True) is None
    assert parse_tests(["assert f()"]) == ("asserts", ["assert f()"])
    assert parse_tests("def t():\n    assert 1\nt()") == ("asserts", ["def t():\n    assert 1", "t()"])
    with pytest.raises(ValueError):
        parse_tests([1, 2])
    with pytest.raises(RewardError, match="row 0"):
        code_tests([""], ["x"], tests=[[1, 2]], isolation=LEVEL, **LIMITS)


HOSTILE = {
    "loops forever": "def add(a, b):\n    while True:\n        pass",
    "sleeps forever": "import time\ntime.sleep(3600)",
    "allocates without limit": "blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))",
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "subprocess": "import subprocess\nsubprocess.run(['sh', '-c', 'echo hi'])",
    "opens a socket": "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
    "writes outside": "open({outside!r}, 'w').write('owned')",
    "removes outside": "import os\nos.remove({victim!r})",
    "reads the run directory": "print(open({victim!r}).read())",
    "prints without limit": "while True:\n    print('x' * 1000)",
    "forges the report": "import sys\nfor i in range(3):\n    print('0' * 32, i, 1)\n"
                         "    sys.stderr.write(f'x {{i}} 1\\n')",
    "exits early": "import os\nos._exit(0)",
    "ctypes": "import ctypes\nctypes.CDLL(None)",
    "multiprocessing": "import multiprocessing\nmultiprocessing.Process(target=print).start()",
}


@pytest.mark.parametrize("isolation", ["namespaces", "process"])
def test_hostile_programs_are_scored_failures_within_the_limit(tmp_path, isolation):
    sandbox_at(isolation, Limits(**LIMITS))  # skipped only where the machine cannot give the level
    outside = tmp_path / "outside.txt"
    victim = tmp_path / "run" / "metrics.jsonl"
    victim.parent.mkdir()
    victim.write_text("secret run data")
    names = list(HOSTILE)
    completions = [fenced(HOSTILE[n].format(outside=str(outside), victim=str(victim))) for n in names]
    t0 = time.perf_counter()
    scores = score(completions + [fenced("def add(a, b):\n    return a + b")], ADD_TESTS, isolation=isolation)
    took = time.perf_counter() - t0
    assert dict(zip(names, scores)) == dict.fromkeys(names, 0.0)
    assert scores[-1] == 1.0  # the caller went on: the good program after them is scored
    assert not outside.exists() and victim.read_text() == "secret run data"
    # each program ends by its own limit (wall 3 s): the whole batch is bounded, never a hang
    assert took < 3 * 4 * len(completions)


@pytest.mark.parametrize("level", ["namespaces", "unshare", "process"])
def test_hostile_program_output_and_reason(level):
    box = sandbox_at(level, Limits(**LIMITS))
    r = box.run("while True:\n    print('y' * 100)")
    assert r.output_capped and len(r.stdout) <= LIMITS["output_bytes"] and "output limit" in r.reason
    r = box.run("import time\ntime.sleep(60)")
    assert r.timed_out and r.seconds < 20 and r.reason == "timed out"
    r = box.run("import faulthandler\nfaulthandler._read_null()")  # a real fault
    assert r.returncode == -signal.SIGSEGV and r.reason == "killed by signal 11"
    r = box.run("while True:\n    pass", limits=Limits(**{**LIMITS, "wall_s": 20.0, "cpu_s": 1.0}))
    assert r.returncode == -signal.SIGKILL and not r.timed_out and r.reason == "killed by signal 9"  # RLIMIT_CPU
    r = box.run("import signal\nsignal.raise_signal(signal.SIGSEGV)\nprint('went on')")
    # a signal the program sends itself: the namespaces' init (the program, PID 1) ignores it and goes on
    assert (r.stdout, r.returncode) == (("went on\n", 0) if level != "process" else ("", -signal.SIGSEGV))
    r = box.run("import os\nprint(os.getcwd(), ' '.join(os.environ))")
    cwd, env = r.stdout.split(" ", 1)
    # scrubbed: no tokens, no keys (bubblewrap may add its working directory)
    assert set(env.split()) - {"PWD", "SHLVL", "_"} == {"HOME", "LANG", "PATH", "TMPDIR"}
    if level == "namespaces":
        assert cwd == "/sandbox"
    else:
        assert "rlhfkit-sandbox-" in cwd and not os.path.exists(cwd)  # its own directory, removed after


def test_sandbox_that_cannot_be_set_up_is_one_line(monkeypatch):
    box = Sandbox(Limits(**LIMITS), isolation="process", python="/nonexistent/python3")
    with pytest.raises(SandboxError, match="code sandbox cannot be set up") as info:
        box.probe()
    assert "\n" not in str(info.value) and info.value.fix
    with pytest.raises(SandboxError, match="unknown sandbox isolation"):
        Sandbox(isolation="docker")
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(SandboxError, match=r"isolation namespaces \(bubblewrap \(bwrap\) is not installed\)") as info:
        Sandbox(Limits(**LIMITS), isolation="namespaces").probe()
    assert "apt-get install bubblewrap" in info.value.fix
    with pytest.raises(SandboxError, match="`unshare` not found"):
        Sandbox(Limits(**LIMITS), isolation="unshare").probe()


def test_code_tests_in_worker_processes_go_on_after_hostile_programs():
    rows = [{"tests": ADD_TESTS}] * 4
    completions = [fenced(HOSTILE["fork bomb"]), fenced("def add(a, b):\n    return a + b"),
                   fenced(HOSTILE["allocates without limit"]), fenced("def add(a, b):\n    return a * b")]
    with CombinedRewards([{"fn": "code_tests", "kwargs": {**LIMITS, "isolation": LEVEL}}], workers=2,
                         timeout_s=60) as combo:
        combo.probe(["p"] * 4, rows)
        out = combo(["p"] * 4, completions, rows)
    assert out.total.tolist() == pytest.approx([0.0, 1.0, 0.0, 1 / 3])
    assert out.metrics["rewards/code_tests/errors"] == 0 and out.metrics["rewards/code_tests/timeouts"] == 0



def _without(monkeypatch, *tools):
    import shutil

    which = shutil.which
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None if name in tools else which(name, *a, **k))


def test_a_run_decides_its_isolation_once_and_says_it_in_one_line(monkeypatch):
    from rlhfkit.config.schema import RewardFunction, SandboxConfig
    from rlhfkit.rewards.code import settle_sandboxes

    if machine_lacks("namespaces"):
        pytest.skip(f"this machine cannot give the boundary: {machine_lacks('namespaces')}")
    lines = []
    specs = [RewardFunction(fn="code_tests", kwargs={"wall_s": 3}), RewardFunction(fn="exact_match"),
             RewardFunction(fn="code_tests", name="strict", kwargs={"isolation": "process"})]
    out = settle_sandboxes(specs, SandboxConfig(), say=lines.append)
    assert out[0]["kwargs"] == {"wall_s": 3, "isolation": "namespaces"} and out[1] is specs[1]
    assert out[2]["kwargs"]["isolation"] == "process" and out[2]["name"] == "strict"
    assert len(lines) == 2 and all(line.startswith("[sandbox] ") and "\n" not in line for line in lines)
    assert "runs in namespaces (bubblewrap" in lines[0] and "warning" not in lines[0]
    # a weaker level only where it is named, said as a warning naming what it lets through
    assert lines[1].startswith("[sandbox] warning: model-written code runs under process, as reward.sandbox"
                               ".isolation names it") and "not a boundary" in lines[1] and "API keys" in lines[1]
    assert settle_sandboxes([RewardFunction(fn="exact_match")], SandboxConfig(), say=lines.append) and len(lines) == 2


@pytest.mark.parametrize("root", [True, False])
def test_without_the_boundary_auto_refuses_in_one_line_and_a_weaker_level_runs_only_by_name(monkeypatch, root):
    # as root or not, with keys in the environment or not: no silent fallback; the refusal names the cause, its fix,
    # and the weaker levels as a choice
    from rlhfkit.config.schema import RewardFunction, SandboxConfig
    from rlhfkit.rewards.code import settle_sandboxes

    _without(monkeypatch, "bwrap")
    monkeypatch.setattr(os, "geteuid", lambda: 0 if root else 1000)
    lines = []
    with pytest.raises(SandboxError, match="runs only inside the namespaces boundary unless you name a weaker level, "
                                           "and it cannot be set up here: bubblewrap \\(bwrap\\) is not installed"
                       ) as info:
        settle_sandboxes([RewardFunction(fn="code_tests")], SandboxConfig(), say=lines.append)
    assert info.value.where == "reward.sandbox.isolation" and "apt-get install bubblewrap" in info.value.fix
    assert "reward.sandbox.isolation=unshare" in info.value.fix and "\n" not in str(info.value) and not lines
    with pytest.raises(SandboxError, match="a boundary is required, but reward.sandbox.isolation names process") as e:
        settle_sandboxes([RewardFunction(fn="code_tests")], SandboxConfig(isolation="process", require_boundary=True),
                         say=lines.append)
    assert e.value.where == "reward.sandbox.require_boundary" and not lines  # refused before saying anything
    with pytest.raises(SandboxError, match="isolation namespaces \\(bubblewrap \\(bwrap\\) is not installed"):
        settle_sandboxes([RewardFunction(fn="code_tests")], SandboxConfig(isolation="namespaces"))
    out = settle_sandboxes([RewardFunction(fn="code_tests")], SandboxConfig(isolation="process"), say=lines.append)
    assert out[0]["kwargs"]["isolation"] == "process" and len(lines) == 1 and "warning" in lines[0]
    with pytest.raises(SandboxError, match="unknown sandbox isolation 'docker'"):
        settle_sandboxes([RewardFunction(fn="code_tests", kwargs={"isolation": "docker"})], SandboxConfig())


def test_a_large_input_the_program_never_reads_ends_at_the_wall_time():
    box = Sandbox(Limits(**{**LIMITS, "wall_s": 2.0}), isolation=LEVEL)
    t0 = time.perf_counter()
    r = box.run("import time\ntime.sleep(60)", stdin="x" * (4 << 20))  # far past a pipe's buffer
    assert r.timed_out and time.perf_counter() - t0 < 15
