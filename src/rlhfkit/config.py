"""Typed configuration: one frozen dataclass per recipe, composed of small shared sections.

A config comes from a YAML file plus dotted overrides (``optim.lr=1e-4``, ``output_dir=runs/x``). Building it
validates every key and type once: unknown keys and wrong types raise :class:`~rlhfkit.errors.ConfigError` with the
key path and a "did you mean" hint. After that the config is frozen; nothing rewrites it. Every field has a help
string (``field(metadata={"help": ...})``) from which the commented YAML files in ``configs/`` are checked.
"""

from __future__ import annotations

import dataclasses
import difflib
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
    r: int = f(16, "LoRA rank")
    alpha: int = f(32, "LoRA scaling numerator (scale = alpha / r)")
    dropout: float = f(0.05, "dropout on the LoRA branch")
    target_modules: list[str] | None = f(None, "module names to adapt; null = chosen per architecture")
    qlora: bool = f(False, "load the base model in 4-bit (needs CUDA and bitsandbytes)")


@dataclass(frozen=True)
class ModelConfig:
    name: str = f("tiny", "HF directory, cached hub name, .gguf file, or tiny[:hidden=..,layers=..]")
    gguf_file: str | None = f(None, "GGUF file name inside `name` (a directory) when loading a GGUF model")
    dtype: str = f("auto", "auto (CUDA: fp32 weights + bf16 autocast when trained, bf16 when frozen or LoRA base; CPU: fp32) | float32 | bfloat16 | float16")
    gradient_checkpointing: bool = f(False, "recompute activations in backward to save memory")
    chat_template: str | None = f(None, "override the tokenizer's chat template (a Jinja string or a file path)")
    lora: LoraConfig = f(LoraConfig(), "LoRA / QLoRA settings")


@dataclass(frozen=True)
class DataConfig:
    train: str | None = f(None, "training data: .jsonl/.json/.parquet/.csv file, a directory, or a datasets name")
    eval: str | None = f(None, "evaluation data (same forms); null = split eval_fraction off the training data")
    split: str | None = f(None, "split / slice of the training source, e.g. train[:500]")
    eval_split: str | None = f(None, "split / slice of the evaluation source")
    eval_fraction: float = f(0.05, "fraction of training records held out for evaluation when eval is null")
    format: str = f("auto", "auto | sft | preference | prompt | unpaired")
    fields: dict[str, str] = f({}, "column mapping, canonical -> yours, e.g. {prompt: question}")
    max_length: int = f(512, "maximum tokens of prompt + completion")
    max_prompt_length: int | None = f(None, "maximum prompt tokens; null = max_length (prompts), max_length/2 (pairs)")
    overflow: str = f("truncate", "over-long prompts: truncate (keep the end) | drop | error; always counted")
    completion_only_loss: bool = f(True, "SFT: train on assistant / completion tokens only")
    packing: bool = f(False, "SFT: pack several examples into each row of max_length")
    limit: int | None = f(None, "use at most this many training records")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = f(1e-5, "peak learning rate")
    weight_decay: float = f(0.0, "AdamW weight decay")
    betas: list[float] = f([0.9, 0.999], "AdamW betas")
    eps: float = f(1e-8, "AdamW epsilon")
    schedule: str = f("linear", "linear | cosine | constant (after warm-up)")
    warmup_ratio: float = f(0.0, "warm-up as a fraction of all optimizer updates")
    warmup_steps: int = f(0, "warm-up in optimizer updates (wins over warmup_ratio when > 0)")
    max_grad_norm: float | None = f(1.0, "gradient clipping norm; null = no clipping")


@dataclass(frozen=True)
class TrainConfig:
    epochs: float = f(1.0, "passes over the training data (fractions allowed)")
    max_steps: int = f(-1, "optimizer updates to run; -1 = derived from epochs")
    batch_size: int = f(8, "micro-batch size per device")
    grad_accum: int = f(1, "micro-batches accumulated per optimizer update")
    eval_batch_size: int | None = f(None, "evaluation micro-batch size; null = batch_size")
    seed: int = f(42, "random seed (data order, initialisation, sampling)")
    eval_every: int = f(0, "evaluate every N optimizer updates; 0 = only at the end")
    save_every: int = f(0, "checkpoint every N optimizer updates; 0 = only the final model")
    save_total_limit: int = f(2, "checkpoints kept (older ones deleted)")
    resume: str = f("auto", "auto (latest checkpoint in output_dir) | never | path to a checkpoint-N directory")
    log_every: int = f(1, "log metrics every N optimizer updates")
    mixed_precision: str = f("auto", "auto (bf16 on CUDA, none on CPU) | no | bf16 | fp16")


