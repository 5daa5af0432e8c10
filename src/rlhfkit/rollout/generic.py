"""The static engine's path for any other causal LM: the model's own modules, one token per row against our
preallocated KV cache, the step replayed as a CUDA graph on CUDA.

transformers 5.x sends every attention of a model that declares ``_supports_attention_backend`` through
``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``. We register one attention function (:data:`ATTENTION`)
and set it on the model's configs for the duration of a forward (:class:`Modules`), so the model computes everything
else as it always does (embeddings and their scale, norms, projections, q/k norms, RoPE, MLP, soft caps, head) and
hands us each layer's queries, keys and values after RoPE. We write the keys / values into the decoder's cache
layout (2L tensors ``[b, kv_heads, S, D]``, decoder.py) and attend with the decoder's masks (padding, causal, the
sliding window the model passes for the layer) and arithmetic (SDPA; soft-capped scores as transformers' eager
does). The static engine's loop is then the same for both paths: buckets, bucket moves, a repeated prompt prefilled
once, sampling, stop checks.

Why not transformers' ``StaticCache``: its sliding-window layer counts the tokens seen in a Python int
(``cumulative_length_int``), which a replayed CUDA graph cannot advance, and its update API changed between 5.17
(``cache_position``) and 5.24 (its own counter). With our cache every step has the same shapes and addresses, so one
captured graph serves every step of a bucket. Not compiled: ``torch.compile`` would have to trace transformers' whole
forward around our hook; the graph alone removes the kernel-launch overhead that makes eager decoding slow on a GPU.
A forward that cannot be captured (a host sync inside it) raises during the capture; the engine then says so in one
line and runs the steps eagerly, still correct.

Checked, not assumed (:func:`check_model`, once per model): a model whose layers keep state outside attention
(recurrent or linear-attention layers), share a cache between layers, or attend in a way our function does not know
(attention sinks, chunked attention, arguments it has never seen) must not decode silently wrong. Before its first
rollout, two short rows are prefilled and decoded two tokens through our cache and compared with the model's own full
forward (its usual attention, no cache); a difference beyond float rounding, or an attention argument we do not
understand, makes the engine use ``hf`` with one line saying why.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from .decoder import causal_lm, decode_masks, distinct_rows, prefill_masks, scores_attention
from .sampling import sample_next

ATTENTION = "rlhfkit_static"
_HARMLESS = {"position_ids", "cache_position", "use_cache", "output_attentions", "output_hidden_states",
             "return_dict", "position_embeddings", "past_key_values", "cache"}  # passed through, meaning nothing here


class NotCovered(Exception):
    """The model cannot run on this path (the message says why, one short phrase)."""


@dataclass
class _Call:
    """What the attention function needs during one forward: the phase, the cache, the masks' inputs."""

    mode: str  # "probe" (no cache: learn the layers' shapes), "prefill" or "decode"
    layers: dict  # the attention modules' layer_idx -> their position (the cache holds layer n at 2n, 2n + 1)
    cache: tuple = ()
    mask: torch.Tensor | None = None  # prefill / probe: the prompts' mask [B, P]
    valid: torch.Tensor | None = None  # decode: the slots' real prompt columns [b, S]
    col: torch.Tensor | None = None  # decode: the column written (1-element long tensor)
    p0: torch.Tensor | None = None  # decode: the padded prompt width
    shapes: list = field(default_factory=list)  # probe: (key shape, value shape) per layer, [Hkv, D]
    dtype: torch.dtype | None = None  # probe: the keys' dtype (the cache's)
    masks: dict = field(default_factory=dict)  # window -> the mask, built once per forward
    blocks: torch.Tensor | None = None  # prefill: [B, P] tokens attending to each other both ways (Gemma 3's images)

    def allowed(self, window: int | None) -> torch.Tensor:
        if window not in self.masks:
            self.masks[window] = (decode_masks(self.valid, self.col, self.p0, [window]) if self.mode == "decode"
                                  else prefill_masks(self.mask, [window], self.blocks))[window]
        return self.masks[window]


