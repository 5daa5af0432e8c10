"""The policy losses of issue 19 (CISPO, SAPO, GMPO): hand values with their derivation, a slow per-token /
per-sequence loop, gradients (hand values and autograd of the slow loop), ties, empty masks, extreme log-ratios,
float32, and the equalities each must satisfy (CISPO unclipped at ratio 1 = REINFORCE's gradient; SAPO at its
temperature limits; GMPO on one-token responses = token-level PPO clip)."""

import dataclasses
import math

import pytest
import torch

from rlhfkit.algos import POLICY_LOSSES, aggregate_loss
from rlhfkit.algos.policy_losses import cispo_loss, gmpo_loss, sapo_loss

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def _batch(seed=0, B=5, T=7, spread=0.3, dtype=torch.float64):
    """Random log-probs, old log-probs (log-ratios ~ spread), one advantage per row and a mask whose rows hold
    7, 3, 1, 5 and 0 tokens (the last row has none); NaN in the padding of both log-probs."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    old = logp + spread * torch.randn(B, T, generator=g, dtype=dtype)
    adv = torch.randn(B, generator=g, dtype=dtype)
    mask = (torch.arange(T).unsqueeze(0) < torch.tensor([7, 3, 1, 5, 0][:B]).unsqueeze(-1)).long()
    nan = torch.full((), math.nan, dtype=dtype)
    return torch.where(mask.bool(), logp, nan), torch.where(mask.bool(), old, nan), adv, mask


def _rows(mask):
    """(row, number of tokens) of each row that has tokens."""
    return [(i, int(mask[i].sum())) for i in range(mask.shape[0]) if int(mask[i].sum()) > 0]


def _reduce(terms, aggregation, max_len):
    """The three aggregations written out over a list of per-row lists of per-token terms (scalar tensors)."""
    rows = [torch.stack(t) for t in terms if t]
    if aggregation == "token_mean":
        return torch.cat(rows).sum() / sum(len(r) for r in rows)
    if aggregation == "seq_mean_token_mean":
        return torch.stack([r.mean() for r in rows]).mean()
    return torch.stack([r.sum() for r in rows]).sum() / max_len / len(terms)  # Dr. GRPO: mean over all B rows


def _grad(fn, logp, *args, **kw):
    x = logp.detach().clone().requires_grad_(True)
    loss, stats = fn(x, *args, **kw)
    (g,) = torch.autograd.grad(loss, x)
    return loss.detach(), g, stats


def _matches_slow(slow, fn, logp, old, adv, mask, **kw):
    """``fn``'s value and gradient equal those of ``slow`` (autograd through the written-out loop, on logp with its
    padding set to 0); returns ``fn``'s gradient."""
    loss, g, _ = _grad(fn, logp, old, adv, mask, **kw)
    x = torch.where(mask.bool(), logp, 0.0).requires_grad_(True)
    want = slow(x)
    (g_slow,) = torch.autograd.grad(want, x)
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    torch.testing.assert_close(g, g_slow)
    return g


def _finite(loss, grad, stats):
    return bool(torch.isfinite(loss) and torch.isfinite(grad).all() and all(torch.isfinite(v) for v in stats.values()))


