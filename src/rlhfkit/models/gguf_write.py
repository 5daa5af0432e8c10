"""Writing a model as one GGUF file (llama.cpp, Ollama, LM Studio), with the ``gguf`` package's own writer and its
tensor-name map (``gguf.GGUFWriter``, ``gguf.get_tensor_name_map``): no llama.cpp checkout needed.

What is written, and what is refused in one line (:func:`check_writable`, before anything is written):

* **Architectures**: the Llama family as llama.cpp's ``llama`` architecture (``LlamaForCausalLM``: Llama 2 / 3 without
  rope scaling, SmolLM / SmolLM2, TinyLlama; ``MistralForCausalLM`` without a sliding window). Q and K projections are
  permuted into llama.cpp's rotary layout as llama.cpp's own converter does (transformers' GGUF reader undoes it:
  the round trip is tested). Refused: other architectures (Qwen2, Gemma, Phi-3, ...), rope scaling (Llama 3.1's
  ``rope_type=llama3`` needs a ``rope_freqs`` tensor), biases on attention or MLP, reward models (a classifier head).
  Convert those with llama.cpp's ``convert_hf_to_gguf.py`` from the directory ``rlhfkit export`` writes.
* **Weights**: F32, F16 or BF16 (the model's own dtype by default, ``--dtype``); norms stay F32 as llama.cpp keeps
  them. No quantisation here (``llama-quantize`` does it from this file).
* **Tokenizer**: byte-level BPE (GPT-2 style: SmolLM2, Llama 3, Qwen and most chat models) as
  ``tokenizer.ggml.model=gpt2`` with its tokens, merges, token types (special tokens as control), BOS / EOS / pad
  ids and the chat template. The pre-tokenizer name llama.cpp splits text with (``tokenizer.ggml.pre``) is read from
  the tokenizer's own split rule where it is a known one (GPT-2's, SmolLM's single digits, those of transformers'
  GGUF table: llama-bpe, qwen2, ...), else ``default`` (llama.cpp then splits as GPT-2 does: said when written).
  SentencePiece tokenizers and rlhfkit's character-level tiny tokenizer are refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .. import files
from ..errors import ModelError

ARCHITECTURES = {"llama": "llama", "mistral": "llama"}  # transformers model_type -> llama.cpp architecture
DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
FIX = ("export the Hugging Face directory (--out DIR) and convert it with llama.cpp's convert_hf_to_gguf.py "
       "(the GGUF writer here covers Llama-family models with byte-level BPE tokenizers)")


def _rope(config) -> tuple[float, str]:
    """(rope theta, rope type) of a transformers 4 or 5 Llama config."""
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return float(theta), str(kind)


def _tokenizer_json(tok) -> dict:
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise ModelError(f"the tokenizer ({type(tok).__name__}) has no tokenizers backend to read its vocabulary "
                         "from", where="--out", fix=FIX)
    return json.loads(backend.to_str())


def _is_byte_level(data: dict) -> bool:
    def has(node) -> bool:
        if not isinstance(node, dict):
            return False
        if node.get("type") == "ByteLevel":
            return True
        return any(has(n) for n in node.get("pretokenizers") or node.get("decoders") or [])
    return data.get("model", {}).get("type") == "BPE" and (has(data.get("pre_tokenizer")) or has(data.get("decoder")))


def pre_tokenizer_name(data: dict) -> str:
    """llama.cpp's name for the tokenizer's split rule (``tokenizer.ggml.pre``): ``gpt-2`` for GPT-2's own,
    ``smollm`` for single digits before GPT-2's, a name of transformers' GGUF table for its split regexes;
    ``default`` for anything else."""
    pre = data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"]:
        regex = (steps[0].get("pattern") or {}).get("Regex")
        try:
            from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
        except ImportError:  # pragma: no cover - an older transformers
            return "default"
        return next((name for name, split in GGUF_PRE_TOKENIZER_SPLITS.items() if split == regex), "default")
    return "default"


def check_writable(model, tok) -> None:
    """One line (:class:`ModelError`) for a model or tokenizer this writer does not cover (module docstring)."""
    config = model.config
    kind = getattr(config, "model_type", "?")
    if any(str(a).endswith("ForSequenceClassification") for a in getattr(config, "architectures", None) or []) \
            or not hasattr(model, "lm_head"):
        raise ModelError("a reward model (a classifier head) has no GGUF form llama.cpp runs", where="--out",
                         fix="export it as a directory: --out DIR")
    if kind not in ARCHITECTURES:
        raise ModelError(f"GGUF export is not built for model_type={kind!r} (Llama family only: "
                         f"{', '.join(ARCHITECTURES)})", where="--out", fix=FIX)
    theta, rope = _rope(config)
    if rope != "default":
        raise ModelError(f"rope_type={rope!r} (rope scaling) is not written to GGUF here", where="--out", fix=FIX)
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise ModelError("attention / MLP biases are not written to GGUF here", where="--out", fix=FIX)
    if getattr(config, "sliding_window", None):
        raise ModelError("a sliding attention window is not written to GGUF here", where="--out", fix=FIX)
    if not _is_byte_level(_tokenizer_json(tok)):
        raise ModelError(f"the tokenizer is not a byte-level BPE ({type(tok).__name__}: SentencePiece or character "
                         "vocabularies are not written to GGUF here)", where="--out", fix=FIX)


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Q / K rows from transformers' rotary layout (halves) to llama.cpp's (interleaved pairs), per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _array(t: torch.Tensor, kind: str):
    """(numpy array, raw dtype for BF16) of ``t`` in GGUF type ``kind``."""
    import gguf

    t = t.detach().cpu()
    if kind == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().view("uint16"), gguf.GGMLQuantizationType.BF16
    return t.to(torch.float16 if kind == "F16" else torch.float32).numpy(), None


def _vocabulary(tok, data: dict, n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, token types, merges) for ``n_vocab`` embedding rows (rows past the tokenizer: ``[PAD<i>]``,
    unused, as llama.cpp's converter writes them)."""
    import gguf

    vocab = tok.get_vocab()
    by_id = {i: t for t, i in vocab.items()}
    special = {a["content"] for a in data.get("added_tokens", []) if a.get("special")}
    added = {a["content"] for a in data.get("added_tokens", [])}
    tokens, types = [], []
    for i in range(n_vocab):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(token)
        types.append(gguf.TokenType.CONTROL if token in special else
                     gguf.TokenType.USER_DEFINED if token in added else gguf.TokenType.NORMAL)
    if len(vocab) > n_vocab:
        raise ModelError(f"the tokenizer has {len(vocab)} tokens for {n_vocab} embedding rows", where="--out",
                         fix="export the tokenizer the model was trained with")
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"].get("merges", [])]
    return tokens, types, merges


