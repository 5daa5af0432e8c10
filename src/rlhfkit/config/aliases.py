"""TRL-style flat names (``learning_rate``, ``per_device_train_batch_size``, ``beta``, ...) accepted at the top level
of a config file or command line, moved to the rlhfkit key they stand for and logged once per process
(``[config] learning_rate -> optim.lr`` on stderr, printed only once the config is valid, so that a config error
stays the one line on stderr)."""

from __future__ import annotations

import dataclasses
import sys

from ..errors import ConfigError
from .recipes import RECIPES

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
    "epsilon": "algo.clip_low",  # these three move on into the chosen policy loss's section: see move_policy_settings
    "cliprange": "algo.clip_low",
    "epsilon_high": "algo.clip_high",
}
_FAMILY_ALIASES: dict[str, dict[str, str]] = {
    "online": {"beta": "algo.kl.coef", "kl_coef": "algo.kl.coef"},
    "preference": {"beta": "algo.beta"},
}


def alias_of(key: str, recipe: str) -> str | None:
    """The rlhfkit key a TRL-style flat name stands for in ``recipe`` (None: not an alias)."""
    family = RECIPES[recipe].family if recipe in RECIPES else ""
    return _FAMILY_ALIASES.get(family, {}).get(key) or ALIASES.get(key)


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


# The settings a policy loss reads from its own section (``algo.<section>.<key>``, the section of the chosen
# ``algo.policy_loss``): rlhfkit's earlier ``algo.clip_low`` / ``algo.clip_high`` and the TRL names mapped to them
# above move there once the whole config (recipe defaults, file, overrides) is merged, when the loss is known.
MOVED_TO_POLICY_SECTION = ("clip_low", "clip_high")


def move_policy_settings(tree: dict, recipe: str, source: str) -> None:
    """Move ``algo.clip_low`` / ``algo.clip_high`` of the merged ``tree`` (in place) into the section of the chosen
    policy loss, logged once as ``epsilon -> algo.ppo.clip_low``; a loss whose section has no such setting refuses
    them in one line."""
    algo, defaults = tree.get("algo"), getattr(RECIPES[recipe].config(), "algo", None)
    if not isinstance(algo, dict) or not hasattr(defaults, "policy_loss"):
        return
    moved = {key: algo.pop(key) for key in MOVED_TO_POLICY_SECTION if key in algo}
    if not moved:
        return
    from .. import algos  # the registry, read lazily (it imports torch)

    name = algo.get("policy_loss", defaults.policy_loss)
    spec = algos.POLICY_LOSSES.get(name)
    if spec is None or not isinstance(algo.setdefault(spec.section, {}), dict):
        return  # an unknown loss or a section that is no mapping: building the config names that, not these keys
    section, fields = algo[spec.section], [fl.name for fl in dataclasses.fields(getattr(defaults, spec.section))]
    for key, value in moved.items():
        target = f"algo.{spec.section}.{key}"
        origin = _ALIAS_ORIGINS.get(f"algo.{key}", f"algo.{key}")  # epsilon, cliprange, ... or the old key itself
        if key not in fields:
            raise ConfigError(f"'{origin}' is a {key} setting, and algo.policy_loss={name} has none (its settings: "
                              f"{', '.join(f'algo.{spec.section}.{k}' for k in fields) or 'none'})", where=source,
                              fix=f"remove {origin}")
        if key in section and section[key] != value:
            raise ConfigError(f"'{origin}' and '{target}' are both set, to different values", where=source,
                              fix=f"keep only {target}")
        section[key] = value
        _log_alias(origin, target)


_ALIASES_LOGGED: set[str] = set()
_ALIASES_PENDING: list[tuple[str, str]] = []
_ALIAS_ORIGINS: dict[str, str] = {}  # this build's alias targets -> the name the user wrote


def _begin_aliases() -> None:
    """Forget the notes of an earlier build (one that failed leaves some)."""
    _ALIASES_PENDING.clear()
    _ALIAS_ORIGINS.clear()


def _log_alias(key: str, target: str) -> None:
    """Note an alias; printed by :func:`_flush_aliases` once the config is valid (a config error stays the one line
    on stderr). A key that moves on into a policy loss's section is printed with its final name."""
    _ALIAS_ORIGINS[target] = key
    if target.removeprefix("algo.") in MOVED_TO_POLICY_SECTION:
        return
    if key not in _ALIASES_LOGGED and (key, target) not in _ALIASES_PENDING:
        _ALIASES_PENDING.append((key, target))


def _flush_aliases() -> None:
    for key, target in _ALIASES_PENDING:
        _ALIASES_LOGGED.add(key)
        print(f"[config] {key} -> {target}", file=sys.stderr)
    _ALIASES_PENDING.clear()
