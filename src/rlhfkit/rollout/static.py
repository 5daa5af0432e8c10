"""The ``static`` engine: our own decode loop over a preallocated KV cache, one compiled step per batch bucket.

Why our own loop rather than transformers' (``generate`` with ``cache_implementation="static"`` and
``torch.compile``, which :class:`~.hf.HFEngine` also offers): on an H100 (issue 18; SmolLM2-135M shape, bf16, batch
64, 256 new tokens) ``generate`` eager gave 1,747 tok/s, ``generate`` + static cache + compile 11,107 tok/s, and the
whole decode step replayed as one CUDA graph 17,079 tok/s: ``generate`` keeps a Python loop of logits processors,
stopping criteria and cache bookkeeping around the compiled forward, and syncs with the host for its stopping
checks. On 2 CPU cores, uncompiled, the same loop saves transformers' per-step overhead (``bench/engines.py``;
figures in ``rollout/auto.py``).

One call, per micro-batch of B left-padded prompts (width P), R = ``max_new_tokens``:

1. the decoder's weights are read in place (:func:`~.decoder.read_weights`; a model it does not cover is generated
   by ``hf``, with one line saying why);
2. a slot set of the bucket b >= B (powers of two) holds the KV cache (2L tensors ``[b, kv_heads, S, D]``) with
   S = P + R rounded up to ``cache_multiple``, the current token / position of each slot, the prompt validity mask
   and the sampling settings, all preallocated and kept between calls (a CUDA graph reads fixed addresses);
3. prefill: the prompts through every layer with SDPA (eager), keys / values into the cache, the first token drawn;
4. decode: one step per token (:func:`decode_step`: forward of one token per slot against the cache, then
   :func:`~.sampling.sample_tokens` -- temperature, top-k, top-p, the token and its log-prob -- inside the same
   compiled function), replayed from a CUDA graph on CUDA; the Gumbel noise of each step comes from a generator
   seeded per call, outside the graph, so a seed reproduces a run with or without compile / graphs;
5. every ``sync_every`` tokens (not every token) the host reads which slots have ended (EOS, or a stop string in the
   decoded tail); when all have, decoding stops; when the live rows fit the next smaller bucket, they move there
   (their cache rows copied) and the finished rows drop out of the batch.

The raw ids and log-probs go to :func:`~.engine.finish_rollout` like every engine's. Memory: the caches of the
buckets used stay allocated between calls (for SmolLM2-135M at batch 64 x 512 columns in bf16: 0.75 GiB for the
largest bucket, less than twice that for all) until :meth:`StaticEngine.release` drops them (the online loop does
after each rollout: ``memory.release_engine_cache``). Compile: ``torch.compile`` of the step, once per (bucket,
cache width, greedy / sampled) with transformers-style automatic dynamic shapes after the first recompile; the time of
each first call is logged and returned by ``take_stats`` (``time/rollout_compile``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from ..errors import say
from .decoder import Weights, coverage, decode_logits, prefill, read_weights, rope_tables
from .engine import Engine, register
from .hf import HFEngine
from .sampling import SamplingParams, gumbel_noise, sample_tokens


def decode_step(w: Weights, cache: tuple[torch.Tensor, ...], tok: torch.Tensor, pos: torch.Tensor, col: torch.Tensor,
                p0: torch.Tensor, valid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, gumbel: torch.Tensor,
                temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, banned: torch.Tensor,
                min_new: torch.Tensor, *, greedy: bool, filters: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step of every slot: ``(next tokens [b], their log-probs [b])``. Writes only the cache column
    ``col`` (so running it twice on the same inputs is harmless: a CUDA graph's warm-up does). The response token
    drawn now has index ``col - p0 + 1``; EOS (``banned``) is impossible while that is below ``min_new``."""
    logits = decode_logits(w, cache, tok, pos, col, p0, valid, cos, sin)
    ban = banned & ((col - p0 + 1) < min_new)
    return sample_tokens(logits, None if greedy else gumbel, temperature=temperature, top_k=top_k, top_p=top_p,
                         banned=ban, filters=filters)


_LIMIT = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"  # torch < 2.6
_COMPILED: list = []  # torch.compile(decode_step), made once per process and shared by every static engine


def compiled_step():
    """``torch.compile(decode_step)`` (fullgraph: a graph break would fail loudly rather than run half eager)."""
    if not _COMPILED:
        _COMPILED.append(torch.compile(decode_step, fullgraph=True))
    return _COMPILED[0]


