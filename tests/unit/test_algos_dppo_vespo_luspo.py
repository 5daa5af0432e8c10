"""The policy losses of issue 34 (DPPO, VESPO, LUSPO): hand values with their derivation, a slow per-token /
per-sequence loop, gradients (hand values and autograd of the slow loop), ties, empty masks, extreme log-ratios,
float32, and the equalities each must satisfy (DPPO and VESPO on-policy = REINFORCE; DPPO's binary divergences are
lower bounds of the full ones; LUSPO = GSPO x length, its token gradient independent of the response's length)."""

import dataclasses
import math

import pytest
import torch
from test_algos_cispo_sapo_gmpo import _finite, _grad, _matches_slow, _reduce, _rows  # tests/unit is on sys.path

from rlhfkit.algos import BINARY_DIVERGENCES, OFF_POLICY_CORRECTIONS, POLICY_LOSSES, aggregate_loss
from rlhfkit.algos.policy_losses import binary_kl, binary_tv, dppo_loss, gspo_loss, luspo_loss, vespo_loss

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
LN = math.log


def _batch(seed=0, B=5, T=7, spread=0.3, dtype=torch.float64):
    """Random log-probs, old log-probs (log-ratios ~ spread), one advantage per row and a mask whose rows hold
    7, 3, 1, 5 and 0 tokens (the last row has none); NaN in the padding of both log-probs."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=dtype) * 2
    old = (logp + spread * torch.randn(B, T, generator=g, dtype=dtype)).clamp(max=-1e-3)
    adv = torch.randn(B, generator=g, dtype=dtype)
    mask = (torch.arange(T).unsqueeze(0) < torch.tensor([7, 3, 1, 5, 0][:B]).unsqueeze(-1)).long()
    nan = torch.full((), math.nan, dtype=dtype)
    return torch.where(mask.bool(), logp, nan), torch.where(mask.bool(), old, nan), adv, mask


def _probs_case():
    # pi_old(y_t) = 0.5 at each of 3 tokens; pi(y_t) = [0.8, 0.55, 0.2]: moved +0.3, +0.05, -0.3; r = [1.6, 1.1, 0.4]
    return torch.log(torch.tensor([[0.8, 0.55, 0.2]], dtype=torch.float64)), torch.full((1, 3), LN(0.5),
                                                                                       dtype=torch.float64)


# ────────────────────────────────────────────────────── DPPO ──────────────────────────────────────────────────────
def test_binary_divergences_hand_values():
    logp, old = _probs_case()
    torch.testing.assert_close(binary_tv(logp, old), torch.tensor([[0.3, 0.05, 0.3]], dtype=torch.float64))
    # KL(Bern(0.5) || Bern(p)) = 0.5 ln(0.5 / p) + 0.5 ln(0.5 / (1 - p)): p = 0.8 and 0.2 give the same 0.22314
    kl = [0.5 * LN(0.5 / p) + 0.5 * LN(0.5 / (1 - p)) for p in (0.8, 0.55, 0.2)]
    torch.testing.assert_close(binary_kl(logp, old), torch.tensor([kl], dtype=torch.float64))
    assert kl[0] == pytest.approx(0.2231435513) and kl[1] == pytest.approx(0.0050252, rel=1e-4)
    assert set(BINARY_DIVERGENCES) == {"binary_tv", "binary_kl"}


@pytest.mark.parametrize("seed", range(4))
def test_binary_divergences_are_lower_bounds_of_the_full_ones(seed):
    # what is approximated: the full distributions over a vocabulary of 50, collapsed to {sampled token, the rest};
    # merging outcomes never increases TV or KL (data processing), and both are 0 exactly when p(y) = mu(y)
    g = torch.Generator().manual_seed(seed)
    mu = torch.softmax(torch.randn(64, 50, generator=g, dtype=torch.float64) * 2, -1)
    p = torch.softmax(mu.log() + 0.7 * torch.randn(64, 50, generator=g, dtype=torch.float64), -1)
    y = torch.multinomial(mu, 1, generator=g)
    lp, lmu = p.log().gather(-1, y), mu.log().gather(-1, y)
    full_tv = 0.5 * (p - mu).abs().sum(-1, keepdim=True)
    full_kl = (mu * (mu.log() - p.log())).sum(-1, keepdim=True)
    assert torch.all(binary_tv(lp, lmu) <= full_tv + 1e-12) and torch.all(binary_kl(lp, lmu) <= full_kl + 1e-12)
    assert torch.all(binary_kl(lp, lmu) >= -1e-12)
    assert torch.all(binary_tv(lmu, lmu) == 0) and torch.allclose(binary_kl(lmu, lmu), torch.zeros_like(lmu))


def test_binary_kl_is_finite_where_a_probability_is_one():
    # mu = 1 (log 0) and p < 1: only the mu log(mu / p) term; p = 1 and mu < 1: large (log(1 - p) held at -27.6)
    for dtype in (torch.float32, torch.float64):
        zero, half = torch.zeros(1, 1, dtype=dtype), torch.full((1, 1), LN(0.5), dtype=dtype)
        assert binary_kl(half, zero).item() == pytest.approx(LN(2.0), rel=1e-6)
        assert torch.isfinite(binary_kl(zero, half)) and binary_kl(zero, half).item() > 5
        assert binary_kl(zero, zero).item() == 0.0


def test_dppo_hand_values_and_gradient():
    logp, old = _probs_case()
    mask = torch.ones(1, 3)
    # A = +1: token 0 rose by 0.3 > delta_high 0.2 -> masked; token 1 rose 0.05 -> kept; token 2 fell (an update for
    # A > 0 moves it back toward the anchor: never masked). per token -M r A log pi, token mean over 3:
    # (0 - 1.1 ln 0.55 - 0.4 ln 0.2) / 3; d / d log pi = -M r A / 3 = [0, -1.1, -0.4] / 3
    loss, g, st = _grad(dppo_loss, logp, old, torch.tensor([1.0]), mask)
    assert loss.item() == pytest.approx((-1.1 * LN(0.55) - 0.4 * LN(0.2)) / 3)
    torch.testing.assert_close(g, torch.tensor([[0.0, -1.1, -0.4]], dtype=torch.float64) / 3)
    assert st["clipfrac"].item() == pytest.approx(1 / 3)
    assert st["ratio_mean"].item() == pytest.approx((1.6 + 1.1 + 0.4) / 3)
    assert all(not v.requires_grad and v.dim() == 0 for v in st.values())
    # A = -1: token 2 fell by 0.3 > delta_low -> masked; tokens 0 and 1 kept: gradient +r / 3 = [1.6, 1.1, 0] / 3
    _, g, st = _grad(dppo_loss, logp, old, torch.tensor([-1.0]), mask)
    torch.testing.assert_close(g, torch.tensor([[1.6, 1.1, 0.0]], dtype=torch.float64) / 3)
    # the thresholds per direction: delta_high 0.35 keeps token 0 for A > 0
    _, g, st = _grad(dppo_loss, logp, old, torch.tensor([1.0]), mask, delta_high=0.35)
    assert torch.all(g != 0) and st["clipfrac"].item() == 0.0
    # binary KL: 0.22314 for tokens 0 and 2: masked at delta 0.22, kept at 0.23
    _, g, _ = _grad(dppo_loss, logp, old, torch.tensor([1.0]), mask, divergence="binary_kl", delta_high=0.22)
    assert g[0, 0] == 0 and g[0, 1] != 0
    _, g, _ = _grad(dppo_loss, logp, old, torch.tensor([1.0]), mask, divergence="binary_kl", delta_high=0.23)
    assert g[0, 0] != 0
    # the cap bounds the weight, not the gradient: r = 1.6 capped at 1.5 on an unmasked token keeps -1.5 A / 3
    _, g, _ = _grad(dppo_loss, logp, old, torch.tensor([1.0]), mask, delta_high=0.35, ratio_cap=1.5)
    torch.testing.assert_close(g, torch.tensor([[-1.5, -1.1, -0.4]], dtype=torch.float64) / 3)
    # prime-rl's term kl_coef (log r)^2 on every token: adds 2 kl_coef log r / 3 to the gradient, masked tokens too
    base, g0, _ = _grad(dppo_loss, logp, old, torch.tensor([1.0]), mask)
    loss, g, _ = _grad(dppo_loss, logp, old, torch.tensor([1.0]), mask, kl_coef=0.1)
    lr = [LN(1.6), LN(1.1), LN(0.4)]
    assert loss.item() == pytest.approx(base.item() + 0.1 * sum(x * x for x in lr) / 3)
    torch.testing.assert_close(g - g0, torch.tensor([[0.2 * x / 3 for x in lr]], dtype=torch.float64))


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("divergence, delta", [("binary_tv", (0.04, 0.06)), ("binary_kl", (0.01, 0.005))])
def test_dppo_matches_slow_loop_value_and_gradient(aggregation, divergence, delta):
    logp, old, adv, mask = _batch(1, spread=0.4)
    adv[1] = 0.0  # a zero advantage: nothing to mask, nothing learned
    lo, hi = delta
    cap, kl = 1.3, 0.05

    def slow(x):  # per token, with plain floats for every detached factor
        terms = [[] for _ in range(x.shape[0])]
        for i, n in _rows(mask):
            a = float(adv[i])
            for t in range(n):
                p, mu = math.exp(float(x[i, t].detach())), math.exp(float(old[i, t]))
                d = abs(p - mu) if divergence == "binary_tv" else \
                    mu * math.log(mu / p) + (1 - mu) * math.log((1 - mu) / (1 - p))
                masked = (a > 0 and p > mu and d > hi) or (a < 0 and p < mu and d > lo)
                w = 0.0 if masked else min(p / mu, cap)
                terms[i].append(-w * a * x[i, t] + kl * (x[i, t] - old[i, t]) ** 2)
        return _reduce(terms, aggregation, 9)

    g = _matches_slow(slow, dppo_loss, logp, old, adv, mask, divergence=divergence, delta_low=lo, delta_high=hi,
                      ratio_cap=cap, kl_coef=kl, aggregation=aggregation, max_len=9)
    _, _, st = _grad(dppo_loss, logp, old, adv, mask, divergence=divergence, delta_low=lo, delta_high=hi)
    assert 0 < st["clipfrac"].item() < 1 and torch.all(g[~mask.bool()] == 0)  # the trust region bit, not all


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_dppo_on_policy_is_reinforce(aggregation):
    # pi_old = pi: r = 1, every divergence 0, nothing masked, no squared term: -A log pi, REINFORCE's gradient
    logp, _, adv, mask = _batch(2)
    reinforce = _grad(lambda x: (aggregate_loss(-adv.unsqueeze(-1) * torch.where(mask.bool(), x, 0.0), mask,
                                                aggregation, 11), {}), logp)
    for divergence in BINARY_DIVERGENCES:
        loss, g, st = _grad(dppo_loss, logp, logp.clone(), adv, mask, divergence=divergence, kl_coef=1e-3,
                            aggregation=aggregation, max_len=11)
        assert loss.item() == pytest.approx(reinforce[0].item(), rel=1e-12)
        torch.testing.assert_close(g, reinforce[1])
        assert st["clipfrac"].item() == 0.0 and st["ratio_mean"].item() == 1.0


def test_dppo_masks_by_probability_mass_not_by_ratio():
    # the paper's case: a rare token 1e-4 -> 1e-2 (r = 100, mass moved 0.01) keeps its gradient where PPO's clip drops
    # it; a dominant token 0.99 -> 0.6 (r = 0.61, mass moved 0.39) is masked for A < 0 where PPO (r in its clip
    # range [0.5, 1.5]) keeps it
    logp = torch.log(torch.tensor([[1e-2, 0.6]], dtype=torch.float64))
    old = torch.log(torch.tensor([[1e-4, 0.99]], dtype=torch.float64))
    mask = torch.ones(1, 2)
    _, g_pos, _ = _grad(dppo_loss, logp[:, :1], old[:, :1], torch.tensor([1.0]), mask[:, :1])
    _, g_ppo, _ = _grad(POLICY_LOSSES["ppo"].fn, logp[:, :1], old[:, :1], torch.tensor([1.0]), mask[:, :1])
    assert g_pos.item() == pytest.approx(-20.0) and g_ppo.item() == 0.0  # min(100, C = 20)
    _, g_neg, st = _grad(dppo_loss, logp[:, 1:], old[:, 1:], torch.tensor([-1.0]), mask[:, 1:])
    _, g_ppo, _ = _grad(POLICY_LOSSES["ppo"].fn, logp[:, 1:], old[:, 1:], torch.tensor([-1.0]), mask[:, 1:],
                        clip_low=0.5)
    assert g_neg.item() == 0.0 and st["clipfrac"].item() == 1.0 and g_ppo.item() != 0.0


# ────────────────────────────────────────────────────── VESPO ─────────────────────────────────────────────────────
def _phi(log_w, k, lam):
    return math.exp(lam + k * log_w - lam * math.exp(log_w))


def test_vespo_hand_values_and_gradient():
    # log r = [0.2, -0.5]: log W = -0.3 (W = 0.741); per token -phi A log pi, token mean over 2
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    old = logp - torch.tensor([[0.2, -0.5]], dtype=torch.float64)
    mask = torch.ones(1, 2)
    for a, k, lam in ((1.0, 2.0, 3.0), (-1.0, 3.0, 2.0)):  # A >= 0: k_pos, lambda_pos; A < 0: k_neg, lambda_neg
        phi = _phi(-0.3, k, lam)  # A > 0: e^(3 - 0.6 - 3 * 0.7408) = 1.1942; A < 0: e^(2 - 0.9 - 2 * 0.7408) = 0.6828
        loss, g, st = _grad(vespo_loss, logp, old, torch.tensor([a]), mask)
        assert loss.item() == pytest.approx(-phi * a * (-1.0 - 2.0) / 2)
        torch.testing.assert_close(g, torch.full((1, 2), -phi * a / 2, dtype=torch.float64))  # phi has no gradient
        assert st["clipfrac"].item() == pytest.approx(max(0.0, 1 - phi))
    assert _phi(-0.3, 2, 3) == pytest.approx(1.19420, rel=1e-4) and _phi(-0.3, 3, 2) == pytest.approx(0.68275, rel=1e-4)
    # the kernel: 1 at W = 1, its peak at W = k / lambda, -> 0 far on both sides
    assert _phi(0.0, 2, 3) == 1.0 and _phi(LN(2 / 3), 2, 3) > _phi(LN(0.6), 2, 3) and _phi(LN(2 / 3), 2, 3) > 1
    for log_w, want in ((0.0, 1.0), (LN(2 / 3), _phi(LN(2 / 3), 2, 3)), (LN(8.0), _phi(LN(8.0), 2, 3))):
        loss, g, _ = _grad(vespo_loss, torch.zeros(1, 1, dtype=torch.float64),
                           torch.full((1, 1), -log_w, dtype=torch.float64), torch.tensor([1.0]), torch.ones(1, 1))
        assert g.item() == pytest.approx(-want)
    assert _phi(LN(8.0), 2, 3) < 1e-7  # a sequence 8x more likely now than when sampled is all but ignored


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_vespo_matches_slow_loop_value_and_gradient(aggregation, seed):
    logp, old, adv, mask = _batch(seed, spread=0.3)
    adv[1] = 0.0  # A = 0 takes the >= 0 kernel; contributes nothing
    adv_tok = adv.unsqueeze(-1) + 0.1 * torch.randn(logp.shape, dtype=logp.dtype,
                                                    generator=torch.Generator().manual_seed(seed))
    kp, lp_, kn, ln_ = 1.5, 2.5, 2.5, 1.5

    def slow(x):  # per row: W from the detached log-ratios, the kernel by the row's mean advantage, per token -phi A lp
        terms = [[] for _ in range(x.shape[0])]
        for i, n in _rows(mask):
            log_w = sum(float(x[i, t].detach() - old[i, t]) for t in range(n))
            a_row = sum(float(adv_tok[i, t]) for t in range(n)) / n
            phi = _phi(log_w, kp, lp_) if a_row >= 0 else _phi(log_w, kn, ln_)
            terms[i] = [-phi * float(adv_tok[i, t]) * x[i, t] for t in range(n)]
        return _reduce(terms, aggregation, 9)

    _matches_slow(slow, vespo_loss, logp, old, adv_tok, mask, k_pos=kp, lambda_pos=lp_, k_neg=kn, lambda_neg=ln_,
                  aggregation=aggregation, max_len=9)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_vespo_on_policy_is_reinforce(aggregation):
    logp, _, adv, mask = _batch(3)
    reinforce = _grad(lambda x: (aggregate_loss(-adv.unsqueeze(-1) * torch.where(mask.bool(), x, 0.0), mask,
                                                aggregation, 11), {}), logp)
    loss, g, st = _grad(vespo_loss, logp, logp.clone(), adv, mask, aggregation=aggregation, max_len=11)
    assert loss.item() == pytest.approx(reinforce[0].item(), rel=1e-12)
    torch.testing.assert_close(g, reinforce[1])
    assert st["clipfrac"].item() == 0.0


def test_vespo_folds_the_correction_into_the_sequence_ratio():
    # weights w_t = pi_old / pi_rollout: W = prod r_t * prod w_t (TRL's VESPO); the loss is not multiplied by w again
    logp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
    old = logp.clone()  # r = 1: the whole of W comes from the correction
    mask, adv = torch.ones(1, 3), torch.tensor([1.0])
    w = torch.tensor([[1.2, 0.9, 1.0]], dtype=torch.float64)
    phi = _phi(LN(1.2 * 0.9), 2.0, 3.0)
    loss, g, _ = _grad(vespo_loss, logp, old, adv, mask, weights=w)
    assert loss.item() == pytest.approx(-phi * (-3.5) / 3)
    torch.testing.assert_close(g, torch.full((1, 3), -phi / 3, dtype=torch.float64))
    # an icepop weight of 0 (token 1 outside the band): that token enters neither W nor the loss; it still counts
    # in the token mean's denominator, as icepop keeps it in the mask
    rollout = old - torch.log(torch.tensor([[1.2, 9.0, 1.0]], dtype=torch.float64))  # rho = [1.2, 9, 1]
    w_ice, m = OFF_POLICY_CORRECTIONS["icepop"](old, rollout, mask)
    assert w_ice[0].tolist() == pytest.approx([1.2, 0.0, 1.0]) and torch.equal(m, mask)
    loss, g, _ = _grad(vespo_loss, logp, old, adv, mask, weights=w_ice)
    phi = _phi(LN(1.2), 2.0, 3.0)
    assert loss.item() == pytest.approx(-phi * (-1.0 - 0.5) / 3)
    torch.testing.assert_close(g, torch.tensor([[-phi / 3, 0.0, -phi / 3]], dtype=torch.float64))


# ────────────────────────────────────────────────────── LUSPO ─────────────────────────────────────────────────────
def test_luspo_hand_values_and_gradient():
    # two rows: 3 tokens with log r = [0.1, 0, -0.1] (s = 1), 1 token with log r = 0.001 (s = e^0.001, inside the
    # range 1 + 2.5e-3); A = [1, 1]. GSPO: per-seq -A s; LUSPO: times |y| = [3, 1]; mean over the 2 sequences
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, 0.0, 0.0]], dtype=torch.float64)
    old = logp - torch.tensor([[0.1, 0.0, -0.1], [0.001, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    s2 = math.exp(0.001)
    loss, g, st = _grad(luspo_loss, logp, old, adv, mask)
    assert loss.item() == pytest.approx((-3 * 1.0 - 1 * s2) / 2)
    # d/d log pi_t of -|y| A s / 2 with s = exp(mean log r): -A s / 2 for every token of every row, whatever its length
    torch.testing.assert_close(g, torch.tensor([[-0.5, -0.5, -0.5], [-s2 / 2, 0, 0]], dtype=torch.float64))
    gs, g_gspo, _ = _grad(gspo_loss, logp, old, adv, mask, clip_low=2e-3, clip_high=2.5e-3)
    assert gs.item() == pytest.approx((-1.0 - s2) / 2)
    torch.testing.assert_close(g_gspo, torch.tensor([[-1 / 6, -1 / 6, -1 / 6], [-s2 / 2, 0, 0]], dtype=torch.float64))
    assert st["clipfrac"].item() == 0.0
    # outside the range the row is clipped (no gradient), as in GSPO: log r = 0.01 for A > 0
    _, g, st = _grad(luspo_loss, logp, logp - 0.01, adv, mask)
    assert torch.all(g == 0) and st["clipfrac"].item() == 1.0


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_luspo_matches_slow_loop_and_is_gspo_times_length(aggregation, seed):
    logp, old, adv, mask = _batch(seed, spread=0.004)  # sequence log-ratios ~ 1e-3: both clip ends are reached
    lo, hi = 1e-3, 1.5e-3

    def slow(x):
        terms = [[] for _ in range(x.shape[0])]
        for i, n in _rows(mask):
            s = torch.exp(torch.stack([x[i, t] - old[i, t] for t in range(n)]).mean())
            a = float(adv[i])
            per_seq = torch.maximum(-a * s, -a * torch.clamp(s, 1 - lo, 1 + hi))
            terms[i] = [n * per_seq] * n
        return _reduce(terms, aggregation, 9)

    g = _matches_slow(slow, luspo_loss, logp, old, adv, mask, clip_low=lo, clip_high=hi, aggregation=aggregation,
                      max_len=9)
    rows_moved = [bool(torch.any(g[i] != 0)) for i, _ in _rows(mask)]
    assert any(rows_moved) and not all(rows_moved)  # some rows clipped (no gradient), some not
    # with every row of one length n, LUSPO is GSPO x n
    full = torch.ones_like(mask)
    lu, g_lu, _ = _grad(luspo_loss, torch.nan_to_num(logp, nan=-1.0), torch.nan_to_num(old, nan=-1.0), adv, full,
                        clip_low=lo, clip_high=hi, aggregation=aggregation, max_len=9)
    gs, g_gs, _ = _grad(gspo_loss, torch.nan_to_num(logp, nan=-1.0), torch.nan_to_num(old, nan=-1.0), adv, full,
                        clip_low=lo, clip_high=hi, aggregation=aggregation, max_len=9)
    assert lu.item() == pytest.approx(7 * gs.item(), rel=1e-12)
    torch.testing.assert_close(g_lu, 7 * g_gs)


# ─────────────────────────────────────────── shared edge cases of the three ───────────────────────────────────────────
LOSSES = [pytest.param(dppo_loss, {}, id="dppo"), pytest.param(dppo_loss, {"divergence": "binary_kl",
                                                                          "kl_coef": 1e-3}, id="dppo_kl"),
          pytest.param(vespo_loss, {}, id="vespo"), pytest.param(luspo_loss, {}, id="luspo")]


@pytest.mark.parametrize("fn, kw", LOSSES)
def test_ties_empty_rows_and_empty_batch(fn, kw):
    logp, old, adv, mask = _batch(3)
    # a tied group: every advantage 0 -> no policy-gradient term (DPPO's squared term, not an advantage's, set to 0)
    loss, g, _ = _grad(fn, logp, old, torch.zeros_like(adv), mask, **{**kw, "kl_coef": 0.0} if fn is dppo_loss else kw)
    assert loss.item() == 0.0 and torch.all(g == 0)
    for aggregation in ("token_mean", "seq_mean_token_mean"):  # the row without tokens (row 4, NaN) changes nothing
        full, g, _ = _grad(fn, logp, old, adv, mask, aggregation=aggregation, **kw)
        part, _, _ = _grad(fn, logp[:4], old[:4], adv[:4], mask[:4], aggregation=aggregation, **kw)
        assert full.item() == pytest.approx(part.item(), rel=1e-12) and torch.all(g[4] == 0)
    loss, g, st = _grad(fn, logp, old, adv, torch.zeros_like(mask), **kw)  # an all-empty batch
    assert loss.item() == 0.0 and torch.all(g == 0) and _finite(loss, g, st)


@pytest.mark.parametrize("fn, kw", LOSSES)
def test_float32_agrees_with_float64(fn, kw):
    logp, old, adv, mask = _batch(4, spread=0.4 if fn is not luspo_loss else 0.003)
    l64, g64, _ = _grad(fn, logp, old, adv, mask, **kw)
    l32, g32, _ = _grad(fn, logp.float(), old.float(), adv.float(), mask, **kw)
    assert l32.dtype == torch.float32 and g32.dtype == torch.float32
    assert l32.item() == pytest.approx(l64.item(), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(g32, g64.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn, kw", LOSSES)
def test_extreme_log_ratios_stay_finite_in_float32(fn, kw):
    # log r = +100 / -100 in float32 (e^100 = inf; probabilities e^50 > 1 are not probabilities, but a broken forward
    # must not poison the update) with NaN / inf padding: the log-ratio is clamped to +-20 first, nothing is NaN
    logp, old = torch.tensor([[-1e-3, -100.0, math.nan]]), torch.tensor([[-100.0, -1e-3, math.inf]])
    for a in (1.0, -1.0):
        loss, g, st = _grad(fn, logp, old, torch.tensor([a]), torch.tensor([[1, 1, 0]]), **kw)
        assert loss.dtype == torch.float32 and _finite(loss, g, st) and g[0, 2] == 0
    if fn is vespo_loss:  # W = e^(20 - 20) = 1 here; a row with W = e^20 or e^-20 gets phi = 0, not NaN
        for lr in (100.0, -100.0):
            loss, g, st = _grad(fn, torch.tensor([[-1.0]]), torch.tensor([[-1.0 - lr]]), torch.tensor([1.0]),
                                torch.ones(1, 1))
            assert _finite(loss, g, st) and abs(g.item()) < 1e-15 and st["clipfrac"].item() == 1.0


@pytest.mark.parametrize("name, fn, defaults, changed", [
    ("dppo", dppo_loss, {"divergence": "binary_tv", "delta_low": 0.2, "delta_high": 0.2, "ratio_cap": 20.0,
                         "kl_coef": 0.0}, {"divergence": "binary_kl", "delta_low": 0.05, "delta_high": 0.05,
                                           "ratio_cap": 5.0, "kl_coef": 1e-3}),
    ("vespo", vespo_loss, {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0},
     {"k_pos": 1.0, "lambda_pos": 2.0, "k_neg": 2.5, "lambda_neg": 1.5}),
    ("luspo", luspo_loss, {"clip_low": 2e-3, "clip_high": 2.5e-3}, {"clip_low": 1e-3, "clip_high": 3e-3}),
])
def test_registry_entry_section_defaults_and_overrides(name, fn, defaults, changed):
    from rlhfkit.config import OnlineAlgoConfig, build_config

    spec = POLICY_LOSSES[name]
    assert spec.fn is fn and spec.section == name
    assert dataclasses.asdict(getattr(OnlineAlgoConfig(), name)) == defaults
    cfg = build_config("grpo", {}, [f"algo.policy_loss={name}", *(f"algo.{name}.{k}={v}" for k, v in changed.items())])
    logp, old, adv, mask = _batch(5, spread=0.3)
    via, _ = spec(logp, old, adv, mask, getattr(cfg.algo, name), aggregation="token_mean")
    assert torch.equal(via, fn(logp, old, adv, mask, **changed, aggregation="token_mean")[0])


def test_config_refuses_bad_settings():
    from rlhfkit.config import build_config
    from rlhfkit.errors import ConfigError

    with pytest.raises(ConfigError, match="binary_tv"):
        build_config("grpo", {}, ["algo.policy_loss=dppo", "algo.dppo.divergence=topk_tv"])
    with pytest.raises(ConfigError, match="algo.dppo.delta_low"):
        build_config("grpo", {}, ["algo.dppo.delta_low=0"])
    with pytest.raises(ConfigError, match="algo.vespo.lambda_neg"):
        build_config("grpo", {}, ["algo.vespo.lambda_neg=0"])
    with pytest.raises(ConfigError, match="algo.luspo.clip_low"):
        build_config("grpo", {}, ["algo.luspo.clip_low=1.5"])


def test_trl_names_of_vespo_and_luspo(monkeypatch):
    import rlhfkit.config.aliases
    from rlhfkit.config import build_config
    from rlhfkit.errors import ConfigError

    monkeypatch.setattr(rlhfkit.config.aliases, "_ALIASES_LOGGED", set())
    # TRL's LUSPO config (its paper index): loss_type=luspo, importance_sampling_level=sequence, epsilon 2e-3 / 2.5e-3
    for order in (("loss_type=luspo", "importance_sampling_level=sequence"),
                  ("importance_sampling_level=sequence", "loss_type=luspo")):
        cfg = build_config("grpo", {}, [*order, "epsilon=1e-3", "epsilon_high=3e-3"])
        assert cfg.algo.policy_loss == "luspo" and cfg.algo.loss_aggregation == "seq_mean_token_mean"
        assert (cfg.algo.luspo.clip_low, cfg.algo.luspo.clip_high) == (1e-3, 3e-3)
    with pytest.raises(ConfigError, match="sequence-level loss.*importance_sampling_level=token"):
        build_config("grpo", {}, ["loss_type=luspo", "importance_sampling_level=token"])
    # TRL's VESPO config: loss_type=vespo with its four kernel settings
    cfg = build_config("grpo", {}, ["loss_type=vespo", "vespo_k_pos=1.5", "vespo_lambda_pos=2.5", "vespo_k_neg=2",
                                    "vespo_lambda_neg=1", "importance_sampling_level=token"])
    assert cfg.algo.policy_loss == "vespo" and cfg.algo.loss_aggregation == "token_mean"
    assert dataclasses.asdict(cfg.algo.vespo) == {"k_pos": 1.5, "lambda_pos": 2.5, "k_neg": 2.0, "lambda_neg": 1.0}
    with pytest.raises(ConfigError, match="token-level loss"):
        build_config("grpo", {}, ["loss_type=vespo", "importance_sampling_level=sequence"])
    # LUSPO chosen by rlhfkit's own key: TRL's level keeps it (and the other level is refused)
    assert build_config("grpo", {"algo": {"policy_loss": "luspo"}},
                        ["importance_sampling_level=sequence"]).algo.policy_loss == "luspo"
    # the plain levels are unchanged: token -> ppo, sequence -> gspo
    assert build_config("grpo", {}, ["importance_sampling_level=sequence"]).algo.policy_loss == "gspo"
    assert build_config("grpo", {}, ["loss_type=grpo", "importance_sampling_level=token"]).algo.policy_loss == "ppo"


def test_config_show_lists_every_policy_loss_and_correction():
    from rlhfkit.config import build_config
    from rlhfkit.config.parse import dump_yaml, show_yaml

    cfg = build_config("grpo", {}, [])
    text = dump_yaml(cfg)  # what `rlhfkit config show grpo` prints, before its comments are wrapped
    assert all(f"{name}:" in show_yaml(cfg) for name in ("dppo", "vespo", "luspo", "icepop"))
    line = next(ln for ln in text.splitlines() if "policy loss (see `algos.POLICY_LOSSES`)" in ln)
    assert all(f" {name} " in line + " " or f" {name};" in line for name in POLICY_LOSSES), line
    for name in ("dppo", "vespo", "luspo"):
        assert f"  {name}:" in text  # its section, with its settings
    corr = next(ln for ln in text.splitlines() if "rollout / trainer mismatch correction" in ln)
    assert all(f" {name} " in corr for name in OFF_POLICY_CORRECTIONS), corr
    assert "    icepop:" in text


def test_vespo_refuses_a_sequence_level_correction():
    from rlhfkit.config import build_config
    from rlhfkit.errors import ConfigError

    with pytest.raises(ConfigError, match="algo.off_policy.level.*token ratios"):
        build_config("grpo", {}, ["algo.policy_loss=vespo", "algo.off_policy.correction=tis",
                                  "algo.off_policy.level=sequence"])
    for ok in (["algo.off_policy.correction=tis"], ["algo.off_policy.correction=icepop"],
               ["algo.off_policy.level=sequence"]):  # token level, icepop (token only), or no correction
        build_config("grpo", {}, ["algo.policy_loss=vespo", *ok])
    build_config("grpo", {}, ["algo.policy_loss=gspo", "algo.off_policy.correction=mis",
                              "algo.off_policy.level=sequence"])  # the other losses multiply: any level
