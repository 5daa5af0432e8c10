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
  weights' digest (:func:`~rlhfkit.api_inputs.model_dir`), so the run's ``config.yaml`` names a real directory.
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
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .api_inputs import lora_settings, model_dir, reward_entries, trainer_inputs  # noqa: F401 - lora_settings: API
from .config import RECIPES, build_config, locate, read_yaml, trl_entry
from .errors import ConfigError, Stopped, say

__all__ = ["Args", "Callback", "Summary", "Trainer", "TRAINERS", "CONFIGS"]

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
    """What ``train()`` returns: TRL's ``TrainOutput`` fields (``global_step``: the optimizer updates done,
    ``training_loss``: the mean loss over this call's updates, ``metrics``: ``train_runtime``,
    ``train_samples_per_second``, ``train_steps_per_second``, ``train_loss``, ``epoch``; unpacked as TRL's tuple),
    and rlhfkit's summary: the run directory (the CLI's), the last logged metrics (``last_metrics``, TRL's names where
    TRL has the trainer), the closing line printed, and ``stopped``: why the run ended early (a callback's stop), None
    when it ran to its end."""

    recipe: str
    run_dir: Path
    last_metrics: dict
    line: str
    stopped: str | None = None
    global_step: int = 0
    training_loss: float = 0.0
    metrics: dict = dataclasses.field(default_factory=dict)

    @property
    def model_dir(self) -> Path:
        """The trained model's directory (a standard Hugging Face directory: the run directory itself)."""
        return self.run_dir

    def __iter__(self):  # global_step, training_loss, metrics = trainer.train(), as TRL's TrainOutput
        return iter((self.global_step, self.training_loss, self.metrics))


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
    """A recipe's run, made from Python objects (see the module docstring for every argument). Besides ``train()``:
    ``evaluate()``, ``save_model(path)``, ``model``, ``processing_class``, ``state`` and ``args``, as TRL's trainers
    have them."""

    recipe: str | None = None

    def __init__(self, recipe: str | None = None, model: Any = None, args: Any = None, *,
                 train_dataset: Any = None, eval_dataset: Any = None, reward_funcs: Any = None,
                 peft_config: Any = None, callbacks: list | tuple | None = None, processing_class: Any = None,
                 tokenizer: Any = None, ref_model: Any = None, reward_model: Any = None, **unused: Any):
        from .callbacks import TrlBridge, args_view, check_callbacks, is_trainer_callback

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
        checked = check_callbacks(callbacks or ())
        self.callbacks = [cb for cb in checked if not is_trainer_callback(cb)]  # rlhfkit's own (Callback, functions)
        tree, self._source, self._yaml, interface = _args_tree(args, self.recipe)
        if interface is None and args is None and type(self) is not Trainer:
            interface = f"{type(self).__name__} without args"  # TRL's trainer, TRL's defaults
        own = trainer_inputs(self.recipe, model, processing_class or tokenizer, train_dataset, eval_dataset,
                             peft_config, ref_model, reward_model)
        funcs = _one_reward_funcs(tree.pop("reward_funcs", None), reward_funcs)
        if funcs is not None:  # TRL's reward_funcs, in the trainer or in args: callables kept as callables
            own = _merge(own, {"reward": {"functions": reward_entries(funcs, tree.pop("reward_weights", None))}})
        self.config = _build(self.recipe, _merge(tree, own), self._source, yaml_path=self._yaml, interface=interface)
        if getattr(getattr(self.config, "model", None), "name", "") is None:  # as TRL, a trainer needs its model
            raise ConfigError("no model: model=None and args name none (rlhfkit does not pick one)", where="model",
                              fix="give model= (a name, a directory, a .gguf file, or a loaded model with its "
                                  "tokenizer), or model.name in args; model='tiny' is the built-in toy model")
        if peft_config is not None:  # its target modules against the model's own, now (peft would say so only later)
            from .models.lora import check_targets

            check_targets(self.config.model)
        self.args = args if interface is not None and _is_trl_object(args) else args_view(self.config)
        from transformers import TrainerControl, TrainerState

        self.state, self.control = TrainerState(), TrainerControl()
        self._bridge = TrlBridge([cb for cb in checked if is_trainer_callback(cb)], self.args, self.state,
                                 self.control)
        self._given = (model, processing_class or tokenizer)  # a loaded model and tokenizer, as given
        self._loaded: tuple | None = None  # (model, tokenizer) loaded for the properties before train()
        self._unfinished = False  # this trainer's last train() stopped early: the next one resumes it
        self._bridge.call("on_init_end")

    def train(self, resume_from_checkpoint: bool | str | None = None) -> Summary:
        """Run the recipe (as ``rlhfkit <recipe>`` with this config) and return its :class:`Summary` (TRL's
        ``TrainOutput`` fields with it). A run stopped by a callback (it returned True or raised
        ``KeyboardInterrupt``) returns with ``stopped`` set and a checkpoint; a SIGTERM or an error raise as in the CLI
        (a :class:`~rlhfkit.errors.UserError` is one line, never ``sys.exit``); Ctrl-C, or ``sys.exit`` in a callback,
        says its line and the last checkpoint first. ``resume_from_checkpoint``: as TRL's (True: the newest valid
        checkpoint, a path: that one; None: ``train.resume``, TRL's ``never`` for a TRL-configured run -- but after
        this trainer's own run stopped early, train() again resumes it; a new trainer resumes with
        ``resume_from_checkpoint=True``)."""
        from .config import replace
        from .config.aliases import origin_of
        from .track.console import silence_libraries
        from .track.metrics import read_metrics
        from .track.names import public
        from .track.progress import run_summary_line
        from .train.lifecycle.run import with_callbacks
        from .train.lifecycle.stop import AGAIN, AGAIN_NEVER

        cfg = self.config
        if resume_from_checkpoint is None and self._unfinished and cfg.train.resume == "never":
            resume_from_checkpoint = True  # this trainer's own stopped run: train() again resumes it
        if resume_from_checkpoint is not None and resume_from_checkpoint is not False:
            cfg = replace(cfg, train={"resume": "auto" if resume_from_checkpoint is True else
                                      str(resume_from_checkpoint)})
            object.__setattr__(cfg, "_rlhfkit_origin", origin_of(self.config))  # the same run, the same story
        run_dir = Path(cfg.output_dir)
        say(f"[rlhfkit] {self.recipe}: run directory {run_dir.resolve()} (Python, {self._source})")
        restore = silence_libraries()
        started, stopped, metrics = time.time(), None, {}
        bridge = self._bridge
        bridge.loss_sum, bridge.updates, bridge.rows, bridge.stop_reason = 0.0, 0, 0, None
        self.control.should_training_stop = False
        try:
            with with_callbacks([bridge, *self.callbacks]):
                metrics = public(self.recipe, RECIPES[self.recipe].run(cfg) or {})  # TRL's names where TRL has them
        except Stopped as stop:
            self._unfinished = True
            bridge.stopped()  # the policy as it stands is trainer.model; on_train_end, as transformers calls it
            if stop.exit_code != 0:  # a signal, another rank's failure: as in the CLI
                raise
            again = "train() again resumes it"
            stopped = stop.message.replace(AGAIN, again).replace(AGAIN_NEVER, again)
            rows = read_metrics(run_dir)
            metrics = rows[-1] if rows else {}
        except ConfigError as err:  # an input checked when the run starts: file:line when a YAML file set it
            raise locate(err, self._yaml) from None
        except (KeyboardInterrupt, SystemExit) as end:  # Ctrl-C (a stop is Stopped, above), sys.exit in a callback:
            from .train.lifecycle.checkpoint import list_checkpoints  # its line (a script never ends without a word)

            self._unfinished = True
            ckpt = max(list_checkpoints(run_dir), default=(0, None))[1]
            where = f"last checkpoint: {ckpt} (train() again resumes from it)" if ckpt else \
                f"no checkpoint written yet in {run_dir}"
            why = "interrupted (Ctrl-C)" if isinstance(end, KeyboardInterrupt) else \
                f"ended by sys.exit({end.code!r}) inside the run (a callback)"
            say(f"[{self.recipe}] {why}; {where}")
            raise
        finally:
            restore()
        self._unfinished = bool(stopped)  # a stopped run's checkpoint: the next train() goes on from it
        seconds = time.time() - started
        line = run_summary_line(self.recipe, run_dir, seconds, since=started)
        if stopped:
            line = line.replace(f"[{self.recipe}] finished", f"[{self.recipe}] stopped", 1)
            say(f"[{self.recipe}] {stopped}")
        say(line)
        loss = bridge.loss_sum / bridge.updates if bridge.updates else 0.0
        out = {"train_runtime": round(seconds, 4), "train_samples_per_second": round(bridge.rows / seconds, 3),
               "train_steps_per_second": round(bridge.updates / seconds, 3), "train_loss": loss,
               "epoch": self.state.epoch}
        self.state.log_history.append({**out, "step": self.state.global_step})
        return Summary(self.recipe, run_dir, dict(metrics), line, stopped, self.state.global_step, loss, out)

    # ── TRL's trainer surface ────────────────────────────────────────────────────────────────────────────────
    @property
    def model(self):
        """The model: after ``train()``, the policy as trained (in memory; the run directory holds it too); before,
        the model given (or loaded from its name, once)."""
        if self._bridge.model is not None:
            return self._bridge.model
        return self._load()[0]

    @property
    def processing_class(self):
        """The tokenizer: the one given, the run's after ``train()``, else the model's own (loaded once)."""
        if self._bridge.tokenizer is not None:
            return self._bridge.tokenizer
        return self._given[1] if self._given[1] is not None else self._load()[1]

    tokenizer = processing_class

    def _load(self) -> tuple:
        if self._loaded is None:
            given, tok = self._given
            if given is not None and not isinstance(given, (str, os.PathLike)):
                self._loaded = (given, tok)
            else:
                from .models.loading import load_causal_lm

                self._loaded = load_causal_lm(self.config.model, trainable=False)
        return self._loaded

    def save_model(self, output_dir: str | os.PathLike | None = None) -> Path:
        """Write the model and its tokenizer as a Hugging Face directory at ``output_dir`` (default the run
        directory, ``args.output_dir``), as TRL's ``save_model``; the run directory of a finished run already holds
        the trained model (nothing written again)."""
        from .files import make_dirs
        from .models.loading import save_model

        out = Path(output_dir if output_dir is not None else self.config.output_dir)
        finished = (Path(self.config.output_dir) / "finished.json").is_file()
        if finished and out.resolve() == Path(self.config.output_dir).resolve():
            return out
        make_dirs(out)
        save_model(self.model, self.processing_class, out)
        return out

    def evaluate(self, eval_dataset: Any = None) -> dict:
        """The recipe's evaluation of the model as it is (trained, after ``train()``), on ``eval_dataset`` (default
        the trainer's): a run of no update (``train.max_steps=0``) in a fresh directory beside the run's, its
        ``eval_*`` metrics (TRL's names) returned, as TRL's ``evaluate()``."""
        import tempfile

        from .config import replace
        from .track.names import public

        cfg, run_dir = self.config, Path(self.config.output_dir)
        data = dict(trainer_inputs(self.recipe, None, None, None, eval_dataset, None, None, None).get("data", {}))
        if not (data.get("eval") or cfg.data.eval or cfg.data.eval_fraction > 0):
            raise ConfigError("evaluate() has no evaluation data", where="eval_dataset",
                              fix="give eval_dataset= (here or to the trainer)")
        name = cfg.model.name
        if self._bridge.model is not None:  # trained: the run's final model, or (stopped) the weights in memory
            name = str(run_dir) if (run_dir / "finished.json").is_file() else model_dir(
                self._bridge.model, self.processing_class, "model")
        base = run_dir.parent if run_dir.parent.exists() else Path(".")
        with tempfile.TemporaryDirectory(prefix=f".{run_dir.name}-eval-", dir=base) as out:
            ecfg = replace(cfg, output_dir=out, model={"name": name, "lora": {"enabled": False}}, data=data,
                           train={"max_steps": 0, "resume": "never", "save_every": 0},
                           track={"report": False, "progress": False, "sample_every": 0, "backends": ["jsonl"]})
            metrics = public(self.recipe, RECIPES[self.recipe].run(ecfg) or {})
        evals = {k: v for k, v in metrics.items() if k.startswith(("eval_", "eval/"))}
        self.state.log_history.append({**evals, "step": self.state.global_step})
        self._bridge.call("on_evaluate", metrics=evals)
        return evals

    def __repr__(self) -> str:
        return f"{type(self).__name__}(output_dir={self.config.output_dir!r})"


