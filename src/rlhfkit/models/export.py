"""Export: one full, merged model directory any tool can load, verified by reloading it.

``export_model(src, out)`` finds the model in ``src``:

* a **LoRA run** (``src/adapter/adapter_config.json``) or a bare **adapter directory** (``adapter_config.json``):
  the base model (``--base``, else the run's ``config.yaml`` ``model.name``, else the adapter's
  ``base_model_name_or_path``) gets the adapter applied, and the adapter is merged into its weights;
* a **model / run directory** (``src/config.json``): the final model a stage wrote at the run's root.

It then saves a full model directory (safetensors, config, tokenizer with its chat template, generation config;
a vision-language model's processor and vision tower with it) with :func:`~rlhfkit.models.loading.save_model`,
RELOADS it with plain ``AutoModelForCausalLM`` (``AutoModelForImageTextToText`` for a VLM, whose probe then holds an
image; ``AutoModelForSequenceClassification`` for reward models, told apart by ``config.architectures``) and checks that
the logits on a probe conversation match the weights written (within the tolerance of their dtype; in the source's
dtype they must match the source too: a LoRA merge is checked against the unmerged base + adapter), and that the
reloaded tokenizer renders and tokenises the probe identically. How far the written dtype moved the logits from
the source's float32 weights (the unmerged base + adapter for LoRA) is printed beside.

**Dtype** (:func:`own_dtype`): the model's own by default, the dtype its first model was published in, followed
through the chain of runs (a run's ``config.yaml`` names the model it started from: a PPO run of an SFT run of
SmolLM2 is bfloat16 as SmolLM2 is), since rlhfkit trains float32 master weights and its run directories say float32:
a 7B model is then 14 GB, not 28. ``model.dtype`` set in a run wins; ``dtype="float32"`` keeps the trained weights
bit for bit. A quantized GGUF base (Q4_1, ...) has no float dtype of its own: bfloat16.

**GGUF** (``out`` ending in ``.gguf``): one file llama.cpp loads, written by :mod:`.gguf_write` (Llama-family models
with byte-level BPE tokenizers; the rest is refused in one line naming llama.cpp's converter), then RELOADED with
rlhfkit's own GGUF loader (the dequantising conversion every ``model.name=file.gguf`` run uses, into a temporary
directory) and checked the same way: logits against the weights written, and the probe's token ids.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config.checks import refuse_pickle
from ..errors import ConfigError, ModelError

PROBE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "shout: zebra. Then count to five, please!"},
    {"role": "assistant", "content": "ZEBRA. 1, 2, 3, 4, 5."},
]

# (atol, rtol) of |logits_reloaded - logits_source| <= atol + rtol * max|logits_source|, per dtype
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (1e-2, 2e-2), torch.float16: (1e-2, 1e-2)}


@dataclass
class Located:
    """Where the model of an export source is: a full model directory, or a LoRA adapter on a base."""

    kind: str  # "full" | "lora"
    model_dir: Path | None = None  # full: the model directory; lora: the run root holding a merged copy, if any
    adapter_dir: Path | None = None
    base: str | None = None
    base_seed: int = 0  # a tiny base is rebuilt from its seed (the run's train.seed)
    base_dtype: str = "auto"
    base_gguf: str | None = None
    tokenizer_dir: Path | None = None
    task_type: str = "CAUSAL_LM"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        raise ModelError("invalid JSON", where=str(path), fix="restore the file the stage wrote") from None


def _run_config(run_dir: Path) -> dict:
    """The ``config.yaml`` a training run saved (``{}`` when there is none)."""
    import yaml

    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return {}


def _seed_of(run_cfg: dict, run_dir: Path | None) -> int:
    """The run's ``train.seed`` (it builds a ``tiny:`` base's weights): an integer, or one line naming the key (a
    hand-edited ``.inf`` or text was an OverflowError / ValueError traceback)."""
    seed = (run_cfg.get("train") or {}).get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        where = f"{run_dir / 'config.yaml'}: train.seed" if run_dir is not None else "train.seed"
        raise ModelError(f"the run's train.seed is {seed!r}, not an integer", where=where,
                         fix="restore the integer rlhfkit wrote there, or give the base model with --base MODEL")
    return seed


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _declared_dtype(config: dict) -> torch.dtype | None:
    """The dtype a ``config.json`` declares (``dtype`` in transformers 5, ``torch_dtype`` before)."""
    name = config.get("dtype") or config.get("torch_dtype")
    return _DTYPES.get(str(name).removeprefix("torch.")) if name else None


def _gguf_dtype(path: Path) -> tuple[torch.dtype, str]:
    try:
        from gguf import GGMLQuantizationType, GGUFReader

        kinds = {t.tensor_type for t in GGUFReader(str(path)).tensors if len(t.shape) > 1}
    except (ImportError, OSError, ValueError):
        return torch.bfloat16, f"{path.name}: its type unread"
    if kinds == {GGMLQuantizationType.F32}:
        return torch.float32, f"{path.name}: F32"
    if kinds == {GGMLQuantizationType.F16}:
        return torch.float16, f"{path.name}: F16"
    if kinds == {GGMLQuantizationType.BF16}:
        return torch.bfloat16, f"{path.name}: BF16"
    return torch.bfloat16, f"{path.name}: quantized, no float dtype of its own"


def own_dtype(src: str | Path, loc: Located, depth: int = 0) -> tuple[torch.dtype, str]:
    """(the dtype a model is published in, where that was read): a run's ``model.dtype`` when set, else the model
    it started from (its ``config.yaml``'s ``model.name``, followed through earlier runs), else the source's own
    ``config.json``; a ``tiny`` model is float32."""
    root = Path(src).expanduser()
    run_dir = root if (root / "config.yaml").is_file() else (loc.adapter_dir.parent if loc.adapter_dir is not None
                                                             and (loc.adapter_dir.parent / "config.yaml").is_file()
                                                             else None)
    model_cfg = (_run_config(run_dir).get("model") or {}) if run_dir is not None else {}
    if str(model_cfg.get("dtype")) in _DTYPES:
        return _DTYPES[model_cfg["dtype"]], f"model.dtype of {run_dir / 'config.yaml'}"
    origin = loc.base if loc.kind == "lora" else model_cfg.get("name")
    if origin and depth < 8:
        if str(origin) == "tiny" or str(origin).startswith("tiny:"):
            return torch.float32, "the built-in tiny model"
        path = Path(str(origin)).expanduser()
        gguf_file = model_cfg.get("gguf_file") if loc.kind != "lora" else loc.base_gguf
        if path.suffix == ".gguf" or gguf_file:
            return _gguf_dtype(path if path.suffix == ".gguf" else path / str(gguf_file))
        if (path / "config.yaml").is_file() or (path / "adapter_config.json").is_file():
            try:
                return own_dtype(path, locate(path), depth + 1)
            except ModelError:
                pass
        declared = _declared_dtype(_read_json(path / "config.json")) if path.is_dir() else None
        if declared is None and not path.exists():  # a hub name: its cached config.json
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(str(origin), "config.json")
            declared = _declared_dtype(_read_json(Path(cached))) if isinstance(cached, str) else None
        if declared is not None:
            return declared, f"config.json of {origin}"
    declared = _declared_dtype(_read_json(loc.model_dir / "config.json")) if loc.model_dir is not None else None
    if declared is not None:
        return declared, f"config.json of {loc.model_dir}"
    return torch.float32, "no dtype declared"


def is_sequence_classifier(config: dict) -> bool:
    return any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])


def locate(src: str | Path, base: str | None = None) -> Located:
    """Find the model of ``src`` (module docstring); raises :class:`ModelError` naming what is missing."""
    root = Path(src).expanduser()
    if not root.exists():
        raise ModelError(f"no such model or run directory: {src}", where=str(src),
                         fix="give a run directory, a model directory or a LoRA adapter directory")
    if not root.is_dir():
        refuse_pickle(str(src), where=str(src))  # a pickled weights file: refused with why
        raise ModelError(f"{src} is a file, not a model directory", where=str(src),
                         fix="give the directory that holds config.json (or adapter_config.json)")
    if (root / "adapter_config.json").is_file():
        adapter_dir, run_dir = root, (root.parent if (root.parent / "config.yaml").is_file() else None)
    elif (root / "adapter" / "adapter_config.json").is_file():
        adapter_dir, run_dir = root / "adapter", root
    else:
        if not (root / "config.json").is_file():
            raise ModelError(f"{src} holds no model (no config.json, no adapter_config.json, no adapter/)",
                             where=str(src), fix="point at the run directory a stage wrote, or at a model directory")
        return Located(kind="full", model_dir=root, tokenizer_dir=root)

    adapter_cfg = _read_json(adapter_dir / "adapter_config.json")
    run_cfg = _run_config(run_dir) if run_dir is not None else {}
    model_cfg = run_cfg.get("model") or {}
    base_name = base or model_cfg.get("name") or adapter_cfg.get("base_model_name_or_path")
    merged_copy = run_dir if run_dir is not None and (run_dir / "config.json").is_file() else None
    if not base_name:
        if merged_copy is not None:  # no base known, but the run saved its merged model: export that
            return Located(kind="full", model_dir=merged_copy, tokenizer_dir=merged_copy)
        raise ModelError(f"the adapter in {adapter_dir} does not name its base model", where=str(src),
                         fix="give the base with --base MODEL")
    tok_dir = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else merged_copy
    return Located(
        kind="lora", model_dir=merged_copy, adapter_dir=adapter_dir, base=str(base_name),
        base_seed=_seed_of(run_cfg, run_dir) if not base else 0,
        base_dtype=str(model_cfg.get("dtype") or "auto"), base_gguf=model_cfg.get("gguf_file") if not base else None,
        tokenizer_dir=tok_dir, task_type=str(adapter_cfg.get("task_type") or "CAUSAL_LM"),
    )


def _load_tokenizer(loc: Located):
    from .loading import load_tokenizer_for
    from .tokenizer import load_tokenizer
    from .vision import vlm_type

    if loc.tokenizer_dir is not None:
        if vlm_type(str(loc.tokenizer_dir)):  # with its processor (the image probe, the export's files)
            from ..config import ModelConfig

            return load_tokenizer_for(ModelConfig(name=str(loc.tokenizer_dir)))
        return load_tokenizer(str(loc.tokenizer_dir))
    from ..config import ModelConfig

    return load_tokenizer_for(ModelConfig(name=loc.base, gguf_file=loc.base_gguf))


def _auto_class(config: dict):
    """The transformers class a directory of ``config`` reloads with (reward model, VLM or causal LM)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSequenceClassification

    if is_sequence_classifier(config):
        return AutoModelForSequenceClassification
    return AutoModelForImageTextToText if isinstance(config.get("vision_config"), dict) else AutoModelForCausalLM


def _load_full(model_dir: Path):
    from .loading import _from_pretrained

    model = _from_pretrained(_auto_class(_read_json(model_dir / "config.json")), str(model_dir), "auto")
    model.eval()
    return model


def _load_lora(loc: Located, tok):
    """The base with the adapter applied, NOT merged (the reference the merged export is checked against)."""
    from peft import PeftModel

    from ..config import ModelConfig
    from .loading import load_causal_lm, load_scalar_model

    mcfg = ModelConfig(name=loc.base, gguf_file=loc.base_gguf, dtype=loc.base_dtype)
    try:
        if loc.task_type == "SEQ_CLS":
            base = load_scalar_model(loc.base, mcfg, tokenizer=tok, device="cpu", seed=loc.base_seed,
                                     trainable=False)
        else:
            base, _ = load_causal_lm(mcfg, tokenizer=tok, device="cpu", seed=loc.base_seed, trainable=False)
    except ModelError as err:
        raise ModelError(f"cannot load the adapter's base model {loc.base!r}: {err.message}", where="--base",
                         fix="give the base model with --base MODEL") from None
    try:
        with warnings.catch_warnings():  # peft calls a transformers API deprecated in v5 (FutureWarning)
            warnings.simplefilter("ignore", FutureWarning)
            model = PeftModel.from_pretrained(base, str(loc.adapter_dir), is_trainable=False)
    except (OSError, ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"the adapter in {loc.adapter_dir} does not fit the base {loc.base!r}: {first}",
                         where="--base", fix="give the base model the adapter was trained on with --base") from None
    model.eval()
    return model


def probe_inputs(tok) -> tuple[str, dict]:
    """The probe conversation rendered by the chat template (text) and tokenised (batch of one)."""
    from ..data.chat import render_chat

    text = render_chat(tok, PROBE, add_generation_prompt=False)
    enc = tok(text, return_tensors="pt", add_special_tokens=False)
    return text, {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def image_probe(tok) -> dict | None:
    """A vision-language model's probe: the probe conversation with an image (a fixed 48 x 40 colour gradient) in
    its user turn, through the processor (ids, pixels and the family's inputs); None for a text model."""
    import numpy as np
    from PIL import Image

    from ..data.media import processor_of

    processor = processor_of(tok)
    if processor is None:
        return None
    from ..data.chat import render_chat

    y, x = np.mgrid[0:40, 0:48]
    image = Image.fromarray(np.stack([x * 5, y * 6, (x + y) * 3], -1).astype("uint8"))
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROBE[1]["content"]}]}
    messages = [PROBE[0], user, PROBE[2]]
    out = processor(text=[render_chat(tok, messages, add_generation_prompt=False)], images=[[image]],
                    return_tensors="pt", add_special_tokens=False)
    return {k: v for k, v in out.items() if hasattr(v, "shape")}


