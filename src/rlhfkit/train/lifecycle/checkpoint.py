"""The checkpoint store of a run and the finiteness guard, shared by the supervised and the online loop.

- **Checkpoints** (:class:`Checkpointer`): ``run_dir/checkpoint-N/`` holds the trainable tensors, optimizers,
  schedulers, every process's RNG streams (:func:`rng_state` / :func:`set_rng_state`) and the loop's state (data
  position, KL controller, ...). Each is written to ``checkpoint-N.tmp`` and renamed once its ``manifest.json``
  (every file with its size and sha256, and the run's fingerprint) is written; :func:`validate_checkpoint` checks a
  checkpoint against its manifest, :func:`list_checkpoints` lists them.
- **The fingerprint** of a run: :mod:`.fingerprint` (:func:`run_fingerprint`, :func:`fingerprint_diff`), kept in
  every manifest (:func:`checkpoint_fingerprint`) and in ``finished.json``; ``train/lifecycle/session.py`` compares
  them.
- **Finiteness**: :func:`check_finite` refuses to save non-finite weights (a checkpoint or the final model);
  :class:`NonFiniteGuard` (one per optimizer, :func:`guard_of`) counts the updates ``optim.clip_and_step`` skipped for
  a non-finite loss or gradient and stops the run after ``train.max_nonfinite_skips`` in a row. The session arms the
  guards (the configured patience, the update count of a resumed run) and logs their count.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import weakref
from pathlib import Path

import torch

from ... import files
from ...config import load_config, read_yaml
from ...errors import ConfigError, NonFiniteError, RunError, UserError
from ...files import fsync_dir
from ...models.loading import trainable_state_dict
from .distributed import get_strategy
from .fingerprint import (  # noqa: F401 - the run's fingerprint (train/lifecycle/fingerprint.py), re-exported
    _EDGE,
    ADDED_KEYS,
    DATA_FILE_KEYS,
    FULL_HASH_LIMIT,
    ITEM_DEFAULTS,
    LENGTH_KEYS,
    NOT_FINGERPRINTED,
    RENAMED_KEYS,
    RENAMED_VALUES,
    _excluded,
    _file_digest,
    _flat,
    _policy_section,
    _same,
    _sha256,
    _show,
    _without_unused_policy_sections,
    data_identity,
    fingerprint_diff,
    run_fingerprint,
    run_length,
    upgrade_fingerprint,
)

# ──────────────────────────────────────────────── RNG streams ────────────────────────────────────────────────


def rng_state() -> dict:
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


def set_rng_state(state: dict) -> None:
    """Restore every RNG stream saved by :func:`rng_state` (CUDA only when present on both sides)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ──────────────────────────────────────────────── finiteness ─────────────────────────────────────────────────


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


class NonFiniteGuard:
    """Counts updates skipped for a non-finite loss or gradient norm; stops the run after ``max_consecutive`` in a
    row. One per optimizer (see :func:`guard_of`); ``updates`` is the number of updates seen (set on resume);
    ``empty``: updates without any gradient (nothing in the loss: every sample dropped, every group tied and
    filtered, every token filtered), not applied; ``applied``: updates applied by this process since it started."""

    def __init__(self, max_consecutive: int = 5, name: str = "model"):
        self.max_consecutive, self.name = max_consecutive, name
        self.consecutive = self.skipped = self.updates = self.empty = self.applied = 0


_GUARDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def guard_of(optimizer, max_consecutive: int = 5, name: str = "model") -> NonFiniteGuard:
    """The guard of ``optimizer`` (made on first use; :class:`~rlhfkit.train.lifecycle.session.Session` arms them with
    the
    configured ``train.max_nonfinite_skips``)."""
    guard = _GUARDS.get(optimizer)
    if guard is None:
        guard = _GUARDS[optimizer] = NonFiniteGuard(max_consecutive, name)
    return guard


# ──────────────────────────────────────────────── checkpoints ────────────────────────────────────────────────

MANIFEST = "manifest.json"


