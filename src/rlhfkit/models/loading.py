"""Loading and saving models.

Sources (``model.name``): a Hugging Face model directory (what every rlhfkit stage writes), a hub name found in the
local cache (no download at run time), a ``.gguf`` file (dequantised once and cached as safetensors under
``~/.cache/rlhfkit/gguf``), or ``tiny[:key=value,...]`` — a small Llama (``arch=qwen3`` / ``gemma3``: of that family)
built from config over the shipped character-level tokenizer.

Every model directory rlhfkit writes is a full, merged model (``model.safetensors`` + ``config.json`` + tokenizer
with its chat template + ``generation_config.json``), loadable by ``AutoModelForCausalLM`` or
``AutoModelForSequenceClassification``; with LoRA the adapter is saved beside it in ``adapter/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import re
import shutil
import time
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError

from .. import files
from ..config.checks import check_model_file
from ..data.chat import check_chat_template
from ..errors import ModelError
from ..errors import say as _say
from .tiny import VLM_ARCHS, parse_tiny_spec
from .tiny import tiny_config as _text_tiny_config
from .tokenizer import eos_token_ids, load_tokenizer, prepare_tokenizer
from .vision import family_of, freeze_vision, language_model_name, load_processor, vlm_type

# LoRA target modules per architecture (``model_type``); anything else uses peft's "all-linear".
LORA_TARGETS = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "mistral": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gemma": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gemma2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "gpt_neox": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
}


def tiny_model_config(spec: str, tokenizer):
    """The transformers config of a ``tiny:`` spec: a text model's (``tiny.tiny_config``) or a tiny VLM's
    (``tiny_vlm.tiny_vlm``; dispatched here, as ``tiny_vlm`` imports ``tiny``)."""
    s = parse_tiny_spec(spec)
    if s["arch"] in VLM_ARCHS:
        from .tiny_vlm import tiny_vlm

        return tiny_vlm(s, tokenizer)[0]
    return _text_tiny_config(spec, tokenizer)


def resolve_dtype(name: str, device: torch.device | str | None = None, trainable: bool = False) -> torch.dtype:
    """``auto``: frozen models (reference, reward) in bf16 on CUDA; trained models keep fp32 master weights and
    train under bf16 autocast (``train.mixed_precision=auto``); everything fp32 on CPU."""
    if name == "auto":
        dev = torch.device(device) if device is not None else None
        cuda = (dev is not None and dev.type == "cuda") or (dev is None and torch.cuda.is_available())
        if cuda and torch.cuda.is_bf16_supported() and not trainable:
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def is_tiny(name: str) -> bool:
    return name == "tiny" or name.startswith("tiny:")


_GGUF_SAID: set[Path] = set()  # GGUF conversions this process has named (converted or found in the cache)


def _gguf_cache_dir(gguf_path: Path) -> Path:
    st = gguf_path.stat()
    key = hashlib.sha1(f"{gguf_path.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:12]
    return files.cache_root() / "gguf" / f"{gguf_path.stem}-{key}"


def resolve_source(name: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """Map ``model.name`` (+ ``gguf_file``) to a loadable directory / hub name; GGUF files are converted once."""
    if is_tiny(name):
        return name, None
    check_model_file(name)  # a pickled .bin / .pt (or any non-GGUF file) is refused before anything opens it
    path = Path(name).expanduser()
    gguf_path = None
    if path.suffix == ".gguf":
        gguf_path = path
    elif gguf_file:
        gguf_path = path / gguf_file
    if gguf_path is not None:
        if not gguf_path.is_file():
            raise ModelError(f"GGUF file not found: {gguf_path}", where="model.name", fix="check the path")
        cache = _gguf_cache_dir(gguf_path)
        if not (cache / "config.json").is_file():
            _say(f"[gguf] one-time conversion of {gguf_path}: dequantising its weights to a float32 safetensors model "
                 f"directory in {cache} (about 30 s per 100M parameters; set RLHFKIT_CACHE to cache elsewhere)")
            started = time.time()
            _convert_gguf(gguf_path, cache)
            _say(f"[gguf] converted in {time.time() - started:.0f} s; later runs load {cache} directly "
                 "(delete it to convert again)")
        elif cache not in _GGUF_SAID:  # the tokenizer, the policy, the reference... each resolve it: said once
            _say(f"[gguf] {gguf_path.name}: using the cached conversion in {cache}")
        _GGUF_SAID.add(cache)
        return str(cache), None
    if path.exists():
        if path.is_dir() and not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ModelError(
                f"{path} is not a model directory (no config.json)", where="model.name",
                fix="point to the directory a stage wrote (it has config.json and model.safetensors)",
            )
        return str(path), None
    if name.startswith((".", "/", "~")) or (("/" in name) and Path(name.split("/")[0]).exists()):
        raise ModelError(f"model directory not found: {name}", where="model.name",
                         fix="check the path (a stage's output directory holds config.json and model.safetensors)")
    if "/" in name and name.count("/") == 1:
        # hub-style name (org/model): only the local cache is consulted
        return name, None
    raise ModelError(f"model not found: {name!r}", where="model.name",
                     fix="give a model directory, a cached hub name, a .gguf file or 'tiny'")



def _convert_gguf(gguf_path: Path, out: Path) -> None:
    """Dequantise a GGUF file to a safetensors model directory (about 30 s for a 135M model), atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ModelError("loading GGUF files needs the `gguf` package", where="model.name",
                         fix="pip install 'rlhfkit[gguf]'") from None
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")  # per process: two runs converting at once never clash
    with _no_tqdm_off_a_terminal():
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                     dtype=torch.float32, **_gguf_dequantize_kwargs())
    _drop_gguf_quantizer(model, gguf_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with files.writing(out, need=files.model_nbytes(model), cleanup=[tmp], what="the model converted from GGUF",
                       fix="rerun"):
        files.fresh_dir(tmp)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    try:
        tmp.replace(out)
    except OSError:  # another process finished the same conversion first
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "config.json").is_file():
            raise


