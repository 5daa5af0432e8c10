"""The Python API: the CLI's recipes as trainer objects, shaped as TRL's are.

    from rlhfkit import GRPOTrainer, GRPOConfig
    trainer = GRPOTrainer(model="tiny", reward_funcs=[f], args=GRPOConfig(learning_rate=1e-5), train_dataset=ds)
    summary = trainer.train()

One trainer class per recipe of :data:`rlhfkit.config.RECIPES` (``SFTTrainer``, ``RewardTrainer``, ``PPOTrainer``,
``GRPOTrainer``, ``RLOOTrainer``, ``ReinforceTrainer``, ``DistillTrainer``, ``DPOTrainer``, ``IPOTrainer``,
``KTOTrainer``, ``SimPOTrainer``, ``ORPOTrainer``, ``PipelineTrainer``), generated from the table, plus
:class:`Trainer` (``Trainer("grpo", ...)``); and per recipe a ``<Name>Config`` taking rlhfkit's keys or TRL's names
(:class:`Args`). A trainer builds the recipe's config when it is made, so a mistake is one
:class:`~rlhfkit.errors.UserError` raised there, before any weights load, as the CLI's one line; ``train()`` runs the
recipe exactly as ``rlhfkit <recipe>`` does (the same run directory, files, resume) and returns a :class:`Summary`.

What each argument may be:

* ``args``: a ``<Name>Config(...)``, a dict (rlhfkit keys, nested or dotted, and TRL names), the path of a YAML config,
  an rlhfkit config object (``rlhfkit.config.OnlineConfig``), or a TRL config object (``trl.GRPOConfig``, read by
  attribute: the fields that differ from that class's defaults, through the table of TRL names; TRL itself is never
  imported here).
* ``model``: a name as ``model.name`` takes (directory, cached hub name, GGUF file, ``tiny:...``), or a loaded model
  with its tokenizer (``processing_class=`` or ``tokenizer=``): written once to rlhfkit's cache, named by its
  weights' digest (:func:`_model_dir`), so the run's ``config.yaml`` names a real directory.
* ``train_dataset`` / ``eval_dataset``: what ``data.train`` takes (a file, a directory, a ``datasets`` name,
  ``reasoning_gym:NAME?...``), a ``datasets.Dataset``, a ``DatasetDict`` (its ``train`` split, and ``test`` /
  ``validation`` for evaluation), or a list of dicts: Python objects are written once as JSON lines to the cache,
  named by their content (:func:`rlhfkit.data.sources.dataset_file`).
* ``reward_funcs``: one or a list of Python callables, specs (``file.py:fn``, ``pkg.mod:fn``, built-in names) or
  ``reward.functions`` entries (dicts); a callable a worker process can import runs there by reference, another
  (a script's own function, a lambda) in this process under the same time limit (one line says so). Callables are
  called TRL's way when their signature allows it (``f(completions, **kwargs)``, ``f(prompts, completions,
  **kwargs)``: keywords, conversational completions as messages; :mod:`rlhfkit.rewards.trl_style`).
* ``peft_config``: a ``peft.LoraConfig`` (or a dict of its names): ``model.lora``.
* ``callbacks``: objects with any of ``on_step(step, metrics)``, ``on_eval(step, metrics)``, ``on_save(step, path)``
  (:class:`Callback`), or plain functions (``on_step``); one returning True stops the run cleanly at the next step
  boundary with a checkpoint (``Summary.stopped`` says so; the same call of ``train()`` again resumes it).

The trainer's own arguments win over the same settings in ``args`` (as the command line wins over a config file).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import RECIPES, build_config, locate, read_yaml, trl_entry
from .errors import ConfigError, Stopped, say

__all__ = ["Args", "Callback", "Summary", "Trainer", "TRAINERS", "CONFIGS"]

_DATA_KEYS = {"train_dataset": "train", "eval_dataset": "eval"}
#: TRL trainer arguments rlhfkit has no use for: refused with why (a silent drop would change the user's run)
_REFUSED = {
    "data_collator": "rlhfkit collates by the data format (data.format, data.packing)",
    "optimizers": "rlhfkit builds AdamW and its schedule from optim.*",
    "optimizer_cls_and_kwargs": "rlhfkit builds AdamW and its schedule from optim.*",
    "compute_metrics": "rlhfkit's evaluation metrics are the recipe's own (eval/* in metrics.jsonl)",
    "preprocess_logits_for_metrics": "rlhfkit's evaluation metrics are the recipe's own",
    "formatting_func": "give the data as prompt / completion or messages columns (data.fields maps other names)",
    "reward_processing_classes": "a reward model's tokenizer is read from its directory",
    "model_init": "give model= (a name or a loaded model)",
    "rollout_func": "multi-turn episodes are environments: env.name (rlhfkit/envs)",
    "environment_factory": "multi-turn episodes are environments: env.name (rlhfkit/envs)",
    "tools": "tool use is an environment: env.name=calculator or your own (rlhfkit/envs)",
}


class Callback:
    """What a run tells a callback (every method optional; return True from one to stop the run at the next step
    boundary with a checkpoint). Called on the main process; ``metrics`` is the step's line of ``metrics.jsonl``."""

    def on_step(self, step: int, metrics: dict) -> bool | None:
        """A logged step (every ``train.log_every`` updates online: every rollout step)."""

    def on_eval(self, step: int, metrics: dict) -> bool | None:
        """An evaluation: the ``eval/*`` metrics of the step."""

    def on_save(self, step: int, path: Path) -> bool | None:
        """A checkpoint written (``path``: its directory)."""


