"""The Python API's inputs (:mod:`rlhfkit.api`): a trainer's own arguments (model, tokenizer, datasets, LoRA, reference
and reward models, reward functions) as the rlhfkit keys they set. A loaded model is written once to rlhfkit's cache
by its weights' digest; Python data once by its content (:func:`rlhfkit.data.sources.dataset_file`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from .config import RECIPES
from .errors import ConfigError, say

_DATA_KEYS = {"train_dataset": "train", "eval_dataset": "eval"}


def trainer_inputs(recipe: str, model, tokenizer, train, evals, peft_config, ref_model, reward_model) -> dict:
    """The rlhfkit keys the trainer's own arguments set."""
    own: dict = {}
    fields = {fl.name for fl in dataclasses.fields(RECIPES[recipe].config)}
    if model is not None:
        own["model"] = {"name": _model_name(model, tokenizer, "model")}
    elif tokenizer is not None:
        raise ConfigError("a tokenizer was given without a model", where="processing_class",
                          fix="give model= too (its tokenizer is taken with a loaded model)")
    for arg, value in (("train_dataset", train), ("eval_dataset", evals)):
        if value is None:
            continue
        if "data" not in fields:
            raise ConfigError(f"the {recipe} recipe takes no {arg}", where=arg, fix=f"remove {arg}")
        own.setdefault("data", {}).update(_data(value, _DATA_KEYS[arg], evals is None))
    if peft_config is not None:
        own.setdefault("model", {})["lora"] = lora_settings(peft_config)
    for key, value in (("ref_model", ref_model), ("reward", reward_model)):
        if value is None:
            continue
        if key not in fields:
            raise ConfigError(f"the {recipe} recipe takes no {key if key == 'ref_model' else 'reward_model'}",
                              where=key, fix="remove it")
        name = _model_name(value, None, key)
        own.update({"ref_model": name} if key == "ref_model" else {"reward": {"model": name}})
    return own


def _model_name(model: Any, tokenizer: Any, arg: str) -> str:
    if isinstance(model, (str, os.PathLike)):
        if tokenizer is not None and str(getattr(tokenizer, "name_or_path", "")) != str(model):
            raise ConfigError("a tokenizer object is taken only with a loaded model", where="processing_class",
                              fix="leave it out (the model's own is loaded), or give the loaded model too; "
                                  "model.chat_template sets another chat template")
        return str(model)
    if not hasattr(model, "save_pretrained") or not hasattr(model, "state_dict"):
        raise ConfigError(f"{arg} is a {type(model).__name__}", where=arg,
                          fix="give a model name / directory, or a loaded transformers model with its tokenizer")
    return model_dir(model, tokenizer, arg)