def write_gguf(model, tok, out: str | Path, dtype: torch.dtype, name: str | None = None) -> dict:
    """Write ``model`` (a Llama-family causal LM, merged) and ``tok`` to the GGUF file ``out`` in ``dtype`` (2-D
    weights; norms F32), atomically (a ``.tmp`` renamed over ``out``). Returns what was written: the architecture,
    the tensor type, the pre-tokenizer name, the number of tensors and bytes."""
    import gguf

    check_writable(model, tok)
    out, kind = Path(out), DTYPES[dtype]
    config = model.config
    data = _tokenizer_json(tok)
    n_head, n_kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or \
        config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_head
    theta, _ = _rope(config)
    state = {k: v for k, v in model.state_dict().items() if "rotary_emb" not in k}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # absent output.weight: llama.cpp and transformers tie it
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    tmp = out.with_name(out.name + ".tmp")
    need = sum(v.numel() * (4 if v.dim() == 1 or kind == "F32" else 2) for v in state.values())
    with files.writing(out, need=need, cleanup=[tmp], what=f"the GGUF file {out}", fix="free disk space and rerun"):
        files.refuse_link(out)
        files.remove_quietly(tmp)  # a leftover of a killed export (or a link planted there): the writer opens it anew
        writer = gguf.GGUFWriter(tmp, ARCHITECTURES[config.model_type])
        writer.add_name(name or out.stem)
        writer.add_context_length(config.max_position_embeddings)
        writer.add_embedding_length(config.hidden_size)
        writer.add_block_count(config.num_hidden_layers)
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_kv)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(theta)
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)
        writer.add_vocab_size(config.vocab_size)
        writer.add_file_type({"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                              "BF16": gguf.LlamaFileType.MOSTLY_BF16}[kind])
        tokens, types, merges = _vocabulary(tok, data, config.vocab_size)
        pre = pre_tokenizer_name(data)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        for key, value in (("bos", tok.bos_token_id), ("eos", tok.eos_token_id), ("pad", tok.pad_token_id),
                           ("unk", tok.unk_token_id)):
            if value is not None:
                getattr(writer, f"add_{key}_token_id")(int(value))
        writer.add_add_bos_token(bool(getattr(tok, "add_bos_token", False)))
        if getattr(tok, "chat_template", None):
            writer.add_chat_template(tok.chat_template)
        for hf_name, tensor in state.items():
            gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                raise ModelError(f"no GGUF name for tensor {hf_name}", where="--out", fix=FIX)
            if hf_name.endswith("q_proj.weight"):
                tensor = _permute(tensor, n_head)
            elif hf_name.endswith("k_proj.weight"):
                tensor = _permute(tensor, n_kv)
            array, raw = _array(tensor, "F32" if tensor.dim() == 1 else kind)
            writer.add_tensor(gguf_name, array, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        files.replace(tmp, out)
    return {"architecture": ARCHITECTURES[config.model_type], "type": kind, "pre": pre, "tensors": len(state),
            "bytes": out.stat().st_size}
