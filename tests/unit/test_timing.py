"""The phase timer of the online step (track/timing.py): phases add up, do not nest, reset on take."""

from __future__ import annotations

from rlhfkit.track import PhaseTimer


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_phases_add_up_and_reset_on_take():
    clock = Clock()
    timer = PhaseTimer("cpu", clock=clock)
    with timer.phase("rollout"):
        clock.now += 2.0
    with timer.phase("reward"):
        clock.now += 0.5
    with timer.phase("rollout"):  # a second draw (dynamic sampling) adds to the first
        clock.now += 1.0
    clock.now += 10.0  # between phases: in no phase
    assert timer.take() == {"time/rollout": 3.0, "time/reward": 0.5}
    assert timer.take() == {}


def test_a_phase_inside_another_counts_in_the_outer():
    clock = Clock()
    timer = PhaseTimer("cpu", clock=clock)
    with timer.phase("eval"):
        clock.now += 1.0
        with timer.phase("rollout"):  # evaluation's rollout: part of time/eval, not of the step's time/rollout
            clock.now += 4.0
    with timer.phase("rollout"):  # the outer phase closed: timed again
        clock.now += 0.25
    assert timer.take() == {"time/eval": 5.0, "time/rollout": 0.25}


def test_a_phase_that_raises_is_still_counted_and_closed():
    clock = Clock()
    timer = PhaseTimer("cpu", clock=clock)
    try:
        with timer.phase("update"):
            clock.now += 1.5
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    with timer.phase("reward"):
        clock.now += 1.0
    assert timer.take() == {"time/update": 1.5, "time/reward": 1.0}
