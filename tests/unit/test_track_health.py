"""Each health rule fires on a crafted sequence and stays silent on healthy values."""

import io

import pytest
from rich.console import Console

from rlhfkit.track import HealthMonitor

HEALTHY = {
    "val/ratio": 1.01,
    "policy/approxkl_avg": 0.004,
    "loss/value_avg": 0.3,
    "val/eos_frac": 0.9,
    "objective/kl": 0.02,
    "loss/policy_avg": -0.01,
}


def _run(seq, **kw):
    mon = HealthMonitor(**kw)
    return [mon.check({**HEALTHY, **m}, step) for step, m in enumerate(seq)]


def test_healthy_run_is_silent():
    mon = HealthMonitor()
    for step in range(50):
        noisy = {k: v * (1 + 0.05 * ((step % 3) - 1)) for k, v in HEALTHY.items()}
        assert mon.check(noisy, step) == []


@pytest.mark.parametrize(
    "seq, needle, knob",
    [
        ([{"val/ratio": 2.5}], "val/ratio=2.5", "algo.ppo.clip_low"),
        ([{"val/ratio": 0.3}], "outside [0.5, 2.0]", "optim.lr"),
        ([{}, {}, {}, {"policy/approxkl_avg": 0.05}], "5x its running median", "algo.ppo_epochs"),
        ([{"loss/value_avg": v} for v in (0.1, 0.12, 0.15, 0.19, 0.25)], "critic is diverging", "critic.lr"),
        ([{"val/eos_frac": 0.05}], "only 5% of responses end with EOS", "reward.missing_eos_penalty"),
        # a single negative batch is k1 sampling noise; three in a row averaging -0.05 are not
        ([{"objective/kl": -0.01}, {"objective/kl": -0.06}, {"objective/kl": -0.08}],
         "objective/kl averaged -0.05 over the last 3 steps: negative", "algo.kl.estimator=k3"),
        ([{"loss/policy_avg": float("nan")}], "loss/policy_avg not finite", "optim.lr"),
    ],
)
def test_rule_fires_on_last_step_only(seq, needle, knob):
    results = _run(seq)
    assert all(r == [] for r in results[:-1])
    (warning,) = results[-1]
    assert needle in warning and knob in warning and "\n" not in warning
    assert warning.startswith(f"step {len(seq) - 1}: ")


def test_quiet_edges():
    # approx KL spike below the 0.01 floor, value loss rising but not doubling, eos count without batch size
    seq = [{}, {}, {}, {"policy/approxkl_avg": 0.009}]
    seq += [{"loss/value_avg": v} for v in (0.3, 0.31, 0.32, 0.33, 0.34)]
    seq += [{"val/num_eos_tokens": 0, "val/eos_frac": None}]
    assert all(r == [] for r in _run(seq))
    # value loss doubling but not strictly increasing
    assert all(r == [] for r in _run([{"loss/value_avg": v} for v in (0.1, 0.2, 0.2, 0.3, 0.5)]))


def test_eos_from_count_and_batch_size():
    mon = HealthMonitor(batch_size=64)
    healthy = {k: v for k, v in HEALTHY.items() if k != "val/eos_frac"}
    assert mon.check({**healthy, "val/num_eos_tokens": 40}, 0) == []
    assert "EOS" in mon.check({**healthy, "val/num_eos_tokens": 3}, 1)[0]


def test_each_warning_at_most_once_every_10_steps_and_report_prints():
    mon = HealthMonitor()
    bad = {**HEALTHY, "val/ratio": 3.0}
    fired = [step for step in range(25) if mon.check(bad, step)]
    assert fired == [0, 10, 20]
    console = Console(file=io.StringIO(), width=80)
    mon = HealthMonitor()
    assert not mon.report({**HEALTHY, "objective/kl": -1.0}, 1, console)  # one batch: noise
    mon.report({**HEALTHY, "objective/kl": -1.0}, 2, console)
    assert mon.report({**HEALTHY, "objective/kl": -1.0}, 3, console)
    assert "warning: step 3: objective/kl averaged -1 over the last 3 steps" in console.file.getvalue()
