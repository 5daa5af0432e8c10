"""The cross-field rules: each recipe config's ``check()`` (called once by :func:`~rlhfkit.config.build_config`:
combinations of keys that cannot work are errors here, before anything loads) and ``check_inputs()`` (whether a run
has what it needs: data, a reward, the packages and devices of its strategy; the runners call it first, so
``config show`` prints configs that are consistent but not yet runnable). Only checks that need the data (sizes)
stay in the trainers.

Config imports no room above it: the registries of ``algos`` and ``envs`` are read lazily, inside the checks (the
documented exception); the split syntax lives in :mod:`.splits`, the tracker names in :mod:`.choices`.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError, DataError, say
from .choices import TRACKER_PACKAGES, known_backends
from .splits import parse_split


def check_output_dir(path: str) -> None:
    """``output_dir`` must be a directory that can be created and written (checked before anything loads)."""
    if not str(path).strip():
        raise ConfigError("'output_dir' is empty", where="output_dir", fix="set output_dir=runs/NAME")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"output_dir {p} is an existing file, not a directory", where="output_dir",
                          fix="choose another output_dir")
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not (probe.is_dir() and os.access(probe, os.W_OK | os.X_OK) and _can_create_in(probe)):
        raise ConfigError(f"output_dir {p} cannot be written ({probe} is not a writable directory)",
                          where="output_dir", fix="choose a directory you can write to")


def _can_create_in(directory: Path) -> bool:
    """Whether an entry can really be made in ``directory`` (``os.access`` says yes to root on read-only or virtual
    file systems such as /sys): a hidden empty directory is made and removed at once; no file is touched."""
    try:
        Path(tempfile.mkdtemp(prefix=".rlhfkit-probe-", dir=directory)).rmdir()
    except OSError:
        return False
    return True


def _check_common(cfg) -> None:
    check_output_dir(cfg.output_dir)
    if cfg.train.max_steps == 0:
        raise ConfigError("'train.max_steps' is 0: nothing would be trained", where="train.max_steps",
                          fix="set train.max_steps=-1 (from train.epochs) or a positive number of updates")
    if cfg.train.mixed_precision == "fp16":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("train.mixed_precision=fp16 needs a CUDA GPU", where="train.mixed_precision",
                              fix="use auto, no or bf16 on CPU")
    if cfg.model.train_vision and (cfg.model.lora.enabled or cfg.model.lora.qlora):
        raise ConfigError("model.train_vision=true trains the vision tower's every weight, and LoRA trains adapters "
                          "only (peft would freeze the tower): the two together are not built",
                          where="model.train_vision", fix="drop model.train_vision, or set model.lora.enabled=false")
    if cfg.model.lora.qlora and not cfg.model.lora.enabled:
        raise ConfigError("model.lora.qlora trains LoRA adapters on a 4-bit base", where="model.lora.qlora",
                          fix="also set model.lora.enabled=true")
    if cfg.model.lora.qlora:
        import torch

        if not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
            raise ConfigError("model.lora.qlora loads the base model in 4-bit, which needs a CUDA GPU and the "
                              "bitsandbytes package", where="model.lora.qlora",
                              fix="set model.lora.qlora=false (plain LoRA), or run on a GPU with bitsandbytes")
    if cfg.model.name is not None and not cfg.model.name.strip():
        raise ConfigError("'model.name' is empty", where="model.name",
                          fix="give a model directory, a .gguf file, a cached hub name, or tiny")
    d = cfg.data
    for key in ("split", "eval_split"):
        if getattr(d, key):
            try:
                parse_split(getattr(d, key))
            except DataError as err:
                raise ConfigError(err.message, where=f"data.{key}", fix=err.fix) from None
    if d.max_prompt_length is not None and d.max_prompt_length > d.max_length:
        raise ConfigError(f"data.max_prompt_length={d.max_prompt_length} exceeds data.max_length={d.max_length} "
                          "(prompt + completion)", where="data.max_prompt_length",
                          fix="lower data.max_prompt_length or raise data.max_length")
    if cfg.model.gguf_file and _is_tiny(cfg.model.name):
        raise ConfigError(f"model.gguf_file={cfg.model.gguf_file!r} names a file inside model.name, but the built-in "
                          "tiny model has none", where="model.gguf_file",
                          fix="set model.name to the directory holding the .gguf file, or model.gguf_file=null")
    check_backends(cfg.track.backends)  # unknown tracker or missing package: part of the config, like fp16 on CPU
    _check_distributed(cfg)


def _is_tiny(name: str) -> bool:
    return name == "tiny" or name.startswith("tiny:")


def _check_data_format(cfg, *allowed: str) -> None:
    if cfg.data.format not in ("auto", *allowed):
        raise ConfigError(f"the {cfg.recipe} recipe reads {' or '.join(allowed)} records, not {cfg.data.format}",
                          where="data.format", fix=f"set data.format=auto (or {allowed[0]})")


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def check_model_file(name: str, key: str = "model.name", where: str | None = None) -> None:
    """A file named as a model is refused in one line unless it is a ``.gguf`` file: a pickled PyTorch checkpoint
    (``pytorch_model.bin``, ``.pt``, ``.pth``, ``.ckpt``, ``.pkl``) because unpickling it can run any code (rlhfkit
    reads weights only from safetensors, or with ``torch.load(weights_only=True)`` inside a model directory), any
    other file because a model is a directory (config.json + weights). Nothing is opened. ``where``: the place the
    message names (default: ``key``)."""
    path = Path(name).expanduser()
    if not path.is_file() or path.suffix.lower() == ".gguf":
        return
    refuse_pickle(name, key, where)
    raise ConfigError(f"{name} is a file; a model is a directory (config.json + model.safetensors) or a .gguf file",
                      where=where or key, fix=f"give the directory that holds it: {key}={path.parent}")


def refuse_pickle(name: str, key: str = "model.name", where: str | None = None) -> None:
    """A pickled PyTorch file (``PICKLE_SUFFIXES``) named as a model: one line saying why it is refused and how to
    convert it (see :func:`check_model_file`); any other name passes. Nothing is opened."""
    if Path(name).suffix.lower() in PICKLE_SUFFIXES:
        raise ConfigError(
            f"{name} is a pickled PyTorch file; rlhfkit refuses it as a model (unpickling can run any code in it: "
            "weights are read only from safetensors files, or with torch.load(weights_only=True) in a model "
            "directory)", where=where or key,
            fix="convert it once where you trust it: python -c \"import torch, safetensors.torch as s; "
                f"s.save_file(torch.load('{name}', weights_only=True), 'DIR/model.safetensors')\" with the model's "
                f"config.json in DIR, then {key}=DIR")


def _check_model_source(name: str | None, key: str) -> None:
    """A local model path that does not exist, or a directory that holds no model, named before anything loads
    (hub-style ``org/name`` and ``tiny`` are left to the loader, which reads only the local cache)."""
    if not name or _is_tiny(name):
        return
    check_model_file(name, key)
    path = Path(name).expanduser()
    if path.exists():
        if path.is_dir() and not any((path / f).is_file() for f in ("config.json", "adapter_config.json")) \
                and not any(path.glob("*.gguf")):
            raise ConfigError(f"{name} is not a model directory (no config.json)", where=key,
                              fix="point to a directory a stage wrote (config.json + model.safetensors), a .gguf "
                                  "file, or 'tiny'")
        return
    looks_local = name.startswith((".", "/", "~")) or path.suffix == ".gguf" or name.count("/") != 1
    if looks_local:
        raise ConfigError(f"model not found: {name}", where=key,
                          fix="check the path (a stage's output directory holds config.json and model.safetensors), "
                              "or give a cached hub name org/model or 'tiny'")
    if os.environ.get("HF_HUB_OFFLINE", "1") != "0":  # offline (the default): the hub name must be in the cache
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise ConfigError(f"model {name!r} is not in the local Hugging Face cache (rlhfkit runs offline)",
                              where=key, fix="download it once (`huggingface-cli download " + name + "`), or run "
                                             "with HF_HUB_OFFLINE=0 to let it be fetched, or give a local directory")


def _check_distributed(cfg) -> None:
    """Combinations the strategies do not support (the environment itself is checked by ``check_inputs``)."""
    dist = cfg.distributed
    if dist.strategy == "fsdp2" and cfg.model.lora.enabled:
        raise ConfigError("distributed.strategy=fsdp2 with LoRA is not built (adapters are small: data parallel "
                          "suffices)", where="distributed.strategy",
                          fix="use distributed.strategy=ddp with LoRA, or train all weights under fsdp2")
    if dist.strategy == "fsdp2" and getattr(getattr(cfg, "memory", None), "offload_optimizer", False):
        raise ConfigError("memory.offload_optimizer moves whole optimizer states; FSDP2's are sharded",
                          where="memory.offload_optimizer",
                          fix="use distributed.cpu_offload=true (FSDP2 keeps its sharded states in host memory)")
    if dist.strategy == "fsdp2" and cfg.train.mixed_precision == "fp16":
        raise ConfigError("fsdp2 here supports bf16 or fp32, not fp16 (no sharded gradient scaler)",
                          where="train.mixed_precision", fix="use train.mixed_precision=bf16")
    if dist.strategy == "deepspeed":
        if not dist.deepspeed_config.strip():
            raise ConfigError("distributed.deepspeed_config is empty", where="distributed.deepspeed_config",
                              fix="use zero2, zero3 or a DeepSpeed JSON path")
        # deepspeed steps the optimizer in every backward: one backward per update
        if cfg.train.grad_accum != 1:
            raise ConfigError("distributed.strategy=deepspeed runs one backward per optimizer update",
                              where="train.grad_accum", fix="set train.grad_accum=1 (raise train.batch_size instead)")
        algo = getattr(cfg, "algo", None)
        if hasattr(algo, "mini_batch_size") and algo.mini_batch_size != cfg.train.batch_size:
            raise ConfigError("distributed.strategy=deepspeed runs one backward per optimizer update",
                              where="algo.mini_batch_size", fix=f"set train.batch_size={algo.mini_batch_size}")
        from .. import algos

        if hasattr(algo, "advantage") and algos.ADVANTAGE_ESTIMATORS[algo.advantage].needs_critic:
            raise ConfigError("distributed.strategy=deepspeed trains one model; PPO's critic is a second one",
                              where="distributed.strategy", fix="use fsdp2 for PPO, or a critic-free estimator")
        if getattr(getattr(cfg, "memory", None), "offload_optimizer", False):
            raise ConfigError("memory.offload_optimizer moves a torch optimizer's state; DeepSpeed keeps its own",
                              where="memory.offload_optimizer",
                              fix="use distributed.cpu_offload=true (DeepSpeed's optimizer offload) instead")


def _inputs_distributed(cfg) -> None:
    """What the chosen strategy needs from this machine, checked before any weight loads."""
    dist = cfg.distributed
    if dist.strategy == "deepspeed":
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError("distributed.strategy=deepspeed needs the deepspeed package",
                              where="distributed.strategy",
                              fix="pip install deepspeed (on a CUDA machine), or use fsdp2")
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("distributed.strategy=deepspeed needs a CUDA GPU", where="distributed.strategy",
                              fix="use distributed.strategy=fsdp2 (works on CPU) or ddp")
        name = dist.deepspeed_config
        if name not in ("zero2", "zero3") and not Path(name).is_file():
            raise ConfigError(f"DeepSpeed config not found: {name}", where="distributed.deepspeed_config",
                              fix="use zero2, zero3 or a path to a DeepSpeed JSON file")
    if dist.cpu_offload and dist.strategy == "fsdp2":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("distributed.cpu_offload moves sharded state from GPU to CPU memory; without a GPU "
                              "everything already is in CPU memory", where="distributed.cpu_offload",
                              fix="set distributed.cpu_offload=false on CPU")


def _check_online(cfg) -> None:
    from .. import algos

    _check_common(cfg)
    _check_data_format(cfg, "prompt")
    algo = cfg.algo
    est = algos.ADVANTAGE_ESTIMATORS[algo.advantage]
    if est.group_based and algo.num_generations < 2:
        raise ConfigError(f"{algo.advantage} compares completions of a prompt and needs num_generations >= 2",
                          where="algo.num_generations", fix="set algo.num_generations=4 (or more)")
    if cfg.train.grad_accum != 1:  # TRL's gradient_accumulation_steps lands here: say where it goes instead
        raise ConfigError(
            f"train.grad_accum={cfg.train.grad_accum} is not read by the online recipes: an update accumulates "
            "algo.mini_batch_size / train.batch_size micro-batches", where="train.grad_accum",
            fix=f"set train.grad_accum=1 and algo.mini_batch_size={cfg.train.batch_size * cfg.train.grad_accum}")
    from .geometry import check_split

    check_split(cfg)  # the step's samples split into updates and micro-batches, or the nearest values that do
    if est.group_based and cfg.generation.temperature == 0:
        raise ConfigError(f"generation.temperature=0 (greedy) makes the {algo.num_generations} completions of a prompt "
                          f"identical: every group ties and {algo.advantage} learns nothing",
                          where="generation.temperature", fix="sample: generation.temperature=1.0 (TRL's default)")
    if cfg.train.log_every != 1:
        raise ConfigError(f"train.log_every={cfg.train.log_every} is not read by the online recipes: they log one line "
                          "per rollout step", where="train.log_every", fix="remove it (train.log_every=1)")
    for i, fn in enumerate(cfg.reward.functions):
        if not fn.fn.strip():
            raise ConfigError(f"reward.functions[{i}] names no function", where=f"reward.functions[{i}].fn",
                              fix="give fn: package.module:function, file.py:function or a built-in name")
    from ..rollout import check_engine  # the registry, read lazily (the documented exception)

    check_engine(cfg.generation.engine, cfg.generation.engine_kwargs, cfg.generation.cache_tokens)
    longest = (cfg.data.max_prompt_length or cfg.data.max_length) + cfg.generation.max_new_tokens
    if cfg.generation.cache_tokens is not None and cfg.generation.cache_tokens < longest:
        raise ConfigError(f"generation.cache_tokens={cfg.generation.cache_tokens} holds less than one sequence "
                          f"({longest} tokens: the prompt limit + generation.max_new_tokens)",
                          where="generation.cache_tokens", fix=f"give at least {longest} (a few times more: "
                          "the slots share it)")
    if any(not text for text in cfg.generation.stop_strings):
        raise ConfigError("generation.stop_strings holds an empty string (every response would stop at once)",
                          where="generation.stop_strings", fix="remove the empty entry")
    if cfg.generation.min_new_tokens > cfg.generation.max_new_tokens:
        raise ConfigError("generation.min_new_tokens exceeds generation.max_new_tokens",
                          where="generation.min_new_tokens", fix="lower it (0 = never force length)")
    if algo.overlong.cache_len > cfg.generation.max_new_tokens:
        raise ConfigError(f"algo.overlong.cache_len={algo.overlong.cache_len} exceeds generation.max_new_tokens="
                          f"{cfg.generation.max_new_tokens}", where="algo.overlong.cache_len",
                          fix="choose a cache_len below max_new_tokens (DAPO: 4096 of 20480)")
    for on, what, where, off in (  # settings that read each prompt's group of answers
            (algo.dynamic_sampling.enabled, "dynamic sampling keeps groups whose rewards differ",
             "algo.dynamic_sampling.enabled", "disable it"),
            (cfg.reward.missing_eos_scope == "varied", "reward.missing_eos_scope=varied looks at each prompt's group "
             "of answers", "reward.missing_eos_scope", "missing_eos_scope=all")):
        if on and not est.group_based:
            raise ConfigError(f"{what}; {algo.advantage} has no groups", where=where,
                              fix=f"use a group estimator (algo.advantage=grpo, dr_grpo or rloo) or {off}")
    if algo.objective == "preference" and algo.num_generations < 2:
        raise ConfigError("online preference learning pairs completions of a prompt and needs num_generations >= 2",
                          where="algo.num_generations", fix="set algo.num_generations=2 (TRL's online DPO)")
    if (not algos.POLICY_LOSSES[algo.policy_loss].sequence_weights and algo.correction != "none"
            and algos.OFF_POLICY_CORRECTIONS[algo.correction].section is None and algo.off_policy.level == "sequence"):
        raise ConfigError(f"{algo.policy_loss} folds the correction's token ratios into its own sequence ratio; a "
                          "sequence-level correction would count each row's ratio once per token",
                          where="algo.off_policy.level", fix="set algo.off_policy.level=token")
    for on, what, where in ((algo.whiten_advantages, "algo.whiten_advantages subtracts the batch's mean advantage",
                             "algo.whiten_advantages"),
                            (cfg.reward.normalize, "reward.normalize subtracts the scores' running mean (and the "
                             "fixed center no longer splits right from wrong)", "reward.normalize")):
        if algo.advantage == "w_reinforce" and on:
            raise ConfigError(f"{what}: a baseline, which w_reinforce has none of by design (each answer is pushed by "
                              "its own score against a fixed center, algo.w_reinforce.center)", where=where,
                              fix=f"set {where}=false")
    if algo.top_entropy_quantile < 1 and algo.objective == "preference":
        raise ConfigError("algo.top_entropy_quantile selects tokens of the policy loss; online preference learning "
                          "(algo.objective=preference) has none", where="algo.top_entropy_quantile", fix="remove it")
    if algo.kl.adaptive and algo.kl.coef == 0:
        raise ConfigError("the adaptive KL controller cannot move a coefficient of 0", where="algo.kl.coef",
                          fix="give an initial algo.kl.coef > 0")


def raise_no_model(key: str = "model.name") -> None:
    """No model named: rlhfkit never trains a model the user did not name (the built-in toy model included)."""
    raise ConfigError("no model named (rlhfkit does not pick one)", where=key,
                      fix=f"set {key}=DIR | org/name | file.gguf (TRL's model_name_or_path works too); "
                          f"{key}=tiny is the built-in 0.34M-parameter toy model")


def require_model(cfg) -> None:
    """What every command that loads the run's model checks first: ``model.name`` is given."""
    if cfg.model.name is None:
        raise_no_model()


