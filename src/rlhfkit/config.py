"""Typed configuration: one frozen dataclass per recipe, composed of small shared sections.

A config comes from a YAML file plus dotted overrides (``optim.lr=1e-4``, ``output_dir=runs/x``). Building it
validates every key and type once: unknown keys and wrong types raise :class:`~rlhfkit.errors.ConfigError` with the
key path and a "did you mean" hint. After that the config is frozen; nothing rewrites it. Every field has a help
string (``field(metadata={"help": ...})``) from which the commented YAML files in ``configs/`` are checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError


def f(default, help: str, **kw):  # noqa: A002 - short helper for fields with help text
    """A dataclass field with a help string; mutable defaults are copied per instance."""
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return field(default_factory=lambda d=default: _copy(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


def _copy(value):
    import copy

    return copy.deepcopy(value)


# ─────────────────────────────────────────────── shared sections ──────────────────────────────────────────────


@dataclass(frozen=True)
class LoraConfig:
    enabled: bool = f(False, "train LoRA adapters instead of all weights")
    r: int = f(16, "LoRA rank", ge=1)
    alpha: int = f(32, "LoRA scaling numerator (scale = alpha / r)", ge=1)
    dropout: float = f(0.05, "dropout on the LoRA branch", ge=0, lt=1)
    target_modules: list[str] | None = f(None, "module names to adapt; null = chosen per architecture")
    qlora: bool = f(False, "load the base model in 4-bit (needs CUDA and bitsandbytes)")


@dataclass(frozen=True)
class ModelConfig:
    name: str = f("tiny", "HF directory, cached hub name, .gguf file, or tiny[:hidden=..,layers=..]")
    gguf_file: str | None = f(None, "GGUF file name inside `name` (a directory) when loading a GGUF model")
    dtype: str = f("auto", "auto (CUDA: fp32 weights + bf16 autocast when trained, bf16 when frozen or LoRA base; "
                           "CPU: fp32) | float32 | bfloat16 | float16")
    gradient_checkpointing: bool = f(False, "recompute activations in backward to save memory")
    chat_template: str | None = f(None, "override the tokenizer's chat template (a Jinja string or a file path)")
    lora: LoraConfig = f(LoraConfig(), "LoRA / QLoRA settings")


@dataclass(frozen=True)
class DataConfig:
    train: str | None = f(None, "training data: .jsonl/.json/.parquet/.csv file, a directory, or a datasets name")
    eval: str | None = f(None, "evaluation data (same forms); null = split eval_fraction off the training data")
    split: str | None = f(None, "split / slice of the training source, e.g. train[:500]")
    eval_split: str | None = f(None, "split / slice of the evaluation source")
    eval_fraction: float = f(0.05, "fraction of training records held out for evaluation when eval is null",
                             ge=0, lt=1)
    format: str = f("auto", "auto | sft | preference | prompt | unpaired")
    fields: dict[str, str] = f({}, "column mapping, field -> your column, e.g. {prompt: question, answer: solution}")
    max_length: int = f(512, "maximum tokens of prompt + completion", ge=2)
    max_prompt_length: int | None = f(None, "maximum prompt tokens; null = max_length (prompts), max_length/2 (pairs)",
                                      ge=1)
    overflow: str = f("truncate", "over-long prompts: truncate (keep the end) | drop | error; always counted")
    completion_only_loss: bool = f(True, "SFT: train on assistant / completion tokens only")
    packing: bool = f(False, "SFT: pack several examples into each row of max_length")
    limit: int | None = f(None, "use at most this many training records", ge=1)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = f(1e-5, "peak learning rate", ge=0)
    weight_decay: float = f(0.0, "AdamW weight decay", ge=0)
    betas: list[float] = f([0.9, 0.999], "AdamW betas", ge=0, lt=1)
    eps: float = f(1e-8, "AdamW epsilon", gt=0)
    schedule: str = f("linear", "linear | cosine | constant (after warm-up)")
    warmup_ratio: float = f(0.0, "warm-up as a fraction of all optimizer updates", ge=0, le=1)
    warmup_steps: int = f(0, "warm-up in optimizer updates (wins over warmup_ratio when > 0)", ge=0)
    max_grad_norm: float | None = f(1.0, "gradient clipping norm; null = no clipping", gt=0)


@dataclass(frozen=True)
class TrainConfig:
    epochs: float = f(1.0, "passes over the training data (fractions allowed)", gt=0)
    max_steps: int = f(-1, "optimizer updates to run; -1 = derived from epochs", ge=-1)
    batch_size: int = f(8, "micro-batch size per device", ge=1)
    grad_accum: int = f(1, "micro-batches accumulated per optimizer update", ge=1)
    eval_batch_size: int | None = f(None, "evaluation micro-batch size; null = batch_size", ge=1)
    seed: int = f(42, "random seed (data order, initialisation, sampling)", ge=0)
    eval_every: int = f(0, "evaluate every N optimizer updates; 0 = only at the end", ge=0)
    save_every: int = f(0, "checkpoint every N optimizer updates; 0 = only the final model", ge=0)
    save_total_limit: int = f(2, "checkpoints kept (older ones deleted)", ge=1)
    resume: str = f("auto", "auto (latest valid checkpoint of the same run) | never (start over) | force (resume "
                            "even when settings changed; the new settings apply from there) | a checkpoint-N path")
    log_every: int = f(1, "log metrics every N optimizer updates", ge=1)
    mixed_precision: str = f("auto", "auto (bf16 on CUDA, none on CPU) | no | bf16 | fp16")
    max_nonfinite_skips: int = f(5, "stop after this many consecutive updates skipped for a non-finite loss or "
                                    "gradient", ge=1)


@dataclass(frozen=True)
class TrackConfig:
    backends: list[str] = f(["jsonl"], "trackers: jsonl (always) + tensorboard | wandb | mlflow | comet_ml | aim | "
                                       "clearml | dvclive | swanlab | trackio (the last via accelerate)")
    sample_every: int = f(10, "print and save a table of samples every N steps (online recipes)", ge=0)
    progress: bool = f(True, "show a progress bar with ETA (off: no bar; metrics still go to metrics.jsonl)")
    report: bool = f(True, "write report.html at the end of the run")
    stop_on_critical: bool = f(False, "stop the run when a critical health warning fires (KL blow-up, collapse)")


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = f(64, "maximum response tokens (a response usually ends earlier, at EOS)", ge=1)
    min_new_tokens: int = f(0, "minimum response tokens; 0 = never force length", ge=0)
    temperature: float = f(1.0, "sampling temperature (0 = greedy); keep 1.0 for on-policy RL", ge=0)
    top_p: float = f(1.0, "nucleus sampling; 1.0 = off", gt=0, le=1)
    top_k: int = f(0, "top-k sampling; 0 = off", ge=0)
    stop_strings: list[str] = f([], "extra strings that end a response (EOS always does)")
    engine: str = f("hf", "rollout engine (see `rollout.ENGINES`): hf (transformers.generate)")
    batch_size: int | None = f(None, "generation micro-batch; null = whole rollout batch", ge=1)


@dataclass(frozen=True)
class DistributedConfig:
    strategy: str = f("ddp", "ddp (data parallel through accelerate) | fsdp2 (PyTorch fully_shard: parameters, "
                             "gradients and optimizer states sharded per layer; CPU with gloo too) | deepspeed "
                             "(accelerate's DeepSpeed ZeRO; needs CUDA and the deepspeed package; not measured here)")
    deepspeed_config: str = f("zero2", "deepspeed: zero2 | zero3 (the shipped configs/deepspeed/*.json) or a path to "
                                       "a DeepSpeed JSON file (batch sizes and clipping are filled from this config)")
    cpu_offload: bool = f(False, "fsdp2: sharded parameters, gradients and optimizer states live in CPU memory "
                                 "(needs CUDA); deepspeed: optimizer states (zero3: and parameters) offloaded to CPU")
    reshard_after_forward: bool = f(True, "fsdp2: free each layer's gathered parameters after its forward (ZeRO-3 "
                                          "like); false keeps them until backward (ZeRO-2 like: more memory, less "
                                          "communication)")


# ─────────────────────────────────────────────── recipe sections ──────────────────────────────────────────────


@dataclass(frozen=True)
class RMConfig:
    margin_field: str | None = f(None, "record field holding a per-pair margin (Llama 2); null = no margin")
    center_coef: float = f(0.0, "reward-centering coefficient: adds coef * mean((r_c + r_r)^2)", ge=0)


@dataclass(frozen=True)
class RewardFunction:
    fn: str = f("", "package.module:function, file.py:function, or a built-in name (exact_match, ...)")
    weight: float = f(1.0, "weight of this function in the total reward")
    name: str | None = f(None, "name in the logs (rewards/<name>/mean); default = function name")
    kwargs: dict[str, Any] = f({}, "keyword arguments passed to the function")


@dataclass(frozen=True)
class RewardConfig:
    model: str | None = f(None, "reward-model directory (from `rlhfkit rm`); null = functions only")
    functions: list[RewardFunction] = f([], "rule / user reward functions combined by weight")
    missing_eos_penalty: float | None = f(1.0, "subtracted from the score of responses that never ended", ge=0)
    clip: float | None = f(10.0, "clip scores to [-clip, clip] after the penalty; null = off", gt=0)
    normalize: bool = f(True, "normalise scores by running mean / std (keeps critic targets bounded)")
    batch_size: int = f(16, "reward-model scoring micro-batch", ge=1)


@dataclass(frozen=True)
class KLConfig:
    coef: float = f(0.05, "KL coefficient (initial value when adaptive)", ge=0)
    estimator: str = f("k1", "per-token KL estimator: k1 (log-ratio) | k2 | k3")
    placement: str = f("auto", "auto (the estimator's default: reward for gae / rloo / reinforce_pp, loss for "
                               "grpo / dr_grpo) | reward (subtract from per-token reward) | loss (add to the loss)")
    adaptive: bool = f(False, "Ziegler et al. (2019) adaptive coefficient towards `target`")
    target: float = f(6.0, "target sequence KL for the adaptive controller", gt=0)
    horizon: int = f(10000, "adaptive controller horizon in episodes", ge=1)
    log_ratio_clip: float | None = f(20.0, "clamp log pi - log ref to [-c, c] before the KL estimator (k3 is inf "
                                           "in float32 beyond 88); null = off", gt=0)


@dataclass(frozen=True)
class OffPolicyConfig:
    correction: str = f("none", "rollout / trainer mismatch correction (see `algos.OFF_POLICY_CORRECTIONS`): none | "
                                "tis (weight min(pi_old / pi_rollout, cap)) | mis (drop tokens / rows outside "
                                "[low, high])")
    level: str = f("token", "importance ratio per token, or per sequence (product of the row's token ratios)")
    cap: float = f(2.0, "TIS: the largest importance weight", ge=1)
    low: float = f(0.5, "MIS band lower end (also the band of the metric rollout/is_ratio_outside_frac)", ge=0, le=1)
    high: float = f(2.0, "MIS band upper end (also the band of the metric rollout/is_ratio_outside_frac)", ge=1)


@dataclass(frozen=True)
class OverlongConfig:
    cache_len: int = f(0, "DAPO soft overlong penalty over the last cache_len tokens before "
                          "generation.max_new_tokens (linear to -penalty at the limit); 0 = off", ge=0)
    penalty: float = f(1.0, "size of the overlong penalty at the limit (added to the score before normalisation)",
                       ge=0)
    filter: bool = f(False, "DAPO overlong filtering: responses cut at max_new_tokens leave every loss")


@dataclass(frozen=True)
class DynamicSamplingConfig:
    enabled: bool = f(False, "DAPO dynamic sampling: draw more prompts and keep only groups whose rewards differ "
                             "until rollout_batch_size groups are kept (group estimators)")
    max_draws: int = f(4, "most rollout batches drawn per step; at the cap the batch is filled with tied groups", ge=1)


@dataclass(frozen=True)
class OnlineAlgoConfig:
    advantage: str = f("gae", "gae (PPO) | grpo | dr_grpo | rloo | reinforce_pp")
    num_generations: int = f(1, "completions per prompt (k); group estimators need k >= 2", ge=1)
    rollout_batch_size: int = f(16, "prompts per rollout step (times num_generations responses)", ge=1)
    ppo_epochs: int = f(2, "passes over each rollout batch", ge=1)
    mini_batch_size: int = f(16, "responses per optimizer update (split in micro-batches of train.batch_size)",
                             ge=1)
    clip_low: float = f(0.2, "PPO clip range below 1", gt=0, lt=1)
    clip_high: float | None = f(None, "PPO clip range above 1; null = clip_low (asymmetric as in DAPO)", gt=0)
    value_clip: float | None = f(0.2, "value clipping range; null = off", gt=0)
    vf_coef: float = f(0.5, "value-loss weight (critic has its own optimizer; scales its loss)", ge=0)
    entropy_coef: float = f(0.0, "entropy bonus coefficient")
    gamma: float = f(1.0, "GAE discount", ge=0, le=1)
    lam: float = f(0.95, "GAE lambda", ge=0, le=1)
    whiten_advantages: bool = f(True, "normalise advantages over the batch")
    loss_aggregation: str = f("token_mean", "token_mean | seq_mean_token_mean | seq_mean_token_sum_norm")
    policy_loss: str = f("ppo", "policy loss (see `algos.POLICY_LOSSES`): ppo (token ratio, clipped) | gspo "
                                "(sequence ratio, length-normalised, clipped per sequence) | gspo_token")
    filter_tied_groups: bool = f(False, "drop groups whose rewards all tie (no learning signal)")
    kl: KLConfig = f(KLConfig(), "KL control to the reference model")
    overlong: OverlongConfig = f(OverlongConfig(), "DAPO overlong reward shaping and filtering")
    dynamic_sampling: DynamicSamplingConfig = f(DynamicSamplingConfig(), "DAPO dynamic sampling")
    off_policy: OffPolicyConfig = f(OffPolicyConfig(), "correction for the gap between the rollout engine's sampling "
                                    "log-probs and the trainer's (metrics rollout/* are always logged)")
    total_episodes: int = f(1024, "responses to generate over the whole run", ge=1)


@dataclass(frozen=True)
class EnvConfig:
    name: str | None = f(None, "multi-turn environment: null = single-turn (reward model / functions) | calculator "
                               "(built-in) | package.module:Class | path/to/file.py:Class")
    kwargs: dict[str, Any] = f({}, "keyword arguments of the environment class")
    max_turns: int = f(4, "most assistant turns per episode", ge=1)
    max_total_tokens: int = f(256, "most tokens per episode after the first prompt (model + environment)", ge=1)


@dataclass(frozen=True)
class CriticConfig:
    init: str = f("reward", "reward (from the reward model, DeepSpeed-Chat) | policy (from the policy)")
    model: str | None = f(None, "explicit critic initialisation directory (overrides init)")
    lr: float = f(1e-5, "critic learning rate", ge=0)


@dataclass(frozen=True)
class MemoryConfig:
    offload_reference: bool = f(False, "keep the reference model on CPU between uses")
    offload_reward: bool = f(False, "keep the reward model on CPU between uses")


@dataclass(frozen=True)
class PreferenceAlgoConfig:
    loss: str = f("dpo", "dpo | ipo | cdpo | simpo | orpo | kto")
    beta: float = f(0.1, "inverse temperature beta (SimPO: reward scale)", gt=0)
    label_smoothing: float = f(0.0, "conservative DPO: assumed fraction of flipped labels", ge=0, lt=0.5)
    simpo_gamma: float = f(0.5, "SimPO target reward margin gamma", ge=0)
    orpo_lambda: float = f(0.1, "ORPO weight of the odds-ratio term", ge=0)
    kto_desirable_weight: float = f(1.0, "KTO weight of desirable examples", gt=0)
    kto_undesirable_weight: float = f(1.0, "KTO weight of undesirable examples", gt=0)
    reference: str = f("precompute", "precompute (once, cached in the run) | on_the_fly")


# ─────────────────────────────────────────────── cross-field checks ───────────────────────────────────────────
# Each recipe config has ``check()``, called once by :func:`build_config`: combinations of keys that cannot work
# are errors here, before anything loads. ``check_inputs()`` says whether a run has what it needs (data, a reward);
# the runners call it first (``config show`` prints configs that are consistent but not yet runnable). Only checks
# that need the data (sizes) stay in the trainers.


def check_output_dir(path: str) -> None:
    """``output_dir`` must be a directory that can be created and written (checked before anything loads)."""
    import os

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
    import tempfile

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
    if cfg.model.lora.qlora and not cfg.model.lora.enabled:
        raise ConfigError("model.lora.qlora trains LoRA adapters on a 4-bit base", where="model.lora.qlora",
                          fix="also set model.lora.enabled=true")
    if cfg.model.lora.qlora:
        import importlib.util

        import torch

        if not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
            raise ConfigError("model.lora.qlora loads the base model in 4-bit, which needs a CUDA GPU and the "
                              "bitsandbytes package", where="model.lora.qlora",
                              fix="set model.lora.qlora=false (plain LoRA), or run on a GPU with bitsandbytes")
    if not cfg.model.name.strip():
        raise ConfigError("'model.name' is empty", where="model.name",
                          fix="give a model directory, a .gguf file, a cached hub name, or tiny")
    d = cfg.data
    for key in ("split", "eval_split"):
        if getattr(d, key):
            from .data import parse_split
            from .errors import DataError

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
    from .track.trackers import check_backends

    check_backends(cfg.track.backends)  # unknown tracker or missing package: part of the config, like fp16 on CPU
    _check_distributed(cfg)


def _is_tiny(name: str) -> bool:
    return name == "tiny" or name.startswith("tiny:")


def _check_data_format(cfg, *allowed: str) -> None:
    if cfg.data.format not in ("auto", *allowed):
        raise ConfigError(f"the {cfg.recipe} recipe reads {' or '.join(allowed)} records, not {cfg.data.format}",
                          where="data.format", fix=f"set data.format=auto (or {allowed[0]})")


def _check_model_source(name: str | None, key: str) -> None:
    """A local model path that does not exist, or a directory that holds no model, named before anything loads
    (hub-style ``org/name`` and ``tiny`` are left to the loader, which reads only the local cache)."""
    if not name or _is_tiny(name):
        return
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
    import os

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
        from . import algos

        if hasattr(algo, "advantage") and algos.ADVANTAGE_ESTIMATORS[algo.advantage].needs_critic:
            raise ConfigError("distributed.strategy=deepspeed trains one model; PPO's critic is a second one",
                              where="distributed.strategy", fix="use fsdp2 for PPO, or a critic-free estimator")


def _inputs_distributed(cfg) -> None:
    """What the chosen strategy needs from this machine, checked before any weight loads."""
    import importlib.util

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
    from . import algos

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
    batch = algo.rollout_batch_size * algo.num_generations
    if batch % algo.mini_batch_size or algo.mini_batch_size % cfg.train.batch_size:
        raise ConfigError(
            f"rollout batch {batch} (= rollout_batch_size x num_generations) must split into mini-batches of "
            f"{algo.mini_batch_size}, and those into micro-batches of train.batch_size={cfg.train.batch_size}",
            where="algo.mini_batch_size", fix="choose divisors")
    for i, fn in enumerate(cfg.reward.functions):
        if not fn.fn.strip():
            raise ConfigError(f"reward.functions[{i}] names no function", where=f"reward.functions[{i}].fn",
                              fix="give fn: package.module:function, file.py:function or a built-in name")
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
    if algo.dynamic_sampling.enabled and not est.group_based:
        raise ConfigError(f"dynamic sampling keeps groups whose rewards differ; {algo.advantage} has no groups",
                          where="algo.dynamic_sampling.enabled",
                          fix="use a group estimator (algo.advantage=grpo, dr_grpo or rloo) or disable it")
    if algo.kl.adaptive and algo.kl.coef == 0:
        raise ConfigError("the adaptive KL controller cannot move a coefficient of 0", where="algo.kl.coef",
                          fix="give an initial algo.kl.coef > 0")


def _inputs_common(cfg) -> None:

    _inputs_distributed(cfg)
    if not cfg.data.train:
        raise ConfigError("no training data given", where="data.train",
                          fix="set data.train=path/to/file.jsonl (see `rlhfkit data make quickstart --out data/`)")
    _check_chat_template(cfg.model.chat_template)
    _check_model_source(cfg.model.name, "model.name")
    _check_model_source(getattr(cfg, "ref_model", None), "ref_model")


def _check_chat_template(template: str | None) -> None:
    """A chat template is Jinja text or the path of a file holding it; text without any Jinja tag that names no
    existing file is a mistyped path (it would otherwise become the template itself)."""
    if template and "{" not in template and not Path(template).expanduser().is_file():
        raise ConfigError(f"model.chat_template file not found: {template}", where="model.chat_template",
                          fix="give the path of an existing template file, or the Jinja template text itself")


def _inputs_online(cfg) -> None:
    from . import algos

    _inputs_common(cfg)
    if cfg.env.name:
        from .envs import load_environment

        load_environment(cfg.env.name)  # an unloadable environment stops the run here, before any weights load
    if cfg.reward.model is None and not cfg.reward.functions and not cfg.env.name:
        raise ConfigError("no reward: give a reward model or reward functions", where="reward",
                          fix="set reward.model=runs/rm, reward.functions=[{fn: exact_match}] or env.name")
    est = algos.ADVANTAGE_ESTIMATORS[cfg.algo.advantage]
    if est.needs_critic and cfg.critic.model is None and cfg.critic.init == "reward" and cfg.reward.model is None:
        raise ConfigError("critic.init=reward needs reward.model", where="critic.init",
                          fix="set critic.init=policy, or give reward.model")
    _check_model_source(cfg.reward.model, "reward.model")
    if est.needs_critic:
        _check_model_source(cfg.critic.model, "critic.model")


def _check_preference(cfg) -> None:
    from . import algos

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


# ─────────────────────────────────────────────────── recipes ──────────────────────────────────────────────────


@dataclass(frozen=True)
class SFTConfig:
    recipe: str = f("sft", "recipe name")
    output_dir: str = f("runs/sft", "run directory (checkpoints, metrics, final model)")
    model: ModelConfig = f(ModelConfig(), "policy model")
    data: DataConfig = f(DataConfig(), "data")
    optim: OptimConfig = f(OptimConfig(lr=2e-5), "optimizer")
    train: TrainConfig = f(TrainConfig(), "loop")
    track: TrackConfig = f(TrackConfig(), "tracking")
    distributed: DistributedConfig = f(DistributedConfig(), "multi-device strategy (see `rlhfkit plan`)")

    def check(self) -> None:
        _check_common(self)
        _check_data_format(self, "sft")

    def check_inputs(self) -> None:
        _inputs_common(self)


@dataclass(frozen=True)
class RewardModelConfig:
    recipe: str = f("rm", "recipe name")
    output_dir: str = f("runs/rm", "run directory")
    model: ModelConfig = f(ModelConfig(), "model the reward model is initialised from (a causal LM)")
    data: DataConfig = f(DataConfig(format="preference"), "preference pairs")
    optim: OptimConfig = f(OptimConfig(lr=1e-5), "optimizer")
    train: TrainConfig = f(TrainConfig(), "loop")
    track: TrackConfig = f(TrackConfig(), "tracking")
    distributed: DistributedConfig = f(DistributedConfig(), "multi-device strategy (see `rlhfkit plan`)")
    rm: RMConfig = f(RMConfig(), "reward-model loss")

    def check(self) -> None:
        _check_common(self)
        _check_data_format(self, "preference")

    def check_inputs(self) -> None:
        _inputs_common(self)


@dataclass(frozen=True)
class OnlineConfig:
    recipe: str = f("ppo", "ppo | grpo | rloo | reinforce")
    output_dir: str = f("runs/ppo", "run directory")
    model: ModelConfig = f(ModelConfig(), "policy (actor)")
    ref_model: str | None = f(None, "reference model; null = the initial policy (LoRA: adapter disabled)")
    data: DataConfig = f(DataConfig(format="prompt"), "prompts (extra fields go to reward functions)")
    optim: OptimConfig = f(OptimConfig(lr=1e-6, schedule="constant"), "actor optimizer")
    train: TrainConfig = f(TrainConfig(), "loop (batch_size = micro-batch of forward/backward)")
    track: TrackConfig = f(TrackConfig(), "tracking")
    distributed: DistributedConfig = f(DistributedConfig(), "multi-device strategy (see `rlhfkit plan`)")
    generation: GenerationConfig = f(GenerationConfig(), "rollout sampling")
    reward: RewardConfig = f(RewardConfig(), "reward model and / or functions")
    algo: OnlineAlgoConfig = f(OnlineAlgoConfig(), "PPO / GRPO / RLOO / REINFORCE++")
    critic: CriticConfig = f(CriticConfig(), "value model (PPO only)")
    memory: MemoryConfig = f(MemoryConfig(), "memory savers")
    env: EnvConfig = f(EnvConfig(), "multi-turn environment (tool calls); its rewards add to the reward's")

    def check(self) -> None:
        _check_online(self)

    def check_inputs(self) -> None:
        _inputs_online(self)


@dataclass(frozen=True)
class PreferenceConfig:
    recipe: str = f("dpo", "dpo | ipo | kto | simpo | orpo")
    output_dir: str = f("runs/dpo", "run directory")
    model: ModelConfig = f(ModelConfig(), "policy")
    ref_model: str | None = f(None, "reference model; null = the initial policy (LoRA: adapter disabled)")
    data: DataConfig = f(DataConfig(format="preference"), "preference pairs (KTO: unpaired or pairs)")
    optim: OptimConfig = f(OptimConfig(lr=5e-7), "optimizer")
    train: TrainConfig = f(TrainConfig(), "loop")
    track: TrackConfig = f(TrackConfig(), "tracking")
    distributed: DistributedConfig = f(DistributedConfig(), "multi-device strategy (see `rlhfkit plan`)")
    algo: PreferenceAlgoConfig = f(PreferenceAlgoConfig(), "preference loss")

    def check(self) -> None:
        _check_preference(self)

    def check_inputs(self) -> None:
        _inputs_common(self)


@dataclass(frozen=True)
class PipelineConfig:
    recipe: str = f("pipeline", "recipe name")
    output_dir: str = f("runs/pipeline", "pipeline directory; each stage writes a subdirectory")
    task: str | None = f(None, "built-in task whose data is generated first (quickstart); null = your data")
    task_size: int = f(2000, "records per generated file", ge=1)
    eval_prompts: int = f(200, "held-out prompts for the gold metric (built-in task)", ge=1)
    base_model: str = f("tiny", "model the first stage starts from")
    stages: list[dict[str, Any]] = f([], "ordered stages: {name, recipe, overrides of that recipe's config}")

    def check(self) -> None:
        check_output_dir(self.output_dir)

    def check_inputs(self) -> None:
        if not self.stages:
            raise ConfigError("the pipeline has no stages", where="stages",
                              fix="list stages, see configs/pipeline.yaml")


# ─────────────────────────────────────────────── the recipe table ─────────────────────────────────────────────
# The one list of recipes: the CLI's commands, config building and the pipeline all read it. A new recipe is one
# entry here (plus its runner and its config class when it needs a new one).

_PAIRS = {"train": "preference.jsonl", "eval": "eval_preference.jsonl"}
_PROMPTS = {"train": "prompts.jsonl", "eval": "eval_prompts.jsonl"}


@dataclass(frozen=True)
class Recipe:
    """One recipe: its command name, config class, defaults layered under the YAML, runner, family.

    family: supervised | reward | online | preference | pipeline. ``makes_policy``: its output is a policy the next
    pipeline stage starts from. ``task_files``: the built-in task's data files for ``data.*`` (pipelines with a task).
    ``runner`` is ``module:function`` (imported only when the recipe runs, so ``--help`` does not import torch).
    """

    name: str
    config: type
    family: str
    runner: str
    description: str
    defaults: dict = field(default_factory=dict)
    makes_policy: bool = False
    task_files: dict = field(default_factory=dict)

    def run(self, cfg):
        import importlib

        module, fn = self.runner.split(":")
        return getattr(importlib.import_module(module), fn)(cfg)


_ONLINE_RUNNER = "rlhfkit.train.online:run_online"
_PREFERENCE_RUNNER = "rlhfkit.train.preference:run_preference"
_NO_NORMALIZE = {"reward": {"normalize": False}}

RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("sft", SFTConfig, "supervised", "rlhfkit.train.sft:run_sft", "supervised fine-tuning on demonstrations",
           makes_policy=True, task_files={"train": "sft.jsonl"}),
    Recipe("rm", RewardModelConfig, "reward", "rlhfkit.train.reward:run_rm",
           "train a reward model on preference pairs (Bradley-Terry)", task_files=_PAIRS),
    Recipe("ppo", OnlineConfig, "online", _ONLINE_RUNNER, "online RL with PPO (critic + GAE)",
           {"output_dir": "runs/ppo"}, makes_policy=True, task_files=_PROMPTS),
    Recipe("grpo", OnlineConfig, "online", _ONLINE_RUNNER, "online RL with GRPO (group-normalised advantages)",
           {"output_dir": "runs/grpo", "reward": {"normalize": False},
            "algo": {"advantage": "grpo", "num_generations": 4, "loss_aggregation": "seq_mean_token_mean",
                     "whiten_advantages": False, "kl": {"estimator": "k3", "coef": 0.04}}},
           makes_policy=True, task_files=_PROMPTS),
    Recipe("rloo", OnlineConfig, "online", _ONLINE_RUNNER, "online RL with RLOO (leave-one-out baseline)",
           {"output_dir": "runs/rloo", **_NO_NORMALIZE,
            "algo": {"advantage": "rloo", "num_generations": 4, "whiten_advantages": False}},
           makes_policy=True, task_files=_PROMPTS),
    Recipe("reinforce", OnlineConfig, "online", _ONLINE_RUNNER, "online RL with REINFORCE++",
           {"output_dir": "runs/reinforce", **_NO_NORMALIZE,
            "algo": {"advantage": "reinforce_pp", "whiten_advantages": False}},
           makes_policy=True, task_files=_PROMPTS),
    Recipe("dpo", PreferenceConfig, "preference", _PREFERENCE_RUNNER, "offline preference optimisation: DPO",
           {"output_dir": "runs/dpo", "algo": {"loss": "dpo"}}, makes_policy=True, task_files=_PAIRS),
    Recipe("ipo", PreferenceConfig, "preference", _PREFERENCE_RUNNER, "offline preference optimisation: IPO",
           {"output_dir": "runs/ipo", "algo": {"loss": "ipo"}}, makes_policy=True, task_files=_PAIRS),
    Recipe("kto", PreferenceConfig, "preference", _PREFERENCE_RUNNER,
           "offline preference optimisation: KTO (unpaired)",
           {"output_dir": "runs/kto", "algo": {"loss": "kto"}, "data": {"format": "unpaired"}},
           makes_policy=True, task_files={"train": "unpaired.jsonl", "eval": "eval_preference.jsonl"}),
    Recipe("simpo", PreferenceConfig, "preference", _PREFERENCE_RUNNER, "offline preference optimisation: SimPO",
           {"output_dir": "runs/simpo", "algo": {"loss": "simpo", "beta": 2.0}}, makes_policy=True,
           task_files=_PAIRS),
    Recipe("orpo", PreferenceConfig, "preference", _PREFERENCE_RUNNER, "offline preference optimisation: ORPO",
           {"output_dir": "runs/orpo", "algo": {"loss": "orpo"}}, makes_policy=True, task_files=_PAIRS),
    Recipe("pipeline", PipelineConfig, "pipeline", "rlhfkit.pipeline:run_pipeline",
           "run several stages in order (e.g. SFT -> RM -> PPO)"),
)}

# Choices of string keys. Those of a registry (estimators, losses, engines, ...) are read from the registry itself
# when a config is built, so a new registered variant is a valid value without touching this file.
STATIC_CHOICES: dict[str, tuple[str, ...]] = {
    "model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "data.format": ("auto", "sft", "preference", "prompt", "unpaired"),
    "data.overflow": ("truncate", "drop", "error"),
    "optim.schedule": ("linear", "cosine", "constant"),
    "train.mixed_precision": ("auto", "no", "bf16", "fp16"),
    "algo.kl.placement": ("auto", "reward", "loss"),
    "algo.reference": ("precompute", "on_the_fly"),
    "critic.init": ("reward", "policy"),
    "algo.off_policy.level": ("token", "sequence"),
    "distributed.strategy": ("ddp", "fsdp2", "deepspeed"),
}


def registry_choices() -> dict[str, tuple[str, ...]]:
    """Choices read from the registries of ``algos`` and ``rollout`` (imported here, lazily: they import torch)."""
    from . import algos
    from .rollout import ENGINES

    return {
        "generation.engine": tuple(ENGINES),
        "algo.advantage": tuple(algos.ADVANTAGE_ESTIMATORS),
        "algo.loss_aggregation": tuple(algos.LOSS_AGGREGATIONS),
        "algo.kl.estimator": tuple(algos.KL_ESTIMATORS),
        "algo.loss": tuple(algos.PREFERENCE_LOSSES),
        "algo.policy_loss": tuple(algos.POLICY_LOSSES),
        "algo.off_policy.correction": tuple(algos.OFF_POLICY_CORRECTIONS),
    }


def choices_of(path: str) -> tuple[str, ...] | None:
    """The allowed values of the string key ``path`` (None: free text)."""
    if path in STATIC_CHOICES:
        return STATIC_CHOICES[path]
    if path in _REGISTRY_KEYS:
        return registry_choices()[path]
    return None


_REGISTRY_KEYS = ("generation.engine", "algo.advantage", "algo.loss_aggregation", "algo.kl.estimator", "algo.loss",
                  "algo.policy_loss", "algo.off_policy.correction")

# Flat names users bring from TRL / transformers, accepted at the top level of a config or command line
# (logged once: "learning_rate -> optim.lr"). Per family where the meaning differs (beta).
ALIASES: dict[str, str] = {
    "learning_rate": "optim.lr",
    "lr": "optim.lr",
    "weight_decay": "optim.weight_decay",
    "warmup_ratio": "optim.warmup_ratio",
    "warmup_steps": "optim.warmup_steps",
    "lr_scheduler_type": "optim.schedule",
    "max_grad_norm": "optim.max_grad_norm",
    "per_device_train_batch_size": "train.batch_size",
    "per_device_eval_batch_size": "train.eval_batch_size",
    "gradient_accumulation_steps": "train.grad_accum",
    "num_train_epochs": "train.epochs",
    "max_steps": "train.max_steps",
    "seed": "train.seed",
    "logging_steps": "train.log_every",
    "save_steps": "train.save_every",
    "eval_steps": "train.eval_every",
    "save_total_limit": "train.save_total_limit",
    "resume_from_checkpoint": "train.resume",
    "gradient_checkpointing": "model.gradient_checkpointing",
    "model_name_or_path": "model.name",
    "use_peft": "model.lora.enabled",
    "lora_r": "model.lora.r",
    "lora_alpha": "model.lora.alpha",
    "lora_dropout": "model.lora.dropout",
    "lora_target_modules": "model.lora.target_modules",
    "dataset_name": "data.train",
    "max_length": "data.max_length",
    "max_prompt_length": "data.max_prompt_length",
    "report_to": "track.backends",
    "max_completion_length": "generation.max_new_tokens",
    "max_new_tokens": "generation.max_new_tokens",
    "temperature": "generation.temperature",
    "num_generations": "algo.num_generations",
    "num_ppo_epochs": "algo.ppo_epochs",
    "num_iterations": "algo.ppo_epochs",
    "epsilon": "algo.clip_low",
    "cliprange": "algo.clip_low",
}
_FAMILY_ALIASES: dict[str, dict[str, str]] = {
    "online": {"beta": "algo.kl.coef", "kl_coef": "algo.kl.coef"},
    "preference": {"beta": "algo.beta"},
}


def alias_of(key: str, recipe: str) -> str | None:
    """The rlhfkit key a TRL-style flat name stands for in ``recipe`` (None: not an alias)."""
    family = RECIPES[recipe].family if recipe in RECIPES else ""
    return _FAMILY_ALIASES.get(family, {}).get(key) or ALIASES.get(key)


# ─────────────────────────────────────────────────── building ─────────────────────────────────────────────────


def _did_you_mean(key: str, options: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, options, n=1, cutoff=0.5)
    if close:
        return f"did you mean '{prefix}{close[0]}'?"
    return f"valid keys: {', '.join(prefix + o for o in sorted(options))}"


def _is_optional(tp) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def _coerce(value: Any, tp, path: str, source: str):
    """Check / convert ``value`` to type ``tp`` or raise ConfigError naming ``path``."""
    optional, tp = _is_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"'{path}' may not be null", where=source, fix=f"give a value for {path}")
    where = source

    def bad(expected: str):
        return ConfigError(
            f"'{path}' must be {expected}, got {type(value).__name__} {value!r}", where=where,
            fix=f"set {path} to {expected}",
        )

    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        if not isinstance(value, dict):
            raise bad("a mapping")
        return _build(tp, value, path, source)
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise bad("true or false")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise bad("an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    raise bad("a number") from None
            else:
                raise bad("a number")
        value = float(value)
        if not math.isfinite(value):
            raise bad("a finite number")
        return value
    if tp is str:
        if isinstance(value, bool) and ("no" if not value else "yes") in (choices_of(path) or ()):
            return "no" if not value else "yes"  # YAML 1.1 reads `no` as false: train.mixed_precision=no
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str) and item_tp is str:  # track.backends=tensorboard or =jsonl,wandb
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise bad("a list")
        return [_coerce(v, item_tp, f"{path}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise bad("a mapping")
        return {str(k): _coerce(v, val_tp, f"{path}.{k}", source) for k, v in value.items()}
    raise TypeError(f"unsupported config type {tp} at {path}")


_BOUNDS = {"ge": (lambda v, b: v >= b, ">="), "gt": (lambda v, b: v > b, ">"), "le": (lambda v, b: v <= b, "<="),
           "lt": (lambda v, b: v < b, "<")}


def _check_bounds(value, meta, path: str, source: str) -> None:
    """Numbers (and lists of numbers) against the field's ``ge`` / ``gt`` / ``le`` / ``lt`` bounds."""
    items = value if isinstance(value, list) else [value]
    for v in items:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        for key, (ok, _) in _BOUNDS.items():
            if key in meta and not ok(v, meta[key]):
                limits = " and ".join(f"{s} {meta[k]}" for k, (_, s) in _BOUNDS.items() if k in meta)
                raise ConfigError(f"'{path}' must be {limits}, got {v!r}", where=source,
                                  fix=f"set {path} to a value {limits}")


