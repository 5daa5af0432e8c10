"""The run lifecycle in its ``output_dir``, shared by the supervised and the online loops.

A :class:`Session` (made by :func:`~rlhfkit.train.lifecycle.run.start_run`, held as ``run.session``) owns, in order:

1. **the directory**: an exclusive lock (``.rlhfkit.lock``, ``flock``: a second run into the same directory exits 2
   naming the first's pid; the lock of a dead process is released by the kernel and taken over);
   :meth:`Session.begin` answers a rerun of a finished command (exit 0, nothing retrained).
2. **resume or start over** (chosen by :meth:`Session.begin` before anything loads, loaded by
   :meth:`Session.resume`; ``train.resume``): ``auto`` takes the newest *valid*
   checkpoint (one without a manifest, written by an earlier rlhfkit, is valid when its files load as tensors only,
   and its settings are read from the run's ``config.yaml``; damaged ones are skipped with a warning and moved aside
   to ``checkpoint-N.damaged`` when the run commits, never deleted) if its fingerprint matches this run, and refuses
   one of another run; ``force`` resumes it even when settings changed; ``never`` starts over; a path resumes that one.
3. **the files** (:meth:`Session.open_sink`, :meth:`Session.open_samples`): new ``metrics.jsonl`` /
   ``samples.jsonl`` / ``warnings.jsonl`` are written beside the earlier run's (``.new``) and swapped in, together
   with ``config.yaml``, only when the run *commits*. A run that starts over where an earlier run left its files
   (``train.resume=never``, or a directory with files but no checkpoint to resume: ``Session.protect``) commits
   at its first checkpoint that holds an applied update, or at its end; a checkpoint before any update was applied
   is not written (the weights are the start's), so no early failure — a NaN reward or environment, a hang, a
   refused prompt, a stop signal, no update ever applied — costs the earlier run anything. A run in a fresh
   directory, or resuming its own checkpoint, commits at its first metrics line (its files, report included, then
   survive a later failure). Starting over
   deletes the earlier run's valid checkpoints at that moment too (an unreadable one is moved aside, anything not
   named ``checkpoint-N`` is left); resuming deletes those newer than the one resumed
   (damaged ones, or the future an explicit ``train.resume=PATH`` rewrites). A run that fails before leaves every
   earlier file byte-identical, and a directory it created empty is removed.
4. **checkpoints** (:meth:`Session.save`): never of non-finite weights; a full disk ends in one line.
   Every file is written through ``rlhfkit.files`` (never through a link planted in the directory; a write failure is
   one line with the space needed, its partial output removed).
5. **the end** (:meth:`Session.finish`): the final model, ``finished.json`` (fingerprint, run length), the report.

**The fingerprint** of a run (every config key that defines what is trained; what is left out and why:
``checkpoint.py``) is stored in every checkpoint's manifest and in ``finished.json``; :meth:`Session.begin` compares
them with this run's.

**``train.resume=force``** (and an explicit checkpoint path whose fingerprint differs) keeps from the checkpoint: the
trainable weights, the optimizer moments (AdamW ``exp_avg`` / ``exp_avg_sq`` / ``step``), the number of updates done
(the schedule position), the data position (micro-batches / rollout steps consumed), the RNG streams and the recipe
state (KL controller, reward normaliser, …). Every setting of the new config applies from there: the peak LR and
schedule, AdamW betas / eps / weight decay, and everything else; ``config.yaml`` is the new config. Weights of
another shape cannot be kept: that ends in one line naming the checkpoint.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path

from ... import files
from ...config import save_config
from ...errors import NoUpdateError, RunError, Stopped, UserError
from ...track import HealthMonitor, MetricsSink, SampleLogger
from ...track.console import get_console
from ...track.metrics import read_run_metrics
from ...track.names import TABLES as NAME_TABLES
from ...track.names import rename_text, wandb_names
from .checkpoint import (
    CHECKPOINT_NAME,
    Checkpointer,
    check_finite,
    checkpoint_fingerprint,
    config_fingerprint,
    fingerprint_diff,
    guard_of,
    list_checkpoints,
    run_fingerprint,
    run_length,
    set_aside,
)
from .distributed import get_strategy

LOCK_FILE = ".rlhfkit.lock"
FINISHED_FILE = "finished.json"


# ─────────────────────────────────────────── fingerprint mismatch ────────────────────────────────────────────


def _mismatch(run_dir: Path, what: str, diff: list[str]) -> RunError:
    shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
    return RunError(f"{what} was made with other settings ({shown}); refusing to resume it", where=str(run_dir),
                    fix="train.resume=never to start over here, a new output_dir, or train.resume=force to keep its "
                        "weights, optimizer state and data position under the new settings")


def _step_of(path: Path) -> int:
    try:
        return int(path.name.split("-", 1)[1].removesuffix(".tmp"))
    except ValueError:
        return -1


def _earlier_files(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds files an earlier run wrote (its metrics, config, checkpoints, model, ...), not
    counting what a run leaves while it writes (the lock, ``*.new``, ``*.tmp``)."""
    try:
        names = [e.name for e in os.scandir(run_dir)]
    except OSError:
        return False
    transient = (LOCK_FILE, ".saving")
    return any(files.is_own_name(n) and n not in transient and not n.endswith((".new", ".tmp")) for n in names)