@torch.no_grad()
def _logits(model, inputs: dict) -> torch.Tensor:
    return model(**inputs, use_cache=False).logits.float()


def _dtype_of(model) -> torch.dtype:
    return next(model.parameters()).dtype


def compare(reference: torch.Tensor, other: torch.Tensor, dtype: torch.dtype) -> dict:
    """Max absolute difference of two logit tensors, the tolerance for ``dtype`` and whether it holds."""
    if reference.shape != other.shape:
        return {"max_abs_diff": float("inf"), "tolerance": 0.0, "ok": False}
    atol, rtol = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    diff = float((reference - other).abs().max())
    tol = atol + rtol * float(reference.abs().max())
    return {"max_abs_diff": diff, "tolerance": tol, "ok": diff <= tol}


def export_model(src: str | Path, out: str | Path, *, base: str | None = None, dtype: str = "auto",
                 log: Callable[[str], None] | None = print) -> Path:
    """Write ``src``'s model (LoRA merged) to ``out`` (a model directory, or a GGUF file when ``out`` ends in
    ``.gguf``) in ``dtype`` (``auto``: the model's own, :func:`own_dtype`), reload it and verify logits and
    tokenizer against the weights written. Returns ``out``."""
    say = log or (lambda _text: None)
    out = Path(out).expanduser()
    srcp = Path(src).expanduser()
    if srcp.exists() and out.exists() and out.resolve() == srcp.resolve():
        raise ConfigError("--out is the source directory", where="--out",
                          fix="export to a new directory, e.g. --out exported/")
    gguf_out = out.suffix.lower() == ".gguf"
    if out.is_file() and not gguf_out:
        raise ConfigError(f"{out} is a file", where="--out", fix="give a directory path (or a .gguf file name)")
    if gguf_out and out.is_dir():
        raise ConfigError(f"{out} is a directory", where="--out", fix="give a new .gguf file name")
    if out.is_symlink() or (out.is_dir() and any(out.iterdir())) or (gguf_out and out.exists()):
        # an export writes only into a new (or empty) directory, never over what is there (a model, a run)
        held = sorted(p.name for p in out.iterdir())[:3] if out.is_dir() and not out.is_symlink() else []
        raise ConfigError(f"{out} already exists" + (f" and holds files ({', '.join(held)}, ...)" if held else "")
                          + ": an export never writes over it", where="--out",
                          fix="give a new path (or an empty directory), or remove it first")
    if dtype != "auto" and dtype not in _DTYPES:
        raise ConfigError(f"--dtype {dtype!r} is not one of auto, {', '.join(_DTYPES)}", where="--dtype",
                          fix="use --dtype auto (the model's own), float32, bfloat16 or float16")
    if gguf_out:
        from .gguf_write import DTYPES  # noqa: F401 - the gguf package: named before anything loads
        try:
            import gguf  # noqa: F401
        except ImportError:
            raise ConfigError("writing GGUF needs the `gguf` package", where="--out",
                              fix="pip install 'rlhfkit[gguf]'") from None
    loc = locate(src, base)
    target, why = (_DTYPES[dtype], "--dtype") if dtype != "auto" else own_dtype(src, loc)

    # 1. the source model and its probe logits
    tok = _load_tokenizer(loc)
    text, inputs = probe_inputs(tok)
    ids = inputs["input_ids"][0].tolist()  # the text probe's ids: the reloaded tokenizer must give them
    inputs = image_probe(tok) or inputs  # a VLM: logits with an image, through its vision tower
    if loc.kind == "lora":
        source = _load_lora(loc, tok)
        say(f"[export] {src}: LoRA adapter {loc.adapter_dir} on base {loc.base}; merging")
    else:
        source = _load_full(loc.model_dir)
        say(f"[export] {src}: full model {type(source).__name__} from {loc.model_dir}")
    src_dtype = _dtype_of(source)
    ref_logits = _logits(source, inputs)
    merged = source.merge_and_unload() if loc.kind == "lora" else source
    if gguf_out:
        from .gguf_write import check_writable

        if image_probe(tok) is not None:
            raise ConfigError("GGUF export of a vision-language model is not built (llama.cpp keeps the vision tower "
                              "in a separate mmproj file)", where="--out", fix="export to a model directory")
        check_writable(merged, tok)  # before the cast and the write: one line for what GGUF cannot hold
    for param in merged.parameters():  # the parameters only: buffers (rotary inv_freq) stay as a reload makes them
        param.data = param.data.to(target)
    written_logits = _logits(merged, inputs)  # the weights as written: what the reload must reproduce
    drift = compare(ref_logits, written_logits, target)
    note = "" if target == src_dtype else (
        f"; logits {drift['max_abs_diff']:.2e} from the {str(src_dtype).removeprefix('torch.')} weights at most")
    what = "base + adapter (unmerged)" if loc.kind == "lora" else "the source model"
    if target == src_dtype and not drift["ok"]:  # the merge itself (LoRA) must reproduce the unmerged model
        raise ModelError(f"the merged model does not reproduce {what}: max |logit difference| "
                         f"{drift['max_abs_diff']:.3g} > tolerance {drift['tolerance']:.3g}", where=str(out),
                         fix="report this with the model's architecture; the export is not safe to use")
    same = f", as {what} does (max |diff| {drift['max_abs_diff']:.2e})" if target == src_dtype else ""
    if not torch.isfinite(written_logits).all():  # float16 overflows past 65504: the model is broken, not rounded
        raise ModelError(f"in {str(target).removeprefix('torch.')} the model's logits are not finite (a weight or an "
                         "activation past the dtype's range)", where=str(out),
                         fix="export with --dtype bfloat16 or --dtype float32")
    other = "" if dtype != "auto" or target == torch.float32 else "; --dtype float32 for full precision"
    dtype_text = f"{str(target).removeprefix('torch.')} ({why}{other})"
    if gguf_out:
        _export_gguf(merged, tok, out, target, inputs, written_logits, text, say, dtype_text + note, same, ids)
    else:
        _export_dir(merged, tok, out, target, inputs, written_logits, text, say, dtype_text + note, same, ids)
    if loc.kind == "lora" and loc.model_dir is not None:
        saved = _load_full(loc.model_dir)
        again = compare(ref_logits, _logits(saved, inputs), src_dtype)
        if not again["ok"] and base is None:
            raise ModelError(
                f"base {loc.base!r} + the adapter does not reproduce the run's merged model at {loc.model_dir} "
                f"(max |logit difference| {again['max_abs_diff']:.3g}); the base may have changed since training",
                where=str(src), fix="give the exact base model with --base, or export the merged model directly",
            )
        say(f"[export] the run's own merged model at {loc.model_dir} "
            + (f"agrees (max |diff| {again['max_abs_diff']:.2e})" if again["ok"]
               else f"differs from --base + adapter (max |diff| {again['max_abs_diff']:.3g}), as expected "
                    "for another base"))
    return out


