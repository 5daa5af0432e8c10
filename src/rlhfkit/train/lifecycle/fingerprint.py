"""**The fingerprint** of a run (:func:`run_fingerprint`) is every config key that defines what is trained: the
recipe, model, reference and reward / critic models, data (files, split, format, lengths, packing), optimizer and
schedule, batch geometry (batch size, accumulation), seed, mixed precision, generation and algorithm settings. Not
in it (:data:`NOT_FINGERPRINTED`): where it is written and how it is watched (``output_dir``, ``track.*``, the
``log_every`` / ``eval_every`` / ``save_every`` / ``save_total_limit`` / ``eval_batch_size`` / ``resume`` /
``max_nonfinite_skips`` keys of ``train``), memory savers (``memory.*``, ``model.gradient_checkpointing``), and the
run length (``train.epochs``, ``train.max_steps``, ``algo.total_episodes``): a resumed run may be made longer or
shorter; the LR schedule is then recomputed for the new length from the update reached. Nor are the sections of
policy losses and advantage estimators the run does not use (``algo.gspo.*`` in a ``ppo`` run). A checkpoint's
fingerprint is read in today's key names (:data:`RENAMED_KEYS`: ``algo.clip_low`` of an earlier version is
``algo.<its loss's section>.clip_low``). Every manifest holds it (:func:`checkpoint_fingerprint`), and so does
``finished.json``; ``train/lifecycle/session.py`` compares them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ... import algos
from ...config import key_of

#: config keys (and sections, by prefix) that do not define the run: changing them never blocks a resume
NOT_FINGERPRINTED = ("output_dir", "track.", "memory.", "model.gradient_checkpointing", "train.resume",
                     "train.log_every", "train.eval_every", "train.save_every", "train.save_total_limit",
                     "train.eval_batch_size", "train.max_nonfinite_skips", "train.epochs", "train.max_steps",
                     "algo.total_episodes", "distributed.timeout_s",
                     "algo.async.reference",  # where the reference's log-probs are taken, not what they are
                     "train.device",  # where it runs
                     "defaults")  # which defaults the values came from: the values themselves are fingerprinted
#: the run length: a finished run rerun with the same length is finished; with another, it resumes
LENGTH_KEYS = ("train.epochs", "train.max_steps", "algo.total_episodes")
#: keys added since a checkpoint may have been written, with the value that gives the behaviour of before: a
#: fingerprint without one is read with it (a run of before resumes, unless the new run sets another value)
ADDED_KEYS = {"algo.async.max_staleness": 0, "algo.async.producers": 1, "algo.objective": "policy",
              "reward.missing_eos_scope": "all", "algo.top_entropy_quantile": 1.0,
              "algo.w_reinforce.negative_weight": 1.0}
#: the same for keys every recipe has (issue 40: TRL's semantics as settings)
ADDED_KEYS_ALL = {"optim.warmup_from_zero": False, "data.plain_text": "template", "train.drop_last": True,
                  "model.train_embeddings": True}
#: a key added to the config without an entry here makes every checkpoint written before it unresumable ("(unset) ->
#: value"): tests/unit/test_session.py reads the fingerprints of earlier versions kept in tests/unit/fingerprints/
#: values renamed since: key -> {old value: today's value that means the same}
RENAMED_VALUES = {"algo.off_policy.correction": {"none": "auto"}}  # without async, auto is none
#: keys renamed since a checkpoint may have been written: old key -> today's, so that its fingerprint still matches.
#: ``{policy_loss}`` is the config section of the run's policy loss (``algos.POLICY_LOSSES[name].section``).
RENAMED_KEYS = {
    "algo.clip_low": "algo.{policy_loss}.clip_low",  # the clip range moved into each policy loss's section
    "algo.clip_high": "algo.{policy_loss}.clip_high",
}


#: config keys naming data files: fingerprinted by resolved path and content (:func:`data_identity`), not by the string
DATA_FILE_KEYS = ("data.train", "data.eval")
#: files up to this size are hashed whole; larger ones by size and the sha256 of their first and last MiB
FULL_HASH_LIMIT = 64 << 20
_EDGE = 1 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _file_digest(path: Path, size: int, limit: int | None = None) -> str:
    """sha256 of the whole file up to ``limit`` bytes (:data:`FULL_HASH_LIMIT`), else of its first and last MiB."""
    if size <= (FULL_HASH_LIMIT if limit is None else limit):
        return _sha256(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(_EDGE))
        f.seek(size - _EDGE)
        digest.update(f.read(_EDGE))
    return digest.hexdigest()


def data_identity(value: Any) -> Any:
    """What a data file is, for the fingerprint: ``{"path": resolved path, "size", "sha256"}`` (the whole file up
    to :data:`FULL_HASH_LIMIT`, else its first and last MiB); a directory: the same over every file in it (each file
    over 2 MiB by its first and last MiB, so that a directory of shards is read in seconds). The same
    file named by another relative path is the same; a file changed under the same name is not. A value that names
    no local file (a ``datasets`` name) stays as it is."""
    if not isinstance(value, str) or not value:
        return value
    path = Path(value).expanduser()
    try:
        real = path.resolve(strict=True)
        if real.is_file():
            size = real.stat().st_size
            return {"path": str(real), "size": size, "sha256": _file_digest(real, size)}
        if real.is_dir():
            digest, total = hashlib.sha256(), 0
            for p in sorted(q for q in real.rglob("*") if q.is_file()):
                size = p.stat().st_size
                total += size
                part = _file_digest(p, size, limit=2 * _EDGE)
                digest.update(f"{p.relative_to(real).as_posix()}\0{size}\0{part}\0".encode())
            return {"path": str(real), "size": total, "sha256": digest.hexdigest()}
    except OSError:
        pass
    return value


def _same(key: str, old: Any, new: Any) -> bool:
    """Equal values; for a data file (:data:`DATA_FILE_KEYS`) also an ``old`` path string (a fingerprint written
    before content was recorded) resolving to the file ``new`` describes."""
    if key in DATA_FILE_KEYS and isinstance(old, str) and isinstance(new, dict):
        return os.path.realpath(os.path.expanduser(old)) == new.get("path")
    return old == new


def _show(key: str, old: Any, new: Any) -> str:
    if isinstance(new, dict) and "sha256" in new:
        if isinstance(old, dict) and old.get("path") == new["path"]:
            return (f"{key}: the content of {new['path']} changed ({old.get('size')} -> {new['size']} bytes, another "
                    "checksum)")
        old = old.get("path") if isinstance(old, dict) else old
        new = new["path"]
    return f"{key}: {old} -> {new}"


def _flat(obj, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fl in dataclasses.fields(obj):
        value = getattr(obj, fl.name)
        key = f"{prefix}{key_of(fl.name)}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(_flat(value, key + "."))
        else:
            if isinstance(value, (list, tuple)):
                value = [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value]
            out[key] = json.loads(json.dumps(value, default=str))  # the JSON form, as it is stored
    return out


def _excluded(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in NOT_FINGERPRINTED)


#: settings added to the items of a list key after checkpoints were written, with their default: an item holding the
#: default is fingerprinted without it, as before the setting existed (an older checkpoint still resumes)
ITEM_DEFAULTS = {"reward.functions": {"convention": "auto", "lint": True}}


def run_fingerprint(cfg) -> dict[str, Any]:
    """The settings that define the run (dotted key -> JSON value); see the module doc for what is left out."""
    flat = {k: data_identity(v) if k in DATA_FILE_KEYS else v for k, v in _flat(cfg).items() if not _excluded(k)}
    for key, defaults in ITEM_DEFAULTS.items():
        if isinstance(flat.get(key), list):
            flat[key] = [{k: v for k, v in item.items() if not (k in defaults and v == defaults[k])}
                         if isinstance(item, dict) else item for item in flat[key]]
    return _without_unused_policy_sections(flat)


def _policy_section(fingerprint: dict) -> str | None:
    spec = algos.POLICY_LOSSES.get(fingerprint.get("algo.policy_loss"))
    return spec.section if spec is not None else None


def _without_unused_policy_sections(fingerprint: dict) -> dict:
    """The settings of policy losses, advantage estimators and off-policy corrections the run does not use
    (``algo.<section>.*``, ``algo.off_policy.<section>.*`` of the others) do not define it: a variant added later
    never blocks a resume."""
    used, corr = _policy_section(fingerprint), fingerprint.get("algo.off_policy.correction")
    unused = tuple(f"algo.{p.section}." for p in algos.POLICY_LOSSES.values() if used and p.section != used) + tuple(
        f"algo.off_policy.{c.section}." for c in algos.OFF_POLICY_CORRECTIONS.values() if c.section and c.name != corr)
    if "algo.advantage" in fingerprint:
        unused += tuple(f"algo.{e.section}." for e in algos.ADVANTAGE_ESTIMATORS.values()
                        if e.section and e.name != fingerprint["algo.advantage"])
    if fingerprint.get("algo.objective", "policy") != "preference":  # online DPO's settings
        unused += ("algo.preference.",)
    return {k: v for k, v in fingerprint.items() if not k.startswith(unused)}


def upgrade_fingerprint(old: dict) -> dict:
    """A fingerprint written by an earlier version in today's key names (:data:`RENAMED_KEYS`)."""
    section = _policy_section(old)
    renamed = {}
    for key, value in old.items():
        new = RENAMED_KEYS.get(key)
        renamed[new.format(policy_loss=section) if new and section else key] = value
    for key, value in ADDED_KEYS_ALL.items():
        if "recipe" in renamed:
            renamed.setdefault(key, value)
    if "algo.advantage" in renamed:  # an online run's: the online keys added since
        for key, value in ADDED_KEYS.items():
            renamed.setdefault(key, value)
        for key, values in RENAMED_VALUES.items():
            if key in renamed and renamed[key] in values and "algo.async.max_staleness" not in old:
                renamed[key] = values[renamed[key]]
    return _without_unused_policy_sections(renamed)


def run_length(cfg) -> dict[str, Any]:
    """The run's length keys (:data:`LENGTH_KEYS`) and their values."""
    flat = _flat(cfg)
    return {k: flat[k] for k in LENGTH_KEYS if k in flat}


def fingerprint_diff(old: dict, new: dict) -> list[str]:
    """``key: old -> new`` for every key that differs (keys on one side only included), recipe first; ``old`` is
    read in today's key names first (:func:`upgrade_fingerprint`)."""
    old = upgrade_fingerprint(old)
    keys = sorted(set(old) | set(new), key=lambda k: (k != "recipe", k))
    missing = "(unset)"
    return [_show(k, old.get(k, missing), new.get(k, missing)) for k in keys
            if not _same(k, old.get(k, missing), new.get(k, missing))]
