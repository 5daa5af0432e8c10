"""Loading raw rows from files, directories and (cached) ``datasets`` names.

:func:`load_rows` returns ``[(where, row), ...]``: every row paired with the place it came from, in the form the
user can open in an editor:

* ``train.jsonl:12`` — line 12 of a JSON-lines file (1-based; blank lines are skipped but counted);
* ``train.json[3]`` — item 3 (0-based) of the record list in a JSON file;
* ``train.csv:row 4`` — spreadsheet row 4 of a CSV file (the header is row 1, the first record row 2);
* ``train.parquet[3]`` — row 3 (0-based) of a Parquet file;
* ``gsm8k:main[train][3]`` — row 3 of a ``datasets`` split;
* ``reasoning_gym:gsm_symbolic[3]`` — item 3 of a procedural task of the ``reasoning-gym`` package, generated here
  (offline, seeded): ``reasoning_gym:NAME?size=500&seed=0&system=default&<the task's own settings>``
  (:func:`load_reasoning_gym`); its ``answer`` and ``metadata`` columns are what the ``reasoning_gym`` verifier reads.

Data given as Python objects (a ``datasets.Dataset``, a list of dicts: the Python API) is written once as JSON lines
into rlhfkit's cache, named by its content (:func:`dataset_file`), so that a run's ``config.yaml`` names a real file
that the CLI can rerun and that the resume fingerprint reads by content.

A split string (``train``, ``train[:500]``, ``train[10:20]``, ``train[:10%]``; the syntax is config's:
:func:`rlhfkit.config.splits.parse_split`) selects rows; for ``datasets`` names it goes to
:func:`datasets.load_dataset`, for local files the slice is applied here (the name part picks files inside a
directory, e.g. ``train`` -> ``train.jsonl``, and is otherwise ignored).

``datasets`` names are loaded **offline** (from the local cache): rlhfkit never downloads data behind your back.
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import hashlib
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from .. import files
from ..config.splits import parse_split
from ..errors import DataError, say
from .formats import Record, detect_kind, drop_tied_pairs, normalize_record
from .images import IMAGE_COLUMNS, check_images, image_ref, is_image_part, part_image

FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


# ---------------------------------------------------------------------------------------------------------------
# split slicing


def _bound(b: str | None, n: int) -> int | None:
    if b is None:
        return None
    if b.endswith("%"):
        pct = int(b[:-1])
        count = int(math.floor(n * abs(pct) / 100.0 + 0.5))  # round half up, as `datasets` does
        return count if pct >= 0 else -count
    return int(b)


def apply_split(rows: list, split: str | None) -> list:
    """Slice ``rows`` by the bracket part of ``split`` (``train[:2]`` keeps the first two)."""
    _, start, stop, is_slice = parse_split(split)
    if not is_slice:
        return rows
    n = len(rows)
    return rows[_bound(start, n):_bound(stop, n)]


# ---------------------------------------------------------------------------------------------------------------
# file readers


def _read_jsonl(path: Path, label: str) -> list[tuple[str, dict]]:
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{label}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"invalid JSON ({exc.msg} at column {exc.colno})", where=where,
                                fix="write one complete JSON object per line (check quotes, commas and "
                                    "brackets)") from None
            if not isinstance(obj, dict):
                raise DataError(f"expected a JSON object, got {type(obj).__name__}", where=where,
                                fix='write one object per line, e.g. {"prompt": "...", "completion": "..."}')
            rows.append((where, obj))
    return rows


def _read_json(path: Path, label: str) -> list[tuple[str, dict]]:
    try:
        with open(path, encoding="utf-8-sig") as f:
            obj = json.load(f)
    except json.JSONDecodeError as exc:
        raise DataError(f"invalid JSON ({exc.msg}: line {exc.lineno} column {exc.colno})", where=label,
                        fix="fix the JSON syntax, or use JSON lines (.jsonl): one object per line") from None
    if isinstance(obj, dict):
        if isinstance(obj.get("data"), list):
            obj = obj["data"]
        else:
            lists = [k for k, v in obj.items() if isinstance(v, list)]
            if len(lists) != 1:
                raise DataError(
                    "a .json file must hold a list of records, or an object with one list of records "
                    f"(found list keys: {lists or 'none'})", where=label,
                    fix='write [{...}, {...}] or {"data": [{...}, ...]}',
                )
            obj = obj[lists[0]]
    if not isinstance(obj, list):
        raise DataError(f"a .json file must hold a list of records, got {type(obj).__name__}", where=label,
                        fix='write [{...}, {...}] or {"data": [{...}, ...]}')
    rows = []
    for i, item in enumerate(obj):
        where = f"{label}[{i}]"
        if not isinstance(item, dict):
            raise DataError(f"expected a JSON object, got {type(item).__name__}", where=where,
                            fix="make every item of the list an object")
        rows.append((where, item))
    return rows


def _read_csv(path: Path, label: str) -> list[tuple[str, dict]]:
    # the csv module keeps every cell a string (no NaN / dtype guessing); labels accept "true"/"1" anyway
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames:
            return []
        return [(f"{label}:row {i + 2}", dict(row)) for i, row in enumerate(reader)]


def _read_parquet(path: Path, label: str) -> list[tuple[str, dict]]:
    try:
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()  # nested lists stay python lists (pandas gives numpy arrays)
    except ImportError:
        try:
            import pandas as pd
        except ImportError:
            raise DataError("reading .parquet needs pyarrow or pandas", where=label,
                            fix="pip install pyarrow, or convert the file to .jsonl") from None
        records = pd.read_parquet(path).to_dict("records")
    except Exception as exc:  # corrupt file
        raise DataError(f"cannot read Parquet: {str(exc).splitlines()[0]}", where=label,
                        fix="check the file, or convert it to .jsonl") from None
    return [(f"{label}[{i}]", r) for i, r in enumerate(records)]


_READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv, ".parquet": _read_parquet}


#: the files :func:`dataset_file` wrote from a Python object in this process -> how the user gave that object
#: (``train_dataset``): an error in row i of such a file names ``train_dataset[i]``, never rlhfkit's cache copy
_WRITTEN_FROM: dict[str, str] = {}


def _read_file(path: Path) -> list[tuple[str, dict]]:
    origin = _WRITTEN_FROM.get(str(path.resolve()))
    if origin is not None:  # one row per line, as dataset_file wrote them
        return [(f"{origin}[{i}]", row) for i, (_, row) in enumerate(_read_jsonl(path, origin))]
    suffix = path.suffix.lower()
    if suffix not in _READERS:
        raise DataError(f"unsupported file type {suffix or '(none)'!r}", where=str(path),
                        fix=f"use one of {', '.join(FILE_SUFFIXES)}")
    try:
        return _READERS[suffix](path, str(path))
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc) from None


_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
         (b"\xfe\xff", "UTF-16"))


def _not_utf8(path: Path, exc: UnicodeDecodeError) -> DataError:
    """Where a file stops being UTF-8, as ``file:line`` and column (the decoder only knows a byte offset of the
    chunk it read, so the position is found again in the file's bytes); a UTF-16 / UTF-32 file is named as such."""
    raw = path.read_bytes()
    enc = next((name for bom, name in _BOMS if raw.startswith(bom)), None)
    if enc is not None:
        return DataError(f"the file is {enc} text, not UTF-8", where=str(path),
                         fix=f"convert it to UTF-8 (e.g. iconv -f {enc} -t UTF-8)")
    try:
        raw.decode("utf-8")  # the whole file: the offset of the first bad byte in it, not in a chunk
        at = min(exc.start, len(raw) - 1)
    except UnicodeDecodeError as first:
        at = first.start
    line = raw.count(b"\n", 0, at) + 1
    col = at - (raw.rfind(b"\n", 0, at) + 1) + 1
    return DataError(f"not UTF-8 text ({exc.reason}, byte 0x{raw[at]:02x} at column {col})", where=f"{path}:{line}",
                     fix="save the file as UTF-8 (it may be Latin-1 / cp1252: iconv -f cp1252 -t UTF-8)")


def _dir_files(path: Path, split_name: str | None) -> list[Path]:
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in FILE_SUFFIXES)
    if split_name:
        picked = [p for p in files if p.stem == split_name or re.match(rf"^{re.escape(split_name)}[-_.]", p.stem)]
        if picked:
            files = picked
    return files


