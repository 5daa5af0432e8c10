"""TRL's callbacks in rlhfkit's runs: ``transformers.TrainerCallback`` objects called with TRL's signature and order.

A TRL script's callbacks (``GRPOTrainer(..., callbacks=[MyCallback()])``) are driven by :class:`TrlBridge`, one object
among a run's callbacks (:mod:`rlhfkit.train.lifecycle.run`: ``Run.tell``), which turns the run's events into the calls
``transformers.Trainer`` makes, each ``(args, state, control, **kwargs)``, on the main process:

================== ===============================================================================================
``on_init_end``    when the trainer is made
``on_train_begin`` before the first update (then ``on_epoch_begin``)
``on_step_begin``  before each optimizer update (``state.global_step``: the updates done before it)
``on_step_end``    after each optimizer update (``state.global_step`` counts it, as TRL counts optimizer steps)
``on_log``         each line of ``metrics.jsonl`` (``logs``: its training metrics), then its evaluation metrics
``on_evaluate``    after ``on_log`` of an evaluation (``metrics``: ``eval_*``)
``on_save``        after a checkpoint is written
``on_epoch_end``   when the run passes an epoch's end (supervised recipes), and at the end
``on_train_end``   after the final model is saved
================== ===============================================================================================

``kwargs``: ``model`` (the policy, unwrapped), ``processing_class`` (its tokenizer), ``optimizer``, ``lr_scheduler``,
``train_dataloader`` and ``eval_dataloader`` (None: rlhfkit plans its batches itself), ``logs`` / ``metrics``.
``state`` is a ``transformers.TrainerState`` (``global_step``, ``max_steps``, ``epoch``, ``log_history``,
``num_input_tokens_seen``), the trainer's ``state``; ``control`` a ``transformers.TrainerControl``:
``should_training_stop`` stops the run at the step boundary with a checkpoint (``train()`` returns, ``stopped`` set;
``train()`` again resumes), ``should_save`` writes a checkpoint there, ``should_evaluate`` evaluates there,
``should_log`` logs there. Calls rlhfkit cannot make are refused when the trainer is made (:func:`check_callbacks`).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from .errors import ConfigError

#: TrainerCallback methods a run does not call, with what to write instead (a subclass overriding one is refused)
REFUSED = {
    "on_substep_end": "rlhfkit accumulates an update's micro-batches inside its step: use on_step_end (after the "
                      "update)",
    "on_pre_optimizer_step": "rlhfkit clips and applies the update inside its NaN guard in one call: use on_step_end "
                             "(gradients are zeroed by then; the update's grad_norm is in the logs)",
    "on_optimizer_step": "use on_step_end (called right after the optimizer step)",
    "on_prediction_step": "rlhfkit evaluates in one call: use on_evaluate (its metrics)",
    "on_predict": "rlhfkit has no predict(): use on_evaluate, or `rlhfkit eval` on the saved model",
    "on_push_begin": "rlhfkit uploads nothing: use on_save, or on_train_end",
}


def _transformers_callback_type():
    try:
        from transformers import TrainerCallback
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    return TrainerCallback


def is_trainer_callback(obj: Any) -> bool:
    """``obj`` is a ``transformers.TrainerCallback`` (an instance or the class itself, as TRL accepts both)."""
    base = _transformers_callback_type()
    if base is None:
        return False
    return isinstance(obj, base) or (isinstance(obj, type) and issubclass(obj, base))


def check_callbacks(callbacks) -> list:
    """The trainer's callbacks, TRL's classes made into instances; one :class:`ConfigError` for a callback that
    overrides a method rlhfkit never calls (:data:`REFUSED`), or that is neither a TrainerCallback, an object with
    rlhfkit's ``on_step`` / ``on_eval`` / ``on_save`` nor a function."""
    base = _transformers_callback_type()
    out = []
    for cb in callbacks:
        if is_trainer_callback(cb):
            cls = cb if isinstance(cb, type) else type(cb)
            for name, instead in REFUSED.items():
                if getattr(cls, name, None) is not getattr(base, name, None):
                    raise ConfigError(f"callback {cls.__name__} overrides {name}, which rlhfkit's loop never calls",
                                      where="callbacks", fix=instead)
            out.append(cb() if isinstance(cb, type) else cb)
        elif callable(cb) or any(hasattr(cb, m) for m in ("on_step", "on_eval", "on_save")):
            out.append(cb)
        else:
            raise ConfigError(f"callbacks holds a {type(cb).__name__}", where="callbacks",
                              fix="give transformers.TrainerCallback objects, rlhfkit.Callback objects or functions")
    return out


def args_view(cfg) -> SimpleNamespace:
    """What callbacks read from ``args`` when the trainer was given no TRL config object: TrainingArguments' names of
    the run's settings (``output_dir``, ``learning_rate``, ``per_device_train_batch_size``, ...)."""
    train, optim = cfg.train, cfg.optim
    return SimpleNamespace(
        output_dir=cfg.output_dir, learning_rate=optim.lr, per_device_train_batch_size=train.batch_size,
        gradient_accumulation_steps=train.grad_accum, num_train_epochs=train.epochs, max_steps=train.max_steps,
        logging_steps=train.log_every, eval_steps=train.eval_every, save_steps=train.save_every, seed=train.seed,
        weight_decay=optim.weight_decay, max_grad_norm=optim.max_grad_norm, lr_scheduler_type=optim.schedule,
        warmup_steps=optim.warmup_steps, report_to=[b for b in cfg.track.backends if b != "jsonl"],
        save_total_limit=train.save_total_limit, resume_from_checkpoint=None)


