"""Stopping a run cleanly on every rank: preemption signals, and a failure on one rank.

Clusters preempt a job with SIGTERM and a grace period (SLURM can send SIGUSR1 ahead of it: ``--signal=USR1@120``;
Kubernetes: ``terminationGracePeriodSeconds``; torchrun forwards the SIGTERM it gets to its workers and kills them 30 s
later). :class:`StopControl` (one per run, ``run.stop``, installed by ``start_run`` on every process, removed when the
run ends) turns both signals into a stop at the next step boundary:

- its handler only *notes* the signal while a loop runs its steps, up to the check after the last step's update
  (``armed``); anywhere else (loading, the final save) or at a second signal it raises
  :class:`~rlhfkit.errors.Stopped` at once, as Ctrl-C
  raises ``KeyboardInterrupt`` (the run's files are staged or closed, checkpoints are renamed into place only when
  complete: nothing half-written is ever picked up);
- the loops call :meth:`StopControl.check` at their step boundaries (the supervised loop after each optimizer update;
  the online loop after the rollout and scoring, and after the PPO epochs): one all-reduce (max) of every rank's state
  (go on, a signal, this rank failed), so all ranks stop at the same step and can write the checkpoint together. A
  signal during a rollout abandons it (:meth:`StopControl.abandon_point`, between micro-batches of generation);
- a rank whose local part of a step fails (rollout, reward functions, environment: no collective inside but the
  weight all-gather that opens a rollout of a sharded policy) notes the error (:meth:`StopControl.fail`) and joins
  that all-reduce instead of dying, so the others stop through the same path;
- then :meth:`StopControl.stop`: one ``all_gather_object`` of why each rank stops, the checkpoint of the step reached
  (every rank; skipped when it is already on disk, and on a critical health stop: the weights that tripped the rule
  are not saved, as with one process, where :class:`~rlhfkit.track.CriticalHealthStop` is raised before the step's
  save), and the exit: the failing rank re-raises its error, every other
  rank raises ``Stopped`` whose one line ("stopped by SIGTERM at step N; checkpoint-N saved; rerun the same command
  to resume") the CLI prints on rank 0. ``Session.close`` closes the run's files and writes the report on the way out.

Exit codes (README, "Exit codes"): 143 after SIGTERM, 138 after SIGUSR1 (128 + the signal's number, as Ctrl-C's 130);
a rank stopped because another failed exits with that rank's code (2 for a user error, 1 otherwise).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

import torch

from ...errors import Stopped, UserError
from ...track import CriticalHealthStop

SIGNALS = ("SIGTERM", "SIGUSR1")
GO, SIGNALLED, FAILED = 0, 1, 2


def exit_code(name: str) -> int:
    """128 + the signal's number: 143 for SIGTERM, 138 for SIGUSR1 (Linux); 0 for a stop the run's own code asked
    for (:meth:`StopControl.request`: a callback)."""
    sig = getattr(signal, name, None) if name in SIGNALS else None
    return 128 + int(sig) if sig is not None else 0


def error_code(err: BaseException) -> int:
    return 2 if isinstance(err, UserError) else 1


def one_line(err: BaseException) -> str:
    text = err.one_line() if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
    return " ".join(text.split())[:300]


AGAIN = "rerun the same command to resume"
AGAIN_NEVER = "rerun with train.resume=auto (TRL's resume_from_checkpoint=true) to resume"


class Abandoned(Exception):
    """Raised inside a rollout when a stop was asked: the rollout is dropped (caught by the online loop)."""


class StopControl:
    """The stop requests of one run on this process; see the module doc."""

    def __init__(self) -> None:
        self.signal: str | None = None  # the first signal noted while armed
        self.error: BaseException | None = None  # this rank's failure in the local part of a step
        self.remote: tuple[int, str, int] | None = None  # (rank, one line, exit code): another process's failure
        self.armed = False
        self.stopping = False  # the run is ending (a stop, a failure): further signals are ignored
        self.where = "before the first update"  # for a stop outside the loop
        self.again = AGAIN  # how to resume, in the stop's line (AGAIN_NEVER under train.resume=never)
        self._previous: dict = {}

    # ── the handler ──────────────────────────────────────────────────────────────────────────────────────────
    def install(self) -> None:
        """Catch SIGTERM / SIGUSR1 (main thread only: Python runs handlers there)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for name in SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def uninstall(self, *, keep_ignoring: bool = False) -> None:
        """Restore the handlers found at :meth:`install`; ``keep_ignoring``: ignore SIGTERM / SIGUSR1 instead, until
        the process exits (a rank that stopped under torchrun: the launcher's SIGTERM, sent when another rank exits,
        must not cut its last line)."""
        for sig, previous in self._previous.items():
            previous = signal.SIG_DFL if previous is None else previous
            signal.signal(sig, signal.SIG_IGN if keep_ignoring else previous)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.stopping:  # already on the way out (closing the files, writing the report): finish that
            return
        if self.armed and self.signal is None:
            self.signal = name
            if int(os.environ.get("RANK", "0")) == 0:  # os.write: print() may be half-way through a line
                os.write(2, f"[stop] {name} received: finishing the current update, then a checkpoint\n".encode())
            return
        where = (f"at a second signal (the first, {self.signal}, was waiting for the step to end)" if self.armed
                 else self.where)
        self.armed = False
        raise Stopped(f"stopped by {name} {where}", exit_code(name), names_checkpoint=False)

    def arm(self, armed: bool, where: str = "while saving the final model") -> None:
        """Note signals (while the loop runs its steps, up to the check after the last step's update) or raise at once
        (``where`` says when)."""
        self.armed = armed
        if not armed:
            self.where = where

    def request(self, why: str) -> None:
        """Stop at the next step boundary as after a signal (``why`` names who asked, e.g. a callback): the
        checkpoint of the step reached, then ``Stopped`` with exit code 0."""
        if self.signal is None:
            self.signal = why

    # ── the loops ────────────────────────────────────────────────────────────────────────────────────────────
    def abandon_point(self) -> None:
        """Inside a rollout (between micro-batches): raise :class:`Abandoned` once a signal was noted."""
        if self.signal is not None:
            raise Abandoned(self.signal)

    def fail(self, err: BaseException) -> None:
        """This rank's local part of the step failed: stop every rank at the next :meth:`check`."""
        self.error = err

    def note_signal(self, name: str) -> None:
        """A signal received by another process of the run (an asynchronous producer's), noted as this one's."""
        if self.signal is None:
            self.signal = name

    def note_failure(self, rank: int, line: str, code: int) -> None:
        """The failure of a process outside the collectives (an asynchronous producer, global ``rank``): every rank
        stops at the next check, as for a rank of its own, and says which process failed."""
        if self.remote is None:
            self.remote = (rank, line, code)

    def check(self, acc) -> int:
        """Every rank's state, reduced (max) over processes: ``GO``, ``SIGNALLED`` or ``FAILED`` (one all-reduce of a
        scalar; every process must call it at the same point)."""
        mine = FAILED if self.error is not None or self.remote is not None else SIGNALLED if self.signal else GO
        if acc.num_processes == 1:
            return mine
        return int(acc.reduce(torch.tensor([mine], device=acc.device), "max").item())

    def should_stop(self, acc, last: bool = False) -> bool:
        """:meth:`check` at a step boundary: stop when a rank failed or was signalled, except for a signal at the
        check after the last step's update (``last``): the run then finishes and saves as usual."""
        state = self.check(acc)
        return state == FAILED or (state == SIGNALLED and not last)

    def local(self, acc, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)``: work of this process alone (no collective inside, e.g. the health rules on the main
        process). With several processes its exception is noted (:meth:`fail`) so every rank stops at the next
        :meth:`should_stop` instead of the others waiting at a collective; with one it is raised at once."""
        if acc.num_processes == 1:
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - re-raised by stop() on this process, after the save
            self.fail(err)

    def stop(self, acc, update: int, save: Callable[[], object] | None):
        """Stop every rank at optimizer update ``update`` (after :meth:`check` said so): ``save()`` writes its
        checkpoint (None: it is on disk already, or nothing was trained; ``save()`` returning False: it wrote none),
        then raise (see the module doc)."""
        self.armed, self.stopping = False, True
        why = [(acc.process_index, self.signal, one_line(self.error) if self.error else None,
                error_code(self.error) if self.error else 0, isinstance(self.error, CriticalHealthStop))]
        if self.remote is not None:
            why.append((self.remote[0], None, self.remote[1], self.remote[2], False))
        if acc.num_processes > 1:
            from accelerate.utils import gather_object

            why = gather_object(why)
        if update == 0:
            saved = "nothing trained yet, no checkpoint needed; rerun the same command to start"
        elif any(w[4] for w in why):  # a critical health stop: the step's weights are what tripped the rule
            saved = f"step {update} not saved (a critical health warning)"
        elif save is not None and save() is False:  # the session wrote none: no update applied yet in this run
            saved = "nothing saved (no update applied yet in this run); rerun the same command to start"
        else:
            saved = f"checkpoint-{update} saved; {self.again}"
        if self.error is not None:
            raise self.error
        failed = [w for w in why if w[2] is not None]
        if failed:
            rank, _, line, code, _ = failed[0]
            raise Stopped(f"stopped at step {update} because rank {rank} failed ({line}); {saved}", code)
        name = self.signal or next(w[1] for w in why if w[1])
        raise Stopped(f"stopped by {name} at step {update}; {saved}", exit_code(name))