def _export_dir(merged, tok, out: Path, dtype, inputs, logits, text, say, dtype_text: str, same: str,
                ids: list[int]) -> None:
    """2-3 for a model directory: save, reload with plain transformers in ``dtype``, compare."""
    from transformers import AutoTokenizer

    from .loading import save_model

    save_model(merged, tok, out)
    say(f"[export] wrote {out} in {dtype_text}, {sum(p.numel() for p in merged.parameters()) / 1e6:.2f}M parameters")
    cls = _auto_class(_read_json(out / "config.json"))
    reloaded = cls.from_pretrained(str(out), dtype=dtype, local_files_only=True)
    reloaded.eval()
    check = compare(logits, _logits(reloaded, inputs), dtype)
    tok2 = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    text2 = tok2.apply_chat_template(PROBE, tokenize=False)
    ids2 = tok2(text2, add_special_tokens=False)["input_ids"]
    tok_ok = text2 == text and list(ids2) == ids
    _verdict(check, tok_ok, out)
    image = " (with an image, through the vision tower written with it)" if "pixel_values" in inputs else ""
    say(f"[export] verified: reloaded with {cls.__name__}; logits on a {inputs['input_ids'].shape[1]}-token probe"
        f"{image} match the weights written (max |diff| {check['max_abs_diff']:.2e} <= {check['tolerance']:.1e})"
        f"{same}; tokenizer + chat template reproduce the same ids")