def _is_eval(key: str) -> bool:
    return key.startswith(("eval_", "eval/"))


class TrlBridge:
    """TRL's callbacks (already checked) driven by a run's events, with the trainer's ``state`` (kept up to date
    even without callbacks: ``trainer.state``) and one ``control``. See the module docstring."""

    def __init__(self, callbacks: list, args: Any, state, control):
        self.callbacks, self.args, self.state, self.control = callbacks, args, state, control
        self.run = None
        self.model = self.tokenizer = None  # the trained policy and its tokenizer, once the run ends
        self.loss_sum, self.updates, self.rows = 0.0, 0, 0  # this train() call's updates: TrainOutput's numbers
        self.stop_reason: str | None = None

    def bind(self, run) -> None:
        self.run = run

    def _kwargs(self) -> dict:
        run, trained = self.run, getattr(self.run, "trained", None)
        model = optimizer = scheduler = None
        if trained is not None:
            name = next(iter(trained.models))  # the policy ("model" or "policy"), the first trained
            model, optimizer, scheduler = trained.parts(name)
            model = run.accelerator.unwrap_model(model) if hasattr(run.accelerator, "unwrap_model") else model
        return {"model": model, "processing_class": getattr(run, "tokenizer", None), "optimizer": optimizer,
                "lr_scheduler": scheduler, "train_dataloader": None, "eval_dataloader": None}

    def call(self, event: str, **extra) -> bool | set | None:
        """Each callback's ``event`` with TRL's arguments (a returned control replaces it, as transformers does);
        then what ``control`` asks: True for a stop, else the set of :data:`~rlhfkit.train.lifecycle.run.REQUESTS`."""
        kwargs = {**(self._kwargs() if self.run is not None else {}), **extra}
        for cb in self.callbacks:
            stopping = self.control.should_training_stop
            out = getattr(cb, event)(self.args, self.state, self.control, **kwargs)
            if out is not None and hasattr(out, "should_training_stop"):
                self.control = out
            if self.control.should_training_stop and not stopping:  # who asked, for the stop's one line
                self.stop_reason = f"a callback ({type(cb).__name__}.{event} set control.should_training_stop)"
        return self._asked()

    def _asked(self) -> bool | set | None:
        c = self.control
        if c.should_training_stop:
            return True
        asked = {w for w, flag in (("save", c.should_save), ("evaluate", c.should_evaluate), ("log", c.should_log))
                 if flag}
        c.should_save = c.should_evaluate = c.should_log = False  # transformers resets them each step, too
        return asked or None

    # ── the run's events (rlhfkit.train.lifecycle.run.Run.tell) ──────────────────────────────────────────────
    def on_train_begin(self, step: int, payload) -> bool | set | None:
        self.state.global_step = step
        self.state.max_steps = int((payload or {}).get("max_steps") or 0)
        self.state.is_world_process_zero = self.state.is_local_process_zero = True
        self.call("on_train_begin")
        return self.call("on_epoch_begin")

    def on_step_begin(self, step: int, payload) -> bool | set | None:
        self.state.global_step = step
        return self.call("on_step_begin")

    def on_update(self, step: int, payload) -> bool | set | None:
        payload = payload or {}
        before = self.state.epoch or 0.0
        self.state.global_step = step
        if payload.get("epoch") is not None:
            self.state.epoch = float(payload["epoch"])
        if payload.get("tokens") is not None:
            self.state.num_input_tokens_seen = int(payload["tokens"])
        if payload.get("loss") is not None:  # TRL's training_loss: the mean over every update
            self.loss_sum, self.updates = self.loss_sum + float(payload["loss"]), self.updates + 1
        self.rows += int(payload.get("rows") or 0)
        out = self.call("on_step_end")
        if self.state.epoch and math.floor(self.state.epoch) > math.floor(before):  # an epoch ended
            out = _merge(out, self.call("on_epoch_end"))
            out = _merge(out, self.call("on_epoch_begin"))
        return out

    def on_step(self, step: int, metrics: dict) -> bool | set | None:
        """A line of metrics.jsonl: ``on_log`` with its training part, then ``on_log`` and ``on_evaluate`` with its
        evaluation part (transformers logs an evaluation separately)."""
        if metrics.get("epoch") is not None:
            self.state.epoch = float(metrics["epoch"])
        train = {k: v for k, v in metrics.items() if not _is_eval(k)}
        evals = {k: v for k, v in metrics.items() if _is_eval(k)}
        out = None
        for part in (train, evals):
            if part:
                logs = {**part, "epoch": self.state.epoch} if "epoch" not in part else part
                self.state.log_history.append({**logs, "step": step})
                out = _merge(out, self.call("on_log", logs=logs))
        if evals:
            out = _merge(out, self.call("on_evaluate", metrics=evals))
        return out

    def on_save(self, step: int, path) -> bool | set | None:
        self.state.global_step = max(self.state.global_step, step)
        return self.call("on_save")

    def on_train_end(self, step: int, model) -> None:
        self.model, self.tokenizer = model, getattr(self.run, "tokenizer", None)
        self.call("on_epoch_end")
        self.call("on_train_end")

    def stopped(self) -> None:
        """The run stopped early (a callback, a signal): the policy as it stands is the trainer's ``model``, and the
        callbacks hear ``on_train_end`` as transformers calls it after a stop."""
        if self.run is not None:
            self.model = self._kwargs()["model"]
            self.tokenizer = getattr(self.run, "tokenizer", None)
        self.call("on_train_end")


def _merge(a, b):
    if a is True or b is True:
        return True
    if isinstance(a, set) or isinstance(b, set):
        return (a or set()) | (b or set())
    return None
