"""The model calls of a training step that need the LM head: the sampled tokens' log-probs (and entropies, greedy
tokens) straight from the final hidden states, chunk by chunk through the head, so no [B, T, V] logits ever exist
in training (:class:`HeadStats`, :func:`response_stats`, :func:`completion_stats`); the critic's values; an
offloaded model on the device for one block; dropout off. The online step, SFT and the preference recipes all go
through here.

How the logits are avoided: for the call, the LM head's ``forward`` (``model.get_output_embeddings()``) is replaced by
one that takes the hidden states the model hands it and returns, in place of logits, the packed statistics
[B, K, 1 or 2] (log-prob, entropy) of the labels given beforehand, computed by
:func:`rlhfkit.algos.linear_token_stats` (a linear head, its bias, a PEFT LoRA adapter on it) or, for any other
head module, by the same statistics over chunks of its output recomputed in backward (``torch.utils.checkpoint``).
The model is still called as a whole, so every wrapper sees an ordinary forward: DDP, FSDP2 (the head is in the
root unit, gathered from forward to backward), DeepSpeed ZeRO-3 (its weight is gathered for the head's forward and
again for its backward, as for any module). A model that changes the logits after its head (Gemma-2's soft-capping,
Granite's and Cohere's scaling, ...) is noticed (the output is not the tensor the head returned), said once, and
computed the plain way: logits [B, K, V] in the model's dtype, then the chunked float32 statistics.

With ``liger-kernel`` installed and a CUDA device, a plain linear head asked for log-probs (and the greedy token)
but no entropy goes through Liger's fused linear cross-entropy (``reduction="none"``); everything else through the
PyTorch path, which the CPU tests check against the plain logits.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ...algos import TokenStats, linear_token_stats, token_stats_from_logits
from ...algos.logprobs import LINEAR_CHUNK_ELEMENTS, linear_mean_logits
from ...errors import say
from ...models.heads import token_values
from ...models.vision import family_of, forward_inputs, media_keys, mrope_positions
from ...rollout.decoder import distinct_rows

IGNORE = -100  # a position whose statistics are not wanted (not computed at all)


# ─────────────────────────────────────────────── the head, fused ────────────────────────────────────────────────


def _unwrapped(model):
    """The transformers model under DDP / DeepSpeed's ``.module`` (PEFT kept: its adapters are part of the head)."""
    for _ in range(4):
        inner = getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            break
        model = inner
    return model


def linear_parts(head, x: torch.Tensor):
    """``(weight, bias, low_rank)`` when ``head(x)`` is a linear map rlhfkit computes itself: an ``nn.Linear``, or a
    PEFT LoRA ``Linear`` on one (plain LoRA of any active adapters, merged or disabled too); None for anything else
    (DoRA and other variants, a LoRA bias, ``modules_to_save``, a quantised head), which takes the generic path."""
    if type(head) is torch.nn.Linear or (isinstance(head, torch.nn.Linear) and isinstance(head, FSDPModule)):
        return head.weight, head.bias, ()
    base = getattr(head, "base_layer", None)
    if not (type(base) is torch.nn.Linear and hasattr(head, "lora_A") and hasattr(head, "active_adapters")):
        return None
    if getattr(head, "disable_adapters", False) or getattr(head, "merged", False):
        return base.weight, base.bias, ()
    lows = []
    for name in head.active_adapters:
        if name not in head.lora_A:
            continue
        if name in getattr(head, "lora_variant", {}) or head.use_dora.get(name) or \
                head.lora_B[name].bias is not None:
            return None
        a = head.lora_A[name]
        xa = x.to(a.weight.dtype) if x.is_floating_point() and not torch.is_autocast_enabled(x.device.type) else x
        lows.append((a(head.lora_dropout[name](xa)) * head.scaling[name], head.lora_B[name].weight))
    return base.weight, base.bias, tuple(lows)