@dataclass(frozen=True)
class Summary:
    """What ``train()`` returns: the run directory (the CLI's), the last logged metrics, the closing line printed,
    and ``stopped``: why the run ended early (a callback's stop), None when it ran to its end."""

    recipe: str
    run_dir: Path
    metrics: dict
    line: str
    stopped: str | None = None

    @property
    def model_dir(self) -> Path:
        """The trained model's directory (a standard Hugging Face directory: the run directory itself)."""
        return self.run_dir


class Args(dict):
    """Settings of one recipe by rlhfkit key (``optim={"lr": 1e-5}`` or ``**{"optim.lr": 1e-5}``) or TRL name
    (``learning_rate=1e-5``), checked when made (a mistake is one :class:`~rlhfkit.errors.ConfigError` here).
    ``<Name>Config`` is this class for the recipe ``name`` (``rlhfkit.GRPOConfig``)."""

    recipe = "sft"

    def __init__(self, **values: Any):
        super().__init__(values)
        _build(self.recipe, _tree(values), "args", check=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.items())})"


class Trainer:
    """A recipe's run, made from Python objects (see the module docstring for every argument)."""

    recipe: str | None = None

    def __init__(self, recipe: str | None = None, model: Any = None, args: Any = None, *,
                 train_dataset: Any = None, eval_dataset: Any = None, reward_funcs: Any = None,
                 peft_config: Any = None, callbacks: list | tuple | None = None, processing_class: Any = None,
                 tokenizer: Any = None, ref_model: Any = None, reward_model: Any = None, **unused: Any):
        if self.recipe is not None and recipe is not None:  # GRPOTrainer("tiny"): the model, positionally
            recipe, model, args = None, recipe, model if args is None else args
        self.recipe = recipe if self.recipe is None else self.recipe
        if self.recipe not in RECIPES:
            raise ConfigError(f"unknown recipe {self.recipe!r}", where="Trainer",
                              fix=f"use one of {', '.join(RECIPES)}")
        for name, value in unused.items():
            if value is None:
                continue
            why = _REFUSED.get(name)
            raise ConfigError(f"{type(self).__name__} has no argument {name!r}" + (f": {why}" if why else ""),
                              where=name, fix=f"remove {name}" if why else
                              "see help(rlhfkit.Trainer) for the arguments")
        self.callbacks = list(callbacks or ())
        tree, self._source, self._yaml, interface = _args_tree(args, self.recipe)
        if interface is None and args is None and type(self) is not Trainer:
            interface = f"{type(self).__name__} without args"  # TRL's trainer, TRL's defaults
        own = _inputs(self.recipe, model, processing_class or tokenizer, train_dataset, eval_dataset, peft_config,
                      ref_model, reward_model)
        funcs = tree.pop("reward_funcs", None) if reward_funcs is None else reward_funcs
        tree.pop("reward_funcs", None)
        if funcs is not None:  # TRL's reward_funcs, in the trainer or in args: callables kept as callables
            own = _merge(own, {"reward": {"functions": _reward_entries(funcs, tree.pop("reward_weights", None))}})
        self.config = _build(self.recipe, _merge(tree, own), self._source, yaml_path=self._yaml, interface=interface)

    def train(self, resume_from_checkpoint: bool | str | None = None) -> Summary:
        """Run the recipe (as ``rlhfkit <recipe>`` with this config) and return its :class:`Summary`. A run stopped
        by a callback returns (``stopped`` set); a SIGTERM, an error or Ctrl-C raise as in the CLI (a
        :class:`~rlhfkit.errors.UserError` is one line, never ``sys.exit``). ``resume_from_checkpoint``: as TRL's
        (True: the newest valid checkpoint, a path: that one; rlhfkit resumes by default, ``train.resume``)."""
        from .config import replace
        from .track.console import silence_libraries
        from .track.metrics import read_metrics
        from .track.names import public
        from .track.progress import run_summary_line
        from .train.lifecycle.run import with_callbacks

        cfg = self.config
        if resume_from_checkpoint is not None and resume_from_checkpoint is not False:
            cfg = replace(cfg, train={"resume": "auto" if resume_from_checkpoint is True else
                                      str(resume_from_checkpoint)})
        run_dir = Path(cfg.output_dir)
        say(f"[rlhfkit] {self.recipe}: run directory {run_dir.resolve()} (Python, {self._source})")
        restore = silence_libraries()
        started, stopped, metrics = time.time(), None, {}
        try:
            with with_callbacks(self.callbacks):
                metrics = public(self.recipe, RECIPES[self.recipe].run(cfg) or {})  # TRL's names where TRL has them
        except Stopped as stop:
            if stop.exit_code != 0:  # a signal, another rank's failure: as in the CLI
                raise
            stopped = stop.message.replace("rerun the same command to resume", "train() again resumes it")
            rows = read_metrics(run_dir)
            metrics = rows[-1] if rows else {}
        except ConfigError as err:  # an input checked when the run starts: file:line when a YAML file set it
            raise locate(err, self._yaml) from None
        finally:
            restore()
        line = run_summary_line(self.recipe, run_dir, time.time() - started, since=started)
        if stopped:
            line = line.replace(f"[{self.recipe}] finished", f"[{self.recipe}] stopped", 1)
            say(f"[{self.recipe}] {stopped}")
        say(line)
        return Summary(self.recipe, run_dir, dict(metrics), line, stopped)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(output_dir={self.config.output_dir!r})"


