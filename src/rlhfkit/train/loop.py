"""The one training loop, on ``accelerate``: run set-up, optimizer and schedule, checkpoints, and the supervised
loop shared by SFT, reward modelling and offline preference recipes (the online recipes reuse every piece but the
loop itself, see ``online.py``).

Departures from ``transformers.Trainer`` on purpose: batches are planned from a seeded permutation per epoch and
sharded by rank here (so resuming is "skip to batch k" without replaying data, and every process sees the same
order); the scheduler is stepped once per optimizer update (never ``num_processes`` times); checkpoints hold only
trainable tensors, optimizer, scheduler, RNG and data position, and are written to a temporary directory then
renamed, so a crash never leaves a half checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import random
import shutil
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, NonFiniteError, RunError
from ..models.loading import trainable_state_dict
from ..track import MetricsSink, Progress
from ..track.console import get_console
from ..track.jsonl import fsync_dir
from .common import to_device
from .distributed import die_with_launcher, get_strategy

# ───────────────────────────────────────────────────── run ────────────────────────────────────────────────────


@dataclass
class Run:
    """What every recipe needs about the current run: config, accelerator, directory, metric sink."""

    cfg: Any
    accelerator: Any
    run_dir: Path
    sink: MetricsSink | None = None
    started: float = field(default_factory=time.time)
    session: Any = None  # the lifecycle of the run directory (train/session.py), made by start_run

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.session is not None:
            self.session.close(failed=exc_type is not None)

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
        if self.sink is not None:
            extra = self.session.skip_metrics() if self.session is not None else {}
            try:
                self.sink.log({**metrics, **extra}, step)
            except OSError as err:
                raise RunError(f"writing metrics.jsonl failed at step {step}: {err.strerror or err}",
                               where=str(self.run_dir), fix="free disk space and rerun (it resumes from the newest "
                                                            "checkpoint)") from None


def set_seed(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass
    torch.manual_seed(seed)


def mixed_precision(name: str) -> str:
    if name == "auto":
        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    return name


def start_run(cfg, *, resume_step: int | None = None) -> Run:
    """Create the accelerator and the run directory, lock it, seed everything. Use as ``with start_run(cfg) as
    run:`` so the directory is released (and, after a failure before the first line, left as it was)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from .session import Session

    # accelerate keeps one state per process, but a pipeline (or a test session) runs stage after stage in one
    # process, each with its own mixed precision: forget the last stage's (the process group itself is kept)
    AcceleratorState._reset_state()
    die_with_launcher()  # torchrun: a killed launcher takes its workers with it
    # cpu=True without CUDA: only then does accelerate set up DDP (gloo) for processes started by torchrun
    accelerator = Accelerator(mixed_precision=mixed_precision(cfg.train.mixed_precision),
                              cpu=not torch.cuda.is_available(), **get_strategy(cfg).accelerator_kwargs(cfg))
    run_dir = Path(cfg.output_dir)
    created = not run_dir.exists()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    run = Run(cfg=cfg, accelerator=accelerator, run_dir=run_dir)
    run.session = Session(run, created=created)
    run.session.acquire()
    set_seed(cfg.train.seed)
    return run


def run_recipe(cfg, train: Callable[..., dict], *, prepare: Callable[[Any], Any] | None = None) -> dict:
    """What every runner does around its training: check the inputs, ``prepare(cfg)`` (what can be read before the
    run directory is locked, e.g. data records; passed on to ``train``), lock and start the run, answer a finished
    one, then ``train(cfg, run[, prepared])`` inside the run's Session. Returns the final metrics."""
    cfg.check_inputs()
    prepared = prepare(cfg) if prepare is not None else None
    with start_run(cfg) as run:
        done = run.session.begin()
        if done is not None:
            return done
        return train(cfg, run) if prepare is None else train(cfg, run, prepared)


# ────────────────────────────────────────────── optimizer & schedule ─────────────────────────────────────────


def build_optimizer(params, optim, lr: float | None = None) -> torch.optim.Optimizer:
    """AdamW over trainable parameters; no weight decay on biases and norms (1-D tensors)."""
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ConfigError("the model has no trainable parameters", where="model.lora",
                          fix="check model.lora.target_modules")
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr if lr is not None else optim.lr,
                             betas=tuple(optim.betas), eps=optim.eps)


