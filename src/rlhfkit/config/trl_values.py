"""The value helpers and translation functions of TRL's names (:mod:`.trl` holds the table that names them): each
translation takes ``(value, ctx)`` and returns the rlhfkit keys to set, or raises :class:`NoEquivalent` with why and
what to do instead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class NoEquivalent(ValueError):
    """Raised by a translation for a value that has no rlhfkit equivalent: (why, fix)."""

    def __init__(self, why: str, fix: str):
        super().__init__(why)
        self.why, self.fix = why, fix


# ───────────────────────────────────────────────── value helpers ──────────────────────────────────────────────


def truthy(value) -> bool:
    """TRL's booleans as YAML / the command line give them (``true``, ``"False"``, ``1``)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "on")
    return bool(value)


def same_value(value, options: tuple) -> bool:
    """``value`` is one of ``options``: strings compared without case (``"none"`` / ``"null"`` are ``None``),
    numbers by value, booleans only with booleans (``False`` is not ``0``)."""
    def norm(v):
        if isinstance(v, str):
            v = v.strip().lower()
            return None if v in ("none", "null", "") else v
        return v

    v = norm(value)
    for o in map(norm, options):
        if isinstance(v, bool) or isinstance(o, bool):
            if isinstance(v, bool) and isinstance(o, bool) and v == o:
                return True
        elif isinstance(v, (int, float)) and isinstance(o, (int, float)):
            if v == o:
                return True
        elif type(v) is type(o) and v == o:
            return True
    return False


def word(value) -> str:
    """A strategy name as written: YAML 1.1 reads ``no`` as false (``eval_strategy=no``)."""
    return {False: "no", True: "yes"}.get(value, str(value).strip().lower()) if isinstance(value, bool) \
        else str(value).strip().lower()


def _choice(name: str, table: dict[str, dict[str, Any]], fix: str) -> Callable:
    """A translation by value: ``table[value]`` is the keys it sets; any other value has no equivalent."""
    def to(value, ctx):
        v = value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else value
        key = str(v).strip().lower() if not isinstance(v, bool) else ("true" if v else "false")
        if key not in table:
            raise NoEquivalent(f"{name}={value!r} has no rlhfkit equivalent (translated: {', '.join(table)})", fix)
        return dict(table[key])
    return to


# ───────────────────────────────────────────────── translations ───────────────────────────────────────────────


def _mixed_precision(flag: str):
    def to(value, ctx):
        if truthy(value):
            return {"train.mixed_precision": flag}
        other = "fp16" if flag == "bf16" else "bf16"
        # bf16=false alone asks for fp32; with fp16=true it only says "not bf16" (fp16 sets the key); fp16=false
        # alone is TRL's default (bf16 where it can): rlhfkit's auto
        return {} if flag == "fp16" or truthy(ctx.given.get(other, False)) else {"train.mixed_precision": "no"}
    return to


def _report_to(value, ctx):
    names = value if isinstance(value, (list, tuple)) else [v.strip() for v in str(value).split(",")]
    names = [str(n).strip() for n in names if str(n).strip() and str(n).strip().lower() not in ("none", "null")]
    if any(n.lower() == "all" for n in names):
        raise NoEquivalent("report_to=all (every installed tracker) is not followed here",
                           "name the trackers, e.g. report_to=tensorboard or track.backends=[tensorboard,wandb]")
    return {"track.backends": names or ["jsonl"]}


def _eval_strategy(value, ctx):
    v = word(value)
    if v == "no":  # no evaluation at all: no eval file, nothing held out
        return {"data.eval": None, "data.eval_fraction": 0.0}
    if v == "steps":  # eval_steps says how often (train.eval_every)
        return {}
    raise NoEquivalent(f"eval_strategy={value!r}: rlhfkit evaluates every train.eval_every updates and at the end",
                       "use eval_strategy=steps with eval_steps=N (train.eval_every=N)")


def _save_strategy(value, ctx):
    v = word(value)
    if v == "no":
        return {"train.save_every": 0}
    if v == "steps":
        return {}
    raise NoEquivalent(f"save_strategy={value!r}: rlhfkit checkpoints every train.save_every updates and saves the "
                       "final model", "use save_steps=N (train.save_every=N)")