# ---------------------------------------------------------------------------------------------------------------
# datasets


@contextlib.contextmanager
def _offline():
    """Force the Hub libraries into offline mode (read from the local cache only; no retries on the network)."""
    import datasets
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, getattr(datasets.config, "HF_DATASETS_OFFLINE", None),
             hub_constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = True
    datasets.config.HF_DATASETS_OFFLINE = True
    hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def _load_hf(source: str, split: str | None, offline: bool) -> list[tuple[str, dict]]:
    name, _, config = source.partition(":")
    split = split or "train"
    fix = (f"download it once (`huggingface-cli download --repo-type dataset {name}`), or run with "
           "HF_HUB_OFFLINE=0 to let it be fetched, or give a local .jsonl/.json/.csv/.parquet file") if offline else \
        "check the dataset name and split, or give a local .jsonl/.json/.csv/.parquet file"
    try:
        import datasets
    except ImportError:
        raise DataError(f"no file {source!r}, and the 'datasets' library is not installed", where="data",
                        fix="give a local .jsonl/.json/.csv/.parquet file") from None
    try:
        with _offline() if offline else contextlib.nullcontext():
            ds = datasets.load_dataset(name, config or None, split=split)
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        how = "from the local cache (rlhfkit runs offline)" if offline else "from the Hub"
        raise DataError(f"cannot load dataset {source!r} {how}: {msg}", where="data", fix=fix) from None
    label = f"{source}[{split}]"
    return [(f"{label}[{i}]", dict(row)) for i, row in enumerate(_raw_images(ds))]