_ACTIVE: list[_Call] = []


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The attention function the model calls (transformers' signature): q [B, H, T, D], k / v [B, Hkv, T, D] after
    RoPE; returns ([B, T, H, Dv], None). ``attention_mask`` is ignored (transformers builds none for an attention
    implementation it does not know; the masks are ours)."""
    if not _ACTIVE:
        raise RuntimeError(f"the attention implementation {ATTENTION!r} runs only inside rlhfkit's static engine")
    call = _ACTIVE[-1]
    if getattr(module, "is_causal", True) is False:
        raise NotCovered("non-causal attention")
    window, softcap = kwargs.pop("sliding_window", None), kwargs.pop("softcap", None)
    odd = sorted(k for k, v in kwargs.items() if k not in _HARMLESS and v is not None and v is not False)
    if odd:
        raise NotCovered(f"attention argument{'s' if len(odd) > 1 else ''} {', '.join(odd)}")
    idx = getattr(module, "layer_idx", None)
    if not isinstance(idx, int):
        raise NotCovered("attention modules without a layer_idx")
    if call.mode == "probe":
        if idx in call.layers:
            raise NotCovered(f"layer {idx} attending twice in one forward")
        call.layers[idx] = len(call.layers)
        call.dtype = key.dtype
        call.shapes.append((tuple(key.shape[1:2]) + tuple(key.shape[3:]), tuple(value.shape[1:2]) +
                            tuple(value.shape[3:])))
    elif idx not in call.layers:
        raise NotCovered(f"layer {idx} attending without having done so in the probe")
    n = call.layers[idx]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    B, H, T, _ = query.shape
    Hkv = key.shape[1]
    allowed = call.allowed(window)
    if call.mode == "decode":
        keys, values = call.cache[2 * n], call.cache[2 * n + 1]
        keys.index_copy_(2, call.col, key)
        values.index_copy_(2, call.col, value)
        q = query.reshape(B, Hkv, H // Hkv, query.shape[-1])  # query heads grouped per key/value head
        out = scores_attention(q, keys, values, allowed, scale, softcap).reshape(B, H, 1, values.shape[-1])
    else:
        if call.mode == "prefill":
            call.cache[2 * n][:B, :, :T] = key
            call.cache[2 * n + 1][:B, :, :T] = value
        rep = H // Hkv
        out = scores_attention(query, key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1), allowed, scale,
                               softcap)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _attention)


_register()


def coverage(model) -> str | None:
    """None when the model may run on this path (:func:`check_model` then checks its arithmetic), else why not."""
    lm = causal_lm(model)
    name = type(lm).__name__
    cfg = getattr(lm, "config", None)
    if cfg is None or not hasattr(cfg, "_attn_implementation_internal"):
        return f"{name} is not a transformers model"
    if not getattr(type(lm), "_supports_attention_backend", False):
        return f"{name} does not take a custom attention function"
    text = cfg.get_text_config()
    other = set(getattr(text, "layer_types", None) or ()) - {"full_attention", "sliding_attention"}
    if other:
        return f"{name} with layer types {sorted(other)}"
    if getattr(text, "attention_chunk_size", None) or getattr(text, "use_bidirectional_attention", False):
        return f"{name} with chunked or bidirectional attention"
    if hasattr(model, "peft_config") and any(getattr(c, "is_prompt_learning", False)
                                             for c in model.peft_config.values()):
        return "a prompt-learning PEFT adapter"
    return None


@dataclass(frozen=True)
class Layout:
    """What :func:`check_model` learned about a model's attention layers: the keys' and values' shapes
    ``([Hkv, Dk], [Hkv, Dv])`` per layer in call order, each layer's ``layer_idx`` -> position, the vocabulary and
    the cache's dtype. Holds no reference to the model (the engine keeps one per model, weakly keyed)."""

    shapes: tuple
    layers: tuple  # (layer_idx, position) pairs
    vocab: int
    dtype: torch.dtype


class Modules:
    """A causal LM's own forward with our attention, for one call: the first argument of :func:`module_step` (in the
    place of the decoder's weights)."""

    def __init__(self, model, layout: Layout):
        self.lm = causal_lm(model)
        self.layout = layout
        self.shapes, self.layers, self.vocab, self.dtype = layout.shapes, dict(layout.layers), layout.vocab, \
            layout.dtype
        self.configs = _configs(self.lm)
        self.logits_to_keep = "logits_to_keep" in inspect.signature(self.lm.forward).parameters

    def tensors(self) -> list[torch.Tensor]:
        """Every parameter and buffer (a CUDA graph reads them at their addresses)."""
        return [*self.lm.parameters(), *self.lm.buffers()]

    def logits(self, call: _Call, ids: torch.Tensor, positions: torch.Tensor, **extra) -> torch.Tensor:
        """The float32 logits [B, V] of the last position of ``ids`` [B, T] at RoPE ``positions`` [B, T] (M-RoPE:
        [3, B, T]); ``extra``: more inputs of the forward (a VLM's image features, ``models.vision``)."""
        kwargs = {"logits_to_keep": 1, **extra} if self.logits_to_keep else extra
        _ACTIVE.append(call)
        saved = [(c, c._attn_implementation_internal) for c in self.configs]
        try:
            for c, _ in saved:
                c._attn_implementation_internal = ATTENTION
            # a mask of ones: the masks are ours (transformers builds none for an implementation it does not know);
            # without one, some models look for padding in the ids (a warning, and a host sync)
            out = self.lm(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=positions,
                          use_cache=False, **kwargs)
        finally:
            for c, value in saved:
                c._attn_implementation_internal = value
            _ACTIVE.pop()
        return out.logits[:, -1].float()


def _configs(lm) -> list:
    """Every config object the model's modules read ``_attn_implementation`` from (sub-configs included)."""
    found: dict[int, object] = {}

    def add(cfg):
        if cfg is not None and hasattr(cfg, "_attn_implementation_internal") and id(cfg) not in found:
            found[id(cfg)] = cfg
            for key in getattr(cfg, "sub_configs", {}) or {}:
                add(getattr(cfg, key, None))

    add(lm.config)
    for m in lm.modules():
        add(getattr(m, "config", None))
    return list(found.values())


def allocate_cache(modules: Modules, b: int, S: int, device) -> tuple[torch.Tensor, ...]:
    """Keys and values of every attention layer, ``[b, kv_heads, S, D]`` each, in the layers' order."""
    return tuple(torch.zeros(b, *shape[:1], S, *shape[1:], dtype=modules.dtype, device=device)
                 for pair in modules.shapes for shape in pair)


def module_prefill(modules: Modules, ids: torch.Tensor, mask: torch.Tensor, cache: tuple[torch.Tensor, ...],
                   cos_tab=None, sin_tab=None) -> torch.Tensor:
    """:func:`~.decoder.prefill` through the model's own modules: keys / values of the left-padded prompts into rows
    :B, columns :P of the cache, the logits of each prompt's last position; a repeated prompt runs once. (``cos_tab``
    / ``sin_tab``: unused, the model applies its own RoPE.)"""
    B, P = ids.shape
    first, inverse = distinct_rows(ids, mask)
    run_ids, run_mask = (ids[first], mask[first]) if len(first) < B else (ids, mask)
    positions = (run_mask.cumsum(-1) - 1).clamp(min=0)
    logits = modules.logits(_Call("prefill", modules.layers, cache, mask=run_mask), run_ids, positions)
    if len(first) < B:
        for c in cache:
            c[:B, :, :P] = c[inverse, :, :P]
        return logits[inverse]
    return logits


def module_logits(modules: Modules, cache: tuple[torch.Tensor, ...], tok: torch.Tensor, pos: torch.Tensor,
                  col: torch.Tensor, p0: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """:func:`~.decoder.decode_logits` through the model's own modules (same arguments but the RoPE tables)."""
    call = _Call("decode", modules.layers, cache, valid=valid, col=col, p0=p0)
    return modules.logits(call, tok[:, None], pos[:, None])


def check_model(model) -> Layout:
    """Learn the layers' cache shapes and check this path against the model's own forward (see the module
    docstring); raises :class:`NotCovered` with the reason. Two rows (one left-padded) of 6 token ids: prefill the
    first 4 columns, decode the last 2; their logits must equal the full forward's at those positions (float32:
    within 1e-3 of the logits' scale; 16-bit: 5e-2, rounding of other kernels)."""
    lm = causal_lm(model)
    device = next(lm.parameters()).device
    ids = torch.tensor([[3, 4, 5, 6, 7, 8], [0, 0, 5, 4, 3, 6]], device=device)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    kwargs = {"logits_to_keep": 0} if "logits_to_keep" in inspect.signature(lm.forward).parameters else {}
    ref = lm(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, **kwargs).logits.float()
    probe = _Call("probe", {}, mask=mask[:, :4])
    Modules(model, Layout((), (), ref.shape[-1], torch.float32)).logits(probe, ids[:, :4], positions[:, :4])
    if not probe.layers:
        raise NotCovered("no attention through the attention interface")
    layout = Layout(tuple(probe.shapes), tuple(probe.layers.items()), ref.shape[-1], probe.dtype)
    modules = Modules(model, layout)
    dtype = layout.dtype
    cache = allocate_cache(modules, 2, 8, device)
    got = [module_prefill(modules, ids[:, :4], mask[:, :4], cache)]
    valid = torch.zeros(2, 8, dtype=torch.bool, device=device)
    valid[:, :4] = mask[:, :4].bool()
    p0 = torch.tensor([4], device=device)
    for c in (4, 5):
        got.append(module_logits(modules, cache, ids[:, c], positions[:, c], torch.tensor([c], device=device), p0,
                                 valid))
    want = ref[:, 3:6].transpose(0, 1)  # positions 3, 4, 5 predict columns 4, 5, 6
    err = (torch.stack(got) - want).abs().max().item()
    tol = (1e-3 if dtype == torch.float32 else 5e-2) * (1.0 + want.abs().max().item())
    if not err <= tol:
        raise NotCovered(f"its cached decode differs from its own forward by {err:.3g} (tolerance {tol:.3g})")
    return layout


def module_step(modules: Modules, cache: tuple[torch.Tensor, ...], tok: torch.Tensor, pos: torch.Tensor,
                col: torch.Tensor, p0: torch.Tensor, valid: torch.Tensor, cos=None, sin=None, *sampling,
                greedy: bool, filters: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~.static.decode_step` through the model's own modules (the same arguments; ``cos`` / ``sin`` unused)."""
    return sample_next(module_logits(modules, cache, tok, pos, col, p0, valid), col, p0, *sampling, greedy=greedy,
                       filters=filters)
