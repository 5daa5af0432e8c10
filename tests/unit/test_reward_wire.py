"""What crosses from a worker to the trainer is plain data: values round-trip as JSON with their tuples, dicts and
non-finite floats; anything else arrives as a description naming its type; a reply that is not the wire's (a pickle,
extra fields, deep nesting, huge numbers, an unknown tag) is refused without running anything, and a worker that
sends one is killed and restarts."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards import wire
from rlhfkit.rewards.sandbox import SandboxError
from rlhfkit.rewards.workers import CallFailed, Worker


def round_trip(value):
    return wire.read_reply(wire.ok(value))


def test_plain_values_round_trip_with_their_shapes():
    value = {"a": [1, 2.5, None, True, "x"], ("k", 1): (1, [2, (3,)]), 3: {"nested": {}}}
    assert round_trip(value) == ("ok", value)
    status, out = round_trip([math.nan, math.inf, -math.inf])
    assert math.isnan(out[0]) and out[1:] == [math.inf, -math.inf]
    assert round_trip(([{"role": "tool", "content": "4"}], 0.5, False)) == (
        "ok", ([{"role": "tool", "content": "4"}], 0.5, False))  # an environment's step: a tuple stays a tuple
    assert isinstance(round_trip((1,))[1], tuple) and isinstance(round_trip([1])[1], list)
    # arrays, tensors and their scalars travel as their tolist(); an integer past 64 bits as the float it overflows to
    assert round_trip([np.float32(0.5), np.int64(3), np.bool_(True), np.arange(3), torch.tensor([1.5, 2.0]),
                       torch.tensor(4.0)]) == ("ok", [0.5, 3, True, [0, 1, 2], [1.5, 2.0], 4.0])
    assert round_trip([10 ** 30, -(10 ** 30)]) == ("ok", [math.inf, -math.inf])
    assert round_trip([10 ** 400, -(10 ** 5000), 2 ** 63, -(2 ** 63)]) == ("ok", [math.inf, -math.inf, math.inf,
                                                                                 -(2 ** 63)])  # past float's range too


def test_other_types_arrive_as_descriptions_naming_them():
    class Grade:
        def __repr__(self):
            return "Grade(A)"

    _, out = round_trip([{1, 2}, Grade(), int])
    assert [type(v).__name__ for v in out] == ["set", "Grade", "type"]
    assert repr(out[1]) == "Grade(A)" and isinstance(out[0], wire.Unsent) and out[0] != out[0].__class__("{1, 2}")
    # a user dict that looks like a tag is still a dict (every JSON object of a value is a tag, dicts included)
    assert round_trip({"t": [1], "o": ["x", "y"]}) == ("ok", {"t": [1], "o": ["x", "y"]})


def test_errors_round_trip_as_their_own_classes_and_fields():
    status, exc = wire.read_reply(wire.user_error(SandboxError("no box", where="reward.sandbox", fix="install")))
    assert status == "user_error" and type(exc) is SandboxError and str(exc) == "reward.sandbox: no box (fix: install)"
    status, exc = wire.read_reply(wire.user_error(type("Odd", (RewardError,), {})("odd")))
    assert type(exc) is RewardError and exc.message == "odd"  # an unknown class name: the base class
    assert wire.read_reply(wire.error("KeyError", "'x'", "Traceback ...")) == ("error", ("KeyError", "'x'",
                                                                                         "Traceback ..."))
    assert len(wire.read_reply(wire.error("E", "m" * 50_000, "t" * 50_000))[1][2]) == wire.MAX_TEXT


class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):  # unpickling this would create the file: proof that something ran
        return (open, (self.path, "w"))


@pytest.mark.parametrize("forged", [
    "pickle",
    '{"s": "ok", "n": null, "v": 1, "extra": 2}',
    '{"s": "ok", "n": null}',
    '{"s": "run", "n": null, "v": 1}',
    '[1, 2]',
    '{"s": "ok", "n": null, "v": {"x": 1}}',
    '{"s": "ok", "n": null, "v": {"o": ["a" , "b", "c"]}}',
    '{"s": "ok", "n": null, "v": {"d": [[[1], 2]]}}',
    '{"s": "ok", "n": null, "v": {"d": [[{"t": [[1]]}, 2]]}}',
    '{"s": "ok", "n": null, "v": ' + "[" * 100 + "]" * 100 + "}",
    '{"s": "ok", "n": null, "v": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"s": "ok", "n": null, "v": 1' + "0" * 30 + "}",
    '{"s": "ok", "n": null, "v": 1' + "0" * 5000 + "}",
    '{"s": "error", "n": null, "kind": 1, "message": "m", "trace": ""}',
    '{"s": "user_error", "n": null, "cls": "RewardError", "message": "' + "m" * 30_000
    + '", "where": null, "fix": null}',
    b"\xff\xfe",
    '{"s": "ok", "v": 1}',  # no request id
    '{"s": "ok", "n": "0123", "v": 1}',  # another request's
])
def test_a_reply_that_is_not_the_wire_is_refused_and_runs_nothing(tmp_path, forged):
    marker = tmp_path / "ran"
    data = pickle.dumps(Evil(str(marker))) if forged == "pickle" else (
        forged if isinstance(forged, bytes) else forged.encode())
    with pytest.raises(wire.ProtocolError):
        wire.read_reply(data)
    assert not marker.exists()


FORGER = '''
import fcntl, os, pickle, stat, struct


class Evil:
    def __reduce__(self):
        return (open, ({marker!r}, "w"))


def forge(prompts, completions, **fields):
    """What a program that reached its worker's reply pipe does: writes a framed pickle into every pipe it may write,
    then lets the honest reply follow."""
    payload = pickle.dumps(Evil())
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                os.write(fd, struct.pack("!i", len(payload)) + payload)
        except OSError:
            pass
    return [1.0] * len(completions)


def honest(prompts, completions, **fields):
    return [2.0] * len(completions)
'''


def test_a_forged_pickle_in_a_workers_reply_pipe_kills_the_worker_and_runs_nothing(tmp_path):
    marker = tmp_path / "payload-ran"
    (tmp_path / "forger.py").write_text(FORGER.format(marker=str(marker)))
    w = Worker("forged")
    try:
        w.setup("forge", f"{tmp_path / 'forger.py'}:forge")
        w.setup("honest", f"{tmp_path / 'forger.py'}:honest")
        with pytest.raises(CallFailed, match="not plain data") as info:
            w.call("forge", None, (["p"], ["c"]), timeout=30)
        assert info.value.kind == "bad reply" and info.value.worker_lost
        assert not marker.exists() and w.restarts == 1 and w.proc is None  # killed, nothing unpickled
        assert w.call("honest", None, (["p"], ["c"]), timeout=30) == [2.0]  # restarted with its set-ups
    finally:
        w.close()


def test_a_reply_past_the_size_limit_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(wire, "MAX_REPLY_BYTES", 1000)
    (tmp_path / "big.py").write_text("def big(n):\n    return 'x' * n\n")
    w = Worker("big")
    try:
        w.setup("big", f"{tmp_path / 'big.py'}:big")
        assert w.call("big", None, (10,), timeout=30) == "x" * 10
        with pytest.raises(CallFailed) as info:  # the child's own limit is the module default: it sends, we refuse
            w.call("big", None, (5000,), timeout=30)
        assert info.value.kind == "bad reply"
    finally:
        w.close()


def test_a_worker_value_that_cannot_travel_is_named_by_the_check(tmp_path):
    from rlhfkit.rewards import CombinedRewards

    (tmp_path / "odd.py").write_text("def odd(prompts, completions, **f):\n    return [{1}] * len(completions)\n")
    with CombinedRewards([f"{tmp_path / 'odd.py'}:odd"], workers=1, timeout_s=30) as combo:
        with pytest.raises(RewardError, match=r"returned a set \(\{1\}\) at index 0"):
            combo(["p"], ["c"], [{}])
