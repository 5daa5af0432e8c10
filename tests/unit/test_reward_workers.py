"""Reward functions in worker processes: each call under a time limit; a call that hangs, raises or kills its worker
scores None for its samples, is counted, and the caller goes on; a function failing on every sample of a step still
stops it with one line; a reward class is built once per worker; the generic Worker keeps objects by key (what
environments use)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards import CombinedRewards, RewardFunctionError
from rlhfkit.rewards.workers import CallFailed, CallTimeout, Worker, WorkerPool

HERE = Path(__file__).resolve().parent
FNS = HERE / "reward_fns_for_tests.py"


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))  # the workers receive the parent's sys.path


def test_hang_crash_and_exception_are_scored_none_and_counted():
    rows = [{} for _ in range(4)]
    with CombinedRewards([{"fn": "reward_fns_for_tests:slow_on_hang", "name": "slow"}], workers=2,
                         timeout_s=1.5) as combo:
        t0 = time.perf_counter()
        out = combo(["p"] * 4, ["hang", "a", "b", "c"], rows, step=3)
        took = time.perf_counter() - t0
        # chunks [0:2] and [2:4]: the first hangs and is killed at the limit, which bounds the whole call (its time
        # is spent: no retry of the chunk's samples one by one, each under the limit again); the other is scored
        assert out.valid.tolist() == [False, False, True, True]
        assert out.total.tolist() == [0.0, 0.0, 1.0, 1.0]
        assert out.metrics["rewards/slow/timeouts"] == 2.0 and out.metrics["rewards/slow/errors"] == 0.0
        assert 1.4 < took < 1.5 + 10 and out.metrics["rewards/slow/time_s"] >= 1.4
        # the killed worker restarts: the next step is whole again
        again = combo(["p"] * 4, ["a", "b", "c", "d"], rows)
        assert again.valid.all() and again.metrics["rewards/slow/timeouts"] == 0.0
    with CombinedRewards([{"fn": f"{FNS}:crash_on_die", "name": "c"}, {"fn": f"{FNS}:raises_on_b", "name": "r"}],
                         workers=2, timeout_s=30) as combo:
        out = combo(["p"] * 4, ["x", "die", "b", "y"], rows)
        # crash_on_die dies on "die", raises_on_b raises on "b": each loses that one sample (its chunk is called
        # again sample by sample), the others keep their values
        assert out.metrics["rewards/c/errors"] == 1.0 and out.metrics["rewards/r/errors"] == 1.0
        c, r = out.per_function["c"], out.per_function["r"]
        assert torch.isnan(c[1]) and c[[0, 2, 3]].tolist() == [0.5, 0.5, 0.5]
        assert torch.isnan(r[2]) and r[[0, 1, 3]].tolist() == [1.0, 1.0, 1.0]
        assert out.total.tolist() == [1.5, 1.0, 0.5, 1.5]


def test_failing_on_every_sample_stops_with_one_line():
    with CombinedRewards([f"{FNS}:raises_on_b"], workers=2, timeout_s=30) as combo:
        with pytest.raises(RewardFunctionError, match=r"raises_on_b raised ZeroDivisionError: no b allowed at step 7"):
            combo(["p", "p"], ["b", "b"], [{}, {}], step=7)
    with CombinedRewards([f"{FNS}:crash_on_die"], workers=1, timeout_s=30) as combo:
        with pytest.raises(RewardFunctionError, match="crash_on_die crashed: worker exited with code 9"):
            combo(["p"], ["die"], [{}])
    # timeouts alone on every sample: no finite reward in the batch -> one line that says samples timed out
    with CombinedRewards(["reward_fns_for_tests:slow_on_hang"], workers=1, timeout_s=0.5) as combo:
        with pytest.raises(RewardError, match=r"None x 2 \(2 samples timed out, 0 failed\)"):
            combo(["p", "p"], ["hang", "hang"], [{}, {}])


def test_wrong_return_type_in_a_worker_is_still_an_error():
    with CombinedRewards([f"{FNS}:returns_text"], workers=2, timeout_s=30) as combo:
        with pytest.raises(RewardError, match="returned a str"):
            combo(["p"] * 3, ["a", "b", "c"], [{}] * 3)
    with CombinedRewards([{"fn": "length_target"}], workers=1, timeout_s=30) as combo:  # the rule's own complaint
        with pytest.raises(RewardError, match="positive `target`"):
            combo(["p"], ["a"], [{}])


def test_reward_class_is_built_once_per_worker_and_keeps_state():
    with CombinedRewards([{"fn": f"{FNS}:CountingReward", "name": "count", "kwargs": {"bonus": 0.25}}], workers=2,
                         timeout_s=30) as combo:
        rows = [{"answer": "x", "other": 1}] * 4  # `other` is not a parameter of __call__: not passed
        first = combo(["p"] * 4, ["a"] * 4, rows).per_function["count"].double()
        second = combo(["p"] * 4, ["a"] * 4, rows).per_function["count"].double()
        pids = {int(v // 100) for v in first.tolist()}
        assert len(pids) == 2 and os.getpid() % 1000 not in pids  # two workers, neither is this process
        # each worker's object counts its own calls: 1 then 2 (+ the constructor's bonus)
        assert torch.allclose(first % 100, torch.full((4,), 1.25, dtype=torch.float64))
        assert torch.allclose(second % 100, torch.full((4,), 2.25, dtype=torch.float64))
    with pytest.raises(RewardError, match="no parameter 'bonsu'"):
        CombinedRewards([{"fn": f"{FNS}:CountingReward", "kwargs": {"bonsu": 1}}], workers=1)
    combo = CombinedRewards([f"{FNS}:BrokenReward"], workers=1, timeout_s=30)
    with pytest.raises(RewardError, match="BrokenReward could not be built: OSError: model file missing"):
        combo.probe(["p"], [{}])
    combo.close()


def test_printing_and_unpicklable_functions():
    with CombinedRewards([f"{FNS}:chatty"], workers=1, timeout_s=30) as combo:
        assert combo(["p", "p"], ["ab", "abc"], [{}, {}]).total.tolist() == [2.0, 3.0]
    # a lambda no worker can import runs in this process, under the time limit (rewards/functions.py, one line)
    with CombinedRewards([lambda p, c, **f: [1.0] * len(c)], workers=1, timeout_s=30) as combo:
        assert combo.functions[0].local and combo(["p"], ["c"], [{}]).total.tolist() == [1.0]
    # in-process (workers=0) takes anything callable
    assert CombinedRewards([lambda p, c, **f: [1.0] * len(c)])(["p"], ["c"], [{}]).total.tolist() == [1.0]


@pytest.mark.parametrize("workers", [0, 1])
def test_what_user_code_prints_is_capped_per_call(capfd, workers):
    with CombinedRewards([f"{FNS}:floods"], workers=workers, timeout_s=60) as combo:
        for _ in range(2):  # the allowance is per call
            assert combo(["p"], ["a"], [{}]).total.tolist() == [1.0]
        time.sleep(0.5)  # the child's pump threads pass on what is left
    out, err = capfd.readouterr()
    assert len(out) < 4 * 64 * 1024 and out.count("output was cut") == 2, len(out)
    if workers:  # os.write to the descriptor is capped too in a child (in this process only Python's streams are)
        assert len(err) < 4 * 64 * 1024 and err.count("output was cut") == 2, len(err)


def test_worker_holds_objects_by_key_and_restarts_after_a_timeout(tmp_path):
    (tmp_path / "envlike.py").write_text(
        "import time\n"
        "class Env:\n"
        "    def __init__(self, start=0):\n        self.n = start\n"
        "    def step(self, k):\n        self.n += k\n        return self.n\n"
        "    def hang(self):\n        time.sleep(3600)\n"
        "    def boom(self):\n        raise KeyError('no such tool')\n")
    w = Worker("env")
    try:
        w.setup("a", f"{tmp_path / 'envlike.py'}:Env", {"start": 10})
        w.setup("b", f"{tmp_path / 'envlike.py'}:Env", {})
        assert w.call("a", "step", (1,), timeout=30) == 11
        assert w.call("a", "step", (2,), timeout=30) == 13
        assert w.call("b", "step", (5,), timeout=30) == 5
        with pytest.raises(CallFailed, match="KeyError: 'no such tool'"):
            w.call("a", "boom", timeout=30)
        assert w.call("a", "step", (0,), timeout=30) == 13  # an exception leaves the object as it was
        t0 = time.perf_counter()
        with pytest.raises(CallTimeout):
            w.call("a", "hang", timeout=0.5)
        assert time.perf_counter() - t0 < 15
        assert w.call("a", "step", (1,), timeout=30) == 11  # restarted: set-ups replayed, state lost
        assert w.restarts == 1
    finally:
        w.close()
    assert w.proc is None


def test_pool_runs_calls_concurrently():
    with WorkerPool(2, 30) as pool:
        pool.setup("sleep", "time:sleep")
        pool.map("sleep", [((0.01,), {})] * 2)  # warm
        t0 = time.perf_counter()
        out = pool.map("sleep", [((1.0,), {})] * 2)
        assert all(o.ok for o in out)
        assert time.perf_counter() - t0 < 1.9  # two one-second calls on two workers overlap


def test_pool_sets_its_workers_up_side_by_side_and_closes_them(tmp_path):
    # each child's constructor runs while the other's does: the pool is ready in one set-up's time, not two
    log = tmp_path / "setups.txt"
    pool = WorkerPool(2, 30)
    pool.setup("slow", f"{FNS}:RecordsSetup", {"path": str(log)})
    rows = [line.split() for line in log.read_text().splitlines()]
    assert len({pid for pid, _, _ in rows}) == 2  # one per worker
    starts, ends = [float(s) for _, s, _ in rows], [float(e) for _, _, e in rows]
    assert max(starts) < min(ends)  # the two set-ups overlapped
    # a second set-up goes to the running children (no restart) and a failing one leaves no child behind
    pool.setup("sleep", "time:sleep")
    assert all(o.ok for o in pool.map("sleep", [((0.0,), {})] * 2)) and all(w.restarts == 0 for w in pool.workers)
    with pytest.raises(RewardError, match="no_such_function"):
        pool.setup("bad", f"{FNS}:no_such_function")
    assert all(w.proc is None for w in pool.workers)  # killed: they restart with every set-up on their next use
    pool.workers[0].setups.pop("bad")
    pool.workers[1].setups.pop("bad")
    assert all(o.ok for o in pool.map("sleep", [((0.0,), {})] * 2))  # restarted, set-ups replayed
    pool.close()
    assert all(w.proc is None for w in pool.workers)


def test_importing_a_task_for_its_reward_does_not_import_torch():
    # a reward worker imports the user's reward module: rlhfkit.tasks.quickstart must not pull in the rollout engines
    import subprocess
    import sys

    code = "import sys, rlhfkit.tasks.quickstart, rlhfkit.envs; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