def _logging_steps(value, ctx):
    if isinstance(value, float) and value < 1:
        raise NoEquivalent(f"logging_steps={value} is a fraction of the run; rlhfkit logs every N updates",
                           "give logging_steps as a whole number of updates")
    return {"train.log_every": value}


def _warmup_steps(value, ctx):  # transformers 5 reads a float below 1 as a ratio
    if isinstance(value, float) and 0 < value < 1:
        return {"optim.warmup_ratio": value}
    return {"optim.warmup_steps": value}


_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}


def _schedule(value, ctx):
    v = str(value).strip().lower()
    if v not in _SCHEDULES:
        raise NoEquivalent(f"lr_scheduler_type={value!r} is not built in", "use linear, cosine or constant "
                           "(constant_with_warmup is constant here: warm-up applies to every schedule)")
    return {"optim.schedule": _SCHEDULES[v]}


def _max_grad_norm(value, ctx):
    return {"optim.max_grad_norm": None if value in (None, 0, 0.0) else value}


def _adam_beta(i: int):
    def to(value, ctx):
        betas = list(ctx.get("optim.betas"))
        betas[i] = value
        return {"optim.betas": betas}
    return to


def _resume(value, ctx):
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("false", "none")):
        return {"train.resume": "never"}  # TRL starts over unless told to resume
    if value is True or (isinstance(value, str) and value.strip().lower() == "true"):
        return {"train.resume": "auto"}
    return {"train.resume": value}


def _save_total_limit(value, ctx):
    if value is None:
        raise NoEquivalent("save_total_limit=null (keep every checkpoint) is not followed here",
                           "give a number, e.g. save_total_limit=3")
    return {"train.save_total_limit": value}


def _dataset_source(ctx) -> str | None:
    name = ctx.given.get("dataset_name")
    if name is None:
        return ctx.get("data.train")
    config = ctx.given.get("dataset_config")
    return f"{name}:{config}" if config else str(name)


def _dataset(value, ctx):
    return {"data.train": _dataset_source(ctx)}


def _dataset_test_split(value, ctx):
    source = _dataset_source(ctx)
    if not source:
        raise NoEquivalent("dataset_test_split names a split of dataset_name, and none is given",
                           "give dataset_name too, or data.eval=FILE")
    return {"data.eval": source, "data.eval_split": value}


def _fsdp(value, ctx):
    text = " ".join(value) if isinstance(value, (list, tuple)) else str(value or "")
    if not text.strip() or text.strip().lower() in ("false", "none"):
        return {}
    out: dict[str, Any] = {"distributed.strategy": "fsdp2"}
    if "offload" in text:
        out["distributed.cpu_offload"] = True
    return out


def _deepspeed(value, ctx):
    if not value:
        return {}
    if isinstance(value, dict):
        raise NoEquivalent("deepspeed as an inline mapping is not read", "save it as a JSON file and give its path")
    return {"distributed.strategy": "deepspeed", "distributed.deepspeed_config": str(value)}


def _model_init_kwargs(value, ctx):
    if not value:
        return {}
    if not isinstance(value, dict):
        raise NoEquivalent("model_init_kwargs must be a mapping", "give e.g. {dtype: bfloat16}")
    out = {}
    for key, v in value.items():
        if key in ("dtype", "torch_dtype"):
            out["model.dtype"] = v
        else:
            raise NoEquivalent(f"model_init_kwargs.{key} is not passed to from_pretrained here",
                               "rlhfkit sets model.dtype; other loading options are not exposed")
    return out


_GENERATION_KWARGS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                      "max_new_tokens": "max_new_tokens", "min_new_tokens": "min_new_tokens",
                      "stop_strings": "stop_strings"}


def _generation_kwargs(value, ctx):
    if not value:
        return {}
    if not isinstance(value, dict):
        raise NoEquivalent("generation_kwargs must be a mapping", "give e.g. {top_p: 0.95}")
    out = {}
    for key, v in value.items():
        if key not in _GENERATION_KWARGS:
            raise NoEquivalent(f"generation_kwargs.{key} has no rlhfkit equivalent (sampling stays on-policy: "
                               f"{', '.join(_GENERATION_KWARGS)})", f"remove {key}")
        out[f"generation.{_GENERATION_KWARGS[key]}"] = v
    return out