def liger_serves(x: torch.Tensor, lows, entropy: bool) -> bool:
    """Whether Liger's fused linear cross-entropy computes this call: CUDA, ``liger_kernel`` importable, no entropy
    (Liger does not compute it), no LoRA on the head."""
    if x.device.type != "cuda" or entropy or lows:
        return False
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


def liger_stats(hidden, weight, bias, labels, temperature: float, argmax: bool,
                mean_logits: bool = False) -> TokenStats:
    """:class:`TokenStats` by ``liger_kernel``'s ``liger_fused_linear_cross_entropy(reduction="none")`` (its
    per-token loss is -log p; the temperature divides the hidden states and the bias, which divides the logits)."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    shape = labels.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    if temperature != 1.0:
        h, bias = h / temperature, None if bias is None else bias / temperature
    out = liger_fused_linear_cross_entropy(h, weight, labels.reshape(-1), bias=bias, ignore_index=IGNORE,
                                           reduction="none", return_predicted_tokens=argmax,
                                           accum_dtype=torch.float32 if weight.dtype == torch.float32 else None)
    loss = out.loss if hasattr(out, "loss") else out
    keep = labels.reshape(-1) != IGNORE
    lp = torch.where(keep, -loss.float(), 0.0).reshape(shape)
    top = torch.where(keep, out.predicted_tokens, -1).reshape(shape) if argmax else None
    ml = torch.where(keep.reshape(shape), linear_mean_logits(hidden, weight, bias, (), temperature), 0.0) \
        if mean_logits else None
    return TokenStats(lp, None, top, ml)


def head_token_stats(head, forward, x: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, *,
                     entropy: bool | str = False, argmax: bool = False, mean_logits: bool = False,
                     chunk_size: int | None = None) -> TokenStats:
    """:class:`TokenStats` [...] of ``softmax(head(x) / temperature)`` at ``labels`` [...] (``IGNORE``: skipped),
    ``x`` [..., H], never holding more than a chunk of logits. ``forward``: the head's own forward (the generic
    path calls it). ``entropy="metric"``: computed unless Liger serves the call (a metric not worth its speed)."""
    parts = linear_parts(head, x)
    if parts is not None:
        weight, bias, lows = parts
        if liger_serves(x, lows, entropy is True):
            return liger_stats(x, weight, bias, labels, temperature, argmax, mean_logits)
        return linear_token_stats(x, weight, labels, bias=bias, low_rank=lows, temperature=temperature,
                                  entropy=bool(entropy), argmax=argmax, mean_logits=mean_logits, chunk_size=chunk_size,
                                  ignore_index=IGNORE)
    return module_token_stats(forward, x, labels, temperature, entropy=bool(entropy), argmax=argmax,
                              mean_logits=mean_logits, chunk_size=chunk_size,
                              vocab=getattr(getattr(head, "weight", None), "shape", (0,))[0])


def module_token_stats(forward, x: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, *,
                       entropy: bool = False, argmax: bool = False, mean_logits: bool = False, vocab: int = 0,
                       chunk_size: int | None = None) -> TokenStats:
    """The generic path for a head that is not a plain linear map: its output over chunks of tokens, each chunk's
    statistics computed and its logits dropped; with gradients each chunk is recomputed in backward
    (``torch.utils.checkpoint``), so a chunk's logits are all that ever exist."""
    from torch.utils.checkpoint import checkpoint

    shape = labels.shape
    xs, ys = x.reshape(-1, x.shape[-1]), labels.reshape(-1)
    chunk = chunk_size or max(1, LINEAR_CHUNK_ELEMENTS // vocab if vocab else 256)

    def piece(xc: torch.Tensor, yc: torch.Tensor) -> tuple:
        logits = forward(xc)
        if temperature != 1.0:
            logits = logits / temperature
        return tuple(token_stats_from_logits(logits, yc, entropy=entropy, argmax=argmax, mean_logits=mean_logits))

    parts = []
    for s in range(0, ys.shape[0], chunk):
        args = (xs[s:s + chunk], ys[s:s + chunk])
        parts.append(checkpoint(piece, *args, use_reentrant=False) if torch.is_grad_enabled() else piece(*args))
    if not parts:
        return token_stats_from_logits(x.new_zeros(*shape, 1), labels, entropy=entropy, argmax=argmax,
                                       mean_logits=mean_logits)
    return TokenStats(*(None if p[0] is None else torch.cat(p).reshape(shape) for p in zip(*parts)))


class HeadStats:
    """The model's forward with its LM head fused into the statistics the caller wants (see the module docstring).

    ``run(labels, **model_kwargs)``: a forward whose head sees hidden states [B, K, H] (``logits_to_keep=K``) ->
    :class:`TokenStats` [B, K] at ``labels`` [B, K]; ``last_rows(rows, labels, **model_kwargs)``: a forward of some
    distinct rows whose last position's statistics are wanted for other rows (``rows`` [B] indexes them) ->
    (TokenStats [B, 1], the model's output, for its cache)."""

    def __init__(self, model, temperature: float = 1.0, *, entropy: bool = False, entropy_grad: bool = False,
                 argmax: bool = False, mean_logits: bool = False, chunk_size: int | None = None):
        self.model, self.lm = model, _unwrapped(model)
        self.entropy_grad = entropy_grad  # False: the entropy is a metric, its gradient never computed
        self.temperature = temperature if temperature > 0 else 1.0  # 0 = greedy sampling: the logits unscaled
        self.entropy, self.argmax, self.mean_logits, self.chunk_size = entropy, argmax, mean_logits, chunk_size
        getter = getattr(self.lm, "get_output_embeddings", None)
        self.head = getter() if getter is not None else None
        if self.head is None:
            self._plain("it has no output embeddings module")

    @property
    def plain(self) -> bool:
        return self.head is None or bool(getattr(self.lm, "rlhfkit_plain_head", False))

    def _plain(self, why: str) -> None:
        if not getattr(self.lm, "rlhfkit_plain_head", False):
            say(f"[memory] {type(self.lm).__name__}: {why}; its log-probs come from the full logits of each batch")
        self.lm.rlhfkit_plain_head = True

    def stats(self, x: torch.Tensor, labels: torch.Tensor, forward=None) -> TokenStats:
        """The statistics of hidden states ``x`` [..., H] through the head, outside a model call."""
        return self._grads(head_token_stats(self.head, forward or self.head.forward, x, labels, self.temperature,
                                            entropy=self.entropy, argmax=self.argmax, mean_logits=self.mean_logits,
                                            chunk_size=self.chunk_size))

    def from_logits(self, logits: torch.Tensor, labels: torch.Tensor) -> TokenStats:
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return self._grads(token_stats_from_logits(logits, labels, entropy=bool(self.entropy), argmax=self.argmax,
                                                   mean_logits=self.mean_logits, chunk_size=self.chunk_size))

    def _grads(self, st: TokenStats) -> TokenStats:
        return st if st.entropy is None or self.entropy_grad else st._replace(entropy=st.entropy.detach())

    @contextlib.contextmanager
    def _patched(self, fn):
        """The head's ``forward`` replaced by ``fn(original_forward, x)`` for the block."""
        head = self.head
        original = head.forward
        head.forward = lambda x, *a, **k: fn(original, x)
        try:
            yield
        finally:
            del head.forward  # the class's forward again (the instance attribute removed)
            if head.forward != original:  # an instance-level forward set by someone else before us
                head.forward = original

    def run(self, labels: torch.Tensor, **kwargs) -> TokenStats:
        if not self.plain:
            made: dict = {}

            def fused(original, x):
                if x.shape[:-1] != labels.shape:  # the model sliced otherwise than asked: let it have logits
                    return original(x)
                st = self.stats(x, labels, original)
                made["argmax"], made["mean_logits"], made["entropy"] = st.argmax, st.mean_logits, st.entropy is not None
                made["packed"] = torch.stack([st.logprobs] + ([st.entropy] if made["entropy"] else []), -1)
                return made["packed"]

            with self._patched(fused):
                out = self.model(**kwargs)
            if "packed" in made and out.logits is made["packed"]:
                p = out.logits
                return self._grads(TokenStats(p[..., 0], p[..., 1] if made["entropy"] else None, made["argmax"],
                                              made["mean_logits"]))  # a metric entropy unpacked: detached again
            self._plain("its logits are changed after the LM head (soft-capping, scaling) or sliced otherwise")
        return self.from_logits(self.model(**kwargs).logits, labels)

    def last_rows(self, rows: torch.Tensor, labels: torch.Tensor, **kwargs):
        if not self.plain:
            made: dict = {}

            def hidden(original, x):
                made["x"] = x
                return x

            with self._patched(hidden):
                out = self.model(**kwargs)
            if "x" in made and out.logits is made["x"]:
                return self.stats(out.logits[:, -1:].index_select(0, rows), labels), out
            self._plain("its logits are changed after the LM head (soft-capping, scaling)")
        out = self.model(**kwargs)
        return self.from_logits(out.logits[:, -1:].index_select(0, rows), labels), out


def response_stats(model, batch: dict, temperature: float, *, entropy: bool = False, entropy_grad: bool = False,
                   argmax: bool = False, share_prompts: bool = True, chunk_size: int | None = None) -> TokenStats:
    """:class:`TokenStats` [B, R] of each response token under ``model`` at ``temperature`` (the log-prob the
    sampler drew it with; 0 = greedy: the plain logits): the same numbers as :func:`response_logits` followed by
    ``token_logprobs`` / ``entropy_from_logits`` / ``argmax``, without the [B, R, V] logits. Only the last R+1
    positions reach the head; with ``share_prompts`` a prompt repeated over rows runs once
    (:func:`shared_prompt_logits` explains how). ``entropy_grad``: the entropy is differentiable (an entropy bonus),
    else detached (a metric: its gradient is never computed)."""
    head = HeadStats(model, temperature, entropy=entropy, entropy_grad=entropy_grad, argmax=argmax,
                     chunk_size=chunk_size)
    responses = batch["response_ids"]
    R = responses.shape[1]
    if share_prompts and can_share_prompts(model):
        def first(out_rows, kwargs):
            return head.last_rows(out_rows, responses[:, :1], **kwargs)

        def rest(kwargs):
            return head.run(F.pad(responses[:, 1:], (0, 1), value=IGNORE), **kwargs)

        shared = _shared_prompt_passes(model, batch, first, rest)
        if shared is not None:
            st_first, st_rest = shared
            return TokenStats(*(None if a is None else torch.cat([a, b[:, :-1]], 1)
                                for a, b in zip(st_first, st_rest)))
    st = head.run(F.pad(responses, (0, 1), value=IGNORE), **_whole(model, batch), use_cache=False,
                  logits_to_keep=R + 1)
    return st.map(lambda t: t[:, :-1])


def _whole(model, batch: dict) -> dict:
    """The inputs of a forward over whole rows of an online batch: ids, mask, positions and, with images
    (``batch["media"]``: one Media or None per row), their features and the family's inputs (``models/vision``)."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": batch["position_ids"]}
    media = batch.get("media")
    return {**kwargs, **(forward_inputs(model, ids, mask, media) if media is not None else {})}


def completion_stats(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None,
                     *, start: int = 0, position_ids: torch.Tensor | None = None, entropy: bool | str = False,
                     argmax: bool = False, mean_logits: bool = False, media: list | None = None) -> TokenStats:
    """:class:`TokenStats` [B, T-1-start] of tokens ``start+1 .. T-1`` given their prefix (the next-token
    statistics of positions ``start .. T-2``); ``labels`` [B, T] (default ``input_ids``): the target of each position
    shifted as ``input_ids``, ``IGNORE`` (-100) where not wanted (prompt, padding: not computed, 0); ``argmax``: the
    most likely token of each position too (a token accuracy); ``entropy`` (detached; ``"metric"``: unless Liger
    serves the call, :func:`head_token_stats`), ``mean_logits``: for TRL's metrics of those names. ``media``: the
    rows' images (one Media or None per row; the labels of image tokens are ``IGNORE`` already)."""
    labels = input_ids if labels is None else labels
    T = input_ids.shape[1]
    kwargs = {"position_ids": position_ids} if position_ids is not None else {}
    if media is not None:  # images: their features (computed once per image set) and the family's inputs
        kwargs.update(forward_inputs(model, input_ids, attention_mask, media))
    head = HeadStats(model, entropy=entropy, argmax=argmax, mean_logits=mean_logits)
    st = head.run(F.pad(labels[:, start + 1:], (0, 1), value=IGNORE), input_ids=input_ids,
                  attention_mask=attention_mask, use_cache=False, logits_to_keep=T - start, **kwargs)
    return st.map(lambda t: t[:, :-1])


# ─────────────────────────────────────────────── the plain logits ───────────────────────────────────────────────


def response_logits(model, batch: dict, temperature: float, share_prompts: bool = True) -> torch.Tensor:
    """Logits [B, R, V] predicting each response token; only the last R+1 positions go through the LM head. The
    plain reference that :func:`response_stats` is tested against (and benchmarks compare with); training never
    calls it.

    ``share_prompts``: rows whose prompt columns are equal (a GRPO group: ``num_generations`` responses to one
    prompt) run their prompt once (:func:`shared_prompt_logits`); the others as one batch."""
    R = batch["response_ids"].shape[1]
    logits = shared_prompt_logits(model, batch) if share_prompts and can_share_prompts(model) else None
    if logits is None:
        out = model(**_whole(model, batch), use_cache=False, logits_to_keep=R + 1)
        logits = out.logits[:, :-1]
    return logits / temperature if temperature > 0 and temperature != 1.0 else logits


def can_share_prompts(model) -> bool:
    """Whether :func:`shared_prompt_logits` may run ``model``: not under gradient checkpointing (transformers then
    drops the cache the responses attend to), a model whose every layer is full attention keeping every key (no
    sliding window, no linear-attention or recurrent layers), and with gradients only a model that no engine wraps
    (DDP, DeepSpeed, FSDP2 expect one forward per backward)."""
    lm = getattr(model, "module", model)  # DDP / DeepSpeed's wrapped model
    if (lm is not model or isinstance(model, FSDPModule)) and torch.is_grad_enabled():
        return False
    cfg = getattr(lm, "config", None)
    # under any wrapper (a PEFT model, whose own class has no such flag): any module transformers set checkpointing on
    checkpointing = any(getattr(m, "gradient_checkpointing", False) is True for m in lm.modules())
    if cfg is None or checkpointing:
        return False
    text = cfg.get_text_config()
    return not getattr(text, "sliding_window", None) and set(getattr(text, "layer_types", None) or
                                                             ["full_attention"]) == {"full_attention"}


def shared_prompt_logits(model, batch: dict) -> torch.Tensor | None:
    """:func:`response_logits` with each distinct prompt run once: its keys / values (with their autograd graph)
    are copied to the rows that repeat it, and the responses attend to them, as ``generate`` runs a decode after the
    prefill. None when no prompt repeats (the caller runs the whole batch).

    Why: in GRPO / RLOO every prompt comes ``num_generations`` times and is often longer than its responses, so the
    policy's update and the no-grad passes spent most of their forward (and backward) on identical prompt columns.
    Measured on 2 CPU cores (``bench/step_parts.py``: SmolLM2-135M, 2 prompts of 43 tokens x 4 responses of 40):
    forward + backward 3.77 -> 2.77 s, no-grad forward 1.03 -> 0.79 s. Equal to the whole-batch forward to float
    rounding (tested: log-probs and gradients)."""
    def first(rows, kwargs):
        out = model(**kwargs)
        return out.logits[:, -1:].index_select(0, rows), out

    shared = _shared_prompt_passes(model, batch, first, lambda kwargs: model(**kwargs).logits)
    return None if shared is None else torch.cat([shared[0], shared[1][:, :-1]], 1)


def _shared_prompt_passes(model, batch: dict, first, rest):
    """The two forwards of a shared-prompt batch: ``first(inverse, kwargs) -> (result for every row, output)`` on the
    distinct prompts (``logits_to_keep=1``, with their cache) and ``rest(kwargs)`` on the responses against that
    cache copied per row; ``(first's result, rest's result)``, or None when no prompt repeats or the model's cache
    is of another kind (the caller then runs the whole batch)."""
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    B, R = ids.shape[0], batch["response_ids"].shape[1]
    P = ids.shape[1] - R
    if P < 1 or R < 1:
        return None
    media = batch.get("media") or [None] * B  # images: a prompt is the same prompt only with the same images
    rows, inverse = distinct_rows(ids[:, :P], mask[:, :P], media_keys(media))  # a row of each distinct prompt
    if len(rows) == B:
        return None
    extra: dict = {}
    if any(m is not None for m in media):  # the prompts' images: their features in the prompt pass
        pos = mrope_positions(model, ids, mask, media) if family_of(model).mrope else pos
        kept = rows.tolist()
        extra = forward_inputs(model, ids[rows, :P], mask[rows, :P], [media[r] for r in kept], positions=False)
    cols = (lambda t, r, c: t[:, r, c]) if pos.dim() == 3 else (lambda t, r, c: t[r, c])  # [3, B, T]: M-RoPE
    head, out = first(inverse, dict(input_ids=ids[rows, :P], attention_mask=mask[rows, :P],
                                    position_ids=cols(pos, rows, slice(None, P)), use_cache=True, logits_to_keep=1,
                                    **extra))
    if out.past_key_values is not None and any(type(layer) is not DynamicLayer for layer in out.past_key_values.layers):
        return None  # a cache of another kind (a model the config check let through): the whole batch, correct
    columns = 0 if out.past_key_values is None else out.past_key_values.get_seq_length()
    if columns == P:
        cache = DynamicCache(ddp_cache_data=[(layer.keys.index_select(0, inverse), layer.values.index_select(
            0, inverse)) for layer in out.past_key_values.layers])
        tail = rest(dict(input_ids=ids[:, P:], attention_mask=mask, position_ids=cols(pos, slice(None), slice(P, None)),
                         past_key_values=cache, use_cache=True, logits_to_keep=R))
        columns = cache.get_seq_length() - R
    if columns != P:  # the responses would not attend to their prompts: never a silent wrong result
        raise RuntimeError(f"shared-prompt forward: the model kept {columns} prompt columns in its cache, not {P}")
    return head, tail


def response_values(critic, batch: dict) -> torch.Tensor:
    """Critic values [B, R]: the value at the position *before* each response token (the state it is taken in)."""
    R = batch["response_ids"].shape[1]
    kwargs = _whole(critic, batch)
    values = token_values(critic, kwargs.pop("input_ids"), kwargs.pop("attention_mask"), **kwargs)
    return values[:, -R - 1:-1].float()


@contextlib.contextmanager
def on_device(model, device, offload: bool):
    """Move an offloaded model to ``device`` for the duration of the block, and back to CPU after."""
    if offload:
        model.to(device)
    try:
        yield model
    finally:
        if offload:
            model.to("cpu")


def disable_dropout(model) -> None:
    """Dropout off in online RL (LoRA dropout included): old and new log-probs must agree at equal weights, or the
    PPO ratio and the KL estimate carry noise that no learning can remove."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    for key in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if isinstance(getattr(model.config, key, None), float):
            setattr(model.config, key, 0.0)
