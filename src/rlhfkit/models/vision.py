"""Vision-language models: which families, their processors, and the inputs a forward over images takes.

A VLM is a language model whose prompt holds image tokens: the processor writes as many as an image has features
(``data/media.py``), the vision tower (and its projector) turns the image into those features, and the model puts
them at the image tokens before its text stack runs. Everything after that is a causal LM, so rlhfkit trains and
decodes the text stack as it does any other (its decoder, the fused LM head, LoRA, the engines), and handles images
in three places only:

* **Loading** (:func:`load_processor`, :func:`vlm_type`): ``AutoModelForImageTextToText`` with the family's
  ``AutoProcessor``; the processor's chat template is the tokenizer's, so SFT, DPO and the online recipes render
  prompts alike. Without torchvision (its PyPI wheels do not import beside some torch builds) transformers cannot
  build a processor that declares a video processor (Qwen2-VL's, Qwen2.5-VL's): :func:`~.tiny_vlm.images_only` builds it
  without one (images only), and image processors are taken with their PIL backend.
* **The vision tower once per image** (:func:`image_features`): features are computed for the distinct image sets
  of a batch, under no gradient when the tower is frozen (the default, ``model.train_vision=false``: LoRA then
  adapts the language model only, :func:`language_model_name`), and kept in a cache of :data:`FEATURE_CACHE_BYTES` per
  model: a frozen tower gives an image the same features all run, so the rollout's prefill, the old, reference
  and update forwards of a step (and the next epochs) all reuse them; the G samples of a prompt share them.
  Qwen3-VL's DeepStack features (several tower layers', added to the first text layers' hidden states at the image
  tokens) are kept with them and handed back the same way (:func:`encoder_outputs`).
* **The family's extra inputs** (:func:`forward_inputs`): the features (``mm_encoder_outputs``, the precomputed
  encoder outputs transformers' VLMs accept), Qwen2-VL's 3-D M-RoPE positions (``get_rope_index``), Gemma 3's
  ``token_type_ids`` (its image tokens attend to each other both ways).

:data:`FAMILIES` lists the families whose code paths are covered; another VLM is refused in one line.
"""

from __future__ import annotations

import inspect
import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ModelError

FEATURE_CACHE_BYTES = 512 * 2**20


@dataclass(frozen=True)
class Family:
    """What differs between VLM families for rlhfkit. ``text``: the attribute of the base model that holds the
    language model; ``vision``: those of the vision tower and its projector (frozen by default); ``mrope``: 3-D
    rotary positions (``get_rope_index``); ``token_types``: the keyword of the per-token image mask its forward
    reads (None: none); ``tuple_features``: the forward concatenates a sequence of feature tensors (else it takes
    one tensor); ``image_rows``: the pixel tensors are ``[sequences, images, ...]`` (Idefics3 / SmolVLM: a split
    image's tiles are images), padded with all-zero images to a batch's most (else ``[images, ...]``)."""

    name: str
    text: str
    vision: tuple[str, ...]
    mrope: bool = False
    token_types: str | None = None
    tuple_features: bool = True
    image_rows: bool = False


FAMILIES = {
    "qwen2_vl": Family("Qwen2-VL", "language_model", ("visual",), mrope=True, token_types="mm_token_type_ids"),
    "qwen2_5_vl": Family("Qwen2.5-VL", "language_model", ("visual",), mrope=True, token_types="mm_token_type_ids"),
    "gemma3": Family("Gemma 3", "language_model", ("vision_tower", "multi_modal_projector"),
                     token_types="token_type_ids", tuple_features=False),
    "llava": Family("LLaVA", "language_model", ("vision_tower", "multi_modal_projector")),
    "qwen3_vl": Family("Qwen3-VL", "language_model", ("visual",), mrope=True, token_types="mm_token_type_ids"),
    "idefics3": Family("Idefics3 / SmolVLM", "text_model", ("vision_model", "connector"), image_rows=True),
    "smolvlm": Family("SmolVLM2", "text_model", ("vision_model", "connector"), image_rows=True),
}
TINY_TYPES = {"qwen2_5_vl": "qwen2_5_vl", "gemma3_vl": "gemma3", "llava": "llava",  # tiny arch -> model_type
              "qwen3_vl": "qwen3_vl", "idefics3": "idefics3", "smolvlm": "smolvlm"}


