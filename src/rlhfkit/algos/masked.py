"""Masked reductions: sums, means, variances, quantiles and whitening over the positions where ``mask`` is 1.

``mask`` may be bool, integer or float 0/1 and must broadcast to ``x``. Masked-out positions never reach the
arithmetic: they are selected away with ``torch.where`` *before* any nonlinearity, so a NaN or inf in padding
reaches neither a value nor a gradient (``where`` routes a zero gradient to the unselected side without multiplying,
whereas ``0 * inf`` in the backward of a square or product would be NaN).
Sums and counts are accumulated in at least float32, so a bfloat16 ``x`` yields float32 results (a bf16 sum or
count is inexact above 256).
An empty mask gives a mean of 0 rather than NaN (the denominator is clamped to 1).
"""

from __future__ import annotations

import torch


def _acc(x: torch.Tensor) -> torch.Tensor:
    """``x`` in at least float32 (bf16 / fp16 sums lose integers above 256)."""
    if x.is_floating_point() and torch.finfo(x.dtype).bits < 32:
        return x.float()
    return x


def zero_outside(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` where ``mask`` is set, 0 elsewhere (out of place)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_count(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Number of positions with ``mask`` set (broadcast to ``x``), in at least float32."""
    dtype = torch.promote_types(x.dtype, torch.float32) if x.is_floating_point() else torch.float32
    m = torch.broadcast_to(mask.bool(), x.shape).to(dtype)
    return m.sum() if dim is None else m.sum(dim)


def _pivot(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One masked value of ``x`` (the largest; 0 when the mask is empty), detached. Variances are taken of x - pivot
    (shift-invariant, and exact for ties: a float32 mean of equal values is not that value, and the rounding left in
    x - mean, divided by sqrt(eps), gave whitened ties values of ~1e-3 instead of 0)."""
    with torch.no_grad():
        top = torch.where(mask.bool(), x, torch.full((), -torch.inf, dtype=x.dtype, device=x.device)).amax()
        return torch.where(torch.isneginf(top), torch.zeros_like(top), top)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` over positions where ``mask`` is 1; ``dim=None`` sums everything to a scalar.

    x: [...]; mask: broadcastable to x -> scalar (dim None) or x with ``dim`` reduced (float32 for bf16 / fp16 x).
    """
    kept = _acc(zero_outside(x, mask))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (token mean when ``dim=None``; per row along ``dim``).

    x: [...]; mask: broadcastable to x -> scalar (dim None) or x with ``dim`` reduced. Empty -> 0.
    """
    return masked_sum(x, mask, dim) / masked_count(x, mask, dim).clamp_min(1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all positions where ``mask`` is 1 (one scalar for the whole tensor).

    x: [...]; mask: broadcastable to x -> scalar. ``unbiased`` applies Bessel's correction n / (n - 1)
    (n = number of masked positions; for n <= 1 the correction is skipped and the variance is 0).
    """
    x = zero_outside(x, mask)  # padding out before the square: its gradient would be 0 * (x - mean) = NaN for inf x
    d = x - _pivot(x, mask)
    mean = masked_mean(d, mask)
    var = masked_mean((d - mean) ** 2, mask)
    if unbiased:
        n = masked_count(x, mask, None)
        var = var * n / (n - 1).clamp_min(1.0)
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise ``x`` to zero mean and unit (unbiased) variance over the masked positions of the whole tensor.

    x: [...]; mask: broadcastable to x -> same shape as x, with masked-out positions set to 0. Equal values give
    exactly 0. ``shift_mean=False`` rescales only (the mean is added back), as in PPO reward whitening.
    (Standard advantage normalisation, e.g. torchtune ``rlhf.whiten`` / OpenAI baselines.)
    """
    x = zero_outside(x, mask)  # padding out before the product with rsqrt(var): 0 * inf in its backward is NaN
    d = x - _pivot(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (d - masked_mean(d, mask)) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + masked_mean(x, mask)
    return zero_outside(whitened, mask)


def masked_quantile(x: torch.Tensor, mask: torch.Tensor | None, q: float) -> torch.Tensor:
    """The ``q``-quantile (0 <= q <= 1) of ``x`` over the masked positions of the whole tensor, by linear
    interpolation between the two nearest order statistics: with the n masked values sorted, v_0 <= ... <= v_{n-1},
    position q (n - 1) (``torch.quantile`` / ``numpy.quantile``'s default ``linear``). Never above v_ceil (the
    interpolation's rounding cannot pass the upper value, so ``x >= quantile`` keeps what it should).

    x: [...]; mask: broadcastable to x (None: every value) -> scalar, float32 for a bf16 / fp16 x, NaN for an empty
    mask; no gradient.
    A sort rather than ``torch.quantile``, which refuses more than 2^24 values (a batch of long answers gathered
    from many processes passes that).
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q={q} outside [0, 1]")
    with torch.no_grad():
        kept = x.detach() if mask is None else x.detach()[torch.broadcast_to(mask.bool(), x.shape)]
        values = torch.sort(_acc(kept).flatten()).values
        n = values.numel()
        if n == 0:
            return torch.full((), float("nan"), dtype=values.dtype, device=x.device)
        pos = q * (n - 1)
        lo, hi = int(pos), min(int(pos) + 1, n - 1)
        frac = pos - lo
        return torch.minimum(values[lo] + frac * (values[hi] - values[lo]), values[hi])
