"""The values a key may take: static choices of string keys, those read from a registry (estimators, losses,
engines, ...: imported lazily, when a config is built, since they import torch), and the tracker names of
``track.backends`` with the package each needs. A new registered variant is a valid value without touching this
file.
"""

from __future__ import annotations

STATIC_CHOICES: dict[str, tuple[str, ...]] = {
    "defaults": ("rlhfkit", "trl"),
    "model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "data.format": ("auto", "sft", "preference", "prompt", "unpaired"),
    "data.overflow": ("truncate", "drop", "error"),
    "data.plain_text": ("template", "raw"),
    "optim.schedule": ("linear", "cosine", "constant"),
    "train.mixed_precision": ("auto", "no", "bf16", "fp16"),
    "train.device": ("auto", "cpu"),
    "algo.kl.placement": ("auto", "reward", "loss"),
    "algo.reference": ("precompute", "on_the_fly"),
    "algo.async.reference": ("auto", "producer", "learner"),
    "critic.init": ("reward", "policy"),
    "algo.off_policy.level": ("token", "sequence"),
    "algo.objective": ("policy", "preference"),
    "distributed.strategy": ("ddp", "fsdp2", "deepspeed"),
    "reward.remote.kind": ("chat", "json"),
    "reward.missing_eos_scope": ("all", "varied"),
    "reward.sandbox.isolation": ("auto", "namespaces", "unshare", "process"),
}


def registry_choices() -> dict[str, tuple[str, ...]]:
    """Choices read from the registries of ``algos`` and ``rollout`` (imported here, lazily: they import torch)."""
    from .. import algos
    from ..rollout import ENGINES

    return {
        "generation.engine": tuple(ENGINES),
        "algo.advantage": tuple(algos.ADVANTAGE_ESTIMATORS),
        "algo.loss_aggregation": tuple(algos.LOSS_AGGREGATIONS),
        "algo.kl.estimator": tuple(algos.KL_ESTIMATORS),
        "algo.loss": tuple(algos.PREFERENCE_LOSSES),
        "algo.policy_loss": tuple(algos.POLICY_LOSSES),
        "algo.off_policy.correction": ("auto", *algos.OFF_POLICY_CORRECTIONS),
        "algo.dppo.divergence": tuple(algos.BINARY_DIVERGENCES),
        "algo.preference.loss": tuple(name for name, p in algos.PREFERENCE_LOSSES.items() if p.paired),
    }


def choices_of(path: str) -> tuple[str, ...] | None:
    """The allowed values of the string key ``path`` (None: free text)."""
    if path in STATIC_CHOICES:
        return STATIC_CHOICES[path]
    if path in _REGISTRY_KEYS:
        return registry_choices()[path]
    return None


_REGISTRY_KEYS = ("generation.engine", "algo.advantage", "algo.loss_aggregation", "algo.kl.estimator", "algo.loss",
                  "algo.policy_loss", "algo.off_policy.correction", "algo.dppo.divergence",
                  "algo.preference.loss")


# Trackers written by rlhfkit's own sink (track.metrics.MetricsSink); the others come from accelerate.
OWN_TRACKERS = ("jsonl", "tensorboard", "wandb")
# tracker -> (module that must be importable, what to pip install)
TRACKER_PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "comet_ml": ("comet_ml", "comet-ml"),
    "aim": ("aim", "aim"),
    "clearml": ("clearml", "clearml"),
    "dvclive": ("dvclive", "dvclive"),
    "swanlab": ("swanlab", "swanlab"),
    "trackio": ("trackio", "trackio"),
}


def known_backends() -> tuple[str, ...]:
    """Every name ``track.backends`` accepts: rlhfkit's own, then accelerate's (``LOGGER_TYPE_TO_CLASS``)."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    return tuple(dict.fromkeys((*OWN_TRACKERS, *LOGGER_TYPE_TO_CLASS)))
