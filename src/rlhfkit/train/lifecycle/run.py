"""The run: its accelerator, directory and metric sink (:class:`Run`), how it starts (:func:`start_run`,
:func:`run_recipe`: seeding, mixed precision, the locked directory), and the set-up both loops make for the models
they train (:func:`set_up_trained`: strategy wrap, optimizer, schedule, prepare, resume, metrics sink).

There are two training loops, sharing everything here and the run's lifecycle (``session.py``, ``checkpoint.py``,
``optim.py``): the supervised loop (``loop.py``: SFT, reward model, offline preference) steps through a dataset;
the online loop (``online.py``: PPO, GRPO, RLOO, REINFORCE++) makes its own data each step (rollout, score,
advantages) and updates a policy and, for PPO, a critic.

Callbacks (the Python API's ``callbacks=``; :func:`with_callbacks` hands them to the runs started inside it) hear of
the run's events through :class:`Run` (:meth:`Run.tell`), on the main process: ``on_train_begin``, ``on_step_begin``
and ``on_update`` around each optimizer update (both loops), ``on_step`` / ``on_eval`` from :meth:`Run.log` (each
logged line, its evaluation part), ``on_save`` from :meth:`Trained.save`, ``on_train_end``; each an optional method
``(step, payload)``. One that returns True (or raises ``KeyboardInterrupt``, as Ctrl-C) asks the run to stop at the
next step boundary, as a SIGTERM does (``stop.StopControl.request``): a checkpoint, then ``Stopped``. One that
returns a set of words asks the loop for that at the next boundary too (:data:`REQUESTS`: ``save`` a checkpoint,
``evaluate``, ``log``; read with :meth:`Run.asked`). TRL's ``TrainerCallback`` objects are driven through this by
:mod:`rlhfkit.callbacks`.
"""

from __future__ import annotations

import contextlib
import contextvars
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MethodType
from typing import Any

import torch

from ...config import RECIPES, DistributedConfig
from ...config.geometry import launched_world_size
from ...config.startup import startup_block
from ...errors import RunError, Stopped, say
from ...track import MetricsSink
from ...track.console import get_console
from ...track.names import public
from .distributed import die_with_launcher, get_strategy
from .optim import build_optimizer, build_scheduler
from .session import Session
from .stop import AGAIN_NEVER, StopControl

#: the callbacks of the runs started in this context (:func:`with_callbacks`)
_CALLBACKS: contextvars.ContextVar[tuple] = contextvars.ContextVar("rlhfkit_callbacks", default=())
#: what a callback may ask a loop for at the next step boundary (besides a stop)
REQUESTS = ("save", "evaluate", "log")


@contextlib.contextmanager
def with_callbacks(callbacks: Sequence) -> Iterator[None]:
    """Runs started inside call ``callbacks`` (objects with any of ``on_step(step, metrics)``, ``on_eval(step,
    metrics)``, ``on_save(step, path)``; a plain function is an ``on_step``)."""
    token = _CALLBACKS.set(tuple(callbacks))
    try:
        yield
    finally:
        _CALLBACKS.reset(token)