def _status(error: BaseException | None) -> str:
    """How a run ended early, for the top of its report."""
    if isinstance(error, Stopped):
        return error.message
    if isinstance(error, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    if isinstance(error, UserError):
        return f"failed: {error.one_line()}"
    return f"failed: {type(error).__name__}: {' '.join(str(error).split())[:300]}"


# ─────────────────────────────────────────────────── lock ────────────────────────────────────────────────────

_HELD: dict[str, RunLock] = {}  # locks this process holds, by path: a run of this process that died takes over


class RunLock:
    """An exclusive ``flock`` on ``run_dir/.rlhfkit.lock`` holding ``pid host``. The kernel drops it when the
    process dies (even by SIGKILL), so a stale lock file is simply taken over."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self.key = os.path.realpath(self.path)
        self.fd: int | None = None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock
            return
        held = _HELD.pop(self.key, None)
        if held is not None:  # an earlier run of this process never closed (a test, a crash caught by a caller)
            held.release()
        while True:
            fd = files.open_lock(self.path)  # never through a link planted under the lock's name
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):  # no flock on this filesystem
                    os.close(fd)
                    get_console().print(f"[lock] warning: cannot lock {self.path} ({err.strerror}); make sure no "
                                        "other run writes into this directory", markup=False, highlight=False)
                    return
                holder = os.read(fd, 200).decode(errors="replace").split()
                os.close(fd)
                pid = holder[0] if holder else "unknown"
                host = f" on {holder[1]}" if len(holder) > 1 else ""
                raise RunError(f"another run (pid {pid}{host}) is writing into this directory",
                               where=str(self.path.parent),
                               fix="wait for it to end or stop it, or choose another output_dir") from None
            try:  # the previous holder may have removed the file between our open and our lock: lock the new one
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self.fd = fd
        _HELD[self.key] = self

    def release(self) -> None:
        if self.fd is None:
            return
        import fcntl

        try:  # only the lock file this process holds (never a link or a file put in its place meanwhile)
            if os.lstat(self.path).st_ino == os.fstat(self.fd).st_ino:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None
        if _HELD.get(self.key) is self:
            del _HELD[self.key]


# ────────────────────────────────────────────────── session ──────────────────────────────────────────────────


class Session:
    """One run's lifecycle in ``run.run_dir`` (``run``: the :class:`~rlhfkit.train.lifecycle.run.Run`; see the module
    doc).
    Every process makes one; files are written by the main process; :meth:`save` and :meth:`finish` have
    barriers, so every process calls them."""

    def __init__(self, run, *, created: bool = False):
        self.run, self.cfg = run, run.cfg
        self.ckpt = Checkpointer(run, keep=run.cfg.train.save_total_limit)
        self.fingerprint = run_fingerprint(run.cfg)
        self.created = created  # this run made run_dir: a run that fails before committing removes it
        self.lock = RunLock(run.run_dir)
        self.committed = False
        self.resumed_from: Path | None = None
        self.resume_step = -1  # -1: starting over (every earlier line dropped)
        self.samples: SampleLogger | None = None
        self.health: HealthMonitor | None = None
        self._old_checkpoints: list[Path] = []
        self._guards: list = []
        self.steps_seen = self.steps_without_reward = 0  # online steps; those in which every sample was dropped
        self._chosen, self._resume_path, self._diff = False, None, []
        self.protect = False  # starting over on an earlier run's files: commit only at a checkpoint with an update

    @property
    def name(self) -> str:
        return self.cfg.recipe

    # ── 1. the directory ─────────────────────────────────────────────────────────────────────────────────────
    def acquire(self) -> None:
        """Lock the run directory (main process); every process raises if another run holds it."""
        acc = self.run.accelerator
        error = None
        if acc.is_main_process:
            try:
                files.check_run_dir(self.run.run_dir)  # no link under a name this run writes, before any write
                self.lock.acquire()
            except RunError as err:
                error = err
        if acc.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            message = [error.one_line() if error else None]
            broadcast_object_list(message)
            if message[0] and error is None:
                error = RunError(message[0])
        if error is not None:
            raise error

    def begin(self) -> dict | None:
        """Before anything loads: a rerun of a finished command (``train.resume=auto``, same settings, same
        length) prints that it is finished and returns the run's last metrics; a finished run or a checkpoint made
        with other settings is refused (exit 2) unless ``train.resume=force``. Returns None when there is
        something to train (the checkpoint to resume, if any, is chosen here)."""
        cfg, run = self.cfg, self.run
        if cfg.train.resume in ("auto", "force"):
            try:
                marker = json.loads((run.run_dir / FINISHED_FILE).read_text())
            except (OSError, ValueError):
                marker = None
            if marker is not None:
                diff = fingerprint_diff(marker.get("fingerprint", {}), self.fingerprint)
                if diff and cfg.train.resume != "force":
                    raise _mismatch(run.run_dir, f"the finished run in {run.run_dir}", diff)
                if not diff and marker.get("length") == run_length(cfg):
                    last: dict = {}
                    for line in read_run_metrics(run.run_dir, cfg.recipe):  # rlhfkit's names, as a run returns
                        last.update({k: v for k, v in line.items() if k not in ("step", "time")})
                    run.print(f"[{self.name}] {run.run_dir} is already finished (update {marker.get('step')}): "
                              "nothing to do (to train again: train.resume=never or a new output_dir)")
                    return last
        self._choose_checkpoint()
        return None

    def _choose_checkpoint(self) -> None:
        """The checkpoint to resume (``train.resume``), refused when another run made it (see :meth:`begin`).
        The main process validates the checkpoints (every file's sha256) and compares the fingerprints, once; the
        others receive its choice (one broadcast)."""
        acc = self.run.accelerator
        choice, error = (None, [], False), None
        if acc.is_main_process:
            try:
                choice = self._choose_here()
            except UserError as err:
                error = err
        if acc.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            box = [(choice, error.one_line() if error else None)]
            broadcast_object_list(box)
            choice, message = box[0]
            if message and error is None:
                error = RunError(message)
        if error is not None:
            raise error
        self._resume_path, self._diff, self.protect = choice
        self._chosen = True

    def _choose_here(self) -> tuple[Path | None, list[str], bool]:
        """(the checkpoint to resume or None, its settings that differ from this run's, whether an earlier run's
        files are there to protect while this one starts over); main process."""
        cfg = self.cfg
        self._old_checkpoints = [p for _, p in sorted(list_checkpoints(self.run.run_dir))]
        path = self.ckpt.find(cfg.train.resume)
        diff = []
        if path is not None:
            old = checkpoint_fingerprint(path) or config_fingerprint(self.run.run_dir)  # no manifest: its run's config
            if old is None:
                self.run.print(f"[ckpt] warning: {path.name} records no settings (no manifest, no config.yaml that "
                               "still builds): resumed without comparing them")
            diff = fingerprint_diff(old, self.fingerprint) if old is not None else []
        if diff and cfg.train.resume == "auto":  # force and an explicit path adopt the new settings
            raise _mismatch(self.run.run_dir, path.name, diff)
        return path, diff, path is None and _earlier_files(self.run.run_dir)

    # ── 2. resume or start over ──────────────────────────────────────────────────────────────────────────────
    def resume(self, *, models: dict, optimizers: dict, schedulers: dict) -> dict | None:
        """Load the checkpoint ``train.resume`` names (its ``state.json``), or None when starting over. Also arms
        the NaN guard of every optimizer with ``train.max_nonfinite_skips``."""
        cfg, run = self.cfg, self.run
        self._guards = []
        for name, opt in optimizers.items():
            guard = guard_of(opt, cfg.train.max_nonfinite_skips, name)
            guard.max_consecutive, guard.name = cfg.train.max_nonfinite_skips, name
            self._guards.append(guard)
        if not self._chosen:
            self._choose_checkpoint()
        path, diff = self._resume_path, self._diff
        if path is None:
            return None
        # the new config's hyper-parameters, to re-apply over the checkpoint's (equal unless forced)
        fresh = {k: [{h: v for h, v in g.items() if h not in ("params", "lr")} for g in o.param_groups]
                 for k, o in optimizers.items()}
        base_lrs = {k: list(s.base_lrs) for k, s in schedulers.items()}
        state = self.ckpt.load(path, models=models, optimizers=optimizers, schedulers=schedulers)
        for k, opt in optimizers.items():
            for group, hyper in zip(opt.param_groups, fresh[k]):
                group.update(hyper)
        for k, sched in schedulers.items():
            sched.base_lrs = base_lrs[k]
            lrs = [base * fn(sched.last_epoch) for base, fn in zip(sched.base_lrs, sched.lr_lambdas)]
            for group, lr in zip(sched.optimizer.param_groups, lrs):
                group["lr"] = lr
            sched._last_lr = lrs
        for guard in self._guards:
            guard.updates = int(state["step"])
        self.resumed_from, self.resume_step = path, int(state["step"])
        if diff:
            run.print(f"[{self.name}] warning: {path.name} was made with other settings ({'; '.join(diff[:6])}); "
                      "kept: weights, optimizer moments, update count, data position, RNG; the new settings apply")
        run.print(f"[{self.name}] resumed from {path} at update {state['step']}")
        return state

    # ── 3. the files ─────────────────────────────────────────────────────────────────────────────────────────
    def open_sink(self) -> MetricsSink:
        """The metrics sink, staged: the first line commits the run (see :meth:`commit`), unless it starts over on
        an earlier run's files (``protect``: then its first checkpoint with an update, or its end)."""
        run = self.run
        try:
            run.sink = MetricsSink(run.run_dir, backends=tuple(self.cfg.track.backends), is_main=run.is_main,
                                   config=self.cfg, resume_step=self.resume_step, staged=True,
                                   on_first_line=None if self.protect else self.commit,
                                   wandb_rename=wandb_names if self.cfg.recipe in NAME_TABLES else None)
        except files.WRITE_ERRORS as err:
            raise files.write_failed(run.run_dir / "metrics.jsonl.new", err, what="the metrics file",
                                     fix="rerun") from None
        return run.sink

    def open_samples(self) -> SampleLogger:
        self.samples = SampleLogger(self.run.run_dir, is_main=self.run.is_main, resume_step=self.resume_step,
                                    staged=True, sink=self.run.sink)
        return self.samples

    def open_health(self, **kwargs) -> HealthMonitor:
        """The health monitor; its ``warnings.jsonl`` is staged like the metrics (``track.stop_on_critical``); its
        messages name the metrics as the run writes them (TRL's names: ``track/names.py``)."""
        recipe = self.cfg.recipe
        self.health = HealthMonitor(run_dir=self.run.run_dir if self.run.is_main else None,
                                    resume_step=self.resume_step, staged=True,
                                    stop_on_critical=self.cfg.track.stop_on_critical,
                                    rename=lambda text: rename_text(recipe, text), **kwargs)
        return self.health

    def _files(self) -> list:
        """The run files opened so far (metrics, samples, warnings), each a ``track.jsonl.StagedFile``."""
        return [f for f in (self.run.sink, self.samples, self.health) if f is not None]

    def commit(self) -> None:
        """The run has produced its first line (or its first checkpoint with an update, ``protect``): from here
        it owns the directory. Writes
        ``config.yaml``, swaps in the new metrics / samples files, removes ``finished.json`` and, when starting
        over, the checkpoints an earlier run left. Main process only, no barrier."""
        if self.committed:
            return
        if not self.run.is_main:
            self.committed = True
            return
        run_dir = self.run.run_dir
        try:
            save_config(self.cfg, run_dir)  # the one write that needs space: before anything is swapped
            self.committed = True
            for f in self._files():
                f.commit()
        except files.WRITE_ERRORS as err:
            raise files.write_failed(run_dir, err, what="the run's files", fix="rerun") from None
        files.remove(run_dir / FINISHED_FILE)
        for path in self.ckpt.damaged:  # never deleted for being unreadable: moved aside, once
            if os.path.lexists(path):
                set_aside(path, self.run.print, "damaged")
        old = [p for p in self._old_checkpoints if p.exists() and p not in self.ckpt.damaged]
        if self.resumed_from is not None:  # keep those up to the one resumed; newer ones (the future this run
            old = [p for p in old if _step_of(p) > self.resume_step]  # rewrites) must not be resumed later
        for path in [p for p in old if not self.ckpt.is_valid(p)]:  # unreadable: set aside, never deleted
            set_aside(path, self.run.print, "unreadable")
        old = [p for p in old if p.exists()]
        for path in old:
            files.remove(path)
        for tmp in self.run.run_dir.glob("checkpoint-*.tmp"):  # a checkpoint a killed run left half-written
            if CHECKPOINT_NAME.fullmatch(tmp.name.removesuffix(".tmp")):
                files.remove(tmp)
        if old:
            self.run.print(f"[ckpt] {'starting over' if self.resumed_from is None else 'resumed'}: removed "
                           f"{', '.join(p.name for p in old)}")
        files.fsync_dir(run_dir)

    def skip_metrics(self) -> dict:
        """``train/skipped_updates``: updates skipped for a non-finite loss / gradient so far; ``train/empty_updates``:
        updates without any gradient, not applied (every optimizer)."""
        if not self._guards:
            return {}
        return {"train/skipped_updates": sum(g.skipped for g in self._guards),
                "train/empty_updates": sum(g.empty for g in self._guards)}

    def check_applied(self) -> None:
        """A run whose trained model (the first optimizer's: the policy) applied no update since it started: when
        updates were skipped for a non-finite loss or gradient, or every sample of every step was dropped (no finite
        reward at all: a fault, never a success), one line and no model; when every update simply had no learning
        signal (every group tied, every sample dropped: a weak
        model on a hard task, as TRL would run it), it finishes and saves the model, saying plainly, in one line,
        that no update changed the policy."""
        g = self._guards[0] if self._guards else None
        if g is None or g.applied or not (g.skipped or g.empty):
            return
        no_reward = getattr(self, "steps_seen", 0) > 0 and self.steps_without_reward >= self.steps_seen
        if not g.skipped and not no_reward:  # ties, not faults: a finite reward was there, it did not vary
            self.run.print(f"[{self.name}] no update changed the {g.name}: all {g.empty} updates of this run had no "
                           "learning signal (every group tied, or every sample dropped: see frac_reward_zero_std / "
                           "rewards/tied_groups_frac and rewards/dropped in metrics.jsonl); the model saved is the "
                           "one the run started from. A harder reward needs a stronger start (SFT) or more samples "
                           "per prompt (num_generations)")
            return
        raise NoUpdateError(
            f"no update of the {g.name} was applied in this run: {g.skipped} skipped for a non-finite loss or "
            f"gradient, {g.empty} without any learning signal (every sample dropped, every group tied and filtered, "
            "every token filtered); no final model saved", where=str(self.run.run_dir),
            fix="see rewards/dropped, rewards/tied_groups_frac, rewards/clipped_frac, train/skipped_updates in "
                "metrics.jsonl: fix the rewards / environment, raise reward.clip (or null) if it ties the scores, "
                "lower optim.lr, or turn off the filter that removes every sample")

    # ── 4. checkpoints ───────────────────────────────────────────────────────────────────────────────────────
    def save(self, step: int, *, models: dict, optimizers: dict, schedulers: dict, state: dict,
             local: dict | None = None) -> Path | None | bool:
        """``checkpoint-<step>`` (every process), committing the run first. False, with one line, when the run
        starts over on an earlier run's files and has applied no update yet: a checkpoint of the start's weights is
        worth less than the earlier run's files it would replace."""
        if self.protect and not self.committed and not self.applied():
            self.run.print(f"[ckpt] no checkpoint at update {step}: no update applied yet in this run (the earlier "
                           f"run's files in {self.run.run_dir} are kept until one is)")
            return False
        self.commit()
        return self.ckpt.save(step, models=models, optimizers=optimizers, schedulers=schedulers, state=state,
                              local=local)

    def applied(self) -> bool:
        """Whether the policy (the first optimizer) applied an update in this run (the same on every process)."""
        return bool(self._guards and self._guards[0].applied)

    # ── 5. the end ───────────────────────────────────────────────────────────────────────────────────────────
    def finish(self, model, save_fn, step: int, *, report: bool = True) -> None:
        """Final model (``save_fn(unwrapped model, run_dir)``, main process, never non-finite), close the files,
        write ``finished.json``, then ``report.html``. Every process calls it."""
        acc, run = self.run.accelerator, self.run
        acc.wait_for_everyone()
        self.check_applied()  # the guards count the same updates on every process (the skip is decided globally)
        if self.cfg.train.max_steps == 0:
            save_fn = None  # an evaluation (no update asked): the model is where it came from
        strategy = get_strategy(self.cfg)
        check_finite({"model": strategy.local_model(acc, model)}, "the final model")
        full = strategy.full_model(acc, model)  # every process: FSDP2 gathers the shards; the model on the main one
        self.commit()
        if run.is_main and save_fn is not None:
            with files.writing(run.run_dir, need=files.model_nbytes(full), cleanup=[run.run_dir / ".saving"],
                               what="the final model"):
                save_fn(full, run.run_dir)
        acc.wait_for_everyone()
        for f in self._files():
            f.close()
        if run.is_main:
            marker = {"step": step, "time": time.time(), "fingerprint": self.fingerprint,
                      "length": run_length(self.cfg)}
            files.write_atomic(run.run_dir / FINISHED_FILE, json.dumps(marker, indent=1),
                               what=f"{FINISHED_FILE} (the model is saved)",
                               fix="rerun (it retrains only the tail after the newest checkpoint)")
        if report:
            write_report(run)

    def close(self, failed: bool, error: BaseException | None = None) -> None:
        """Release the directory. A run that failed before committing removes its staged files, and the run
        directory when it made it and left it empty; one that ends early after it (a failure, a stop by a signal)
        closes its files and writes the report, ``error`` at its top."""
        try:
            if failed and not self.committed and self.run.is_main:
                for f in self._files():
                    f.discard()
            elif failed:
                for f in self._files():
                    f.close()
                try:
                    write_report(self.run, status=_status(error))
                except Exception as err:  # noqa: BLE001 - the run's own error is the one to show
                    self.run.print(f"[report] warning: no report written ({type(err).__name__}: {err})")
        finally:
            self.lock.release()
        if failed and not self.committed and self.created and self.run.is_main:
            try:
                self.run.run_dir.rmdir()  # only if empty
            except OSError:
                pass


def write_report(run, status: str | None = None) -> None:
    """``report.html`` of the run (main process, when ``track.report``); ``status``: why it ended early, shown
    first."""
    if run.is_main and run.cfg.track.report:
        from ...report import build_report

        build_report(run.run_dir, title=f"rlhfkit {run.cfg.recipe}: {run.run_dir}", status=status)