def _reward_functions(ctx) -> list[dict]:
    """reward_funcs (and reward_weights) of this source as rlhfkit's reward.functions."""
    funcs = ctx.given.get("reward_funcs")
    if funcs is None:
        current = ctx.get("reward.functions", merge=False) or []
        fns = [dict(f) if isinstance(f, dict) else {"fn": f.fn, "weight": f.weight, "name": f.name,
                                                     "kwargs": dict(f.kwargs)} for f in current]
    else:
        names = funcs if isinstance(funcs, (list, tuple)) else [funcs]
        fns = [{"fn": str(n)} for n in names]
    weights = ctx.given.get("reward_weights")
    if weights is not None:
        weights = list(weights) if isinstance(weights, (list, tuple)) else [weights]
        if len(weights) != len(fns):
            raise NoEquivalent(f"reward_weights has {len(weights)} weights for {len(fns)} reward functions",
                               "give one weight per function")
        fns = [{**fn, "weight": w} for fn, w in zip(fns, weights)]
    return fns


def _reward_funcs(value, ctx):
    return {"reward.functions": _reward_functions(ctx)}


_AGGREGATION = {  # TRL GRPOConfig.loss_type -> what rlhfkit's LOSS_AGGREGATIONS entry computes
    "dapo": {"algo.loss_aggregation": "token_mean"},
    "bnpo": {"algo.loss_aggregation": "token_mean"},
    "grpo": {"algo.loss_aggregation": "seq_mean_token_mean"},
    "dr_grpo": {"algo.loss_aggregation": "seq_mean_token_sum_norm", "algo.advantage": "dr_grpo"},
}


# TRL loss types that are a policy loss of their own (issue 34): loss_type -> (the keys it sets, the
# importance_sampling_level TRL pairs it with; the other level has no meaning for it)
_POLICY_LOSS_TYPES = {
    "luspo": ({"algo.policy_loss": "luspo", "algo.loss_aggregation": "seq_mean_token_mean"}, "sequence"),
    "vespo": ({"algo.policy_loss": "vespo", "algo.loss_aggregation": "token_mean"}, "token"),
}
_GRPO_LOSS_TYPES = _choice("loss_type", {**_AGGREGATION, **{k: v[0] for k, v in _POLICY_LOSS_TYPES.items()}},
                           "use dapo, bnpo, grpo, dr_grpo, luspo or vespo (other losses: algo.policy_loss)")
_PAIR_LOSS_TYPES = _choice("loss_type", {"sigmoid": {"algo.preference.loss": "dpo"},
                                         "ipo": {"algo.preference.loss": "ipo"}},
                           "use sigmoid or ipo (or algo.preference.loss=cdpo | simpo | orpo)")
_LEVELS = _choice("importance_sampling_level", {"token": {"algo.policy_loss": "ppo"},
                                                "sequence": {"algo.policy_loss": "gspo"}}, "use token or sequence")


def _pairs(ctx) -> bool:
    """The recipe learns from pairs (online DPO: ``algo.objective=preference``, its default or set)."""
    return str(ctx.get("algo.objective", merge=False)) == "preference"