def _fsync_file(path: Path) -> None:
    files.fsync_file(path)


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

    def __init__(self, run, keep: int = 2):
        self.run = run
        self.keep = max(1, keep)
        self.damaged: list[Path] = []  # found by find(): moved aside (set_aside) when the run commits
        self._valid: set[Path] = set()  # checkpoints known to be valid (written or validated by this process)
        self._fingerprint: dict | None = None

    def save(self, step: int, *, models: dict, optimizers: dict, schedulers: dict, state: dict,
             local: dict | None = None) -> Path | None:
        """``local``: this process's own part of the loop state (tensors, lists, numbers, strings:
        ``local_<rank>.pt``, e.g. the asynchronous mode's queue of experiences), when the loop has one."""
        acc = self.run.accelerator
        final = self.run.run_dir / f"checkpoint-{step}"
        tmp = self.run.run_dir / f"checkpoint-{step}.tmp"
        check_finite({k: acc.unwrap_model(m) for k, m in models.items()}, f"checkpoint-{step}")
        acc.wait_for_everyone()
        # a full disk (OSError, torch's RuntimeError, ...) is one line with the space needed; checkpoint-N.tmp goes
        need = 3 * sum(p.numel() * p.element_size() for m in models.values()  # weights + two AdamW moments
                       for p in acc.unwrap_model(m).parameters() if p.requires_grad)
        with files.writing(final, need=need, cleanup=[tmp], fix="rerun to resume (the previous checkpoints are "
                                                                 "intact)"):
            if acc.is_main_process:
                files.fresh_dir(tmp)  # made here: nothing inside can be a planted link, so torch.save may use paths
            acc.wait_for_everyone()  # tmp exists for every process
            rng = tmp / f"rng_state_{acc.process_index}.pt"
            torch.save(rng_state(), rng)
            _fsync_file(rng)
            if local is not None:
                torch.save(local, tmp / f"local_{acc.process_index}.pt")
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
                with files.open_new(tmp / "state.json") as f:
                    f.write(json.dumps({"step": step, **state}, indent=1, default=float))
            acc.wait_for_everyone()  # every RNG file is written
            if acc.is_main_process:
                listed = {}
                for p in sorted(q for q in tmp.rglob("*") if q.is_file()):  # sharded/: the strategy's shards
                    _fsync_file(p)
                    listed[p.relative_to(tmp).as_posix()] = {"size": p.stat().st_size, "sha256": _sha256(p)}
                if self._fingerprint is None:
                    self._fingerprint = run_fingerprint(self.run.cfg)
                manifest = {"step": step, "files": listed, "fingerprint": self._fingerprint}
                with files.open_new(tmp / MANIFEST) as f:
                    f.write(json.dumps(manifest, indent=1))
                _fsync_file(tmp / MANIFEST)
                fsync_dir(tmp)
                if final.exists() and validate_checkpoint(final) is not None:
                    set_aside(final, self.run.print, "replaced by a new one")  # never deleted for being unreadable
                files.replace(tmp, final)  # a link in final's place is refused, an older directory removed
                fsync_dir(self.run.run_dir)
                self._valid.add(final)
                self._prune()
        acc.wait_for_everyone()
        return final

    def is_valid(self, path: Path) -> bool:
        """:func:`validate_checkpoint`: in full once per checkpoint, then (and for those this run wrote) the sizes
        only, so that pruning rereads no checkpoint."""
        if path in self._valid and validate_checkpoint(path, checksums=False) is None:
            return True
        self._valid.discard(path)
        if validate_checkpoint(path) is None:
            self._valid.add(path)
        return path in self._valid

    def _prune(self) -> None:
        """Keep the newest ``keep`` valid checkpoints; older valid ones go. An unreadable checkpoint is never deleted
        (nor counted), nor anything that is not a ``checkpoint-N`` directory."""
        valid = [path for _, path in sorted(list_checkpoints(self.run.run_dir), reverse=True) if self.is_valid(path)]
        for path in valid[self.keep:]:
            files.remove(path)
            self._valid.discard(path)

    def _say_if_unverified(self, path: Path) -> None:
        if not (path / MANIFEST).is_file():
            self.run.print(f"[ckpt] warning: {path.name} has no manifest (written by an earlier rlhfkit, or copied "
                           "without its manifest.json): its files' sizes and checksums cannot be checked, only that "
                           "they load as tensors; resumed as it is (train.resume=never starts over instead)")

    def find(self, resume: str) -> Path | None:
        """The checkpoint to resume from: ``auto`` / ``force`` = newest valid one (damaged ones skipped with a
        warning), ``never`` = none, else a path (which must be valid)."""
        if resume == "never":
            return None
        if resume in ("auto", "force"):
            for _, path in sorted(list_checkpoints(self.run.run_dir), reverse=True):
                problem = validate_checkpoint(path)
                if problem is None:
                    self._valid.add(path)
                    self._say_if_unverified(path)
                    return path
                self.damaged.append(path)
                self.run.print(f"[ckpt] warning: {path.name} is damaged ({problem}); it will be moved aside to "
                               f"{_aside_name(path).name} (never deleted); trying an older checkpoint")
            return None
        path = Path(resume)
        if not (path / "trainer_state.pt").is_file():
            raise ConfigError(f"no checkpoint at {path}", where="train.resume",
                              fix="use auto, never, or a checkpoint-N directory of this run")
        problem = validate_checkpoint(path)
        if problem is not None:
            raise RunError(f"checkpoint {path} is damaged ({problem})", where="train.resume",
                           fix="use train.resume=auto (the newest valid checkpoint) or never")
        self._say_if_unverified(path)
        return path

    def load(self, path: Path, *, models: dict, optimizers: dict, schedulers: dict) -> dict:
        acc = self.run.accelerator
        own = path / f"rng_state_{acc.process_index}.pt"  # rank 0's when the run had fewer processes
        try:
            payload = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=True)
            rng = torch.load(own if own.is_file() else path / "rng_state_0.pt", weights_only=True)
            state = json.loads((path / "state.json").read_text())
            local = path / f"local_{acc.process_index}.pt"
            if local.is_file():  # the loop's own part of this process (Checkpointer.save's ``local``)
                state["local"] = torch.load(local, map_location="cpu", weights_only=True)
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
        set_rng_state(rng)
        return state


