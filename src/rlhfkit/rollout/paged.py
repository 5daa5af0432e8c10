"""A paged KV cache and the decoder's forward over it, for the continuous engine (``rollout/continuous.py``).

The cache is a pool of fixed-size blocks shared by every sequence: per layer, keys and values of shape
``[blocks + 1, block_size, kv_heads, head_dim]`` (block 0 is a scratch block: idle slots and padding write there, no
live sequence reads it). A sequence holds a list of blocks (its *block table*): position p of the sequence lives in
block ``table[p // block_size]`` at offset ``p % block_size``. Blocks are reference-counted, so a group's prompt is
written once and its full blocks are read by every sample of the group.

:func:`paged_forward` runs rows of tokens (one token per row for a decode step, a chunk of a prompt per row for a
prefill) through the decoder's own layers (:func:`~.decoder._layer`, the arithmetic the static engine and
transformers use): each row writes its new keys / values into its blocks, gathers its blocks into a dense
``[kv_heads, W, head_dim]`` view and attends to the positions up to its own (SDPA with a boolean mask, the query
heads grouped per key / value head as in :func:`~.decoder.decode_logits`; a sliding-window layer within its window;
the model's scale and soft cap through :func:`~.decoder.attention`). The gather is a copy of the row's cache per
layer: without a paged-attention kernel this is the price of paging in plain PyTorch, and it is why the gathered
width W is bucketed to the longest live sequence rather than to the longest possible one (the static engine attends
over its whole cache width at every step as well).
"""

from __future__ import annotations

import torch

from .decoder import Weights, _embed, _layer, _logits, _tables, attention

SCRATCH = 0  # the block where idle slots and padding write


class BlockPool:
    """The blocks of a paged cache: the tensors (``caches``: keys and values of each layer, 2L tensors) and their
    bookkeeping (a free list, a reference count per block). Allocation takes the lowest free block first, so a
    schedule places its sequences in the same blocks every time."""

    def __init__(self, w: Weights, blocks: int, block_size: int, device: torch.device, dtype: torch.dtype):
        shape = (blocks + 1, block_size, w.kv_heads, w.head_dim)
        self.caches = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(2 * len(w.layers)))
        self.blocks, self.block_size = blocks, block_size
        self.refs = [0] * (blocks + 1)
        self.free = list(range(blocks, 0, -1))  # a stack: pop() gives the lowest free block

    @property
    def available(self) -> int:
        return len(self.free)

    @property
    def used(self) -> int:
        return self.blocks - len(self.free)

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` positions."""
        return -(-tokens // self.block_size)

    def take(self, n: int) -> list[int] | None:
        """``n`` fresh blocks (reference count 1), or None (nothing taken) when fewer are free."""
        if n > len(self.free):
            return None
        out = [self.free.pop() for _ in range(n)]
        for b in out:
            self.refs[b] = 1
        return out

    def share(self, blocks: list[int]) -> None:
        for b in blocks:
            self.refs[b] += 1

    def release(self, blocks: list[int]) -> None:
        for b in blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free.append(b)
        self.free.sort(reverse=True)

    def copy(self, src: list[int], dst: list[int]) -> None:
        """Copy whole blocks ``src`` into ``dst`` (every layer's keys and values)."""
        if src:
            s = torch.tensor(src, device=self.caches[0].device)
            d = torch.tensor(dst, device=self.caches[0].device)
            for c in self.caches:
                c.index_copy_(0, d, c.index_select(0, s))


def paged_forward(w: Weights, caches: tuple[torch.Tensor, ...], ids: torch.Tensor, pos: torch.Tensor,
                  table: torch.Tensor, last: torch.Tensor, cos_tab: torch.Tensor,
                  sin_tab: torch.Tensor, shift: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of tokens through the decoder over a paged cache -> the logits [n, V] (float32) at column ``last[i]`` of
    row i.

    ids / pos [n, C]: the tokens of each row and their positions in the row's sequence (-1: padding, written to
    the scratch block, its output unused); table [n, Wb] long: each row's blocks (0 past its end); the keys /
    values of every real token are written first, then each token attends to its sequence's positions 0..pos
    (read from the row's blocks, the current chunk included). A position whose block index is past the table
    writes to the scratch block. Every shape is fixed by the arguments, so a decode step (C = 1, fixed n and Wb)
    can be captured as a CUDA graph. ``shift`` [n]: each row's rotary shift (the rotary position is ``pos + shift``:
    M-RoPE after a prompt's images, ``rollout/vision.py``; None: 0)."""
    n, C = ids.shape
    Wb = table.shape[1]
    bs = caches[0].shape[1]
    W = Wb * bs
    real = pos >= 0
    p = pos.clamp(min=0)
    index = p // bs
    block = torch.where(real & (index < Wb), table.gather(1, index.clamp(max=Wb - 1)),
                        torch.full_like(index, SCRATCH))
    offset = p % bs
    rot = p if shift is None else (p + shift[:, None]).clamp(min=0)
    cos, sin = _tables(cos_tab, rot)[:, :, None], _tables(sin_tab, rot)[:, :, None]  # [K, n, 1, C, D]: K RoPE tables
    rep = w.heads // w.kv_heads
    keys_at = torch.arange(W, device=ids.device)[None, None, :]
    allowed = {}  # window -> [n, 1, rep * C, W]: the query heads grouped per key / value head
    for window in w.windows:
        ok = (keys_at <= p[:, :, None]) & (True if window is None else keys_at > p[:, :, None] - window)  # [n, C, W]
        allowed[window] = ok[:, None].expand(n, rep, C, W).reshape(n, 1, rep * C, W)
    h = _embed(w, ids)
    for i, layer in enumerate(w.layers):
        def attend(q, k, v, i=i, window=layer.window):
            keys, values = caches[2 * i], caches[2 * i + 1]
            keys[block, offset] = k.transpose(1, 2).to(keys.dtype)
            values[block, offset] = v.transpose(1, 2).to(values.dtype)
            kk = keys[table].reshape(n, W, w.kv_heads, w.head_dim).transpose(1, 2)
            vv = values[table].reshape(n, W, w.kv_heads, w.head_dim).transpose(1, 2)
            qg = q.reshape(n, w.kv_heads, rep * C, w.head_dim)
            out = attention(w, qg, kk, vv, allowed[window])
            return out.view(n, w.kv_heads, rep, C, w.head_dim).reshape(n, w.heads, C, w.head_dim) \
                .transpose(1, 2).reshape(n, C, w.heads * w.head_dim)

        h = _layer(w, layer, h, cos[layer.rope], sin[layer.rope], attend)
    return _logits(w, h[torch.arange(n, device=ids.device), last][:, None])