# our schedule names -> transformers.get_scheduler's
HF_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup"}


def lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    """Multiplier of the peak LR after ``step`` updates: linear warm-up, then linear / cosine decay or constant.

    The curves are ``transformers.get_scheduler``'s, read one update ahead during warm-up: transformers runs the
    first update at LR 0 (``step / warmup``); here it runs at ``1 / warmup`` of the peak and the warm-up's last
    update at the peak, so no update is wasted. Past ``total`` the multiplier stays at its end value (cosine would
    rise again).
    """
    from transformers import get_scheduler

    dummy = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)  # only to read transformers' curve
    curve = get_scheduler(HF_SCHEDULES[schedule], dummy, num_warmup_steps=warmup,
                          num_training_steps=total).lr_lambdas[0]

    def fn(step: int) -> float:
        return float(curve(step + 1) if step < warmup else curve(min(step, max(total, warmup))))

    return fn


def build_scheduler(optimizer, optim, total_updates: int):
    """``LambdaLR`` over :func:`lr_lambda` (transformers' schedules), stepped once per optimizer update."""
    warmup = optim.warmup_steps if optim.warmup_steps > 0 else int(optim.warmup_ratio * total_updates)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(optim.schedule, warmup, total_updates))


class NonFiniteGuard:
    """Counts updates skipped for a non-finite loss or gradient norm; stops the run after ``max_consecutive`` in a
    row. One per optimizer (see :func:`guard_of`); ``updates`` is the number of updates seen (set on resume)."""

    def __init__(self, max_consecutive: int = 5, name: str = "model"):
        self.max_consecutive, self.name = max_consecutive, name
        self.consecutive = self.skipped = self.updates = 0


_GUARDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def guard_of(optimizer, max_consecutive: int = 5, name: str = "model") -> NonFiniteGuard:
    """The guard of ``optimizer`` (made on first use; :class:`~rlhfkit.train.session.Session` makes them with the
    configured ``train.max_nonfinite_skips``)."""
    guard = _GUARDS.get(optimizer)
    if guard is None:
        guard = _GUARDS[optimizer] = NonFiniteGuard(max_consecutive, name)
    return guard


def clip_and_step(accelerator, model, optimizer, scheduler, max_grad_norm: float | None, *,
                  loss: torch.Tensor | None = None) -> torch.Tensor | None:
    """Clip gradients (when asked), step optimizer and schedule, zero gradients. Returns the pre-clip grad norm.

    NaN guard (every recipe steps through here): when the gradient norm (or ``loss``, when given) is not finite,
    the update is skipped (gradients zeroed, the optimizer not stepped; the schedule still steps, so update counts
    and LR stay aligned with the data position), counted (``train/skipped_updates``) and warned about; after
    ``train.max_nonfinite_skips`` consecutive skips the run stops with :class:`NonFiniteError` (nothing saved).
    This costs one host sync per update."""
    params = [p for p in model.parameters() if p.grad is not None]
    clip = max_grad_norm if max_grad_norm is not None and max_grad_norm > 0 else float("inf")
    norm = accelerator.clip_grad_norm_(model.parameters(), clip) if params else torch.zeros(())
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a replicated DTensor
    bad = ~torch.isfinite(torch.as_tensor(norm, dtype=torch.float32))
    if loss is not None:
        bad = bad | ~torch.isfinite(loss.detach().float()).all().to(bad.device)
    if accelerator.num_processes > 1:
        bad = accelerator.reduce(bad.float().to(accelerator.device), "max") > 0
    guard = guard_of(optimizer)
    guard.updates += 1
    if bool(bad) and getattr(accelerator, "scaler", None) is not None:
        bad = torch.zeros((), dtype=torch.bool)  # fp16: the grad scaler skips this step and lowers its scale
    if bool(bad):
        guard.skipped += 1
        guard.consecutive += 1
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        lr = optimizer.param_groups[0]["lr"]
        knob = (f"lower optim.max_grad_norm (now {max_grad_norm:g})" if max_grad_norm else "set optim.max_grad_norm")
        if guard.consecutive >= guard.max_consecutive:
            raise NonFiniteError(
                f"update {guard.updates} of the {guard.name}: loss or gradient not finite in {guard.consecutive} "
                f"consecutive updates; stopped, nothing more saved (earlier checkpoints are intact)", where="optim.lr",
                fix=f"lower optim.lr (now {lr:g}) or {knob}; train.max_nonfinite_skips sets the patience")
        if accelerator.is_main_process:
            get_console().print(
                f"[nan] warning: update {guard.updates} of the {guard.name}: loss or gradient norm not finite "
                f"({float(norm):g}); update skipped ({guard.consecutive} in a row, stop at {guard.max_consecutive}). "
                f"If it repeats: lower optim.lr (now {lr:g}) or {knob}", markup=False,
                highlight=False)
        return norm if max_grad_norm is not None and max_grad_norm > 0 else None
    guard.consecutive = 0
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm if max_grad_norm is not None and max_grad_norm > 0 else None