def _raw_images(ds):
    """``ds`` with its ``Image`` columns (one image or a list) left encoded (``{"bytes", "path"}``): records keep
    image bytes, decoded when they are checked and processed, not all at once here."""
    import datasets

    for name, feature in ds.features.items():
        inner = getattr(feature, "feature", None)
        if isinstance(feature, datasets.Image):
            ds = ds.cast_column(name, datasets.Image(decode=False))
        elif isinstance(inner, datasets.Image):
            ds = ds.cast_column(name, type(feature)(datasets.Image(decode=False)))
    return ds


# ---------------------------------------------------------------------------------------------------------------
# reasoning-gym: procedural tasks generated offline

REASONING_GYM = "reasoning_gym:"
RG_DEFAULTS = {"size": 500, "seed": 0, "system": "default"}


def _reasoning_gym_spec(source: str) -> tuple[str, dict]:
    """``reasoning_gym:NAME?size=..&seed=..`` -> (NAME, settings with the defaults filled in); values read as YAML
    scalars (``size=200`` is a number)."""
    import yaml

    name, _, query = source[len(REASONING_GYM):].partition("?")
    settings = dict(RG_DEFAULTS)
    for key, raw in parse_qsl(query, keep_blank_values=True):
        try:
            settings[key] = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            settings[key] = raw
    return name.strip(), settings


def load_reasoning_gym(source: str) -> list[tuple[str, dict]]:
    """The rows of a ``reasoning-gym`` task (see the module docstring): ``prompt`` (the question, after the
    package's system prompt ``system``: a name of ``reasoning_gym.utils.SYSTEM_PROMPTS``, or ``none`` for the bare
    question as text), ``question``, ``answer`` and ``metadata`` (what its verifier reads). ``size`` items from
    ``seed``; every other setting goes to the task's own config (``reasoning_gym.create_dataset(NAME, ...)``)."""
    name, settings = _reasoning_gym_spec(source)
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
        from reasoning_gym.utils import SYSTEM_PROMPTS
    except ImportError:
        raise DataError("data from reasoning-gym needs the reasoning-gym package", where=source,
                        fix="pip install 'rlhfkit[tasks]' (or pip install reasoning-gym)") from None
    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=1)
        raise DataError(f"reasoning-gym has no task {name!r}", where=source,
                        fix=(f"did you mean {close[0]!r}? " if close else "") + "see reasoning_gym.factory.DATASETS")
    system = settings.pop("system")
    system = None if system in (None, False, "", "none") else str(system)
    if system is not None and system not in SYSTEM_PROMPTS:
        raise DataError(f"reasoning-gym has no system prompt {system!r}", where=source,
                        fix=f"system= one of {', '.join(SYSTEM_PROMPTS)} or none")
    try:
        items = reasoning_gym.create_dataset(name, **settings)
        entries = _generate(items, name, source)
    except (TypeError, ValueError, AssertionError) as exc:
        raise DataError(f"reasoning-gym task {name!r} refused its settings ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''})", where=source,
                        fix="check the settings after '?' against the task's config class") from None
    rows = []
    for i, e in enumerate(entries):
        prompt: Any = e["question"] if system is None else [{"role": "system", "content": SYSTEM_PROMPTS[system]},
                                                            {"role": "user", "content": e["question"]}]
        rows.append((f"{REASONING_GYM}{name}[{i}]", {"prompt": prompt, "question": e["question"],
                                                     "answer": e["answer"], "metadata": e["metadata"]}))
    return rows