def _inputs_common(cfg) -> None:
    require_model(cfg)
    _note_precision(cfg)

    _inputs_distributed(cfg)
    if not cfg.data.train:
        raise ConfigError("no training data given", where="data.train",
                          fix="set data.train=path/to/file.jsonl (see `rlhfkit data make quickstart --out data/`)")
    _check_chat_template(cfg.model.chat_template)
    _check_model_source(cfg.model.name, "model.name")
    _check_model_source(getattr(cfg, "ref_model", None), "ref_model")


def _note_precision(cfg) -> None:
    """``train.mixed_precision=bf16`` without CUDA (TRL's ``bf16=True`` default, carried over in a TRL config): said
    in one line before anything loads (it runs, under the CPU's bf16 autocast: less precise, and slower than float32
    on a CPU without bf16 units)."""
    if cfg.train.mixed_precision != "bf16":
        return
    import torch

    if not torch.cuda.is_available():
        say("[config] train.mixed_precision=bf16 (TRL's bf16=true) on a CPU: forwards run under the CPU's bf16 "
            "autocast, less precise and, on a CPU without bf16 units, slower than float32; "
            "train.mixed_precision=auto trains in float32 here")


def _check_chat_template(template: str | None) -> None:
    """A chat template is Jinja text or the path of a file holding it; text without any Jinja tag that names no
    existing file is a mistyped path (it would otherwise become the template itself)."""
    if template and "{" not in template and not Path(template).expanduser().is_file():
        raise ConfigError(f"model.chat_template file not found: {template}", where="model.chat_template",
                          fix="give the path of an existing template file, or the Jinja template text itself")


