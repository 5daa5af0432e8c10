"""Model-written code in a training run: a tiny GRPO run whose code reward meets the escape catalogue (programs that
disarm the guard's hook, then read the home and run directories and the trainer's environment, write outside, fork,
exec, allocate 10 GB, open sockets, signal the worker, find it through /proc to forge its reply) finishes, every
attempt failing inside the boundary and scored as the failed program it is, with the reward's failed calls counted
per step (none); without bubblewrap, `auto` stops the run before any weights load, in one line naming the cause and
its fix, exit 2 (a weaker level runs only by name)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import machine_lacks

from rlhfkit.config import build_config
from rlhfkit.tasks import write_jsonl
from rlhfkit.train.online.synchronous import run_online

MISSING = machine_lacks("namespaces")  # where the machine allows the boundary, the run must get it (never a skip)

DISARM = ("import gc, os\nfor _f in gc.get_objects():\n"
          "    if getattr(_f, '__name__', '') == 'hook' and getattr(_f, '__closure__', None):\n"
          "        for _c in _f.__closure__:\n"
          "            try:\n                _c.cell_contents.clear()\n            except Exception:\n"
          "                pass\n")
ATTACKS = [
    "print(open({home!r}).read())",
    "print(open({run!r}).read())",
    "print([open(f'/proc/{{p}}/environ').read() for p in os.listdir('/proc') if p.isdigit()])",
    "open({outside!r}, 'w').write('owned')",
    "while True:\n    os.fork()",
    "os.execv('/bin/sh', ['sh', '-c', 'echo owned > {outside}'])",
    "x = bytearray(10 * 10**9)",
    "import socket\nsocket.create_connection(('127.0.0.1', 22))",
    "import signal\nos.kill({pid}, signal.SIGKILL)",
    "import pickle, struct\nclass E:\n    def __reduce__(self):\n        return (open, ({marker!r}, 'w'))\n"
    "p = pickle.dumps(('ok', E()))\nfor pid in os.listdir('/proc'):\n"
    "    for fd in (os.listdir(f'/proc/{{pid}}/fd') if pid.isdigit() else []):\n"
    "        try:\n            os.write(os.open(f'/proc/{{pid}}/fd/{{fd}}', os.O_WRONLY | os.O_NONBLOCK),"
    " struct.pack('!i', len(p)) + p)\n        except OSError:\n            pass",
]
REWARD = '''
from rlhfkit.rewards.code import code_tests


def policy_writes(prompts, completions, attack, tests, **fields):
    """As if the policy wrote the row's program: scored by code_tests in the boundary; plus a little for the length of
    the real completion, so that groups are not tied."""
    scores = code_tests(prompts, ["```python\\n" + a + "\\n```" for a in attack], tests=tests,
                        isolation="namespaces", wall_s=10.0, memory_mb=256)
    return [s + 0.1 * (len(c) % 4) for s, c in zip(scores, completions)]
'''
SOLVED = "\ndef add(a, b):\n    return a + b\n"


def attempt(code: str) -> str:
    """The attack, and on its failure the program goes on (to its solution)."""
    body = "".join(f"    {line}\n" for line in code.splitlines())
    return f"try:\n{body}except BaseException as exc:\n    print('refused', type(exc).__name__)\n"


@pytest.mark.slow
@pytest.mark.skipif(bool(MISSING), reason=f"this machine gives no namespace boundary: {MISSING}")
def test_a_grpo_run_meets_the_escape_catalogue_and_finishes(tmp_path, monkeypatch):
    secret = "sk-" + secrets.token_hex(12)
    home = Path.home() / f".rlhfkit-canary-{secrets.token_hex(4)}"
    home.write_text(secret)
    try:
        monkeypatch.setenv("RLHFKIT_TEST_API_KEY", secret)
        monkeypatch.chdir(tmp_path)
        out, outside, marker = tmp_path / "run", tmp_path / "outside.txt", tmp_path / "payload-ran"
        earlier = tmp_path / "earlier" / "metrics.jsonl"
        earlier.parent.mkdir()
        earlier.write_text(secret)
        names = dict(home=str(home), run=str(earlier), outside=str(outside), pid=os.getpid(), marker=str(marker))
        rows = [{"prompt": f"Write add(a, b). ({i})", "tests": ["assert add(1, 2) == 3"],
                 "attack": DISARM + attempt(ATTACKS[i % len(ATTACKS)].format(**names)) + SOLVED}
                for i in range(len(ATTACKS) * 2)]
        write_jsonl(tmp_path / "prompts.jsonl", rows)
        (tmp_path / "hostile.py").write_text(REWARD)
        run_online(build_config("grpo", {}, [
            f"data.train={tmp_path / 'prompts.jsonl'}", f"output_dir={out}", "model.name=tiny:hidden=32,layers=1",
            "generation.max_new_tokens=6", "data.max_length=64", "track.report=false", "track.sample_every=0",
            "train.resume=never", "train.eval_every=0", "reward.lint=false", "reward.workers=2",
            "reward.timeout_s=120", "reward.sandbox.require_boundary=true",
            f"reward.functions=[{{fn: '{tmp_path / 'hostile.py'}:policy_writes', name: hostile}}, "
            "{fn: code_tests, weight: 0.5}]",
            "algo.rollout_batch_size=4", "algo.num_generations=2", "algo.mini_batch_size=8", "train.batch_size=8",
            "algo.total_episodes=24"]))
        metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        steps = [m for m in metrics if "rewards/hostile/errors" in m]
        assert len(steps) == 3 and (out / "finished.json").exists()
        # every program ran and failed inside the boundary: no call failed or timed out, no sample dropped
        assert all(m["rewards/hostile/errors"] == 0 and m["rewards/hostile/timeouts"] == 0 for m in steps)
        assert all(m["rewards/dropped"] == 0 for m in steps)
        # each program goes on after its failed attempt, defines add and passes its test: the boundary leaves a
        # program its own work (the completion's length adds 0 to 0.3)
        assert all(1.0 <= m["rewards/hostile/mean"] <= 1.3 for m in steps), [m["rewards/hostile/mean"] for m in steps]
        assert not outside.exists() and not marker.exists() and earlier.read_text() == secret
        assert secret not in (out / "metrics.jsonl").read_text()
    finally:
        home.unlink(missing_ok=True)


def test_without_bubblewrap_auto_stops_before_any_weights_load(tmp_path):
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Write add(a, b).", "tests": ["assert add(1, 2) == 3"]}] * 8)
    empty = tmp_path / "bin"
    empty.mkdir()  # a PATH without bwrap (nor unshare): no boundary, and auto never falls back to a weaker level
    out = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "rlhfkit", "grpo", f"data.train={tmp_path / 'prompts.jsonl'}", f"output_dir={out}",
         "model.name=tiny:hidden=32,layers=1", "reward.functions=[{fn: code_tests}]", "algo.rollout_batch_size=4"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PATH=str(empty)))
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip()
    assert "\n" not in line and "reward.sandbox.isolation" in line and "apt-get install bubblewrap" in line
    assert "bubblewrap (bwrap) is not installed" in line and not out.exists()
    assert "policy" not in res.stdout  # no model was loaded
