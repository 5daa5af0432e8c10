"""The metric names a run writes: TRL 1.16's for the recipes TRL has, rlhfkit's own where TRL has none.

The loops compute their metrics under rlhfkit's names (``objective/scores``, ``train/loss``, ``lr``, ...; the health
rules, the progress line and the summary read those). What leaves the run (``metrics.jsonl``, TensorBoard, W&B, the
other trackers, the Python API's callbacks and returned metrics) is renamed once, by :func:`public`, with the table
of the recipe: GRPO / RLOO (``reward``, ``reward_std``, ``kl``, ``entropy``, ``completions/mean_length``,
``clip_ratio/low_mean``, ...), online DPO (``objective/scores``, ``rewards/chosen``, ``beta``, ...), SFT, the reward
model, DPO / IPO / KTO / SimPO / ORPO (``loss``, ``grad_norm``, ``learning_rate``, ``rewards/chosen``,
``eval_loss``, ...), as TRL 1.16's trainers log them (read from their ``_metrics`` and ``Trainer.log``; the bench
``bench/trl_port.py`` compares the sets). Evaluation metrics take TRL's ``eval_`` prefix (``eval_loss``). PPO,
REINFORCE++ and distillation keep rlhfkit's names (TRL 1.16 has no such trainer; PPO's are TRL's earlier PPOTrainer's).
Readers of a run's files (the report, the closing line) map them back with :func:`internal`. W&B gets the names TRL
users see there: transformers' ``train/`` and ``eval/`` prefixes (:func:`wandb_names`).

``None`` in a table drops the metric from the output (its TRL counterpart says the same, e.g. ``val/eos_frac`` is
``1 - completions/clipped_ratio``).
"""

from __future__ import annotations

from collections.abc import Mapping

_GROUP = {  # GRPOTrainer / RLOOTrainer (trl/trainer/grpo_trainer.py, rloo_trainer.py: self._metrics)
    "loss/policy_avg": "loss",
    "policy/grad_norm": "grad_norm",
    "lr": "learning_rate",
    "tokens/seen": "num_tokens",
    "response/length_mean": "completions/mean_length",
    "response/length_min": "completions/min_length",
    "response/length_max": "completions/max_length",
    "response/clipped_frac": "completions/clipped_ratio",
    "response/terminated_length_mean": "completions/mean_terminated_length",
    "response/terminated_length_min": "completions/min_terminated_length",
    "response/terminated_length_max": "completions/max_terminated_length",
    "objective/scores": "reward",
    "objective/scores_std": "reward_std",
    "rewards/tied_groups_frac": "frac_reward_zero_std",
    "objective/kl_per_token": "kl",  # TRL's kl is per token; objective/kl (per answer) keeps its name
    "policy/entropy_avg": "entropy",
    "policy/clip_low_frac": "clip_ratio/low_mean",
    "policy/clip_low_frac_min": "clip_ratio/low_min",
    "policy/clip_high_frac": "clip_ratio/high_mean",
    "policy/clip_high_frac_max": "clip_ratio/high_max",
    "policy/clipfrac_avg": "clip_ratio/region_mean",
    "time/step": "step_time",
    "val/eos_frac": None,  # 1 - completions/clipped_ratio
    "val/num_eos_tokens": None,
    "eval/scores": "eval_reward",
}

_ONLINE_DPO = {  # trl.experimental.online_dpo.OnlineDPOTrainer (its stats dict)
    "loss/policy_avg": "loss",
    "policy/grad_norm": "grad_norm",
    "lr": "learning_rate",
    "tokens/seen": "num_tokens",
    "val/eos_frac": "val/contain_eos_token",
    "preference/beta": "beta",
    "eval/scores": "eval_objective/scores",
}

