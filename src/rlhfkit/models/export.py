"""Export: one full, merged model directory any tool can load, verified by reloading it.

``export_model(src, out)`` finds the model in ``src``:

* a **LoRA run** (``src/adapter/adapter_config.json``) or a bare **adapter directory** (``adapter_config.json``):
  the base model (``--base``, else the run's ``config.yaml`` ``model.name``, else the adapter's
  ``base_model_name_or_path``) gets the adapter applied, and the adapter is merged into its weights;
* a **model / run directory** (``src/config.json``): the final model a stage wrote at the run's root.

It then saves a full model directory (safetensors, config, tokenizer with its chat template, generation config)
with :func:`~rlhfkit.models.loading.save_model`, RELOADS it with plain ``AutoModelForCausalLM`` (or
``AutoModelForSequenceClassification`` for reward models, told apart by ``config.architectures``) and checks that
the logits on a probe conversation match the source's (the unmerged base + adapter for LoRA) within a tolerance,
and that the reloaded tokenizer renders and tokenises the probe identically.
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

    if loc.tokenizer_dir is not None:
        return load_tokenizer(str(loc.tokenizer_dir))
    from ..config import ModelConfig

    return load_tokenizer_for(ModelConfig(name=loc.base, gguf_file=loc.base_gguf))


def _load_full(model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from .loading import _from_pretrained

    config = _read_json(model_dir / "config.json")
    cls = AutoModelForSequenceClassification if is_sequence_classifier(config) else AutoModelForCausalLM
    model = _from_pretrained(cls, str(model_dir), "auto")
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


def export_model(src: str | Path, out: str | Path, *, base: str | None = None,
                 log: Callable[[str], None] | None = print) -> Path:
    """Write ``src``'s model (LoRA merged) to ``out`` as a full model directory, reload it with plain
    ``transformers`` and verify logits and tokenizer against the source. Returns ``out``."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from .loading import save_model

    say = log or (lambda _text: None)
    out = Path(out).expanduser()
    srcp = Path(src).expanduser()
    if srcp.exists() and out.exists() and out.resolve() == srcp.resolve():
        raise ConfigError("--out is the source directory", where="--out",
                          fix="export to a new directory, e.g. --out exported/")
    if out.is_file():
        raise ConfigError(f"{out} is a file", where="--out", fix="give a directory path")
    loc = locate(src, base)

    # 1. the source model and its probe logits
    tok = _load_tokenizer(loc)
    text, inputs = probe_inputs(tok)
    if loc.kind == "lora":
        source = _load_lora(loc, tok)
        say(f"[export] {src}: LoRA adapter {loc.adapter_dir} on base {loc.base}; merging")
    else:
        source = _load_full(loc.model_dir)
        say(f"[export] {src}: full model {type(source).__name__} from {loc.model_dir}")
    dtype = _dtype_of(source)
    ref_logits = _logits(source, inputs)
    merged = source.merge_and_unload() if loc.kind == "lora" else source

    # 2. save a full model directory (tokenizer and chat template included)
    save_model(merged, tok, out)
    say(f"[export] wrote {out} ({dtype}, {sum(p.numel() for p in merged.parameters()) / 1e6:.2f}M parameters)")

    # 3. reload with plain transformers and compare
    config = _read_json(out / "config.json")
    reward = is_sequence_classifier(config)
    cls = AutoModelForSequenceClassification if reward else AutoModelForCausalLM
    reloaded = cls.from_pretrained(str(out), dtype=dtype, local_files_only=True)
    reloaded.eval()
    check = compare(ref_logits, _logits(reloaded, inputs), dtype)
    tok2 = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    text2 = tok2.apply_chat_template(PROBE, tokenize=False)
    ids2 = tok2(text2, add_special_tokens=False)["input_ids"]
    tok_ok = text2 == text and list(ids2) == inputs["input_ids"][0].tolist()
    what = "base + adapter (unmerged)" if loc.kind == "lora" else "the source model"
    if not check["ok"]:
        raise ModelError(
            f"the exported model does not reproduce {what}: max |logit difference| {check['max_abs_diff']:.3g} > "
            f"tolerance {check['tolerance']:.3g}", where=str(out),
            fix="report this with the model's architecture; the export is not safe to use",
        )
    if not tok_ok:
        raise ModelError("the exported tokenizer renders or tokenises the chat template differently", where=str(out),
                         fix="report this with the tokenizer's name; the export is not safe to use")
    say(f"[export] verified: reloaded with {cls.__name__}; logits on a {inputs['input_ids'].shape[1]}-token probe "
        f"match {what} (max |diff| {check['max_abs_diff']:.2e} <= {check['tolerance']:.1e}); "
        "tokenizer + chat template reproduce the same ids")
    if loc.kind == "lora" and loc.model_dir is not None:
        saved = _load_full(loc.model_dir)
        again = compare(ref_logits, _logits(saved, inputs), dtype)
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
