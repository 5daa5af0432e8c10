"""Finite divergence is named (issue 21 §5): each rule of the supervised recipes (loss far above its start, per-token
loss at the uniform value ln |V|, gradient-norm blow-up), the online entropy / KL rules on the lr=1 GRPO case and the
dynamic-sampling rule, each on a synthetic metric sequence; healthy sequences stay silent."""

from __future__ import annotations

import math

import pytest

from rlhfkit.track import HealthMonitor

LN100 = math.log(100)


def _names(seq, **kw) -> list[list[str]]:
    """The rule names firing at each step of ``seq`` (a list of metric dicts)."""
    mon = HealthMonitor(**kw)
    return [[w.name for w in mon.evaluate(m, step)] for step, m in enumerate(seq)]


def _first(seq, name, **kw) -> int | None:
    """The first step at which rule ``name`` fires, None if never."""
    return next((i for i, names in enumerate(_names(seq, **kw)) if name in names), None)


# the lr=1 runs of the tiny model on the quickstart task (measured; tests/e2e/test_health_divergence.py reruns them)
SFT_LR1 = [4.63, 27.2, 33.8, 78.2, 29.3, 40.9, 42.2, 51.1, 83.4, 66.5]
RM_LR1 = [0.695, 4.585, 0.702, 0.577, 0.683, 17.97, 2.738, 16.65, 0.483, 5.075]
DPO_LR1 = [0.693, 0.633, 1.608, 0.904, 1.53, 2.142, 0.649, 0.44, 2.707, 3.8]
SFT_HEALTHY = [4.63, 4.29, 4.05, 3.89, 3.82, 3.62, 3.56, 3.59, 3.43, 3.35, 3.46, 3.45, 3.27, 3.39, 3.2, 3.26]
DPO_HEALTHY = [0.693, 0.69, 0.68, 0.70, 0.66, 0.65, 0.67, 0.62, 0.64, 0.60, 0.72, 0.58, 0.61, 0.55, 0.57]


@pytest.mark.parametrize("losses, at", [(SFT_LR1, 4), (RM_LR1, 4), (DPO_LR1, 5)])
def test_loss_rising_fires_on_the_lr1_runs(losses, at):
    # the mean of the last 5 checks against the lowest of the first 5, from the 5th check on: SFT (4.63 + 27.2 +
    # 33.8 + 78.2 + 29.3) / 5 = 34.6 vs 4.63 at step 4; RM (0.695 + 4.585 + 0.702 + 0.577 + 0.683) / 5 = 1.45 >
    # 2 x 0.577 and 0.87 above it at step 4; DPO (0.633 + 1.608 + 0.904 + 1.53 + 2.142) / 5 = 1.36 > 2 x 0.633 =
    # 1.27 and 0.73 above it at step 5 (at step 4 the mean 1.07 is under 1.27)
    assert _first([{"train/loss": v} for v in losses], "loss_rising") == at


@pytest.mark.parametrize("losses", [SFT_HEALTHY, DPO_HEALTHY, [0.01, 0.012, 0.011, 0.02, 0.025, 0.03, 0.03]])
def test_loss_rising_silent_on_healthy_noise_and_below_the_floor(losses):
    # the last one doubles but stays within 0.5 of its start: a loss near 0 that wobbles is not a divergence
    assert _first([{"train/loss": v} for v in losses], "loss_rising", vocab_size=100) is None


def test_eval_loss_rising_against_its_first_value():
    seq = [{"eval/loss": 4.61}, {"train/loss": 4.0}, {"eval/loss": 14.6}]
    assert _first(seq, "loss_rising") == 2
    assert _first([{"eval/loss": 0.69}, {"eval/loss": 1.0}], "loss_rising") is None  # 1.45x, under the 2x bound


def test_loss_at_uniform_after_it_had_learned():
    # SFT that learned (3.0 per token) and collapsed back to ln 100 = 4.605 (within 5%)
    seq = [{"train/loss": v} for v in (4.6, 3.5, 3.0, 3.1, 4.5, 4.6, 4.61, 4.6, 4.6)]
    assert _first(seq, "loss_at_uniform", vocab_size=100) == 8
    assert _first(seq, "loss_at_uniform") is None  # no vocabulary: no uniform value (RM, DPO)


def test_loss_above_uniform_is_worse_than_guessing():
    assert _first([{"train/loss": v} for v in SFT_LR1], "loss_at_uniform", vocab_size=100) == 5