# ───────────────────────────────────────────────── checkpoints ────────────────────────────────────────────────


def _rng_state() -> dict:
    """Every RNG stream as tensors / lists / numbers only, so it loads with ``torch.load(weights_only=True)``."""
    version, internal, gauss = random.getstate()
    state: dict = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]
    except ImportError:
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


MANIFEST = "manifest.json"


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_finite(models: dict, what: str) -> None:
    """Refuse to save non-finite weights (a diverged run must never leave a NaN model to resume or to use)."""
    for name, model in models.items():
        for pname, p in model.named_parameters():
            local = p.detach().to_local() if hasattr(p, "to_local") else p.detach()  # FSDP2: this rank's shard
            if p.requires_grad and not bool(torch.isfinite(local).all()):
                raise NonFiniteError(f"the {name} weight {pname} is not finite (NaN / inf); {what} not saved",
                                     where="optim.lr",
                                     fix="lower optim.lr or set optim.max_grad_norm, then rerun (the last good "
                                         "checkpoint is kept)")


class Checkpointer:
    """``run_dir/checkpoint-N/`` every N optimizer updates: trainable weights, optimizers, schedulers, RNG, state.

    ``state`` is a JSON-able dict (data position, KL controller, reward normaliser, …). Weights, optimizers and
    schedulers are the same on every process and written once, by the main process; the RNG state is written by
    every process (``rng_state_<rank>.pt``), because the streams of the ranks part as soon as they draw different
    amounts (dropout over batches of different shapes, sampling). Everything goes to ``checkpoint-N.tmp``; last, the
    main process writes ``manifest.json`` (every file with its size and sha256, and the run's fingerprint), fsyncs
    the files and the directory, renames it to ``checkpoint-N`` and fsyncs the run directory; only the newest
    ``keep`` are kept. Every process must call :meth:`save` (it has barriers).

    Everything is loaded with ``torch.load(weights_only=True)``: tensors, lists, numbers and strings only, so a
    planted ``checkpoint-N/`` can never run code. A checkpoint whose manifest is missing or does not match its files
    (torn, truncated, a file missing) is not used: :meth:`find` falls back to the newest valid one with a warning.
    """

    def __init__(self, run: Run, keep: int = 2):
        self.run = run
        self.keep = max(1, keep)

    def save(self, step: int, *, models: dict, optimizers: dict, schedulers: dict, state: dict) -> Path | None:
        acc = self.run.accelerator
        final = self.run.run_dir / f"checkpoint-{step}"
        tmp = self.run.run_dir / f"checkpoint-{step}.tmp"
        check_finite({k: acc.unwrap_model(m) for k, m in models.items()}, f"checkpoint-{step}")
        acc.wait_for_everyone()
        try:
            if acc.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            acc.wait_for_everyone()  # tmp exists for every process
            rng = tmp / f"rng_state_{acc.process_index}.pt"
            torch.save(_rng_state(), rng)
            _fsync_file(rng)
            strategy = get_strategy(self.run.cfg)
            if strategy.sharded_state:  # every process writes its shards of models and optimizers (tmp/sharded)
                strategy.save_state(tmp, models, optimizers)
            if acc.is_main_process:
                payload = {
                    "models": {} if strategy.sharded_state else
                    {k: trainable_state_dict(acc.unwrap_model(m)) for k, m in models.items()},
                    "optimizers": {} if strategy.sharded_state else {k: o.state_dict() for k, o in optimizers.items()},
                    "schedulers": {k: s.state_dict() for k, s in schedulers.items()},
                }
                torch.save(payload, tmp / "trainer_state.pt")
                (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1, default=float))
            acc.wait_for_everyone()  # every RNG file is written
            if acc.is_main_process:
                files = {}
                for p in sorted(q for q in tmp.rglob("*") if q.is_file()):  # sharded/: the strategy's shards
                    _fsync_file(p)
                    files[p.relative_to(tmp).as_posix()] = {"size": p.stat().st_size, "sha256": _sha256(p)}
                from .session import run_fingerprint

                manifest = {"step": step, "files": files, "fingerprint": run_fingerprint(self.run.cfg)}
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
                _fsync_file(tmp / MANIFEST)
                fsync_dir(tmp)
                shutil.rmtree(final, ignore_errors=True)
                tmp.replace(final)
                fsync_dir(self.run.run_dir)
                self._prune()
        except OSError as err:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RunError(f"writing checkpoint-{step} failed: {err.strerror or err}", where=str(final),
                           fix="free disk space (the previous checkpoints are intact) and rerun to resume") from None
        acc.wait_for_everyone()
        return final

    def _prune(self) -> None:
        ckpts = sorted(list_checkpoints(self.run.run_dir), key=lambda p: p[0])
        for _, path in ckpts[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    def find(self, resume: str) -> Path | None:
        """The checkpoint to resume from: ``auto`` / ``force`` = newest valid one (damaged ones skipped with a
        warning), ``never`` = none, else a path (which must be valid)."""
        if resume == "never":
            return None
        if resume in ("auto", "force"):
            for _, path in sorted(list_checkpoints(self.run.run_dir), reverse=True):
                problem = validate_checkpoint(path)
                if problem is None:
                    return path
                self.run.print(f"[ckpt] warning: {path.name} is damaged ({problem}); trying an older checkpoint")
            return None
        path = Path(resume)
        if not (path / "trainer_state.pt").is_file():
            raise ConfigError(f"no checkpoint at {path}", where="train.resume",
                              fix="use auto, never, or a checkpoint-N directory of this run")
        problem = validate_checkpoint(path)
        if problem is not None:
            raise RunError(f"checkpoint {path} is damaged ({problem})", where="train.resume",
                           fix="use train.resume=auto (the newest valid checkpoint) or never")
        return path

    def load(self, path: Path, *, models: dict, optimizers: dict, schedulers: dict) -> dict:
        acc = self.run.accelerator
        own = path / f"rng_state_{acc.process_index}.pt"  # rank 0's when the run had fewer processes
        try:
            payload = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=True)
            rng = torch.load(own if own.is_file() else path / "rng_state_0.pt", weights_only=True)
            state = json.loads((path / "state.json").read_text())
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
            raise RunError(f"{path.name} cannot be loaded safely: {first}", where=str(path),
                           fix="delete it (rlhfkit writes tensors only, never other objects) or set "
                               "train.resume=never") from None
        try:
            if (path / "sharded").is_dir():  # written by a sharded strategy: models and optimizers from the shards
                get_strategy(self.run.cfg).load_state(path, models, optimizers)
                models, optimizers = {}, {}
            for k, m in models.items():
                missing = acc.unwrap_model(m).load_state_dict(payload["models"][k], strict=False)
                unexpected = getattr(missing, "unexpected_keys", [])
                if unexpected:
                    raise ValueError(f"unexpected tensors {unexpected[:3]}")
            for k, o in optimizers.items():
                o.load_state_dict(payload["optimizers"][k])
            for k, s in schedulers.items():
                s.load_state_dict(payload["schedulers"][k])
        except (KeyError, ValueError, RuntimeError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
            raise RunError(f"{path.name} does not fit this run's models: {first}", where=str(path),
                           fix="resume with the model it was written for, or set train.resume=never / a new "
                               "output_dir") from None
        _set_rng_state(rng)
        return state


def validate_checkpoint(path: Path) -> str | None:
    """Why ``path`` cannot be used (no / torn manifest, a file missing, truncated or changed), or None if it is
    complete. Reads every file once (sha256)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        return "no manifest.json: not completely written, or written by an older rlhfkit"
    except (OSError, ValueError, KeyError, TypeError):
        return "manifest.json is torn"
    if "trainer_state.pt" not in files or "state.json" not in files or "rng_state_0.pt" not in files:
        return "the manifest lacks trainer_state.pt, state.json or rng_state_0.pt"
    for name, meta in files.items():
        p = path / name
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != meta.get("size"):
            return f"{name} has {p.stat().st_size} bytes, the manifest says {meta.get('size')}"
        if _sha256(p) != meta.get("sha256"):
            return f"{name} does not match its checksum"
    return None


def checkpoint_fingerprint(path: Path) -> dict | None:
    try:
        return json.loads((path / MANIFEST).read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    out = []
    for p in Path(run_dir).glob("checkpoint-*"):
        if p.name.endswith(".tmp") or not (p / "trainer_state.pt").is_file():
            continue
        try:
            out.append((int(p.name.split("-", 1)[1]), p))
        except ValueError:
            continue
    return out


# ───────────────────────────────────────────────── batch planning ─────────────────────────────────────────────


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 1000003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def plan_batches(n: int, micro_batch: int, world: int, seed: int, epoch: int, rank: int) -> list[list[int]]:
    """This rank's micro-batches for one epoch: a seeded permutation cut into global batches of micro*world, each
    split by rank. The tail that does not fill a global batch is dropped (every rank steps in lock-step)."""
    order = epoch_order(n, seed, epoch)
    global_batch = micro_batch * world
    full = len(order) // global_batch
    return [order[b * global_batch + rank * micro_batch: b * global_batch + (rank + 1) * micro_batch]
            for b in range(full)]


# ──────────────────────────────────────────────── supervised loop ─────────────────────────────────────────────


LossFn = Callable[[Any, dict], tuple[torch.Tensor, dict]]


@dataclass
class SupervisedJob:
    """Everything the supervised loop needs from a recipe."""

    name: str
    model: Any
    tokenizer: Any
    train_items: Sequence
    collate: Callable[[list], dict]
    loss_fn: LossFn  # (model, batch) -> (loss, stats of detached tensors)
    eval_items: Sequence = ()
    eval_fn: Callable[[Any, list[dict]], dict] | None = None  # (model, batches) -> metrics (already reduced)
    show: tuple[str, ...] = ("loss",)
    on_save: Callable[[Any, Path], None] | None = None  # (unwrapped model, run_dir): writes the final model
    extra_state: dict = field(default_factory=dict)


def mean_stats(accelerator, stats: list[dict]) -> dict[str, float]:
    """Each stat averaged over the micro-batches of one update, then over processes (one all-reduce; every process
    must call it, with the same keys)."""
    keys = list(stats[0])
    local = torch.stack([torch.stack([torch.as_tensor(s[k], dtype=torch.float32, device=accelerator.device).mean()
                                      for s in stats]).mean() for k in keys])
    return dict(zip(keys, accelerator.reduce(local, "mean").tolist()))


def total_updates(cfg, n_items: int, world: int) -> tuple[int, int]:
    """(updates, micro-batches per epoch on one rank) from epochs / max_steps."""
    per_epoch = n_items // (cfg.train.batch_size * world)
    if per_epoch == 0:
        raise ConfigError(
            f"{n_items} training records do not fill one batch of {cfg.train.batch_size} x {world} processes",
            where="train.batch_size", fix="lower train.batch_size or give more data",
        )
    if cfg.train.max_steps > 0:
        return cfg.train.max_steps, per_epoch
    return max(1, int(per_epoch * cfg.train.epochs) // cfg.train.grad_accum), per_epoch


def eval_batches(run: Run, job: SupervisedJob) -> list[dict]:
    if not job.eval_items:
        return []
    bs = run.cfg.train.eval_batch_size or run.cfg.train.batch_size
    n = len(job.eval_items)
    # shard by rank, every item evaluated exactly once
    idx = list(range(run.accelerator.process_index, n, run.world_size))
    return [to_device(job.collate([job.eval_items[i] for i in idx[s: s + bs]]), run.device)
            for s in range(0, len(idx), bs)]


def train_supervised(run: Run, job: SupervisedJob) -> dict:
    """The supervised loop. Steps: 1. plan  2. prepare  3. resume  4. update loop (accumulate, clip, step, log,
    evaluate, checkpoint)  5. save. Returns the last metrics."""
    cfg, acc = run.cfg, run.accelerator
    # 1. plan: how many optimizer updates, and the data position of each
    n_updates, per_epoch = total_updates(cfg, len(job.train_items), run.world_size)
    ga = cfg.train.grad_accum

    # 2. prepare model + optimizer (the scheduler stays ours: stepped once per update); the strategy shards the
    #    model first (fsdp2) so the optimizer holds the shards
    strategy = get_strategy(cfg)
    model = strategy.wrap(job.model, cfg, run.device)
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, n_updates)
    model, optimizer = strategy.prepare(acc, model, optimizer)
    evaluate = job.eval_fn and (lambda m, b: _gathered_eval(strategy, job.eval_fn, m, b))

    # 3. resume from the newest valid checkpoint of the same run, or start over (run/session.py)
    session = run.session
    step, micro = 0, 0  # optimizer updates done; micro-batches consumed
    state = session.resume(models={"model": model}, optimizers={"model": optimizer}, schedulers={"model": scheduler})
    if state is not None:
        step, micro = state["step"], state["micro"]
        job.extra_state.update(state.get("extra", {}))
    session.open_sink()  # staged: the earlier run's files are replaced with the first line

    evals = eval_batches(run, job)
    last: dict = {}
    if step == 0 and job.eval_fn is not None and evals:
        last = {f"eval/{k}": v for k, v in evaluate(model, evals).items()}
        run.log(last, step=0)

    # 4. update loop
    model.train()
    batches_cache: dict[int, list[list[int]]] = {}

    def micro_batch(i: int) -> dict:
        epoch, pos = divmod(i, per_epoch)
        if epoch not in batches_cache:
            batches_cache.clear()
            batches_cache[epoch] = plan_batches(len(job.train_items), cfg.train.batch_size, run.world_size,
                                                cfg.train.seed, epoch, acc.process_index)
        return job.collate([job.train_items[j] for j in batches_cache[epoch][pos]])

    with Progress(n_updates, desc=job.name, unit="update", show=None, is_main=run.is_main and cfg.track.progress,
                  initial=step) as progress:
        while step < n_updates:
            stats = []
            for k in range(ga):
                batch = to_device(micro_batch(micro), run.device)
                micro += 1
                sync = contextlib.nullcontext() if k == ga - 1 else acc.no_sync(model)  # all-reduce on the last
                with sync:
                    with acc.autocast():  # the forward only: torch advises against backward under autocast
                        loss, st = job.loss_fn(model, batch)
                    acc.backward(loss / ga)
                stats.append({"loss": loss.detach(), **st})
            grad_norm = clip_and_step(acc, model, optimizer, scheduler, cfg.optim.max_grad_norm,
                                      loss=torch.stack([s["loss"] for s in stats]))
            step += 1

            metrics = {}
            if step % cfg.train.log_every == 0 or step == n_updates:
                metrics = {f"train/{k}": v for k, v in mean_stats(acc, stats).items()}
                metrics.update({"lr": scheduler.get_last_lr()[0], "epoch": micro / per_epoch})
                if grad_norm is not None:
                    metrics["train/grad_norm"] = float(grad_norm)
            # every eval_every updates and after the last one, in the same line: one metrics line per step
            if job.eval_fn is not None and evals and (step == n_updates or
                                                     (cfg.train.eval_every > 0 and step % cfg.train.eval_every == 0)):
                metrics.update({f"eval/{k}": v for k, v in evaluate(model, evals).items()})
            if metrics:
                run.log(metrics, step)
                last.update(metrics)
            # full names: the bar shows eval/loss as eval_loss, never under the train name
            progress.update(1, {k: v for k, v in metrics.items() if k.split("/")[-1] in job.show or k in job.show})
            if cfg.train.save_every > 0 and step % cfg.train.save_every == 0 and step != n_updates:
                session.save(step, models={"model": model}, optimizers={"model": optimizer},
                             schedulers={"model": scheduler}, state={"micro": micro, "extra": job.extra_state})

    # 5. final model, one ordinary HF directory whatever the strategy (the final evaluation was logged with the
    #    last update), finished marker, report
    session.finish(model, job.on_save, step)
    job.model = strategy.local_model(acc, model)
    return last


def _gathered_eval(strategy, eval_fn, model, batches):
    """Evaluation on full weights gathered once (ranks may hold different numbers of eval batches)."""
    with strategy.gathered(model):
        return eval_fn(model, batches)