@dataclass
class Run:
    """What every recipe needs about the current run: config, accelerator, directory, metric sink."""

    cfg: Any
    accelerator: Any
    run_dir: Path
    sink: MetricsSink | None = None
    started: float = field(default_factory=time.time)
    session: Session | None = None  # the lifecycle of the run directory (train/lifecycle/session.py), made by start_run
    stop: StopControl = field(default_factory=StopControl)  # SIGTERM / SIGUSR1 / another rank's failure (stop.py)
    callbacks: tuple = field(default_factory=_CALLBACKS.get)  # the Python API's (with_callbacks)
    trained: Any = None  # the trained models, optimizers and schedules (set_up_trained), for callbacks
    tokenizer: Any = None  # the policy's tokenizer (the loops set it), for callbacks
    requests: set = field(default_factory=set)  # what callbacks asked for at the next step boundary (REQUESTS)

    def __post_init__(self) -> None:
        if getattr(getattr(self.cfg, "train", None), "resume", None) == "never":  # a rerun starts over
            self.stop.again = AGAIN_NEVER
        for cb in self.callbacks:  # a callback that reads the run (rlhfkit.callbacks) is given it
            if hasattr(cb, "bind"):
                cb.bind(self)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:  # ending early: a signal now must not cut the report (stop.py)
            self.stop.stopping = True
        try:
            if self.session is not None:
                self.session.close(failed=exc_type is not None, error=exc)
        finally:  # several processes: a stopped rank ignores the launcher's SIGTERM to the end
            self.stop.uninstall(keep_ignoring=self.stop.stopping and self.world_size > 1)

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def world_size(self) -> int:
        return self.accelerator.num_processes

    def print(self, *args) -> None:
        if self.is_main:
            get_console().print(*args, markup=False, highlight=False)

    def log(self, metrics: dict, step: int) -> None:
        """One line of metrics at ``step``, under the names the recipe writes (TRL's where TRL has the trainer:
        :func:`rlhfkit.track.names.public`) to ``metrics.jsonl``, the trackers and the callbacks."""
        metrics = public(getattr(self.cfg, "recipe", None), metrics)
        if self.sink is not None:
            extra = self.session.skip_metrics() if self.session is not None else {}
            try:
                self.sink.log({**metrics, **extra}, step)
            except OSError as err:
                raise RunError(f"writing metrics.jsonl failed at step {step}: {err.strerror or err}",
                               where=str(self.run_dir), fix="free disk space and rerun (it resumes from the newest "
                                                            "checkpoint)") from None
        if self.callbacks:
            self.tell("on_step", step, metrics)
            evals = {k: v for k, v in metrics.items() if k.startswith(("eval/", "eval_"))}
            if evals:
                self.tell("on_eval", step, evals)

    def tell(self, event: str, step: int, payload=None) -> None:
        """Call each callback's ``event`` (main process); one returning True, or raising ``KeyboardInterrupt``,
        asks the run to stop at the next step boundary; a set of :data:`REQUESTS` asks for those (a plain function is
        an ``on_step`` callback)."""
        if not self.is_main or not self.callbacks:
            return
        for cb in self.callbacks:
            fn = getattr(cb, event, None)
            if fn is None and event == "on_step" and not hasattr(cb, "on_eval") and callable(cb):
                fn = cb
            if fn is None:
                continue
            who = (f"{type(cb).__name__ if fn is not cb else ''}{'.' if fn is not cb else ''}"
                   f"{getattr(fn, '__name__', event)}")
            try:
                out = fn(step, payload)
            except Stopped:
                raise
            except KeyboardInterrupt:  # as Ctrl-C: stop at this boundary, with its checkpoint and one line
                self.stop.request(f"a KeyboardInterrupt raised in a callback ({who})")
                continue
            if out is True:
                self.stop.request(getattr(cb, "stop_reason", None) or f"a callback ({who})")
            elif isinstance(out, (set, frozenset)):
                self.requests |= set(out) & set(REQUESTS)

    def asked(self, what: str) -> bool:
        """Whether a callback asked for ``what`` (one of :data:`REQUESTS`) at this boundary (then forgotten)."""
        found = what in self.requests
        self.requests.discard(what)
        return found


def set_seed(seed: int) -> None:
    """Seed Python's, numpy's (when installed) and torch's generators."""
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass
    torch.manual_seed(seed)


def mixed_precision(name: str, cpu: bool = False) -> str:
    """accelerate's precision for ``train.mixed_precision`` (``auto``: bf16 where CUDA supports it, else none;
    ``cpu``: the run trains on the CPU, ``train.device=cpu``)."""
    if name == "auto":
        return "bf16" if not cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    return name


