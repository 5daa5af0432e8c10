"""DPO family, SimPO, ORPO, KTO: hand values, and agreement with independent reference formulations."""

import math

import pytest
import torch
import torch.nn.functional as F

from rlhfkit.algos import (
    PREFERENCE_LOSSES,
    dpo_loss,
    kto_kl_estimate,
    kto_loss,
    orpo_loss,
    simpo_loss,
)

REWARD_KEYS = {
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
}


def _t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def _neg_log_sigmoid(x: float) -> float:
    """-log(1 / (1 + e^-x)) = log(1 + e^-x), written without torch."""
    return math.log1p(math.exp(-x)) if x > -30 else -x


def _detached(stats):
    return all(not v.requires_grad and v.dim() == 0 for v in stats.values())


# ------------------------------------------------------------------ hand values
def test_dpo_hand_value_and_stats():
    # pi_c - ref_c = -1 - (-2) = 1; pi_r - ref_r = -3 - (-2) = -1 -> h = 2
    # beta = 0.1: -log sig(0.2) = 0.598139
    loss, stats = dpo_loss(_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.0), beta=0.1)
    assert loss.item() == pytest.approx(0.5981388694)
    assert set(stats) == REWARD_KEYS and _detached(stats)
    # rewards: beta * 1 = 0.1 and beta * -1 = -0.1; margin 0.2; chosen > rejected
    assert stats["rewards/chosen"].item() == pytest.approx(0.1)
    assert stats["rewards/rejected"].item() == pytest.approx(-0.1)
    assert stats["rewards/margins"].item() == pytest.approx(0.2)
    assert stats["rewards/accuracies"].item() == 1.0
    assert stats["logps/chosen"].item() == -1.0 and stats["logps/rejected"].item() == -3.0


def test_cdpo_label_smoothing_hand_value():
    # h = 2, beta = 0.1, eps = 0.1: 0.9 * -log sig(0.2) + 0.1 * -log sig(-0.2)
    #   = 0.9 * 0.598139 + 0.1 * (0.598139 + 0.2) = 0.618139
    loss, _ = dpo_loss(_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.0), beta=0.1, label_smoothing=0.1)
    assert loss.item() == pytest.approx(0.6181388694)
    loss_reg, _ = PREFERENCE_LOSSES["cdpo"].fn(_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.0), beta=0.1)
    assert loss_reg.item() == pytest.approx(0.6181388694)


def test_ipo_hand_value():
    # h = 2, beta = 0.1: (h - 1 / (2 * 0.1))^2 = (2 - 5)^2 = 9
    loss, _ = dpo_loss(_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.0), beta=0.1, loss_type="ipo")
    assert loss.item() == pytest.approx(9.0)
    # beta = 0.5: (2 - 1)^2 = 1
    loss, _ = PREFERENCE_LOSSES["ipo"].fn(_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.0), beta=0.5)
    assert loss.item() == pytest.approx(1.0)
    with pytest.raises(ValueError):
        dpo_loss(_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.0), loss_type="ipo", label_smoothing=0.1)
    with pytest.raises(ValueError, match="hinge"):
        dpo_loss(_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.0), loss_type="hinge")


def test_simpo_hand_value():
    # beta = 2, gamma = 0.5, avg_c = -1, avg_r = -1.5: 2 * (-1) - 2 * (-1.5) - 0.5 = 0.5 -> -log sig(0.5) = 0.474077
    loss, stats = simpo_loss(_t(-1.0), _t(-1.5), beta=2.0, gamma=0.5)
    assert loss.item() == pytest.approx(0.4740769842)
    assert set(stats) == REWARD_KEYS and _detached(stats)
    # rewards = beta * avg logp: -2 and -3
    assert stats["rewards/chosen"].item() == pytest.approx(-2.0)
    assert stats["rewards/rejected"].item() == pytest.approx(-3.0)
    # gamma = 0: -log sig(1) = 0.313262
    assert simpo_loss(_t(-1.0), _t(-1.5), beta=2.0, gamma=0.0)[0].item() == pytest.approx(0.3132616875)


def test_orpo_hand_value():
    # avg_c = log 0.5 -> odds 0.5 / 0.5 = 1, log odds 0; avg_r = log 0.2 -> odds 0.25, log odds -log 4
    # log odds ratio = log 4 -> log sig(log 4) = log(4 / 5) = -0.223144
    # L = NLL 1.0 + 0.1 * 0.223144 = 1.0223144
    loss, stats = orpo_loss(
        _t(math.log(0.5)), _t(math.log(0.2)), torch.tensor(1.0, dtype=torch.float64), lam=0.1
    )
    assert loss.item() == pytest.approx(1.0 + 0.1 * -math.log(0.8))
    assert stats["log_odds_ratio"].item() == pytest.approx(math.log(0.8))
    assert stats["log_odds_chosen"].item() == pytest.approx(math.log(4))
    assert stats["nll"].item() == pytest.approx(1.0)
    assert REWARD_KEYS <= set(stats) and _detached(stats)
    # rewards = lam * avg logp (TRL's convention)
    assert stats["rewards/chosen"].item() == pytest.approx(0.1 * math.log(0.5))


