"""Advantage estimators: hand values and fast-vs-slow-loop references."""

import math

import pytest
import torch

from rlhfkit.algos import (
    ADVANTAGE_ESTIMATORS,
    gae,
    group_all_tied,
    grpo_advantages,
    masked_mean,
    masked_var,
    reinforce_pp_advantages,
    reinforce_pp_returns,
    rloo_advantages,
)


def _slow_gae(rewards, values, mask, gamma, lam):
    """Per-sequence Python loop over the valid positions only (the plain textbook recursion)."""
    B, T = rewards.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        idx = [t for t in range(T) if mask[b, t]]
        last = 0.0
        for n in reversed(range(len(idx))):
            t = idx[n]
            next_v = float(values[b, idx[n + 1]]) if n + 1 < len(idx) else 0.0
            delta = float(rewards[b, t]) + gamma * next_v - float(values[b, t])
            last = delta + gamma * lam * last
            adv[b, t] = last
    return adv.float()


def _ragged(B, T, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g)
    values = torch.randn(B, T, generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    return rewards, values, mask


def test_gae_hand_values():
    # gamma = lam = 1: A_t = sum_{l>=t} r_l - V_t (the sum telescopes) = 1 - 0.5; returns = 1
    adv, ret = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.full((1, 3), 0.5), torch.ones(1, 3), 1.0, 1.0)
    torch.testing.assert_close(adv, torch.full((1, 3), 0.5))
    torch.testing.assert_close(ret, torch.ones(1, 3))
    # gamma = lam = 0.5, r = [0, 1], V = [0.2, 0.4]:
    # delta_1 = 1 + 0 - 0.4 = 0.6 -> A_1 = 0.6; delta_0 = 0 + 0.5 * 0.4 - 0.2 = 0 -> A_0 = 0.25 * 0.6 = 0.15
    adv, ret = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.2, 0.4]]), torch.ones(1, 2), 0.5, 0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.15, 0.6]]))
    torch.testing.assert_close(ret, torch.tensor([[0.35, 1.0]]))


def test_gae_matches_slow_loop_with_ragged_lengths():
    rewards, values, mask = _ragged(5, 9, [9, 1, 4, 6, 3])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    expected = _slow_gae(rewards, values, mask, 0.9, 0.8)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, (expected + values) * mask)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)


def test_gae_ignores_garbage_after_eos_and_skips_holes():
    rewards, values, mask = _ragged(3, 6, [6, 2, 4], seed=1)
    mask[0, 2] = 0  # a hole inside row 0 (e.g. tool output): stepped over
    adv, _ = gae(rewards, values, mask, 0.95, 0.9)
    torch.testing.assert_close(adv, _slow_gae(rewards, values, mask, 0.95, 0.9))
    # changing values / rewards where the mask is 0 changes nothing
    noisy_r = torch.where(mask.bool(), rewards, torch.full_like(rewards, 1e3))
    noisy_v = torch.where(mask.bool(), values, torch.full_like(values, -1e3))
    adv2, _ = gae(noisy_r, noisy_v, mask, 0.95, 0.9)
    torch.testing.assert_close(adv2, adv)


def test_grpo_hand_values_and_dr_grpo():
    # k = 2, P = 2, completion-major: prompt 0 has [1, 3] (indices 0, 2), prompt 1 has [0, 0] (indices 1, 3)
    # prompt 0: mean 2, unbiased std sqrt(((1-2)^2 + (3-2)^2) / 1) = sqrt(2) -> -+1/sqrt(2); prompt 1: 0 / eps = 0
    scores = torch.tensor([1.0, 0.0, 3.0, 0.0])
    s = 1 / (math.sqrt(2) + 1e-6)
    torch.testing.assert_close(grpo_advantages(scores, 2), torch.tensor([-s, 0.0, s, 0.0]))
    # Dr. GRPO: r - mean only -> [-1, 0, 1, 0] (= +- half the difference for k = 2)
    torch.testing.assert_close(
        grpo_advantages(scores, 2, scale_by_std=False), torch.tensor([-1.0, 0.0, 1.0, 0.0])
    )
    # k = 3, one prompt, scores [1, 2, 6]: mean 3, unbiased std sqrt((4 + 1 + 9) / 2) = sqrt(7)
    out = grpo_advantages(torch.tensor([1.0, 2.0, 6.0]), 3, eps=0.0)
    torch.testing.assert_close(out, torch.tensor([-2.0, -1.0, 3.0]) / math.sqrt(7))


