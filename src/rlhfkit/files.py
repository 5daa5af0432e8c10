"""Safe file operations in a run directory: every file rlhfkit creates, replaces or removes there goes through here.

1. **Never through a link.** A symbolic link planted in ``output_dir`` under the name of a file rlhfkit writes
   (``ln -s ~/notes.txt RUN/.rlhfkit.lock``) must never make rlhfkit truncate or overwrite its target. Files are
   created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (:func:`open_new`) or opened for appending with ``O_NOFOLLOW``
   (:func:`open_append`); a name is checked with ``lstat`` before it is replaced (:func:`replace`) or removed
   (:func:`remove`, which never runs ``rmtree`` through a link); directories are made fresh with ``mkdir``, which
   never follows a link (:func:`fresh_dir`). A link, or something other than a regular file / directory (a FIFO, a
   device), found in the place of a run file stops the run with one line naming it (:class:`PlantedLinkError`, exit
   2); :func:`check_run_dir` looks for them before a run writes anything. The run directory itself may be a link
   (users do that on purpose); the names inside it that rlhfkit owns (:data:`OWN_NAMES`) may not.
   Third-party writers (``save_pretrained``, safetensors, ``torch.save`` to a path) write only into a fresh directory
   made here, so nothing inside can be a planted link; their output is then renamed into place.
2. **Never half-written.** ``torch.save`` reports a full disk as ``RuntimeError``, safetensors as
   ``SafetensorError``, Python as ``OSError``: :func:`writing` turns any of them (:data:`WRITE_ERRORS`) into one line
   naming the path, the space the write needed (an estimate: :func:`nbytes`) and the space free, after removing the
   write's own partial output. A file is replaced only by renaming a complete, fsynced copy over it
   (:func:`write_atomic`), so an earlier version survives any failure.

This room imports only ``errors``: every room that writes (track, report, models, train, pipeline) sits above it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .errors import RunError, UserError

try:  # safetensors' own error type (a full disk while saving weights): not an OSError
    from safetensors import SafetensorError as _SafetensorError
except ImportError:  # pragma: no cover - safetensors is a dependency of transformers
    _SafetensorError = OSError

#: what a write may raise for a full disk, a quota, an I/O error (each library's own type)
WRITE_ERRORS: tuple[type[BaseException], ...] = (OSError, RuntimeError, _SafetensorError)

#: the names rlhfkit writes in a run directory (``fnmatch`` patterns): none of them may be a link there
OWN_NAMES = (
    ".rlhfkit.lock", ".saving", "*.tmp", "*.tmp[0-9]*", "*.new", "*.damaged",
    "metrics.jsonl", "samples.jsonl", "warnings.jsonl", "config.yaml", "finished.json", "report.html",
    "checkpoint-*", "reference_logps*.pt", "pipeline_state.json", "summary.json", "eval*.json", "wandb_id.txt", "tb",
    # the model directory save_pretrained writes (full model, adapter, tokenizer)
    "adapter", "*.safetensors", "*.safetensors.index.json", "config.json", "generation_config.json",
    "tokenizer*", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "vocab.*", "merges.txt",
    "adapter_config.json", "adapter_model.*", "README.md", "rlhfkit_export.json",
)
#: directories whose every entry rlhfkit wrote (a link anywhere inside is refused)
OWN_DIRS = ("checkpoint-*", "adapter", ".saving")

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted in a file's place must not block the open


class PlantedLinkError(RunError):
    """A link (or a FIFO, a device) where rlhfkit writes one of its own files: never followed, never removed."""


def cache_root() -> Path:
    """rlhfkit's cache outside any run directory: ``$RLHFKIT_CACHE``, else ``~/.cache/rlhfkit`` (converted GGUF models,
    the Python API's models and datasets)."""
    return Path(os.environ.get("RLHFKIT_CACHE", Path.home() / ".cache" / "rlhfkit"))


def _refusal(path: Path, st: os.stat_result) -> PlantedLinkError:
    if stat.S_ISLNK(st.st_mode):
        try:
            what = f"a symbolic link to {os.readlink(path)}"
        except OSError:
            what = "a symbolic link"
    elif stat.S_ISREG(st.st_mode):
        what = f"a hard link ({st.st_nlink} names share its content)"
    else:
        what = "not a regular file or directory"
    return PlantedLinkError(f"{path.name} is {what}; rlhfkit never writes through a link in a run directory",
                            where=str(path), fix=f"remove {path} (rlhfkit writes its own file there) or choose "
                                                 "another output_dir")