@contextlib.contextmanager
def _no_tqdm_off_a_terminal():
    """transformers' GGUF reader draws a tqdm bar of its own (``tqdm.auto``, which transformers' progress-bar switch
    does not reach); off a terminal its ``\\r`` redraws became one 1,700-character line in piped logs. Silenced
    there (rlhfkit's own line says the conversion runs and how long it takes); kept on a terminal."""
    import sys

    if sys.stderr.isatty():
        yield
        return
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - older transformers
        yield
        return
    original = gguf_utils.tqdm
    gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _gguf_dequantize_kwargs() -> dict:
    """Ask transformers for plain dense weights (recent versions otherwise attach a GGUF quantizer that refuses
    ``save_pretrained``, or keep supported architectures' weights packed in GGUF blocks)."""
    try:
        from transformers.utils.quantization_config import GgufConfig
    except ImportError:  # older transformers: GGUF loading always dequantises and attaches no quantizer
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _drop_gguf_quantizer(model, gguf_path: Path) -> None:
    """Detach a leftover GGUF quantizer once every weight is a dense float tensor, so the model saves as safetensors."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None and not getattr(model, "is_quantized", False):
        return
    if any(not p.is_floating_point() for p in model.parameters()):
        raise ModelError(f"{gguf_path.name}: transformers kept the GGUF weights quantized; "
                         "cannot convert to safetensors",
                         where="model.name", fix="upgrade transformers, or convert the file with llama.cpp's tools")
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    else:
        for attr in ("hf_quantizer", "quantization_method"):
            if attr in model.__dict__:
                delattr(model, attr)
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False


def _hub_kwargs() -> dict:
    return {"local_files_only": True} if os.environ.get("HF_HUB_OFFLINE", "1") != "0" else {}


def load_tokenizer_for(mcfg) -> object:
    """The tokenizer of ``mcfg.name`` with its chat template (``model.chat_template`` when set), checked; a
    vision-language model's comes from its processor, which it carries (``tok.rlhfkit_processor``, read by the data
    code; :func:`~.vision.load_processor`)."""
    source, _ = resolve_source(mcfg.name, mcfg.gguf_file)
    processor = load_processor(source) if vlm_type(source) else None
    tok = prepare_tokenizer(processor.tokenizer, name=mcfg.name) if processor is not None else load_tokenizer(source)
    if mcfg.chat_template:
        tpl = Path(mcfg.chat_template).expanduser()
        from_file = tpl.is_file()
        tok.chat_template = tpl.read_text() if from_file else mcfg.chat_template
        origin = str(tpl) if from_file else "model.chat_template"
        if processor is not None:
            processor.chat_template = tok.chat_template
    else:
        origin = _template_origin(source, mcfg.name)
    check_chat_template(tok, origin)  # a broken template is named here, not blamed on the first data line
    return tok


def _template_origin(source: str, name: str) -> str:
    """Where the chat template of model ``source`` was read from, for messages: its file, or the model's name."""
    for file in ("chat_template.jinja", "tokenizer_config.json"):
        if (Path(source) / file).is_file():
            return str(Path(source) / file)
    return f"the chat template of {name}"