# ─────────────────────────────────────────────── which models ───────────────────────────────────────────────


def _config_dict(source: str) -> dict | None:
    path = Path(source).expanduser() / "config.json"
    if not path.is_file() and "/" in source and not source.startswith((".", "/", "~")):  # a hub name: its cache
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(source, "config.json")
        except (ImportError, ValueError):
            cached = None
        path = Path(cached) if isinstance(cached, str) else path
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def vlm_type(source: str) -> str | None:
    """The VLM family (``model_type``) of a model source, read from its ``config.json`` (or a ``tiny:arch=``
    spec), or None for a text model. A multimodal config of a family not in :data:`FAMILIES` is a
    :class:`ModelError`."""
    if source.startswith("tiny"):
        from .tiny import parse_tiny_spec

        return TINY_TYPES.get(parse_tiny_spec(source)["arch"])
    cfg = _config_dict(source)
    if cfg is None or not isinstance(cfg.get("vision_config"), dict):
        return None
    kind = cfg.get("model_type")
    if kind not in FAMILIES:
        names = ", ".join(f.name for f in FAMILIES.values())
        raise ModelError(f"{source} is a vision-language model of type {kind!r}, which rlhfkit's VLM path does not "
                         f"cover (it covers {names})", where="model.name",
                         fix="use a model of a covered family, or its language model alone as a text model")
    return kind


def _image_processor_config(source: str) -> dict | None:
    """The image processor's settings of a model source, from its files (a tiny spec: its arch and image side)."""
    if source.startswith("tiny"):
        from .tiny import parse_tiny_spec

        s = parse_tiny_spec(source)
        return {"arch": s["arch"], "image": s["image"]}
    path = Path(source).expanduser()
    for name in ("preprocessor_config.json", "processor_config.json"):
        try:
            data = json.loads((path / name).read_text())
        except (OSError, ValueError):
            continue
        data = data.get("image_processor", data) if isinstance(data, dict) else {}
        return {k: v for k, v in data.items() if k not in ("processor_class", "image_processor_type", "backend")}
    return None


def processor_difference(student: str, teacher: str) -> str | None:
    """How ``teacher``'s image processing differs from ``student``'s, in a phrase (None: the same; read from their
    files, before any weights): another family, or other image processor settings (another number of image tokens
    per image, so other ids)."""
    kinds = vlm_type(student), vlm_type(teacher)
    if kinds[0] != kinds[1]:
        return f"student {kinds[0] or 'text'}, teacher {kinds[1] or 'text'}"
    a, b = _image_processor_config(student), _image_processor_config(teacher)
    if a != b:
        keys = sorted(k for k in set(a or {}) | set(b or {}) if (a or {}).get(k) != (b or {}).get(k))[:3]
        return "image processor settings differ" + (f" ({', '.join(keys)})" if keys else "")
    return None


def hf_model(model):
    """The ``transformers`` model under DDP / accelerate's ``.module`` and a PEFT wrapper."""
    for _ in range(8):
        inner = getattr(model, "module", None)
        if isinstance(inner, torch.nn.Module):
            model = inner
            continue
        if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
            model = model.get_base_model()
            continue
        break
    return model


def family_of(model) -> Family | None:
    """The :class:`Family` of a loaded model (None: a text model)."""
    cfg = getattr(hf_model(model), "config", None)
    if cfg is None or getattr(cfg, "vision_config", None) is None:
        return None
    return FAMILIES.get(getattr(cfg, "model_type", None))


def base_of(model):
    """The VLM's base model (``XModel``: the towers and the language model, no LM head)."""
    return hf_model(model).model


def vision_modules(model) -> list[torch.nn.Module]:
    """The vision tower and its projector."""
    fam, base = family_of(model), base_of(model)
    return [getattr(base, name) for name in fam.vision if isinstance(getattr(base, name, None), torch.nn.Module)]


def freeze_vision(model) -> int:
    """No gradient for the vision tower and projector (``model.train_vision=false``); returns the parameters frozen."""
    n = 0
    for module in vision_modules(model):
        for p in module.parameters():
            p.requires_grad_(False)
            n += p.numel()
    return n


def vision_frozen(model) -> bool:
    return not any(p.requires_grad for m in vision_modules(model) for p in m.parameters())