RG_SAY_S, RG_MAX_S = 30.0, 600.0  # generating reasoning-gym items: said past the first, refused past the second


def _generate(items, name: str, source: str) -> list:
    """Every item of a reasoning-gym dataset (generated on access, one by one), timed on its first items: a size that
    would take more than :data:`RG_SAY_S` is said in one line with the estimate, one past :data:`RG_MAX_S` refused
    before the time is spent (``size=100000000`` of a task at 8,000 items/s: 3.5 hours and the rows in memory)."""
    n, out, t0 = len(items), [], time.perf_counter()
    while len(out) < n:
        out.append(items[len(out)])
        took = time.perf_counter() - t0
        if len(out) in (200, 2000) or (len(out) < 200 and took > 1.0):
            estimate = took / len(out) * n
            if estimate > RG_MAX_S:
                fits = int(len(out) / took * RG_MAX_S)
                raise DataError(f"reasoning-gym task {name!r}: size={n} would take about {_duration(estimate)} to "
                                f"generate here ({len(out) / took:,.0f} items/s), before the run starts",
                                where=source, fix=f"lower size= (about {fits:,} fit in {_duration(RG_MAX_S)}): a run "
                                                  "reads algo.total_episodes prompts, not more")
            if estimate > RG_SAY_S and len(out) == 200:
                say(f"[data] reasoning-gym task {name!r}: generating {n:,} items, about {_duration(estimate)} "
                    f"({len(out) / took:,.0f} items/s)")
    return out


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


# ---------------------------------------------------------------------------------------------------------------
# Python objects as data files