def _export_gguf(merged, tok, out: Path, dtype, inputs, logits, text, say, dtype_text: str, same: str,
                 ids: list[int]) -> None:
    """2-3 for a GGUF file: write it, convert it back with rlhfkit's GGUF loader into a temporary directory, load
    that (float32, as every GGUF run loads), compare with the weights written."""
    import tempfile

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .gguf_write import write_gguf
    from .loading import _convert_gguf

    info = write_gguf(merged, tok, out, dtype)
    pre = "" if info["pre"] != "default" else (" (its split rule is not one llama.cpp names: written as 'default', "
                                               "llama.cpp then splits text as GPT-2 does)")
    say(f"[export] wrote {out}: GGUF {info['architecture']}, {info['type']} tensors in {dtype_text}, "
        f"{info['bytes'] / 1e6:.1f} MB, tokenizer gpt2 / pre {info['pre']}{pre}")
    with tempfile.TemporaryDirectory(prefix="rlhfkit-gguf-check-", dir=out.parent) as tmp:
        back = Path(tmp) / "model"
        _convert_gguf(out, back)
        reloaded = AutoModelForCausalLM.from_pretrained(str(back), dtype=torch.float32, local_files_only=True)
        reloaded.eval()
        exact = _logits(merged.float(), inputs)  # the written values, computed as the reload computes them
        check = compare(exact, _logits(reloaded, inputs), torch.float32)
        tok2 = AutoTokenizer.from_pretrained(str(back), local_files_only=True)
        ids2 = tok2(text, add_special_tokens=False)["input_ids"]
        tok_ok = list(ids2) == ids and bool(getattr(tok2, "chat_template", None))
    _verdict(check, tok_ok, out)
    say(f"[export] verified: {out.name} reloaded with rlhfkit's GGUF loader (model.name={out}); logits on a "
        f"{inputs['input_ids'].shape[1]}-token probe match the weights written (max |diff| "
        f"{check['max_abs_diff']:.2e} <= {check['tolerance']:.1e}){same}; its tokenizer gives the same ids and keeps "
        "the chat template")


def _verdict(check: dict, tok_ok: bool, out: Path) -> None:
    if not check["ok"]:
        raise ModelError(
            f"the exported model does not reproduce the weights written: max |logit difference| "
            f"{check['max_abs_diff']:.3g} > tolerance {check['tolerance']:.3g}", where=str(out),
            fix="report this with the model's architecture; the export is not safe to use",
        )
    if not tok_ok:
        raise ModelError("the exported tokenizer renders or tokenises the chat template differently", where=str(out),
                         fix="report this with the tokenizer's name; the export is not safe to use")
