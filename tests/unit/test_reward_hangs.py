"""A reward that never returns, of every shape (sleeping, a busy loop, one that swallows the exceptions a timer raises
into it, an ``async def`` that never finishes), in a worker process or in the trainer's own (a function defined in
the user's script), costs at most ``reward.timeout_s`` per call of the whole batch (retries included), and the probe
and the lint together wait for it once; ``sys.exit`` inside a reward ends that call, not the run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import reward_fns_for_tests as fns

from rlhfkit.errors import RewardError
from rlhfkit.rewards import CombinedRewards, RewardFunctionError
from rlhfkit.rewards.lint import probe_rewards

HERE = Path(__file__).resolve().parent
SHAPES = ["hang_sleep", "hang_busy", "hang_swallowing", "hang_async"]
LIMIT = 0.5


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))  # the workers receive the parent's sys.path


def in_the_trainer(fn):
    """``fn`` as a function no worker can import (a closure, as a function of the user's script is): called in this
    process under the timer signal. An ``async def`` stays one."""
    import inspect

    if inspect.iscoroutinefunction(fn):
        async def local(prompts, completions, **kwargs):
            return await fn(prompts, completions, **kwargs)
    else:
        def local(prompts, completions, **fields):
            return fn(prompts, completions, **fields)
    local.__name__ = fn.__name__
    return local


@pytest.mark.parametrize("where", ["worker", "trainer"])
def test_a_hanging_reward_of_every_shape_costs_at_most_its_limit_per_call(where):
    # in a worker every shape ends the same way (the process is killed): two of them are enough there
    shapes = SHAPES if where == "trainer" else ["hang_sleep", "hang_async"]
    specs = [{"fn": f"reward_fns_for_tests:{s}" if where == "worker" else in_the_trainer(getattr(fns, s)), "name": s}
             for s in shapes] + [{"fn": "reward_fns_for_tests:contains_yes", "name": "ok"}]
    prompts, completions = ["p"] * 6, ["yes", "no", "yes", "no", "yes", "no"]
    with CombinedRewards(specs, workers=2, timeout_s=LIMIT) as combo:
        combo.start()  # the workers' start is not the calls' time
        t0 = time.perf_counter()
        out = combo(prompts, completions, [{}] * 6, step=1)
        took = time.perf_counter() - t0
        for s in shapes:  # each function: one limit for its whole call (its two chunks side by side, no retries)
            assert out.metrics[f"rewards/{s}/timeouts"] == 6.0 and out.metrics[f"rewards/{s}/time_s"] < LIMIT + 1.5
        assert took < len(shapes) * (LIMIT + 3) and out.valid.all()  # the run goes on: `ok` scored every sample
        assert out.total.tolist() == [1.0, 0.0] * 3


def test_a_reward_that_only_hangs_stops_the_run_with_one_line_after_one_limit():
    with CombinedRewards(["reward_fns_for_tests:hang_sleep"], workers=2, timeout_s=LIMIT) as combo:
        combo.start()
        t0 = time.perf_counter()
        with pytest.raises(RewardError, match=r"no completion of the batch at step 1 got a finite reward .*hang_sleep "
                                              r"-> None x 8 \(8 samples timed out, 0 failed\)") as info:
            combo(["p"] * 8, ["c"] * 8, [{}] * 8, step=1)
        assert time.perf_counter() - t0 < LIMIT + 3 and "reward.timeout_s" in info.value.fix


def test_the_probe_and_the_lint_wait_for_a_hanging_reward_once(capsys):
    rows = [{"answer": "4"}, {"answer": "5"}]
    with CombinedRewards(["reward_fns_for_tests:hang_busy", "exact_match"], workers=2, timeout_s=LIMIT) as combo:
        combo.start()
        t0 = time.perf_counter()
        report = probe_rewards(combo, ["2+2?", "2+3?"], rows, say=print)
        took = time.perf_counter() - t0
    assert took < LIMIT + 3  # the probe's one limit; the lint does not call it again (it had 26 completions)
    assert any("hang_busy ran out of time on the probe" in n for n in report.notes) and report.means["exact_match"]


def test_sys_exit_inside_a_reward_fails_that_call_not_the_run():
    for fn in ("reward_fns_for_tests:exits_on_b", in_the_trainer(fns.exits_on_b)):
        with CombinedRewards([{"fn": fn, "name": "exits"}], workers=2, timeout_s=30) as combo:
            out = combo(["p"] * 4, ["a", "b", "c", "d"], [{}] * 4)  # the sample it exits on is lost, not the run
            assert out.valid.tolist() == [True, False, True, True] and out.metrics["rewards/exits/errors"] == 1.0
            with pytest.raises(RewardFunctionError, match=r"SystemExit: sys.exit\(0\) inside the call at step 3"):
                combo(["p"], ["b"], [{}], step=3)  # on every sample: a bug, one line (never a bare SystemExit)
