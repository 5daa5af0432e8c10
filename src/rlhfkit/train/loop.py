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
import json
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import save_config
from ..errors import ConfigError
from ..models.loading import trainable_state_dict
from ..track import MetricsSink, Progress
from ..track.console import get_console
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
            self.sink.log(metrics, step)


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
    """Create the accelerator and the run directory, seed everything (the config is saved by :func:`open_sink`)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    # accelerate keeps one state per process, but a pipeline (or a test session) runs stage after stage in one
    # process, each with its own mixed precision: forget the last stage's (the process group itself is kept)
    AcceleratorState._reset_state()
    die_with_launcher()  # torchrun: a killed launcher takes its workers with it
    # cpu=True without CUDA: only then does accelerate set up DDP (gloo) for processes started by torchrun
    accelerator = Accelerator(mixed_precision=mixed_precision(cfg.train.mixed_precision),
                              cpu=not torch.cuda.is_available(), **get_strategy(cfg).accelerator_kwargs(cfg))
    run_dir = Path(cfg.output_dir)
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    set_seed(cfg.train.seed)
    return Run(cfg=cfg, accelerator=accelerator, run_dir=run_dir)


def open_sink(run: Run, resume_step: int | None) -> MetricsSink:
    """Start writing the run directory: the resolved config and the metrics. Called when training starts, after the
    model and data loaded, so a run that fails on bad input leaves the files of a previous run alone."""
    if run.is_main:
        save_config(run.cfg, run.run_dir)
    run.sink = MetricsSink(run.run_dir, backends=tuple(run.cfg.track.backends), is_main=run.is_main,
                           config=run.cfg, resume_step=resume_step)
    return run.sink


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


def lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    """Multiplier of the peak LR after ``step`` updates: linear warm-up, then linear / cosine decay or constant."""

    def fn(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total - warmup)
        progress = min(max(progress, 0.0), 1.0)
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return max(0.0, 1.0 - progress)

    return fn


def build_scheduler(optimizer, optim, total_updates: int):
    warmup = optim.warmup_steps if optim.warmup_steps > 0 else int(optim.warmup_ratio * total_updates)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(optim.schedule, warmup, total_updates))


def clip_and_step(accelerator, model, optimizer, scheduler, max_grad_norm: float | None) -> torch.Tensor | None:
    """Clip gradients (when asked), step optimizer and schedule, zero gradients. Returns the pre-clip grad norm."""
    norm = None
    if max_grad_norm is not None and max_grad_norm > 0:
        norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a replicated DTensor
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


# ───────────────────────────────────────────────── checkpoints ────────────────────────────────────────────────


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    """``run_dir/checkpoint-N/`` every N optimizer updates: trainable weights, optimizers, schedulers, RNG, state.

    ``state`` is a JSON-able dict (data position, KL controller, reward normaliser, …). Weights, optimizers and
    schedulers are the same on every process and written once, by the main process; the RNG state is written by
    every process (``rng_state_<rank>.pt``), because the streams of the ranks part as soon as they draw different
    amounts (dropout over batches of different shapes, sampling). Everything goes to ``checkpoint-N.tmp``, renamed
    when complete; only the newest ``keep`` are kept. Every process must call :meth:`save` (it has barriers).
    """

    def __init__(self, run: Run, keep: int = 2):
        self.run = run
        self.keep = max(1, keep)

    def save(self, step: int, *, models: dict, optimizers: dict, schedulers: dict, state: dict) -> Path | None:
        acc = self.run.accelerator
        final = self.run.run_dir / f"checkpoint-{step}"
        tmp = self.run.run_dir / f"checkpoint-{step}.tmp"
        acc.wait_for_everyone()
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()  # tmp exists for every process
        torch.save(_rng_state(), tmp / f"rng_state_{acc.process_index}.pt")
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
            shutil.rmtree(final, ignore_errors=True)
            tmp.replace(final)
            self._prune()
        acc.wait_for_everyone()
        return final

    def _prune(self) -> None:
        ckpts = sorted(list_checkpoints(self.run.run_dir), key=lambda p: p[0])
        for _, path in ckpts[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    def clear(self) -> None:
        """Starting over: delete this run directory's checkpoints (a later ``resume=auto`` must not find them)."""
        acc = self.run.accelerator
        acc.wait_for_everyone()
        if acc.is_main_process:
            old = sorted(self.run.run_dir.glob("checkpoint-*"))
            for path in old:
                shutil.rmtree(path, ignore_errors=True)
            if old:
                self.run.print(f"[ckpt] starting over: removed {', '.join(p.name for p in old)}")
        acc.wait_for_everyone()

    def find(self, resume: str) -> Path | None:
        """The checkpoint to resume from: ``auto`` = newest complete one, ``never`` = none, else a path."""
        if resume == "never":
            return None
        if resume == "auto":
            ckpts = list_checkpoints(self.run.run_dir)
            return max(ckpts)[1] if ckpts else None
        path = Path(resume)
        if not (path / "trainer_state.pt").is_file():
            raise ConfigError(f"no checkpoint at {path}", where="train.resume",
                              fix="use auto, never, or a checkpoint-N directory of this run")
        return path

    def load(self, path: Path, *, models: dict, optimizers: dict, schedulers: dict) -> dict:
        acc = self.run.accelerator
        payload = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
        if (path / "sharded").is_dir():  # written by a sharded strategy: models and optimizers from the shards
            get_strategy(self.run.cfg).load_state(path, models, optimizers)
            models, optimizers = {}, {}
        for k, m in models.items():
            missing = acc.unwrap_model(m).load_state_dict(payload["models"][k], strict=False)
            unexpected = getattr(missing, "unexpected_keys", [])
            if unexpected:
                raise RuntimeError(f"checkpoint {path} does not match model {k}: {unexpected[:3]}")
        for k, o in optimizers.items():
            o.load_state_dict(payload["optimizers"][k])
        for k, s in schedulers.items():
            s.load_state_dict(payload["schedulers"][k])
        own = path / f"rng_state_{acc.process_index}.pt"  # rank 0's when the run had fewer processes
        _set_rng_state(torch.load(own if own.is_file() else path / "rng_state_0.pt", weights_only=False))
        return json.loads((path / "state.json").read_text())


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