def test_rloo_required_case():
    # k = 4, P = 3, completion-major: index i * 3 + j = completion i of prompt j
    scores = torch.tensor([1.0, 2, 3, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    adv = rloo_advantages(scores, group_size=4)
    # index 0 = completion 0 of prompt 0; prompt 0 has scores 1, 2, 5, 8 -> 1 - (2 + 5 + 8) / 3 = -4
    assert abs(adv[0].item() - (-4.0)) < 1e-6
    # index 7 = completion 2 of prompt 1; prompt 1 has 2, 3, 6, 9 -> 6 - (2 + 3 + 9) / 3 = 4/3
    assert abs(adv[7].item() - 4.0 / 3.0) < 1e-6
    # RLOO = k / (k - 1) * (r - group mean), and sums to 0 per prompt
    torch.testing.assert_close(adv, 4 / 3 * grpo_advantages(scores, 4, scale_by_std=False))
    torch.testing.assert_close(adv.reshape(4, 3).sum(0), torch.zeros(3))


def test_rloo_k2():
    # k = 2: the other completion's reward is the baseline -> A = +-(r_1 - r_2), the full difference
    # (Dr. GRPO's r - mean gives +- half the difference: see test_grpo_hand_values_and_dr_grpo)
    scores = torch.tensor([1.0, 5.0, 4.0, 2.0])  # prompt 0: [1, 4]; prompt 1: [5, 2]
    torch.testing.assert_close(rloo_advantages(scores, 2), torch.tensor([-3.0, 3.0, 3.0, -3.0]))


def test_group_shape_errors():
    with pytest.raises(ValueError):
        rloo_advantages(torch.ones(5), 2)
    with pytest.raises(ValueError):
        rloo_advantages(torch.ones(4), 1)
    with pytest.raises(ValueError):
        grpo_advantages(torch.ones(4, 1), 2)


def test_group_all_tied():
    # k = 3, P = 2: prompt 0 -> [1, 1, 1] (tied), prompt 1 -> [0, 1, 2]
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 2.0])
    out = group_all_tied(scores, 3)
    assert out.dtype == torch.bool
    assert out.tolist() == [True, False, True, False, True, False]
    assert group_all_tied(torch.tensor([1.0, 1.05]), 2, atol=0.1).tolist() == [True, True]


def _slow_returns(rewards, mask, gamma):
    B, T = rewards.shape
    out = torch.zeros(B, T)
    for b in range(B):
        g = 0.0
        for t in reversed(range(T)):
            if mask[b, t]:
                g = float(rewards[b, t]) + gamma * g
                out[b, t] = g
    return out


def test_reinforce_pp_returns_hand_and_loop():
    # r = [0, 0, 1], gamma = 0.5 -> G = [0.25, 0.5, 1]
    out = reinforce_pp_returns(torch.tensor([[0.0, 0.0, 1.0]]), torch.ones(1, 3), gamma=0.5)
    torch.testing.assert_close(out, torch.tensor([[0.25, 0.5, 1.0]]))
    rewards, _, mask = _ragged(4, 7, [7, 2, 5, 1], seed=2)
    for gamma in (1.0, 0.9):
        torch.testing.assert_close(
            reinforce_pp_returns(rewards, mask, gamma), _slow_returns(rewards, mask, gamma)
        )


def test_reinforce_pp_advantages_whitened_over_batch():
    rewards, _, mask = _ragged(4, 7, [7, 2, 5, 3], seed=3)
    adv = reinforce_pp_advantages(rewards, mask)
    assert abs(masked_mean(adv, mask).item()) < 1e-5
    assert masked_var(adv, mask).item() == pytest.approx(1.0, abs=1e-4)
    assert torch.all(adv[mask == 0] == 0)


def test_registry():
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "w_reinforce", "distill"}
    assert ADVANTAGE_ESTIMATORS["gae"].needs_critic
    assert not any(ADVANTAGE_ESTIMATORS[n].needs_critic for n in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "distill"))
    assert {n for n, e in ADVANTAGE_ESTIMATORS.items() if e.group_based} == {"grpo", "dr_grpo", "rloo"}
    assert not ADVANTAGE_ESTIMATORS["grpo"].kl_in_reward_default
    assert ADVANTAGE_ESTIMATORS["reinforce_pp"].kl_in_reward_default
    scores = torch.tensor([1.0, 0.0, 3.0, 0.0])
    # one calling convention: token rewards [B, T] (here the score on the last of 2 tokens) -> (advantages, returns)
    token_rewards = torch.stack([torch.zeros(4), scores], dim=1)
    adv, returns = ADVANTAGE_ESTIMATORS["dr_grpo"].fn(token_rewards, torch.ones(4, 2), group_size=2)
    assert returns is None
    torch.testing.assert_close(adv, grpo_advantages(scores, 2, scale_by_std=False).unsqueeze(-1).expand(4, 2))


def test_pure():
    rewards, values, mask = _ragged(3, 5, [5, 2, 3])
    r0, v0, m0 = rewards.clone(), values.clone(), mask.clone()
    scores = torch.tensor([1.0, 2.0, 3.0, 5.0])
    s0 = scores.clone()
    gae(rewards, values, mask, 0.9, 0.9)
    reinforce_pp_advantages(rewards, mask, 0.9)
    grpo_advantages(scores, 2), rloo_advantages(scores, 2), group_all_tied(scores, 2)
    assert torch.equal(rewards, r0) and torch.equal(values, v0) and torch.equal(mask, m0)
    assert torch.equal(scores, s0)
