"""TRL 1.16's defaults, per recipe, as rlhfkit settings, and what stays different from TRL whatever the settings.

A run configured through TRL's interface (:func:`.aliases.defaults_mode`: a TRL config object, TRL's names in the file
or the Python ``args``, a TRL-named trainer without ``args``) is built on :func:`defaults_layer` (``defaults=trl``), so
it gets TRL 1.16's value for every setting TRL defines; rlhfkit's own keys keep rlhfkit's defaults. What no setting
makes equal is :data:`TRL_DIFFERENCES`, each row with the test of whether it applies to a given run (the start-up block,
:mod:`.startup`, prints only those); :data:`PRACTICES` are rlhfkit's recommendations beside TRL's defaults, printed in
one line, never switched on. ``docs/coming-from-trl.md`` is rendered from these tables
(:func:`~rlhfkit.config.startup.markdown_table`; ``tools/sync_configs.py`` writes it, a test checks it).

Read from TRL 1.16.0's config classes (``GRPOConfig``, ``RLOOConfig``, ``DPOConfig``, ``KTOConfig``, ``SFTConfig``,
``RewardConfig``, ``trl.experimental``'s ``OnlineDPOConfig``, ``CPOConfig``, ``ORPOConfig``, on top of
``transformers.TrainingArguments`` 5.x) and their trainers (where the KL goes, which estimator, how the loss is
averaged, what is tokenised how); ``bench/trl_port.py`` compares each table with the classes when TRL is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrlDefault:
    """One of TRL 1.16's defaults as rlhfkit writes it: ``key`` = ``value`` is what TRL does when ``trl`` (the TRL
    setting, as a TRL user would write it) is left alone."""

    key: str
    value: Any
    trl: str


@dataclass(frozen=True)
class TrlDifference:
    """A behaviour of TRL 1.16 that no rlhfkit setting reproduces (``text``: TRL's, then rlhfkit's), for
    ``recipes``; ``applies(cfg, world)``: whether it concerns this run (None: it depends on the data or the model and
    is said where it happens, e.g. the ``[data]`` line that counts cut records)."""

    recipes: tuple[str, ...]
    text: str
    applies: Callable[[Any, int], bool] | None = None


@dataclass(frozen=True)
class Practice:
    """rlhfkit's practice where TRL's default is otherwise: ``key`` = ``value`` (TRL: ``trl``), and ``why``; said in
    one line by a TRL-configured run that does not set ``key``, never switched on."""

    recipes: tuple[str, ...]
    key: str
    value: Any
    trl: str
    why: str
    say: str | None = None  # what the run's line recommends, where ``trl`` names no TRL setting (else ``trl``)
    applies: Callable[[Any, Any], bool] | None = None  # (cfg, origin) -> whether it is worth saying to this run


def _d(key: str, value: Any, trl: str) -> TrlDefault:
    return TrlDefault(key, value, trl)


def _training(lr: float, *, supervised: bool) -> tuple[TrlDefault, ...]:
    """transformers' ``TrainingArguments`` as TRL 1.16's configs leave them (their own learning rate each)."""
    rows = [
        _d("optim.lr", lr, f"learning_rate={lr:g}"),
        _d("optim.schedule", "linear", "lr_scheduler_type=linear"),
        _d("optim.warmup_ratio", 0.0, "no warm-up"),
        _d("optim.warmup_steps", 0, "warmup_steps=0"),
        _d("optim.warmup_from_zero", True, "transformers' warm-up, its first update at LR 0"),
        _d("optim.weight_decay", 0.0, "weight_decay=0"),
        _d("optim.max_grad_norm", 1.0, "max_grad_norm=1.0"),
        _d("optim.betas", [0.9, 0.999], "adam_beta1=0.9, adam_beta2=0.999"),
        _d("optim.eps", 1e-8, "adam_epsilon=1e-8"),
        _d("model.gradient_checkpointing", True, "gradient_checkpointing=True"),
        _d("data.eval_fraction", 0.0, "eval_strategy=no (nothing held out)"),
        _d("data.plain_text", "raw", "standard-format strings tokenised as they are"),
        _d("train.batch_size", 8, "per_device_train_batch_size=8"),
        _d("train.epochs", 3.0, "num_train_epochs=3"),
        _d("train.max_steps", -1, "max_steps=-1"),
        _d("train.save_every", 500, "save_steps=500"),
        _d("train.seed", 42, "seed=42"),
        _d("train.resume", "never", "resume_from_checkpoint=None (train() starts over in output_dir)"),
    ]
    if supervised:
        rows += [_d("train.grad_accum", 1, "gradient_accumulation_steps=1"),
                 _d("train.log_every", 10, "logging_steps=10"),
                 _d("train.drop_last", False, "dataloader_drop_last=False")]
    return tuple(rows)


def _online(lr: float, k: int, beta: float, max_new: int, temperature: float, *,
            pairs: bool = False) -> tuple[TrlDefault, ...]:
    return (
        *_training(lr, supervised=False),
        _d("algo.num_generations", k, "two completions per prompt" if pairs else f"num_generations={k}"),
        _d("algo.ppo_epochs", 1, "one update per generation" if pairs else "num_iterations=1"),
        _d("algo.kl.coef", beta, "no KL term beside the DPO loss's own" if pairs else f"beta={beta:g}"),
        _d("algo.entropy_coef", 0.0, "no entropy bonus"),
        _d("algo.overlong.filter", False, "mask_truncated_completions=False"),
        _d("algo.total_episodes", None, "num_train_epochs=3 (passes over the prompts)"),
        _d("generation.max_new_tokens", max_new, f"max_completion_length={max_new}"),
        _d("generation.temperature", temperature, f"temperature={temperature:g}"),
        _d("generation.top_p", 1.0, "top_p=1.0"),
        _d("generation.top_k", 0, "top_k=0"),
        _d("reward.missing_eos_penalty", None, "missing_eos_penalty=None"),
        _d("reward.missing_eos_scope", "all", "missing_eos_penalty, when set, on every unended answer"),
        _d("reward.clip", None, "no reward clip"),
        _d("reward.normalize", False, "no running reward normalisation"),
    )


_PPO_CLIP = (_d("algo.ppo.clip_low", 0.2, "epsilon=0.2"), _d("algo.ppo.clip_high", None, "epsilon_high=None"))
_PAIRS = (_d("data.max_length", 1024, "max_length=1024"), _d("algo.beta", 0.1, "beta=0.1"))

#: Per recipe: TRL 1.16's defaults of the trainer a TRL user would run instead. The online batch geometry is TRL's
#: derivation (config/geometry.trl_batch), not a value: algo.mini_batch_size / rollout_batch_size follow
#: per_device_train_batch_size, gradient_accumulation_steps and num_generations.
TRL_DEFAULTS: dict[str, tuple[TrlDefault, ...]] = {
    "grpo": (*_online(1e-6, 8, 0.0, 512, 1.0), *_PPO_CLIP,
             _d("algo.advantage", "grpo", "scale_rewards=group"),
             _d("algo.loss_aggregation", "token_mean", "loss_type=dapo"),
             _d("algo.whiten_advantages", False, "no batch whitening"),
             _d("algo.kl.estimator", "k3", "k3 KL in the loss")),
    "rloo": (*_online(1e-6, 2, 0.05, 512, 1.0), *_PPO_CLIP,
             _d("algo.advantage", "rloo", "leave-one-out baseline"),
             _d("algo.whiten_advantages", False, "normalize_advantages=False"),
             _d("algo.kl.estimator", "k1", "k1 KL in the reward")),
    "online-dpo": (*_online(5e-7, 2, 0.0, 64, 0.9, pairs=True),
                   _d("data.max_length", 512, "max_length=512"),
                   _d("algo.objective", "preference", "the DPO loss on each prompt's two completions"),
                   _d("algo.preference.loss", "dpo", "loss_type=sigmoid"),
                   _d("algo.preference.beta", 0.1, "beta=0.1")),
    "sft": (*_training(2e-5, supervised=True),
            _d("data.max_length", 1024, "max_length=1024"),
            _d("data.packing", False, "packing=False"),
            _d("data.completion_only_loss", None, "completion_only_loss=None, assistant_only_loss=False")),
    "rm": (*_training(1e-4, supervised=True),
           _d("data.max_length", 1024, "max_length=1024"),
           _d("rm.center_coef", 0.0, "center_rewards_coefficient=None")),
    "dpo": (*_training(1e-6, supervised=True), *_PAIRS,
            _d("algo.reference", "on_the_fly", "precompute_ref_log_probs=False"),
            _d("algo.label_smoothing", 0.0, "label_smoothing=0")),
    "ipo": (*_training(1e-6, supervised=True), *_PAIRS,
            _d("algo.reference", "on_the_fly", "precompute_ref_log_probs=False")),
    "kto": (*_training(1e-6, supervised=True), *_PAIRS,
            _d("algo.reference", "on_the_fly", "precompute_ref_log_probs=False"),
            _d("algo.kto_desirable_weight", 1.0, "desirable_weight=1.0"),
            _d("algo.kto_undesirable_weight", 1.0, "undesirable_weight=1.0")),
    "simpo": (*_training(1e-6, supervised=True), *_PAIRS,
              _d("algo.simpo_gamma", 0.5, "simpo_gamma=0.5")),
    "orpo": (*_training(1e-6, supervised=True),
             _d("data.max_length", 1024, "max_length=1024"),
             _d("algo.orpo_lambda", 0.1, "beta=0.1 (ORPO's lambda)")),
}

#: The TRL 1.16 class each recipe's defaults are read from (its name in the start-up block and the docs).
TRL_CLASSES = {"grpo": "GRPOConfig", "rloo": "RLOOConfig", "online-dpo": "OnlineDPOConfig (trl.experimental)",
               "sft": "SFTConfig", "rm": "RewardConfig", "dpo": "DPOConfig", "ipo": "DPOConfig(loss_type='ipo')",
               "kto": "KTOConfig", "simpo": "CPOConfig(loss_type='simpo') (trl.experimental)",
               "orpo": "ORPOConfig (trl.experimental)"}

_ONLINE = ("grpo", "rloo", "online-dpo")
_SUPERVISED = ("sft", "rm", "dpo", "ipo", "kto", "simpo", "orpo")
_ALL = _ONLINE + _SUPERVISED
_PAIRED = ("rm", "dpo", "ipo", "kto", "simpo", "orpo")


def _has_dropout(cfg, world: int) -> bool:
    """The model's ``config.json`` sets a dropout above 0 (a name that is no local directory: unknown, said)."""
    import json
    from pathlib import Path

    path = Path(str(cfg.model.name or "")) / "config.json"
    if str(cfg.model.name or "").startswith("tiny"):
        return False
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return True
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for k, v in config.items()
               if k.endswith(("dropout", "pdrop", "dropout_prob")))


