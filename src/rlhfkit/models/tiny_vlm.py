"""Tiny vision-language models built from config (random weights) with their processors, offline: the character
tokenizer of :mod:`.tiny` plus each family's image tokens, the family's own image processor (its PIL backend: no
torchvision) at a small resolution, and a chat template that renders ``{"type": "image"}`` content parts as the
family does. ``tiny:arch=qwen2_5_vl`` (Qwen2.5-VL: M-RoPE, 2x2 patch merging), ``tiny:arch=gemma3_vl`` (Gemma 3 with
a SigLIP tower, bidirectional attention over each image's tokens, sliding-window text layers), ``tiny:arch=llava``
(LLaVA: a CLIP tower and a Llama language model), ``tiny:arch=qwen3_vl`` (Qwen3-VL: interleaved M-RoPE, DeepStack,
a Qwen3 text stack) and ``tiny:arch=idefics3`` / ``tiny:arch=smolvlm`` (SmolVLM v1 / v2: a SigLIP-style tower, a
pixel-shuffle connector, a Llama language model, images split into tiles), so every recipe and engine runs each
family's code paths in tests and demos. Sizes are the text model's :data:`~.tiny.TINY_DEFAULTS` plus ``image`` (the
side, in pixels, images are resized to; 32: Qwen2.5-VL and Qwen3-VL 4 image tokens, Gemma 3 4, LLaVA 16, Idefics3 /
SmolVLM 4 per tile, 5 tiles for a square picture)."""

from __future__ import annotations

from .tiny import CHARS, SPECIAL_TOKENS, VLM_ARCHS  # noqa: F401 - the names of the archs

PATCH = 8  # vision patch side of every tiny tower

# each family's image tokens: (token, the tokenizer attribute transformers' processor reads it from)
_TOKENS = {
    "qwen2_5_vl": [("<|vision_start|>", "vision_start_token"), ("<|vision_end|>", "vision_end_token"),
                   ("<|image_pad|>", "image_token"), ("<|video_pad|>", "video_token")],
    "qwen3_vl": [("<|vision_start|>", "vision_start_token"), ("<|vision_end|>", "vision_end_token"),
                 ("<|image_pad|>", "image_token"), ("<|video_pad|>", "video_token")],
    "gemma3_vl": [("<start_of_image>", "boi_token"), ("<end_of_image>", "eoi_token"),
                  ("<image_soft_token>", "image_token")],
    "llava": [("<image>", "image_token")],
    "idefics3": [("<fake_token_around_image>", "fake_image_token"), ("<image>", "image_token"),
                 ("<global-img>", "global_image_token"), ("<end_of_utterance>", "end_of_utterance_token")],
}
_TOKENS["smolvlm"] = _TOKENS["idefics3"]
# unnamed special tokens of a family (Idefics3 / SmolVLM: the tile markers its processor writes for a split image)
_MORE = {"idefics3": [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]}
_MORE["smolvlm"] = _MORE["idefics3"]
# how each family's chat template writes an image part (what its processor expands into the image tokens)
_IMAGE_PART = {"qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>", "gemma3_vl": "<start_of_image>",
               "llava": "<image>\n", "qwen3_vl": "<|vision_start|><|image_pad|><|vision_end|>",
               "idefics3": "<image>", "smolvlm": "<image>"}


def chat_template(arch: str) -> str:
    """ChatML with ``{"type": "image"}`` / ``{"type": "text"}`` content parts, the image written as ``arch`` does."""
    part = _IMAGE_PART[arch]
    return ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
            "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
            "{% for item in message['content'] %}{% if item['type'] == 'image' %}" + part +
            "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def extra_tokens(arch: str) -> list[str]:
    """The tokens of ``arch``'s tokenizer after the characters (its image tokens), in id order."""
    return [t for t, _ in _TOKENS.get(arch, ())] + _MORE.get(arch, [])


