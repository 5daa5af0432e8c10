"""On-policy distillation's estimator: the teacher's per-token reward and the ``distill`` advantage estimator.

Checked against hand values, a slow per-token loop, the exact reverse-KL gradient of a categorical (the policy
gradient with these advantages is minus the gradient of KL(student || teacher)), masks, extreme log-probs, dtypes.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.algos import ADVANTAGE_ESTIMATORS, reinforce_pp_returns, teacher_token_rewards

DISTILL = ADVANTAGE_ESTIMATORS["distill"]


def _advantages(teacher, student, mask, gamma=0.0, coef=1.0, task=None):
    rewards = teacher_token_rewards(teacher, student, mask, coef)
    if task is not None:
        rewards = rewards + task
    adv, returns = DISTILL.fn(rewards, mask, values=None, group_size=1, gamma=gamma, lam=1.0)
    assert returns is None
    return adv


def test_registry_entry():
    assert not DISTILL.needs_critic and not DISTILL.group_based and DISTILL.needs_teacher
    assert not any(e.needs_teacher for name, e in ADVANTAGE_ESTIMATORS.items() if name != "distill")


def test_hand_values_and_discount():
    teacher = torch.tensor([[-1.0, -2.0, -0.5, -9.0]])
    student = torch.tensor([[-2.0, -1.0, -0.5, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last position is padding
    # teacher - student: [1, -1, 0, (masked)]
    torch.testing.assert_close(teacher_token_rewards(teacher, student, mask), torch.tensor([[1.0, -1.0, 0.0, 0.0]]))
    torch.testing.assert_close(teacher_token_rewards(teacher, student, mask, coef=0.5),
                               torch.tensor([[0.5, -0.5, 0.0, 0.0]]))
    # gamma 0: each token's own log-ratio
    torch.testing.assert_close(_advantages(teacher, student, mask, 0.0), torch.tensor([[1.0, -1.0, 0.0, 0.0]]))
    # gamma 1: return-to-go [1 - 1 + 0, -1 + 0, 0]
    torch.testing.assert_close(_advantages(teacher, student, mask, 1.0), torch.tensor([[0.0, -1.0, 0.0, 0.0]]))
    # gamma 0.5: A2 = 0, A1 = -1 + 0.5 * 0 = -1, A0 = 1 + 0.5 * -1 = 0.5
    torch.testing.assert_close(_advantages(teacher, student, mask, 0.5), torch.tensor([[0.5, -1.0, 0.0, 0.0]]))


def test_mix_with_task_score_on_last_token():
    teacher, student = torch.tensor([[-1.0, -1.0]]), torch.tensor([[-1.5, -0.5]])  # log-ratios [0.5, -0.5]
    mask = torch.ones(1, 2)
    task = torch.tensor([[0.0, 2.0]])  # a score of 2 on the last token (shaped_token_rewards puts it there)
    # coef 0.1, gamma 1: token rewards [0.05, -0.05 + 2]; returns [2.0, 1.95]
    torch.testing.assert_close(_advantages(teacher, student, mask, 1.0, coef=0.1, task=task),
                               torch.tensor([[2.0, 1.95]]))


def _slow(teacher, student, mask, gamma, coef, clip):
    """One token at a time, in plain Python floats."""
    out = torch.zeros_like(teacher)
    for b in range(teacher.shape[0]):
        running = 0.0
        for t in reversed(range(teacher.shape[1])):
            if mask[b, t]:
                r = coef * max(-clip, min(clip, float(teacher[b, t]) - float(student[b, t])))
                running = r + gamma * running
                out[b, t] = running
    return out


@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
def test_equals_slow_loop_with_holes_in_the_mask(gamma):
    g = torch.Generator().manual_seed(0)
    B, T = 6, 9
    teacher = -torch.rand(B, T, generator=g) * 30  # some log-ratios beyond the clamp of 20
    student = -torch.rand(B, T, generator=g) * 5
    mask = (torch.rand(B, T, generator=g) > 0.3).float()  # holes (environment tokens) and padding
    mask[2] = 0  # a dropped sample
    fast = _advantages(teacher, student, mask, gamma, coef=0.7)
    torch.testing.assert_close(fast, _slow(teacher, student, mask, gamma, 0.7, 20.0))
    assert torch.all(fast[2] == 0)


def test_policy_gradient_is_minus_the_reverse_kl_gradient():
    """For a categorical student s = softmax(z) and a fixed teacher t, the expected policy gradient with advantage
    log t(y) - log s(y) (detached) is sum_y s(y) A(y) grad log s(y) = -grad KL(s || t), since E_s[grad log s] = 0."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    log_t = torch.log_softmax(torch.randn(7, generator=g, dtype=torch.float64), -1)
    log_s = torch.log_softmax(z, -1)
    adv = teacher_token_rewards(log_t.unsqueeze(0), log_s.detach().unsqueeze(0), torch.ones(1, 7)).squeeze(0)
    (pg,) = torch.autograd.grad((log_s.exp().detach() * adv * log_s).sum(), z, retain_graph=True)
    kl = (log_s.exp() * (log_s - log_t)).sum()
    (kl_grad,) = torch.autograd.grad(kl, z)
    torch.testing.assert_close(pg, -kl_grad)


