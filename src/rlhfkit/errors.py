"""User-facing errors.

Every mistake a user can make (bad file, bad record, unknown key, missing model) raises a subclass of
:class:`UserError` carrying *where* (file / line / key) and *how to fix it*. The CLI prints ``str(err)`` as one
line and exits with code 2; programming errors keep their traceback.
"""

from __future__ import annotations

import os


def is_main_rank() -> bool:
    """True on the process that speaks for the run: ``RANK`` unset (one process) or 0. Lines printed once per run
    before an accelerator exists (the CLI's start and closing lines, config notes, data notes) ask this, so under
    torchrun they are printed once, not once per process. Here, on the ground floor, so every room can ask it."""
    return os.environ.get("RANK", "0") == "0"


def say(message: str) -> None:
    """One line on stdout from the main rank (:func:`is_main_rank`), flushed; rooms below ``track`` use it."""
    if is_main_rank():
        print(message, flush=True)


class UserError(Exception):
    """An error caused by input the user controls; printed as one line, exit code 2."""

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None):
        self.message = message
        self.where = where
        self.fix = fix
        super().__init__(self.one_line())

    def __str__(self) -> str:  # what it says now: a reader may place it later (``where`` set to file:line)
        return self.one_line()

    def one_line(self) -> str:
        parts = []
        if self.where:
            parts.append(f"{self.where}: ")
        parts.append(self.message)
        if self.fix:
            parts.append(f" (fix: {self.fix})")
        return "".join(parts).replace("\n", " ")


class ConfigError(UserError):
    """Unknown key, wrong type, or invalid value in a config file or override. ``key``: the dotted key the error is
    about, when ``where`` does not already name it (the config reader turns it into ``file:line``)."""

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None, key: str | None = None):
        self.key = key
        self.located = False  # set when the config reader has placed it at a file:line
        super().__init__(message, where=where, fix=fix)


class DataError(UserError):
    """Malformed file, malformed record, missing field, empty dataset, over-long prompt."""


class ModelError(UserError):
    """A model or tokenizer that cannot be loaded or lacks something a recipe needs."""


class RewardError(UserError):
    """A reward function that cannot be imported, called, or returns the wrong thing."""


class EnvError(UserError):
    """An environment that cannot be loaded, or that fails or returns the wrong thing during an episode
    (``rlhfkit.envs``)."""


class RunError(UserError):
    """The run directory cannot be used as asked: locked by another run, holding a different run, unreadable or
    damaged checkpoints, a full disk while saving."""


class NoUpdateError(UserError):
    """A run that applied no update at all (every one skipped: non-finite, or without any learning signal): it does
    not end as a success, and saves no final model."""


class NonFiniteError(UserError):
    """Training diverged: too many consecutive non-finite losses / gradients, or non-finite weights about to be
    saved."""


class Stopped(KeyboardInterrupt):
    """A run stopped on purpose before its end: by a preemption signal (SIGTERM, SIGUSR1; ``train/lifecycle/stop.py``)
    or
    because another rank failed. Like Ctrl-C's ``KeyboardInterrupt`` (which it is, so no ``except Exception`` in user
    code swallows it), the CLI prints it as one line (``message``; None: the CLI's own line naming the last
    checkpoint) and exits with ``exit_code``; ``names_checkpoint`` False: the CLI adds the last checkpoint to it."""

    def __init__(self, message: str, exit_code: int, *, names_checkpoint: bool = True):
        self.message, self.exit_code, self.names_checkpoint = message, exit_code, names_checkpoint
        super().__init__(message)
