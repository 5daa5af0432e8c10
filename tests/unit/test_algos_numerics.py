"""Numerical edge cases of the algos (issue 13): values and gradients stay finite and exact where the maths says so.

Each test states the hand-derived expectation; each failed before its fix (noted per test).
"""

import math

import pytest
import torch

from rlhfkit.algos import (
    AdaptiveKLController,
    grpo_advantages,
    kl_loss,
    kl_penalty,
    masked_mean,
    masked_var,
    masked_whiten,
    orpo_loss,
    ppo_policy_loss,
    reinforce_pp_advantages,
    rloo_advantages,
    value_loss,
)
from rlhfkit.algos.preference import log1mexp

NAN, INF = float("nan"), float("inf")


# ────────── ORPO: log(1 - e^a) near 0 ───────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize("a", [-1e-8, -3e-8, -1e-20, -0.5, -0.6931, -0.6932, -5.0, -100.0])
def test_log1mexp_value_and_gradient_match_float64(a):
    # log(1 - e^a) and its derivative -e^a / (1 - e^a), from float64 (before: the unused log1p(-exp(a)) branch
    # gave a NaN gradient for a within -3e-8 of 0 in float32)
    x = torch.tensor([a], dtype=torch.float32, requires_grad=True)
    y = log1mexp(x)
    y.sum().backward()
    want = math.log(-math.expm1(a))
    dwant = -math.exp(a) / -math.expm1(a)
    assert y.item() == pytest.approx(want, rel=1e-5)
    assert torch.isfinite(x.grad).all()
    assert x.grad.item() == pytest.approx(dwant, rel=1e-4)


def test_log1mexp_at_zero_is_finite_without_gradient():
    # a = 0 (a completion of probability 1): clamped to -tiny -> log(tiny) = -87.34 in float32, gradient 0
    x = torch.zeros(2, requires_grad=True)
    y = log1mexp(x)
    y.sum().backward()
    assert torch.allclose(y, torch.full((2,), math.log(torch.finfo(torch.float32).tiny)))
    assert torch.equal(x.grad, torch.zeros(2))


def test_orpo_gradient_finite_when_chosen_logprob_is_nearly_zero():
    # chosen avg log-prob a = -1e-8, rejected -1, lam = 0.1, B = 1:
    # log odds_c = a - log(1 - e^a) = -1e-8 - log(1e-8) = 18.4207; log odds_r = -1 - log(1 - e^-1) = -0.54132
    # d loss / d a = -lam * sigmoid(-(lo_c - lo_r)) * d lo_c / d a, d lo_c / d a = 1 / (1 - e^a) = 1e8
    a = torch.tensor([-1e-8], requires_grad=True)
    r = torch.tensor([-1.0], requires_grad=True)
    loss, _ = orpo_loss(a, r, torch.tensor(0.0), lam=0.1)
    loss.backward()
    lo_c = -1e-8 - math.log(-math.expm1(-1e-8))
    lo_r = -1.0 - math.log(-math.expm1(-1.0))
    sig = 1.0 / (1.0 + math.exp(lo_c - lo_r))
    assert torch.isfinite(a.grad).all() and torch.isfinite(r.grad).all()
    assert a.grad.item() == pytest.approx(-0.1 * sig / -math.expm1(-1e-8), rel=1e-3)
    # d lo_r / d r = 1 / (1 - e^-1); the rejected gradient has the opposite sign
    assert r.grad.item() == pytest.approx(0.1 * sig / -math.expm1(-1.0), rel=1e-3)


# ────────── group baselines: ties are exactly 0 ─────────────────────────────────────────────────────────────────
@pytest.mark.parametrize("value", [1.2, 0.1, -3.7, 1e6 + 0.3])
def test_group_of_equal_rewards_gets_exactly_zero_advantage(value):
    # before: grpo_advantages(torch.full((8,), 1.2), 8) gave +0.106 for every member (float32 mean != 1.2)
    scores = torch.full((8,), value)
    assert torch.equal(grpo_advantages(scores, 8), torch.zeros(8))
    assert torch.equal(grpo_advantages(scores, 8, scale_by_std=False), torch.zeros(8))
    assert torch.equal(rloo_advantages(scores, 8), torch.zeros(8))