def _legacy_problem(path: Path) -> str | None:
    """A checkpoint without a manifest (written before the manifest existed) is usable when its files load as
    tensors only (``weights_only``) and its state is JSON; why not, or None."""
    try:
        torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=True)
        torch.load(path / "rng_state_0.pt", map_location="cpu", weights_only=True)
        json.loads((path / "state.json").read_text())
    except FileNotFoundError as err:
        return f"no manifest.json, and {Path(err.filename or '?').name} is missing"
    except Exception as err:  # noqa: BLE001 - anything a damaged file raises: it is unreadable, not a crash
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        return f"no manifest.json, and its files do not load as tensors ({first})"
    return None


def validate_checkpoint(path: Path, checksums: bool = True) -> str | None:
    """Why ``path`` cannot be used (a torn manifest, a file missing, truncated or changed), or None if it is
    complete. Reads every file once (sha256; ``checksums=False``: the sizes only). A checkpoint without a manifest
    (an earlier rlhfkit's) is complete when its files load as tensors only (:func:`_legacy_problem`)."""
    if files.refuse_link(path) is None or not path.is_dir():
        return "not a directory"
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        listed = manifest["files"]
    except FileNotFoundError:
        return _legacy_problem(path)
    except (OSError, ValueError, KeyError, TypeError):
        return "manifest.json is torn"
    if not isinstance(listed, dict):
        return "manifest.json is torn"
    if "trainer_state.pt" not in listed or "state.json" not in listed or "rng_state_0.pt" not in listed:
        return "the manifest lacks trainer_state.pt, state.json or rng_state_0.pt"
    for name, meta in listed.items():
        p = path / name
        if not p.is_file() or p.is_symlink():
            return f"{name} is missing"
        if not isinstance(meta, dict):
            return "manifest.json is torn"
        if p.stat().st_size != meta.get("size"):
            return f"{name} has {p.stat().st_size} bytes, the manifest says {meta.get('size')}"
        if checksums and _sha256(p) != meta.get("sha256"):
            return f"{name} does not match its checksum"
    return None


def _aside_name(path: Path) -> Path:
    aside = path.with_name(path.name + ".damaged")
    n = 2
    while os.path.lexists(aside):
        aside, n = path.with_name(f"{path.name}.damaged-{n}"), n + 1
    return aside


def set_aside(path: Path, say=print, why: str = "unreadable") -> Path:
    """Move a damaged checkpoint aside to ``checkpoint-N.damaged`` (never deleted: it may be the only copy of the
    user's work) with one warning line; returns its new path."""
    aside = _aside_name(path)
    files.refuse_link(path)
    os.rename(path, aside)
    say(f"[ckpt] warning: {path.name} ({why}) moved aside to {aside.name}; nothing was deleted")
    return aside


def checkpoint_fingerprint(path: Path) -> dict | None:
    """The run fingerprint a checkpoint's manifest holds (None when it has none or cannot be read)."""
    try:
        return json.loads((path / MANIFEST).read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def config_fingerprint(run_dir: Path) -> dict | None:
    """The fingerprint of the run whose ``config.yaml`` is in ``run_dir`` (for a checkpoint without a manifest);
    None when there is none or it no longer builds."""
    path = Path(run_dir) / "config.yaml"
    try:
        files.refuse_link(path)
        recipe = read_yaml(path).get("recipe")
        return run_fingerprint(load_config(recipe, path))
    except (UserError, OSError, ValueError, AttributeError, TypeError):
        return None


CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every ``checkpoint-N`` directory in ``run_dir`` (not a link; ``.tmp`` / ``.damaged`` and every
    other name left out), valid or not."""
    out = []
    for p in Path(run_dir).glob("checkpoint-*"):
        match = CHECKPOINT_NAME.fullmatch(p.name)
        if match and p.is_dir() and not p.is_symlink():
            out.append((int(match.group(1)), p))
    return out
