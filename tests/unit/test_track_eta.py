"""The ETA on synthetic timings: a machine that slows down (the quickstart's case, where the run's average gave ETAs
4x too low), a first step that compiles, a step in progress counted by its phases, a step that overruns; and the
closing line of a run whose own metrics are not the reward's (distill)."""

import io

import pytest
from rich.console import Console

from rlhfkit.track import MetricsSink, Progress
from rlhfkit.track.progress import EtaEstimator, run_summary_line


def _run(durations, stop_at, **kw):
    """An estimator after ``stop_at`` units of the given durations; (estimator, time now, true seconds left)."""
    est, t = EtaEstimator(len(durations), start=0.0, **kw), 0.0
    for d in durations[:stop_at]:
        t += d
        est.done(t)
    return est, t, sum(durations[stop_at:])


def _average_eta(durations, stop_at):
    """The estimator this replaces: the units done over the time since the start."""
    elapsed = sum(durations[:stop_at])
    return (len(durations) - stop_at) * elapsed / stop_at


def test_a_machine_that_slows_down():
    # the quickstart's SFT on a loaded machine: 9.7 updates/s for the first 10%, then about 2 updates/s
    durations = [0.1] * 41 + [0.5] * 372
    for stop_at in (60, 125, 200):
        est, now, truth = _run(durations, stop_at)
        assert est.eta(now) == pytest.approx(truth, rel=0.05)  # within a few steps of the change
        assert truth / _average_eta(durations, stop_at) > 1.15  # the run's average: too low, for the whole run
    assert 176.5 / _average_eta(durations, 60) > 2  # 2.2x too low shortly after the machine slowed


def test_the_first_step_compiles():
    durations = [30.0] + [1.0] * 99  # the first rollout compiles the engine
    est, now, truth = _run(durations, 5)
    assert est.eta(now) == pytest.approx(truth)  # 95 s, not the average's 95 x 34 / 5
    assert _average_eta(durations, 5) > 6 * truth
    est, now, _ = _run(durations, 1)  # one step: all there is to go on
    assert est.eta(now) == pytest.approx(99 * 30.0)


def test_a_step_in_progress_counts_its_phases():
    # each step: rollout 6 s (64 sequences), update 4 s (4 updates); 10 steps, 3 done
    est, t = EtaEstimator(10, start=0.0), 0.0
    for _ in range(3):
        est.phase("rollout", t)
        t += 6
        est.phase("update", t)
        t += 4
        est.done(t)
    est.phase("rollout", t)
    assert est.eta(t, 0.0) == pytest.approx(70)
    assert est.eta(t + 3, 0.5) == pytest.approx(67)  # half the rollout done: 3 of the step's 10 s
    est.phase("update", t + 6)
    assert est.eta(t + 8, 0.5) == pytest.approx(62)  # half the update done: 8 of 10 s
    seen = [est.eta(t + 6 + s, s / 4) for s in (0, 1, 2, 3, 4)]
    assert seen == sorted(seen, reverse=True)  # it falls steadily inside the step


def test_a_step_that_overruns_raises_the_estimate():
    est, now, _ = _run([1.0] * 100, 10)
    assert est.eta(now + 0.5) == pytest.approx(89.5)  # without phases: a step less the time since the last
    assert est.eta(now + 5.0) > est.eta(now + 1.0)  # a step already 5 s long: the next ones are likely slower too


def test_progress_line_shows_it(monkeypatch):
    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock, console = Clock(), Console(file=io.StringIO(), width=120)
    with Progress(413, "sft", unit="update", console=console, clock=clock) as bar:
        for i in range(125):
            clock.t += 0.1 if i < 41 else 0.5
            bar.update()
    line = console.file.getvalue().splitlines()[2]
    assert line.startswith("[sft] 125/413 (30%)") and "eta 0:02:24" in line and "2.00 update/s" in line


def test_closing_line_of_a_distillation_run(tmp_path):
    with MetricsSink(tmp_path) as sink:
        for step, rkl in enumerate([0.9, 0.5, 0.2], start=1):
            sink.log({"objective/scores": 0.0, "objective/kl": 0.0, "distill/reverse_kl": rkl,
                      "distill/argmax_agreement": 0.3 + step / 10}, step)
        sink.log({"eval/distill/reverse_kl": 0.25, "eval/scores": 0.0}, 3)
    line = run_summary_line("distill", tmp_path, 5)
    assert line.startswith("[distill] finished in 0:00:05: reverse_kl 0.9 -> 0.2, eval_reverse_kl 0.25, "
                           "agreement 0.4 -> 0.6;")
    shown = line.split(";")[0]
    assert "score" not in shown and " kl " not in shown  # a metric at 0 all run long says nothing


def test_a_resumed_run_has_an_eta_from_its_first_step(tmp_path):
    # a run stopped at update 40 of 100 that made 2 s updates: resumed, its ETA is known before its own first update
    # (the earlier lines' pace, from metrics.jsonl; an evaluation's longer interval does not count), then its own
    from rlhfkit.track.progress import earlier_pace

    with MetricsSink(tmp_path) as sink:
        for step in range(1, 41):
            sink.log({"loss": 1.0}, step)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    import json

    rows = [json.loads(x) for x in lines]
    for i, row in enumerate(rows):  # 2 s per update, one interval of 30 s (an evaluation)
        row["time"] = 1000.0 + 2.0 * i + (30.0 if i >= 20 else 0.0)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert earlier_pace(tmp_path) == pytest.approx(2.0) and earlier_pace(tmp_path, 4) == pytest.approx(8.0)
    est = EtaEstimator(100, initial=40, start=0.0, earlier=earlier_pace(tmp_path))
    assert est.eta(0.5) == pytest.approx(60 * 2.0 - 0.5, abs=0.6)  # not "?" (None) as before
    assert EtaEstimator(100, initial=40, start=0.0).eta(0.5) is None
    est.done(30.0)  # the resumed run's first update took longer (loading): the estimate follows its own pace later
    for t in (32.0, 34.0, 36.0):
        est.done(t)
    assert est.eta(36.0) == pytest.approx(56 * 2.0)


def test_the_rollout_phase_moves_with_the_tokens():
    from rlhfkit.track.progress import Progress

    out = io.StringIO()
    progress = Progress(4, desc="grpo", unit="rollout", console=Console(file=out, width=120), is_main=True)
    progress.phase("rollout", total=8, unit="sequences")
    assert progress.phase_text() == "rollout 0/8 sequences"
    progress.detail("3 ended, token 64/512")  # the engine's host check, mid micro-batch
    assert progress.phase_text() == "rollout 0/8 sequences (3 ended, token 64/512)"
    progress.advance(8)
    assert progress.phase_text() == "rollout 8/8 sequences"
    progress.close()