def _not_a_file(path: Path) -> RunError:
    return RunError(f"{path.name} is a directory where rlhfkit writes a file", where=str(path),
                    fix=f"move {path} away or choose another output_dir")


def refuse_link(path: str | Path) -> os.stat_result | None:
    """``lstat`` of ``path`` (None when nothing is there); a link, FIFO, socket or device raises
    :class:`PlantedLinkError` naming it."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise _refusal(path, st)
    return st


def is_own_name(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in OWN_NAMES)


def check_run_dir(run_dir: str | Path) -> None:
    """Before a run writes anything: no entry of ``run_dir`` under a name rlhfkit writes (:data:`OWN_NAMES`), nor
    anything inside the directories it writes whole (:data:`OWN_DIRS`: checkpoints, the adapter), is a link or a
    special file. ``run_dir`` itself may be a link."""
    run_dir = Path(run_dir)
    try:
        entries = sorted(os.scandir(run_dir), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if not is_own_name(entry.name):
            continue
        st = refuse_link(run_dir / entry.name)
        if st is not None and stat.S_ISDIR(st.st_mode) and any(fnmatch.fnmatchcase(entry.name, p) for p in OWN_DIRS):
            for sub in sorted(Path(run_dir / entry.name).rglob("*")):
                refuse_link(sub)


# ─────────────────────────────────────────── creating and replacing ───────────────────────────────────────────


def remove(path: str | Path) -> None:
    """Remove a file or a directory tree rlhfkit wrote (nothing there is fine). A link in its place is refused,
    never followed (``shutil.rmtree`` itself removes links inside a tree without following them)."""
    st = refuse_link(path)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def remove_quietly(*paths: str | Path) -> None:
    """Clean-up after a failure: remove what this write made, skipping (never following) anything that is a link
    now or cannot be removed; never raises."""
    for path in paths:
        with contextlib.suppress(OSError, UserError):
            remove(path)


def fresh_dir(path: str | Path) -> Path:
    """An empty directory at ``path`` made by this process (what was there, if rlhfkit's, is removed first; a link
    is refused). ``mkdir`` never follows a link, so nothing inside can have been planted."""
    path = Path(path)
    remove(path)
    os.mkdir(path)
    return path


def make_dirs(path: str | Path) -> Path:
    """``mkdir -p`` that refuses a link or a file in the place of the last component (a link higher up, such as
    the run directory itself, is the user's choice)."""
    path = Path(path)
    st = refuse_link(path)
    if st is None:
        path.mkdir(parents=True, exist_ok=True)
    elif not stat.S_ISDIR(st.st_mode):
        raise RunError(f"{path.name} is a file, not a directory", where=str(path), fix="remove it or choose another "
                                                                                        "output_dir")
    return path


def _open_fd(path: Path, flags: int) -> int:
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, 0o644)
    except OSError as err:
        st = refuse_link(path)  # ELOOP (a link), EEXIST (one raced in): name it
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise _not_a_file(path) from None
        raise err
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:  # a hard link shares its content with a file elsewhere
        os.close(fd)
        raise _refusal(path, st)
    return fd