def test_tied_group_beside_an_informative_group():
    # k = 4 completions of P = 2 prompts, completion-major: prompt 0 ties at 1.2, prompt 1 has rewards 0, 1, 2, 3
    # prompt 1: mean 1.5, unbiased std sqrt(5/3) -> (r - 1.5) / (sqrt(5/3) + 1e-6); prompt 0: exactly 0
    scores = torch.tensor([1.2, 0.0, 1.2, 1.0, 1.2, 2.0, 1.2, 3.0])
    adv = grpo_advantages(scores, 4).reshape(4, 2)
    assert torch.equal(adv[:, 0], torch.zeros(4))
    want = (torch.tensor([0.0, 1.0, 2.0, 3.0]) - 1.5) / (math.sqrt(5 / 3) + 1e-6)
    torch.testing.assert_close(adv[:, 1], want)
    # RLOO, prompt 1: r_i - (6 - r_i) / 3
    loo = rloo_advantages(scores, 4).reshape(4, 2)
    assert torch.equal(loo[:, 0], torch.zeros(4))
    torch.testing.assert_close(loo[:, 1], torch.tensor([-2.0, -2 / 3, 2 / 3, 2.0]))


def test_whitening_equal_values_gives_exactly_zero():
    # before: masked_whiten of eight 1.2s gave 0.0012 each (rounding of the mean divided by sqrt(1e-8))
    x = torch.full((2, 8), 1.2)
    mask = torch.ones(2, 8)
    mask[1, 5:] = 0
    assert torch.equal(masked_whiten(x, mask), torch.zeros(2, 8))
    assert masked_var(x, mask).item() == 0.0
    # REINFORCE++: equal returns everywhere -> 0
    rewards = torch.tensor([[0.0, 0.0, 1.2], [0.0, 0.0, 1.2]])
    assert torch.equal(reinforce_pp_advantages(rewards, torch.ones(2, 3)), torch.zeros(2, 3))


def test_whitening_hand_values_unchanged_by_the_pivot():
    # [1, 2, 3] (4 masked): mean 2, unbiased var 1 -> [-1, 0, 1]; shift_mean=False adds the mean back
    x, m = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1, 1, 1, 0])
    torch.testing.assert_close(masked_whiten(x, m), torch.tensor([-1.0, 0.0, 1.0, 0.0]))
    torch.testing.assert_close(masked_whiten(x, m, shift_mean=False), torch.tensor([1.0, 2.0, 3.0, 0.0]))
    # and against float64 on random data (empty mask: all 0, no NaN)
    g = torch.Generator().manual_seed(0)
    y = torch.randn(4, 9, generator=g, dtype=torch.float64) * 5 + 100
    mk = torch.rand(4, 9, generator=g) > 0.3
    v = y[mk]
    torch.testing.assert_close(masked_whiten(y, mk)[mk], (v - v.mean()) / (v.var() + 1e-8).sqrt())
    assert torch.equal(masked_whiten(y, torch.zeros(4, 9)), torch.zeros(4, 9, dtype=torch.float64))


# ────────── NaN / overflow in padding never reaches a gradient ──────────────────────────────────────────────────
def _pad_with(v: float) -> tuple[torch.Tensor, torch.Tensor]:
    """log-probs [[-1, -0.5, v]] with the last position masked out."""
    return torch.tensor([[-1.0, -0.5, v]], requires_grad=True), torch.tensor([[1.0, 1.0, 0.0]])