# ─────────────────────────────────────────────── building the config ─────────────────────────────────────────


def _tree(values: Mapping) -> dict:
    """``values`` with dotted keys (``optim.lr``) expanded into nested mappings."""
    out: dict = {}
    for key, value in values.items():
        node = out
        *parents, last = str(key).split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"'{key}' sets a key inside '{part}', which is not a section", where=str(key),
                                  fix="give each key once")
        node[last] = _merge(node[last], value) if isinstance(node.get(last), dict) and isinstance(value, dict) \
            else value
    return out


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def _build(recipe: str, tree: dict, source: str, *, yaml_path: str | None = None, check: bool = False,
           interface: str | None = None):
    """The recipe's frozen config from ``tree`` (ConfigError located in ``yaml_path`` when the file set the key).
    ``check``: only validate (TRL's reward_weights wait for the trainer's reward functions); ``interface``: the run
    is configured through TRL's interface, so TRL's defaults (:func:`rlhfkit.config.aliases.defaults_mode`)."""
    if check:
        tree = {k: v for k, v in tree.items() if k not in ("reward_weights", "reward_funcs")}
    from .config.trl_defaults import trl_defaults

    try:
        return build_config(recipe, tree, source=source,
                            interface=interface if trl_defaults(recipe) is not None else None)
    except ConfigError as err:
        raise locate(err, yaml_path) from None