def _inputs_online(cfg) -> None:
    from .. import algos

    _inputs_common(cfg)
    if cfg.env.name:
        from ..envs import load_environment

        load_environment(cfg.env.name)  # an unloadable environment stops the run here, before any weights load
    if (cfg.reward.model is None and not cfg.reward.functions and not cfg.reward.remote.url and not cfg.env.name
            and not cfg.teacher.model):
        raise ConfigError("no reward: give a reward model, reward functions, a remote judge or a teacher",
                          where="reward", fix="set reward.model=runs/rm, reward.functions=[{fn: exact_match}], "
                                              "reward.remote.url, env.name or teacher.model")
    est = algos.ADVANTAGE_ESTIMATORS[cfg.algo.advantage]
    if cfg.generation.temperature == 0:  # group estimators refuse it when the config is built
        say("[config] generation.temperature=0: greedy rollouts explore nothing, and the policy is trained on "
            "log-probs of a distribution it did not sample from (set generation.temperature=1.0 for on-policy RL)")
    if est.needs_teacher and not cfg.teacher.model:
        raise ConfigError(f"algo.advantage={cfg.algo.advantage} learns from a teacher and none is set",
                          where="teacher.model", fix="set teacher.model=runs/teacher (an HF or run directory, or a "
                                                     ".gguf file)")
    if est.needs_critic and cfg.critic.model is None and cfg.critic.init == "reward" and cfg.reward.model is None:
        raise ConfigError("critic.init=reward needs reward.model", where="critic.init",
                          fix="set critic.init=policy, or give reward.model")
    _check_model_source(cfg.reward.model, "reward.model")
    _check_model_source(cfg.teacher.model, "teacher.model")
    if est.needs_critic:
        _check_model_source(cfg.critic.model, "critic.model")


