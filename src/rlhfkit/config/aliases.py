"""TRL's names (``learning_rate``, ``per_device_train_batch_size``, ``loss_type``, ``bf16``, ...) accepted at the top
level of a config file or command line: renamed or translated to the rlhfkit keys they stand for, or refused in one
line that says why (the table is :data:`.trl.TRL_NAMES`). Each is logged once per process (``[config]
learning_rate -> optim.lr`` on stderr), printed only once the config is valid, so that a config error stays the one
line on stderr."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from ..errors import ConfigError, is_main_rank
from .recipes import RECIPES
from .schema import field_of, key_of
from .trl import NoEquivalent, TrlName, entries_for, same_value, word


def trl_entry(name: str, recipe: str, source: str) -> TrlName | None:
    """The entry of TRL name ``name`` for ``recipe``'s family (None: not a TRL name); a name TRL has only for other
    recipe families is refused here."""
    entries = entries_for(name)
    if not entries:
        return None
    family = RECIPES[recipe].family
    for entry in sorted(entries, key=lambda e: not e.families):  # a family's own entry before the general one
        if not entry.families or family in entry.families:
            return entry
    families = sorted({f for e in entries for f in e.families})
    owners = ", ".join(r for r, spec in RECIPES.items() if spec.family in families)
    raise ConfigError(f"'{name}' (TRL) is a setting of the {owners} recipes, not of {recipe}", where=source,
                      fix=f"remove {name}", key=name)


class _Context:
    """What a translation may read: the tree being built (``get``, falling back to the recipe's defaults) and the
    other TRL names given in the same place (``given``). Keys read are remembered: a translation that reads a key
    and writes it back merges (adam_beta1 then adam_beta2), it does not conflict."""

    def __init__(self, tree: dict, recipe: str, given: dict):
        self.tree, self.recipe, self.given, self.read = tree, recipe, given, set()

    def get(self, key: str, *, merge: bool = True):
        """``key``'s value so far; ``merge``: the translation writes it back changed (remembered as read)."""
        if merge:
            self.read.add(key)
        node: Any = self.tree
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return _default_of(self.recipe, key)
            node = node[part]
        return node


def _default_of(recipe: str, key: str):
    """``key``'s default for ``recipe``: the recipe table's default, else the config class's."""
    obj: Any = RECIPES[recipe].defaults
    for part in key.split("."):
        if not isinstance(obj, dict) or part not in obj:
            break
        obj = obj[part]
    else:
        return obj
    obj = RECIPES[recipe].config()
    for part in key.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, field_of(part), None)
    return obj


def _has_key(recipe: str, key: str) -> bool:
    """``key`` names a field of ``recipe``'s config (down to a mapping field such as data.fields)."""
    obj: Any = RECIPES[recipe].config()
    for part in key.split("."):
        if not dataclasses.is_dataclass(obj):
            return True  # inside a mapping (data.fields.text)
        if part not in {key_of(fl.name) for fl in dataclasses.fields(obj)}:
            return key.removeprefix("algo.") in MOVED_TO_POLICY_SECTION and hasattr(obj, "policy_loss")
        obj = getattr(obj, field_of(part))
    return True


def translate(name: str, value, recipe: str, source: str, tree: dict, given: dict) -> tuple[dict, set[str]]:
    """The rlhfkit keys TRL name ``name`` = ``value`` sets for ``recipe`` (and the keys the translation read), or a
    one-line ConfigError: a name with no equivalent, a value with none, a key the recipe does not have."""
    entry = trl_entry(name, recipe, source)
    ctx = _Context(tree, recipe, given)
    if entry.refused:
        if entry.accepted and same_value(value, entry.accepted):
            _note(f"{name}={_show(value)}: nothing to set ({entry.doc})")
            return {}, set()
        raise ConfigError(f"'{name}' (TRL) has no rlhfkit equivalent: {entry.doc}", where=source, fix=entry.fix,
                          key=name)
    try:
        out = {entry.key: value} if entry.key else entry.to(value, ctx)
    except NoEquivalent as exc:
        raise ConfigError(f"'{name}' (TRL): {exc.why}", where=source, fix=exc.fix, key=name) from None
    for key in out:
        if not _has_key(recipe, key):
            raise ConfigError(f"'{name}' (TRL) stands for {key}, which the {recipe} recipe does not have",
                              where=source, fix=f"remove {name}", key=name)
    shown = word(value) if entry.words else _show(value)
    if entry.key:
        _log_alias(name, entry.key)
    elif out:
        _note(f"{name}={shown} -> " + " ".join(f"{k}={_show(v)}" for k, v in out.items()))
    else:
        _note(f"{name}={shown}: nothing to set")
    return out, ctx.read


def _show(value) -> str:
    if isinstance(value, list):
        return "[" + ",".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def split_trl_names(data: dict, recipe: str) -> tuple[dict, dict]:
    """(the keys of a config mapping that are the recipe's own, the TRL names among the others, in order)."""
    names = {fl.name for fl in dataclasses.fields(RECIPES[recipe].config)}
    own, trl = {}, {}
    for key, value in data.items():
        (trl if key not in names and entries_for(str(key)) else own)[key] = value
    return own, trl


