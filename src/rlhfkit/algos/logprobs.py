"""Per-token log-probabilities and entropies from logits, computed in chunks.

A full-vocabulary float32 softmax of a whole batch ([B, T, V] with V ~ 150k) is the largest tensor of an RLHF
step, so we never build it: logits stay in their own dtype (bf16 usually), and blocks of at most ``chunk_size``
tokens go through a fused float32 ``log_softmax`` (= x - logsumexp(x); the kernel reads bf16 and accumulates in
float32, so no separate cast pass), are gathered at the labels and discarded. Both functions are custom autograd
functions whose backward recomputes the softmax block by block as well, so training (entropy bonus, policy
log-probs) keeps only the input logits for backward, never a float32 [B, T, V] copy.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.autograd.function import once_differentiable

# Default block: about 2**26 float32 elements (256 MiB) per chunk whatever the vocabulary size.
_DEFAULT_CHUNK_ELEMENTS = 2**26


def _chunk_tokens(vocab: int, chunk_size: int | None) -> int:
    if chunk_size is None:
        return max(1, _DEFAULT_CHUNK_ELEMENTS // max(vocab, 1))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 token, got {chunk_size}")
    return chunk_size


def _blocks(B: int, T: int, chunk: int) -> Iterator[tuple[slice, slice]]:
    """(batch slice, time slice) pairs covering [B, T] with at most ``chunk`` tokens each."""
    t_step = max(1, min(T, chunk))
    b_step = max(1, chunk // max(T, 1))
    for b0 in range(0, B, b_step):
        for t0 in range(0, T, t_step):
            yield slice(b0, b0 + b_step), slice(t0, t0 + t_step)


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float32 for bf16 / fp16 / fp32 logits, float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk: int) -> torch.Tensor:
        B, T, _ = logits.shape
        acc = _acc(logits.dtype)
        out = torch.empty(B, T, dtype=acc, device=logits.device)
        for bs, ts in _blocks(B, T, chunk):
            # x - logsumexp(x) by one fused kernel that reads bf16 and writes float32 (no separate cast)
            logp = torch.log_softmax(logits[bs, ts], dim=-1, dtype=acc)
            out[bs, ts] = logp.gather(-1, labels[bs, ts].unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(logits, labels)
        ctx.chunk = chunk
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        # d logp(label) / d x_v = 1[v == label] - softmax(x)_v
        logits, labels = ctx.saved_tensors
        B, T, _ = logits.shape
        acc = _acc(logits.dtype)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for bs, ts in _blocks(B, T, ctx.chunk):
            g = grad_out[bs, ts].to(acc).unsqueeze(-1)
            blk = torch.softmax(logits[bs, ts], dim=-1, dtype=acc)  # a fresh block: in-place below is ours
            blk.mul_(-g).scatter_add_(-1, labels[bs, ts].unsqueeze(-1), g)
            grad[bs, ts] = blk
        return grad, None, None


class _Entropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, chunk: int) -> torch.Tensor:
        B, T, _ = logits.shape
        acc = _acc(logits.dtype)
        ent = torch.empty(B, T, dtype=acc, device=logits.device)
        for bs, ts in _blocks(B, T, chunk):
            p = torch.softmax(logits[bs, ts], dim=-1, dtype=acc)
            # entr(p) = -p log p, 0 at p = 0 (logits of -inf), NaN stays NaN
            ent[bs, ts] = torch.special.entr(p).sum(-1)
        ctx.save_for_backward(logits, ent)
        ctx.chunk = chunk
        return ent

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        # H = -sum_v p_v log p_v  =>  dH / dx_k = -p_k (log p_k + H) = entr(p_k) - p_k H
        logits, ent = ctx.saved_tensors
        B, T, _ = logits.shape
        acc = _acc(logits.dtype)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for bs, ts in _blocks(B, T, ctx.chunk):
            p = torch.softmax(logits[bs, ts], dim=-1, dtype=acc)
            d = torch.special.entr(p)
            d.sub_(p.mul_(ent[bs, ts].unsqueeze(-1))).mul_(grad_out[bs, ts].to(acc).unsqueeze(-1))
            grad[bs, ts] = d
        return grad, None


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """log softmax(logits)[label] = x_label - logsumexp(x) per token, on float32 chunks.

    The REINFORCE log pi of Williams (1992).

    logits: [B, T, V] (any float dtype) or [N, V]; labels: [B, T] (or [N]) integer ids in [0, V) — replace
    ignore indices such as -100 before calling -> float32 [B, T] (or [N]; float64 for float64 logits).
    ``chunk_size``: tokens per float32 block (None: about 2**26 / V tokens, i.e. 256 MiB of float32 per block).
    Differentiable; backward recomputes the softmax per block (no float32 [B, T, V] is ever kept).
    """
    if logits.dim() == 2:
        return token_logprobs(logits.unsqueeze(0), labels.unsqueeze(0), chunk_size).squeeze(0)
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree")
    return _TokenLogprobs.apply(logits, labels.long(), _chunk_tokens(logits.shape[-1], chunk_size))


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy H = -sum_v p_v log p_v of each next-token distribution p = softmax(x), chunked (Shannon 1948).

    logits: [B, T, V] (any float dtype) or [N, V] -> float32 [B, T] (or [N]; float64 for float64 logits), nats.
    ``chunk_size`` as in :func:`token_logprobs`. Differentiable (for an entropy bonus), block-wise backward.
    """
    if logits.dim() == 2:
        return entropy_from_logits(logits.unsqueeze(0), chunk_size).squeeze(0)
    return _Entropy.apply(logits, _chunk_tokens(logits.shape[-1], chunk_size))