def _on_cpu(cfg, world: int) -> bool:
    import torch

    return cfg.train.mixed_precision == "auto" and (getattr(cfg.train, "device", "auto") == "cpu"
                                                    or not torch.cuda.is_available())


def _token_mean_spread(cfg, world: int) -> bool:
    from .geometry import step_geometry

    g = step_geometry(cfg, world)
    return cfg.algo.loss_aggregation == "token_mean" and (world > 1 or g.updates_per_step > 1
                                                          or g.micro_per_update > 1)


def _always(cfg, world: int) -> bool:
    return True


#: What stays different from TRL 1.16 whatever the settings, per recipe (docs/coming-from-trl.md renders it).
TRL_DIFFERENCES: tuple[TrlDifference, ...] = (
    TrlDifference(("grpo",), "TRL's loss_type=dapo divides the summed token losses by the completion tokens of the "
                  "whole generation batch over every process; rlhfkit's token_mean by each micro-batch's, averaged "
                  "over the update (the same with one micro-batch per update on one process)", _token_mean_spread),
    TrlDifference(("rloo",), "TRL's RLOO clips the ratio of whole sequences (the exp of the summed token "
                  "log-ratios) and averages per sequence; rlhfkit clips each token's ratio (algo.policy_loss=ppo, "
                  "algo.loss_aggregation)", lambda cfg, world: cfg.algo.policy_loss == "ppo"),
    TrlDifference(("grpo", "rloo"), "TRL keeps the model's dropout (disable_dropout=False); rlhfkit's online recipes "
                  "always disable it (old and new log-probs must agree)", _has_dropout),
    TrlDifference(("rm", "dpo", "ipo", "kto", "simpo", "orpo"), "TRL disables the model's dropout "
                  "(disable_dropout=True); rlhfkit's supervised recipes keep it", _has_dropout),
    TrlDifference(_ALL, "TRL trains a vision-language model's vision tower and projector with its language model "
                  "(unless frozen by hand or left out of a peft_config); rlhfkit freezes them (model.train_vision=true "
                  "trains them)"),
    TrlDifference(_ONLINE, "TRL keeps an image-placeholder token a vision-language model samples in its completion "
                  "(the next forward then finds an image token without an image); rlhfkit ends the response before "
                  "it"),
    TrlDifference(_ALL, "TRL's bf16=True autocasts in bf16 on a CPU too; rlhfkit trains in float32 on a CPU "
                  "(train.mixed_precision=auto; bf16=True asks for the autocast)", _on_cpu),
    TrlDifference(_ALL, "TRL keeps every checkpoint (save_total_limit=None); rlhfkit keeps train.save_total_limit "
                  "of them", lambda cfg, world: cfg.train.save_every > 0),
    TrlDifference(_ONLINE, "TRL logs every logging_steps optimizer steps (10 by default), averaged; rlhfkit logs "
                  "every rollout step", _always),
    TrlDifference(_SUPERVISED, "with logging_steps above 1 TRL logs the mean over the window; rlhfkit logs the last "
                  "update's values", lambda cfg, world: cfg.train.log_every > 1),
    TrlDifference(_ALL, "TRL evaluates only with eval_strategy=steps (an eval_dataset alone is never evaluated, nor "
                  "before the first update); rlhfkit evaluates data.eval before the first update (supervised "
                  "recipes) and at the end, and every train.eval_every updates",
                  lambda cfg, world: bool(cfg.data.eval)),
    TrlDifference(("sft",), "TRL's SFT loss averages over the tokens of the whole accumulated update; rlhfkit "
                  "averages each micro-batch's, then the micro-batches", lambda cfg, world: cfg.train.grad_accum > 1),
    TrlDifference(("online-dpo",), "a pair whose two completions score alike trains nothing here; TRL keeps it, "
                  "the first completion as the chosen one", _always),
    TrlDifference(("simpo",), "TRL's CPOTrainer(loss_type=simpo) adds cpo_alpha=1.0 x the chosen answer's NLL unless "
                  "cpo_alpha=0; rlhfkit's simpo is the SimPO loss alone", _always),
    TrlDifference(_PAIRED, "an over-long pair: TRL keeps the start of prompt + completion (truncation_mode="
                  "keep_start); rlhfkit cuts the prompt from the left (to data.max_prompt_length, by default half of "
                  "data.max_length), then the completion from the right (the [data] line counts the records cut)"),
    TrlDifference(("grpo", "rloo"), "a prompt longer than data.max_length is cut from the left here (the [data] line "
                  "counts them); TRL 1.16 has no prompt limit"),
    TrlDifference(_ALL, "a peft.LoraConfig without target_modules: peft adapts its default for the architecture "
                  "(q_proj and v_proj for Llama); rlhfkit its own choice (every linear layer of the blocks)",
                  lambda cfg, world: cfg.model.lora.enabled and cfg.model.lora.target_modules is None),
)