def collective_timeout(cfg):
    """``distributed.timeout_s`` for the process group accelerate creates (the first run of a process creates it)."""
    from datetime import timedelta

    from accelerate.utils import InitProcessGroupKwargs

    dist = getattr(cfg, "distributed", None) or DistributedConfig()  # a config without the section: its default
    return InitProcessGroupKwargs(timeout=timedelta(seconds=dist.timeout_s))


def start_run(cfg, *, resume_step: int | None = None) -> Run:
    """Create the accelerator and the run directory, lock it, seed everything. Use as ``with start_run(cfg) as
    run:`` so the directory is released (and, after a failure before the first line, left as it was)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    # accelerate keeps one state per process, but a pipeline (or a test session) runs stage after stage in one
    # process, each with its own mixed precision: forget the last stage's (the process group itself is kept)
    AcceleratorState._reset_state()
    die_with_launcher()  # torchrun: a killed launcher takes its workers with it
    # cpu=True without CUDA: only then does accelerate set up DDP (gloo) for processes started by torchrun
    cpu = cfg.train.device == "cpu" or not torch.cuda.is_available()  # train.device=cpu: TRL's use_cpu=True
    accelerator = Accelerator(mixed_precision=mixed_precision(cfg.train.mixed_precision, cpu),
                              cpu=cpu, kwargs_handlers=[collective_timeout(cfg)],
                              **get_strategy(cfg).accelerator_kwargs(cfg))
    run_dir = Path(cfg.output_dir)
    created = not run_dir.exists()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    run = Run(cfg=cfg, accelerator=accelerator, run_dir=run_dir)
    run.session = Session(run, created=created)
    run.stop.install()  # every process: SIGTERM / SIGUSR1 end the run at a step boundary with a checkpoint
    try:
        run.session.acquire()
    except BaseException:
        run.stop.uninstall()
        raise
    set_seed(cfg.train.seed)
    return run


def check_lora(cfg) -> None:
    """LoRA's target modules against the model's own, before the data, the rewards or any weights
    (:func:`rlhfkit.models.lora.check_targets`)."""
    mcfg = getattr(cfg, "model", None)
    if mcfg is not None and getattr(mcfg, "lora", None) is not None:
        from ...models.lora import check_targets

        check_targets(mcfg)


def run_recipe(cfg, train: Callable[..., dict], *, prepare: Callable[[Any], Any] | None = None) -> dict:
    """What every runner does around its training: check the inputs, ``prepare(cfg)`` (what can be read before the
    run directory is locked, e.g. data records; passed on to ``train``), lock and start the run, answer a finished
    one, then ``train(cfg, run[, prepared])`` inside the run's Session. Returns the final metrics. A vision-language
    policy gets LoRA by default first (:func:`~rlhfkit.models.lora.lora_by_default`)."""
    from ...models.lora import lora_by_default

    cfg = lora_by_default(cfg)
    cfg.check_inputs()
    check_lora(cfg)
    prepared = prepare(cfg) if prepare is not None else None
    if RECIPES[cfg.recipe].family != "online":  # the online recipes say theirs with the step's geometry
        block = startup_block(cfg, launched_world_size())
        if block:
            say(block)
    with start_run(cfg) as run:
        done = run.session.begin()
        if done is not None:
            return done
        return train(cfg, run) if prepare is None else train(cfg, run, prepared)


# ─────────────────────────────────────── set-up of the trained models ────────────────────────────────────────


@dataclass
class Trained:
    """The models a loop trains, by name (the names key their entries in checkpoints and their NaN guards), each
    with its optimizer and schedule, prepared by the strategy; ``state`` is the resumed checkpoint's loop state
    (``state.json``: ``step`` and what the loop saved), None when the run starts over."""

    session: Session
    models: dict[str, Any]
    optimizers: dict[str, torch.optim.Optimizer]
    schedulers: dict[str, Any]
    state: dict | None

    def parts(self, name: str) -> tuple[Any, torch.optim.Optimizer, Any]:
        """(model, optimizer, schedule) of ``name``."""
        return self.models[name], self.optimizers[name], self.schedulers[name]

    def save(self, step: int, state: dict, local: dict | None = None):
        """``checkpoint-<step>``: every model, optimizer and schedule, the loop's ``state`` and this process's own
        ``local`` part when given (every process); then the callbacks' ``on_save``. False when the session wrote
        none (:meth:`Session.save <rlhfkit.train.lifecycle.session.Session.save>`: no update applied yet)."""
        path = self.session.save(step, models=self.models, optimizers=self.optimizers, schedulers=self.schedulers,
                                 state=state, local=local)
        run = self.session.run
        if run.callbacks and path:
            run.tell("on_save", step, path)
        return path


def set_up_trained(run: Run, models: dict[str, Any], total_updates: int, *,
                   lrs: dict[str, float | None] | None = None) -> Trained:
    """What both loops do before their first update, for the models they train (``{name: model}``, in order):
    1. the strategy wraps each (fsdp2 shards it first, so its optimizer holds the shards)  2. AdamW over each
    (``lrs[name]`` instead of ``optim.lr`` when given)  3. its LR schedule over ``total_updates`` (ours, stepped once
    per update, never prepared)  4. models and optimizers prepared in one call  5. resume the checkpoint the session
    chose, or start over  6. open the metrics sink (staged: the earlier run's files are replaced with the first
    line). A causal LM keeps its logits' dtype under mixed precision (:func:`keep_logits_dtype`)."""
    cfg, strategy, lrs = run.cfg, get_strategy(run.cfg), lrs or {}
    wrapped = {name: strategy.wrap(model, cfg, run.device) for name, model in models.items()}
    optimizers, schedulers = {}, {}
    for name, model in wrapped.items():
        optimizers[name] = build_optimizer(model.parameters(), cfg.optim, lr=lrs.get(name))
        schedulers[name] = build_scheduler(optimizers[name], cfg.optim, total_updates)
    prepared = strategy.prepare(run.accelerator, *(x for name in wrapped for x in (wrapped[name], optimizers[name])))
    names = list(wrapped)
    models = {name: prepared[2 * i] for i, name in enumerate(names)}
    optimizers = {name: prepared[2 * i + 1] for i, name in enumerate(names)}
    for model in models.values():
        keep_logits_dtype(run.accelerator, model)
    state = run.session.resume(models=models, optimizers=optimizers, schedulers=schedulers)
    run.session.open_sink()
    run.trained = Trained(run.session, models, optimizers, schedulers, state)
    return run.trained