def _check_preference(cfg) -> None:
    from .. import algos

    _check_common(cfg)
    algo, spec = cfg.algo, algos.PREFERENCE_LOSSES[cfg.algo.loss]
    if algo.loss == "ipo" and algo.label_smoothing:
        raise ConfigError("label smoothing applies to the sigmoid (DPO) loss, not to IPO",
                          where="algo.label_smoothing", fix="set algo.label_smoothing=0 or algo.loss=cdpo")
    if not spec.needs_reference and cfg.ref_model:
        raise ConfigError(f"{algo.loss} uses no reference model", where="ref_model", fix="set ref_model=null")
    if spec.paired and cfg.data.format not in ("auto", "preference"):
        raise ConfigError(f"algo.loss={algo.loss} trains on preference pairs, not {cfg.data.format} data",
                          where="data.format", fix="set data.format=preference (or use algo.loss=kto)")
    if not spec.paired and cfg.data.format not in ("auto", "preference", "unpaired"):
        raise ConfigError(f"algo.loss={algo.loss} trains on unpaired examples or pairs, not {cfg.data.format}",
                          where="data.format", fix="set data.format=unpaired (or preference)")


def check_backends(backends: Sequence[str]) -> None:
    """Raise a one-line ``ConfigError`` (where ``track.backends``) for an unknown tracker or one whose package is
    not installed. Writes nothing, imports nothing (the packages are only looked up with ``find_spec``)."""
    known = known_backends()
    for name in backends:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigError(f"unknown tracker '{name}'", where="track.backends",
                              fix=f"{hint}use some of {', '.join(known)}")
        module, pip = TRACKER_PACKAGES.get(name, (name, name))
        if name != "jsonl" and importlib.util.find_spec(module) is None:
            raise ConfigError(f"the {name} tracker needs the {pip} package, which is not installed",
                              where="track.backends", fix=f"pip install {pip} (or drop {name} from track.backends)")
