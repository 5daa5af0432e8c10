"""Models with random weights in published shapes, for the benchmarks against TRL (``vs_trl.py``, ``gpu_suite.py``,
``real_shapes.py``): a model directory both frameworks load the same way (config.json, generation_config.json,
tokenizer files, safetensors), made once per (shape, rigged mean length, size) in a working directory.

``bench/shapes/NAME`` holds the config.json and generation_config.json of Qwen3-0.6B, Llama-3.2-1B and Qwen3-1.7B as
published; a shape without tokenizer files gets :func:`synthetic_tokenizer`; ``tiny`` shrinks a shape
(:func:`tiny_config`) so the same family's code path runs in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 1024}


def tiny_config(config: dict, generation: dict | None) -> tuple[dict, dict | None]:
    """``config`` (and its generation config) at a tiny size: :data:`TINY`'s sizes (head_dim 16 where the config
    names one), the family, RoPE and other options kept; the special token ids (BOS, EOS, pad) renumbered 1, 2, ...
    in the order they appear, so that they fit the small vocabulary."""
    special: dict[int, int] = {}

    def remap(v):
        if isinstance(v, list):
            return [remap(x) for x in v]
        if isinstance(v, int) and v >= TINY["vocab_size"]:
            return special.setdefault(v, len(special) + 1)
        return v

    out = {**config, **TINY, **({"head_dim": 16} if config.get("head_dim") else {})}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if out.get(key) is not None:
            out[key] = remap(out[key])
    gen = None
    if generation is not None:
        gen = {k: remap(v) if k.endswith("token_id") else v for k, v in generation.items()}
    return out, gen


def random_model(shape: Path, workdir: Path, mean_len: int | None = None, tiny: bool = False,
                 chain: int | None = None) -> Path:
    """A model directory with ``shape``'s config and tokenizer files (or a synthetic tokenizer) and random weights
    (seed 0), rigged to answer at lengths ~ Geometric(1 / ``mean_len``) when given; ``chain`` (a number of levels,
    the longest answer): rigged instead by ``_common.rig_chain``, so that a prompt sets its answer's length (the
    levels' token ids in ``levels.json``; the synthetic tokenizer's chat template then ends the prompt with the last
    word of the last message, see :func:`synthetic_tokenizer`); ``tiny``: shrunk first. Made once per (shape, rig,
    size) in ``workdir`` (reused by a later run given the same ``--work``)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not (shape / "config.json").is_file():
        raise SystemExit(f"vs_trl: --shape {shape}: no config.json there (it needs config.json and the tokenizer)")
    if chain and (shape / "tokenizer_config.json").is_file():
        raise SystemExit(f"vs_trl: --shape {shape}: lengths set by the prompt need the synthetic tokenizer (this "
                         "shape has its own): use --lengths random")
    rig = f"-chain{chain}" if chain else f"-mean{mean_len}" if mean_len else ""
    out = workdir / f"{shape.name}-random{rig}{'-tiny' if tiny else ''}"
    if (out / "config.json").is_file():
        return out
    if tiny:  # the shrunk config and generation config, written where AutoConfig reads them
        small = workdir / f"{shape.name}-tiny-shape"
        small.mkdir(parents=True, exist_ok=True)
        gen_path = shape / "generation_config.json"
        cfg, gen = tiny_config(json.loads((shape / "config.json").read_text()),
                               json.loads(gen_path.read_text()) if gen_path.is_file() else None)
        (small / "config.json").write_text(json.dumps(cfg))
        if gen is not None:
            (small / "generation_config.json").write_text(json.dumps(gen))
        shape = small
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(shape)
    model = AutoModelForCausalLM.from_config(config)
    tok = AutoTokenizer.from_pretrained(shape) if (shape / "tokenizer_config.json").is_file() else \
        synthetic_tokenizer(config, echo_last=bool(chain))
    eos = list(config.eos_token_id) if isinstance(config.eos_token_id, list) else [config.eos_token_id]  # a copy:
    # the chain rig adds the generation config's ids to it, which must not change the config saved beside the weights
    levels = None
    if chain:
        from _common import rig_chain

        gen_path = shape / "generation_config.json"
        gen_eos = json.loads(gen_path.read_text()).get("eos_token_id") if gen_path.is_file() else None
        eos += [i for i in (gen_eos if isinstance(gen_eos, list) else [gen_eos]) if i is not None and i not in eos]
        keep = tuple(i for i in (*tok.all_special_ids, config.bos_token_id, getattr(config, "pad_token_id", None))
                     if i is not None)
        levels = rig_chain(model, chain, tuple(eos), keep=keep)
    elif mean_len:
        from _common import rig_lengths

        keep = tuple(i for i in (tok.pad_token_id, tok.bos_token_id, config.bos_token_id) if i is not None)
        rig_lengths(model, mean_len, eos[0], keep=keep)
    partial = out.with_name(out.name + ".partial")  # a run stopped while saving leaves no half model to reuse
    model.save_pretrained(partial)
    tok.save_pretrained(partial)
    if levels is not None:
        (partial / "levels.json").write_text(json.dumps(levels))
    for name in ("generation_config.json", "chat_template.jinja"):  # the model's own, where the shape has them
        if (shape / name).is_file():
            shutil.copy(shape / name, partial / name)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def synthetic_tokenizer(config, echo_last: bool = False):
    """A word-level tokenizer with the config's vocabulary size (``t<i>`` for id i), its EOS / BOS / pad at the
    config's ids, a turn marker and a chat template (``<start> role content <eos>``): random weights need no real
    tokenizer, only the vocabulary size and the special ids, and both frameworks read the same files. ``echo_last``:
    the generation prompt (``<start> assistant``) is followed by the last word of the last message, so that the
    prompt's last token is one the data chose (``rig_chain``'s level: the answer's length)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    V = config.vocab_size
    eos = config.eos_token_id if isinstance(config.eos_token_id, int) else config.eos_token_id[0]
    bos = config.bos_token_id if config.bos_token_id is not None else eos
    names = {eos: "<eos>", bos: "<bos>"}
    free = (i for i in range(V) if i not in names)
    for name in ("<unk>", "<pad>", "<start>"):
        names[next(free)] = name
    vocab = {names.get(i, f"t{i}"): i for i in range(V)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    pad = getattr(config, "pad_token_id", None)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>", bos_token="<bos>",
                                  pad_token=names.get(pad, "<pad>") if pad is not None else "<pad>",
                                  additional_special_tokens=["<start>"])
    tok.chat_template = ("{% for m in messages %}<start> {{ m['role'] }} {{ m['content'] }} <eos> {% endfor %}"
                         "{% if add_generation_prompt %}<start> assistant "
                         + ("{{ messages[-1]['content'].split()[-1] }} " if echo_last else "") + "{% endif %}")
    return tok