def language_model_name(model) -> str:
    """The full module name of the language model inside the VLM ``model`` (``model.language_model``): LoRA adapts
    modules under it only, never the vision tower's, whose blocks may share their names (Qwen2.5-VL's vision MLP
    has ``gate_proj`` / ``up_proj`` / ``down_proj`` too; :func:`~.loading.lora_targets`)."""
    text = getattr(base_of(model), family_of(model).text)
    return next(n for n, m in hf_model(model).named_modules() if m is text)


# ─────────────────────────────────────────────── processors ─────────────────────────────────────────────────


def load_processor(source: str, tok=None):
    """The processor of a VLM source (a model directory, a cached hub name or a tiny VLM spec), its chat template
    on its tokenizer (the one template every stage renders with), the tokenizer's ``rlhfkit_processor`` set to it.
    Image processors with their PIL backend (no torchvision); a processor that declares a video processor built
    without it when torchvision is missing (:func:`~.tiny_vlm.images_only`)."""
    if source.startswith("tiny"):
        from .tiny import parse_tiny_spec
        from .tiny_vlm import tiny_vlm, tiny_vlm_tokenizer

        s = parse_tiny_spec(source)
        _, processor = tiny_vlm(s, tok if tok is not None else tiny_vlm_tokenizer(s["arch"]))
    else:
        processor = _auto_processor(source)
    tok = processor.tokenizer
    if getattr(processor, "chat_template", None):
        tok.chat_template = processor.chat_template
    tok.rlhfkit_processor = processor
    return processor


def _hub_kwargs() -> dict:
    import os

    return {"local_files_only": True} if os.environ.get("HF_HUB_OFFLINE", "1") != "0" else {}


def _auto_processor(source: str):
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    try:
        return AutoProcessor.from_pretrained(source, backend="pil", **_hub_kwargs())
    except (AttributeError, ValueError, TypeError, ImportError, OSError) as first:
        cls_name = _processor_class(source)
        import transformers

        cls = getattr(transformers, cls_name or "", None)
        if cls is None or "video_processor" not in inspect.signature(cls.__init__).parameters:
            raise ModelError(f"cannot load the processor of {source}: {' '.join(str(first).split())[:200]}",
                             where="model.name", fix="check the model directory's processor files") from None
    try:
        image = AutoImageProcessor.from_pretrained(source, backend="pil", **_hub_kwargs())
        tok = AutoTokenizer.from_pretrained(source, **_hub_kwargs())
        template = getattr(tok, "chat_template", None) or _saved_template(source)
        from .tiny_vlm import images_only  # (there: tiny.py imports tiny_vlm, which must not import this module)

        return images_only(cls)(image_processor=image, tokenizer=tok, chat_template=template,
                                **_processor_kwargs(source, cls))
    except (ImportError, OSError, ValueError, TypeError) as exc:  # ImportError: SmolVLM2's needs num2words
        fix = "install the package it names" if isinstance(exc, ImportError) else \
            "check the model directory's processor files"
        raise ModelError(f"cannot load the processor of {source}: {' '.join(str(exc).split())[:200]}",
                         where="model.name", fix=fix) from None


def _processor_kwargs(source: str, cls) -> dict:
    """The processor's own settings in its ``processor_config.json`` that ``cls`` takes (SmolVLM2's
    ``image_seq_len``: without it, 169 image tokens a tile whatever the model's)."""
    try:
        data = json.loads((Path(source) / "processor_config.json").read_text())
    except (OSError, ValueError):
        return {}
    takes = inspect.signature(cls.__init__).parameters
    parts = ("self", "image_processor", "tokenizer", "video_processor", "chat_template")
    return {k: v for k, v in data.items() if k in takes and k not in parts} if isinstance(data, dict) else {}


def _processor_class(source: str) -> str | None:
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        try:
            value = json.loads((Path(source) / name).read_text()).get("processor_class")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, str):
            return value
    return None