_SUPERVISED = {  # transformers.Trainer.log + TRL's SFT / DPO / KTO / Reward trainers
    "train/loss": "loss",
    "train/grad_norm": "grad_norm",
    "lr": "learning_rate",
    "tokens/seen": "num_tokens",
    "train/entropy": "entropy",
    "train/mean_token_accuracy": "mean_token_accuracy",
    "train/rewards/chosen": "rewards/chosen",
    "train/rewards/rejected": "rewards/rejected",
    "train/rewards/accuracies": "rewards/accuracies",
    "train/rewards/margins": "rewards/margins",
    "train/logps/chosen": "logps/chosen",
    "train/logps/rejected": "logps/rejected",
    "train/logits/chosen": "logits/chosen",
    "train/logits/rejected": "logits/rejected",
    "train/kl": "kl",
    "train/accuracy": "accuracy",
    "train/margin_mean": "margin",
    "train/mean_reward": "mean_reward",
    "train/min_reward": "min_reward",
    "train/max_reward": "max_reward",
}

#: recipe -> {rlhfkit's name: TRL's name, or None to leave it out}; a recipe absent here keeps rlhfkit's names
TABLES: dict[str, dict[str, str | None]] = {
    "grpo": _GROUP, "rloo": _GROUP, "online-dpo": _ONLINE_DPO,
    **{r: _SUPERVISED for r in ("sft", "rm", "dpo", "ipo", "kto", "simpo", "orpo")},
}
_EVAL_TRL = ("sft", "rm", "dpo", "ipo", "kto", "simpo", "orpo")  # eval/<name> -> eval_<TRL name>


def public_name(recipe: str, key: str) -> str | None:
    """The name ``key`` (rlhfkit's) is written under for ``recipe`` (None: left out)."""
    table = TABLES.get(recipe)
    if table is None:
        return key
    if key in table:
        return table[key]
    if recipe in _EVAL_TRL and key.startswith("eval/"):
        inner = "train/" + key[len("eval/"):]
        return "eval_" + (table.get(inner) or key[len("eval/"):])
    return key


def public(recipe: str, metrics: Mapping) -> dict:
    """``metrics`` under the names ``recipe`` writes (module docstring)."""
    if recipe not in TABLES:
        return dict(metrics)
    out = {}
    for key, value in metrics.items():
        name = public_name(recipe, key)
        if name is not None:
            out[name] = value
    return out


def internal(recipe: str | None, metrics: Mapping) -> dict:
    """The inverse of :func:`public`: a line of a run's ``metrics.jsonl`` under rlhfkit's names (a run of an earlier
    version, already under them, comes back as it is)."""
    if recipe not in TABLES:
        return dict(metrics)
    back = _inverse(recipe)
    out = {}
    for key, value in metrics.items():
        if key in back:
            out[back[key]] = value
        elif recipe in _EVAL_TRL and key.startswith("eval_"):
            inner = back.get(key[len("eval_"):], key[len("eval_"):])
            out["eval/" + inner.removeprefix("train/")] = value
        else:
            out[key] = value
    return out


_INVERSES: dict[str, dict[str, str]] = {}


def _inverse(recipe: str) -> dict[str, str]:
    if recipe not in _INVERSES:
        _INVERSES[recipe] = {v: k for k, v in TABLES[recipe].items() if v is not None}
    return _INVERSES[recipe]


def rename_text(recipe: str | None, text: str) -> str:
    """``text`` (a health warning, a closing line) with each rlhfkit metric name it quotes under the name the run
    writes (``objective/scores`` -> ``reward`` for GRPO); the longest names first, whole names only."""
    import re

    table = TABLES.get(recipe or "")
    if not table:
        return text
    names = sorted((k for k, v in table.items() if v is not None and k != v), key=len, reverse=True)
    pattern = re.compile(r"(?<![\w/.])(" + "|".join(re.escape(n) for n in names) + r")(?![\w/])")
    return pattern.sub(lambda m: table[m.group(1)], text)


def wandb_names(metrics: Mapping) -> dict:
    """transformers' ``WandbCallback`` naming (``rewrite_logs``): ``eval_x`` -> ``eval/x``, every other key under
    ``train/``, so a TRL user's W&B dashboards read the same."""
    out = {}
    for key, value in metrics.items():
        if key.startswith("eval_"):
            out["eval/" + key[len("eval_"):]] = value
        elif key.startswith(("train/", "eval/")):
            out[key] = value
        else:
            out["train/" + key] = value
    return out
