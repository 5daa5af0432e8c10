"""TRL's names (``learning_rate``, ``per_device_train_batch_size``, ``loss_type``, ``bf16``, ...) accepted at the top
level of a config file or command line: renamed or translated to the rlhfkit keys they stand for, or refused in one
line that says why (the table is :data:`.trl.TRL_NAMES`). Each is logged once per process (``[config]
learning_rate -> optim.lr`` on stderr), printed only once the config is valid, so that a config error stays the one
line on stderr."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, is_main_rank
from .recipes import RECIPES
from .schema import field_of, key_of
from .trl import GEOMETRY_INPUT, NoEquivalent, TrlName, entries_for, same_value, word
from .trl_defaults import defaults_layer, trl_defaults


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

    def __init__(self, tree: dict, recipe: str, given: dict, name: str = ""):
        self.tree, self.recipe, self.given, self.read, self.name = tree, recipe, given, set(), name

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
    ctx = _Context(tree, recipe, given, name)
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
        if not key.startswith(GEOMETRY_INPUT) and not _has_key(recipe, key):
            raise ConfigError(f"'{name}' (TRL) stands for {key}, which the {recipe} recipe does not have",
                              where=source, fix=f"remove {name}", key=name)
    shown = word(value) if entry.words else _show(value)
    if any(key.startswith(GEOMETRY_INPUT) for key in out):
        pass  # noted with the keys it makes, once every source is merged (finish)
    elif entry.key:
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


# where a key was set: the recipe's defaults (or TRL's, defaults=trl), the config file, the command line; a later
# source wins over an earlier one whichever name either used, and two names of one source for one key must agree
DEFAULT, FILE, CLI = 0, 1, 2


class Origins:
    """Which source set each key of a config being built (:data:`FILE` or :data:`CLI`; absent: a default), and
    the TRL geometry inputs (``gradient_accumulation_steps``, ``generation_batch_size``, ``steps_per_generation``)
    of each source, turned into keys once every source is merged (:func:`finish`)."""

    def __init__(self, mode: str = "rlhfkit", why: str = ""):
        self.mode, self.why = mode, why
        self.keys: dict[str, tuple[int, str]] = {}  # dotted key -> (source, the name the user wrote)
        self.geometry: dict[str, tuple[object, int]] = {}  # TRL name -> (value, source)

    def set(self, key: str, source: int, name: str) -> None:
        self.keys[key] = (source, name)

    def rank(self, key: str) -> int:
        return self.keys.get(key, (DEFAULT, ""))[0]

    def name(self, key: str) -> str:
        return self.keys.get(key, (DEFAULT, key))[1]

    def set_tree(self, data: dict, source: int, prefix: str = "") -> None:
        """Every dotted key of the mapping ``data`` (a file's own keys) as set by ``source``."""
        for k, v in data.items():
            key = f"{prefix}{k}"
            self.set(key, source, key)
            if isinstance(v, dict):
                self.set_tree(v, source, key + ".")


def apply_trl_names(tree: dict, items: dict, recipe: str, source: str, *, direct: dict | None = None,
                    given: dict | None = None, written: dict | None = None, origins: Origins | None = None) -> None:
    """Write the TRL names ``items`` into ``tree`` (in place). ``given``: every TRL name of the same place (a file,
    or the command line; default ``items``), which translations read; ``written``: what the earlier ones of that
    place set (shared between calls for one place). A key set by them that ``direct`` (the keys the same file set
    itself) sets to another value, or that two of them set to different values, is an error; on the command line
    (``direct=None``) they win over the file, and a later override over them. ``origins`` records each key's source
    (and keeps the geometry inputs for :func:`finish`)."""
    written = {} if written is None else written
    rank = FILE if direct is not None else CLI
    for name, value in items.items():
        out, read = translate(str(name), value, recipe, source, tree, items if given is None else given)
        for key, new in out.items():
            _check_conflict(name, key, new, direct, written, read, source)
            written[key] = (name, new)
            if key.startswith(GEOMETRY_INPUT):
                if origins is not None:
                    origins.geometry[key[len(GEOMETRY_INPUT):]] = (new, rank)
                continue
            _set(tree, key, new)
            if origins is not None:
                origins.set(key, rank, str(name))


def _check_conflict(name, key, new, direct, written, read, source) -> None:
    if direct is not None and not key.startswith(GEOMETRY_INPUT):
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


def defaults_mode(recipe: str, data: dict, parsed: list, source: str, trl_names=(),
                  interface: str | None = None) -> tuple[str, str]:
    """``(defaults, why)``: whose defaults a config is built on, ``rlhfkit`` or ``trl`` (TRL 1.16's,
    :mod:`.trl_defaults`), and why, in words. The rule (docs/coming-from-trl.md): ``defaults`` as the command line
    (which wins) or the file gives it; else ``trl`` when the run is configured through TRL's interface, for a recipe
    TRL 1.16 has a trainer for: ``interface`` (the Python API's word for it: a TRL config object, a TRL-named trainer
    without rlhfkit keys) or TRL's names in the file / the ``args`` (``trl_names``); else ``rlhfkit``. TRL names on
    the command line alone keep rlhfkit's defaults (the CLI's own recipes; ``defaults=trl`` asks for TRL's)."""
    mode = next((value for keys, value in reversed(parsed) if keys == ["defaults"]), data.get("defaults"))
    if mode is not None:
        mode = str(mode)
        if mode == "trl" and trl_defaults(recipe) is None:
            owners = ", ".join(r for r in RECIPES if trl_defaults(r) is not None)
            raise ConfigError(f"defaults=trl gives TRL 1.16's defaults for the {owners} recipes; TRL 1.16 has no "
                              f"trainer for {recipe}", where=source, fix="remove defaults=trl", key="defaults")
        return mode, f"defaults={mode}"
    if trl_defaults(recipe) is None:
        return "rlhfkit", ""
    if interface:
        return "trl", f"configured through TRL's interface ({interface})"
    names = [str(n) for n in trl_names]
    if names:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        return "trl", f"the configuration is written with TRL's names ({shown})"
    return "rlhfkit", ""


def base_tree(recipe: str, mode: str) -> dict:
    """The defaults a config is built on: the recipe's own, with TRL's over them when ``mode`` is ``trl``."""
    import copy

    tree = copy.deepcopy(RECIPES[recipe].defaults)
    return _merge_trees(tree, defaults_layer(recipe)) if mode == "trl" else tree


def _merge_trees(base: dict, over: dict) -> dict:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge_trees(base[k], v)
        else:
            base[k] = v
    return base


def apply_command_line(tree: dict, parsed: list, recipe: str, origins: Origins) -> None:
    """The command line's overrides (``(keys, value)`` pairs, in order) over ``tree``: TRL names translated (they
    win over the file's keys, whichever name the file used), every key recorded as the command line's."""
    own = {fl.name for fl in dataclasses.fields(RECIPES[recipe].config)}
    cli_trl = {keys[0]: value for keys, value in parsed
               if len(keys) == 1 and keys[0] not in own and trl_entry(keys[0], recipe, "command line")}
    written: dict = {}
    for keys, value in parsed:
        if len(keys) == 1 and keys[0] in cli_trl:  # in command-line order, so a later override still wins
            apply_trl_names(tree, {keys[0]: value}, recipe, "command line", given=cli_trl, written=written,
                            origins=origins)
        else:
            node = tree
            for k in keys[:-1]:
                if not isinstance(node.get(k), dict):
                    node[k] = {}
                node = node[k]
            node[keys[-1]] = value
            origins.set(".".join(keys), CLI, ".".join(keys))
    direct: dict = {}  # the command line's own keys, nested: a TRL name that sets one of them otherwise is refused
    for keys, value in parsed:
        if not (len(keys) == 1 and keys[0] in cli_trl):
            _set(direct, ".".join(keys), value)
    for key, (name, new) in written.items():
        _check_conflict(name, key, new, direct, {}, set(), "command line")


def finish(tree: dict, recipe: str, source: str, origins: Origins, world: int) -> None:
    """Once every source is merged into ``tree`` (in place): the policy-loss settings moved into their section
    (:func:`move_policy_settings`), then TRL's batch names turned into ``algo.mini_batch_size`` /
    ``algo.rollout_batch_size`` (:func:`~rlhfkit.config.geometry.trl_batch`; with ``defaults=trl`` also when
    none is given, as TRL derives them)."""
    move_policy_settings(tree, recipe, source, origins)
    inputs = {name: value for name, (value, _) in origins.geometry.items()}
    if RECIPES[recipe].family != "online" or (not inputs and origins.mode != "trl"):
        return
    from .geometry import trl_batch  # geometry reads the TRL table (trl.py), as this module does

    def get(key: str):
        return _Context(tree, recipe, {}).get(key, merge=False)

    grad_accum = inputs.get("gradient_accumulation_steps", 1)  # any of TRL's batch names: TRL's whole derivation
    n, s = inputs.get("generation_batch_size"), inputs.get("steps_per_generation")
    if n is None and s is None:
        s = grad_accum  # TRL: steps_per_generation defaults to gradient_accumulation_steps
    pairs = str(get("algo.objective")) == "preference"
    if pairs:
        out = _pair_batch(tree, origins, int(get("train.batch_size")), grad_accum, source)
    else:
        out = trl_batch(int(get("train.batch_size")), int(get("algo.num_generations")), world, grad_accum=grad_accum,
                        generation_batch_size=n, steps_per_generation=s, source=source)
    made_of = {"algo.mini_batch_size": ("gradient_accumulation_steps",),
               "algo.rollout_batch_size": ("generation_batch_size", "steps_per_generation")}
    for key, value in out.items():
        if key not in made_of:  # online DPO's micro-batch: TRL's per_device_train_batch_size in responses
            _set(tree, key, value)
            continue
        given = [(name, origins.geometry[name][1]) for name in made_of[key] if name in origins.geometry]
        given = given or [(name, rank) for name, (_, rank) in origins.geometry.items()]
        name, rank = given[0] if given else ("TRL's defaults", DEFAULT)
        if origins.rank(key) > rank:
            continue  # set by a later source (the command line over the file, anything over defaults=trl)
        if origins.rank(key) == rank > DEFAULT and get(key) != value:
            raise ConfigError(f"'{name}' (TRL) makes {key}={value} and '{origins.name(key)}' sets {get(key)}",
                              where=source, fix=f"keep only one of {name} and {key}", key=name)
        _set(tree, key, value)
        b, k = get("train.batch_size"), get("algo.num_generations")
        procs = f"{world} process{'es' if world > 1 else ''}"
        how = (f"OnlineDPOTrainer's per_device_train_batch_size {out['algo.rollout_batch_size'] // grad_accum} "
               f"prompts x 2 completions x gradient_accumulation_steps {grad_accum}" if pairs else
               f"per_device_train_batch_size {b} x gradient_accumulation_steps {grad_accum}"
               if key == "algo.mini_batch_size" else
               f"generation_batch_size {n} / (num_generations {k} x {procs})" if n is not None else
               f"per_device_train_batch_size {b} x steps_per_generation {s} / num_generations {k}")
        if rank > DEFAULT:  # TRL's derivation from its defaults is the step line of the start-up block
            _note(f"{name} -> {key}={value} (TRL's batch geometry: {how})")


def _pair_batch(tree: dict, origins: Origins, per_device: int, grad_accum: int, source: str) -> dict[str, int]:
    """Online DPO's step as TRL's OnlineDPOTrainer makes it: ``per_device_train_batch_size`` counts *prompts*, each
    with its two completions, ``gradient_accumulation_steps`` micro-batches an update: rlhfkit's rollout batch of
    B x G prompts, one update of 2 x B x G responses, micro-batches of 2 x B responses. A ``train.batch_size`` the
    user wrote as rlhfkit's key is rlhfkit's micro-batch (in responses) and stays."""
    own_micro = origins.rank("train.batch_size") > DEFAULT and origins.name("train.batch_size") == "train.batch_size"
    b = per_device // 2 if own_micro else per_device
    if own_micro and per_device % 2:
        raise ConfigError(f"train.batch_size={per_device} responses is not whole pairs", where=source,
                          fix=f"set train.batch_size={per_device + 1}", key="train.batch_size")
    out = {"algo.rollout_batch_size": b * grad_accum, "algo.mini_batch_size": 2 * b * grad_accum}
    if not own_micro:
        out["train.batch_size"] = 2 * b
    return out


_MISSING = object()


@dataclass(frozen=True)
class Origin:
    """Where a built config's values came from: ``defaults`` (``rlhfkit`` / ``trl``) and ``why`` (in words), the
    dotted keys a file, the ``args`` or the command line set (``given``; everything else is a default), and the TRL
    names among them. Kept beside the config (:func:`origin_of`), never in ``config.yaml`` or the fingerprint."""

    defaults: str = "rlhfkit"
    why: str = ""
    given: frozenset = frozenset()
    trl_names: tuple = ()

    def set_by_user(self, key: str) -> bool:
        """``key`` (or a section above it, or a key inside it) was set by the user."""
        return any(g == key or key.startswith(g + ".") or g.startswith(key + ".") for g in self.given)


def remember_origin(cfg, origins: Origins, trl_names=()) -> None:
    """Keep ``origins`` beside the frozen ``cfg`` (read by :func:`origin_of`: the start-up block)."""
    given = frozenset(k for k, (rank, _) in origins.keys.items() if rank > DEFAULT)
    object.__setattr__(cfg, "_rlhfkit_origin", Origin(origins.mode, origins.why, given, tuple(trl_names)))


def origin_of(cfg) -> Origin:
    """Where ``cfg``'s values came from (a config not built by :func:`~.parse.build_config`, or changed since: every
    key counts as given, the defaults its ``defaults`` field names)."""
    found = getattr(cfg, "_rlhfkit_origin", None)
    if found is not None:
        return found
    return Origin(getattr(cfg, "defaults", "rlhfkit"), "", frozenset(key_of(fl.name) for fl in dataclasses.fields(cfg)))


def _set(tree: dict, key: str, value) -> None:
    node = tree
    *parents, last = key.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def suggest_key(path: str, root, options: list[str], prefix: str = "") -> str:
    """The fix for unknown key ``path`` of the config class ``root``: the closest of every rlhfkit key (by its full
    dotted name, or by its last part, so ``num_generation`` finds ``algo.num_generations`` from the top level) and
    every TRL name (``num_generation`` -> ``num_generations``) together; without one close enough, the keys of the
    level it was written at (``options`` under ``prefix``), as before."""
    import difflib

    def ratio(a: str, b: str) -> float:
        return difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio()

    leaf = path.rsplit(".", 1)[-1]
    scored: list[tuple[float, str]] = []
    for key in _dotted_keys(root):
        here = key.rpartition(".")[0] == path.rpartition(".")[0]  # the same section: preferred on a tie
        scored.append((max(ratio(path, key), ratio(leaf, key.rsplit(".", 1)[-1]) - 0.02) + 0.01 * here, f"'{key}'"))
    if "." not in path:  # TRL's names are flat
        families = {spec.family for spec in RECIPES.values() if spec.config is root}
        for entry in _TRL_TABLE():
            if not entry.families or families & set(entry.families):
                scored.append((ratio(leaf, entry.name) - 0.01, f"'{entry.name}' (TRL)"))
    scored = [(score, key) for score, key in scored if score >= 0.75]
    if not scored:
        close = difflib.get_close_matches(leaf, options, n=1, cutoff=0.6)
        return f"did you mean '{prefix}{close[0]}'?" if close else \
            f"valid keys: {', '.join(prefix + o for o in sorted(options))}"
    best = max(score for score, _ in scored)
    picks = list(dict.fromkeys(key for score, key in sorted(scored, reverse=True) if score >= best - 0.03))[:2]
    return "did you mean " + " or ".join(picks) + "?"


def _TRL_TABLE():  # noqa: N802 - the table, imported here so that this module's import stays light
    from .trl import TRL_NAMES

    return TRL_NAMES


def _dotted_keys(cls, prefix: str = "") -> list[str]:
    """Every dotted key of the config class ``cls`` (sections opened, mapping fields as one key)."""
    out = []
    obj = cls() if isinstance(cls, type) else cls
    for fl in dataclasses.fields(obj):
        value = getattr(obj, fl.name)
        key = f"{prefix}{key_of(fl.name)}"
        out.append(key)
        if dataclasses.is_dataclass(value):
            out += _dotted_keys(value, key + ".")
    return out


# The settings a policy loss reads from its own section (``algo.<section>.<key>``, the section of the chosen
# ``algo.policy_loss``): rlhfkit's earlier ``algo.clip_low`` / ``algo.clip_high`` and the TRL names mapped to them
# above move there once the whole config (recipe defaults, file, overrides) is merged, when the loss is known.
MOVED_TO_POLICY_SECTION = ("clip_low", "clip_high")


def move_policy_settings(tree: dict, recipe: str, source: str, origins: Origins | None = None) -> None:
    """Move ``algo.clip_low`` / ``algo.clip_high`` of the merged ``tree`` (in place) into the section of the chosen
    policy loss, logged once as ``epsilon -> algo.ppo.clip_low``; a loss whose section has no such setting refuses
    them in one line. Where the section sets the key too, the later source wins (``origins``: the command line's
    ``epsilon_high=0.28`` over the file's ``algo.ppo.clip_high``); the same source with two values is an error."""
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
            moved_rank = origins.rank(f"algo.{key}") if origins is not None else FILE
            target_rank = origins.rank(target) if origins is not None else FILE
            if target_rank > moved_rank:
                continue  # the section's own key was set later (the command line over the file)
            if target_rank == moved_rank:
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


def _flush_aliases(width: int = 120) -> None:
    """The notes of this build not printed before in this process, as one ``[config]`` block: the notes joined by
    "; ", a line broken only between two notes (each stays whole, to be found as written)."""
    notes = [text for text in _ALIASES_PENDING if text not in _ALIASES_LOGGED]
    _ALIASES_LOGGED.update(notes)
    _ALIASES_PENDING.clear()
    if not notes or not is_main_rank():  # once per run under torchrun
        return
    lines, line = [], "[config] TRL names: " + notes[0]
    for note in notes[1:]:
        if len(line) + 2 + len(note) > width - 1:  # room for the ";" a broken line ends with
            lines.append(line + ";")
            line = "    " + note
        else:
            line += "; " + note
    print("\n".join([*lines, line]), file=sys.stderr)
