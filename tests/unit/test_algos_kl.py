"""KL estimators k1 / k2 / k3 and KL-coefficient controllers."""

import math

import pytest
import torch

from rlhfkit.algos import KL_ESTIMATORS, AdaptiveKLController, FixedKLController, kl_penalty

LOGP = torch.tensor([[0.0, 1.0, -1.0, 2.0]])
REF = torch.zeros(1, 4)


def test_k1_k2_k3_closed_forms():
    # log_ratio = [0, 1, -1, 2]
    # k1 = log_ratio; k2 = 0.5 * log_ratio^2 = [0, .5, .5, 2]
    # k3 = e^-lr - 1 + lr = [0, e^-1, e - 2, e^-2 + 1]
    torch.testing.assert_close(kl_penalty(LOGP, REF, "k1"), LOGP)
    torch.testing.assert_close(kl_penalty(LOGP, REF, "k2"), torch.tensor([[0.0, 0.5, 0.5, 2.0]]))
    expected_k3 = torch.tensor([[0.0, math.exp(-1), math.e - 2, math.exp(-2) + 1]])
    torch.testing.assert_close(kl_penalty(LOGP, REF, "k3"), expected_k3)
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}


def test_k3_nonnegative_and_k2_nonnegative():
    g = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(64, 32, generator=g) * 2, torch.randn(64, 32, generator=g) * 2
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    assert (kl_penalty(logp, ref, "k2") >= 0).all()
    # tiny ratios too (expm1 keeps precision near 0)
    assert (kl_penalty(torch.full((5,), 1e-7), torch.zeros(5), "k3") >= 0).all()


def test_k1_and_k3_are_unbiased_exact_expectation():
    # Expectation under pi over a 6-token vocabulary, summed exactly:
    # sum_x pi(x) * k(x) must equal KL(pi || ref) = sum_x pi log(pi / ref) for k1 and k3
    # (k3: sum pi (ref/pi - 1 - log(ref/pi)) = sum ref - 1 + KL = KL).
    g = torch.Generator().manual_seed(1)
    logpi = torch.log_softmax(torch.randn(6, generator=g, dtype=torch.float64), -1)
    logref = torch.log_softmax(torch.randn(6, generator=g, dtype=torch.float64), -1)
    kl = (logpi.exp() * (logpi - logref)).sum()
    for est in ("k1", "k3"):
        assert (logpi.exp() * kl_penalty(logpi, logref, est)).sum().item() == pytest.approx(
            kl.item(), rel=1e-10
        )


def test_mask_and_clip():
    mask = torch.tensor([[1, 1, 0, 0]])
    torch.testing.assert_close(kl_penalty(LOGP, REF, "k1", mask=mask), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    # log_ratio clipped to [-0.5, 0.5]: k1 = [0, .5, -.5, .5]
    torch.testing.assert_close(
        kl_penalty(LOGP, REF, "k1", log_ratio_clip=0.5), torch.tensor([[0.0, 0.5, -0.5, 0.5]])
    )


def test_unknown_estimator():
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(LOGP, REF, "k4")


def test_pure():
    a, b = LOGP.clone(), REF.clone()
    for est in KL_ESTIMATORS:
        kl_penalty(a, b, est, mask=torch.ones(1, 4), log_ratio_clip=1.0)
    assert torch.equal(a, LOGP) and torch.equal(b, REF)


def test_adaptive_kl_controller_hand_values():
    ctl = AdaptiveKLController(init_coef=0.2, target=6.0, horizon=10000)
    # KL 9: error = 9/6 - 1 = 0.5, clipped to 0.2 -> coef = 0.2 * (1 + 0.2 * 256 / 10000) = 0.201024
    assert ctl.update(9.0, n_steps=256) == pytest.approx(0.201024)
    assert ctl.value == pytest.approx(0.201024)
    # KL 5.4 (a tensor is accepted): error = 5.4/6 - 1 = -0.1 -> coef *= 1 - 0.1 * 256 / 10000 = 0.99744
    ctl.update(torch.tensor(5.4), n_steps=256)
    assert ctl.value == pytest.approx(0.201024 * 0.99744)
    # very low KL: error clipped to -0.2 -> coef *= 1 - 0.2 * 10000 / 10000 = 0.8
    v = ctl.value
    ctl.update(0.0, n_steps=10000)
    assert ctl.value == pytest.approx(0.8 * v)


def test_controllers_state_dict_roundtrip():
    a = AdaptiveKLController(0.1, 6.0, 1000)
    a.update(12.0, 100)
    b = AdaptiveKLController(0.5, 6.0, 1000)
    b.load_state_dict(a.state_dict())
    assert b.value == a.value and b.target == a.target and b.horizon == a.horizon
    f = FixedKLController(0.05)
    assert f.update(100.0, 10) == 0.05 and f.value == 0.05
    g = FixedKLController(1.0)
    g.load_state_dict(f.state_dict())
    assert g.value == 0.05