def test_the_uniform_messages_say_which_side_and_the_value():
    mon = HealthMonitor(vocab_size=100)
    at = [mon.evaluate({"train/loss": v}, i) for i, v in enumerate((4.6, 3.0, 3.0, 4.6, 4.6, 4.6, 4.6, 4.6))][-1]
    (w,) = [w for w in at if w.name == "loss_at_uniform"]
    assert "at the uniform value ln |V| = 4.605 (100 tokens)" in w.message and "collapsed to uniform" in w.message
    assert w.severity == "critical" and w.knob == "optim.lr"
    mon = HealthMonitor(vocab_size=100)
    above = [mon.evaluate({"train/loss": v}, i) for i, v in enumerate(SFT_LR1[:6])][-1]
    (w,) = [w for w in above if w.name == "loss_at_uniform"]
    assert "above the uniform value" in w.message and "worse than a uniform guess" in w.message


def test_a_random_model_at_uniform_that_has_not_learned_yet_is_left_alone():
    # random weights start at ln |V| and fall slowly at a small lr: never 10% below, never above 5% over
    seq = [{"train/loss": LN100 * (1 + 0.01 * math.sin(i)) - 0.002 * i} for i in range(30)]
    assert _first(seq, "loss_at_uniform", vocab_size=100) is None
    assert _first([{"train/loss": v} for v in SFT_HEALTHY], "loss_at_uniform", vocab_size=100) is None


def test_grad_norm_blowup_against_the_early_median():
    assert _first([{"train/grad_norm": v} for v in (2.42, 77.0, 13.7)], "grad_norm_blowup") == 1  # 32x
    assert _first([{"train/grad_norm": v} for v in (0.349, 110.1)], "grad_norm_blowup") == 1  # RM lr=1: 315x
    healthy = (2.42, 1.87, 1.64, 1.48, 1.37, 1.27, 1.03, 0.93, 1.05, 0.72, 1.69, 0.89, 1.5, 1.13, 1.3, 1.87)
    assert _first([{"train/grad_norm": v} for v in healthy], "grad_norm_blowup") is None
    # 20x, but from 0.01 to 0.2: under the floor of 1
    assert _first([{"train/grad_norm": v} for v in (0.01, 0.01, 0.2)], "grad_norm_blowup") is None
    # one hard batch in a healthy RM run (32 pairs a batch, measured): a spike the next steps do not repeat
    spike = (0.94, 1.04, 1.37, 0.86, 1.9, 0.81, 1.06, 2.71, 10.56, 1.28, 1.34, 1.24, 3.75, 1.56)
    assert _first([{"train/grad_norm": v} for v in spike], "grad_norm_blowup") is None
    # a blow-up that stays is still caught, on its second step
    assert _first([{"train/grad_norm": v} for v in (1.0, 1.1, 0.9, 1.2, 1.0, 30.0, 45.0, 60.0)],
                  "grad_norm_blowup") == 6


def test_grpo_entropy_to_the_uniform_value_fires_on_a_small_vocabulary():
    # 1.7 nats per token at the start; ln 100 = 4.6 < 3 x 1.7: only the uniform bound can see it
    seq = [{"policy/entropy_avg": 1.7}] * 5 + [{"policy/entropy_avg": v} for v in (2.5, 3.5, 4.3)]
    assert _first(seq, "entropy_explosion", vocab_size=100) == 7
    assert _first(seq, "entropy_explosion") is None  # without |V|, 3x is out of reach
    # a random model already near uniform is not "exploding"
    flat = [{"policy/entropy_avg": 4.4 + 0.1 * (i % 2)} for i in range(12)]
    assert _first(flat, "entropy_explosion", vocab_size=100) is None


def test_grpo_kl_drifting_0_to_15_nats_fires_kl_high():
    # 15 nats over 30 tokens: 0.5 per token, under the 1-nat per-token rule and the 20-nat bound
    seq = [{"objective/kl": 0.75 * i, "response/length_mean": 30.0} for i in range(21)]
    names = _names(seq)
    first = next(i for i, n in enumerate(names) if "kl_high" in n)
    assert first == 14  # 10.5 nats > 10, 0.35 per token > 0.2
    assert not any({"kl_blowup", "kl_per_token", "kl_spike"} & set(n) for n in names)
    # long responses with a moderate per-token KL stay silent (12 nats over 256 tokens)
    assert _first([{"objective/kl": 12.0, "response/length_mean": 256.0}], "kl_high") is None


def test_dynamic_sampling_where_every_group_ties_warns():
    starved = {"rollout/dynamic_draws": 4.0, "rewards/tied_groups_frac": 1.0}
    assert _first([starved], "dynamic_sampling_starved") == 0
    fine = {"rollout/dynamic_draws": 4.0, "rewards/tied_groups_frac": 0.75}
    assert _first([fine] * 12, "dynamic_sampling_starved") is None
    assert _first([{"rewards/tied_groups_frac": 1.0}], "dynamic_sampling_starved") is None  # no dynamic sampling


def test_thresholds_name_the_new_rules():
    text = HealthMonitor().thresholds()
    assert "ln |V|" in text and "2x its start" in text and "10x its start" in text and "dynamic" in text
