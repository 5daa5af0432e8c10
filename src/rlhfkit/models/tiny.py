"""The built-in tiny model: a character-level tokenizer shipped in ``assets/tiny-tokenizer`` and small models built
from config (random weights), so tests, the quickstart and benchmarks run offline in seconds.

Model spec: ``tiny`` or ``tiny:key=value,key=value`` with keys of :data:`TINY_DEFAULTS` (e.g.
``tiny:hidden=128,layers=4``) and ``arch``, one of :data:`TINY_ARCHS`: ``llama`` (the default), ``qwen3`` (per-head
q/k norms) or ``gemma3`` (Gemma 3's norms, scaled embeddings, gelu-tanh, local layers with a sliding window of
``window`` tokens and a global layer every sixth, or the last when fewer; ``tiny:arch=gemma3``), so a recipe can be
run end to end on each family's code paths (the rollout engine's included). The vision-language archs
(``qwen2_5_vl``, ``gemma3_vl``, ``llava``, ``qwen3_vl``, ``idefics3``, ``smolvlm``: :mod:`.tiny_vlm`) add a small
vision tower and their processor, images resized to ``image`` pixels a side.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelError

VLM_ARCHS = ("qwen2_5_vl", "gemma3_vl", "llava", "qwen3_vl", "idefics3", "smolvlm")

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "tiny-tokenizer"

SPECIAL_TOKENS = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]

TINY_DEFAULTS = {"hidden": 128, "layers": 2, "heads": 4, "kv_heads": 4, "intermediate": 256, "context": 256,
                 "window": 16, "image": 32}
TINY_ARCHS = ("llama", "qwen3", "gemma3", "qwen2_5_vl", "gemma3_vl", "llava", "qwen3_vl", "idefics3",
              "smolvlm")


def build_tiny_tokenizer(out_dir: str | Path) -> Path:
    """Write the character-level tokenizer (100 tokens, EOS ``<|im_end|>``, pad ``<pad>``, no chat template)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=TINY_DEFAULTS["context"],
        clean_up_tokenization_spaces=False,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return out


def parse_tiny_spec(spec: str) -> dict:
    """``tiny:hidden=64,layers=2`` -> dict of model sizes and ``arch`` (unknown keys or architectures are errors)."""
    sizes: dict = {**TINY_DEFAULTS, "arch": "llama"}
    _, _, rest = spec.partition(":")
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if key == "arch" and eq:
            if value not in TINY_ARCHS:
                raise ModelError(f"unknown tiny architecture {value!r}", where=f"model.name={spec}",
                                 fix=f"use arch= one of {', '.join(TINY_ARCHS)}")
            sizes["arch"] = value
            continue
        if not eq or key not in TINY_DEFAULTS:
            raise ModelError(
                f"bad tiny model spec item {item!r}",
                where=f"model.name={spec}",
                fix=f"use tiny:key=value,... with keys {sorted([*TINY_DEFAULTS, 'arch'])}",
            )
        try:
            sizes[key] = int(value)
        except ValueError:
            raise ModelError(f"{key} must be an integer, got {value!r}", where=f"model.name={spec}") from None
    return sizes


def tiny_config(spec: str, tokenizer):
    """The transformers config of a tiny spec (its ``arch``: ``LlamaConfig``, ``Qwen3Config`` or
    ``Gemma3TextConfig``; a VLM's: ``loading.tiny_model_config`` through :mod:`.tiny_vlm`, which imports this
    module), with the tokenizer's vocabulary and pad / EOS ids and tied embeddings."""
    import transformers

    s = parse_tiny_spec(spec)
    if s["arch"] in VLM_ARCHS:
        raise ValueError(f"{spec} is a tiny VLM: its config comes from models.tiny_vlm (loading.tiny_model_config)")
    common = dict(vocab_size=len(tokenizer), hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                  num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                  intermediate_size=s["intermediate"], max_position_embeddings=s["context"],
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
                  tie_word_embeddings=True)
    head_dim = s["hidden"] // s["heads"]
    if s["arch"] == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=head_dim)
    if s["arch"] == "gemma3":
        every = min(6, s["layers"])  # Gemma 3: five local layers, then a global one
        return transformers.Gemma3TextConfig(
            **common, head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=s["window"],
            layer_types=["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                         for i in range(s["layers"])])
    return transformers.LlamaConfig(**common)


tiny_llama_config = tiny_config  # its name before the tiny model had other architectures
