"""The prefill of prompts with images, for the static and continuous engines: the vision encoder and the prompt once
per distinct prompt, through the model's own forward, its keys / values written into the engine's cache; the decode
after it is the text stack's alone (rlhfkit's decoder, or the model's own modules), as for a text prompt.

Why through the model's forward: what a VLM does before its text stack differs by family (features scattered at the
image tokens; Qwen2-VL's 3-D M-RoPE positions; Gemma 3's image tokens attending to each other both ways), and it
runs once per prompt, so its speed matters little; the model computes it as it always does, with our attention
function (:mod:`~.generic`) writing each layer's keys / values into our cache layout and attending with our masks
(Gemma 3's image blocks included). The images' features come from :func:`rlhfkit.models.vision.image_features`
(computed once per image set, shared with the trainer's forwards of the step).

What a decode needs from it besides the cache: each row's **rotary shift** (:func:`rlhfkit.models.vision.rope_shift`):
under M-RoPE an image's tokens take fewer positions than they are tokens, so the first response token's position
is the prompt's token count plus a (negative) shift; 0 for every other family. The decode's positions are 1-D:
after the prompt every token is text, whose three M-RoPE components are equal, which is plain RoPE.
"""

from __future__ import annotations

import torch

from ..models.vision import family_of, forward_inputs, media_keys, rope_shift
from .decoder import distinct_rows
from .generic import Layout, Modules, _Call


def decoder_layout(w, vocab: int) -> Layout:
    """The :class:`~.generic.Layout` of rlhfkit's decoder cache for weights ``w`` (layer i at 2i, 2i + 1)."""
    shape = (w.kv_heads, w.head_dim)
    return Layout(((shape, shape),) * len(w.layers), tuple((i, i) for i in range(len(w.layers))), vocab,
                  w.embed.dtype)


def image_blocks(token_types: torch.Tensor) -> torch.Tensor:
    """[B, P] the image block of each token (-1: text): a run of image tokens is one block (Gemma 3's mask)."""
    image = token_types == 1
    start = image & ~torch.nn.functional.pad(image, (1, 0))[:, :-1]
    return torch.where(image, start.long().cumsum(-1) - 1, -1)


def media_prefill(model, layout: Layout, ids: torch.Tensor, mask: torch.Tensor, media: list,
                  cache: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill left-padded prompts ``ids`` / ``mask`` [B, P] with their images (``media``: one Media or None per
    row) into rows :B, columns :P of ``cache`` (``layout``'s); returns the float32 logits [B, V] of each prompt's last
    position and the rotary shift [B] of its decode. A prompt repeated with the same images runs once."""
    B, P = ids.shape
    first, inverse = distinct_rows(ids, mask, media_keys(media, ids.device))
    run_ids, run_mask = ids[first], mask[first]
    run_media = [media[i] for i in first.tolist()]
    extra = forward_inputs(model, run_ids, run_mask, run_media)
    positions = extra.pop("position_ids", None)
    if positions is None:
        positions = (run_mask.cumsum(-1) - 1).clamp(min=0)
    fam = family_of(model)
    blocks = image_blocks(extra[fam.token_types]) if fam.token_types == "token_type_ids" else None
    call = _Call("prefill", dict(layout.layers), cache, mask=run_mask, blocks=blocks)
    logits = Modules(model, layout).logits(call, run_ids, positions, **extra)
    shift = rope_shift(model, run_ids, run_mask, run_media)
    if len(first) < B:
        for c in cache:
            c[:B, :, :P] = c[inverse, :, :P]
        return logits[inverse], shift[inverse]
    return logits, shift