def _jsonable(value: Any) -> Any:
    """numpy / torch scalars and arrays as their Python values, dates as ISO text; anything else is refused."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def dataset_file(data: Any, label: str, origin: str | None = None) -> str:
    """Write ``data`` (a ``datasets.Dataset``, or a list / tuple of dicts) once as JSON lines under rlhfkit's cache
    (``$RLHFKIT_CACHE`` or ``~/.cache/rlhfkit``, ``datasets/<label>-<sha256 of the lines>.jsonl``) and return the
    path: the same rows give the same file (written once, never changed), other rows another. A row that is not a
    mapping, or a value JSON cannot hold, is one :class:`DataError` naming the row and the column. ``origin``: how
    the user gave ``data`` (default ``<label>_dataset``, the Python API's argument): a later error in one of its rows,
    in this process, names ``origin[row]`` rather than the cache file."""
    origin = origin or f"{label}_dataset"
    rows = data.to_list() if hasattr(data, "to_list") and hasattr(data, "column_names") else data
    if not isinstance(rows, (list, tuple)):
        raise DataError(f"cannot read {type(data).__name__} as {label} data", where=label,
                        fix="give a datasets.Dataset, a list of dicts, or the path of a data file")
    if not rows:
        raise DataError(f"the {label} data has no rows", where=label, fix="give at least one record")
    lines = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"row {i} is a {type(row).__name__}, not a mapping of columns", where=f"{origin}[{i}]",
                            fix='give rows as dicts, e.g. {"prompt": "...", "answer": "..."}')
        row = _images_as_files(row, f"{label}[{i}]")
        try:
            lines.append(json.dumps(row, default=_jsonable, ensure_ascii=False, sort_keys=True))
        except (TypeError, ValueError) as exc:
            bad = next((k for k, v in row.items() if not _json_ok(v)), "?")
            raise DataError(f"column {bad!r} holds a {exc} value, which a data file cannot hold",
                            where=f"{origin}[{i}]", fix="convert it to text, a number or a list first "
                                                       "(e.g. dataset.map)") from None
    text = "\n".join(lines) + "\n"
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    path = files.cache_root() / "datasets" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}-{digest}.jsonl"
    if not path.is_file():
        files.make_dirs(path.parent)
        files.write_atomic(path, text, what=f"the {label} data", fix="free disk space, or set RLHFKIT_CACHE")
    _WRITTEN_FROM[str(path.resolve())] = origin
    say(f"[data] the {label} data ({len(rows)} rows) is the file {path} (written once; the run's config names it)")
    return str(path)


def _image_file(value: Any, where: str, field: str) -> str:
    """An image of Python data as a path a data file can hold: a path made absolute (relative to the current
    directory), or bytes / a PIL image / a ``datasets`` image written once under the cache
    (``datasets/images/<sha256>.<format>``, named by content) and named by that absolute path."""
    ref = image_ref(value, base=Path.cwd(), where=where, field=field)
    if isinstance(ref, str):
        return ref
    digest = hashlib.sha256(ref).hexdigest()[:24]
    kind = next((ext for sig, ext in _SIGNATURES if ref.startswith(sig)), "img")
    path = files.cache_root() / "datasets" / "images" / f"{digest}.{kind}"
    if not path.is_file():
        files.make_dirs(path.parent)
        files.write_atomic(path, ref, what="an image of the data", fix="free disk space, or set RLHFKIT_CACHE")
    return str(path)


_SIGNATURES = ((b"\x89PNG", "png"), (b"\xff\xd8", "jpg"), (b"GIF8", "gif"), (b"RIFF", "webp"), (b"BM", "bmp"))


def _images_as_files(row: dict, where: str) -> dict:
    """``row`` with every image (image columns, content parts) as a file path (:func:`_image_file`)."""
    out = dict(row)
    for column in IMAGE_COLUMNS:
        value = out.get(column)
        if isinstance(value, (list, tuple)):
            out[column] = [_image_file(v, where, column) for v in value]
        elif value is not None:
            out[column] = _image_file(value, where, column)
    for key, value in out.items():
        if isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
            out[key] = [{**m, "content": [{**p, "image": _image_file(part_image(p), where, key)}
                                          if is_image_part(p) and part_image(p) is not None else p
                                          for p in m["content"]]} if isinstance(m["content"], list) else m
                        for m in value]
    return out


def _json_ok(value: Any) -> bool:
    try:
        json.dumps(value, default=_jsonable)
        return True
    except (TypeError, ValueError):
        return False


def _looks_like_path(source: str) -> bool:
    return (source.lower().endswith(FILE_SUFFIXES) or source.startswith((".", "/", "~"))
            or "\\" in source or source.endswith("/"))


# ---------------------------------------------------------------------------------------------------------------
# public


def load_rows(source: str, *, split: str | None = None, offline: bool | None = None) -> list[tuple[str, dict]]:
    """Read the raw rows of ``source`` as ``[(where, row), ...]`` (module docstring for the forms).

    ``source`` is a ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file, a directory of them (or one written by
    ``Dataset.save_to_disk``), or a ``datasets`` name ``name`` / ``name:config`` found in the local cache.
    ``offline`` (None: as for models, offline unless ``HF_HUB_OFFLINE=0``): read ``datasets`` names from the cache
    only.
    """
    source = str(source)
    if offline is None:
        offline = os.environ.get("HF_HUB_OFFLINE", "1") != "0"
    path = Path(source).expanduser()
    split_name = parse_split(split)[0]
    if source.startswith(REASONING_GYM):
        rows = apply_split(load_reasoning_gym(source), split)
    elif path.is_file():
        rows = _read_file(path)
        rows = apply_split(rows, split)
    elif path.is_dir():
        if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            rows = _load_from_disk(path, split_name)
        else:
            files = _dir_files(path, split_name)
            if not files:
                raise DataError(f"no {'/'.join(FILE_SUFFIXES)} files in the directory", where=source,
                                fix="point data.train at a data file or a directory holding some")
            rows = [r for f in files for r in _read_file(f)]
        rows = apply_split(rows, split)
    elif _looks_like_path(source):
        raise DataError("no such file", where=source,
                        fix="check the path (relative paths are taken from the current directory)")
    else:
        parse_split(split)  # validate before the (slow) import
        rows = _load_hf(source, split, offline)
    if not rows:
        raise DataError(f"no records in {source}" + (f" (split {split!r})" if split else ""), where=source,
                        fix="give a file with at least one record" + (" or widen the split" if split else ""))
    return rows


def _conversational(row: dict, fields: dict[str, str] | None) -> bool:
    """The row gives its prompt (or its conversation) as messages, not as text: TRL's "conversational format", in
    which TRL-style reward functions get completions as messages (:mod:`rlhfkit.rewards.trl_style`)."""
    fields = fields or {}
    names = (fields.get("prompt", "prompt"), fields.get("messages", "messages"), "conversations",
             fields.get("chosen", "chosen"), fields.get("completion", "completion"))
    return any(isinstance(row.get(n), list) for n in names)


def _prompt_completion(row: dict, fields: dict[str, str] | None) -> bool:
    """The row is a prompt / completion pair (not a conversation or a text): TRL's rule for which tokens SFT trains
    on by default (``data.completion_only_loss=null``)."""
    fields = fields or {}
    return row.get(fields.get("prompt", "prompt")) is not None and row.get(fields.get("completion",
                                                                                    "completion")) is not None


def is_conversational(records) -> bool:
    """The records' data was conversational (its first record's; see :func:`_conversational`)."""
    return bool(records) and bool(getattr(records[0], "conversational", False))


def _load_from_disk(path: Path, split_name: str | None) -> list[tuple[str, dict]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise DataError(f"cannot load the saved dataset: {str(exc).splitlines()[0]}", where=str(path),
                        fix="check the directory written by save_to_disk") from None
    if isinstance(ds, datasets.DatasetDict):
        key = split_name or "train"
        if key not in ds:
            raise DataError(f"no split {key!r} in the saved dataset (has {', '.join(ds)})", where=str(path),
                            fix=f"set data.split to one of {', '.join(ds)}")
        ds = ds[key]
    return [(f"{path}[{i}]", dict(row)) for i, row in enumerate(_raw_images(ds))]


def load_dataset_records(
    source: str,
    kind: str,
    fields: dict[str, str] | None = None,
    split: str | None = None,
    limit: int | None = None,
) -> list[Record]:
    """:func:`load_rows` then :func:`~rlhfkit.data.formats.normalize_record` on each (the first ``limit`` rows).

    ``kind="auto"`` detects the kind from the first row and holds every other row to it. Preference pairs whose
    chosen equals rejected are dropped, their count printed (:func:`~rlhfkit.data.formats.drop_tied_pairs`; a
    :class:`DataError` when every pair is tied).
    """
    rows = load_rows(source, split=split)
    if limit is not None:
        rows = rows[: max(0, int(limit))]
    if kind == "auto" and rows:
        kind = detect_kind(rows[0][1], fields, rows[0][0])
    path = Path(str(source)).expanduser()
    base = path.parent if path.is_file() else path if path.is_dir() else None  # relative image paths start here
    records = [normalize_record(row, kind, fields, where, base) for where, row in rows]
    if any("images" in r for r in records):
        checked = check_images(records)
        say(f"[data] {source}: {checked} image{'s' if checked != 1 else ''} checked "
            f"({sum(1 for r in records if r.get('images'))} of {len(records)} records have images)")
    for record, (_, row) in zip(records, rows):
        record.conversational = _conversational(row, fields)
        record.prompt_completion = _prompt_completion(row, fields)
    records, tied = drop_tied_pairs(records, source)
    if tied:
        first = ", ".join(getattr(r, "where", "record") for r in tied[:3]) + (", ..." if len(tied) > 3 else "")
        say(f"[data] {source}: dropped {len(tied)} of {len(records) + len(tied)} preference pairs whose chosen "
            f"equals rejected ({first})")
    return records