def _online_beta(value, ctx):
    """GRPO / RLOO's beta is the KL coefficient; online DPO's its pair loss's (OnlineDPOConfig: a list of one)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    if _pairs(ctx) and len(values) != 1:
        raise NoEquivalent(f"beta={value!r}: a beta per epoch is not built in", "give one beta")
    return {"algo.preference.beta": float(values[0])} if _pairs(ctx) else {"algo.kl.coef": value}


def _online_loss_type(value, ctx):
    """GRPO's loss_type is its aggregation (or luspo / vespo); online DPO's its pair loss: sigmoid -> dpo, ipo."""
    return (_PAIR_LOSS_TYPES if _pairs(ctx) else _GRPO_LOSS_TYPES)(value, ctx)


def _importance_sampling_level(value, ctx):
    """token -> ppo, sequence -> gspo; with luspo / vespo (a loss_type given with it, or the config's policy loss) the
    level TRL pairs it with selects that loss (TRL's LUSPO config reads as one choice), the other one is refused."""
    level, loss_type = word(value), word(ctx.given.get("loss_type", ""))
    if loss_type not in _POLICY_LOSS_TYPES:
        loss_type = word(ctx.get("algo.policy_loss", merge=False))
    if loss_type not in _POLICY_LOSS_TYPES:
        return _LEVELS(value, ctx)
    keys, paired = _POLICY_LOSS_TYPES[loss_type]
    if level != paired:
        raise NoEquivalent(f"loss_type={loss_type} is a {paired}-level loss; importance_sampling_level={level} does "
                           "not apply to it", f"use importance_sampling_level={paired}, or remove it")
    return {"algo.policy_loss": keys["algo.policy_loss"]}


def _scale_rewards(value, ctx):
    v = "group" if value is True else "none" if value is False else str(value).strip().lower()
    v = {"true": "group", "false": "none"}.get(v, v)
    advantage = ctx.get("algo.advantage", merge=False)
    if advantage not in ("grpo", "dr_grpo"):
        raise NoEquivalent(f"scale_rewards sets how GRPO scales its group advantages; this recipe's advantage is "
                           f"{advantage}", "remove scale_rewards (or use the grpo recipe)")
    if v == "group":
        return {"algo.advantage": "grpo"}
    if v == "none":
        return {"algo.advantage": "dr_grpo"}
    raise NoEquivalent(f"scale_rewards={value!r} (scaling by the batch's std) is not built in",
                       "use scale_rewards=none with algo.whiten_advantages=true (whitening over the batch's tokens)")


def _reward_clip_range(value, ctx):
    lo, hi = (value if isinstance(value, (list, tuple)) and len(value) == 2 else (None, None))
    if lo is None or hi is None or float(lo) != -float(hi):
        raise NoEquivalent(f"reward_clip_range={value!r}: rlhfkit clips scores to a symmetric [-c, c]",
                           "give a symmetric range, or reward.clip=C")
    return {"reward.clip": float(hi)}


def _max_tool_iterations(value, ctx):
    return {} if value is None else {"env.max_turns": int(value) + 1}


def _center_rewards(value, ctx):
    return {"rm.center_coef": 0.0 if value is None else value}


def _completion_only(value, ctx):
    return {} if value is None else {"data.completion_only_loss": truthy(value)}


def _assistant_only(value, ctx):
    return {"data.completion_only_loss": True} if truthy(value) else {}


def _disable_tqdm(value, ctx):
    return {} if value is None else {"track.progress": not truthy(value)}


def _overwrite(value, ctx):
    return {"train.resume": "never"} if truthy(value) else {}


def _log_completions(value, ctx):
    return {} if truthy(value) else {"track.sample_every": 0}


def _no_cuda(value, ctx):
    return {"train.device": "cpu"} if truthy(value) else {}


def _checkpointing_kwargs(value, ctx):
    """transformers' gradient-checkpointing options: rlhfkit checkpoints without re-entrance (``use_reentrant:
    false``, what TRL's examples pass and torch recommends); re-entrant checkpointing is not built in."""
    kwargs = dict(value or {})
    reentrant = kwargs.pop("use_reentrant", False)
    if truthy(reentrant) or kwargs:
        raise NoEquivalent(f"gradient_checkpointing_kwargs={value!r}: rlhfkit checkpoints with use_reentrant=False "
                           "and no other option", "give {use_reentrant: false} or remove it")
    return {}


GEOMETRY_INPUT = "trl."  # prefix of the keys a geometry translation writes: read by config/geometry.py, not set


def _geometry_input(value, ctx):
    """gradient_accumulation_steps, generation_batch_size, steps_per_generation (online): kept as they are, under
    ``trl.<name>``, and turned into ``algo.mini_batch_size`` / ``algo.rollout_batch_size`` once every source is merged
    (:func:`~rlhfkit.config.geometry.trl_batch`: they also read per_device_train_batch_size and num_generations)."""
    if value is None:
        return {}
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise NoEquivalent(f"{ctx.name}={value!r} must be a whole number >= 1", f"give {ctx.name} a whole number")
    return {GEOMETRY_INPUT + ctx.name: value}


def _online_epochs(value, ctx):
    return {"train.epochs": value, "algo.total_episodes": None}


def _online_logging(value, ctx):
    _logging_steps(value, ctx)
    return {}


def _online_eval_batch(value, ctx):
    return {}