def _is_trl_object(args: Any) -> bool:
    """``args`` is a TRL / transformers config object (not one of rlhfkit's forms)."""
    return args is not None and not isinstance(args, (Args, Mapping, str, os.PathLike)) and \
        (dataclasses.is_dataclass(args) or hasattr(args, "to_dict")) and \
        type(args) not in {r.config for r in RECIPES.values()}


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


def _one_reward_funcs(in_args: Any, given: Any) -> Any:
    """The reward functions, given in ``args`` (``reward_funcs``) or to the trainer: both, naming different ones, is
    refused in one line (one would be dropped without a word)."""
    if in_args is None or given is None:
        return given if in_args is None else in_args
    as_list = [list(v) if isinstance(v, (list, tuple)) else [v] for v in (in_args, given)]
    if len(as_list[0]) == len(as_list[1]) and all(a is b or a == b for a, b in zip(*as_list)):
        return given
    raise ConfigError(f"reward_funcs is given twice with different functions: {_names(as_list[0])} in args and "
                      f"{_names(as_list[1])} to the trainer; one would be dropped", where="reward_funcs",
                      fix="give reward_funcs once (to the trainer, or in args)")


def _names(funcs: list) -> str:
    return "[" + ", ".join(getattr(f, "__name__", None) or repr(f) for f in funcs) + "]"


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

