"""The estimator registry's one calling convention and the shaped per-token rewards it reads."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.algos import (
    ADVANTAGE_ESTIMATORS,
    gae,
    grpo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_returns,
    rloo_advantages,
    shaped_token_rewards,
    w_reinforce_advantages,
)


def test_shaped_token_rewards_by_hand():
    scores = torch.tensor([2.0, -1.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # row 1 ends after one token
    rewards, non_score = shaped_token_rewards(scores, kl, mask, kl_coef=0.5, kl_in_reward=True)
    # row 0: -0.5*kl on every token, the score on the last; row 1: one token, -0.25 + (-1); masked tail 0
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, -0.1, 2.0 - 0.15], [-1.25, 0.0, 0.0]]))
    torch.testing.assert_close(non_score, torch.tensor([[-0.05, -0.1, -0.15], [-0.25, 0.0, 0.0]]))
    rewards, non_score = shaped_token_rewards(scores, kl, mask, kl_coef=0.5, kl_in_reward=False)
    torch.testing.assert_close(rewards, torch.tensor([[0.0, 0.0, 2.0], [-1.0, 0.0, 0.0]]))
    assert torch.all(non_score == 0)


def test_shaped_token_rewards_empty_mask_and_nan_tail():
    kl = torch.tensor([[float("nan"), 1.0]])
    rewards, _ = shaped_token_rewards(torch.tensor([1.0]), kl, torch.zeros(1, 2), 0.1, True)
    assert torch.all(rewards == 0)  # no token to hold the score; NaN in a masked slot never leaks


def _inputs(seed=0, B=8, T=5):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T) < torch.randint(1, T + 1, (B, 1), generator=g)).float()
    scores = torch.randn(B, generator=g)
    kl = torch.rand(B, T, generator=g) * mask
    values = torch.randn(B, T, generator=g)
    return scores, kl, mask, values


@pytest.mark.parametrize("kl_in_reward", [True, False])
def test_every_estimator_equals_its_direct_formula(kl_in_reward):
    """The registry's convention reproduces what the loop computed before the registry (the slow, spelled-out way)."""
    scores, kl, mask, values = _inputs()
    coef, k = 0.1, 2
    rewards, non_score = shaped_token_rewards(scores, kl, mask, coef, kl_in_reward)
    seq = scores + (non_score * mask).sum(-1)  # the sequence reward of the group estimators
    expected = {
        "gae": gae(rewards, values, mask, 1.0, 0.95)[0],
        "grpo": grpo_advantages(seq, k).unsqueeze(-1) * mask,
        "dr_grpo": grpo_advantages(seq, k, scale_by_std=False).unsqueeze(-1) * mask,
        "rloo": rloo_advantages(seq, k).unsqueeze(-1) * mask,
        "reinforce_pp": reinforce_pp_advantages(rewards, mask, 1.0),
        "distill": reinforce_pp_returns(rewards, mask, 1.0),  # the teacher's rewards are added to ``rewards``
        "w_reinforce": w_reinforce_advantages(seq).unsqueeze(-1) * mask,  # its function's defaults (no settings)
    }
    assert set(expected) == set(ADVANTAGE_ESTIMATORS)
    for name, est in ADVANTAGE_ESTIMATORS.items():
        adv, returns = est.fn(rewards, mask, values=values, group_size=k, gamma=1.0, lam=0.95)
        torch.testing.assert_close(adv, expected[name], msg=name)
        assert (returns is not None) == est.needs_critic, name
        assert torch.all(adv[mask == 0] == 0), name


def test_gae_without_values_is_an_error():
    scores, kl, mask, _ = _inputs()
    with pytest.raises(ValueError, match="values"):
        ADVANTAGE_ESTIMATORS["gae"].fn(shaped_token_rewards(scores, kl, mask, 0.0, True)[0], mask)


def test_sampling_params_round_trip():
    from rlhfkit.config import build_config
    from rlhfkit.rollout import SamplingParams

    cfg = build_config("grpo", {}, ["generation.top_k=5", "generation.stop_strings=['</a>']"])
    p = SamplingParams.from_config(cfg.generation)
    assert p.top_k == 5 and p.filters and not p.greedy
    assert p.max_new_tokens == cfg.generation.max_new_tokens and p.temperature == cfg.generation.temperature
    assert SamplingParams.from_config(cfg.generation, greedy=True).greedy
    assert SamplingParams(temperature=0).greedy and not SamplingParams(temperature=0).filters
    assert p.replace(max_new_tokens=3).max_new_tokens == 3 and p.max_new_tokens != 3  # frozen: a copy
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