def check_safetensors(path: Path) -> None:
    """One line naming ``path`` when a ``.safetensors`` file is truncated or torn: its header must parse and the
    tensors it lists must end exactly at the end of the file (reads the header only)."""
    import json
    import struct

    size = path.stat().st_size
    problem = None
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                problem = f"{size} bytes, no header"
            else:
                (n,) = struct.unpack("<Q", head)
                if n > size - 8:
                    problem = "its header runs past the end of the file"
                else:
                    header = json.loads(f.read(n))
                    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
                    if 8 + n + end != size:
                        problem = f"{size} bytes where its header lists {8 + n + end}"
    except (ValueError, KeyError, TypeError, IndexError):
        problem = "its header is not valid"
    if problem is not None:
        raise ModelError(f"{path} is truncated or damaged ({problem})", where="model.name",
                         fix="copy or save the model again (a stage's output directory is rewritten by rerunning it)")


def _from_pretrained(cls, source: str, dtype: torch.dtype, **kwargs):
    if Path(source).is_dir():
        for weights in sorted(Path(source).glob("*.safetensors")):
            check_safetensors(weights)
    try:
        return cls.from_pretrained(source, dtype=dtype, **_hub_kwargs(), **kwargs)
    except pickle.UnpicklingError as exc:  # a pickled .bin holding more than tensors: weights_only refused it
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        raise ModelError(
            f"the pickled weights in {source} hold more than tensors ({found.group(1) if found else 'an object'}): "
            "refused (rlhfkit reads a .bin only with torch.load(weights_only=True), which runs no code)",
            where="model.name", fix="save the model again as model.safetensors from a copy you trust "
                                    "(model.save_pretrained(DIR, safe_serialization=True))") from None
    except (OSError, ValueError, SafetensorError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot load model from {source!r}: {first}", where="model.name",
                         fix="give a local model directory (or a hub name already in the local cache)") from None


