"""Per-token log-probabilities and entropies from logits, computed in chunks.

A full-vocabulary float32 softmax of a whole batch ([B, T, V] with V ~ 150k) is the largest tensor of an RLHF
step, so we never build it: logits stay in their own dtype (bf16 usually), and blocks of at most ``chunk_size``
tokens go through a fused float32 ``log_softmax`` (= x - logsumexp(x); the kernel reads bf16 and accumulates in
float32, so no separate cast pass), are gathered at the labels and discarded. Both functions are custom autograd
functions whose backward recomputes the softmax block by block as well, so training (entropy bonus, policy
log-probs) keeps only the input logits for backward, never a float32 [B, T, V] copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

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


# ─────────────────────────────────── from hidden states, through the LM head ───────────────────────────────────


class TokenStats(NamedTuple):
    """Per-token statistics of the next-token distributions: ``logprobs`` of the labels (float32, differentiable),
    ``entropy`` (float32, differentiable; None when not asked), ``argmax`` (the greedy token, long; None when not
    asked), ``mean_logits`` (the mean of the logits over the vocabulary, float32, no gradient; None when not asked:
    TRL's ``logits/chosen`` metric). Positions whose label is the ignore index hold 0 (and argmax -1)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    argmax: torch.Tensor | None = None
    mean_logits: torch.Tensor | None = None

    def map(self, fn) -> TokenStats:
        """The same statistics with ``fn`` applied to each present tensor (a slice, a concatenation part, ...)."""
        return TokenStats(*(None if t is None else fn(t) for t in self))


#: float32 elements of one block of the linear path: a chunk's logits in float32 (and their softmax / gradient
#: beside them, so about 3 such blocks live at the peak); 2**25 elements = 128 MiB per block
LINEAR_CHUNK_ELEMENTS = 2**25


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype an ``nn.Linear`` would compute in here: autocast's when it is on for the device, else the input's."""
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind) and hidden.is_floating_point():
        return torch.get_autocast_dtype(kind)
    return hidden.dtype


def _head_logits(h, weight, bias, lows, temperature: float, autocast: bool = False) -> torch.Tensor:
    """One chunk's logits ``(h W^T + b + sum_i x_i w_i^T) / temperature`` in the compute dtype (as the plain path
    rounds them: the head's output in that dtype, divided by the temperature in it). ``autocast``: through
    ``F.linear`` under the caller's autocast (its cached cast of the weight)."""
    if autocast:
        z = torch.nn.functional.linear(h, weight, bias)
        for x, w in lows:
            z = z + torch.nn.functional.linear(x, w)
    else:
        z = torch.addmm(bias, h, weight.t()) if bias is not None else h @ weight.t()
        for x, w in lows:
            z = z.addmm_(x, w.t())
    return z.div_(temperature) if temperature != 1.0 else z


def _accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, in place (``addmm_``) when the dtypes agree; else through a product in a's dtype (a bf16
    gradient of float32 master weights, as autocast's own backward makes it)."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    else:
        acc += a @ b


class _LinearTokenStats(torch.autograd.Function):
    """logits = (hidden @ weight.T + bias + sum_i low_in_i @ low_w_i.T) / temperature, computed ``chunk`` rows at a
    time: forward keeps per row only the label's log-prob (and the entropy, the argmax); backward recomputes each
    chunk's logits and softmax and sends d logp / d logits = onehot - p (and d H / d logits = entr(p) - p H) back
    through the linear maps. Saved: the inputs (views of what the model holds anyway) and [N] vectors."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, want_entropy, want_argmax, chunk, *lows_flat):
        ctx.set_materialize_grads(False)
        dt = _compute_dtype(hidden)
        acc = torch.promote_types(dt, torch.float32)
        N = hidden.shape[0]
        lows = list(zip(lows_flat[0::2], lows_flat[1::2]))
        autocast = torch.is_autocast_enabled(hidden.device.type)
        # under autocast its linear casts the weight once and caches it for the region, as the model's own layers
        # do (no copy of ours); without it the weight is cast to the input's dtype (a no-op when they agree)
        w, b = (weight, bias) if autocast else (weight.to(dt), None if bias is None else bias.to(dt))
        lw = lows if autocast else [(x.to(dt), v.to(dt)) for x, v in lows]
        with contextlib.nullcontext() if autocast else torch.autocast(hidden.device.type, enabled=False):
            lp = torch.empty(N, dtype=acc, device=hidden.device)
            ent = torch.empty(N if want_entropy else 0, dtype=acc, device=hidden.device)
            top = torch.empty(N if want_argmax else 0, dtype=torch.long, device=hidden.device)
            for s in range(0, N, chunk):
                e = min(N, s + chunk)
                h = hidden[s:e] if autocast else hidden[s:e].to(dt)
                z = _head_logits(h, w, b, [(x[s:e], v) for x, v in lw], temperature, autocast)
                if want_argmax:
                    top[s:e] = z.argmax(-1)
                logp = torch.log_softmax(z, dim=-1, dtype=acc)
                del z
                lp[s:e] = logp.gather(-1, labels[s:e, None]).squeeze(-1)
                if want_entropy:  # -p log p (0 at p = 0), in the block's own memory
                    ent[s:e] = torch.special.entr(logp.exp_(), out=logp).sum(-1)
                del logp
        ctx.save_for_backward(hidden, weight, bias, labels, ent, *lows_flat)
        ctx.meta = (temperature, want_entropy, chunk, dt, acc, len(lows))
        ctx.mark_non_differentiable(top)
        return lp, ent, top

    @staticmethod
    @once_differentiable
    def backward(ctx, g_lp, g_ent, _g_top):
        hidden, weight, bias, labels, ent, *lows_flat = ctx.saved_tensors
        temperature, want_entropy, chunk, dt, acc, n_low = ctx.meta
        lows = list(zip(lows_flat[0::2], lows_flat[1::2]))
        needs = ctx.needs_input_grad
        N = hidden.shape[0]
        if g_ent is not None and not want_entropy:
            g_ent = None
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(dt), None if bias is None else bias.to(dt)
            lw = [(x.to(dt), v.to(dt)) for x, v in lows]
            grad_h = torch.empty_like(hidden) if needs[0] else None
            grad_w = torch.zeros(weight.shape, dtype=torch.promote_types(weight.dtype, dt), device=weight.device) \
                if needs[1] else None
            grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if bias is not None and needs[2] else None
            grad_x = [torch.empty_like(x) if needs[8 + 2 * i] else None for i, (x, _) in enumerate(lows)]
            grad_v = [torch.zeros(v.shape, dtype=torch.promote_types(v.dtype, dt), device=v.device)
                      if needs[9 + 2 * i] else None for i, (_, v) in enumerate(lows)]
            for s in range(0, N, chunk):
                e = min(N, s + chunk)
                h = hidden[s:e].to(dt)
                xs = [(x[s:e], v) for x, v in lw]
                p = torch.log_softmax(_head_logits(h, w, b, xs, temperature), dim=-1, dtype=acc).exp_()
                glp = torch.zeros(e - s, dtype=acc, device=p.device) if g_lp is None else g_lp[s:e].to(acc)
                if g_ent is not None:  # d/dz [a logp_y + c H] = a (onehot_y - p) + c (entr(p) - p H)
                    ge = g_ent[s:e].to(acc)
                    grad = torch.special.entr(p).mul_(ge[:, None])
                    grad.addcmul_(p, (glp + ge * ent[s:e])[:, None], value=-1.0)
                else:
                    grad = p.mul_(-glp[:, None])
                del p
                grad.scatter_add_(-1, labels[s:e, None], glp[:, None])
                if grad_b is not None:
                    grad_b += grad.sum(0) / temperature
                gd = grad.to(dt)
                del grad
                if temperature != 1.0:
                    gd.div_(temperature)
                if grad_h is not None:
                    grad_h[s:e] = gd @ w
                if grad_w is not None:  # in place when the dtypes agree (no [V, H] temporary per chunk)
                    _accumulate(grad_w, gd.t(), h)
                for i, (x, v) in enumerate(xs):
                    if grad_x[i] is not None:
                        grad_x[i][s:e] = gd @ v
                    if grad_v[i] is not None:
                        _accumulate(grad_v[i], gd.t(), x)
                del gd
        lows_grads = [g for pair in zip(grad_x, grad_v) for g in pair]
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        lows_grads = [None if g is None else g.to(t.dtype) for g, t in zip(lows_grads, lows_flat)]
        return (grad_h, grad_w, grad_b, None, None, None, None, None, *lows_grads)


@torch.no_grad()
def linear_mean_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       low_rank: tuple[tuple[torch.Tensor, torch.Tensor], ...] = (),
                       temperature: float = 1.0) -> torch.Tensor:
    """The mean over the vocabulary of ``(hidden @ W^T + b + sum_i x_i @ w_i^T) / temperature`` [...], float32,
    without the logits: the mean of a linear map is the map of the mean row (``hidden @ mean(W)``)."""
    z = hidden.float() @ weight.float().mean(0)
    if bias is not None:
        z = z + bias.float().mean()
    for x, w in low_rank:
        z = z + x.float() @ w.float().mean(0)
    return z / temperature if temperature != 1.0 else z


def linear_token_stats(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                       bias: torch.Tensor | None = None,
                       low_rank: tuple[tuple[torch.Tensor, torch.Tensor], ...] = (),
                       temperature: float = 1.0, entropy: bool = False, argmax: bool = False,
                       mean_logits: bool = False, chunk_size: int | None = None,
                       ignore_index: int = -100) -> TokenStats:
    """Log-prob of each label, entropy and argmax of softmax(logits / temperature) where logits = hidden @ W^T + b
    (+ sum_i x_i @ w_i^T: a LoRA adapter's low-rank path, x_i = scaling x A_i^T(dropout(hidden)), w_i = B_i), without
    ever holding the logits of more than ``chunk_size`` tokens: the fused linear + log-softmax of Liger's kernels
    (Hsu et al. 2024), in PyTorch, with a backward that recomputes each chunk.

    hidden: [..., H] (any float dtype; under autocast the head computes in autocast's dtype, as ``nn.Linear``);
    weight: [V, H]; labels: [...] ids in [0, V) or ``ignore_index`` (those positions are not computed at all: 0 in
    every output, argmax -1, no gradient); bias: [V]; low_rank: pairs ([..., r], [V, r]).
    Returns :class:`TokenStats` of shape [...]: float32 log-probs (and entropies, nats) for bf16 / fp16 / fp32
    inputs, float64 for float64. Both are differentiable with respect to hidden, weight, bias and the low-rank
    pairs; detach the entropy when it is a metric only (its gradient is then not computed).
    ``chunk_size``: tokens per block (None: about 2**25 / V tokens, i.e. 128 MiB of float32 logits per block).
    Memory: O(chunk x V) beyond the inputs, in forward and backward; compute: the head's matmul twice (forward and
    recomputed in backward), as any recomputation. ``mean_logits``: :func:`linear_mean_logits` of each position.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)} disagree")
    V = weight.shape[0]
    chunk = max(1, LINEAR_CHUNK_ELEMENTS // V) if chunk_size is None else _chunk_tokens(V, chunk_size)
    shape = labels.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_y = labels.reshape(-1).long()
    lows = [(x.reshape(-1, x.shape[-1]), w) for x, w in low_rank]
    keep = flat_y != ignore_index
    everything = bool(keep.all())
    if not everything:  # only the positions with a label go through the head
        idx = keep.nonzero().squeeze(-1)
        flat_h, flat_y = flat_h.index_select(0, idx), flat_y.index_select(0, idx)
        lows = [(x.index_select(0, idx), w) for x, w in lows]
    if flat_y.numel() and (int(flat_y.min()) < 0 or int(flat_y.max()) >= V):
        raise ValueError(f"labels must lie in [0, {V}) or be the ignore index {ignore_index}")
    lp, ent, top = _LinearTokenStats.apply(flat_h, weight, bias, flat_y, float(temperature), bool(entropy),
                                           bool(argmax), chunk, *[t for pair in lows for t in pair])

    def place(t: torch.Tensor | None, fill) -> torch.Tensor | None:
        if t is None:
            return None
        if not everything:
            t = torch.full(keep.shape, fill, dtype=t.dtype, device=t.device).index_put((idx,), t)
        return t.reshape(shape)

    ml = linear_mean_logits(flat_h, weight, bias, tuple(lows), float(temperature)) if mean_logits else None
    return TokenStats(place(lp, 0.0), place(ent, 0.0) if entropy else None, place(top, -1) if argmax else None,
                      place(ml, 0.0))


def token_stats_from_logits(logits: torch.Tensor, labels: torch.Tensor, *, entropy: bool = False,
                            argmax: bool = False, mean_logits: bool = False, chunk_size: int | None = None,
                            ignore_index: int = -100) -> TokenStats:
    """:class:`TokenStats` from logits already made ([..., V]; a head that is not a linear map): the chunked
    :func:`token_logprobs` / :func:`entropy_from_logits`; positions labelled ``ignore_index`` hold 0 (argmax -1)."""
    keep = labels != ignore_index
    safe = torch.where(keep, labels, 0)
    lp = torch.where(keep, token_logprobs(logits, safe, chunk_size), 0.0)
    ent = torch.where(keep, entropy_from_logits(logits, chunk_size), 0.0) if entropy else None
    top = torch.where(keep, logits.argmax(-1), -1) if argmax else None
    ml = torch.where(keep, logits.detach().float().mean(-1), 0.0) if mean_logits else None
    return TokenStats(lp, ent, top, ml)