def bucket_of(n: int) -> int:
    """The smallest power of two >= n."""
    return 1 << max(0, n - 1).bit_length()


@dataclass
class Slots:
    """The live batch of one bucket: every buffer a decode step reads, allocated once per (bucket, cache shape)."""

    cache: tuple[torch.Tensor, ...]  # 2L x [b, kv_heads, S, D]: keys, values of each layer
    tok: torch.Tensor  # [b] long: the token each slot feeds next
    pos: torch.Tensor  # [b] long: its RoPE position
    valid: torch.Tensor  # [b, S] bool: real prompt columns
    done: torch.Tensor  # [b] bool
    rows: torch.Tensor  # [b] long: output row of each slot (B, a scratch row, for filler slots)
    col: torch.Tensor  # [1] long: cache column of the token fed next (the same for every slot)
    p0: torch.Tensor  # [1] long: padded prompt width P
    cos: torch.Tensor  # [S, D]
    sin: torch.Tensor
    gumbel: torch.Tensor  # [b, V] float32
    temperature: torch.Tensor  # 0-d float32
    top_p: torch.Tensor
    top_k: torch.Tensor  # 0-d long
    min_new: torch.Tensor
    banned: torch.Tensor  # [V] bool: the EOS ids
    graphs: dict = field(default_factory=dict)  # (greedy, filters) -> CudaGraphStep

    @classmethod
    def allocate(cls, w: Weights, b: int, S: int, device: torch.device, dtype: torch.dtype) -> Slots:
        V = w.head.shape[0]

        def z(*shape, dt=torch.long):
            return torch.zeros(shape, dtype=dt, device=device)

        return cls(cache=tuple(z(b, w.kv_heads, S, w.head_dim, dt=dtype) for _ in range(2 * len(w.layers))),
                   tok=z(b), pos=z(b),
                   valid=z(b, S, dt=torch.bool), done=z(b, dt=torch.bool), rows=z(b), col=z(1), p0=z(1),
                   cos=z(S, w.head_dim, dt=dtype), sin=z(S, w.head_dim, dt=dtype), gumbel=z(b, V, dt=torch.float32),
                   temperature=z(dt=torch.float32), top_p=z(dt=torch.float32), top_k=z(), min_new=z(),
                   banned=z(V, dt=torch.bool))

    @property
    def size(self) -> int:
        return int(self.tok.shape[0])

    @property
    def width(self) -> int:
        return int(self.valid.shape[1])

    def set_call(self, params: SamplingParams, eos_ids: list[int], cos: torch.Tensor, sin: torch.Tensor,
                 P: int) -> None:
        """The settings of this call, copied into the buffers (the addresses stay)."""
        self.temperature.fill_(params.temperature if params.temperature > 0 else 1.0)
        self.top_p.fill_(params.top_p)
        self.top_k.fill_(params.top_k)
        self.min_new.fill_(params.min_new_tokens)
        self.banned.zero_()
        self.banned[torch.tensor(eos_ids, device=self.banned.device)] = True
        self.cos.copy_(cos)
        self.sin.copy_(sin)
        self.p0.fill_(P)
        self.col.fill_(P)

    def start(self, first: torch.Tensor, mask: torch.Tensor, eos: torch.Tensor) -> None:
        """Rows 0..B-1 in slots 0..B-1 after the prefill (``first``: their first response token); the rest filler."""
        B, P = mask.shape
        self.tok.fill_(0)
        self.tok[:B] = first
        self.pos.zero_()
        self.pos[:B] = mask.sum(-1)  # the first response token sits at position len(prompt)
        self.valid.zero_()
        self.valid[:B, :P] = mask.bool()
        self.done.fill_(True)
        self.done[:B] = torch.isin(first, eos)
        self.rows.fill_(B)
        self.rows[:B] = torch.arange(B, device=self.rows.device)

    def take(self, other: Slots, live: torch.Tensor, scratch_row: int) -> None:
        """Move the slots ``live`` (indices into ``other``) here, in order; the remaining slots are filler."""
        n = len(live)
        pick = torch.cat([live, live[:1].expand(self.size - n)])  # fillers copy a live slot (finite values)
        for mine, theirs in zip(self.cache, other.cache):
            torch.index_select(theirs, 0, pick, out=mine)
        for name in ("tok", "pos", "valid"):
            getattr(self, name).copy_(getattr(other, name).index_select(0, pick))
        self.done.fill_(True)
        self.done[:n] = False
        self.rows.fill_(scratch_row)
        self.rows[:n] = other.rows[live]
        for name in ("col", "p0", "cos", "sin", "temperature", "top_p", "top_k", "min_new", "banned"):
            getattr(self, name).copy_(getattr(other, name))

    def step_args(self, w: Weights) -> tuple:
        return (w, self.cache, self.tok, self.pos, self.col, self.p0, self.valid, self.cos, self.sin, self.gumbel,
                self.temperature, self.top_k, self.top_p, self.banned, self.min_new)