def load_causal_lm(mcfg, *, tokenizer=None, device=None, seed: int = 0, trainable: bool = True):
    """Load the policy (or a reference copy): dtype, gradient checkpointing and LoRA applied per ``mcfg``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    tok = tokenizer or load_tokenizer_for(mcfg)
    dtype = resolve_dtype(mcfg.dtype, device, trainable and not mcfg.lora.enabled)
    source, _ = resolve_source(mcfg.name, mcfg.gguf_file)
    quant = _quantization(mcfg) if trainable else {}
    auto = AutoModelForImageTextToText if vlm_type(source) else AutoModelForCausalLM  # a VLM: its own class
    if is_tiny(source):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = auto.from_config(tiny_model_config(source, tok), dtype=dtype)
    elif (Path(source) / "adapter_config.json").is_file():
        model = _load_adapter_dir(source, dtype)
    else:
        model = _from_pretrained(auto, source, dtype, **quant)
    _align_special_tokens(model, tok)
    if trainable:
        model = _prepare_trainable(model, mcfg)
    else:
        model.requires_grad_(False)
        model.eval()
    return model, tok


def load_scalar_model(source_name: str, mcfg, *, tokenizer, device=None, seed: int = 0, trainable: bool = True):
    """A 1-label ``AutoModelForSequenceClassification`` (reward model or critic) from a causal-LM or RM directory.

    Initialised from a causal LM, the backbone is reused and the ``score`` head starts at zero-mean small random
    values (transformers warns that the head is newly initialised; that is expected here).
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    dtype = resolve_dtype(mcfg.dtype, device, trainable and not mcfg.lora.enabled)
    source, _ = resolve_source(source_name, mcfg.gguf_file if source_name == mcfg.name else None)
    if vlm_type(source):
        model = _vlm_value_model(source, tokenizer, dtype, seed)
    elif is_tiny(source):
        cfg = tiny_model_config(source, tokenizer)
        cfg.num_labels = 1
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForSequenceClassification.from_config(cfg, dtype=dtype)
    else:
        if (Path(source) / "adapter_config.json").is_file():
            raise ModelError(f"{source} holds only a LoRA adapter", where="model.name",
                             fix="use the merged model directory the stage wrote (its parent), or `rlhfkit export`")
        cfg = AutoConfig.from_pretrained(source, **_hub_kwargs())
        cfg.num_labels = 1
        cfg.pad_token_id = tokenizer.pad_token_id
        with warnings.catch_warnings(), torch.random.fork_rng():
            warnings.simplefilter("ignore")
            torch.manual_seed(seed)
            model = _from_pretrained(AutoModelForSequenceClassification, source, dtype, config=cfg)
    model.config.pad_token_id = tokenizer.pad_token_id
    if trainable:
        model = _prepare_trainable(model, mcfg, task_type="SEQ_CLS")
    else:
        model.requires_grad_(False)
        model.eval()
    return model


def _vlm_value_model(source: str, tokenizer, dtype, seed: int):
    """A vision-language model as a critic: the VLM whole (its towers see the images) with its LM head replaced by a
    one-output linear head (small random values, untied from the embeddings), whose per-token output is the value
    (``models.heads.token_values`` reads ``lm_head``: ``rlhfkit_value_head``). transformers has no
    sequence-classification class for VLMs; a reward model of images is not built."""
    from transformers import AutoModelForImageTextToText

    with warnings.catch_warnings(), torch.random.fork_rng():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        if is_tiny(source):
            model = AutoModelForImageTextToText.from_config(tiny_model_config(source, tokenizer), dtype=dtype)
        else:
            model = _from_pretrained(AutoModelForImageTextToText, source, dtype)
        hidden = model.config.get_text_config().hidden_size
        head = torch.nn.Linear(hidden, 1, bias=False, dtype=dtype, device=model.lm_head.weight.device)
        torch.nn.init.normal_(head.weight, std=hidden ** -0.5 / 10)
    model.config.tie_word_embeddings = False
    model.config.get_text_config().tie_word_embeddings = False
    model.lm_head = head
    model.rlhfkit_value_head = "lm_head"
    return model


def _quantization(mcfg) -> dict:
    if not mcfg.lora.qlora:
        return {}
    if not torch.cuda.is_available():
        raise ModelError("QLoRA needs a CUDA GPU", where="model.lora.qlora", fix="set model.lora.qlora=false on CPU")
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except ImportError:
        raise ModelError("QLoRA needs bitsandbytes", where="model.lora.qlora", fix="pip install bitsandbytes") from None
    return {"quantization_config": BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True)}


def _load_adapter_dir(source: str, dtype):
    from peft import AutoPeftModelForCausalLM

    model = AutoPeftModelForCausalLM.from_pretrained(source, dtype=dtype, **_hub_kwargs())
    return model.merge_and_unload()


def _align_special_tokens(model, tok) -> None:
    model.config.pad_token_id = tok.pad_token_id
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.pad_token_id = tok.pad_token_id
        gen.eos_token_id = eos_token_ids(tok, gen)


