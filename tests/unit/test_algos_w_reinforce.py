"""W-REINFORCE (Zhu et al. 2025, arXiv 2506.01347): REINFORCE without a baseline, positive samples weighted lambda.

The references: the paper's rewards (+1 correct / -1 wrong, lambda 0.1: +lambda / -1), a per-sample Python loop, and
the gradient of the paper's objective lambda * L_PSR + L_NSR written out with autograd on the log-probs."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.algos import (
    ADVANTAGE_ESTIMATORS,
    grpo_advantages,
    ppo_policy_loss,
    shaped_token_rewards,
    w_reinforce_advantages,
)
from rlhfkit.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.train.lifecycle.fingerprint import fingerprint_diff, run_fingerprint


def _slow(scores, positive_weight, center, negative_weight=1.0):
    out = []
    for s in scores.tolist():
        r = s - center
        out.append(positive_weight * r if r > 0 else negative_weight * r)
    return torch.tensor(out, dtype=scores.dtype)


def test_the_papers_rewards_give_plus_lambda_and_minus_one():
    scores = torch.tensor([1.0, -1.0, -1.0, 1.0])
    torch.testing.assert_close(w_reinforce_advantages(scores, 0.1, 0.0), torch.tensor([0.1, -1.0, -1.0, 0.1]))
    # lambda = 1: plain REINFORCE on the raw reward; lambda = 0: negative samples only (the paper's NSR)
    torch.testing.assert_close(w_reinforce_advantages(scores, 1.0, 0.0), scores)
    torch.testing.assert_close(w_reinforce_advantages(scores, 0.0, 0.0), torch.tensor([0.0, -1.0, -1.0, 0.0]))
    # negative_weight = 0: positive samples only (the paper's PSR)
    torch.testing.assert_close(w_reinforce_advantages(scores, 1.0, 0.0, negative_weight=0.0),
                               torch.tensor([1.0, 0.0, 0.0, 1.0]))


def test_a_zero_one_verifier_with_the_default_center():
    # right 1 -> +0.05, wrong 0 -> -0.5, wrong and penalised (-1) -> -1.5, right but penalised (0) -> -0.5; a score
    # at the center (0.5) gets exactly 0
    scores = torch.tensor([1.0, 0.0, -1.0, 0.5])
    torch.testing.assert_close(w_reinforce_advantages(scores, 0.1, 0.5), torch.tensor([0.05, -0.5, -1.5, 0.0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_matches_a_slow_loop(dtype):
    g = torch.Generator().manual_seed(0)
    scores = (torch.randn(257, generator=g) * 3).to(dtype)
    for lam, center, neg in ((0.1, 0.5, 1.0), (0.3, -1.0, 1.0), (1.0, 0.0, 0.0), (0.0, 2.0, 0.5)):
        got = w_reinforce_advantages(scores, lam, center, negative_weight=neg)
        assert got.dtype == dtype
        torch.testing.assert_close(got, _slow(scores, lam, center, neg))


def test_extreme_scores_stay_finite_and_ordered():
    scores = torch.tensor([3e38, -3e38, 1e-30, -1e-30])
    adv = w_reinforce_advantages(scores, 0.1, 0.0)
    assert torch.isfinite(adv).all()
    assert adv[0] > 0 > adv[1] and adv[2] > 0 > adv[3]


def test_invalid_samples_and_empty_batches_get_nothing():
    scores = torch.tensor([1.0, 0.0, 1.0])
    valid = torch.tensor([True, False, True])
    torch.testing.assert_close(w_reinforce_advantages(scores, 0.1, 0.5, valid=valid), torch.tensor([0.05, 0.0, 0.05]))
    assert torch.all(w_reinforce_advantages(scores, 0.1, 0.5, valid=torch.zeros(3, dtype=torch.bool)) == 0)
    assert w_reinforce_advantages(torch.zeros(0), 0.1, 0.5).shape == (0,)


def test_pure():
    scores = torch.tensor([1.0, 0.0])
    before = scores.clone()
    w_reinforce_advantages(scores, 0.1, 0.5)
    assert torch.equal(scores, before)


@pytest.mark.parametrize("lam, neg", [(0.1, 1.0), (1.0, 0.0)])  # W-REINFORCE; PSR (right answers only)
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_the_policy_gradient_is_the_papers_objective(aggregation, lam, neg):
    """On-policy (ratio 1, no clip active), the PPO surrogate with these advantages has the gradient of
    -(lambda * sum over right answers of log pi - sum over wrong answers of log pi), normalised as the aggregation
    normalises: the paper's lambda * L_PSR + L_NSR, here for the 0 / 1 verifier at center 0.5 (half the scale)."""
    g = torch.Generator().manual_seed(1)
    B, T = 4, 5
    logits = torch.randn(B, T, 7, generator=g, requires_grad=True)
    tokens = torch.randint(0, 7, (B, T), generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float32)
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])  # right, wrong, wrong, right

    def logp():
        return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    adv = w_reinforce_advantages(scores, lam, 0.5, negative_weight=neg).unsqueeze(-1) * mask
    loss, _ = ppo_policy_loss(logp(), logp().detach(), adv, mask, aggregation=aggregation)
    (got,) = torch.autograd.grad(loss, logits)

    lp = logp() * mask
    sign = torch.where(scores > 0.5, lam * 0.5, -0.5 * neg)  # +lambda / 2 on right answers, -neg / 2 on wrong ones
    if aggregation == "token_mean":
        objective = (sign.unsqueeze(-1) * lp).sum() / mask.sum()
    else:
        objective = (sign * lp.sum(-1) / mask.sum(-1)).mean()
    (want,) = torch.autograd.grad(-objective, logits)
    torch.testing.assert_close(got, want)
    # and not GRPO's on the same four answers as one group (its baseline weighs right and wrong alike, +-0.87)
    grpo, _ = ppo_policy_loss(logp(), logp().detach(), grpo_advantages(scores, 4).unsqueeze(-1) * mask, mask,
                              aggregation=aggregation)
    assert not torch.allclose(got, torch.autograd.grad(grpo, logits)[0])