def model_dir(model: Any, tokenizer: Any, arg: str) -> str:
    """A loaded model (and its tokenizer) written once to ``$RLHFKIT_CACHE/models/<name>-<digest>``, the digest of
    its weights and config: the same weights are written once, and a run resumed with them fingerprints the same."""
    from .files import cache_root, fresh_dir, make_dirs, replace
    from .models.loading import is_peft, save_model
    from .track.console import silence_libraries

    if is_peft(model):
        raise ConfigError(f"{arg} is a PEFT model", where=arg,
                          fix="give the base model and the LoRA settings as peft_config= (rlhfkit applies them)")
    if tokenizer is None:
        raise ConfigError(f"a loaded {arg} needs its tokenizer", where=arg,
                          fix="give processing_class=tokenizer (or tokenizer=)")
    settings = {k: v for k, v in model.config.to_dict().items()  # what saving adds or rewrites left out
                if k not in ("architectures", "_name_or_path", "transformers_version")}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(f"{key}:{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(dtype=_byte_dtype()).numpy().tobytes())
    base = str(getattr(model, "name_or_path", "") or "model").rstrip("/").rsplit("/", 1)[-1] or "model"
    out = cache_root() / "models" / f"{base}-{digest.hexdigest()[:16]}"
    if not (out / "config.json").is_file():
        say(f"[model] the loaded {arg} is written once to {out} (the run's config names that directory)")
        make_dirs(out.parent)
        tmp = fresh_dir(out.with_name(out.name + ".tmp"))
        restore = silence_libraries()  # transformers' "Writing model shards" bar
        try:
            save_model(model, tokenizer, tmp)
        finally:
            restore()
        replace(tmp, out)
    return str(out)


def _byte_dtype():
    import torch

    return torch.uint8


def _data(value: Any, key: str, take_eval: bool) -> dict:
    """``data.<key>`` (and ``data.eval`` from a DatasetDict's test / validation split when ``take_eval``)."""
    from .data.sources import dataset_file

    if isinstance(value, (str, os.PathLike)):
        return {key: str(value)}
    if type(value).__name__ in ("IterableDataset", "IterableDatasetDict"):
        raise ConfigError("a streaming (iterable) dataset has no length to plan a run by", where=f"{key}_dataset",
                          fix="give a datasets.Dataset (e.g. dataset.take(n) then Dataset.from_list)")
    if isinstance(value, Mapping) and value and all(hasattr(v, "column_names") for v in value.values()):  # DatasetDict
        splits = dict(value)
        if key != "train" or "train" not in splits:
            raise ConfigError(f"a DatasetDict with splits {', '.join(splits)} was given as the {key} data",
                              where=f"{key}_dataset", fix="give one split, e.g. dataset['train']")
        out = {"train": dataset_file(splits["train"], "train", "train_dataset['train']")}
        held = next((s for s in ("test", "validation", "eval") if s in splits), None)
        if take_eval and held is not None:
            out["eval"] = dataset_file(splits[held], "eval", f"train_dataset[{held!r}]")
        return out
    return {key: dataset_file(value, key)}


def lora_settings(peft_config: Any) -> dict:
    """``model.lora`` from a ``peft.LoraConfig`` (or a dict of its names): r, lora_alpha, lora_dropout,
    target_modules (``all-linear`` -> null: rlhfkit's per-architecture choice, all linear layers of the blocks where it
    knows none); a setting rlhfkit does not apply (DoRA, rsLoRA, bias, modules_to_save, ...) is refused in one line."""
    get = peft_config.get if isinstance(peft_config, Mapping) else lambda k, d=None: getattr(peft_config, k, d)
    refused = {"use_dora": False, "use_rslora": False, "bias": "none", "modules_to_save": None,
               "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {}}
    for name, default in refused.items():
        value = get(name, default)
        if value not in (default, None) and not (isinstance(default, dict) and not value):
            raise ConfigError(f"peft_config.{name}={value!r} is not applied by rlhfkit's LoRA", where="peft_config",
                              fix=f"leave {name} at its default (rlhfkit trains plain LoRA: r, alpha, dropout, "
                                  "target modules)")
    targets = get("target_modules", None)
    if isinstance(targets, str):  # peft's string form: a regular expression (rlhfkit.models.lora)
        targets = None if targets == "all-linear" else [targets]
    elif targets is not None:
        targets = sorted(targets)
    out = {"enabled": True, "r": get("r", 8), "alpha": get("lora_alpha", 8), "dropout": get("lora_dropout", 0.0),
           "target_modules": targets}
    return {k: v for k, v in out.items() if v is not None or k == "target_modules"}


def reward_entries(reward_funcs: Any, weights: Any) -> list[dict]:
    """``reward.functions`` from the trainer's ``reward_funcs`` (and TRL's ``reward_weights`` from ``args``)."""
    from .rewards.loading import spec_of
    from .rewards.trl_style import keyword_callable

    items = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    entries = []
    for item in items:
        entry = dict(item) if isinstance(item, Mapping) else {"fn": item}
        fn = entry.get("fn")
        if callable(fn):
            # through TRL's argument, a function TRL could call is called TRL's way (on conversational data its
            # completions are messages, as TRL passes them); rlhfkit's positional convention otherwise
            entry.setdefault("convention", "trl" if keyword_callable(fn) else "auto")
            name = getattr(fn, "__name__", None)  # TRL's rewards/<fn.__name__>/mean (a lambda's: <lambda>)
            if isinstance(name, str) and name not in {e.get("name") for e in entries}:
                entry.setdefault("name", name)
            entry["fn"] = spec_of(fn)
        elif not isinstance(fn, str):
            raise ConfigError(f"reward_funcs holds a {type(fn).__name__}", where="reward_funcs",
                              fix="give Python functions, specs (file.py:fn, pkg.mod:fn, built-in names) or dicts")
        entries.append(entry)
    if weights is not None:
        weights = list(weights) if isinstance(weights, (list, tuple)) else [weights]
        if len(weights) != len(entries):
            raise ConfigError(f"reward_weights has {len(weights)} weights for {len(entries)} reward functions",
                              where="reward_weights", fix="give one weight per function")
        entries = [{**e, "weight": w} for e, w in zip(entries, weights)]
    return entries