@dataclass(frozen=True)
class TrackConfig:
    backends: list[str] = f(["jsonl"], "metric sinks: jsonl (always) + tensorboard | wandb")
    sample_every: int = f(10, "print and save a table of samples every N steps (online recipes)")
    progress: bool = f(True, "show a progress bar with ETA")
    report: bool = f(True, "write report.html at the end of the run")


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = f(64, "maximum response tokens (a response usually ends earlier, at EOS)")
    min_new_tokens: int = f(0, "minimum response tokens; 0 = never force length")
    temperature: float = f(1.0, "sampling temperature (0 = greedy); keep 1.0 for on-policy RL")
    top_p: float = f(1.0, "nucleus sampling; 1.0 = off")
    top_k: int = f(0, "top-k sampling; 0 = off")
    stop_strings: list[str] = f([], "extra strings that end a response (EOS always does)")
    engine: str = f("hf", "rollout engine: hf (transformers.generate)")
    batch_size: int | None = f(None, "generation micro-batch; null = whole rollout batch")


# ─────────────────────────────────────────────── recipe sections ──────────────────────────────────────────────


@dataclass(frozen=True)
class RMConfig:
    margin_field: str | None = f(None, "record field holding a per-pair margin (Llama 2); null = no margin")
    center_coef: float = f(0.0, "reward-centering coefficient: adds coef * mean((r_c + r_r)^2)")


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
    missing_eos_penalty: float | None = f(1.0, "subtracted from the score of responses that never ended")
    clip: float | None = f(10.0, "clip scores to [-clip, clip] after the penalty; null = off")
    normalize: bool = f(True, "normalise scores by running mean / std (keeps critic targets bounded)")
    batch_size: int = f(16, "reward-model scoring micro-batch")


@dataclass(frozen=True)
class KLConfig:
    coef: float = f(0.05, "KL coefficient (initial value when adaptive)")
    estimator: str = f("k1", "per-token KL estimator: k1 (log-ratio) | k2 | k3")
    placement: str = f("reward", "reward (subtract from per-token reward) | loss (add to the policy loss)")
    adaptive: bool = f(False, "Ziegler et al. (2019) adaptive coefficient towards `target`")
    target: float = f(6.0, "target sequence KL for the adaptive controller")
    horizon: int = f(10000, "adaptive controller horizon in episodes")


@dataclass(frozen=True)
class OnlineAlgoConfig:
    advantage: str = f("gae", "gae (PPO) | grpo | dr_grpo | rloo | reinforce_pp")
    num_generations: int = f(1, "completions per prompt (k); group estimators need k >= 2")
    rollout_batch_size: int = f(16, "prompts per rollout step (times num_generations responses)")
    ppo_epochs: int = f(2, "passes over each rollout batch")
    mini_batch_size: int = f(16, "responses per optimizer update (split in micro-batches of train.batch_size)")
    clip_low: float = f(0.2, "PPO clip range below 1")
    clip_high: float | None = f(None, "PPO clip range above 1; null = clip_low (asymmetric as in DAPO)")
    value_clip: float | None = f(0.2, "value clipping range; null = off")
    vf_coef: float = f(0.5, "value-loss weight (critic has its own optimizer; scales its loss)")
    entropy_coef: float = f(0.0, "entropy bonus coefficient")
    gamma: float = f(1.0, "GAE discount")
    lam: float = f(0.95, "GAE lambda")
    whiten_advantages: bool = f(True, "normalise advantages over the batch")
    loss_aggregation: str = f("token_mean", "token_mean | seq_mean_token_mean | seq_mean_token_sum_norm")
    filter_tied_groups: bool = f(False, "drop groups whose rewards all tie (no learning signal)")
    kl: KLConfig = f(KLConfig(), "KL control to the reference model")
    total_episodes: int = f(1024, "responses to generate over the whole run")