def lora_targets(model, mcfg) -> list[str] | str:
    """What peft is told to adapt: ``model.lora.target_modules`` as the full names of the modules it matches
    (:mod:`rlhfkit.models.lora`: names, or regular expressions as peft's string form), else the projections per
    architecture (:data:`LORA_TARGETS`, else every linear layer); for a vision-language model always full names,
    of its language model's modules only (:func:`lora_candidates`), so that neither a name the vision tower shares
    nor a pattern reaching into it adapts the tower."""
    entries = list(mcfg.lora.target_modules or [])
    if family_of(model) is not None:
        inside = lora_candidates(model)
        if entries:
            return [n for n in inside if any(matches_target(e, n) for e in entries)]  # check_targets: not empty
        default = LORA_TARGETS.get(getattr(model.config.get_text_config(), "model_type", ""))
        modules = dict(model.named_modules())
        return [n for n in inside if (n.rsplit(".", 1)[-1] in default if default else
                                      isinstance(modules[n], torch.nn.Linear))]
    if entries:
        return [n for n in adaptable(model) if any(matches_target(e, n) for e in entries)] or entries
    return LORA_TARGETS.get(getattr(model.config, "model_type", ""), "all-linear")


def lora_candidates(model) -> list[str]:
    """The full names of the modules LoRA may adapt: :func:`adaptable`'s, of a VLM's language model only."""
    names = adaptable(model)
    if family_of(model) is None:
        return names
    prefix = language_model_name(model) + "."
    return [n for n in names if n.startswith(prefix)]


_REGEX_CHARS = set(".*[]()|^$+?\\")
_ADAPTABLE = ("Linear", "Conv1D", "Conv1d", "Conv2d", "Embedding")  # the layer types peft's LoRA adapts


def is_pattern(entry: str) -> bool:
    """``entry`` is a regular expression (peft's string form), not a module name."""
    return bool(_REGEX_CHARS & set(entry))


def matches_target(entry: str, name: str) -> bool:
    if is_pattern(entry):
        return re.fullmatch(entry, name) is not None
    return name == entry or name.endswith("." + entry)


def adaptable(model: torch.nn.Module) -> list[str]:
    """The full names of the modules LoRA can adapt (linear, 1-D convolution, embedding layers)."""
    return [n for n, m in model.named_modules() if n and type(m).__name__ in _ADAPTABLE]


def freeze_embeddings(model) -> int:
    """No gradient for the input embeddings and the output projection (one tensor when tied); returns the number
    of parameters frozen (a tied tensor counted once)."""
    params = {id(p): p for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
              for p in m.parameters()}
    for p in params.values():
        p.requires_grad_(False)
    return sum(p.numel() for p in params.values())


