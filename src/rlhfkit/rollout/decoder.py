"""The Llama-family decoder as plain functions over the model's own weight tensors, for the static engine.

:func:`read_weights` collects the parameters of a ``transformers`` model (``LlamaForCausalLM``,
``Qwen2ForCausalLM``, ``MistralForCausalLM`` without a sliding window; PEFT LoRA merged) as they are, no copy: the
optimizer's in-place updates are seen by the next call. :func:`prefill` runs the left-padded prompts through every
layer with SDPA and writes their keys / values into a preallocated cache; :func:`decode_logits` runs one token per row
against that cache. The arithmetic is transformers' own, op for op (RMSNorm in float32, rotate-half RoPE from the
model's own rotary module, SiLU-gated MLP, ``head_dim ** -0.5`` scaling), so greedy decoding gives the tokens
``generate`` gives (tested against ``hf``); it departs only where it saves work: one query token attends to the
cache with the query heads grouped per key/value head (no ``repeat_kv`` copy of the cache), and the cache has a
fixed width with a validity mask instead of growing.

Cache layout: a tuple of 2L tensors ``[batch, kv_heads, S, head_dim]``, keys then values of each layer. Separate
tensors, not one ``[L, 2, ...]`` tensor: ``torch.compile`` updates a whole input tensor in place, but an in-place
write into a view of a larger input became a copy of the whole cache per layer (measured on 1 CPU core for
SmolLM2's cache at batch 8 x 128 columns: 892 ms per step against 0.13 ms). Prompts are left-padded to width P; the
response token t of every row sits in column P + t; ``valid [batch, S]`` marks the real prompt columns and every
column from P up to the current one is valid for every row.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

DECODERS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
ROPE_TYPES = ("default", "linear", "llama3")  # inverse frequencies fixed at build (no dependence on the length)


class Weights(NamedTuple):
    """The tensors of a decoder, by reference. ``layers[i]`` = (ln1, q, q_bias, k, k_bias, v, v_bias, o, o_bias,
    ln2, gate, up, down); biases are None where the model has none (Qwen2 has q/k/v biases). A named tuple, not an
    object: ``torch.compile`` guards a tuple by its contents (shapes, dtypes, the ints), an object by its identity,
    which would recompile the step at every call (a new Weights each call)."""

    embed: torch.Tensor
    layers: tuple[tuple[torch.Tensor | None, ...], ...]
    norm: torch.Tensor
    head: torch.Tensor
    head_bias: torch.Tensor | None
    eps: float
    heads: int
    kv_heads: int
    head_dim: int

    def tensors(self) -> list[torch.Tensor]:
        """Every weight tensor (to check that their storage has not moved since a CUDA graph read it)."""
        flat = [self.embed, self.norm, self.head, self.head_bias, *(t for layer in self.layers for t in layer)]
        return [t for t in flat if t is not None]


def causal_lm(model):
    """The ``transformers`` causal LM inside a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model


def coverage(model) -> str | None:
    """None when :func:`read_weights` covers ``model`` exactly, else the reason it does not (one short phrase).
    Called inside ``Engine.generate``'s :func:`~.lora.merged_lora`, which has merged every active LoRA layer on
    floating-point weights; one on integer (quantized) weights is caught here as quantized weights."""
    lm = causal_lm(model)
    # FSDP2's fully_shard swaps the class for a subclass named FSDP<name>: look through the class's bases
    arch = next((c.__name__ for c in type(lm).__mro__ if c.__name__ in DECODERS), type(lm).__name__)
    cfg = getattr(lm, "config", None)
    if arch not in DECODERS or cfg is None:
        return f"architecture {arch} (covered: {', '.join(DECODERS)})"
    if (getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "pretraining_tp", 1) not in (None, 1)
            or getattr(cfg, "mlp_bias", False)):
        return f"{arch} with hidden_act={cfg.hidden_act!r}, pretraining_tp or MLP biases"
    rope = getattr(getattr(lm.model, "rotary_emb", None), "rope_type", None)
    if rope not in ROPE_TYPES:
        return f"RoPE type {rope!r} (covered: {', '.join(ROPE_TYPES)})"
    layer_types = getattr(cfg, "layer_types", None)
    sliding = (any(t != "full_attention" for t in layer_types) if layer_types
               else getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True))
    if sliding:
        return "sliding-window attention"
    if getattr(lm, "hf_quantizer", None) is not None or any(
            not p.dtype.is_floating_point for p in lm.parameters()):
        return "quantized weights"
    if hasattr(model, "peft_config") and any(getattr(c, "peft_type", "LORA") != "LORA"
                                             for c in model.peft_config.values()):
        return "a PEFT adapter other than LoRA"
    return None