@dataclass(frozen=True)
class CriticConfig:
    init: str = f("reward", "reward (from the reward model, DeepSpeed-Chat) | policy (from the policy)")
    model: str | None = f(None, "explicit critic initialisation directory (overrides init)")
    lr: float = f(1e-5, "critic learning rate")


@dataclass(frozen=True)
class MemoryConfig:
    offload_reference: bool = f(False, "keep the reference model on CPU between uses")
    offload_reward: bool = f(False, "keep the reward model on CPU between uses")


@dataclass(frozen=True)
class PreferenceAlgoConfig:
    loss: str = f("dpo", "dpo | ipo | cdpo | simpo | orpo | kto")
    beta: float = f(0.1, "inverse temperature beta (SimPO: reward scale)")
    label_smoothing: float = f(0.0, "conservative DPO: assumed fraction of flipped labels")
    simpo_gamma: float = f(0.5, "SimPO target reward margin gamma")
    orpo_lambda: float = f(0.1, "ORPO weight of the odds-ratio term")
    kto_desirable_weight: float = f(1.0, "KTO weight of desirable examples")
    kto_undesirable_weight: float = f(1.0, "KTO weight of undesirable examples")
    reference: str = f("precompute", "precompute (once, cached in the run) | on_the_fly")


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


@dataclass(frozen=True)
class RewardModelConfig:
    recipe: str = f("rm", "recipe name")
    output_dir: str = f("runs/rm", "run directory")
    model: ModelConfig = f(ModelConfig(), "model the reward model is initialised from (a causal LM)")
    data: DataConfig = f(DataConfig(format="preference"), "preference pairs")
    optim: OptimConfig = f(OptimConfig(lr=1e-5), "optimizer")
    train: TrainConfig = f(TrainConfig(), "loop")
    track: TrackConfig = f(TrackConfig(), "tracking")
    rm: RMConfig = f(RMConfig(), "reward-model loss")


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
    generation: GenerationConfig = f(GenerationConfig(), "rollout sampling")
    reward: RewardConfig = f(RewardConfig(), "reward model and / or functions")
    algo: OnlineAlgoConfig = f(OnlineAlgoConfig(), "PPO / GRPO / RLOO / REINFORCE++")
    critic: CriticConfig = f(CriticConfig(), "value model (PPO only)")
    memory: MemoryConfig = f(MemoryConfig(), "memory savers")


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
    algo: PreferenceAlgoConfig = f(PreferenceAlgoConfig(), "preference loss")


@dataclass(frozen=True)
class PipelineConfig:
    recipe: str = f("pipeline", "recipe name")
    output_dir: str = f("runs/pipeline", "pipeline directory; each stage writes a subdirectory")
    task: str | None = f(None, "built-in task whose data is generated first (quickstart); null = your data")
    task_size: int = f(2000, "records per generated file")
    eval_prompts: int = f(200, "held-out prompts for the gold metric (built-in task)")
    base_model: str = f("tiny", "model the first stage starts from")
    stages: list[dict[str, Any]] = f([], "ordered stages: {name, recipe, overrides of that recipe's config}")


RECIPES: dict[str, type] = {
    "sft": SFTConfig,
    "rm": RewardModelConfig,
    "ppo": OnlineConfig,
    "grpo": OnlineConfig,
    "rloo": OnlineConfig,
    "reinforce": OnlineConfig,
    "dpo": PreferenceConfig,
    "ipo": PreferenceConfig,
    "kto": PreferenceConfig,
    "simpo": PreferenceConfig,
    "orpo": PreferenceConfig,
    "pipeline": PipelineConfig,
}