def _args_tree(args: Any, recipe: str) -> tuple[dict, str, str | None, str | None]:
    """(the settings of ``args`` as a mapping for ``build_config``, where they came from, the YAML path, and how the
    run is configured through TRL's interface when it is: a TRL config object, a ``<Name>Config`` or dict with no
    rlhfkit key; None: the settings decide, TRL names or not)."""
    if args is None:
        return {}, "recipe defaults", None, None
    if isinstance(args, Args):
        if RECIPES[args.recipe].config is not RECIPES[recipe].config:
            raise ConfigError(f"{type(args).__name__} holds {args.recipe} settings, not {recipe}'s", where="args",
                              fix=f"use {RECIPES[recipe].api_name}Config")
        tree = _tree(args)
        return tree, type(args).__name__, None, _no_own_keys(tree, recipe, type(args).__name__)
    if isinstance(args, (str, os.PathLike)):
        return read_yaml(args), str(args), str(args), None
    if isinstance(args, Mapping):
        tree = _tree(args)
        return tree, "args", None, _no_own_keys(tree, recipe, "a dict")
    if dataclasses.is_dataclass(args) and type(args) in {r.config for r in RECIPES.values()}:
        if type(args) is not RECIPES[recipe].config:
            raise ConfigError(f"args is a {type(args).__name__}, not the {recipe} recipe's config", where="args",
                              fix=f"give a {RECIPES[recipe].config.__name__}")
        tree = _as_tree(args)
        tree["recipe"] = recipe
        return tree, type(args).__name__, None, None
    if dataclasses.is_dataclass(args) or hasattr(args, "to_dict"):
        name = f"{type(args).__module__}.{type(args).__name__}"
        return trl_args(args, recipe), name, None, name
    raise ConfigError(f"args is a {type(args).__name__}", where="args",
                      fix=f"give {RECIPES[recipe].api_name}Config(...), a dict, a YAML path, or a TRL config object")


#: keys of a recipe config that are no sign of either interface (TRL has output_dir too)
_NEUTRAL_KEYS = ("output_dir", "recipe")


def _no_own_keys(tree: dict, recipe: str, what: str) -> str | None:
    """The words for "configured through TRL's interface" when ``tree`` holds none of rlhfkit's own keys (an empty
    ``GRPOConfig()``, a dict of TRL names); None otherwise (rlhfkit's keys, or ``defaults`` said)."""
    own = {fl.name for fl in dataclasses.fields(RECIPES[recipe].config)} - set(_NEUTRAL_KEYS)
    if any(k in own for k in tree):
        return None
    return f"{what} without rlhfkit keys"


