"""The decoders of the common families as plain functions over the model's own weight tensors, for the static engine.

:func:`read_weights` collects the parameters of a ``transformers`` model (:data:`DECODERS`: Llama 2 / 3.x, Qwen2 /
Qwen2.5, Qwen3, Mistral, Gemma 2, Gemma 3 (text-only, also inside ``Gemma3ForConditionalGeneration``), Phi-3 / Phi-4;
sliding-window layers included; PEFT LoRA merged) as they are, no copy: the optimizer's in-place updates are seen by
the next call. :func:`prefill` runs the left-padded prompts through every layer and writes their keys / values into
a preallocated cache; :func:`decode_logits` runs one token per row against that cache. The arithmetic is
transformers' own, op for op, read from each family's modeling file (transformers 5.17 and 5.24 compute it alike):

- RMSNorm in float32: Llama's ``weight * x.to(dtype)``, Gemma's ``(x * (1 + weight.float())).type_as(x)``;
- RoPE from the model's own rotary module (rotate-half; Gemma 3: one table per layer type, local and global; Phi:
  partial rotary, the first ``partial_rotary_factor`` of each head rotated);
- Qwen3 / Gemma 3: per-head RMSNorm of the queries and keys before RoPE;
- Gemma: embeddings times ``sqrt(hidden)`` (the model's buffer, cast to the weights' dtype), the attention output and
  the MLP output normed before their residual adds, ``query_pre_attn_scalar ** -0.5`` scaling, gelu-tanh MLP, the
  final logits soft-capped (``tanh(x / cap) * cap``), Gemma 2's attention logits too (eager attention, as its only
  implementation);
- Phi-3: fused q/k/v and gate/up projections, split after one matmul as Phi does;
- sliding-window layers (Mistral's and Phi-3's ``sliding_window`` on every layer, Qwen2 / Qwen3 with
  ``use_sliding_window`` on their ``layer_types``, Gemma's local layers): a query at cache column c sees the columns
  c - window + 1 .. c, transformers' ``sliding_window_overlay`` over the same column indices.

So greedy decoding gives the tokens ``generate`` gives (tested against ``hf`` per family). It departs only where it
saves work: one query token attends to the cache with the query heads grouped per key/value head (no ``repeat_kv``
copy of the cache), and the cache has a fixed width with a validity mask instead of growing (a sliding layer keeps
every column and masks those outside its window: simpler than a ring buffer, at the memory of a full layer).

Cache layout: a tuple of 2L tensors ``[batch, kv_heads, S, head_dim]``, keys then values of each layer. Separate
tensors, not one ``[L, 2, ...]`` tensor: ``torch.compile`` updates a whole input tensor in place, but an in-place
write into a view of a larger input became a copy of the whole cache per layer (measured on 1 CPU core for
SmolLM2's cache at batch 8 x 128 columns: 892 ms per step against 0.13 ms). Prompts are left-padded to width P; the
response token t of every row sits in column P + t; ``valid [batch, S]`` marks the real prompt columns and every
column from P up to the current one is valid for every row.

RoPE tables (:func:`rope_tables`): ``cos, sin [S, rotary_dim]``, or ``[K, S, rotary_dim]`` for a model with K rotary
tables (Gemma 3: one per layer type; ``Layer.rope`` says which a layer uses). Allocate buffers for them with the
shape :func:`rope_tables` returns, never ``[S, head_dim]`` (Phi's rotary dim is smaller).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

DECODERS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM", "Gemma2ForCausalLM",
            "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Phi3ForCausalLM")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # inverse frequencies fixed at build (no dependence on length)
ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
               "gelu": F.gelu}
_GEMMA = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
_EVERY_LAYER_SLIDES = ("MistralForCausalLM", "Phi3ForCausalLM")  # their mask: config.sliding_window, every layer
_BY_LAYER_TYPE = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", *_GEMMA)  # config.layer_types picks the sliding layers


class Layer(NamedTuple):
    """The tensors of one decoder layer, by reference. The first 13 fields are those of every family (ln1: the norm
    before attention; ln2: the norm before the MLP); biases and the fields a family lacks are None. Phi-3 keeps its
    fused projections in ``qkv`` / ``gate_up`` (``q``, ``k``, ``v``, ``gate``, ``up`` None); Gemma norms the attention
    and MLP outputs (``attn_norm``, ``mlp_norm``); Qwen3 / Gemma 3 norm each head's queries and keys (``q_norm``,
    ``k_norm``). ``window``: the sliding window (None: full attention); ``rope``: which RoPE table (0 but on
    Gemma 3's global layers)."""

    ln1: torch.Tensor
    q: torch.Tensor | None
    q_bias: torch.Tensor | None
    k: torch.Tensor | None
    k_bias: torch.Tensor | None
    v: torch.Tensor | None
    v_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    ln2: torch.Tensor
    gate: torch.Tensor | None
    up: torch.Tensor | None
    down: torch.Tensor
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    attn_norm: torch.Tensor | None = None
    mlp_norm: torch.Tensor | None = None
    qkv: torch.Tensor | None = None
    qkv_bias: torch.Tensor | None = None
    gate_up: torch.Tensor | None = None
    window: int | None = None
    rope: int = 0


class Weights(NamedTuple):
    """The tensors of a decoder, by reference, and the settings its arithmetic needs. ``layers[i]``: a :class:`Layer`
    (its first 13 fields as before: ln1, q, q_bias, k, k_bias, v, v_bias, o, o_bias, ln2, gate, up, down). A named
    tuple, not an object: ``torch.compile`` guards a tuple by its contents (shapes, dtypes, the ints and floats), an
    object by its identity, which would recompile the step at every call (a new Weights each call). The fields after
    ``head_dim`` have defaults (Llama's), so a Weights built by hand as before still works."""

    embed: torch.Tensor
    layers: tuple[Layer, ...]
    norm: torch.Tensor
    head: torch.Tensor
    head_bias: torch.Tensor | None
    eps: float
    heads: int
    kv_heads: int
    head_dim: int
    scale: float | None = None  # attention scaling (None: head_dim ** -0.5; Gemma: query_pre_attn_scalar ** -0.5)
    gemma_norm: bool = False  # Gemma's RMSNorm: (x * (1 + w)) in float32, then cast
    act: str = "silu"  # the MLP's activation, a key of ACTIVATIONS
    embed_scale: float | None = None  # Gemma: embeddings times this (sqrt(hidden) as the model's float32 buffer)
    final_softcap: float | None = None  # Gemma: logits = tanh(logits / cap) * cap
    attn_softcap: float | None = None  # Gemma 2: the same on the attention scores (eager attention)

    def tensors(self) -> list[torch.Tensor]:
        """Every weight tensor (to check that their storage has not moved since a CUDA graph read it)."""
        flat = [self.embed, self.norm, self.head, self.head_bias, *(t for layer in self.layers for t in layer)]
        return [t for t in flat if isinstance(t, torch.Tensor)]

    @property
    def windows(self) -> tuple[int | None, ...]:
        """The distinct sliding windows of the layers (None: full attention)."""
        return tuple(dict.fromkeys(layer.window for layer in self.layers))


def causal_lm(model):
    """The ``transformers`` causal LM inside a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model


# vision-language models whose text stack is a covered family's (their text decode is that family's arithmetic;
# Gemma3ForConditionalGeneration is in DECODERS itself): the class -> the text family, by the text config's model_type
VLM_TEXT = {"Qwen2_5_VLForConditionalGeneration": {"qwen2_5_vl_text": "Qwen2ForCausalLM"},
            "Qwen2VLForConditionalGeneration": {"qwen2_vl_text": "Qwen2ForCausalLM"},
            "Qwen3VLForConditionalGeneration": {"qwen3_vl_text": "Qwen3ForCausalLM"},
            "LlavaForConditionalGeneration": {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                                              "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"},
            "Idefics3ForConditionalGeneration": {"llama": "LlamaForCausalLM"},
            "SmolVLMForConditionalGeneration": {"llama": "LlamaForCausalLM"}}


def architecture(model) -> str:
    """The class name of the causal LM (FSDP2's fully_shard swaps the class for a subclass named FSDP<name>: the
    covered name among its bases, else its own); for a vision-language model of :data:`VLM_TEXT`, its text stack's
    family."""
    lm = causal_lm(model)
    for c in type(lm).__mro__:
        if c.__name__ in VLM_TEXT:
            kind = getattr(lm.config.get_text_config(), "model_type", None)
            return VLM_TEXT[c.__name__].get(kind, c.__name__)
    return next((c.__name__ for c in type(lm).__mro__ if c.__name__ in DECODERS), type(lm).__name__)


def text_model(model):
    """The decoder stack (``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``) of the causal LM: ``lm.model``, or
    its ``language_model`` (``text_model``: Idefics3 / SmolVLM) in a multimodal wrapper (a VLM's text-only decode is
    its language model's)."""
    inner = causal_lm(model).model
    for name in ("language_model", "text_model"):
        if isinstance(getattr(inner, name, None), torch.nn.Module):
            return getattr(inner, name)
    return inner


def layer_windows(arch: str, cfg) -> tuple[int | None, ...]:
    """The sliding window of each layer as the family's modeling file builds its masks (None: full attention).
    Raises ValueError for a layer type that is neither full nor sliding attention."""
    n = cfg.num_hidden_layers
    window = getattr(cfg, "sliding_window", None)
    if arch in _EVERY_LAYER_SLIDES:
        return (window,) * n
    if arch not in _BY_LAYER_TYPE:  # Llama: no sliding window in its modeling file
        return (None,) * n
    types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * n)
    other = set(types) - {"full_attention", "sliding_attention"}
    if other:
        raise ValueError(f"layer types {sorted(other)}")
    return tuple(window if t == "sliding_attention" else None for t in types)


def rope_kinds(inner) -> tuple[str, ...] | None:
    """The layer types with a RoPE table each (Gemma 3's rotary module: one per type, in its own order), or None for a
    rotary module with one table."""
    rotary = inner.rotary_emb
    return tuple(rotary.layer_types) if isinstance(getattr(rotary, "rope_type", None), dict) else None


def coverage(model) -> str | None:
    """None when :func:`read_weights` covers ``model`` exactly, else the reason it does not (one short phrase).
    Called inside ``Engine.generate``'s :func:`~.lora.merged_lora`, which has merged every active LoRA layer on
    floating-point weights; one on integer (quantized) weights is caught here as quantized weights."""
    lm = causal_lm(model)
    arch = architecture(model)
    if arch not in DECODERS or getattr(lm, "config", None) is None:
        return f"architecture {arch}"
    inner = text_model(model)
    cfg = inner.config
    act = getattr(cfg, "hidden_activation", None) if arch in _GEMMA else getattr(cfg, "hidden_act", "silu")
    if act not in ACTIVATIONS or getattr(cfg, "pretraining_tp", 1) not in (None, 1) or getattr(cfg, "mlp_bias", False):
        return f"{arch} with hidden activation {act!r}, pretraining_tp or MLP biases"
    rotary = getattr(inner, "rotary_emb", None)
    kinds = getattr(rotary, "rope_type", None)
    for rope in (kinds.values() if isinstance(kinds, dict) else [kinds]):
        if rope not in ROPE_TYPES:
            return f"RoPE type {rope!r} (covered: {', '.join(ROPE_TYPES)})"
    try:
        layer_windows(arch, cfg)
    except ValueError as err:
        return f"{arch} with {err}"
    if getattr(cfg, "use_bidirectional_attention", False):
        return f"{arch} with bidirectional attention"
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


def _weight(norm) -> torch.Tensor | None:
    return None if norm is None else norm.weight


def read_weights(model) -> Weights:
    """The decoder's tensors, in place (call :func:`coverage` first)."""
    lm = causal_lm(model)
    arch = architecture(model)
    inner = text_model(model)
    cfg = inner.config
    gemma = arch in _GEMMA
    windows = layer_windows(arch, cfg)
    kinds = rope_kinds(inner)
    layers = []
    for i, layer in enumerate(inner.layers):
        att, mlp = layer.self_attn, layer.mlp
        fused = hasattr(att, "qkv_proj")
        q, k, v = ((None, None),) * 3 if fused else (_linear(m) for m in (att.q_proj, att.k_proj, att.v_proj))
        qkv = _linear(att.qkv_proj) if fused else (None, None)
        gate_up = _linear(mlp.gate_up_proj)[0] if hasattr(mlp, "gate_up_proj") else None
        gate, up = (None, None) if gate_up is not None else (_linear(mlp.gate_proj)[0], _linear(mlp.up_proj)[0])
        if gemma:  # input norm, attention, post-attention norm, residual; pre-MLP norm, MLP, post-MLP norm, residual
            ln1, ln2 = layer.input_layernorm, layer.pre_feedforward_layernorm
            attn_norm, mlp_norm = layer.post_attention_layernorm, layer.post_feedforward_layernorm
        else:
            ln1, ln2, attn_norm, mlp_norm = layer.input_layernorm, layer.post_attention_layernorm, None, None
        down = _linear(mlp.down_proj)[0]
        layers.append(Layer(ln1.weight, *q, *k, *v, *_linear(att.o_proj), ln2.weight, gate, up, down,
                            q_norm=_weight(getattr(att, "q_norm", None)), k_norm=_weight(getattr(att, "k_norm", None)),
                            attn_norm=_weight(attn_norm), mlp_norm=_weight(mlp_norm), qkv=qkv[0], qkv_bias=qkv[1],
                            gate_up=gate_up, window=windows[i],
                            rope=kinds.index(cfg.layer_types[i]) if kinds else 0))
    head, head_bias = _linear(lm.lm_head)
    heads = cfg.num_attention_heads
    embed = inner.embed_tokens
    scale = getattr(embed.get_base_layer() if hasattr(embed, "get_base_layer") else embed, "embed_scale", None)
    return Weights(embed=_linear(embed)[0], layers=tuple(layers), norm=inner.norm.weight, head=head,
                   head_bias=head_bias, eps=float(cfg.rms_norm_eps), heads=heads,
                   kv_heads=cfg.num_key_value_heads or heads,
                   head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
                   scale=float(inner.layers[0].self_attn.scaling), gemma_norm=gemma,
                   act=getattr(cfg, "hidden_activation", None) if gemma else getattr(cfg, "hidden_act", "silu"),
                   embed_scale=None if scale is None else float(scale),
                   final_softcap=getattr(lm.config.get_text_config(), "final_logit_softcapping", None),
                   attn_softcap=getattr(cfg, "attn_logit_softcapping", None) if gemma else None)


def rope_tables(model, length: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos, sin of positions 0..length-1 from the model's own rotary module: ``[length, rotary_dim]``, or
    ``[K, length, rotary_dim]`` for K tables (Gemma 3, one per layer type; ``Layer.rope`` indexes them)."""
    inner = text_model(model)
    positions = torch.arange(length, device=device)[None]
    x = torch.empty(0, device=device, dtype=dtype)
    kinds = rope_kinds(inner)
    if kinds is None:
        cos, sin = inner.rotary_emb(x, positions)
        return cos[0], sin[0]
    pairs = [inner.rotary_emb(x, positions, kind) for kind in kinds]
    return torch.stack([c[0] for c, _ in pairs]), torch.stack([s[0] for _, s in pairs])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalise in float32, cast back, then scale."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Gemma RMSNorm: normalise and scale by (1 + weight) in float32, then cast back."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).type_as(x)


def _norm(w: Weights, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (gemma_rms_norm if w.gemma_norm else rms_norm)(x, weight, w.eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of the first ``cos.shape[-1]`` dims of each head (all of them but for Phi's partial rotary)."""
    d = cos.shape[-1]
    if d < x.shape[-1]:
        return torch.cat((_rotate(x[..., :d], cos, sin), x[..., d:]), dim=-1)
    half = d // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _layer(w: Weights, layer: Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
    """One decoder layer on h [B, T, hidden]; ``attend(q, k, v)`` (q [B, H, T, D], k / v [B, Hkv, T, D], RoPE
    applied) returns the attention output [B, T, H * D] and does the cache."""
    B, T, _ = h.shape
    x = _norm(w, h, layer.ln1)
    if layer.qkv is not None:  # Phi-3: one matmul, split as Phi3Attention does
        qkv = F.linear(x, layer.qkv, layer.qkv_bias)
        nq, nk = w.heads * w.head_dim, w.kv_heads * w.head_dim
        q, k, v = qkv[..., :nq], qkv[..., nq:nq + nk], qkv[..., nq + nk:]
    else:
        q, k, v = F.linear(x, layer.q, layer.q_bias), F.linear(x, layer.k, layer.k_bias), F.linear(x, layer.v,
                                                                                                    layer.v_bias)
    q, k, v = q.view(B, T, w.heads, w.head_dim), k.view(B, T, w.kv_heads, w.head_dim), v.view(B, T, w.kv_heads,
                                                                                              w.head_dim)
    if layer.q_norm is not None:  # Qwen3 / Gemma 3: RMSNorm over each head's dims
        q, k = _norm(w, q, layer.q_norm), _norm(w, k, layer.k_norm)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    out = F.linear(attend(_rotate(q, cos, sin), _rotate(k, cos, sin), v), layer.o, layer.o_bias)
    h = h + (out if layer.attn_norm is None else _norm(w, out, layer.attn_norm))
    x = _norm(w, h, layer.ln2)
    act = ACTIVATIONS[w.act]
    if layer.gate_up is not None:  # Phi-3: gate and up from one matmul
        gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)
        out = F.linear(up * act(gate), layer.down)
    else:
        out = F.linear(act(F.linear(x, layer.gate)) * F.linear(x, layer.up), layer.down)
    return h + (out if layer.mlp_norm is None else _norm(w, out, layer.mlp_norm))


def _embed(w: Weights, ids: torch.Tensor) -> torch.Tensor:
    h = F.embedding(ids, w.embed)
    if w.embed_scale is not None:  # Gemma: the float32 buffer cast to the weights' dtype, then multiplied
        h = h * torch.full((), w.embed_scale, dtype=torch.float32, device=h.device).to(h.dtype)
    return h


def _logits(w: Weights, h: torch.Tensor) -> torch.Tensor:
    """Logits [B, V] of the last position of h [B, T, hidden], in float32 (as ``generate`` takes them)."""
    logits = F.linear(_norm(w, h[:, -1], w.norm), w.head, w.head_bias)
    if w.final_softcap is not None:
        logits = torch.tanh(logits / w.final_softcap) * w.final_softcap
    return logits.float()


def attention(w: Weights, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """:func:`scores_attention` with the model's scale and soft cap."""
    return scores_attention(q, k, v, allowed, w.scale if w.scale is not None else w.head_dim ** -0.5, w.attn_softcap)


def scores_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float,
                     softcap: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v over the ``allowed`` keys (a boolean mask broadcast to the scores): SDPA, or with a
    soft cap (Gemma 2) transformers' eager arithmetic (scores capped, masked, softmax in float32, cast back)."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)


def _tables(tab: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """RoPE rows of ``index`` from a table ``[S, D]`` or ``[K, S, D]`` -> ``[K, *index.shape, D]``."""
    return tab[index].unsqueeze(0) if tab.dim() == 2 else tab[:, index]


def prefill(w: Weights, ids: torch.Tensor, mask: torch.Tensor, cache: tuple[torch.Tensor, ...],
            cos_tab: torch.Tensor, sin_tab: torch.Tensor) -> torch.Tensor:
    """Run left-padded prompts ids / mask [B, P] through the decoder; keys / values go to rows :B, columns :P of
    the cache; returns the logits [B, V] of each prompt's last position (the first response token's distribution).

    A prompt that appears several times (GRPO's group of ``num_generations`` rows) runs once: the distinct rows go
    through the layers, then their cache rows and logits are copied to every row that repeats them. On 2 CPU cores,
    for SmolLM2 with 2 prompts of 43 tokens x 4 completions, the prefill took about 0.5 s of a 4.2 s rollout, run
    once per prompt 0.2-0.3 s.

    Causal attention over the real prompt tokens (SDPA with a boolean mask; a sliding layer sees the last ``window``
    columns); a padding position attends to itself only, so no row of the softmax is empty (its output is never used:
    padding columns stay masked)."""
    B, P = ids.shape
    first, inverse = distinct_rows(ids, mask)
    if len(first) < B:
        logits = _prefill(w, ids[first], mask[first], cache, cos_tab, sin_tab)
        for c in cache:
            c[:B, :, :P] = c[inverse, :, :P]  # the right side is a copy (advanced indexing): no overlap
        return logits[inverse]
    return _prefill(w, ids, mask, cache, cos_tab, sin_tab)


def distinct_rows(ids: torch.Tensor, mask: torch.Tensor,
                  keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``ids`` / ``mask`` [B, P] that repeat (a GRPO group's prompt): ``(first [U], inverse [B])``, the
    index of one row of each distinct (ids, mask) pair and, per row, which of them it is (``ids[first][inverse]``
    equals ``ids``). The static engine's prefill and the trainer's shared-prompt forward both run ``first`` only.
    ``keys`` [B] (long): a row's other inputs (its images: equal ids with other images are other prompts)."""
    B = ids.shape[0]
    rows = [ids, mask.long()] + ([keys.to(ids.device).long()[:, None]] if keys is not None else [])
    distinct, inverse = torch.unique(torch.cat(rows, 1), dim=0, return_inverse=True)
    first = torch.full((len(distinct),), B, dtype=torch.long, device=ids.device).scatter_reduce(
        0, inverse, torch.arange(B, device=ids.device), "amin")
    return first, inverse


def prefill_masks(mask: torch.Tensor, windows, blocks: torch.Tensor | None = None) -> dict:
    """window -> boolean mask [B, 1, P, P] of the prefill of left-padded prompts (``mask`` [B, P]): causal over the
    real tokens, within the window (None: no window), every position attending at least to itself. ``blocks``
    [B, P] (long, -1 outside): tokens of one block also attend to each other both ways (Gemma 3's image tokens),
    within the window as transformers composes it: ``(causal | block) & window``."""
    P = mask.shape[1]
    cols = torch.arange(P, device=mask.device)
    causal = (cols[None, :] <= cols[:, None]) & mask.bool()[:, None, :]  # [B, P(query), P(key)]
    if blocks is not None:
        causal = causal | ((blocks[:, :, None] == blocks[:, None, :]) & (blocks >= 0)[:, :, None])
    eye = torch.eye(P, dtype=torch.bool, device=mask.device)
    return {window: ((causal if window is None else causal & (cols[None, :] > cols[:, None] - window)) | eye)
            .unsqueeze(1) for window in windows}


def _prefill(w: Weights, ids: torch.Tensor, mask: torch.Tensor, cache: tuple[torch.Tensor, ...],
             cos_tab: torch.Tensor, sin_tab: torch.Tensor) -> torch.Tensor:
    """:func:`prefill` of distinct rows."""
    B, P = ids.shape
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cos, sin = _tables(cos_tab, positions).unsqueeze(2), _tables(sin_tab, positions).unsqueeze(2)  # [K, B, 1, P, D]
    allowed = prefill_masks(mask, w.windows)
    rep = w.heads // w.kv_heads
    h = _embed(w, ids)
    for i, layer in enumerate(w.layers):
        def attend(q, k, v, i=i, window=layer.window):
            cache[2 * i][:B, :, :P] = k
            cache[2 * i + 1][:B, :, :P] = v
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            return attention(w, q, k, v, allowed[window]).transpose(1, 2).reshape(B, P, -1)

        h = _layer(w, layer, h, cos[layer.rope], sin[layer.rope], attend)
    return _logits(w, h)


def decode_masks(valid: torch.Tensor, col: torch.Tensor, p0: torch.Tensor, windows) -> dict:
    """window -> boolean mask [B, 1, 1, S] of one decode step writing cache column ``col``: the real prompt columns
    (``valid`` [B, S]) and the columns p0..col, within the window (None: no window)."""
    S = valid.shape[1]
    cols = torch.arange(S, device=valid.device)
    base = valid | ((cols >= p0) & (cols <= col))[None, :]
    return {window: (base if window is None else base & (cols > col - window)[None, :])[:, None, None, :]
            for window in windows}


def decode_logits(w: Weights, cache: tuple[torch.Tensor, ...], tok: torch.Tensor, pos: torch.Tensor, col: torch.Tensor,
                  p0: torch.Tensor, valid: torch.Tensor, cos_tab: torch.Tensor,
                  sin_tab: torch.Tensor) -> torch.Tensor:
    """One decode step for every row of the cache: token ``tok`` [B] at RoPE position ``pos`` [B] goes to cache
    column ``col`` (1-element long tensor, the same for every row); it attends to the real prompt columns
    (``valid`` [B, S]) and to the columns p0..col (``p0``: the padded prompt width, 1-element tensor), a sliding
    layer to those within its window. Returns the logits [B, V] of the next token. Every shape is fixed by the cache,
    so the step compiles (and is captured as a CUDA graph) once per cache shape."""
    B = valid.shape[0]
    allowed = decode_masks(valid, col, p0, w.windows)
    cos, sin = _tables(cos_tab, pos)[:, :, None, None, :], _tables(sin_tab, pos)[:, :, None, None, :]  # [K, B, 1, 1, D]
    rep = w.heads // w.kv_heads
    h = _embed(w, tok[:, None])
    for i, layer in enumerate(w.layers):
        def attend(q, k, v, i=i, window=layer.window):
            keys, values = cache[2 * i], cache[2 * i + 1]
            keys.index_copy_(2, col, k)
            values.index_copy_(2, col, v)
            q = q.reshape(B, w.kv_heads, rep, w.head_dim)  # query heads grouped per key/value head
            return attention(w, q, keys, values, allowed[window]).reshape(B, 1, -1)

        h = _layer(w, layer, h, cos[layer.rope], sin[layer.rope], attend)
    return _logits(w, h)