def _to_device(batch: dict, device) -> dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def _mean_stats(accelerator, stats: list[dict]) -> dict[str, float]:
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
    return [_to_device(job.collate([job.eval_items[i] for i in idx[s: s + bs]]), run.device)
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

    # 3. resume from the newest checkpoint when there is one
    ckpt = Checkpointer(run, keep=cfg.train.save_total_limit)
    step, micro = 0, 0  # optimizer updates done; micro-batches consumed
    resume_from = ckpt.find(cfg.train.resume)
    if resume_from is not None:
        state = ckpt.load(resume_from, models={"model": model}, optimizers={"model": optimizer},
                          schedulers={"model": scheduler})
        step, micro = state["step"], state["micro"]
        job.extra_state.update(state.get("extra", {}))
        run.print(f"[{job.name}] resumed from {resume_from} at update {step}")
    else:
        ckpt.clear()  # what an earlier attempt in this directory left must not be resumed later
    # resumed: drop the lines logged after the checkpoint; starting over: drop every line (-1)
    open_sink(run, resume_step=step if resume_from is not None else -1)

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

    with Progress(n_updates, desc=job.name, unit="update", show=job.show, is_main=run.is_main,
                  initial=step) as progress:
        while step < n_updates:
            stats = []
            for k in range(ga):
                batch = _to_device(micro_batch(micro), run.device)
                micro += 1
                sync = contextlib.nullcontext() if k == ga - 1 else acc.no_sync(model)  # all-reduce on the last
                with sync:
                    with acc.autocast():  # the forward only: torch advises against backward under autocast
                        loss, st = job.loss_fn(model, batch)
                    acc.backward(loss / ga)
                stats.append({"loss": loss.detach(), **st})
            grad_norm = clip_and_step(acc, model, optimizer, scheduler, cfg.optim.max_grad_norm)
            step += 1

            metrics = {}
            if step % cfg.train.log_every == 0 or step == n_updates:
                metrics = {f"train/{k}": v for k, v in _mean_stats(acc, stats).items()}
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
            progress.update(1, {k.split("/")[-1]: v for k, v in metrics.items()
                                if k.split("/")[-1] in job.show or k in job.show})
            if cfg.train.save_every > 0 and step % cfg.train.save_every == 0 and step != n_updates:
                ckpt.save(step, models={"model": model}, optimizers={"model": optimizer},
                          schedulers={"model": scheduler}, state={"micro": micro, "extra": job.extra_state})

    # 5. final model, one ordinary HF directory whatever the strategy (the final evaluation was logged with the
    #    last update)
    acc.wait_for_everyone()
    full = strategy.full_model(acc, model)  # every process takes part (gathers shards); the model on the main one
    if run.is_main and job.on_save is not None:
        job.on_save(full, run.run_dir)
    acc.wait_for_everyone()
    if run.sink is not None:
        run.sink.close()
    job.model = strategy.local_model(acc, model)
    return last


def _gathered_eval(strategy, eval_fn, model, batches):
    """Evaluation on full weights gathered once (ranks may hold different numbers of eval batches)."""
    with strategy.gathered(model):
        return eval_fn(model, batches)