@pytest.mark.parametrize("bad", [NAN, INF, -INF, 200.0, -200.0])
def test_ppo_loss_padding_garbage_reaches_neither_loss_nor_gradient(bad):
    # valid tokens: log-ratio 0 (old = new) -> ratio 1, A = [2, -1]; token mean of -A r = (-2 + 1) / 2 = -0.5;
    # d / d logp = -A r / 2 = [-1, 0.5]; the padded position gets exactly 0 (before: NaN)
    logp, mask = _pad_with(bad)
    old = torch.tensor([[-1.0, -0.5, 0.0]])
    adv = torch.tensor([[2.0, -1.0, NAN]])  # a NaN advantage in padding too
    loss, stats = ppo_policy_loss(logp, old, adv, mask)
    loss.backward()
    assert loss.item() == pytest.approx(-0.5)
    assert torch.equal(logp.grad, torch.tensor([[-1.0, 0.5, 0.0]]))
    assert all(torch.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("bad", [NAN, INF, -200.0])
def test_value_loss_padding_garbage_reaches_no_gradient(bad):
    # valid: V = [1, 2], R = [0, 0], no clipping -> 0.5 * mean(1, 4) = 1.25; dL/dV = V / 2 = [0.5, 1]
    values = torch.tensor([[1.0, 2.0, bad]], requires_grad=True)
    loss, _ = value_loss(values, torch.tensor([[1.0, 2.0, bad]]), torch.tensor([[0.0, 0.0, bad]]),
                         torch.tensor([[1.0, 1.0, 0.0]]))
    loss.backward()
    assert loss.item() == pytest.approx(1.25)
    assert torch.equal(values.grad, torch.tensor([[0.5, 1.0, 0.0]]))


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("bad", [NAN, -200.0, 200.0])
def test_kl_loss_padding_garbage_reaches_no_gradient(estimator, bad):
    # valid log-ratios 0 -> every estimator 0 with gradient 0 (k1: d/dx x = 1 -> 1/2 per token)
    logp, mask = _pad_with(bad)
    loss, stats = kl_loss(logp, torch.tensor([[-1.0, -0.5, 0.0]]), mask, estimator=estimator)
    loss.backward()
    assert loss.item() == 0.0 and stats["kl"].item() == 0.0
    want = [0.5, 0.5, 0.0] if estimator == "k1" else [0.0, 0.0, 0.0]
    assert torch.equal(logp.grad, torch.tensor([want]))


def test_kl_penalty_masked_before_the_estimator():
    # k3 at log-ratio -200 overflows (e^200 = inf in float32); masked out it is exactly 0, with a 0 gradient
    logp = torch.tensor([[0.5, -200.0]], requires_grad=True)
    kl = kl_penalty(logp, torch.zeros(1, 2), "k3", mask=torch.tensor([[1, 0]]))
    kl.sum().backward()
    assert kl[0, 1].item() == 0.0 and kl[0, 0].item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 1].item() == 0.0


def test_masked_whiten_inf_in_padding_reaches_no_gradient():
    # before: one inf in a masked position made every gradient NaN
    x = torch.tensor([1.0, 2.0, INF, NAN], requires_grad=True)
    m = torch.tensor([1.0, 1.0, 0.0, 0.0])
    w = masked_whiten(x, m)
    (w * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    torch.testing.assert_close(w, torch.tensor([-0.7071068, 0.7071068, 0.0, 0.0]))
    assert torch.isfinite(x.grad).all() and x.grad[2:].abs().sum() == 0
    # masked_var likewise
    x.grad = None
    masked_var(x, m).backward()
    assert torch.isfinite(x.grad).all()
    # masked_mean / sum keep their select-only behaviour
    x.grad = None
    masked_mean(x, m).backward()
    assert torch.equal(x.grad, torch.tensor([0.5, 0.5, 0.0, 0.0]))


# ────────── log-ratios beyond float32's exp range ───────────────────────────────────────────────────────────────
def test_ppo_loss_log_ratio_beyond_88_is_clipped():
    # log-ratio 100 on a valid token: e^100 = inf in float32. Clamped to 20: A = -1 -> per-token max(-A r, -A 1.2)
    # = e^20; token mean over 2 tokens (other: ratio 1, A = 1 -> -1) = (e^20 - 1) / 2; gradient 0 at the clamp
    logp = torch.tensor([[100.0, 0.0]], requires_grad=True)
    loss, stats = ppo_policy_loss(logp, torch.zeros(1, 2), torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2))
    loss.backward()
    assert loss.item() == pytest.approx((math.exp(20) - 1) / 2, rel=1e-5)
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 0].item() == 0.0
    assert all(torch.isfinite(v) for v in stats.values())
    # within the clamp nothing changes: log-ratio 19 -> e^19 and its gradient -A e^19 / 2
    logp = torch.tensor([[19.0, 0.0]], requires_grad=True)
    loss, _ = ppo_policy_loss(logp, torch.zeros(1, 2), torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2))
    loss.backward()
    assert logp.grad[0, 0].item() == pytest.approx(math.exp(19) / 2, rel=1e-5)
    # and the unclamped loss (log_ratio_clip=None) is inf, which is what the clamp prevents
    loss, _ = ppo_policy_loss(torch.tensor([[100.0, 0.0]]), torch.zeros(1, 2), torch.tensor([[-1.0, 1.0]]),
                              torch.ones(1, 2), log_ratio_clip=None)
    assert math.isinf(loss.item())


