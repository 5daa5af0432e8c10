"""The supervised loop, on ``accelerate``: SFT, reward modelling and the offline preference recipes step through a
dataset with it (each recipe gives a :class:`SupervisedJob`: its model, items, collate and loss).

It shares with the online loop (``online.py``) the run (``run.py``: start, seeding, and :func:`set_up_trained`, the
wrap / optimizer / schedule / prepare / resume / sink set-up), the update (``optim.clip_and_step``), the checkpoint
store (``checkpoint.py``) and the run's lifecycle (``session.py``); what is its own is the data plan and the step.

Departures from ``transformers.Trainer`` on purpose: batches are planned from a seeded permutation per epoch and
sharded by rank (:func:`~rlhfkit.train.shared.batches.plan_batches`, so resuming is "skip to batch k" without
replaying data, and every process sees the same order); the scheduler is stepped once per optimizer update (never
``num_processes`` times); checkpoints hold only trainable tensors, optimizer, scheduler, RNG and data position, and
are written to a temporary directory then renamed, so a crash never leaves a half checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...errors import ConfigError
from ...track import Progress
from ...track.progress import earlier_pace
from ..lifecycle.distributed import get_strategy
from ..lifecycle.optim import clip_and_step, lr_used
from ..lifecycle.run import Run, set_up_trained
from ..shared.batches import mean_stats, plan_batches, to_device

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
    health: dict = field(default_factory=dict)  # HealthMonitor settings (vocab_size: train/loss is per-token CE)


def total_updates(cfg, n_items: int, world: int) -> tuple[int, int]:
    """(updates, micro-batches per epoch on one rank) from epochs / max_steps. ``train.drop_last`` (rlhfkit's
    default): an epoch is the whole micro-batches (the short one left out), an update ``train.grad_accum`` of them
    wherever the epoch ends; otherwise (TRL / transformers) the short micro-batch is trained on, an update ends at
    an epoch's end (its last one may accumulate fewer) and the run is ``ceil(epochs x updates per epoch)``."""
    b, ga = cfg.train.batch_size * world, cfg.train.grad_accum
    per_epoch = n_items // b if cfg.train.drop_last else -(-n_items // b)
    if per_epoch == 0:
        raise ConfigError(
            f"{n_items} training records do not fill one batch of {cfg.train.batch_size} x {world} processes",
            where="train.batch_size", fix="lower train.batch_size or give more data (or train.drop_last=false)",
        )
    if cfg.train.max_steps >= 0:  # 0: no update, an evaluation of the model as it is (the API's evaluate())
        return cfg.train.max_steps, per_epoch
    if cfg.train.drop_last:
        return max(1, int(per_epoch * cfg.train.epochs) // ga), per_epoch
    return max(1, math.ceil(cfg.train.epochs * -(-per_epoch // ga))), per_epoch


def plan_line(cfg, name: str, n_items: int, world: int, n_updates: int, per_epoch: int) -> str:
    """The run's geometry in one line: rows per micro-batch and update, micro-batches per epoch, updates."""
    b, ga = cfg.train.batch_size, cfg.train.grad_accum
    short = n_items % (b * world)
    tail = ("" if not short else f", the short one of {short} rows {'dropped' if cfg.train.drop_last else 'kept'}")
    length = f"train.max_steps={cfg.train.max_steps}" if cfg.train.max_steps > 0 else \
        f"train.epochs={cfg.train.epochs:g}"
    procs = f" x {world} processes" if world > 1 else ""
    return (f"[{name}] run: {n_items} rows, micro-batches of {b}{procs}, {ga} per update; {per_epoch} micro-batch"
            f"{'es' if per_epoch != 1 else ''} an epoch{tail}; {n_updates} update{'s' if n_updates != 1 else ''} "
            f"from {length}")


def update_window(cfg, update: int, per_epoch: int) -> tuple[int, int]:
    """(first micro-batch, how many) of update ``update`` (0-based): ``train.grad_accum`` consecutive ones, or with
    ``train.drop_last=false`` as transformers accumulates, never across an epoch's end."""
    ga = cfg.train.grad_accum
    if cfg.train.drop_last:
        return update * ga, ga
    per_update = -(-per_epoch // ga)
    epoch, j = divmod(update, per_update)
    return epoch * per_epoch + j * ga, min(ga, per_epoch - j * ga)


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
    """The supervised loop. Steps: 1. plan  2. set up and resume  3. update loop (accumulate, clip, step, log,
    evaluate, checkpoint; a SIGTERM / SIGUSR1 stops every rank after the update under way, with a checkpoint: see
    ``stop.py``)  4. save. Returns the last metrics."""
    cfg, acc = run.cfg, run.accelerator
    # 1. plan: how many optimizer updates, and the data position of each
    n_updates, per_epoch = total_updates(cfg, len(job.train_items), run.world_size)
    run.print(plan_line(cfg, job.name, len(job.train_items), run.world_size, n_updates, per_epoch))

    # 2. wrap, optimizer, schedule, prepare, resume the newest valid checkpoint of the same run (or start over), open
    #    the metrics sink: the set-up both loops share (run.py); then the data position resumed
    strategy = get_strategy(cfg)
    trained = set_up_trained(run, {"model": job.model}, n_updates)
    model, optimizer, scheduler = trained.parts("model")
    evaluate = job.eval_fn and (lambda m, b: _gathered_eval(strategy, job.eval_fn, m, b))
    health = run.session.open_health(**job.health)  # loss rising / at ln |V|, gradient blow-up: track/health.py

    def log(metrics: dict, at: int) -> None:  # metrics.jsonl, then the health rules (main process: one warning)
        run.log(metrics, step=at)
        if run.is_main:  # a critical stop (track.stop_on_critical) reaches every rank at the step's check
            run.stop.local(acc, health.report, metrics, at)
    step, micro = 0, 0  # optimizer updates done; micro-batches consumed
    tokens = 0.0  # input tokens trained on so far, every process (TRL's num_tokens)
    if trained.state is not None:
        step, micro = trained.state["step"], trained.state["micro"]
        tokens = float(trained.state.get("tokens_seen", 0.0))
        job.extra_state.update(trained.state.get("extra", {}))

    evals = eval_batches(run, job)
    last: dict = {}
    run.tokenizer = job.tokenizer
    run.tell("on_train_begin", step, {"max_steps": n_updates})
    if step == 0 and job.eval_fn is not None and evals:
        last = {f"eval/{k}": v for k, v in evaluate(model, evals).items()}
        log(last, 0)

    # 3. update loop
    model.train()
    saved = step  # the update the newest checkpoint holds (0: none needed yet)
    batches_cache: dict[int, list[list[int]]] = {}

    def micro_batch(i: int) -> dict:
        epoch, pos = divmod(i, per_epoch)
        if epoch not in batches_cache:
            batches_cache.clear()
            batches_cache[epoch] = plan_batches(len(job.train_items), cfg.train.batch_size, run.world_size,
                                                cfg.train.seed, epoch, acc.process_index,
                                                drop_last=cfg.train.drop_last)
        return job.collate([job.train_items[j] for j in batches_cache[epoch][pos]])

    earlier = earlier_pace(run.run_dir) if step > 0 and run.is_main else None  # a resume: its ETA at once
    with Progress(n_updates, desc=job.name, unit="update", show=None, is_main=run.is_main and cfg.track.progress,
                  initial=step, earlier=earlier) as progress:
        run.stop.arm(True)
        while step < n_updates:
            stats = []
            run.tell("on_step_begin", step)
            micro, window = update_window(cfg, step, per_epoch)
            progress.phase("update", total=window, unit="micro-batches")
            seen, rows = torch.zeros((), device=run.device), 0
            for k in range(window):
                batch = to_device(micro_batch(micro), run.device)
                seen += batch_tokens(batch)
                rows += batch_rows(batch)
                micro += 1
                sync = contextlib.nullcontext() if k == window - 1 else acc.no_sync(model)  # all-reduce on the last
                with sync:
                    with acc.autocast():  # the forward only: torch advises against backward under autocast
                        loss, st = job.loss_fn(model, batch)
                    acc.backward(loss / window)
                stats.append({"loss": loss.detach(), **st})
                progress.advance()
            grad_norm = clip_and_step(acc, model, optimizer, scheduler, cfg.optim.max_grad_norm,
                                      loss=torch.stack([s["loss"] for s in stats]))
            step += 1
            tokens += float(acc.reduce(seen, "sum") if acc.num_processes > 1 else seen)
            if run.callbacks:  # what TRL's callbacks and TrainOutput read (one host copy, only with callbacks)
                run.tell("on_update", step, {"epoch": micro / per_epoch, "tokens": tokens, "rows": rows,
                                             "prompts": rows,
                                             "loss": float(torch.stack([s["loss"] for s in stats]).mean())})

            metrics = {}
            if step % cfg.train.log_every == 0 or step == n_updates or run.asked("log"):
                metrics = {f"train/{k}": v for k, v in mean_stats(acc, stats).items()}
                metrics.update({"lr": lr_used(scheduler), "epoch": micro / per_epoch, "tokens/seen": tokens})
                if grad_norm is not None:
                    metrics["train/grad_norm"] = float(grad_norm)
            # every eval_every updates and after the last one, in the same line: one metrics line per step
            if job.eval_fn is not None and evals and (step == n_updates or run.asked("evaluate") or
                                                     (cfg.train.eval_every > 0 and step % cfg.train.eval_every == 0)):
                progress.phase("eval")
                metrics.update({f"eval/{k}": v for k, v in evaluate(model, evals).items()})
            if metrics:
                log(metrics, step)
                last.update(metrics)
            # full names: the bar shows eval/loss as eval_loss, never under the train name
            progress.update(1, {k: v for k, v in metrics.items() if k.split("/")[-1] in job.show or k in job.show})
            save = functools.partial(trained.save, step, state={"micro": micro, "extra": job.extra_state,
                                                                "tokens_seen": tokens})
            due = cfg.train.save_every > 0 and step % cfg.train.save_every == 0
            if (due or run.asked("save")) and step != n_updates:  # a callback's should_save too
                saved = step if save() is not False else saved
            if run.stop.should_stop(acc, last=step == n_updates):  # every rank at the same update
                run.stop.stop(acc, step, None if saved == step else save)
        run.stop.arm(False)

    # 4. final model, one ordinary HF directory whatever the strategy (the final evaluation was logged with the
    #    last update), finished marker, report
    run.session.finish(model, job.on_save, step)
    job.model = strategy.local_model(acc, model)
    run.tell("on_train_end", step, job.model)
    return last


def batch_tokens(batch: dict) -> torch.Tensor:
    """The real (unpadded) input tokens of a collated batch: its attention mask's sum (a pair's chosen and rejected
    rows both count, as TRL counts its concatenated batch); without one, its ``input_ids``' size."""
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        return mask.sum().float()
    ids = batch.get("input_ids")
    return torch.as_tensor(float(ids.numel()) if isinstance(ids, torch.Tensor) else 0.0)


def batch_rows(batch: dict) -> int:
    """The examples of a collated batch (its first tensor's rows; a pair's two sides count once)."""
    first = next((v for v in batch.values() if isinstance(v, torch.Tensor)), None)
    rows = int(first.shape[0]) if first is not None else 0
    paired = "prompt_lengths" in batch and "label" not in batch  # PreferenceCollator: chosen rows, then rejected
    return rows // 2 if paired else rows


def _gathered_eval(strategy, eval_fn, model, batches):
    """Evaluation on full weights gathered once (ranks may hold different numbers of eval batches)."""
    with strategy.gathered(model):
        return eval_fn(model, batches)
