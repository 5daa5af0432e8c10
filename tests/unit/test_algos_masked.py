"""Masked reductions against hand-computed values."""

import math

import pytest
import torch

from rlhfkit.algos import masked_mean, masked_sum, masked_var, masked_whiten

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_masked_sum_and_mean_hand_values():
    # valid entries 1, 2, 4 -> sum 7, token mean 7/3; per row: (1+2)/2 = 1.5 and 4/1 = 4
    assert masked_sum(X, M).item() == pytest.approx(7.0)
    assert masked_mean(X, M).item() == pytest.approx(7.0 / 3.0)
    torch.testing.assert_close(masked_sum(X, M, dim=1), torch.tensor([3.0, 4.0]))
    torch.testing.assert_close(masked_mean(X, M, dim=1), torch.tensor([1.5, 4.0]))
    # per column: (1+4)/2, 2/1, empty -> 0
    torch.testing.assert_close(masked_mean(X, M, dim=0), torch.tensor([2.5, 2.0, 0.0]))


def test_masked_mean_accepts_bool_and_float_masks_and_ignores_nan_padding():
    x = X.clone()
    x[0, 2] = float("nan")
    x[1, 1] = float("inf")
    assert masked_mean(x, M.bool()).item() == pytest.approx(7.0 / 3.0)
    assert masked_mean(x, M.float()).item() == pytest.approx(7.0 / 3.0)


def test_masked_mean_empty_mask_is_zero():
    assert masked_mean(X, torch.zeros_like(M)).item() == 0.0


def test_masked_mean_broadcast_mask():
    # mask [2, 1] broadcast over columns: only row 0 -> (1+2+3)/3 = 2
    assert masked_mean(X, torch.tensor([[1], [0]])).item() == pytest.approx(2.0)


def test_masked_mean_bf16_count_exact():
    # 1001 ones: a bf16 count would round 1001 to 1000 (8 significant bits); ours counts in float32 -> exactly 1
    x = torch.ones(1001, dtype=torch.bfloat16)
    out = masked_mean(x, torch.ones(1001))
    assert out.dtype == torch.float32
    assert out.item() == 1.0


def test_masked_var_hand_values():
    # valid entries 1, 2, 4: mean 7/3, squared deviations 16/9 + 1/9 + 25/9 = 42/9
    # unbiased: (42/9) / 2 = 7/3; biased: (42/9) / 3 = 14/9
    assert masked_var(X, M).item() == pytest.approx(7.0 / 3.0)
    assert masked_var(X, M, unbiased=False).item() == pytest.approx(14.0 / 9.0)
    # one valid entry: variance 0, not NaN
    assert masked_var(X, torch.tensor([[1, 0, 0], [0, 0, 0]])).item() == 0.0


def test_masked_whiten_hand_values():
    # entries 1, 2, 4 -> (x - 7/3) / sqrt(7/3); masked-out positions -> 0
    out = masked_whiten(X, M)
    s = math.sqrt(7.0 / 3.0)
    expected = torch.tensor([[(1 - 7 / 3) / s, (2 - 7 / 3) / s, 0.0], [(4 - 7 / 3) / s, 0.0, 0.0]])
    torch.testing.assert_close(out, expected)


def test_masked_whiten_statistics_on_ragged_mask():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 9, generator=g) * 3 + 7
    lengths = torch.tensor([9, 1, 4, 6, 2])
    mask = (torch.arange(9)[None, :] < lengths[:, None]).float()
    w = masked_whiten(x, mask)
    assert abs(masked_mean(w, mask).item()) < 1e-5
    assert masked_var(w, mask).item() == pytest.approx(1.0, abs=1e-4)
    assert torch.all(w[mask == 0] == 0)
    # shift_mean=False keeps the original mean and only rescales
    w2 = masked_whiten(x, mask, shift_mean=False)
    assert masked_mean(w2, mask).item() == pytest.approx(masked_mean(x, mask).item(), abs=1e-4)
    assert masked_var(w2, mask).item() == pytest.approx(1.0, abs=1e-4)


def test_masked_ops_are_pure():
    x, m = X.clone(), M.clone()
    masked_sum(x, m), masked_mean(x, m, 1), masked_var(x, m), masked_whiten(x, m)
    assert torch.equal(x, X) and torch.equal(m, M)