def _as_tree(obj) -> Any:
    """A config object as the mapping of its keys (``algo.async``, whose field is ``async_``)."""
    from .config.schema import key_of

    if dataclasses.is_dataclass(obj):
        return {key_of(fl.name): _as_tree(getattr(obj, fl.name)) for fl in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [_as_tree(v) for v in obj]
    return obj


def trl_args(obj: Any, recipe: str) -> dict:
    """The settings of a TRL config object (``trl.GRPOConfig(...)``, any ``TrainingArguments``), read by attribute:
    each field whose value differs from what a default instance of the same class holds (a field TRL derives from
    others, such as ``generation_batch_size``, compared with an instance built from the same given fields), by its
    TRL name, for the table of TRL names to rename, translate or refuse. TRL need not be installed: only the
    object's class is used."""
    cls = type(obj)
    names = [fl.name for fl in dataclasses.fields(obj) if fl.init] if dataclasses.is_dataclass(obj) \
        else list(obj.to_dict())
    values = {n: getattr(obj, n) for n in names if hasattr(obj, n)}

    def default_of(name: str):
        fl = next((f for f in dataclasses.fields(cls) if f.name == name), None) if dataclasses.is_dataclass(cls) \
            else None
        if fl is None:
            return None
        if fl.default is not dataclasses.MISSING:
            return fl.default
        return fl.default_factory() if fl.default_factory is not dataclasses.MISSING else None

    def build(**kw):  # an instance of the same class (its __post_init__ run), or None when it refuses these
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return cls(**kw)
            except Exception:  # noqa: BLE001 - e.g. TrainingArguments' bf16 on a machine without it
                return None

    # 1. fields the user set: those whose class default is a value and that differ from a default instance's (built
    #    with the device settings the user gave: TrainingArguments refuses its own bf16 default without a GPU)
    device = {n: values[n] for n in _DEVICE_FIELDS if n in values}
    fresh = build() or build(**device)
    given = {n: v for n, v in values.items() if default_of(n) is not None
             and not _same(v, getattr(fresh, n, default_of(n)) if fresh is not None else default_of(n))}
    # 2. fields declared None, which the class may derive from others (generation_batch_size): in declaration
    #    order, one is the user's when an instance built from what was found so far holds another value for it
    given.update({n: v for n, v in device.items() if v is not None and not _same(v, default_of(n))
                  and not (n in ("use_cpu", "no_cuda") and v is True and not _cuda())})  # what it does anyway
    derived = build(**{**device, **given})
    for n, v in values.items():
        if default_of(n) is None and v is not None and not _same(v, getattr(derived, n, None)):
            given[n] = v
            derived = build(**{**device, **given})
    out = {}
    for name, value in given.items():
        if name in ("output_dir",) or trl_entry(name, recipe, f"args ({cls.__name__})") is not None:
            out[name] = _plain(value)
        else:
            raise ConfigError(f"'{name}' of {cls.__name__} is not a TRL setting rlhfkit knows", where=name,
                              fix=f"remove it, or set the rlhfkit key it stands for (`rlhfkit config show {recipe}`)")
    return out


_DEVICE_FIELDS = ("use_cpu", "no_cuda", "bf16", "fp16", "tf32")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - e.g. tensors
        return a is b


def _plain(value: Any) -> Any:
    """An enum (TRL's IntervalStrategy.NO) as its value; everything else as it is."""
    return value.value if hasattr(value, "value") and type(value).__module__ != "builtins" else value


# ─────────────────────────────────────────────── the trainer's inputs ────────────────────────────────────────


def _inputs(recipe: str, model, tokenizer, train, evals, peft_config, ref_model, reward_model) -> dict:
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
    return _model_dir(model, tokenizer, arg)


def _model_dir(model: Any, tokenizer: Any, arg: str) -> str:
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
        out = {"train": dataset_file(splits["train"], "train")}
        held = next((s for s in ("test", "validation", "eval") if s in splits), None)
        if take_eval and held is not None:
            out["eval"] = dataset_file(splits[held], "eval")
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
    if isinstance(targets, str):
        targets = None if targets == "all-linear" else [targets]
    elif targets is not None:
        targets = sorted(targets)
    out = {"enabled": True, "r": get("r", 8), "alpha": get("lora_alpha", 8), "dropout": get("lora_dropout", 0.0),
           "target_modules": targets}
    return {k: v for k, v in out.items() if v is not None or k == "target_modules"}


def _reward_entries(reward_funcs: Any, weights: Any) -> list[dict]:
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


# ─────────────────────────────────────────────── one class per recipe ────────────────────────────────────────


def _recipe_classes() -> tuple[dict[str, type], dict[str, type]]:
    trainers, configs = {}, {}
    for name, spec in RECIPES.items():
        doc = f"rlhfkit {name}: {spec.description} (see rlhfkit.api)."
        trainers[f"{spec.api_name}Trainer"] = type(f"{spec.api_name}Trainer", (Trainer,),
                                                   {"recipe": name, "__doc__": doc, "__module__": __name__})
        configs[f"{spec.api_name}Config"] = type(f"{spec.api_name}Config", (Args,),
                                                 {"recipe": name, "__module__": __name__,
                                                  "__doc__": f"Settings of the {name} recipe (see rlhfkit.api.Args)."})
    return trainers, configs


TRAINERS, CONFIGS = _recipe_classes()
globals().update(TRAINERS)
globals().update(CONFIGS)
__all__ += [*TRAINERS, *CONFIGS]

