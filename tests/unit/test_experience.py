"""The loss mask of an online step: composed once from the keep-factors the steps set (train/online/experience.py), by
hand
and against the five in-place rewrites the loop used to make (score, tied groups, overlong filter, off-policy mask,
advantages masked twice)."""

from __future__ import annotations

from types import MethodType, SimpleNamespace

import pytest
import torch

from rlhfkit.algos import (
    ADVANTAGE_ESTIMATORS,
    OFF_POLICY_CORRECTIONS,
    FixedKLController,
    group_all_tied,
    shaped_token_rewards,
)
from rlhfkit.config import build_config
from rlhfkit.train.online.experience import Experience, compose_mask
from rlhfkit.train.online.learner import Learner


def test_compose_mask_by_hand():
    action = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    valid = torch.tensor([True, True, False, True])  # row 2 dropped (no finite reward)
    untied = torch.tensor([1.0, 0.0, 1.0, 1.0])  # row 1's group tied (0 / 1 numbers work like bools)
    in_band = torch.tensor([[1, 0, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)  # token 1 of row 0 out
    # row 0: [1, 1, 0] * [1, 0, 1] = [1, 0, 0]; row 1: untied 0; row 2: valid 0; row 3: every factor keeps it
    want = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    got = compose_mask(action, valid, untied, None, in_band)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(compose_mask(action, in_band, None, untied, valid), want)  # the order does not matter
    assert torch.equal(compose_mask(action), action.float())  # no factor: the model's tokens
    assert torch.equal(compose_mask(action, None, None), action.float())  # a factor not set keeps everything


def test_mask_reads_the_factors_set_so_far_then_the_loss_mask_fixed_once():
    rollout = SimpleNamespace(sequences=torch.zeros(2, 3), attention_mask=torch.ones(2, 3),
                              response_ids=torch.zeros(2, 2))
    exp = Experience(rollout=rollout, rows=[{}, {}], position_ids=torch.zeros(2, 3),
                     action=torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    assert torch.equal(exp.mask, exp.action) and exp.loss_mask is None
    exp.valid = torch.tensor([True, False])  # step 3
    assert torch.equal(exp.mask, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    exp.finished = torch.tensor([False, True])  # step 5: row 0 was cut at the length limit
    assert torch.equal(exp.sample_mask, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))  # the samples: valid only
    exp.compose_loss_mask(torch.tensor([[-2.0, 3.0], [5.0, 7.0]]), torch.tensor([[0.5, 2.0], [1.0, 1.0]]))
    assert torch.equal(exp.loss_mask, torch.zeros(2, 2)) and exp.mask is exp.loss_mask
    assert torch.equal(exp.advantages, torch.zeros(2, 2)) and torch.equal(exp.is_weights, torch.zeros(2, 2))
    exp.old_logprobs = torch.zeros(2, 2)
    assert torch.equal(exp.rows_of(torch.tensor([1]))["mask"], torch.zeros(1, 2))


def _old_step5(action, valid, scores, ended, old_lp, sampled, trainer):
    """Step 5 as the loop wrote it before the keep-factors: the mask rewritten in place at each decision, the
    advantages masked twice (the slow reference)."""
    algo = trainer.cfg.algo
    mask = action.float()
    mask = mask * valid.unsqueeze(-1)  # 3. score: dropped samples take no part in the step
    token_rewards, _ = shaped_token_rewards(scores, torch.zeros_like(mask), mask, 0.0, True)
    adv, _ = trainer.estimator.fn(token_rewards, mask, values=None, group_size=trainer.k, gamma=algo.gamma,
                                  lam=algo.lam)
    keep = ~group_all_tied(scores, trainer.k, valid=mask.bool().any(-1))
    loss_mask = mask * keep.unsqueeze(-1).float()
    loss_mask = loss_mask * ended.unsqueeze(-1).float()
    advantages = adv * loss_mask
    op = algo.off_policy
    weights, new = OFF_POLICY_CORRECTIONS[op.correction](old_lp, sampled, loss_mask, cap=op.cap, low=op.low,
                                                         high=op.high, level=op.level)
    loss_mask = new.to(loss_mask.dtype)
    advantages = advantages * loss_mask
    return loss_mask, advantages, (None if weights is None else weights * loss_mask)


@pytest.mark.parametrize("correction, level", [("mis", "token"), ("mis", "sequence"), ("tis", "token"),
                                               ("none", "token")])
def test_step5_composes_the_mask_the_old_rewrites_made(correction, level):
    # 4 groups of 2 (completion-major) over 5 tokens: one dropped sample, a tied group, truncated responses, and
    # sampling log-probs off by +-1 on some tokens (outside MIS's [0.5, 2] band: e^1 = 2.72)
    cfg = build_config("grpo", {}, ["algo.num_generations=2", "algo.filter_tied_groups=true", "algo.kl.coef=0",
                                    "algo.overlong.filter=true", f"algo.off_policy.correction={correction}",
                                    f"algo.off_policy.level={level}", "algo.whiten_advantages=false"])
    g = torch.Generator().manual_seed(0)
    B, R = 8, 5
    lengths = torch.tensor([5, 3, 1, 4, 5, 2, 5, 3])
    action = (torch.arange(R) < lengths.unsqueeze(-1)).long()
    valid = torch.tensor([True, True, True, True, True, False, True, True])
    scores = torch.tensor([1.0, 0.0, 2.0, 2.0, 0.0, 0.0, 3.0, 1.0])  # group 2 (rows 2, 6): 2 vs 3; group 1 ties
    scores[~valid] = 0.0
    ended = lengths < R
    old_lp = -torch.rand(B, R, generator=g)
    sampled = old_lp + torch.randint(-1, 2, (B, R), generator=g).float() * (torch.rand(B, R, generator=g) < 0.2)
    rollout = SimpleNamespace(ended=ended, logprobs=sampled)
    trainer = SimpleNamespace(cfg=cfg, kl_ctl=FixedKLController(0.0), estimator=ADVANTAGE_ESTIMATORS["grpo"], k=2,
                              kl_in_reward=True, acc=SimpleNamespace(num_processes=1), moments=None)
    trainer.off_policy = MethodType(Learner.off_policy, trainer)
    trainer.sampled_logprobs = MethodType(Learner.sampled_logprobs, trainer)
    trainer.kl_metrics = MethodType(Learner.kl_metrics, trainer)
    exp = Experience(rollout=rollout, rows=[{}] * B, position_ids=None, action=action.float(), valid=valid,
                     scores=scores, old_logprobs=old_lp, ref_logprobs=None, values=None)
    metrics = Learner.advantages(trainer, exp)
    mask, advantages, weights = _old_step5(action, valid, scores, ended, old_lp, sampled, trainer)
    assert torch.equal(exp.mask, mask) and torch.equal(exp.advantages, advantages)
    assert (exp.is_weights is None) == (weights is None)
    if weights is not None:
        assert torch.equal(exp.is_weights, weights)
        assert metrics["rollout/is_weight_mean"] == pytest.approx(float((weights * mask).sum() / mask.sum()))
    # the factors: each set once, by the step that decides it
    assert torch.equal(exp.untied, torch.tensor([True, False, True, True, True, False, True, True]))
    assert torch.equal(exp.finished, ended) and (exp.in_band is not None)
    assert mask[1].sum() == 0 and mask[5].sum() == 0 and mask[0].sum() == 0  # tied group, dropped, truncated
    if correction == "mis":
        assert 0 < mask.sum() < compose_mask(action, valid, exp.untied, ended).sum()  # the band removed tokens
