"""TRL 1.16's defaults, per recipe, as rlhfkit settings: what ``defaults=trl`` layers under a config file
(:func:`defaults_layer`) and what :mod:`.geometry` compares a config with at the start of every online run. Read from
TRL 1.16.0's ``GRPOConfig`` / ``RLOOConfig`` / ``_BaseConfig`` / ``transformers.TrainingArguments`` field defaults
and its trainers (where the KL goes, which estimator, how the loss is averaged); the names TRL users write live in
:mod:`.trl`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrlDefault:
    """One of TRL 1.16's defaults as rlhfkit writes it: ``key`` = ``value`` is what TRL does when ``trl`` (the TRL
    setting, as a TRL user would write it) is left alone. Read from TRL 1.16.0's ``GRPOConfig`` / ``RLOOConfig`` /
    ``_BaseConfig`` / ``TrainingArguments`` field defaults and its trainers (where the KL goes, which estimator)."""

    key: str
    value: Any
    trl: str


def _common_trl(k: int, beta: float) -> tuple[TrlDefault, ...]:
    return (
        TrlDefault("algo.num_generations", k, f"num_generations={k}"),
        TrlDefault("algo.ppo_epochs", 1, "num_iterations=1"),
        TrlDefault("algo.kl.coef", beta, f"beta={beta}"),
        TrlDefault("algo.ppo.clip_low", 0.2, "epsilon=0.2"),
        TrlDefault("algo.ppo.clip_high", None, "epsilon_high=None"),
        TrlDefault("algo.entropy_coef", 0.0, "no entropy bonus"),
        TrlDefault("algo.overlong.filter", False, "mask_truncated_completions=False"),
        TrlDefault("generation.max_new_tokens", 512, "max_completion_length=512"),
        TrlDefault("generation.temperature", 1.0, "temperature=1.0"),
        TrlDefault("generation.top_p", 1.0, "top_p=1.0"),
        TrlDefault("generation.top_k", 0, "top_k=0"),
        TrlDefault("optim.lr", 1e-6, "learning_rate=1e-6"),
        TrlDefault("optim.schedule", "linear", "lr_scheduler_type=linear"),
        TrlDefault("optim.warmup_ratio", 0.0, "warmup_steps=0 (no warm-up)"),
        TrlDefault("optim.warmup_steps", 0, "warmup_steps=0"),
        TrlDefault("optim.weight_decay", 0.0, "weight_decay=0"),
        TrlDefault("optim.max_grad_norm", 1.0, "max_grad_norm=1.0"),
        TrlDefault("model.gradient_checkpointing", True, "gradient_checkpointing=True"),
        TrlDefault("reward.missing_eos_penalty", None, "no missing-EOS penalty"),
        TrlDefault("reward.clip", None, "no reward clip"),
        TrlDefault("reward.normalize", False, "no running reward normalisation"),
        TrlDefault("data.eval_fraction", 0.0, "eval_strategy=no (nothing held out)"),
        TrlDefault("train.batch_size", 8, "per_device_train_batch_size=8"),
        TrlDefault("train.save_every", 500, "save_steps=500"),
        TrlDefault("train.seed", 42, "seed=42"),
        TrlDefault("train.epochs", 3.0, "num_train_epochs=3"),
        TrlDefault("algo.total_episodes", None, "num_train_epochs=3 (passes over the prompts)"),
    )


# Per recipe: TRL 1.16's defaults of the trainer a TRL user would run instead (``defaults=trl`` layers them under the
# config file; config/geometry.py lists where a config differs from them). The batch geometry is TRL's derivation
# (config/geometry.trl_batch), not a value: algo.mini_batch_size and algo.rollout_batch_size follow
# per_device_train_batch_size and num_generations.
TRL_DEFAULTS: dict[str, tuple[TrlDefault, ...]] = {
    "grpo": (*_common_trl(8, 0.0),
             TrlDefault("algo.advantage", "grpo", "scale_rewards=group"),
             TrlDefault("algo.loss_aggregation", "token_mean", "loss_type=dapo"),
             TrlDefault("algo.whiten_advantages", False, "no batch whitening"),
             TrlDefault("algo.kl.estimator", "k3", "k3 KL in the loss")),
    "rloo": (*_common_trl(2, 0.05),
             TrlDefault("algo.advantage", "rloo", "leave-one-out baseline"),
             TrlDefault("algo.whiten_advantages", False, "normalize_advantages=False"),
             TrlDefault("algo.kl.estimator", "k1", "k1 KL in the reward")),
}

# What stays different from TRL 1.16 under defaults=trl (no rlhfkit setting gives TRL's behaviour), per recipe.
TRL_UNMATCHED: dict[str, tuple[str, ...]] = {
    "grpo": ("TRL's dapo divides the summed token losses by the tokens of the whole generation batch over every "
             "process; rlhfkit's token_mean by each update's own tokens (the same with one update per step on one "
             "process)",),
    "rloo": ("TRL's RLOO clips the ratio of whole sequences (the exp of the summed token log-ratios) and averages "
             "per sequence; rlhfkit clips each token's ratio (algo.policy_loss=ppo, algo.loss_aggregation)",),
}
_COMMON_UNMATCHED = (
    "TRL keeps the model's dropout (disable_dropout=False); rlhfkit's online recipes always disable it",
    "TRL's bf16=True autocasts on a CPU too; train.mixed_precision=auto is bf16 on CUDA and float32 on a CPU",
    "TRL keeps every checkpoint (save_total_limit=None); rlhfkit keeps train.save_total_limit of them",
)


def trl_defaults(recipe: str) -> tuple[TrlDefault, ...] | None:
    """TRL 1.16's defaults for ``recipe`` (None: TRL 1.16 has no stable trainer for it)."""
    return TRL_DEFAULTS.get(recipe)


def trl_unmatched(recipe: str) -> tuple[str, ...]:
    """What stays different from TRL 1.16 for ``recipe`` whatever the settings."""
    return TRL_UNMATCHED.get(recipe, ()) + _COMMON_UNMATCHED if recipe in TRL_DEFAULTS else ()


def defaults_layer(recipe: str) -> dict:
    """TRL's defaults for ``recipe`` as a config tree (``defaults=trl`` merges it over the recipe's own)."""
    tree: dict = {}
    for d in TRL_DEFAULTS[recipe]:
        node = tree
        *parents, last = d.key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = d.value
    return tree