def test_kl_loss_log_ratio_clip():
    # k3 at log-ratio -100: e^100 - 1 - 100 = inf in float32; clipped to 20: e^20 - 1 - 20, gradient 0
    logp = torch.tensor([[-100.0]], requires_grad=True)
    loss, _ = kl_loss(logp, torch.zeros(1, 1), torch.ones(1, 1), estimator="k3", log_ratio_clip=20.0)
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(20) - 21, rel=1e-5)
    assert logp.grad.item() == 0.0
    assert math.isinf(kl_loss(logp.detach(), torch.zeros(1, 1), torch.ones(1, 1), estimator="k3")[0].item())


# ────────── adaptive KL coefficient ─────────────────────────────────────────────────────────────────────────────
def test_adaptive_kl_coefficient_never_negative():
    # before: n_steps = 6 x horizon at KL 0 -> beta * (1 - 0.2 * 6) = -0.02. Now n_steps / horizon is capped at 1:
    # beta * (1 - 0.2) = 0.08, and at most +20% up: 0.08 * 1.2 = 0.096
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10)
    assert ctl.update(0.0, n_steps=60) == pytest.approx(0.08)
    assert ctl.update(100.0, n_steps=60) == pytest.approx(0.096)
    for _ in range(500):
        ctl.update(0.0, n_steps=10**6)
    assert ctl.value > 0
    # a non-finite KL leaves the coefficient as it is
    v = ctl.value
    assert ctl.update(NAN, 10) == v and ctl.update(torch.tensor(INF), 10) == v


# ────────── the online loop uses the clamp ───────────────────────────────────────────────────────────────────────
def test_online_advantages_pass_log_ratio_clip_and_mask():
    # step 5 of the online loop on a stub trainer: k3 at log-ratio -100 on a valid token is e^100 = inf unclamped;
    # with algo.kl.log_ratio_clip = 20 it is e^20 - 21, and NaN in a padded position gives KL 0 there
    from types import SimpleNamespace

    from rlhfkit.algos import ADVANTAGE_ESTIMATORS, FixedKLController
    from rlhfkit.config import build_config
    from rlhfkit.train.online.experience import Experience
    from rlhfkit.train.online.learner import Learner

    cfg = build_config("reinforce", {}, ["algo.kl.estimator=k3"])
    assert cfg.algo.kl.log_ratio_clip == 20.0
    trainer = SimpleNamespace(cfg=cfg, kl_ctl=FixedKLController(0.0), estimator=ADVANTAGE_ESTIMATORS["reinforce_pp"],
                              k=1, kl_in_reward=True, off_policy=lambda e: (None, {}))
    trainer.kl_metrics = lambda e: Learner.kl_metrics(trainer, e)
    exp = Experience(rollout=None, rows=[], position_ids=None, action=torch.tensor([[1.0, 1.0, 0.0]]),
                     old_logprobs=torch.tensor([[-100.0, -1.0, NAN]]), ref_logprobs=torch.tensor([[0.0, -1.0, 0.0]]),
                     scores=torch.tensor([1.0]), values=None, turn_rewards=None)
    metrics = Learner.advantages(trainer, exp)
    assert torch.equal(exp.kl[0, 1:], torch.zeros(2))
    assert exp.kl[0, 0].item() == pytest.approx(math.exp(20) - 21, rel=1e-5)
    assert metrics["objective/kl"] == pytest.approx(math.exp(20) - 21, rel=1e-5)
    assert torch.isfinite(exp.advantages).all()


# ────────── samples dropped from a step (reward NaN / None) leave their group's statistics ─────────────────────────
def test_group_baselines_over_valid_members_only():
    # k = 4, P = 1: rewards [1, 3, 999, 5] with member 2 dropped -> valid [1, 3, 5]: mean 3, unbiased std 2
    # GRPO: [-1, 0, (dropped) 0, 1] (/ (2 + eps)); Dr. GRPO: [-2, 0, 0, 2]; RLOO: r_i - mean(others): [-3, 0, 0, 3]
    scores = torch.tensor([1.0, 3.0, 999.0, 5.0])
    valid = torch.tensor([True, True, False, True])
    torch.testing.assert_close(grpo_advantages(scores, 4, valid=valid), torch.tensor([-2.0, 0.0, 0.0, 2.0]) / 2.000001)
    torch.testing.assert_close(grpo_advantages(scores, 4, scale_by_std=False, valid=valid),
                               torch.tensor([-2.0, 0.0, 0.0, 2.0]))
    torch.testing.assert_close(rloo_advantages(scores, 4, valid=valid), torch.tensor([-3.0, 0.0, 0.0, 3.0]))
    # a group with a single valid member (or none) gets 0 everywhere
    one = torch.tensor([True, False, False, False])
    for adv in (grpo_advantages(scores, 4, valid=one), rloo_advantages(scores, 4, valid=one),
                grpo_advantages(scores, 4, valid=torch.zeros(4, dtype=torch.bool))):
        assert torch.equal(adv, torch.zeros(4))