def test_orpo_log_odds_stable_at_extremes():
    # log p -> 0- (p -> 1) and log p very negative: no inf / nan, and finite gradients
    c = _t(-1e-9, -50.0).requires_grad_(True)
    r = _t(-60.0, -1e-6)
    loss, stats = orpo_loss(c, r, _t(1.0, 1.0), lam=1.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(c.grad).all()
    # pair 0: log odds_c = -1e-9 - log(1 - e^-1e-9) = -1e-9 - log(1e-9) ~ 20.72; log odds_r = -60 - log(1) = -60
    #   -> ratio ~ 80.7, log sig ~ 0
    # pair 1: log odds_c = -50 - log(1 - e^-50) = -50; log odds_r = -1e-6 - log(1e-6) ~ 13.8155
    #   -> ratio ~ -63.8155, log sig ~ -63.8155;  mean over the two pairs ~ -31.908
    expected = 0.5 * (-50 - (-1e-6 - math.log(-math.expm1(-1e-6))))
    assert stats["log_odds_ratio"].item() == pytest.approx(expected, rel=1e-6)


def test_kto_hand_values():
    # beta = 0.1, z0 = 0.5.  desirable r = 2.5: 1 - sig(0.1 * (2.5 - 0.5)) = 1 - sig(0.2) = 0.450166
    # undesirable r = -1.5: 1 - sig(0.1 * (0.5 - (-1.5))) = 1 - sig(0.2) = 0.450166
    # weights w_d = 1, w_u = 2: loss = (0.450166 + 2 * 0.450166) / 2 = 0.675249 (mean over the batch of 2)
    policy, ref = _t(-1.0, -4.0), _t(-3.5, -2.5)  # r = [2.5, -1.5]
    labels = torch.tensor([True, False])
    loss, stats = kto_loss(
        policy, ref, labels, _t(0.5)[0], beta=0.1, desirable_weight=1.0, undesirable_weight=2.0
    )
    one_minus_sig = 1 - 1 / (1 + math.exp(-0.2))
    assert loss.item() == pytest.approx(1.5 * one_minus_sig)
    # rewards = beta * r: 0.25 for the desirable one, -0.15 for the undesirable one
    assert stats["rewards/chosen"].item() == pytest.approx(0.25)
    assert stats["rewards/rejected"].item() == pytest.approx(-0.15)
    assert stats["kl"].item() == pytest.approx(0.5)
    assert stats["count/chosen"].item() == 1 and stats["count/rejected"].item() == 1
    assert _detached(stats)
    # a negative reference point is clamped to 0: desirable r = 2.5 -> 1 - sig(0.25)
    loss0, _ = kto_loss(policy[:1], ref[:1], labels[:1], _t(-3.0)[0], beta=0.1)
    assert loss0.item() == pytest.approx(1 - 1 / (1 + math.exp(-0.25)))


def test_kto_kl_estimate():
    # mean(pi - ref) = mean(-1 + 2, -2 + 2) = 0.5
    pi = _t(-1.0, -2.0).requires_grad_(True)
    z0 = kto_kl_estimate(pi, _t(-2.0, -2.0))
    assert z0.item() == pytest.approx(0.5) and not z0.requires_grad
    # mean(pi - ref) = -1 -> clamped to 0
    assert kto_kl_estimate(_t(-3.0), _t(-2.0)).item() == 0.0


def test_dpo_gradient_closed_form():
    # Rafailov et al. 2023 eq. 8: d L / d pi_c = -beta * sig(-beta h) (per example, divided by B for the mean)
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (torch.randn(5, generator=g, dtype=torch.float64) * 5 for _ in range(4))
    pc.requires_grad_(True)
    dpo_loss(pc, pr, rc, rr, beta=0.3)[0].backward()
    h = (pc - rc) - (pr - rr)
    torch.testing.assert_close(pc.grad, -0.3 * torch.sigmoid(-0.3 * h.detach()) / 5)


# ------------------------------------------------------------------ independent references on random inputs
def _random(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [-(torch.rand(n, generator=g, dtype=torch.float64) * 40 + 1) for _ in range(4)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dpo_family_vs_independent_references(seed):
    pc, pr, rc, rr = _random(seed=seed)
    beta, eps = 0.25, 0.2
    # DPO as a 2-way softmax cross-entropy with logits beta * (log-ratio chosen, log-ratio rejected), target 0
    logits = torch.stack([beta * (pc - rc), beta * (pr - rr)], dim=1)
    ce = F.cross_entropy(logits, torch.zeros(len(pc), dtype=torch.long))
    torch.testing.assert_close(dpo_loss(pc, pr, rc, rr, beta=beta)[0], ce)
    # cDPO: soft target (1 - eps, eps) in the same cross-entropy
    soft = F.cross_entropy(logits, torch.tensor([1 - eps, eps], dtype=torch.float64).expand(len(pc), 2))
    torch.testing.assert_close(dpo_loss(pc, pr, rc, rr, beta=beta, label_smoothing=eps)[0], soft)
    # IPO by a per-example Python loop
    ipo = sum(
        ((a - c) - (b - d) - 1 / (2 * beta)) ** 2
        for a, b, c, d in zip(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist())
    )
    torch.testing.assert_close(dpo_loss(pc, pr, rc, rr, beta=beta, loss_type="ipo")[0].item(), ipo / len(pc))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_simpo_orpo_kto_vs_slow_python_loop(seed):
    c, r, nll, other = _random(seed=seed)
    c, r = c / 20, r / 20  # average log-probs in (-2.05, -0.05)
    n = len(c)

    # SimPO: mean of log(1 + exp(-(beta c - beta r - gamma)))
    beta, gamma = 2.5, 0.8
    slow = sum(_neg_log_sigmoid(beta * a - beta * b - gamma) for a, b in zip(c.tolist(), r.tolist())) / n
    assert simpo_loss(c, r, beta=beta, gamma=gamma)[0].item() == pytest.approx(slow, rel=1e-10)

    # ORPO: log odds = log(p / (1 - p)) with p = exp(avg logp)
    lam = 0.3
    terms = []
    for a, b in zip(c.tolist(), r.tolist()):
        pa, pb = math.exp(a), math.exp(b)
        terms.append(_neg_log_sigmoid(math.log(pa / (1 - pa)) - math.log(pb / (1 - pb))))
    slow = sum(nll.tolist()) / n + lam * sum(terms) / n
    assert orpo_loss(c, r, nll, lam=lam)[0].item() == pytest.approx(slow, rel=1e-9)

    # KTO with a reference point from mismatched pairs, unequal weights, mixed labels
    beta, wd, wu = 0.1, 1.3, 0.7
    labels = torch.arange(n) % 3 != 0
    policy, ref = c * 20, other
    z0 = max(0.0, sum(p - q for p, q in zip(nll.tolist(), other.tolist())) / n)
    kl = kto_kl_estimate(nll, other)
    assert kl.item() == pytest.approx(z0)
    slow = 0.0
    for p, q, lab in zip(policy.tolist(), ref.tolist(), labels.tolist()):
        rew = p - q
        if lab:
            slow += wd * (1 - 1 / (1 + math.exp(-beta * (rew - z0))))
        else:
            slow += wu * (1 - 1 / (1 + math.exp(-beta * (z0 - rew))))
    out, _ = kto_loss(policy, ref, labels, kl, beta=beta, desirable_weight=wd, undesirable_weight=wu)
    assert out.item() == pytest.approx(slow / n, rel=1e-10)


# ------------------------------------------------------------------ registry and purity
def test_preference_registry():
    assert set(PREFERENCE_LOSSES) == {"dpo", "ipo", "cdpo", "simpo", "orpo", "kto"}
    assert {n for n, p in PREFERENCE_LOSSES.items() if p.needs_reference} == {"dpo", "ipo", "cdpo", "kto"}
    assert {n for n, p in PREFERENCE_LOSSES.items() if not p.paired} == {"kto"}
    assert {n for n, p in PREFERENCE_LOSSES.items() if p.length_normalised} == {"simpo", "orpo"}
    pc, pr, rc, rr = _random()
    torch.testing.assert_close(PREFERENCE_LOSSES["dpo"].fn(pc, pr, rc, rr)[0], dpo_loss(pc, pr, rc, rr)[0])


def test_preference_losses_are_pure():
    pc, pr, rc, rr = _random()
    labels = torch.arange(16) % 2 == 0
    saved = [t.clone() for t in (pc, pr, rc, rr, labels)]
    dpo_loss(pc, pr, rc, rr, label_smoothing=0.1)
    dpo_loss(pc, pr, rc, rr, loss_type="ipo")
    simpo_loss(pc / 40, pr / 40)
    orpo_loss(pc / 40, pr / 40, rc)
    kto_loss(pc, pr, labels, kto_kl_estimate(rc, rr))
    for a, b in zip((pc, pr, rc, rr, labels), saved):
        assert torch.equal(a, b)