def _build(cls, data: dict, prefix: str, source: str, base=None):
    """``cls`` with the keys of ``data`` set on top of ``base`` (default: the class defaults). Nested sections start
    from the parent's default for that field, so a recipe's own defaults survive a partial override."""
    base = base if base is not None else cls()
    hints = typing.get_type_hints(cls)
    fields_by_name = {fl.name: fl for fl in dataclasses.fields(cls)}
    names = list(fields_by_name)
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(
                f"unknown key '{path}'", where=source,
                fix=_did_you_mean(str(key), names, f"{prefix}." if prefix else ""),
            )
        current = getattr(base, key)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            kwargs[key] = _build(type(current), value, path, source, base=current)
            continue
        coerced = _coerce(value, hints[key], path, source)
        _check_bounds(coerced, fields_by_name[key].metadata, path, source)
        choices = choices_of(path)
        if choices is not None and coerced not in choices:
            raise ConfigError(
                f"'{path}' must be one of {', '.join(choices)}, got {coerced!r}", where=source,
                fix=_did_you_mean(str(coerced), list(choices)),
            )
        kwargs[key] = coerced
    return dataclasses.replace(base, **kwargs)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in ("fields", "kwargs"):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=1e-4`` -> (["a", "b"], 1e-4); values are parsed as YAML (numbers, bools, lists, null)."""
    key, eq, raw = text.partition("=")
    key = key.strip().lstrip("-").replace("-", "_") if key.startswith("--") else key.strip()
    if not eq or not key:
        raise ConfigError(f"bad override {text!r}", where="command line", fix="write key.sub=value, e.g. optim.lr=1e-5")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, float) is False and isinstance(raw, str) and _looks_like_sci(raw):
        value = float(raw)
    if isinstance(value, (dict, list)) and not raw.strip().startswith(("{", "[")):
        value = raw  # e.g. output_dir=runs/a: b is a path, not a mapping
    return key.split("."), value


def _looks_like_sci(raw: str) -> bool:
    # YAML 1.1 reads "1e-5" as a string; users mean a number.
    try:
        float(raw)
    except ValueError:
        return False
    return any(c in raw.lower() for c in "e") and not raw.strip().lower().startswith(("inf", "nan"))


def _set_path(tree: dict, keys: list[str], value: Any) -> None:
    node = tree
    for k in keys[:-1]:
        nxt = node.get(k)
        if not isinstance(nxt, dict):
            nxt = {}
            node[k] = nxt
        node = nxt
    node[keys[-1]] = value


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}", where=str(p), fix="check the path (see configs/ for examples)")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        raise ConfigError(f"invalid YAML ({getattr(exc, 'problem', exc)})", where=where,
                          fix="fix the YAML syntax") from None
    if not isinstance(data, dict):
        raise ConfigError("a config file must be a mapping of keys", where=str(p), fix="see configs/ for examples")
    return _fix_sci(data)


def _fix_sci(node):
    if isinstance(node, dict):
        return {k: _fix_sci(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_fix_sci(v) for v in node]
    if isinstance(node, str) and _looks_like_sci(node) and node.strip()[0] in "0123456789.-+":
        return float(node)
    return node


def _apply_aliases(tree: dict, recipe: str, source: str) -> dict:
    """Top-level TRL-style flat names moved to the rlhfkit keys they stand for (logged once each)."""
    names = {fl.name for fl in dataclasses.fields(RECIPES[recipe].config)}
    out = dict(tree)
    for key in list(out):
        target = None if key in names else alias_of(str(key), recipe)
        if target is None:
            continue
        value = out.pop(key)
        keys = target.split(".")
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {}) if isinstance(node.get(k, {}), dict) else node
        if keys[-1] in node and node[keys[-1]] != value and isinstance(node, dict):
            raise ConfigError(f"'{key}' and '{target}' are both set, to different values", where=source,
                              fix=f"keep only {target}")
        node[keys[-1]] = value
        _log_alias(key, target)
    return out


_ALIASES_LOGGED: set[str] = set()
_ALIASES_PENDING: list[tuple[str, str]] = []


def _log_alias(key: str, target: str) -> None:
    """Note an alias; printed by :func:`_flush_aliases` once the config is valid (a config error stays the one line
    on stderr)."""
    if key not in _ALIASES_LOGGED and (key, target) not in _ALIASES_PENDING:
        _ALIASES_PENDING.append((key, target))


def _flush_aliases() -> None:
    import sys

    for key, target in _ALIASES_PENDING:
        _ALIASES_LOGGED.add(key)
        print(f"[config] {key} -> {target}", file=sys.stderr)
    _ALIASES_PENDING.clear()


def build_config(recipe: str, data: dict | None = None, overrides: list[str] | tuple[str, ...] = (),
                 source: str = "config"):
    """Build, validate (types, bounds, choices, then the recipe's cross-field ``check()``) and freeze the config of
    ``recipe`` from a mapping plus dotted overrides."""
    if recipe not in RECIPES:
        raise ConfigError(f"unknown recipe '{recipe}'", where="recipe", fix=_did_you_mean(recipe, list(RECIPES)))
    spec = RECIPES[recipe]
    _ALIASES_PENDING.clear()
    data = _apply_aliases(_copy(data or {}), recipe, source)
    tree = _merge(_copy(spec.defaults), data)  # never mutate shared defaults
    file_recipe = tree.get("recipe", recipe)
    if file_recipe not in RECIPES or RECIPES[file_recipe].config is not spec.config:
        raise ConfigError(
            f"this config is for recipe '{file_recipe}', not '{recipe}'", where=f"{source}: recipe",
            fix=f"run `rlhfkit {file_recipe} ...` or use a {recipe} config",
        )
    tree["recipe"] = recipe if data.get("recipe") is None else file_recipe
    for item in overrides:
        keys, value = parse_override(item)
        if len(keys) == 1 and keys[0] not in {fl.name for fl in dataclasses.fields(spec.config)}:
            target = alias_of(keys[0], recipe)
            if target is not None:
                _log_alias(keys[0], target)
                keys = target.split(".")
        _set_path(tree, keys, value)
    src = source if not overrides else f"{source} + overrides"
    cfg = _build(spec.config, tree, "", src)
    cfg.check()
    _flush_aliases()
    return cfg


def load_config(recipe: str, path: str | Path | None, overrides=()):
    """Read ``path`` (may be None) and build ``recipe``'s config."""
    data = read_yaml(path) if path else {}
    return build_config(recipe, data, overrides, source=str(path) if path else "defaults")


def replace(cfg, **changes):
    """A changed copy (configs are frozen); nested sections as dicts of changes, e.g. train={"seed": 1}."""
    kwargs = {}
    for key, value in changes.items():
        cur = getattr(cfg, key)
        if dataclasses.is_dataclass(cur) and isinstance(value, dict):
            kwargs[key] = replace(cur, **value)
        else:
            kwargs[key] = value
    return dataclasses.replace(cfg, **kwargs)


def dump_yaml(cfg, comments: bool = True) -> str:
    """YAML text of ``cfg`` with each key's help string as a trailing comment."""
    lines: list[str] = []

    def emit(obj, indent: int):
        for fl in dataclasses.fields(obj):
            value = getattr(obj, fl.name)
            help_text = fl.metadata.get("help", "")
            pad = "  " * indent
            if dataclasses.is_dataclass(value):
                lines.append(f"{pad}{fl.name}:" + (f"  # {help_text}" if comments and help_text else ""))
                emit(value, indent + 1)
                continue
            if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
                value = [dataclasses.asdict(v) for v in value]
            text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
            if text.endswith("\n...") or text.endswith("..."):
                text = text.replace("\n...", "").replace("...", "").strip()
            lines.append(f"{pad}{fl.name}: {text}" + (f"  # {help_text}" if comments and help_text else ""))

    emit(cfg, 0)
    return "\n".join(lines) + "\n"


def save_config(cfg, run_dir: str | Path) -> Path:
    """Write the resolved config (with comments) to ``run_dir/config.yaml``."""
    out = Path(run_dir) / "config.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".yaml.tmp")
    tmp.write_text(dump_yaml(cfg))
    tmp.replace(out)
    return out
