"""The images of one tokenised sequence (:class:`Media`) and how a vision-language model's processor turns a rendered
conversation and its images into token ids (:func:`expand`).

A VLM's chat template writes one placeholder per image (``<|image_pad|>``, ``<start_of_image>``, ``<image>``); the
processor replaces each with the image's tokens (as many as the image has patches after merging, at the processor's
resolution) and computes the pixel inputs. rlhfkit renders the conversation as for text (``data/chat.py``: the
assistant's character spans), calls the processor on the rendered text with its images, and maps the token offsets
of the expanded text back onto the rendered one with the processor's replacement offsets, so the assistant mask is
found exactly as for text and every image token lies outside it.

The tokenizer carries its processor as ``tok.rlhfkit_processor`` (set by ``models.vision.load_processor``); data
code asks :func:`processor_of`. A :class:`Media` keeps what is small (the image references, the rendered text, the
number of image tokens, the processor's small per-image tensors such as Qwen2-VL's ``image_grid_thw``); the pixel
tensors are made again when a batch needs them (:meth:`Media.pixels`, a cache bounded in bytes; with a frozen
vision tower only until each image's features are computed, ``models/vision.py``): pixels for a whole dataset
held from tokenisation on would be gigabytes (Qwen2.5-VL: about 4.8 MB of float32 per 448x448 image).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DataError, ModelError
from .images import describe, load_images

PIXEL_CACHE_BYTES = 256 * 2**20  # the pixel tensors kept (the prompts of a few steps at least)
_PIXELS: OrderedDict[tuple, dict] = OrderedDict()


def processor_of(tok) -> Any:
    """The VLM processor the tokenizer came with, or None (a text model)."""
    return getattr(tok, "rlhfkit_processor", None)


def images_key(refs: list) -> str:
    """A digest of the images' contents (files read), the identity of a sequence's images."""
    h = hashlib.sha256()
    for ref in refs:
        h.update(Path(ref).read_bytes() if isinstance(ref, str) else ref)
        h.update(b"|")
    return h.hexdigest()[:24]


@dataclass(eq=False)
class Media:
    """The images of one sequence (a prompt, or a whole SFT conversation): ``refs`` (paths or bytes, in order),
    ``key`` (:func:`images_key`), ``tokens`` (image tokens in its ids), ``text`` (the rendered text the processor
    expanded), ``extras`` (the processor's small tensors for these images, e.g. ``image_grid_thw``). The processor
    itself is not pickled (a record travels to reward workers without it)."""

    refs: list
    key: str
    tokens: int
    text: str
    extras: dict = field(default_factory=dict)
    processor: Any = None

    def __getstate__(self):
        return {**self.__dict__, "processor": None}

    @property
    def images(self) -> int:
        return len(self.refs)

    def pixels(self) -> dict:
        """The processor's image tensors for these images (``pixel_values`` and the rest, batch of one sequence),
        made again from the images (kept in a cache of :data:`PIXEL_CACHE_BYTES`)."""
        if self.processor is None:
            raise ModelError("the images of a record lost their processor (a record sent to another process)",
                             where="model.name", fix="tokenise the records in the process that trains")
        cache_key = (id(self.processor), self.key, self.text)
        if cache_key in _PIXELS:
            _PIXELS.move_to_end(cache_key)
            return _PIXELS[cache_key]
        out = _call(self.processor, self.text, load_images(self.refs), "images", offsets=False)
        pixels = {k: v for k, v in out.items() if k not in _TEXT_KEYS and hasattr(v, "shape")}
        _PIXELS[cache_key] = pixels
        size = sum(v.numel() * v.element_size() for p in _PIXELS.values() for v in p.values())
        while size > PIXEL_CACHE_BYTES and len(_PIXELS) > 1:
            _, dropped = _PIXELS.popitem(last=False)
            size -= sum(v.numel() * v.element_size() for v in dropped.values())
        return pixels


_TEXT_KEYS = frozenset({"input_ids", "attention_mask", "offset_mapping", "text_replacement_offsets",
                        "mm_token_type_ids", "token_type_ids"})


def _call(processor, text: str, images: list, where: str, offsets: bool = True):
    kwargs = {"return_offsets_mapping": True, "return_text_replacement_offsets": True} if offsets else {}
    try:
        return processor(text=[text], images=[images], return_tensors="pt", add_special_tokens=False, **kwargs)
    except (ValueError, TypeError) as exc:
        text_ = " ".join(str(exc).split())[:300]
        raise DataError(f"the processor refused the record's text and {len(images)} image(s): {text_}", where=where,
                        fix="give one image per image placeholder; no image token text in the messages") from None


def image_token_ids(processor) -> set[int]:
    """Every token id the processor writes for images (the placeholder, the image's own tokens, the markers around
    it: ``<start_of_image>``, ``<|vision_start|>``, ...): none of them is ever a trained or sampled token."""
    tok = processor.tokenizer
    names = ("image_token", "boi_token", "eoi_token", "vision_start_token", "vision_end_token", "video_token",
             "image_start_token", "image_end_token", "fake_image_token", "global_image_token", "global_image_tag")
    ids = set()
    for name in names:
        for holder in (processor, tok):
            value = getattr(holder, name, None)
            if isinstance(value, str):
                tid = tok.convert_tokens_to_ids(value)
                if isinstance(tid, int) and tid != tok.unk_token_id:
                    ids.add(tid)
    for holder in (processor, tok):
        value = getattr(holder, "image_token_id", None)
        if isinstance(value, int):
            ids.add(value)
    tiles = getattr(processor, "row_col_ids", None) or ()  # Idefics3 / SmolVLM: <row_r_col_c> before each tile
    ids.update(t for t in tiles if isinstance(t, int) and t != tok.unk_token_id)
    return ids


def feature_token_id(processor) -> int:
    """The token the model puts the image features at (one per feature vector): the tokenizer's ``image_token``
    (Gemma 3's ``<image_soft_token>``; its processor's own ``image_token_id`` is the ``<start_of_image>`` it
    expands), else the processor's."""
    tid = getattr(processor.tokenizer, "image_token_id", None)
    return int(tid) if isinstance(tid, int) else int(processor.image_token_id)


def require_processor(tok, refs: list, where: str):
    """The tokenizer's processor; a :class:`DataError` naming the record when a text model is given images."""
    processor = processor_of(tok)
    if processor is None:
        raise DataError(f"the record has {len(refs)} image(s) but the model has no image processor", where=where,
                        fix="train a vision-language model (one with a processor: Qwen2.5-VL, Gemma 3, ...), or "
                            "drop the images")
    return processor


def expand(tok, text: str, refs: list, where: str) -> tuple[list[int], list[tuple[int, int]], Media]:
    """``(ids, offsets, media)`` of a rendered ``text`` with its images: the processor's ids (each image's
    placeholder expanded to its tokens), each token's character span in ``text`` (the tokens of an expansion span
    its placeholder), and the :class:`Media`."""
    processor = require_processor(tok, refs, where)
    out = _call(processor, text, load_images(refs, where), where)
    if "offset_mapping" not in out or "text_replacement_offsets" not in out:
        raise ModelError(f"{type(processor).__name__} returns no token offsets: rlhfkit needs transformers' "
                         "return_text_replacement_offsets (transformers >= 5.24) and a fast tokenizer",
                         where="model.name", fix="pip install -U transformers")
    ids = [int(i) for i in out["input_ids"][0]]
    spans = sorted((r["new_span"], r["span"]) for r in out["text_replacement_offsets"][0])
    offsets = []
    for s, e in out["offset_mapping"][0].tolist():
        shift, inside = 0, None
        for (ns, ne), (os_, oe) in spans:
            if ne <= s:
                shift += (ne - ns) - (oe - os_)
            elif ns <= s < ne:
                inside = (os_, oe)
                break
        offsets.append(inside if inside is not None else (s - shift, e - shift))
    feature_id = feature_token_id(processor)
    extras = {k: v for k, v in out.items() if k not in _TEXT_KEYS and hasattr(v, "shape")
              and not k.startswith("pixel")}
    media = Media(list(refs), images_key(refs), ids.count(feature_id), text, extras, processor)
    return ids, offsets, media


def media_where(media: Media | None) -> str:
    return "" if media is None else ", ".join(describe(r) for r in media.refs)