# Per-recipe defaults layered under the YAML (so `rlhfkit grpo` without a file is GRPO, not PPO).
RECIPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": {"output_dir": "runs/ppo"},
    "grpo": {
        "output_dir": "runs/grpo",
        "algo": {"advantage": "grpo", "num_generations": 4, "loss_aggregation": "seq_mean_token_mean",
                 "whiten_advantages": False, "kl": {"placement": "loss", "estimator": "k3", "coef": 0.04}},
        "reward": {"normalize": False},
    },
    "rloo": {
        "output_dir": "runs/rloo",
        "algo": {"advantage": "rloo", "num_generations": 4, "whiten_advantages": False},
        "reward": {"normalize": False},
    },
    "reinforce": {
        "output_dir": "runs/reinforce",
        "algo": {"advantage": "reinforce_pp", "whiten_advantages": False},
        "reward": {"normalize": False},
    },
    "dpo": {"output_dir": "runs/dpo", "algo": {"loss": "dpo"}},
    "ipo": {"output_dir": "runs/ipo", "algo": {"loss": "ipo"}},
    "kto": {"output_dir": "runs/kto", "algo": {"loss": "kto"}, "data": {"format": "unpaired"}},
    "simpo": {"output_dir": "runs/simpo", "algo": {"loss": "simpo", "beta": 2.0}},
    "orpo": {"output_dir": "runs/orpo", "algo": {"loss": "orpo"}},
}

CHOICES: dict[str, tuple[str, ...]] = {
    "model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "data.format": ("auto", "sft", "preference", "prompt", "unpaired"),
    "data.overflow": ("truncate", "drop", "error"),
    "optim.schedule": ("linear", "cosine", "constant"),
    "train.mixed_precision": ("auto", "no", "bf16", "fp16"),
    "generation.engine": ("hf",),
    "algo.advantage": ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp"),
    "algo.loss_aggregation": ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"),
    "algo.kl.estimator": ("k1", "k2", "k3"),
    "algo.kl.placement": ("reward", "loss"),
    "algo.loss": ("dpo", "ipo", "cdpo", "simpo", "orpo", "kto"),
    "algo.reference": ("precompute", "on_the_fly"),
    "critic.init": ("reward", "policy"),
}


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
                    return float(value)
                except ValueError:
                    pass
            raise bad("a number")
        return float(value)
    if tp is str:
        if isinstance(value, bool) and ("no" if not value else "yes") in CHOICES.get(path, ()):
            return "no" if not value else "yes"  # YAML 1.1 reads `no` as false: train.mixed_precision=no
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise bad("a list")
        return [_coerce(v, item_tp, f"{path}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise bad("a mapping")
        return {str(k): _coerce(v, val_tp, f"{path}.{k}", source) for k, v in value.items()}
    raise TypeError(f"unsupported config type {tp} at {path}")


def _build(cls, data: dict, prefix: str, source: str, base=None):
    """``cls`` with the keys of ``data`` set on top of ``base`` (default: the class defaults). Nested sections start
    from the parent's default for that field, so a recipe's own defaults survive a partial override."""
    base = base if base is not None else cls()
    hints = typing.get_type_hints(cls)
    names = [fl.name for fl in dataclasses.fields(cls)]
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
        choices = CHOICES.get(path)
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
        raise ConfigError(f"invalid YAML ({getattr(exc, 'problem', exc)})", where=where, fix="fix the YAML syntax") from None
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


def build_config(recipe: str, data: dict | None = None, overrides: list[str] | tuple[str, ...] = (), source: str = "config"):
    """Build and validate the config of ``recipe`` from a mapping plus dotted overrides."""
    if recipe not in RECIPES:
        raise ConfigError(f"unknown recipe '{recipe}'", where="recipe", fix=_did_you_mean(recipe, list(RECIPES)))
    tree = _merge(_copy(RECIPE_DEFAULTS.get(recipe, {})), _copy(data or {}))  # never mutate shared defaults
    file_recipe = tree.get("recipe", recipe)
    if RECIPES.get(file_recipe) is not RECIPES[recipe]:
        raise ConfigError(
            f"this config is for recipe '{file_recipe}', not '{recipe}'", where=f"{source}: recipe",
            fix=f"run `rlhfkit {file_recipe} ...` or use a {recipe} config",
        )
    tree["recipe"] = recipe if (data or {}).get("recipe") is None else file_recipe
    for item in overrides:
        keys, value = parse_override(item)
        _set_path(tree, keys, value)
    src = source if not overrides else f"{source} + overrides"
    return _build(RECIPES[recipe], tree, "", src)


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