#: rlhfkit's practice where TRL's default is otherwise (said in one line, never switched on).
PRACTICES: tuple[Practice, ...] = (
    Practice(_ONLINE, "reward.missing_eos_penalty", 1.0, "missing_eos_penalty=1.0",
             "an answer cut at the length limit scores 1 less"),
    Practice(("grpo",), "reward.missing_eos_scope", "varied", "none: the penalty on every unended answer",
             "the penalty only where a group's scores differ; on every unended answer it drifted 2.5-5x further from "
             "the base, docs/learning.md", say="reward.missing_eos_scope=varied",
             applies=lambda cfg, origin: not (origin.set_by_user("reward.missing_eos_penalty")
                                              and cfg.reward.missing_eos_penalty is None)),
    Practice(("grpo", "rloo"), "algo.ppo.clip_high", 0.28, "epsilon_high=0.28", "DAPO's clip-higher keeps exploring"),
)


def trl_defaults(recipe: str) -> tuple[TrlDefault, ...] | None:
    """TRL 1.16's defaults for ``recipe`` (None: TRL 1.16 has no trainer for it)."""
    return TRL_DEFAULTS.get(recipe)


def trl_unmatched(recipe: str) -> tuple[TrlDifference, ...]:
    """Every row of :data:`TRL_DIFFERENCES` for ``recipe``."""
    return tuple(d for d in TRL_DIFFERENCES if recipe in d.recipes)


def defaults_layer(recipe: str) -> dict:
    """TRL's defaults for ``recipe`` as a config tree (``defaults=trl`` merges it over the recipe's own)."""
    tree: dict = {}
    for d in TRL_DEFAULTS[recipe]:
        node = tree
        *parents, last = d.key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = list(d.value) if isinstance(d.value, list) else d.value
    return tree


def _get(cfg, key: str) -> Any:
    from .keys import field_of

    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, field_of(part))
    return obj


def _same(a, b) -> bool:
    import math

    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b