def test_gradient_wrt_student_logprobs():
    teacher = torch.tensor([[-1.0, -50.0, -1.0]])
    student = torch.tensor([[-2.0, -1.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    teacher_token_rewards(teacher, student, mask, coef=2.0).sum().backward()
    # d/ds of 2 * (t - s) = -2 inside the clamp; 0 where clamped (-49 < -20) and where masked
    torch.testing.assert_close(student.grad, torch.tensor([[-2.0, 0.0, 0.0]]))


def test_extreme_log_probs_stay_finite():
    inf = math.inf
    teacher = torch.tensor([[-inf, -inf, 0.0, -1e30, -1.0]])
    student = torch.tensor([[-1.0, -inf, -inf, 0.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    rewards = teacher_token_rewards(teacher, student, mask, log_ratio_clip=20.0)
    # -inf - (-1) -> -20; -inf - -inf = NaN -> 0; 0 - -inf -> +20; -1e30 -> -20
    torch.testing.assert_close(rewards, torch.tensor([[-20.0, 0.0, 20.0, -20.0, 0.0]]))
    unclamped = teacher_token_rewards(teacher[:, 3:], student[:, 3:], mask[:, 3:], log_ratio_clip=None)
    assert unclamped[0, 0] == -1e30
    adv = _advantages(teacher, student, mask, gamma=1.0)
    assert torch.isfinite(adv).all()


def test_masked_nan_never_leaks_and_empty_mask():
    nan = math.nan
    teacher = torch.tensor([[nan, -1.0], [-1.0, -1.0]])
    student = torch.tensor([[-1.0, nan], [-2.0, -2.0]])
    mask = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    assert torch.all(teacher_token_rewards(teacher, student, mask) == 0)
    assert torch.all(_advantages(teacher, student, mask, 1.0) == 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_inputs_give_float32(dtype):
    teacher = torch.tensor([[-1.0, -3.0]], dtype=dtype)
    student = torch.tensor([[-2.0, -1.0]], dtype=dtype)
    out = teacher_token_rewards(teacher, student, torch.ones(1, 2))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[1.0, -2.0]]))


def test_distill_estimator_is_the_unwhitened_return():
    g = torch.Generator().manual_seed(3)
    rewards, mask = torch.randn(4, 6, generator=g), (torch.rand(4, 6, generator=g) > 0.2).float()
    adv, _ = DISTILL.fn(rewards, mask, values=None, group_size=1, gamma=0.8, lam=0.95)
    torch.testing.assert_close(adv, reinforce_pp_returns(rewards, mask, 0.8))