# ───────────────────────────────────────────────────── CISPO ─────────────────────────────────────────────────────
def test_cispo_hand_values_and_gradient():
    # log pi = [-0.5, -1, -2], log pi_old = -1 -> log r = [0.5, 0, -1], r = [1.6487, 1, 0.3679]; A = 2
    logp, old, adv, mask = torch.tensor([[-0.5, -1.0, -2.0]]), torch.full((1, 3), -1.0), torch.tensor([2.0]), \
        torch.ones(1, 3)
    # clip to [0.8, 1.28]: weights [1.28, 1, 0.8]; per token -A w log pi = [1.28, 2, 3.2]; token mean 6.48 / 3
    loss, g, st = _grad(cispo_loss, logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(2.16)
    # d/d log pi = -A w / 3 (w detached): [-2.56, -2, -1.6] / 3 -- the two clipped tokens keep a gradient
    torch.testing.assert_close(g, torch.tensor([[-2.56, -2.0, -1.6]]) / 3)
    assert st["clipfrac"].item() == pytest.approx(2 / 3)
    assert st["ratio_mean"].item() == pytest.approx((math.exp(0.5) + 1 + math.exp(-1)) / 3)
    assert st["approxkl"].item() == pytest.approx(0.5 * (0.25 + 0 + 1) / 3)
    assert all(not v.requires_grad and v.dim() == 0 for v in st.values())
    # the defaults (no lower bound, cap 1 + 4 = 5): nothing clipped, w = r: loss (2 e^0.5 0.5 + 2 + 2 e^-1 2) / 3
    loss, g, st = _grad(cispo_loss, logp, old, adv, mask)
    assert loss.item() == pytest.approx((math.exp(0.5) + 2 + 4 * math.exp(-1)) / 3)
    torch.testing.assert_close(g, -2 * torch.tensor([[math.exp(0.5), 1.0, math.exp(-1)]]) / 3)
    assert st["clipfrac"].item() == 0.0
    # log r = 2: r = e^2 = 7.39 above the cap 5 -> w = 5; gradient -A * 5 = -10 (PPO's would be 0 here)
    _, g, st = _grad(cispo_loss, torch.tensor([[1.0]]), torch.tensor([[-1.0]]), torch.tensor([2.0]), torch.ones(1, 1))
    assert g.item() == pytest.approx(-10.0) and st["clipfrac"].item() == 1.0


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_cispo_matches_slow_loop_value_and_gradient(aggregation, seed):
    logp, old, adv, mask = _batch(seed, spread=0.6)  # ratios e^(+-0.6 sigma): both bounds are reached
    lo, hi = 0.3, 0.25

    def slow(x):  # per token: the weight a plain float (no gradient), times -A log pi
        terms = [[] for _ in range(x.shape[0])]
        for i, n in _rows(mask):
            for t in range(n):
                r = math.exp(float(x[i, t].detach() - old[i, t]))
                terms[i].append(-float(adv[i]) * min(max(r, 1 - lo), 1 + hi) * x[i, t])
        return _reduce(terms, aggregation, 9)

    g = _matches_slow(slow, cispo_loss, logp, old, adv, mask, clip_low=lo, clip_high=hi,
                      aggregation=aggregation, max_len=9)
    # no token's gradient is dropped: every valid token with A != 0 has one (PPO's clip zeroes some of them)
    assert torch.all(g[mask.bool()] != 0) and torch.all(g[~mask.bool()] == 0)
    ppo = _grad(POLICY_LOSSES["ppo"].fn, logp, old, adv, mask, clip_low=lo, clip_high=hi)[1]
    assert torch.any(ppo[mask.bool()] == 0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_cispo_unclipped_at_ratio_one_is_reinforce(aggregation):
    # r = 1 (pi_old = pi) and no clipping: -sg(1) A log pi has REINFORCE's value and gradient -A grad log pi,
    # aggregated the same way; with the default bounds too (r = 1 lies inside [0, 5])
    logp, _, adv, mask = _batch(2)
    reinforce = _grad(lambda x: (aggregate_loss(-adv.unsqueeze(-1) * torch.where(mask.bool(), x, 0.0), mask,
                                                aggregation, 11), {}), logp)
    for bounds in ({"clip_low": None, "clip_high": None}, {}):
        loss, g, st = _grad(cispo_loss, logp, logp.clone(), adv, mask, aggregation=aggregation, max_len=11, **bounds)
        assert loss.item() == pytest.approx(reinforce[0].item(), rel=1e-12)
        torch.testing.assert_close(g, reinforce[1])
        assert st["ratio_mean"].item() == 1.0 and st["clipfrac"].item() == 0.0


@pytest.mark.parametrize("bounds", [{}, {"clip_low": None, "clip_high": None}])
def test_cispo_extreme_log_ratios_stay_finite_in_float32(bounds):
    # log r = +100 / -100 in float32 (e^100 = inf) with NaN padding: the log-ratio is clamped to +-20 first, so the
    # weight is at most e^20 ~ 4.9e8 (or the cap 5) and the value and gradient stay finite
    logp = torch.tensor([[50.0, -50.0, math.nan]])
    old = torch.tensor([[-50.0, 50.0, math.inf]])
    loss, g, st = _grad(cispo_loss, logp, old, torch.tensor([1.0]), torch.tensor([[1, 1, 0]]), **bounds)
    assert loss.dtype == torch.float32 and _finite(loss, g, st) and g[0, 2] == 0
    w = 5.0 if not bounds else math.exp(20)
    assert g[0, 0].item() == pytest.approx(-w / 2, rel=1e-5)  # -A w / 2 tokens
    assert g[0, 1].item() == pytest.approx(-math.exp(-20) / 2, rel=1e-5)  # no lower bound: w = e^-20


# ────────────────────────────────────────────────────── SAPO ──────────────────────────────────────────────────────
def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_sapo_hand_values_and_gradient():
    # log r = [0.5, 0, -1] (r = [1.6487, 1, 0.3679]), one row; the loss per token is -A (4 / tau) sigma(tau (r - 1))
    logp, old, mask = torch.tensor([[-0.5, -1.0, -2.0]]), torch.full((1, 3), -1.0), torch.ones(1, 3)
    r = [math.exp(0.5), 1.0, math.exp(-1)]
    for a, tau in ((2.0, 1.0), (-2.0, 1.05)):  # A > 0 takes tau_pos = 1, A < 0 tau_neg = 1.05 (the defaults)
        loss, g, st = _grad(sapo_loss, logp, old, torch.tensor([a]), mask)
        # value: mean over the 3 tokens of -A (4 / tau) sigma(tau (r - 1)); at r = 1 sigma = 1/2: -2 A / tau
        assert loss.item() == pytest.approx(sum(-a * 4 / tau * _sigmoid(tau * (x - 1)) for x in r) / 3)
        # d/d log pi = -A (4 / tau) sigma' tau r / 3 = -A w r / 3, w = 4 sigma (1 - sigma): 1 at r = 1, less elsewhere
        w = [4 * _sigmoid(tau * (x - 1)) * (1 - _sigmoid(tau * (x - 1))) for x in r]
        torch.testing.assert_close(g, torch.tensor([[-a * wi * x / 3 for wi, x in zip(w, r)]]))
        assert w[1] == 1.0 and 0 < w[0] < 1 and 0 < w[2] < 1
        assert st["clipfrac"].item() == pytest.approx(sum(1 - wi for wi in w) / 3)  # the gate's mean closure
    # the negative temperature closes the gate sooner: at the same r, w(tau_neg = 1.05) < w(tau_pos = 1)
    gp = _grad(sapo_loss, logp, old, torch.tensor([1.0]), mask)[1]
    gn = _grad(sapo_loss, logp, old, torch.tensor([-1.0]), mask)[1]
    assert torch.all(gn[0, [0, 2]].abs() < gp[0, [0, 2]].abs()) and gn[0, 1].item() == pytest.approx(-gp[0, 1].item())


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_sapo_matches_slow_loop_value_and_gradient(aggregation, seed):
    logp, old, adv, mask = _batch(seed, spread=0.6)
    adv[1] = 0.0  # a zero advantage takes tau_neg and contributes nothing
    tp, tn = 0.7, 1.6

    def slow(x):  # per token, written out: tau by the sign of the row's advantage, the sigmoid gate times 4 / tau
        terms = [[] for _ in range(x.shape[0])]
        for i, n in _rows(mask):
            tau = tp if float(adv[i]) > 0 else tn
            for t in range(n):
                r = torch.exp(x[i, t] - old[i, t])
                terms[i].append(-float(adv[i]) * 4 / tau * torch.sigmoid(tau * (r - 1)))
        return _reduce(terms, aggregation, 9)

    g = _matches_slow(slow, sapo_loss, logp, old, adv, mask, tau_pos=tp, tau_neg=tn, aggregation=aggregation, max_len=9)
    # a smooth gate drops no token: every valid token of a row with A != 0 has a gradient
    has_adv = (adv != 0).unsqueeze(-1) & mask.bool()
    assert torch.all(g[has_adv] != 0) and torch.all(g[~has_adv] == 0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_sapo_small_temperature_is_the_unclipped_importance_weighted_loss(aggregation):
    # tau -> 0: sigma(tau (r - 1)) = 1/2 + tau (r - 1) / 4 + O(tau^3), so f(r) = 2 / tau + (r - 1) + O(tau^2):
    # the gradient -> -A r grad log pi (w -> 1), the value -> -A (r - 1) plus the constant -2 A / tau
    logp, old, adv, mask = _batch(6, spread=0.6)
    tau = 1e-5
    loss, g, st = _grad(sapo_loss, logp, old, adv, mask, tau_pos=tau, tau_neg=tau, aggregation=aggregation, max_len=9)
    a = adv.unsqueeze(-1).expand_as(logp)

    def unclipped(x):  # the IS surrogate -A r with no clip at all
        return aggregate_loss(-a * torch.exp(torch.where(mask.bool(), x - old, 0.0)), mask, aggregation, 9), {}

    want, g_want, _ = _grad(unclipped, logp)
    offset = aggregate_loss(-a * 2 / tau, mask, aggregation, 9)  # the constant; minus -A * 1 of the r - 1
    assert (loss - offset).item() == pytest.approx((want + aggregate_loss(a, mask, aggregation, 9)).item(), abs=1e-6)
    torch.testing.assert_close(g, g_want, rtol=1e-8, atol=1e-10)
    assert st["clipfrac"].item() < 1e-9  # the gate never closes


def test_sapo_large_temperature_moves_only_on_policy_tokens():
    # tau -> inf: w = 4 sigma (1 - sigma) of tau (r - 1) -> 0 for every r != 1 (a trust region of width ~ 1 / tau),
    # while r = 1 keeps w = 1: its gradient is REINFORCE's -A / n
    logp, old, adv, mask = _batch(7, spread=0.3)
    old = torch.where(torch.arange(7) % 2 == 0, logp, old)  # even positions on-policy (r = 1), odd ones not
    loss, g, st = _grad(sapo_loss, logp, old, adv, mask, tau_pos=1e4, tau_neg=1e4, aggregation="token_mean")
    n = int(mask.sum())
    on = mask.bool() & (torch.arange(7) % 2 == 0)
    off = mask.bool() & ~on
    torch.testing.assert_close(g[on], (-adv.unsqueeze(-1).expand_as(logp) / n)[on])
    assert torch.all(g[off].abs() < 1e-30) and torch.isfinite(loss)
    assert st["clipfrac"].item() == pytest.approx(int(off.sum()) / n)  # the off-policy tokens' gates are shut


def test_sapo_extreme_log_ratios_stay_finite_in_float32():
    # log r = +100 / -100 in float32 with NaN / inf padding: clamped to +-20 first; r = e^20: the gate is shut
    # (sigma = 1 in float32, w = 0); r = e^-20 ~ 2e-9: sigma(-tau) stays finite; nothing is NaN
    logp, old = torch.tensor([[50.0, -50.0, math.nan]]), torch.tensor([[-50.0, 50.0, math.inf]])
    for a in (1.0, -1.0):
        loss, g, st = _grad(sapo_loss, logp, old, torch.tensor([a]), torch.tensor([[1, 1, 0]]))
        assert loss.dtype == torch.float32 and _finite(loss, g, st) and g[0, 2] == 0 and g[0, 0] == 0


# ────────────────────────────────────────────────────── GMPO ──────────────────────────────────────────────────────
def test_gmpo_hand_values_and_gradient():
    # log r = [0.5, 0, -1], range (-0.4, 0.4) in log space (the defaults), one row of 3 tokens
    logp, old, mask = torch.tensor([[-0.5, -1.0, -2.0]]), torch.full((1, 3), -1.0), torch.ones(1, 3)
    # A = +1: the smaller of log r and its clip per token: [min(0.5, 0.4), 0, min(-1, -0.4)] = [0.4, 0, -1];
    # s = exp(-0.6 / 3) = e^-0.2; loss -A s = -e^-0.2; d/d log pi = -A s / 3 on the unclipped tokens, 0 on token 0
    loss, g, st = _grad(gmpo_loss, logp, old, torch.tensor([1.0]), mask)
    s = math.exp(-0.2)
    assert loss.item() == pytest.approx(-s)
    torch.testing.assert_close(g, torch.tensor([[0.0, -s / 3, -s / 3]]))
    assert st["clipfrac"].item() == pytest.approx(1 / 3)
    assert st["ratio_mean"].item() == pytest.approx((math.exp(0.5) + 1 + math.exp(-1)) / 3)
    # A = -1: the larger one: [max(0.5, 0.4), 0, max(-1, -0.4)] = [0.5, 0, -0.4]; s = exp(0.1 / 3); loss +s;
    # gradient s / 3 on tokens 0 and 1, 0 on the clipped token 2
    loss, g, st = _grad(gmpo_loss, logp, old, torch.tensor([-1.0]), mask)
    s = math.exp(0.1 / 3)
    assert loss.item() == pytest.approx(s)
    torch.testing.assert_close(g, torch.tensor([[s / 3, s / 3, 0.0]]))
    assert st["clipfrac"].item() == pytest.approx(1 / 3)
    # asymmetric range (clip_high 0.6): token 0's 0.5 is no longer clipped for A = +1: s = exp(-0.5 / 3)
    loss, g, _ = _grad(gmpo_loss, logp, old, torch.tensor([1.0]), mask, clip_low=0.4, clip_high=0.6)
    assert loss.item() == pytest.approx(-math.exp(-0.5 / 3)) and torch.all(g != 0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_gmpo_matches_slow_loop_value_and_gradient(aggregation, seed):
    logp, old, adv, mask = _batch(seed, spread=0.6)  # log-ratios ~ 0.6 sigma: many outside (-0.3, 0.25)
    adv_tok = adv.unsqueeze(-1) + 0.1 * torch.randn(logp.shape, dtype=logp.dtype,
                                                    generator=torch.Generator().manual_seed(seed))
    lo, hi = 0.3, 0.25

    def slow(x):  # per row: the pessimistic clipped log-ratio per token, their mean, exp, times -A (the row mean)
        terms = [[] for _ in range(x.shape[0])]
        for i, n in _rows(mask):
            a = sum(float(adv_tok[i, t]) for t in range(n)) / n
            logs = []
            for t in range(n):
                lr = x[i, t] - old[i, t]
                cl = torch.clamp(lr, -lo, hi)
                lr_, cl_ = lr.item(), cl.item()
                logs.append(lr if (a > 0 and lr_ <= cl_) or (a < 0 and lr_ >= cl_) else cl)
            s = torch.exp(torch.stack(logs).mean())
            terms[i] = [-a * s] * n  # the sequence loss on each of its tokens
        return _reduce(terms, aggregation, 9)

    g = _matches_slow(slow, gmpo_loss, logp, old, adv_tok, mask, clip_low=lo, clip_high=hi,
                      aggregation=aggregation, max_len=9)
    assert torch.any(g[mask.bool()] == 0) and torch.all(g[~mask.bool()] == 0)  # clipped tokens lose their gradient


@pytest.mark.parametrize("eps_lo, eps_hi", [(0.4, 0.4), (0.2, 0.35)])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gmpo_on_one_token_responses_is_token_level_ppo(eps_lo, eps_hi, aggregation):
    # one token per row: s = exp(pessimistic clipped log r) = min / max(r, clip(r, e^-lo, e^hi)), so -A s is PPO's
    # max(-A r, -A clip(r, 1 - c_lo, 1 + c_hi)) with c_lo = 1 - e^-lo, c_hi = e^hi - 1; same value and gradient
    g = torch.Generator().manual_seed(8)
    logp = -torch.rand(12, 3, generator=g, dtype=torch.float64) * 3
    old = logp + 0.6 * torch.randn(12, 3, generator=g, dtype=torch.float64)  # both clip ends reached
    adv = torch.randn(12, generator=g, dtype=torch.float64)
    mask = torch.zeros(12, 3, dtype=torch.long)
    mask[:, 0] = 1  # one response token per row, padding after it
    mask[11, 0] = 0  # and one row without tokens
    kw = {"aggregation": aggregation, "max_len": 3}
    gm, g_gm, st_gm = _grad(gmpo_loss, logp, old, adv, mask, clip_low=eps_lo, clip_high=eps_hi, **kw)
    ppo, g_ppo, st_ppo = _grad(POLICY_LOSSES["ppo"].fn, logp, old, adv, mask, clip_low=1 - math.exp(-eps_lo),
                               clip_high=math.exp(eps_hi) - 1, **kw)
    assert gm.item() == pytest.approx(ppo.item(), rel=1e-12)
    torch.testing.assert_close(g_gm, g_ppo)
    assert st_gm["clipfrac"].item() == pytest.approx(st_ppo["clipfrac"].item()) and 0 < st_gm["clipfrac"] < 1


def test_gmpo_without_clipping_is_the_geometric_mean_ratio_of_gspo():
    # a range wider than every log-ratio: s is GSPO's length-normalised ratio exp(mean log r), unclipped
    logp, old, adv, mask = _batch(9, spread=0.3)
    gm, g_gm, _ = _grad(gmpo_loss, logp, old, adv, mask, clip_low=50.0, clip_high=50.0)
    gs, g_gs, _ = _grad(POLICY_LOSSES["gspo"].fn, logp, old, adv, mask, clip_low=0.999, clip_high=1e9)
    assert gm.item() == pytest.approx(gs.item(), rel=1e-12)
    torch.testing.assert_close(g_gm, g_gs)


@pytest.mark.parametrize("wide", [False, True])
def test_gmpo_extreme_log_ratios_stay_finite_in_float32(wide):
    # log r = +100 / -100 in float32 with NaN / inf padding: clamped to +-20 before anything; the default range
    # clips them to +-0.4, a range of 1e3 leaves +-20, whose mean 0 gives s = 1; nothing is NaN either way
    logp, old = torch.tensor([[50.0, -50.0, math.nan]]), torch.tensor([[-50.0, 50.0, math.inf]])
    kw = {"clip_low": 1e3, "clip_high": 1e3} if wide else {}
    for a in (1.0, -1.0):
        loss, g, st = _grad(gmpo_loss, logp, old, torch.tensor([a]), torch.tensor([[1, 1, 0]]), **kw)
        assert loss.dtype == torch.float32 and _finite(loss, g, st) and g[0, 2] == 0
    _, g, _ = _grad(gmpo_loss, torch.tensor([[50.0]]), torch.tensor([[-50.0]]), torch.tensor([1.0]),
                    torch.ones(1, 1), clip_low=1e3, clip_high=1e3)
    assert torch.isfinite(g).all()  # s = e^20 ~ 4.9e8: large, finite


# ─────────────────────────────────────────── shared edge cases of the three ───────────────────────────────────────────
LOSSES = [pytest.param(cispo_loss, {"clip_low": 0.2, "clip_high": 0.28}, id="cispo"),
          pytest.param(sapo_loss, {}, id="sapo"), pytest.param(gmpo_loss, {}, id="gmpo")]


@pytest.mark.parametrize("fn, kw", LOSSES)
def test_ties_empty_rows_and_empty_batch(fn, kw):
    logp, old, adv, mask = _batch(3)
    # a tied group: every advantage 0 -> loss exactly 0 and no gradient anywhere (GMPO: sgn(0) = 0 too)
    loss, g, _ = _grad(fn, logp, old, torch.zeros_like(adv), mask, **kw)
    assert loss.item() == 0.0 and torch.all(g == 0)
    # the row without tokens (row 4, NaN padding) changes nothing: same loss as the batch without it
    for aggregation in ("token_mean", "seq_mean_token_mean"):
        full, g, _ = _grad(fn, logp, old, adv, mask, aggregation=aggregation, **kw)
        part, _, _ = _grad(fn, logp[:4], old[:4], adv[:4], mask[:4], aggregation=aggregation, **kw)
        assert full.item() == pytest.approx(part.item(), rel=1e-12) and torch.all(g[4] == 0)
    # an all-empty batch: loss 0, gradient 0, stats finite
    loss, g, st = _grad(fn, logp, old, adv, torch.zeros_like(mask), **kw)
    assert loss.item() == 0.0 and torch.all(g == 0) and _finite(loss, g, st)


@pytest.mark.parametrize("fn, kw", LOSSES)
def test_float32_agrees_with_float64(fn, kw):
    logp, old, adv, mask = _batch(4, spread=0.6)
    l64, g64, _ = _grad(fn, logp, old, adv, mask, **kw)
    l32, g32, _ = _grad(fn, logp.float(), old.float(), adv.float(), mask, **kw)
    assert l32.dtype == torch.float32 and g32.dtype == torch.float32
    assert l32.item() == pytest.approx(l64.item(), rel=1e-5)
    torch.testing.assert_close(g32, g64.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, fn, defaults, changed", [
    ("cispo", cispo_loss, {"clip_low": None, "clip_high": 4.0}, {"clip_low": 0.2, "clip_high": 0.28}),
    ("sapo", sapo_loss, {"tau_pos": 1.0, "tau_neg": 1.05}, {"tau_pos": 0.5, "tau_neg": 2.0}),
    ("gmpo", gmpo_loss, {"clip_low": 0.4, "clip_high": 0.4}, {"clip_low": 0.2, "clip_high": 0.3}),
])
def test_registry_entry_section_defaults_and_overrides(name, fn, defaults, changed):
    from rlhfkit.config import OnlineAlgoConfig, build_config

    spec = POLICY_LOSSES[name]
    assert spec.fn is fn and spec.section == name
    assert dataclasses.asdict(getattr(OnlineAlgoConfig(), name)) == defaults  # the papers' values
    cfg = build_config("grpo", {}, [f"algo.policy_loss={name}", *(f"algo.{name}.{k}={v}" for k, v in changed.items())])
    logp, old, adv, mask = _batch(5, spread=0.6)
    via, _ = spec(logp, old, adv, mask, getattr(cfg.algo, name), aggregation="token_mean")
    assert torch.equal(via, fn(logp, old, adv, mask, **changed, aggregation="token_mean")[0])


def test_trl_clip_names_reach_cispo_and_gmpo_and_sapo_refuses_them(monkeypatch):
    from rlhfkit.config import aliases, build_config
    from rlhfkit.errors import ConfigError

    monkeypatch.setattr(aliases, "_ALIASES_LOGGED", set())  # aliases are logged once per process: leave it unlogged
    # TRL's epsilon / epsilon_high go on to the chosen loss's section (GMPO's range is in log space)
    assert build_config("grpo", {}, ["algo.policy_loss=cispo", "epsilon_high=0.5"]).algo.cispo.clip_high == 0.5
    assert build_config("grpo", {}, ["algo.policy_loss=gmpo", "epsilon=0.3"]).algo.gmpo.clip_low == 0.3
    # SAPO has no clip range: epsilon is refused with the loss's own settings named; a temperature must be > 0
    with pytest.raises(ConfigError, match="algo.sapo.tau_pos"):
        build_config("grpo", {}, ["algo.policy_loss=sapo", "epsilon=0.2"])
    with pytest.raises(ConfigError, match="algo.sapo.tau_neg"):
        build_config("grpo", {}, ["algo.policy_loss=sapo", "algo.sapo.tau_neg=0"])