def _linear(module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of a linear layer, through a merged LoRA wrapper to its base layer."""
    base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
    return base.weight, getattr(base, "bias", None)


def read_weights(model) -> Weights:
    """The decoder's tensors, in place (call :func:`coverage` first)."""
    lm = causal_lm(model)
    cfg, inner = lm.config, lm.model
    layers = []
    for layer in inner.layers:
        att, mlp = layer.self_attn, layer.mlp
        q, k, v, o = (_linear(m) for m in (att.q_proj, att.k_proj, att.v_proj, att.o_proj))
        gate, up, down = (_linear(m)[0] for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        layers.append((layer.input_layernorm.weight, *q, *k, *v, *o, layer.post_attention_layernorm.weight,
                       gate, up, down))
    head, head_bias = _linear(lm.lm_head)
    heads = cfg.num_attention_heads
    return Weights(embed=_linear(inner.embed_tokens)[0], layers=tuple(layers), norm=inner.norm.weight, head=head,
                   head_bias=head_bias, eps=float(cfg.rms_norm_eps), heads=heads,
                   kv_heads=cfg.num_key_value_heads or heads,
                   head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)


def rope_tables(model, length: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos, sin [length, head_dim] of positions 0..length-1, from the model's own rotary module."""
    positions = torch.arange(length, device=device)[None]
    cos, sin = causal_lm(model).model.rotary_emb(torch.empty(0, device=device, dtype=dtype), positions)
    return cos[0], sin[0]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalise in float32, cast back, then scale."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _layer(w: Weights, layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
    """One decoder layer on h [B, T, hidden]; ``attend(q, k, v)`` (q [B, H, T, D], k / v [B, Hkv, T, D], RoPE
    applied) returns the attention output [B, T, H * D] and does the cache."""
    ln1, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, ln2, gate, up, down = layer
    B, T, _ = h.shape
    x = rms_norm(h, ln1, w.eps)
    q = F.linear(x, q_w, q_b).view(B, T, w.heads, w.head_dim).transpose(1, 2)
    k = F.linear(x, k_w, k_b).view(B, T, w.kv_heads, w.head_dim).transpose(1, 2)
    v = F.linear(x, v_w, v_b).view(B, T, w.kv_heads, w.head_dim).transpose(1, 2)
    h = h + F.linear(attend(_rotate(q, cos, sin), _rotate(k, cos, sin), v), o_w, o_b)
    x = rms_norm(h, ln2, w.eps)
    return h + F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def _logits(w: Weights, h: torch.Tensor) -> torch.Tensor:
    """Logits [B, V] of the last position of h [B, T, hidden], in float32 (as ``generate`` takes them)."""
    return F.linear(rms_norm(h[:, -1], w.norm, w.eps), w.head, w.head_bias).float()


def prefill(w: Weights, ids: torch.Tensor, mask: torch.Tensor, cache: tuple[torch.Tensor, ...],
            cos_tab: torch.Tensor, sin_tab: torch.Tensor) -> torch.Tensor:
    """Run left-padded prompts ids / mask [B, P] through the decoder; keys / values go to rows :B, columns :P of
    the cache; returns the logits [B, V] of each prompt's last position (the first response token's distribution).

    A prompt that appears several times (GRPO's group of ``num_generations`` rows) runs once: the distinct rows go
    through the layers, then their cache rows and logits are copied to every row that repeats them. On 2 CPU cores,
    for SmolLM2 with 2 prompts of 43 tokens x 4 completions, the prefill took about 0.5 s of a 4.2 s rollout, run
    once per prompt 0.2-0.3 s.

    Causal attention over the real prompt tokens (SDPA with a boolean mask); a padding position attends to itself
    only, so no row of the softmax is empty (its output is never used: padding columns stay masked)."""
    B, P = ids.shape
    first, inverse = distinct_rows(ids, mask)
    if len(first) < B:
        logits = _prefill(w, ids[first], mask[first], cache, cos_tab, sin_tab)
        for c in cache:
            c[:B, :, :P] = c[inverse, :, :P]  # the right side is a copy (advanced indexing): no overlap
        return logits[inverse]
    return _prefill(w, ids, mask, cache, cos_tab, sin_tab)


def distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``ids`` / ``mask`` [B, P] that repeat (a GRPO group's prompt): ``(first [U], inverse [B])``, the
    index of one row of each distinct (ids, mask) pair and, per row, which of them it is (``ids[first][inverse]``
    equals ``ids``). The static engine's prefill and the trainer's shared-prompt forward both run ``first`` only."""
    B = ids.shape[0]
    distinct, inverse = torch.unique(torch.cat([ids, mask.long()], 1), dim=0, return_inverse=True)
    first = torch.full((len(distinct),), B, dtype=torch.long, device=ids.device).scatter_reduce(
        0, inverse, torch.arange(B, device=ids.device), "amin")
    return first, inverse


def _prefill(w: Weights, ids: torch.Tensor, mask: torch.Tensor, cache: tuple[torch.Tensor, ...],
             cos_tab: torch.Tensor, sin_tab: torch.Tensor) -> torch.Tensor:
    """:func:`prefill` of distinct rows."""
    B, P = ids.shape
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cos, sin = cos_tab[positions].unsqueeze(1), sin_tab[positions].unsqueeze(1)  # [B, 1, P, D]
    causal = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()
    allowed = (causal & mask.bool()[:, None, :]) | torch.eye(P, dtype=torch.bool, device=ids.device)
    allowed = allowed.unsqueeze(1)  # [B, 1, P, P]
    rep = w.heads // w.kv_heads
    h = F.embedding(ids, w.embed)
    for i, layer in enumerate(w.layers):
        def attend(q, k, v, i=i):
            cache[2 * i][:B, :, :P] = k
            cache[2 * i + 1][:B, :, :P] = v
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=w.head_dim ** -0.5)
            return out.transpose(1, 2).reshape(B, P, -1)

        h = _layer(w, layer, h, cos, sin, attend)
    return _logits(w, h)


def decode_logits(w: Weights, cache: tuple[torch.Tensor, ...], tok: torch.Tensor, pos: torch.Tensor, col: torch.Tensor,
                  p0: torch.Tensor, valid: torch.Tensor, cos_tab: torch.Tensor,
                  sin_tab: torch.Tensor) -> torch.Tensor:
    """One decode step for every row of the cache: token ``tok`` [B] at RoPE position ``pos`` [B] goes to cache
    column ``col`` (1-element long tensor, the same for every row); it attends to the real prompt columns
    (``valid`` [B, S]) and to the columns p0..col (``p0``: the padded prompt width, 1-element tensor). Returns the
    logits [B, V] of the next token. Every shape is fixed by the cache, so the step compiles (and is captured as
    a CUDA graph) once per cache shape."""
    B, S = valid.shape
    cols = torch.arange(S, device=valid.device)
    allowed = (valid | ((cols >= p0) & (cols <= col))[None, :])[:, None, None, :]  # [B, 1, 1, S]
    cos, sin = cos_tab[pos][:, None, None, :], sin_tab[pos][:, None, None, :]  # [B, 1, 1, D]
    rep = w.heads // w.kv_heads
    h = F.embedding(tok[:, None], w.embed)
    for i, layer in enumerate(w.layers):
        def attend(q, k, v, i=i):
            keys, values = cache[2 * i], cache[2 * i + 1]
            keys.index_copy_(2, col, k)
            values.index_copy_(2, col, v)
            q = q.reshape(B, w.kv_heads, rep, w.head_dim)  # query heads grouped per key/value head
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, scale=w.head_dim ** -0.5)
            return out.reshape(B, 1, -1)

        h = _layer(w, layer, h, cos, sin, attend)
    return _logits(w, h)
