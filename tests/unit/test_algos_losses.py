"""SFT, Bradley–Terry, PPO value loss, KL-in-loss and the loss aggregations: hand values (the policy losses are in
test_algos_policy_losses.py, the preference losses in test_algos_preference.py)."""

import math

import pytest
import torch

from rlhfkit.algos import (
    LOSS_AGGREGATIONS,
    aggregate_loss,
    bradley_terry_loss,
    kl_loss,
    sft_loss,
    value_loss,
)

E = math.e


def _stats_are_detached(stats):
    return all(isinstance(v, torch.Tensor) and not v.requires_grad and v.dim() == 0 for v in stats.values())


# ------------------------------------------------------------------ SFT / Bradley–Terry
def test_sft_loss_token_mean():
    # valid log-probs -1, -2, -3 (the -9s are padding) -> NLL (1 + 2 + 3) / 3 = 2
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]], requires_grad=True)
    loss, stats = sft_loss(logprobs, torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert loss.item() == pytest.approx(2.0)
    assert stats["num_tokens"].item() == 3
    loss.backward()
    # d loss / d logp = -1/3 on valid tokens, 0 on padding
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1 / 3, -1 / 3, 0.0], [-1 / 3, 0.0, 0.0]]))
    assert _stats_are_detached(stats)


def test_bradley_terry_hand_values():
    chosen, rejected = torch.tensor([2.0, 0.0], requires_grad=True), torch.tensor([1.0, 1.0])
    # r_c - r_r = [1, -1]: (-log sig(1) - log sig(-1)) / 2 = (0.313262 + 1.313262) / 2 = 0.813262
    loss, stats = bradley_terry_loss(chosen, rejected)
    assert loss.item() == pytest.approx(0.8132616875)
    assert stats["accuracy"].item() == 0.5
    assert stats["chosen_mean"].item() == 1.0 and stats["rejected_mean"].item() == 1.0
    assert stats["margin_mean"].item() == 0.0
    assert _stats_are_detached(stats)
    # margin 0.5 (Llama 2): logits [0.5, -1.5] -> (0.474077 + 1.701413) / 2 = 1.087745
    loss_m, _ = bradley_terry_loss(chosen, rejected, margin=torch.tensor([0.5, 0.5]))
    assert loss_m.item() == pytest.approx(1.0877451310)
    # centering 0.01: (r_c + r_r)^2 = [9, 1], mean 5 -> + 0.05
    loss_c, _ = bradley_terry_loss(chosen, rejected, center_coef=0.01)
    assert loss_c.item() == pytest.approx(0.8132616875 + 0.05)


# ------------------------------------------------------------------ aggregations
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, 100.0], [5.0, 100.0, 100.0, 100.0], [100.0, 100.0, 100.0, 100.0]])
RAGGED = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_aggregations_on_ragged_mask():
    # valid tokens: row 0 -> 1, 2, 3; row 1 -> 5; row 2 -> none
    # token_mean: (1 + 2 + 3 + 5) / 4 = 2.75
    assert aggregate_loss(PER_TOKEN, RAGGED, "token_mean").item() == pytest.approx(2.75)
    # seq_mean_token_mean: mean(2, 5) over the rows that have tokens = 3.5
    assert aggregate_loss(PER_TOKEN, RAGGED, "seq_mean_token_mean").item() == pytest.approx(3.5)
    # seq_mean_token_sum_norm (T = 4): (6/4 + 5/4 + 0/4) / 3 rows = 11/12
    assert aggregate_loss(PER_TOKEN, RAGGED, "seq_mean_token_sum_norm").item() == pytest.approx(11 / 12)
    # with max_len = 10: (0.6 + 0.5 + 0) / 3
    assert aggregate_loss(PER_TOKEN, RAGGED, "seq_mean_token_sum_norm", max_len=10).item() == pytest.approx(
        1.1 / 3
    )
    assert set(LOSS_AGGREGATIONS) == {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"}
    with pytest.raises(ValueError, match="token_sum"):
        aggregate_loss(PER_TOKEN, RAGGED, "token_sum")


# ------------------------------------------------------------------ value loss
def test_value_loss_clip_cases():
    old, ret = torch.tensor([[0.5, 0.9, 0.5]]), torch.tensor([[2.0, 0.0, 0.0]])
    values = torch.tensor([[1.0, 1.0, 1.0]], requires_grad=True)
    # token 0: clip(1.0, 0.3, 0.7) = 0.7; (1 - 2)^2 = 1 vs (0.7 - 2)^2 = 1.69 -> 1.69 (clipped chosen)
    # token 1: 1.0 within [0.7, 1.1]; both errors 1 -> 1 (not clipped)
    # token 2: clipped 0.7; (1 - 0)^2 = 1 vs 0.49 -> 1 (unclipped chosen)
    loss, stats = value_loss(values, old, ret, torch.ones(1, 3), clip_range=0.2)
    assert loss.item() == pytest.approx(0.5 * (1.69 + 1 + 1) / 3)
    assert stats["clipfrac"].item() == pytest.approx(1 / 3)
    assert stats["value_mean"].item() == pytest.approx(1.0)
    assert stats["error"].item() == pytest.approx(1.0)  # unclipped squared errors 1, 1, 1
    assert _stats_are_detached(stats)
    loss.backward()
    # token 0 clipped -> zero gradient; tokens 1, 2: d/dv 0.5 (v - R)^2 / 3 = (v - R) / 3
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 1 / 3, 1 / 3]]))
    # no clipping: 0.5 * mean((1 - 2)^2, 1, 1) = 0.5; masked: only token 0 -> 0.5 * 1
    assert value_loss(values, old, ret, torch.ones(1, 3), clip_range=None)[0].item() == pytest.approx(0.5)
    assert value_loss(values, old, ret, torch.tensor([[1, 0, 0]]))[0].item() == pytest.approx(0.5 * 1.69)


# ------------------------------------------------------------------ KL in loss
def test_kl_loss_k3():
    # log_ratio = [0, 1] (third token masked): k3 = [0, e^-1] -> token mean e^-1 / 2
    logp, ref = torch.tensor([[0.0, 1.0, 7.0]]), torch.zeros(1, 3)
    loss, stats = kl_loss(logp, ref, torch.tensor([[1, 1, 0]]))
    assert loss.item() == pytest.approx(math.exp(-1) / 2)
    assert stats["kl"].item() == pytest.approx(math.exp(-1) / 2)
    # k1 with seq_mean_token_sum_norm, T = 3: (0 + 1) / 3
    loss1, _ = kl_loss(
        logp, ref, torch.tensor([[1, 1, 0]]), estimator="k1", aggregation="seq_mean_token_sum_norm"
    )
    assert loss1.item() == pytest.approx(1 / 3)