def test_the_registry_reads_its_section_and_the_kl_in_the_reward():
    est = ADVANTAGE_ESTIMATORS["w_reinforce"]
    assert not est.needs_critic and not est.group_based and not est.kl_in_reward_default
    cfg = build_config("grpo", {}, ["model.name=x", "data.train=x", "algo.advantage=w_reinforce",
                                    "algo.w_reinforce.positive_weight=0.25", "reward.missing_eos_scope=all"])
    assert est.settings(cfg.algo) == {"positive_weight": 0.25, "center": 0.5, "negative_weight": 1.0}
    assert ADVANTAGE_ESTIMATORS["grpo"].settings(cfg.algo) == {}
    scores = torch.tensor([1.0, 0.0, 0.6])
    kl = torch.tensor([[0.5, 0.5], [0.1, 0.0], [1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    rewards, _ = shaped_token_rewards(scores, kl, mask, 0.1, kl_in_reward=True)
    adv, returns = est.fn(rewards, mask, group_size=1, **est.settings(cfg.algo))
    assert returns is None
    # sequence rewards 1 - 0.1 = 0.9, -0.01, 0.6 - 0.1 = 0.5 (exactly the center: 0)
    seq = torch.tensor([0.4 * 0.25, -0.51, 0.0])
    torch.testing.assert_close(adv, seq.unsqueeze(-1) * mask)


def test_a_baseline_is_refused_in_one_line():
    """Whitening and the running score normalisation both subtract a mean: the baseline W-REINFORCE leaves out."""
    base = ["model.name=x", "data.train=x", "algo.advantage=w_reinforce"]
    with pytest.raises(ConfigError, match="whiten_advantages") as err:
        build_config("ppo", {}, [*base, "reward.normalize=false"])
    assert err.value.where == "algo.whiten_advantages"
    with pytest.raises(ConfigError, match="running mean") as err:
        build_config("ppo", {}, [*base, "algo.whiten_advantages=false"])
    assert err.value.where == "reward.normalize"
    build_config("ppo", {}, [*base, "algo.whiten_advantages=false", "reward.normalize=false"])
    build_config("grpo", {}, [*base, "reward.missing_eos_scope=all"])  # grpo's recipe has neither


def test_its_section_never_blocks_another_estimators_resume():
    base = run_fingerprint(build_config("grpo", {}, ["model.name=x", "data.train=x"]))
    older = {k: v for k, v in base.items() if not k.startswith("algo.w_reinforce.")}
    assert fingerprint_diff(older, base) == []
    other = run_fingerprint(build_config("grpo", {}, ["model.name=x", "data.train=x",
                                                       "algo.w_reinforce.positive_weight=0.5"]))
    assert fingerprint_diff(base, other) == []
    mine = ["model.name=x", "data.train=x", "algo.advantage=w_reinforce", "reward.missing_eos_scope=all"]
    a = run_fingerprint(build_config("grpo", {}, mine))
    b = run_fingerprint(build_config("grpo", {}, [*mine, "algo.w_reinforce.positive_weight=0.5"]))
    assert fingerprint_diff(a, b) == ["algo.w_reinforce.positive_weight: 0.1 -> 0.5"]
    # a w_reinforce run of before negative_weight existed resumes (it weighed negatives 1)
    assert fingerprint_diff({k: v for k, v in a.items() if k != "algo.w_reinforce.negative_weight"}, a) == []