def _saved_template(source: str) -> str | None:
    path = Path(source)
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    try:
        return json.loads((path / "chat_template.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return None


# ─────────────────────────────────────────── the vision tower ───────────────────────────────────────────────


def batch_pixels(medias: list, rows: bool = False) -> dict:
    """The processor's image tensors of several sequences as one batch, as the processor makes them for a batch:
    concatenated along their first axis, in order; ``rows`` (:attr:`Family.image_rows`, tensors ``[1, images, ...]``
    per sequence): each padded with zeros to the batch's most images (and largest size) first, which the model
    reads as no image."""
    parts = [m.pixels() for m in medias]
    if not rows:
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    out = {}
    for k in parts[0]:
        shape = [max(p[k].shape[d] for p in parts) for d in range(parts[0][k].dim())]
        padded = [torch.nn.functional.pad(p[k], [x for d in reversed(range(1, len(shape)))
                                                 for x in (0, shape[d] - p[k].shape[d])]) for p in parts]
        out[k] = torch.cat(padded)
    return out


def _cache(model) -> OrderedDict:
    base = base_of(model)
    cache = base.__dict__.get("_rlhfkit_features")
    if cache is None:
        cache = base.__dict__["_rlhfkit_features"] = OrderedDict()
    return cache


def _encode(model, medias: list) -> list[torch.Tensor]:
    """Features [tokens_i, H] of each sequence's images: one call of the family's ``get_image_features``."""
    base = base_of(model)
    device = next(base.parameters()).device
    pixels = batch_pixels(medias, family_of(model).image_rows)
    accepts = inspect.signature(base.get_image_features).parameters
    every = any(p.kind is p.VAR_KEYWORD for p in accepts.values())
    kwargs = {k: v.to(device) for k, v in pixels.items() if every or k in accepts}
    out = base.get_image_features(**kwargs, return_dict=True)
    flat = _flat(out.pooler_output)
    deep = getattr(out, "deepstack_features", None)
    if deep:  # DeepStack (Qwen3-VL): the listed tower layers' features too, kept with them: [tokens, 1 + layers, H]
        flat = torch.stack([flat, *map(_flat, deep)], 1)
    counts = [m.tokens for m in medias]
    if flat.shape[0] != sum(counts):
        raise RuntimeError(f"the vision tower gave {flat.shape[0]} features for {sum(counts)} image tokens")
    return list(torch.split(flat, counts))


def _flat(pooled) -> torch.Tensor:
    """[tokens, H] of the tower's features of a batch (one tensor, or one per image)."""
    if isinstance(pooled, (list, tuple)):
        return torch.cat([p.reshape(-1, p.shape[-1]) for p in pooled])
    return pooled.reshape(-1, pooled.shape[-1])


def image_features(model, medias: list, *, grad: bool | None = None) -> list[torch.Tensor]:
    """Features of each sequence's images (one tensor [image tokens, hidden] per item of ``medias``; with DeepStack
    [image tokens, 1 + its layers, hidden], the last layer's first). A frozen
    tower (``grad`` None: as the tower is) computes each distinct image set once and keeps it (see the module
    docstring); a trained one computes all of them, with gradients."""
    grad = (not vision_frozen(model)) if grad is None else grad
    if grad:
        return _encode(model, medias)
    cache = _cache(model)
    dtype = next(base_of(model).parameters()).dtype
    autocast = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
    keys = [(m.key, m.tokens, dtype, autocast) for m in medias]
    missing, seen = [], set()
    for m, key in zip(medias, keys):
        if key not in cache and key not in seen:
            missing.append(m)
            seen.add(key)
    if missing:
        with torch.no_grad():
            made = _encode(model, missing)
        for m, feats in zip(missing, made):
            cache[(m.key, m.tokens, dtype, autocast)] = feats
    out = []
    for key in keys:
        cache.move_to_end(key)
        out.append(cache[key])
    size = sum(t.numel() * t.element_size() for t in cache.values())
    while size > FEATURE_CACHE_BYTES and len(cache) > len(set(keys)):
        _, dropped = cache.popitem(last=False)
        size -= dropped.numel() * dropped.element_size()
    return out


def forget_features(model) -> None:
    """Drop the cached features (the tower's weights were changed)."""
    _cache(model).clear()


# ─────────────────────────────────────────── a forward's inputs ─────────────────────────────────────────────


def encoder_outputs(model, features: list[torch.Tensor]) -> dict:
    """``mm_encoder_outputs`` of features in row order, in the family's format (DeepStack's: the features of the
    tower's listed layers beside the last's, which the model adds to its first text layers' hidden states)."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    flat = torch.cat(features) if features else None
    if flat is not None and flat.dim() == 3:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        return {"image": BaseModelOutputWithDeepstackFeatures(
            pooler_output=(flat[:, 0],), deepstack_features=[(flat[:, i],) for i in range(1, flat.shape[1])])}
    pooled = (flat,) if family_of(model).tuple_features else flat
    return {"image": BaseModelOutputWithPooling(pooler_output=pooled)}


def mrope_positions(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, media: list) -> torch.Tensor:
    """Qwen2-VL's 3-D rotary positions [3, B, T] of left- or right-padded rows (padding at 0): the text tokens'
    positions count on, an image's tokens take (temporal, row, column) positions of its grid."""
    base = base_of(model)
    grids = [m.extras["image_grid_thw"] for m in media if m is not None]
    image = feature_id(model)
    types = (input_ids == image).int()
    if not grids:
        pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return pos[None].expand(3, -1, -1)
    pos, _ = base.get_rope_index(input_ids, image_grid_thw=torch.cat(grids).to(input_ids.device),
                                 attention_mask=attention_mask, mm_token_type_ids=types)
    return pos


def rope_shift(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, media: list) -> torch.Tensor:
    """[B] the offset of each row's next text position from its token count (0 but for M-RoPE, where an image's
    tokens take fewer positions than tokens): a decode step's rotary position is ``tokens + shift``."""
    if not family_of(model).mrope:
        return torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    pos = mrope_positions(model, input_ids, attention_mask, media)
    top = pos.masked_fill(~attention_mask.bool()[None], -1).amax(dim=(0, 2))
    return top + 1 - attention_mask.long().sum(-1)


_IMAGE_IDS = ("image_token_id", "image_token_index", "video_token_id", "vision_start_token_id", "vision_end_token_id",
              "vision_token_id", "boi_token_index", "eoi_token_index", "boi_token_id", "eoi_token_id")


def image_token_ids(model) -> tuple[int, ...]:
    """The token ids a VLM reserves for images (placeholders, their markers; from its config): never a response
    token (() for a text model)."""
    if family_of(model) is None:
        return ()
    cfg = hf_model(model).config
    return tuple(sorted({int(v) for k in _IMAGE_IDS if isinstance(v := getattr(cfg, k, None), int)}))


def feature_id(model) -> int:
    cfg = hf_model(model).config
    value = getattr(cfg, "image_token_id", None)
    return int(value if value is not None else cfg.image_token_index)


def forward_inputs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, media: list, *,
                   positions: bool = True) -> dict:
    """The keyword arguments a forward of ``input_ids`` [B, T] needs for its images besides ids and mask: the
    features of the rows' images (``media``: one :class:`~rlhfkit.data.media.Media` or None per row; a row's
    image tokens must all be in ``input_ids``), the per-token image mask the family reads, and (``positions``) the
    3-D M-RoPE positions. {} for a text model or rows without images."""
    fam = family_of(model)
    if fam is None or not any(m is not None for m in media):
        return {}
    rows = [m for m in media if m is not None]
    out: dict = {"mm_encoder_outputs": encoder_outputs(model, image_features(model, rows))}
    if fam.token_types is not None:
        out[fam.token_types] = (input_ids == feature_id(model)).long()
    if fam.mrope and positions:
        out["position_ids"] = mrope_positions(model, input_ids, attention_mask, media)
    return out


def generate_inputs(model, input_ids: torch.Tensor, media: list) -> dict:
    """What transformers' ``generate`` takes for the rows' images: the processor's pixel tensors of the rows with
    images, in order, and the family's per-token image mask (``generate`` runs the tower itself: the reference the
    engines are tested against)."""
    fam, rows = family_of(model), [m for m in media if m is not None]
    device = input_ids.device
    out = {k: v.to(device) for k, v in batch_pixels(rows, fam.image_rows).items()} if rows else {}
    if fam is not None and fam.token_types is not None:
        out[fam.token_types] = (input_ids == feature_id(model)).long()
    return out


def text_positions(model, position_ids: torch.Tensor) -> torch.Tensor:
    """Positions for a forward of text tokens only: [3, B, T] for M-RoPE (the three the same), else as given."""
    fam = family_of(model)
    if fam is not None and fam.mrope and position_ids.dim() == 2:
        return position_ids[None].expand(3, -1, -1)
    return position_ids


def media_keys(media: list, device=None) -> torch.Tensor | None:
    """[B] long: equal for rows with the same images (0: none); None when no row has images."""
    if not any(m is not None for m in media):
        return None
    index: dict[str, int] = {}
    return torch.tensor([0 if m is None else index.setdefault(m.key, len(index) + 1) for m in media],
                        dtype=torch.long, device=device)