def _prepare_trainable(model, mcfg, task_type: str = "CAUSAL_LM"):
    if family_of(model) is not None and not getattr(mcfg, "train_vision", False):
        frozen = freeze_vision(model)  # LoRA (if any) goes on the language model only: lora_targets
        _say(f"[model] {family_of(model).name}: the vision tower and projector are frozen ({frozen / 1e6:.2f}M "
             "parameters; TRL would train them; model.train_vision=true trains them)")
    if not getattr(mcfg, "train_embeddings", True) and not (mcfg.lora.enabled or mcfg.lora.qlora):
        frozen = freeze_embeddings(model)
        head = " and the LM head" if model.get_output_embeddings() is not None else ""
        _say(f"[model] the token embeddings{head} are frozen ({frozen / 1e6:.2f}M parameters; "
             "model.train_embeddings=false)")
    if mcfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if mcfg.lora.enabled or mcfg.lora.qlora:
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        if mcfg.lora.qlora:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=mcfg.gradient_checkpointing)
        if mcfg.gradient_checkpointing:
            model.enable_input_require_grads()
        peft_cfg = LoraConfig(
            r=mcfg.lora.r, lora_alpha=mcfg.lora.alpha, lora_dropout=mcfg.lora.dropout,
            target_modules=lora_targets(model, mcfg), task_type=task_type,
            modules_to_save=[getattr(model, "rlhfkit_value_head", "score")] if task_type == "SEQ_CLS" else None,
        )
        model = get_peft_model(model, peft_cfg)
    model.train()
    return model


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def trainable_state_dict(model) -> dict[str, torch.Tensor]:
    """Only the trainable tensors (adapter weights under LoRA; everything otherwise) — what a checkpoint needs."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in names}


def save_model(model, tokenizer, out_dir: str | Path, *, extra_files: dict[str, str] | None = None) -> Path:
    """Save a full, merged model directory atomically (write to a temp dir, then swap files in).

    With LoRA: the adapter goes to ``out_dir/adapter/`` and the merged weights to ``out_dir``. Existing non-model
    files in ``out_dir`` (metrics, checkpoints, config.yaml) are left alone.
    """
    out = files.make_dirs(out_dir)
    tmp = out / ".saving"
    need = files.model_nbytes(model) * (2 if is_peft(model) else 1)
    with files.writing(out, need=need, cleanup=[tmp], what=f"the model to {out}",
                       fix="rerun (a run resumes from its newest checkpoint)"):
        files.fresh_dir(tmp)  # made here: save_pretrained writes nowhere else, so never through a planted link
        # a vision-language model's processor holds its tokenizer, image processor and chat template
        processor = getattr(tokenizer, "rlhfkit_processor", None) or tokenizer
        if is_peft(model):
            model.save_pretrained(tmp / "adapter")
            processor.save_pretrained(tmp / "adapter")
            model.get_base_model().save_pretrained(tmp, state_dict=merged_state_dict(model))
        else:
            model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            with files.open_new(tmp / name) as f:
                f.write(text)
        for item in sorted(tmp.iterdir()):
            files.refuse_link(out / item.name)  # every destination checked before the first is replaced
        for old in out.glob("model*.safetensors*"):  # a former save's other layout (one file / shards) would be read
            if not (tmp / old.name).exists() and old.is_file() and not old.is_symlink():
                old.unlink()
        for item in sorted(tmp.iterdir()):
            files.replace(item, out / item.name)
        os.rmdir(tmp)
        files.fsync_dir(out)
    return out


def merged_state_dict(peft_model) -> dict[str, torch.Tensor]:
    """The LoRA-merged weights of ``peft_model`` under its base model's own names, in host memory: each adapted
    layer's ``W + delta`` (peft's ``get_delta_weight``, added as ``merge_and_unload`` adds it: the same bits, tested
    against it), every other tensor as it is (a CPU tensor itself, no copy). Saved by the base model's
    ``save_pretrained`` (its tied weights, key conversions and config as for any model). Why not ``merge_and_unload``
    on a deep copy, as before: the copy doubled the whole model (adapters and all) on its device at the end of every
    LoRA run, on a GPU too; measured on the Qwen3-1.7B shape on CPU (bench/real_shapes.py), the final save peaked at
    13.3 GiB against the train step's 9.3 GiB. Here the extra is the adapted weights, in host memory."""
    base = peft_model.get_base_model()
    modules = dict(base.named_modules())
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for key, value in base.state_dict().items():
            if ".lora_" in key or ".original_module." in key:  # adapters; a saved module's frozen original
                continue
            name = re.sub(r"\.modules_to_save\.[^.]+\.", ".", key.replace(".base_layer.", "."))
            owner = modules.get(key.rsplit(".base_layer.", 1)[0]) if key.endswith(".base_layer.weight") else None
            if owner is not None and hasattr(owner, "get_delta_weight"):
                merged = value.detach().to("cpu", copy=True)
                for adapter in owner.active_adapters:
                    if adapter in owner.lora_A or adapter in owner.lora_embedding_A:
                        merged += owner.get_delta_weight(adapter).to("cpu")  # merge_and_unload's in-place add
                out[name] = merged
            else:
                out[name] = value.detach().to("cpu")
    return out


def describe(model) -> str:
    total = sum(p.numel() for p in model.parameters())
    train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return f"{total / 1e6:.2f}M parameters, {train / 1e6:.2f}M trainable"