def keep_logits_dtype(accelerator, model) -> None:
    """Under mixed precision, a prepared causal LM returns its logits in the dtype it computed them in (bf16), not
    in float32: accelerate's ``prepare`` wraps ``forward`` in autocast *and* ``convert_outputs_to_fp32``, so the
    policy handed its losses a float32 copy of the [B, T, V] logits (805 MiB at B=16, T=256, V=49152;
    ``bench/README.md``, e4). Training reads no logits at all now (the fused head, ``train/shared/forward.py``, returns
    float32 statistics in their place); a model whose logits are read (the plain path of a model that changes them
    after its head, evaluation) gets them in bf16, and ``algos.token_logprobs`` / ``entropy_from_logits`` work on
    float32 blocks themselves, so the copy bought nothing. The model keeps
    accelerate's autocast (rollouts and forwards still run in bf16); other models (value / reward heads, whose
    outputs are small) keep accelerate's wrapper. Nothing to do without native mixed precision."""
    inner = accelerator.unwrap_model(model, keep_fp32_wrapper=True)
    original = getattr(inner, "_original_forward", None)
    if original is None or not accelerator.native_amp or inner.get_output_embeddings() is None:
        return
    from accelerate.utils import get_mixed_precision_context_manager

    autocast = get_mixed_precision_context_manager(accelerator.native_amp, accelerator.autocast_handler)
    func = getattr(original, "__func__", None)
    inner.forward = MethodType(autocast(func), inner) if func is not None else autocast(original)