def apply_trl_names(tree: dict, items: dict, recipe: str, source: str, *, direct: dict | None = None,
                    given: dict | None = None, written: dict | None = None) -> None:
    """Write the TRL names ``items`` into ``tree`` (in place). ``given``: every TRL name of the same place (a file,
    or the command line; default ``items``), which translations read; ``written``: what the earlier ones of that
    place set (shared between calls for one place). A key set by them that ``direct`` (the keys the same file set
    itself) sets to another value, or that two of them set to different values, is an error; on the command line
    (``direct=None``) they win over the file, and a later override over them."""
    written = {} if written is None else written
    for name, value in items.items():
        out, read = translate(str(name), value, recipe, source, tree, items if given is None else given)
        for key, new in out.items():
            _check_conflict(name, key, new, direct, written, read, source)
            _set(tree, key, new)
            written[key] = (name, new)


def _check_conflict(name, key, new, direct, written, read, source) -> None:
    if direct is not None:
        node: Any = direct
        for part in key.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING and node != new:
            raise ConfigError(f"'{name}' and '{key}' are both set, to different values", where=source,
                              fix=f"keep only {key}", key=name)
    if key in written and written[key][1] != new and key not in read:
        other = written[key][0]
        raise ConfigError(f"'{other}' and '{name}' both set {key}, to different values ({_show(written[key][1])}, "
                          f"{_show(new)})", where=source, fix=f"keep one of {other} and {name}", key=name)


_MISSING = object()


def _set(tree: dict, key: str, value) -> None:
    node = tree
    *parents, last = key.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


# The settings a policy loss reads from its own section (``algo.<section>.<key>``, the section of the chosen
# ``algo.policy_loss``): rlhfkit's earlier ``algo.clip_low`` / ``algo.clip_high`` and the TRL names mapped to them
# above move there once the whole config (recipe defaults, file, overrides) is merged, when the loss is known.
MOVED_TO_POLICY_SECTION = ("clip_low", "clip_high")


def move_policy_settings(tree: dict, recipe: str, source: str) -> None:
    """Move ``algo.clip_low`` / ``algo.clip_high`` of the merged ``tree`` (in place) into the section of the chosen
    policy loss, logged once as ``epsilon -> algo.ppo.clip_low``; a loss whose section has no such setting refuses
    them in one line."""
    algo, defaults = tree.get("algo"), getattr(RECIPES[recipe].config(), "algo", None)
    if not isinstance(algo, dict) or not hasattr(defaults, "policy_loss"):
        return
    moved = {key: algo.pop(key) for key in MOVED_TO_POLICY_SECTION if key in algo}
    if not moved:
        return
    from .. import algos  # the registry, read lazily (it imports torch)

    name = algo.get("policy_loss", defaults.policy_loss)
    spec = algos.POLICY_LOSSES.get(name)
    if spec is None or not isinstance(algo.setdefault(spec.section, {}), dict):
        return  # an unknown loss or a section that is no mapping: building the config names that, not these keys
    section, fields = algo[spec.section], [fl.name for fl in dataclasses.fields(getattr(defaults, spec.section))]
    for key, value in moved.items():
        target = f"algo.{spec.section}.{key}"
        origin = _ALIAS_ORIGINS.get(f"algo.{key}", f"algo.{key}")  # epsilon, cliprange, ... or the old key itself
        if key not in fields:
            raise ConfigError(f"'{origin}' is a {key} setting, and algo.policy_loss={name} has none (its settings: "
                              f"{', '.join(f'algo.{spec.section}.{k}' for k in fields) or 'none'})", where=source,
                              fix=f"remove {origin}")
        if key in section and section[key] != value:
            raise ConfigError(f"'{origin}' and '{target}' are both set, to different values", where=source,
                              fix=f"keep only {target}")
        section[key] = value
        _log_alias(origin, target)


_ALIASES_LOGGED: set[str] = set()
_ALIASES_PENDING: list[str] = []
_ALIAS_ORIGINS: dict[str, str] = {}  # this build's alias targets -> the name the user wrote


def _begin_aliases() -> None:
    """Forget the notes of an earlier build (one that failed leaves some)."""
    _ALIASES_PENDING.clear()
    _ALIAS_ORIGINS.clear()


def _log_alias(key: str, target: str) -> None:
    """Note a renamed name; printed by :func:`_flush_aliases` once the config is valid (a config error stays the one
    line on stderr). A key that moves on into a policy loss's section is printed with its final name."""
    _ALIAS_ORIGINS[target] = key
    if target.removeprefix("algo.") in MOVED_TO_POLICY_SECTION:
        return
    _note(f"{key} -> {target}")


def _note(text: str) -> None:
    """One ``[config]`` line, printed once per process."""
    if text not in _ALIASES_LOGGED and text not in _ALIASES_PENDING:
        _ALIASES_PENDING.append(text)


def _flush_aliases() -> None:
    for text in _ALIASES_PENDING:
        _ALIASES_LOGGED.add(text)
        if is_main_rank():  # once per run under torchrun
            print(f"[config] {text}", file=sys.stderr)
    _ALIASES_PENDING.clear()
