"""A vision-language model's vision tower in ``rlhfkit plan``: its parameters, the image tokens an image becomes at
the processor's resolution, and the memory encoding images adds (``models/memory.py`` adds these to its phases).

* **Parameters**: the tower and its projector, counted exactly by building the model from its ``config.json`` on
  PyTorch's ``meta`` device (no memory, no weights read). Frozen by default (``model.train_vision=false``): weights
  only, no gradient or AdamW state.
* **Image tokens per image** at the processor's resolution (its ``preprocessor_config.json``): Qwen2-VL's and
  Qwen3-VL's largest image (``max_pixels``) in ``(patch x merge)^2`` tiles; Gemma 3's ``mm_tokens_per_image``; LLaVA's
  ``image_seq_length`` (a CLIP tower's patches); Idefics3's / SmolVLM's largest image in tiles (:func:`_tiles`).
  They are part of every sequence's tokens (``data.max_length`` must hold them): the plan counts one image per
  sequence, of at most the sequence's length (:func:`image_tokens`).
* **Encoding**: the tower's forward over one batch's images (no gradient when frozen: two layers' activations
  live; trained: every layer's, kept for backward), and the features kept between uses (each distinct image set's,
  at most ``models.vision.FEATURE_CACHE_BYTES``; Qwen3-VL's DeepStack keeps its listed tower layers' features beside
  the last's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Tower:
    """The sizes of a vision tower that decide its memory."""

    params: int  # tower + projector
    tokens: int  # image tokens per image (features handed to the language model)
    patches: int  # patches the tower runs per image
    layers: int
    hidden: int
    intermediate: int
    note: str  # where ``tokens`` comes from
    stacks: int = 1  # feature tensors per image token (DeepStack: the last layer's and each listed layer's)


def _vision_params(config) -> int:
    """The tower's and projector's parameters of a VLM config, counted on the meta device."""
    import torch
    from transformers import AutoModelForImageTextToText

    from .vision import FAMILIES

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    fam = FAMILIES[config.model_type]
    return sum(p.numel() for name in fam.vision for p in getattr(model.model, name).parameters())


def _processor_settings(directory: Path | None) -> dict:
    for name in ("preprocessor_config.json", "processor_config.json"):
        try:
            data = json.loads((directory / name).read_text()) if directory is not None else {}
        except (OSError, ValueError):
            continue
        return data.get("image_processor", data) if isinstance(data, dict) else {}
    return {}


def tower_of(config, directory: Path | None = None, processor: dict | None = None) -> Tower | None:
    """The :class:`Tower` of a VLM config (a transformers config object), or None for a text model; ``processor``:
    the image processor's settings (read from ``directory`` when not given)."""
    if getattr(config, "vision_config", None) is None:
        return None
    v, kind = config.vision_config, config.model_type
    settings = processor if processor is not None else _processor_settings(directory)
    layers = getattr(v, "depth", None) or getattr(v, "num_hidden_layers", 0)
    if kind in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        merge, patch = v.spatial_merge_size, v.patch_size
        pixels = int(settings.get("max_pixels") or (settings.get("size") or {}).get("longest_edge") or 12845056)
        tokens, patches = pixels // (patch * merge) ** 2, pixels // patch ** 2
        note = f"an image of max_pixels={pixels:,} in {patch * merge} x {patch * merge} tiles"
    elif kind in ("idefics3", "smolvlm"):
        tokens, patches, note = _tiles(config, settings)
    elif kind == "gemma3":
        tokens, patches = config.mm_tokens_per_image, (v.image_size // v.patch_size) ** 2
        note = f"mm_tokens_per_image (SigLIP at {v.image_size} px)"
    else:
        patches = (v.image_size // v.patch_size) ** 2
        tokens = getattr(config, "image_seq_length", None) or patches
        note = f"{v.image_size} px in {v.patch_size} px patches"
    return Tower(params=_vision_params(config), tokens=int(tokens), patches=int(patches), layers=int(layers),
                 hidden=int(v.hidden_size), intermediate=int(getattr(v, "intermediate_size", 4 * v.hidden_size)),
                 note=note, stacks=1 + len(getattr(v, "deepstack_visual_indexes", None) or ()))


def _tiles(config, settings: dict) -> tuple[int, int, str]:
    """(image tokens, tower patches, note) of Idefics3's / SmolVLM's largest image: a square at the processor's
    ``size.longest_edge`` cut into n x n tiles of ``max_image_size`` plus the whole image at that size (one tile
    without ``do_image_splitting``), each tile ``(image_size / patch)^2 / scale_factor^2`` tokens."""
    from transformers.models.idefics3.image_processing_pil_idefics3 import MAX_IMAGE_SIZE

    v = config.vision_config
    grid = (v.image_size // v.patch_size) ** 2
    per_tile = grid // config.scale_factor ** 2
    tile = int((settings.get("max_image_size") or {}).get("longest_edge") or v.image_size)
    longest = min(int((settings.get("size") or {}).get("longest_edge") or 4 * tile), MAX_IMAGE_SIZE)
    n = -(-longest // tile)
    tiles = n * n + 1 if settings.get("do_image_splitting", True) and n > 1 else 1
    split = f"{n} x {n} tiles + the whole image" if tiles > 1 else "one tile"
    return tiles * per_tile, tiles * grid, f"an image of {longest} px as {split} of {tile} px, {per_tile} tokens each"


def read_tower(name: str) -> Tower | None:
    """The tower of ``model.name`` (a model directory, a cached hub name or a tiny VLM spec), None for a text model."""
    from .vision import vlm_type

    if not vlm_type(name):
        return None
    if name.startswith("tiny"):
        from .tiny import parse_tiny_spec
        from .tiny_vlm import tiny_vlm, tiny_vlm_tokenizer

        s = parse_tiny_spec(name)
        config, processor = tiny_vlm(s, tiny_vlm_tokenizer(s["arch"]))
        return tower_of(config, processor=processor.image_processor.to_dict())
    from transformers import AutoConfig

    from .vision import _hub_kwargs

    return tower_of(AutoConfig.from_pretrained(name, **_hub_kwargs()), Path(name).expanduser())


def image_tokens(tower: Tower, seq_len: int) -> tuple[int, int]:
    """(image tokens, tower patches) of one image in a sequence of ``seq_len`` tokens: the processor's largest image,
    cut to what the sequence holds (a prompt with images is never cut, so a longer one cannot be in the data)."""
    tokens = min(tower.tokens, seq_len)
    return tokens, tower.patches * tokens // tower.tokens


def tower_bytes(tower: Tower, images: int, *, trained: bool, c: int, text_hidden: int,
                seq_len: int) -> dict[str, tuple[float, str]]:
    """Bytes of encoding ``images`` images, one per sequence of ``seq_len`` tokens (``c``: bytes of the compute
    dtype), and of their features: a layer keeps about 6 x hidden + 2 x intermediate numbers per patch (norms,
    q/k/v, attention output, MLP). Frozen, the features are cached (``image_features``): what is encoded once is
    reused by every later pass of the step, so this counts an upper bound for those passes."""
    from .vision import FEATURE_CACHE_BYTES

    tokens, patches = image_tokens(tower, seq_len)
    cut = "" if tokens == tower.tokens else f" (cut to the {seq_len}-token sequence)"
    per = patches * (6 * tower.hidden + 2 * tower.intermediate) * c
    layers = tower.layers if trained else 2
    feats = min(FEATURE_CACHE_BYTES, images * tokens * tower.stacks * text_hidden * c)
    stacks = f" x {tower.stacks} (DeepStack)" if tower.stacks > 1 else ""
    return {"vision tower forward" + ("" if trained else " (no grad, frozen)"): (
                images * per * layers, f"{images} images x {patches:,} patches{cut} x {layers} layers x "
                                       f"(6 x {tower.hidden} + 2 x {tower.intermediate}) x {c} B"),
            "image features (kept per image set)": (feats, f"{images} images x {tokens} tokens{stacks} x {text_hidden} "
                                                           f"x {c} B (at most {FEATURE_CACHE_BYTES / 2**20:.0f} MiB)")}
