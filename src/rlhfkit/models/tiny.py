"""The built-in tiny model: a character-level tokenizer shipped in ``assets/tiny-tokenizer`` and small Llama
models built from config (random weights), so tests, the quickstart and benchmarks run offline in seconds.

Model spec: ``tiny`` or ``tiny:key=value,key=value`` with keys of :data:`TINY_DEFAULTS`
(e.g. ``tiny:hidden=128,layers=4``).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelError

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "tiny-tokenizer"

SPECIAL_TOKENS = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]

TINY_DEFAULTS = {"hidden": 128, "layers": 2, "heads": 4, "kv_heads": 4, "intermediate": 256, "context": 256}


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


def parse_tiny_spec(spec: str) -> dict[str, int]:
    """``tiny:hidden=64,layers=2`` -> dict of model sizes (unknown keys are errors)."""
    sizes = dict(TINY_DEFAULTS)
    _, _, rest = spec.partition(":")
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in TINY_DEFAULTS:
            raise ModelError(
                f"bad tiny model spec item {item!r}",
                where=f"model.name={spec}",
                fix=f"use tiny:key=value,... with keys {sorted(TINY_DEFAULTS)}",
            )
        try:
            sizes[key] = int(value)
        except ValueError:
            raise ModelError(f"{key} must be an integer, got {value!r}", where=f"model.name={spec}") from None
    return sizes


def tiny_llama_config(spec: str, tokenizer):
    """A ``LlamaConfig`` for the given tiny spec and tokenizer (ids of pad / eos taken from the tokenizer)."""
    from transformers import LlamaConfig

    s = parse_tiny_spec(spec)
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=s["hidden"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        intermediate_size=s["intermediate"],
        max_position_embeddings=s["context"],
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