@pytest.mark.parametrize("seed", [0, 1])
def test_group_baselines_with_valid_mask_match_slow_loop(seed):
    g = torch.Generator().manual_seed(seed)
    k, P = 5, 7
    scores = torch.randn(k * P, generator=g, dtype=torch.float64)
    valid = torch.rand(k * P, generator=g) > 0.3
    grpo, loo = grpo_advantages(scores, k, valid=valid), rloo_advantages(scores, k, valid=valid)
    for j in range(P):
        idx = [i * P + j for i in range(k) if valid[i * P + j]]
        r = [scores[i].item() for i in idx]
        for i in range(k):
            b = i * P + j
            if b not in idx or len(idx) < 2:
                assert grpo[b] == 0 and loo[b] == 0
                continue
            mean = sum(r) / len(r)
            std = math.sqrt(sum((x - mean) ** 2 for x in r) / (len(r) - 1))
            assert grpo[b].item() == pytest.approx((scores[b].item() - mean) / (std + 1e-6), rel=1e-9)
            others = (sum(r) - scores[b].item()) / (len(r) - 1)
            assert loo[b].item() == pytest.approx(scores[b].item() - others, rel=1e-9, abs=1e-12)


def test_sequence_estimators_leave_rows_without_tokens_out_of_their_group():
    # the registry's group estimators read a row whose mask is all 0 as dropped: rewards [1, 3, (dropped), 5] on
    # the last token -> RLOO [-3, 0, 0, 3], broadcast over each row's tokens
    from rlhfkit.algos import ADVANTAGE_ESTIMATORS

    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    rewards = torch.tensor([[0.0, 1.0], [3.0, 0.0], [0.0, 999.0], [0.0, 5.0]])
    adv, _ = ADVANTAGE_ESTIMATORS["rloo"].fn(rewards, mask, group_size=4)
    torch.testing.assert_close(adv, torch.tensor([[-3.0, -3.0], [0.0, 0.0], [0.0, 0.0], [3.0, 3.0]]))


def test_group_all_tied_compares_valid_members_only():
    # k = 4, P = 1: [1, 1, 0 (dropped), 1] ties among the valid; [1, 2, ...] with only member 0 valid ties too
    from rlhfkit.algos import group_all_tied

    assert group_all_tied(torch.tensor([1.0, 1.0, 0.0, 1.0]), 4).tolist() == [False] * 4
    v = torch.tensor([1, 1, 0, 1])
    assert group_all_tied(torch.tensor([1.0, 1.0, 0.0, 1.0]), 4, valid=v).tolist() == [True] * 4
    assert group_all_tied(torch.tensor([1.0, 2.0, 0.0, 1.0]), 4, valid=v).tolist() == [False] * 4
    assert group_all_tied(torch.tensor([1.0, 2.0]), 2, valid=torch.tensor([1, 0])).tolist() == [True, True]


@pytest.mark.parametrize("name", ["simpo", "orpo"])
def test_length_normalised_losses_with_an_empty_completion_stay_finite(name):
    # a completion cut away entirely (0 tokens, summed log-prob 0) gives a mean of 0 / max(0, 1) = 0, not 0 / 0
    from types import SimpleNamespace

    from rlhfkit.algos import PREFERENCE_LOSSES

    chosen = torch.tensor([-2.0, 0.0], requires_grad=True)
    lp = {"chosen": chosen, "rejected": torch.tensor([-4.0, -3.0]), "chosen_tokens": torch.tensor([2.0, 0.0]),
          "rejected_tokens": torch.tensor([2.0, 3.0])}
    params = SimpleNamespace(beta=2.0, simpo_gamma=0.5, orpo_lambda=0.1)
    loss, stats = PREFERENCE_LOSSES[name].from_logps(lp, params)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(chosen.grad).all()
    assert all(torch.isfinite(v) for v in stats.values())