class CudaGraphStep:
    """One decode step captured as a CUDA graph over a slot set's buffers and the model's weights (explicit
    ``torch.cuda.CUDAGraph``). Replays read the buffers' current contents; the weights must stay at the addresses
    they had at capture (``weight_ptrs``, checked by the caller before each call's first replay)."""

    def __init__(self, fn, args: tuple, kwargs: dict, weight_ptrs: tuple[int, ...]):
        self.weight_ptrs = weight_ptrs
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capture: compiles, sets up cuBLAS / SDPA workspaces
            for _ in range(2):
                fn(*args, **kwargs)  # the step only rewrites the cache column it writes anyway
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn(*args, **kwargs)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.graph.replay()
        return self.out


@register
class StaticEngine(Engine):
    """Our decode loop (see the module docstring). Settings (``generation.engine_kwargs``): ``compile``
    (``torch.compile`` the decode step), ``cuda_graphs`` (replay the step as a CUDA graph; CUDA only, ignored
    elsewhere), ``sync_every`` (tokens between the host's checks for ended rows), ``cache_multiple`` (the cache
    width is rounded up to a multiple of it, so prompts of similar widths share a compiled step)."""

    name = "static"

    def __init__(self, tokenizer=None, *, eos_token_ids, pad_token_id, stop_strings=(), batch_size=None,
                 compile: bool = True, cuda_graphs: bool = True, sync_every: int = 8, cache_multiple: int = 64):
        super().__init__(tokenizer, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                         stop_strings=stop_strings, batch_size=batch_size)
        if sync_every < 1 or cache_multiple < 1:
            raise ValueError("static engine: sync_every and cache_multiple must be >= 1")
        self.compile, self.cuda_graphs = bool(compile), bool(cuda_graphs)
        self.sync_every, self.cache_multiple = int(sync_every), int(cache_multiple)
        self.fallback = HFEngine(tokenizer, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                                 stop_strings=stop_strings, batch_size=batch_size)
        self._slots: dict[tuple, Slots] = {}
        self._first_calls: set[tuple] = set()

    def release(self) -> None:
        """Drop every bucket's slots: their KV caches, buffers and captured CUDA graphs (with the graphs' memory
        pools); the next call allocates the buckets it uses again (the compiled step is kept: same shapes, no
        recompile)."""
        self._slots.clear()
        self.fallback.release()

    # ── the call ─────────────────────────────────────────────────────────────────────────────────────────────
    def _decode(self, model, ids, mask, params, seed):
        reason = coverage(model)
        if reason is not None:
            self.say_once(f"[rollout] static engine: {reason} is not covered; generating with hf")
            return self.fallback._decode(model, ids, mask, params, seed)
        return self.decode_covered(model, ids, mask, params, seed)

    def decode_covered(self, model, ids, mask, params, seed):
        """``_decode`` of a model :func:`~.decoder.coverage` accepted (``auto`` checks that once, in its pick)."""
        w = read_weights(model)
        device, dtype = ids.device, w.embed.dtype
        B, P = ids.shape
        R = params.max_new_tokens
        S = -(-(P + R) // self.cache_multiple) * self.cache_multiple
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        out_ids = torch.full((R, B + 1), self.pad_token_id, dtype=torch.long, device=device)  # row B: scratch
        out_lp = torch.zeros((R, B + 1), dtype=torch.float32, device=device)
        ptrs = tuple(t.data_ptr() for t in w.tensors())
        with torch.autocast(device.type, enabled=False):  # the weights' own dtype, whatever the caller's autocast
            cos, sin = rope_tables(model, S, device, dtype)
            slots = self._slots_for(w, bucket_of(B), S, device, dtype)
            slots.set_call(params, self.eos_token_ids, cos, sin, P)
            # 1. prefill and the first token
            logits = prefill(w, ids, mask, slots.cache, cos, sin)
            noise = None if params.greedy else gumbel_noise((B, logits.shape[-1]), gen, device)
            first, lp = sample_tokens(logits, noise, temperature=slots.temperature, top_k=slots.top_k,
                                      top_p=slots.top_p, banned=slots.banned if params.min_new_tokens > 0 else None,
                                      filters=params.filters)
            out_ids[0, :B], out_lp[0, :B] = first, lp
            eos = torch.tensor(self.eos_token_ids, device=device)
            slots.start(first, mask, eos)
            # 2. one step per token; the host looks at the ended rows every sync_every tokens
            end = R
            for t in range(1, R):  # token t is drawn from the step fed with token t - 1
                if (t - 1) % self.sync_every == 0:
                    slots = self._sync(w, slots, out_ids, t, B, S, device, dtype)
                    if slots is None:
                        end = t
                        break
                if not params.greedy:
                    gumbel_noise(slots.gumbel.shape, gen, device, out=slots.gumbel)
                tok, lp = self._run_step(w, slots, params, ptrs)
                slots.tok.copy_(tok)
                slots.pos.add_(1)
                slots.col.add_(1)
                slots.done |= torch.isin(tok, eos)
                out_ids[t].index_copy_(0, slots.rows, tok)
                out_lp[t].index_copy_(0, slots.rows, lp)
        return out_ids[:end, :B].T, out_lp[:end, :B].T

    def _sync(self, w, slots: Slots, out_ids: torch.Tensor, t: int, B: int, S: int, device, dtype) -> Slots | None:
        """After ``t`` tokens: mark slots whose tail holds a stop string as done; None when every row has ended,
        else the slots of the smallest bucket that holds the live rows (the same slots when that is no smaller)."""
        done = slots.done.cpu()
        rows = slots.rows.cpu()
        if self.stop_strings:
            window = self.sync_every + max(len(s) for s in self.stop_strings) + 8
            tails = out_ids[max(0, t - window):t].T.cpu()
            for slot in range(slots.size):
                r = int(rows[slot])
                if r < B and not done[slot]:
                    text = self.tokenizer.decode(tails[r].tolist(), skip_special_tokens=False)
                    if any(s in text for s in self.stop_strings):
                        done[slot] = True
            slots.done.copy_(done)
        live = ((rows < B) & ~done).nonzero().flatten()
        if len(live) == 0:
            return None
        b = bucket_of(len(live))
        if b >= slots.size:
            return slots
        smaller = self._slots_for(w, b, S, device, dtype)
        smaller.take(slots, live.to(device), B)
        return smaller

    def _slots_for(self, w: Weights, b: int, S: int, device, dtype) -> Slots:
        key = (b, S, len(w.layers), w.kv_heads, w.head_dim, w.head.shape[0], dtype, str(device))
        if key not in self._slots:
            self._slots[key] = Slots.allocate(w, b, S, device, dtype)
        return self._slots[key]

    def _run_step(self, w: Weights, slots: Slots, params: SamplingParams,
                  ptrs: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step: eager, compiled, or replayed from a CUDA graph; the first call of each variant is
        timed and counted as compile time."""
        flags = {"greedy": params.greedy, "filters": params.filters}
        graphs = self.cuda_graphs and slots.tok.device.type == "cuda"
        if graphs:
            graph = slots.graphs.get((params.greedy, params.filters))
            if graph is not None and graph.weight_ptrs == ptrs:
                return graph()
        fn = compiled_step() if self.compile else decode_step
        key = (slots.size, slots.width, params.greedy, params.filters, graphs)
        first = key not in self._first_calls and (self.compile or graphs)
        t0 = time.perf_counter()
        # compiled: room for buckets x cache widths x greedy / sampled (the eager step needs no dynamo setting)
        with torch._dynamo.config.patch(**{_LIMIT: 64}) if self.compile else contextlib.nullcontext():
            if graphs:
                graph = CudaGraphStep(fn, slots.step_args(w), flags, ptrs)
                slots.graphs[(params.greedy, params.filters)] = graph
                out = graph()
            else:
                out = fn(*slots.step_args(w), **flags)
        if first:
            self._first_calls.add(key)
            seconds = time.perf_counter() - t0
            self.compile_seconds += seconds
            what = "compiled" + (" and captured" if graphs else "") if self.compile else "captured"
            if seconds >= 1.0:  # (a step compiled by another static engine of this process is only looked up)
                say(f"[rollout] static engine: decode step for batch {slots.size} x {slots.width} cache "
                    f"columns ({'greedy' if params.greedy else 'sampled'}) {what} in {seconds:.1f} s")
        return out