def tiny_vlm_tokenizer(arch: str):
    """The character tokenizer (the same ids as :func:`~.tiny.build_tiny_tokenizer`'s) plus ``arch``'s image
    tokens after them, as named special tokens (``tok.image_token``, ...), with the family's chat template."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    extra = extra_tokens(arch)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS + extra)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIAL_TOKENS + extra)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<|im_end|>", unk_token="<unk>",
                                  additional_special_tokens=["<|im_start|>"],
                                  extra_special_tokens={name: t for t, name in _TOKENS[arch]},
                                  model_max_length=4096, clean_up_tokenization_spaces=False)
    tok.chat_template = chat_template(arch)
    return tok


def tiny_vlm(s: dict, tok):
    """``(config, processor)`` of a tiny VLM spec ``s`` (:func:`~.tiny.parse_tiny_spec`'s dict) over ``tok``."""
    import transformers

    arch, side = s["arch"], s["image"]
    ids = {name: tok.convert_tokens_to_ids(t) for t, name in _TOKENS[arch]}
    text = dict(vocab_size=len(tok), hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], intermediate_size=s["intermediate"],
                max_position_embeddings=s["context"], pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                bos_token_id=None, tie_word_embeddings=True)
    head_dim = s["hidden"] // s["heads"]
    vision = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, patch_size=PATCH, image_size=side)
    template = chat_template(arch)
    if arch == "qwen2_5_vl":
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        quarter = head_dim // 4  # M-RoPE sections (temporal, height, width) over the rotary half of a head
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                                   "mrope_section": [head_dim // 2 - 2 * quarter, quarter, quarter]}
        cfg = transformers.Qwen2_5_VLConfig(
            text_config=text, vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                 patch_size=PATCH, spatial_merge_size=2, temporal_patch_size=2,
                                                 out_hidden_size=s["hidden"], fullatt_block_indexes=[0],
                                                 window_size=4 * PATCH),
            image_token_id=ids["image_token"], video_token_id=ids["video_token"],
            vision_start_token_id=ids["vision_start_token"], vision_end_token_id=ids["vision_end_token"],
            tie_word_embeddings=True)
        ip = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=2, temporal_patch_size=2,
                                      min_pixels=side * side, max_pixels=side * side)
        processor = images_only(transformers.Qwen2_5_VLProcessor)(image_processor=ip, tokenizer=tok,
                                                                   chat_template=template)
    elif arch == "qwen3_vl":
        cfg, processor = _qwen3_vl(s, tok, ids, text, head_dim, template)
    elif arch == "gemma3_vl":
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        every = min(6, s["layers"])
        per_image = 4  # the tower's (side / PATCH)^2 patches average-pooled to 4 tokens
        cfg = transformers.Gemma3Config(
            text_config=transformers.Gemma3TextConfig(
                **text, head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=s["window"],
                layer_types=["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                             for i in range(s["layers"])]),
            vision_config=transformers.SiglipVisionConfig(**vision, num_hidden_layers=1, vision_use_head=False),
            mm_tokens_per_image=per_image, boi_token_index=ids["boi_token"], eoi_token_index=ids["eoi_token"],
            image_token_index=ids["image_token"], tie_word_embeddings=True)
        ip = Gemma3ImageProcessorPil(size={"height": side, "width": side})
        processor = transformers.Gemma3Processor(image_processor=ip, tokenizer=tok, chat_template=template,
                                                 image_seq_length=per_image)
    elif arch == "llava":
        from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

        cfg = transformers.LlavaConfig(
            text_config=transformers.LlamaConfig(**text), vision_config=transformers.CLIPVisionConfig(
                **vision, num_hidden_layers=2, projection_dim=32),
            image_token_index=ids["image_token"], image_seq_length=(side // PATCH) ** 2, vision_feature_layer=-1,
            tie_word_embeddings=True)
        ip = LlavaImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
        processor = transformers.LlavaProcessor(image_processor=ip, tokenizer=tok, chat_template=template,
                                                patch_size=PATCH, vision_feature_select_strategy="default",
                                                num_additional_image_tokens=1)
    elif arch in ("idefics3", "smolvlm"):
        cfg, processor = _idefics3(arch, side, text, vision, ids, tok, template)
    else:  # pragma: no cover - parse_tiny_spec checks the name
        raise ValueError(arch)
    if arch not in ("idefics3", "smolvlm"):  # (theirs is given to the constructor: its setter warns, deprecated)
        cfg.pad_token_id = tok.pad_token_id
    cfg.eos_token_id = tok.eos_token_id
    return cfg, processor


def _qwen3_vl(s: dict, tok, ids: dict, text: dict, head_dim: int, template: str):
    """Qwen3-VL: a Qwen3 text stack (q / k norms) with interleaved M-RoPE (the rotary frequencies dealt to
    temporal, row and column in turn, ``mrope_section`` of each), a tower with a learned position grid, and DeepStack:
    the first two tower blocks' features, each through its own merger, added to the hidden states of the first two
    text layers at the image tokens (layers=1: the first only)."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    side, third = s["image"], head_dim // 2 // 3
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_interleaved": True,
                               "mrope_section": [head_dim // 2 - 2 * third, third, third]}
    cfg = transformers.Qwen3VLConfig(
        text_config={**text, "head_dim": head_dim},
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=PATCH,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=s["hidden"],
                           num_position_embeddings=16, deepstack_visual_indexes=[0, 1]),
        image_token_id=ids["image_token"], video_token_id=ids["video_token"],
        vision_start_token_id=ids["vision_start_token"], vision_end_token_id=ids["vision_end_token"],
        tie_word_embeddings=True)
    ip = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=2, temporal_patch_size=2, min_pixels=side * side,
                                  max_pixels=side * side)
    processor = images_only(transformers.Qwen3VLProcessor)(image_processor=ip, tokenizer=tok, chat_template=template)
    return cfg, processor


def _idefics3(arch: str, side: int, text: dict, vision: dict, ids: dict, tok, template: str):
    """``(config, processor)`` of a tiny Idefics3 (SmolVLM v1's class) or SmolVLM (SmolVLM2's): a SigLIP-style
    tower, the pixel-shuffle connector (``scale_factor`` 2: (side / PATCH)^2 / 4 tokens per tile), a Llama text
    model. Images are split as the real processors split them: the longest edge resized to ``2 * side``, cut into
    ``side`` x ``side`` tiles (``<row_r_col_c>`` before each) plus the whole image at ``side`` (``<global-img>``), so
    a square picture is 2 x 2 tiles + 1. Both use ``Idefics3Processor`` (the same expansion, token for token, as
    ``SmolVLMProcessor``, which needs ``num2words`` and a video processor, i.e. torchvision)."""
    import transformers

    per_tile = (side // PATCH) ** 2 // 4
    if arch == "idefics3":
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil as Pil

        config_cls, vision_cls = transformers.Idefics3Config, transformers.Idefics3VisionConfig
    else:
        from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil as Pil

        config_cls, vision_cls = transformers.SmolVLMConfig, transformers.SmolVLMVisionConfig
    cfg = config_cls(text_config=transformers.LlamaConfig(**text), vision_config=vision_cls(**vision,
                     num_hidden_layers=1), scale_factor=2, image_token_id=ids["image_token"], tie_word_embeddings=True,
                     pad_token_id=tok.pad_token_id)
    ip = Pil(size={"longest_edge": 2 * side}, max_image_size={"longest_edge": side}, do_image_splitting=True)
    processor = transformers.Idefics3Processor(image_processor=ip, tokenizer=tok, image_seq_len=per_tile,
                                               chat_template=template)
    return cfg, processor


def images_only(cls):
    """``cls`` (a processor class taking ``image_processor, tokenizer, video_processor``) without its video
    processor: transformers checks every declared sub-processor's class, and video processors need torchvision. Used
    by the tiny VLMs and by ``vision.load_processor`` for a real model's processor when torchvision is missing."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        cls.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__})