def open_new(path: str | Path, mode: str = "w", encoding: str | None = "utf-8"):
    """A new file at ``path``, opened for writing: an earlier file of that name is removed first (a link or a
    special file is refused, never followed), then ``O_CREAT | O_EXCL | O_NOFOLLOW`` makes sure this process
    created it."""
    path = Path(path)
    st = refuse_link(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise _not_a_file(path)
    remove(path)
    fd = _open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    return os.fdopen(fd, mode, encoding=None if "b" in mode else encoding)


def open_append(path: str | Path, encoding: str = "utf-8"):
    """``path`` opened for appending (created when missing; read-write, so its end can be read back), never through
    a link."""
    fd = _open_fd(Path(path), os.O_RDWR | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding=encoding)


def open_lock(path: str | Path) -> int:
    """A read-write descriptor of the lock file (created when missing), never through a link."""
    return _open_fd(Path(path), os.O_RDWR | os.O_CREAT)


def replace(src: str | Path, dst: str | Path) -> None:
    """Rename ``src`` over ``dst`` (atomic), after checking that ``dst`` is not a link; a directory at ``dst`` is
    removed first (a directory cannot be renamed over a non-empty one)."""
    st = refuse_link(dst)
    if st is not None and stat.S_ISDIR(st.st_mode):
        if not os.path.isdir(src):
            raise _not_a_file(Path(dst))
        shutil.rmtree(dst)
    os.replace(src, dst)


def fsync_dir(path: str | Path) -> None:
    """Make a rename / creation inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ─────────────────────────────────────────────── write failures ───────────────────────────────────────────────


def nbytes(obj: Any) -> int:
    """The bytes of every tensor / array in ``obj`` (dicts, lists, tuples walked), plus strings and bytes: what
    saving it needs on disk, give or take the container's overhead."""
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return int(obj.element_size()) * int(obj.numel())
    if hasattr(obj, "nbytes") and not isinstance(obj, (str, bytes)):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    if isinstance(obj, (str, bytes)):
        return len(obj)
    return 8


def model_nbytes(model) -> int:
    """Bytes of a model's parameters and buffers (what its safetensors file holds)."""
    return sum(nbytes(t) for t in model.state_dict().values())


def free_bytes(path: str | Path) -> int | None:
    """Free bytes on the filesystem holding ``path`` (its nearest existing ancestor), None when unknown."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def _reason(err: BaseException) -> str:
    text = getattr(err, "strerror", None)
    if text:
        return text
    low = str(err).lower()  # torch: "PytorchStreamWriter failed writing file ..."; safetensors: "... StorageFull"
    if any(s in low for s in ("no space left", "storagefull", "disk full", "file write failed", "quota")):
        return "No space left on device"
    return (str(err).strip().splitlines() or [type(err).__name__])[-1][:160]


def write_failed(path: str | Path, err: BaseException, need: int | None = None, *, what: str | None = None,
                 fix: str = "rerun (it resumes from the newest checkpoint)") -> RunError:
    """One line for a failed write: the path, the reason, the space it needed and the space free."""
    path = Path(path)
    free = free_bytes(path)
    space = ""
    if need:
        space = f"; it needs about {_size(need)}" + (f", {_size(free)} free" if free is not None else "")
    todo = f"free at least {_size(need)} on that disk and " if need else "free disk space / check permissions and "
    return RunError(f"writing {what or path.name} failed: {_reason(err)}{space}", where=str(path), fix=todo + fix)


@contextlib.contextmanager
def writing(path: str | Path, *, need: int | None = None, cleanup: Iterable[str | Path] = (), what: str | None = None,
            fix: str = "rerun (it resumes from the newest checkpoint)") -> Iterator[None]:
    """Around a write: any failure of the write (:data:`WRITE_ERRORS`) removes ``cleanup`` (its partial output) and
    becomes one line (:func:`write_failed`); a :class:`~rlhfkit.errors.UserError` (a planted link) passes as it is,
    after the same clean-up."""
    try:
        yield
    except UserError:
        remove_quietly(*cleanup)
        raise
    except WRITE_ERRORS as err:
        remove_quietly(*cleanup)
        raise write_failed(path, err, need, what=what, fix=fix) from None


def write_atomic(path: str | Path, data: str | bytes, *, what: str | None = None,
                 fix: str = "rerun (it resumes from the newest checkpoint)") -> Path:
    """Replace ``path`` with ``data`` all at once: written to ``<name>.tmp`` (a new file, never a link), fsynced,
    renamed over ``path`` (refused when ``path`` is a link); a failure leaves the earlier file and no ``.tmp``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with writing(path, need=len(raw), cleanup=[tmp], what=what, fix=fix):
        refuse_link(path)
        with open_new(tmp, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        replace(tmp, path)
    fsync_dir(path.parent)
    return path


def save_torch(obj: Any, path: str | Path, *, what: str | None = None,
               fix: str = "rerun (it resumes from the newest checkpoint)") -> Path:
    """``torch.save(obj)`` to ``path`` atomically (``<name>.tmp``, a new file never a link, then renamed), a failure
    being one line with the space needed (:func:`writing`)."""
    import torch

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with writing(path, need=nbytes(obj), cleanup=[tmp], what=what, fix=fix):
        refuse_link(path)
        with open_new(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        replace(tmp, path)
    fsync_dir(path.parent)
    return path
