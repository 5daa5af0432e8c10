"""Reading a config: YAML files, dotted overrides (``optim.lr=1e-4``), coercion into the frozen dataclasses of
:mod:`.schema` with bounds, choices and a "did you mean" for unknown keys; then writing it back (:func:`dump_yaml`,
:func:`save_config`).

Building validates every key and type once: unknown keys and wrong types raise :class:`~rlhfkit.errors.ConfigError`
with the file (or ``command line``), the key path and a fix, in one line. After that the config is frozen.

Why PyYAML plus our own ~300 lines, not OmegaConf (the field's habit; issue 17 asked). Measured with OmegaConf 2.4.0
on rlhfkit's own dataclasses (``OmegaConf.structured(SFTConfig)`` + ``merge`` + ``from_dotlist`` + ``to_object``):
what it does as well: the schema from our frozen dataclasses, ``1e-5`` read as a float (PyYAML reads it as a string:
:func:`_fix_sci`), lists / dicts / null in dotted overrides, a "did you mean" for an unknown key. What it gets wrong
or loses, each a case users hit:

* ``train.mixed_precision=no`` becomes the string ``'False'`` (YAML 1.1 ``no``); :func:`_coerce` reads it back as
  ``no`` because ``no`` is one of the key's choices.
* ``output_dir=runs/${USER}`` or a chat template holding ``${...}`` fails at ``to_object``
  (``InterpolationKeyError: Interpolation key 'USER' not found``): every string is an interpolation there.
* ``model.chat_template={{ messages }}`` on the command line: ``ConstructorError ... found unhashable key``;
  ``output_dir=runs/a: b``: ``Cannot convert 'DictConfig' to string``. Here a value that YAML reads as a mapping
  without the user writing ``{`` stays the text it was (:func:`parse_override`).
* ``track.backends=jsonl,wandb`` (a list key given as text) and ``--max-steps=3`` (argparse style) are refused.
* ``train.batch_size=2.0`` is refused ("could not be converted to Integer"); here a whole float is an integer.
* ``data.fields`` / ``*.kwargs`` are deep-merged (recipe default ``{prompt: q}`` + override ``{answer: a}`` gives
  both); here a mapping the user gives replaces the default.
* No bounds, choices or finiteness: ``optim.lr=-1``, ``train.batch_size=0``, ``train.epochs=inf`` and
  ``data.format=sftt`` all pass; bounds (``ge`` / ``gt`` / ``le`` / ``lt`` in the field metadata) and the choices
  read from the registries would have to stay ours anyway.
* Errors are several lines (``full_key: optim.lr / reference_type=OptimConfig / object_type=OptimConfig``) and
  do not name the file the key came from (a merge forgets it); ours are one line naming the file and the key, with
  a fix. A YAML syntax error names ``file:line`` in both (PyYAML's mark); neither keeps line numbers for a key that
  parses but is wrong.
* TRL's flat names (``learning_rate``, ``beta`` per family) are unknown keys there, and would stay our
  pre-processing (:mod:`.aliases`).

So OmegaConf would replace the ~60 lines that read YAML and split ``key.sub=value``, and every guarantee above would
need code of ours around it again, plus a dependency (OmegaConf, antlr4). PyYAML stays the parser; we keep the
coercion.

**Bounded YAML** (:func:`load_yaml`, for config files and every override's value): PyYAML's safe loader builds a
"billion laughs" (9 levels of nested aliases) in no time as shared objects, and then every walk over the tree (the
merge, the coercion, ``deepcopy``, the dump) expands it: the CLI hung for minutes. A 50,000-deep nested list is a
``RecursionError`` in its composer, and a key written twice in one mapping silently takes the last value. So the
composed node graph is checked before anything is built: at most :data:`YAML_MAX_DEPTH` levels (counted while
composing, aliases followed), at most :data:`YAML_MAX_VALUES` values with every alias expanded (counted on the
graph, each node once, so the check itself is linear), no alias that contains itself, no key twice in one mapping
(a ``<<`` merge may still be overridden), and at most :data:`YAML_MAX_BYTES` of text; each refusal is one
``ConfigError`` line naming ``file:line``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from .. import files
from ..errors import ConfigError
from .aliases import (
    FILE,
    Origins,
    _begin_aliases,
    _flush_aliases,
    apply_command_line,
    apply_trl_names,
    base_tree,
    defaults_mode,
    finish,
    remember_origin,
    split_trl_names,
    suggest_key,
)
from .choices import choices_of
from .geometry import launched_world_size
from .recipes import RECIPES
from .schema import key_of
from .trl import TRL_NAMES, entries_for

YAML_MAX_BYTES = 1 << 20  # a config file or an override value; a longer one is refused
YAML_MAX_DEPTH = 64  # levels of nesting (aliases followed)
YAML_MAX_VALUES = 100_000  # values in the tree with every alias expanded


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing what no config needs (see the module docstring); ``source`` names the file
    (or ``command line``) in the errors."""

    source, lines = "config", True
    _depth = 0

    def _refuse(self, mark, what: str, fix: str) -> ConfigError:
        line = f":{mark.line + 1}" if self.lines else ""
        return ConfigError(what, where=f"{self.source}{line}", fix=fix)

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > YAML_MAX_DEPTH:
                raise self._refuse(self.peek_event().start_mark, f"YAML nested deeper than {YAML_MAX_DEPTH} levels",
                                   "flatten the structure (no config needs that depth)")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor):
        node = super().compose_mapping_node(anchor)
        seen: dict = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            name = (key.tag, key.value)
            if name in seen:
                lines = f" (lines {seen[name]} and {key.start_mark.line + 1})" if self.lines else ""
                raise self._refuse(key.start_mark, f"key {key.value!r} is written twice in one mapping{lines}; YAML "
                                                   "would silently keep the last", "keep one of them")
            seen[name] = key.start_mark.line + 1
        return node

    def compose_document(self):
        node = super().compose_document()
        self._measure(node, {}, set(), 1)
        return node

    def _measure(self, node, seen: dict, open_: set, depth: int) -> tuple[int, int]:
        """(values, levels) under ``node`` with every alias expanded, each node measured once (``seen``), refused
        past the bounds; ``depth``: the levels above it."""
        key = id(node)
        if key in open_:
            raise self._refuse(node.start_mark, "a YAML alias contains itself (a recursive structure)",
                               "remove the alias")
        if key not in seen:
            if depth > YAML_MAX_DEPTH:
                raise self._refuse(node.start_mark, f"YAML aliases nest deeper than {YAML_MAX_DEPTH} levels",
                                   "write the values out (no config needs that depth)")
            open_.add(key)
            children = node.value if isinstance(node, yaml.SequenceNode) else \
                [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else []
            size, height = 1, 1
            for child in children:
                child_size, child_height = self._measure(child, seen, open_, depth + 1)
                size, height = size + child_size, max(height, child_height + 1)
                if size > YAML_MAX_VALUES:
                    raise self._refuse(node.start_mark, f"YAML aliases expand to more than {YAML_MAX_VALUES:,} "
                                       "values (nested aliases: a 'billion laughs')",
                                       "write the values out, or use fewer aliases")
            open_.discard(key)
            seen[key] = size, height
        size, height = seen[key]
        if depth + height - 1 > YAML_MAX_DEPTH:  # a node measured before, met again deeper through an alias
            raise self._refuse(node.start_mark, f"YAML aliases nest deeper than {YAML_MAX_DEPTH} levels",
                               "write the values out (no config needs that depth)")
        return size, height


def load_yaml(text: str, source: str = "config", lines: bool = True):
    """``text`` parsed as YAML, within the bounds of the module docstring (``source``: the file, or
    ``command line``, for the errors, with the line when ``lines``); ``yaml.YAMLError`` for a syntax error, as
    ``yaml.safe_load``."""
    if len(text) > YAML_MAX_BYTES:
        raise ConfigError(f"YAML of {len(text):,} characters (more than {YAML_MAX_BYTES:,})", where=source,
                          fix="keep data out of the config: give a file path instead")
    loader = _BoundedLoader(text)
    loader.source, loader.lines = source, lines
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _did_you_mean(key: str, options: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, options, n=1, cutoff=0.5)
    if close:
        return f"did you mean '{prefix}{close[0]}'?"
    return f"valid keys: {', '.join(prefix + o for o in sorted(options))}"


def _is_optional(tp) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def _coerce(value: Any, tp, path: str, source: str):
    """Check / convert ``value`` to type ``tp`` or raise ConfigError naming ``path``."""
    optional, tp = _is_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"'{path}' may not be null", where=source, fix=f"give a value for {path}", key=path)
    where = source

    def bad(expected: str):
        return ConfigError(
            f"'{path}' must be {expected}, got {type(value).__name__} {value!r}", where=where,
            fix=f"set {path} to {expected}", key=path,
        )

    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        if not isinstance(value, dict):
            raise bad("a mapping")
        return _build(tp, value, path, source)
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise bad("true or false")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise bad("an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    raise bad("a number") from None
            else:
                raise bad("a number")
        value = float(value)
        if not math.isfinite(value):
            raise bad("a finite number")
        return value
    if tp is str:
        if isinstance(value, bool) and ("no" if not value else "yes") in (choices_of(path) or ()):
            return "no" if not value else "yes"  # YAML 1.1 reads `no` as false: train.mixed_precision=no
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str) and item_tp is str:  # track.backends=tensorboard or =jsonl,wandb
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise bad("a list")
        return [_coerce(v, item_tp, f"{path}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise bad("a mapping")
        return {str(k): _coerce(v, val_tp, f"{path}.{k}", source) for k, v in value.items()}
    raise TypeError(f"unsupported config type {tp} at {path}")


_BOUNDS = {"ge": (lambda v, b: v >= b, ">="), "gt": (lambda v, b: v > b, ">"), "le": (lambda v, b: v <= b, "<="),
           "lt": (lambda v, b: v < b, "<")}


def _check_bounds(value, meta, path: str, source: str) -> None:
    """Numbers (and lists of numbers) against the field's ``ge`` / ``gt`` / ``le`` / ``lt`` bounds."""
    items = value if isinstance(value, list) else [value]
    for v in items:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        for key, (ok, _) in _BOUNDS.items():
            if key in meta and not ok(v, meta[key]):
                limits = " and ".join(f"{s} {meta[k]}" for k, (_, s) in _BOUNDS.items() if k in meta)
                raise ConfigError(f"'{path}' must be {limits}, got {v!r}", where=source,
                                  fix=f"set {path} to a value {limits}", key=path)


def _build(cls, data: dict, prefix: str, source: str, base=None, root=None):
    """``cls`` with the keys of ``data`` set on top of ``base`` (default: the class defaults). Nested sections start
    from the parent's default for that field, so a recipe's own defaults survive a partial override."""
    base = base if base is not None else cls()
    hints = typing.get_type_hints(cls)
    fields_by_key = {key_of(fl.name): fl for fl in dataclasses.fields(cls)}
    names = list(fields_by_key)
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(
                f"unknown key '{path}'", where=source,
                fix=suggest_key(path, root or cls, names, f"{prefix}." if prefix else ""), key=path,
            )
        name = fields_by_key[key].name
        current = getattr(base, name)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            kwargs[name] = _build(type(current), value, path, source, base=current, root=root or cls)
            continue
        coerced = _coerce(value, hints[name], path, source)
        _check_bounds(coerced, fields_by_key[key].metadata, path, source)
        choices = choices_of(path)
        if choices is not None and coerced not in choices:
            raise ConfigError(
                f"'{path}' must be one of {', '.join(choices)}, got {coerced!r}", where=source,
                fix=_did_you_mean(str(coerced), list(choices)), key=path,
            )
        kwargs[name] = coerced
    return dataclasses.replace(base, **kwargs)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in ("fields", "kwargs"):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=1e-4`` -> (["a", "b"], 1e-4); values are parsed as YAML (numbers, bools, lists, null)."""
    key, eq, raw = text.partition("=")
    key = key.strip().lstrip("-").replace("-", "_") if key.startswith("--") else key.strip()
    if not eq or not key:
        raise ConfigError(f"bad override {text!r}", where="command line", fix="write key.sub=value, e.g. optim.lr=1e-5")
    try:
        value = load_yaml(raw, "command line", lines=False) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except ConfigError as err:
        err.message = f"{key}: {err.message}"
        raise
    if isinstance(value, float) is False and isinstance(raw, str) and _looks_like_sci(raw):
        value = float(raw)
    if isinstance(value, (dict, list)) and not raw.strip().startswith(("{", "[")):
        value = raw  # e.g. output_dir=runs/a: b is a path, not a mapping
    return key.split("."), value


def _looks_like_sci(raw: str) -> bool:
    # YAML 1.1 reads "1e-5" as a string; users mean a number.
    try:
        float(raw)
    except ValueError:
        return False
    return any(c in raw.lower() for c in "e") and not raw.strip().lower().startswith(("inf", "nan"))


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}", where=str(p), fix="check the path (see configs/ for examples)")
    try:
        data = load_yaml(p.read_text(), str(p)) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        raise ConfigError(f"invalid YAML ({getattr(exc, 'problem', exc)})", where=where,
                          fix="fix the YAML syntax") from None
    if not isinstance(data, dict):
        raise ConfigError("a config file must be a mapping of keys", where=str(p), fix="see configs/ for examples")
    return _fix_sci(data)


Lines = dict[tuple, int]
_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*|\[\d+\])*$")


def yaml_lines(path: str | Path) -> Lines:
    """The 1-based line of every key (and list item) of the YAML file ``path``, by its path in the tree
    (``("optim", "lr")``, ``("reward", "functions", 0, "fn")``): PyYAML's node marks, read beside the parsed data.
    {} when the file cannot be read or parsed (its own error is reported elsewhere)."""
    try:
        text = Path(path).read_text()
        root = _BoundedLoader(text).get_single_node() if len(text) <= YAML_MAX_BYTES else None
    except (OSError, ValueError, yaml.YAMLError, ConfigError):
        return {}
    out: Lines = {}

    def walk(node, at: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for knode, vnode in node.value:
                here = (*at, str(knode.value))
                out.setdefault(here, knode.start_mark.line + 1)
                walk(vnode, here)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                out.setdefault((*at, i), item.start_mark.line + 1)
                walk(item, (*at, i))

    walk(root, ())
    return out


def is_key(text: str | None) -> bool:
    """``text`` is a dotted config key (``algo.kl.coef``, ``reward.functions[0].fn``), not a file or a phrase."""
    return bool(text and _KEY.match(text))


def _key_path(key: str) -> tuple:
    """``reward.functions[0].fn`` -> ("reward", "functions", 0, "fn")."""
    return tuple(int(p[1:-1]) if p.startswith("[") else p for p in re.findall(r"[^.\[\]]+|\[\d+\]", key))


def locate(err: ConfigError, path: str | Path | None, overrides=()) -> ConfigError:
    """``err`` with ``file:line`` as its place when the key it is about (``err.key``, or ``err.where`` when that is a
    dotted key) was written in the config file ``path`` and not set again by a command-line override; the rest of
    the message is unchanged (an error placed by a key, ``where=key``, keeps the key after the line). Errors about
    overrides, or keys the file does not hold, are returned as they were."""
    if path is None or err.located:
        return err
    key = err.key or (err.where if is_key(err.where) else None)
    if not key:
        return err
    parts = _key_path(key)
    for item in overrides:
        try:
            over = _key_path(".".join(parse_override(item)[0]))  # reward.functions[0].weight as the error's path
        except ConfigError:
            continue
        if parts[: len(over)] == over or over[: len(parts)] == parts:
            return err  # the command line set it (or a key inside it): its message stays as it was
    lines = yaml_lines(path)
    line = lines.get(parts)
    if line is None:  # the file may have written it under TRL's name (learning_rate: -1 -> optim.lr)
        line = next((lines[(t.name,)] for t in TRL_NAMES if t.key == key and (t.name,) in lines), None)
    if line is None:
        return err
    err.where = f"{path}:{line}" if err.key else f"{path}:{line}: {err.where}"
    err.located = True
    return err


def _fix_sci(node):
    if isinstance(node, dict):
        return {k: _fix_sci(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_fix_sci(v) for v in node]
    if isinstance(node, str) and _looks_like_sci(node) and node.strip()[0] in "0123456789.-+":
        return float(node)
    return node


def build_config(recipe: str, data: dict | None = None, overrides: list[str] | tuple[str, ...] = (),
                 source: str = "config", interface: str | None = None):
    """Build, validate (types, bounds, choices, then the recipe's cross-field ``check()``) and freeze the config of
    ``recipe`` from a mapping plus dotted overrides. Its defaults are rlhfkit's or TRL 1.16's
    (:func:`~.aliases.defaults_mode`; ``interface``: the Python API's word that the run is configured through TRL's
    interface); where each value came from is kept beside it (:func:`~.aliases.origin_of`)."""
    if recipe not in RECIPES:
        raise ConfigError(f"unknown recipe '{recipe}'", where="recipe", fix=_did_you_mean(recipe, list(RECIPES)))
    spec = RECIPES[recipe]
    _begin_aliases()
    data, file_trl = split_trl_names(copy.deepcopy(data or {}), recipe)
    parsed = [parse_override(item) for item in overrides]
    origins = Origins(*defaults_mode(recipe, data, parsed, source, file_trl, interface))  # TRL's or rlhfkit's
    tree = _merge(base_tree(recipe, origins.mode), data)  # never mutate shared defaults
    if origins.mode == "trl" or "defaults" in tree:
        tree["defaults"] = origins.mode
    file_recipe = tree.get("recipe", recipe)
    if file_recipe not in RECIPES or RECIPES[file_recipe].config is not spec.config:
        raise ConfigError(
            f"this config is for recipe '{file_recipe}', not '{recipe}'", where=f"{source}: recipe",
            fix=f"run `rlhfkit {file_recipe} ...` or use a {recipe} config",
        )
    tree["recipe"] = recipe if data.get("recipe") is None else file_recipe
    origins.set_tree(data, FILE)
    apply_trl_names(tree, file_trl, recipe, source, direct=data, origins=origins)  # renamed, translated or refused
    apply_command_line(tree, parsed, recipe, origins)  # the command line wins over the file, whichever names
    src = source if not overrides else f"{source} + overrides"
    finish(tree, recipe, src, origins, launched_world_size())  # policy-loss sections, TRL's batch geometry
    cfg = _build(spec.config, tree, "", src)
    cfg.check()
    _flush_aliases()
    remember_origin(cfg, origins, [*file_trl, *(k[0] for k, _ in parsed if len(k) == 1 and k[0] not in data
                                                and entries_for(k[0]))])
    return cfg


def load_config(recipe: str, path: str | Path | None, overrides=()):
    """Read ``path`` (may be None) and build ``recipe``'s config; an error about a key the file holds names its
    ``file:line`` (:func:`locate`)."""
    data = read_yaml(path) if path else {}
    try:
        return build_config(recipe, data, overrides, source=str(path) if path else "defaults")
    except ConfigError as err:
        raise locate(err, path, overrides) from None


def replace(cfg, **changes):
    """A changed copy (configs are frozen); nested sections as dicts of changes, e.g. train={"seed": 1}."""
    kwargs = {}
    for key, value in changes.items():
        cur = getattr(cfg, key)
        if dataclasses.is_dataclass(cur) and isinstance(value, dict):
            kwargs[key] = replace(cur, **value)
        else:
            kwargs[key] = value
    return dataclasses.replace(cfg, **kwargs)


def dump_yaml(cfg, comments: bool = True) -> str:
    """YAML text of ``cfg`` with each key's help string as a trailing comment."""
    lines: list[str] = []

    def emit(obj, indent: int):
        for fl in dataclasses.fields(obj):
            value = getattr(obj, fl.name)
            help_text = fl.metadata.get("help", "")
            pad = "  " * indent
            if dataclasses.is_dataclass(value):
                lines.append(f"{pad}{key_of(fl.name)}:" + (f"  # {help_text}" if comments and help_text else ""))
                emit(value, indent + 1)
                continue
            if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
                value = [dataclasses.asdict(v) for v in value]
            text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
            if text.endswith("\n...") or text.endswith("..."):
                text = text.replace("\n...", "").replace("...", "").strip()
            lines.append(f"{pad}{key_of(fl.name)}: {text}" + (f"  # {help_text}" if comments and help_text else ""))

    emit(cfg, 0)
    return "\n".join(lines) + "\n"


def specific_sections(recipe: str) -> dict[str, list[str]]:
    """The sections of ``recipe``'s config that not every recipe has as they are here (``algo``, ``generation``,
    ``critic``, ...): section -> the recipes that have it."""
    configs = {r: spec.config for r, spec in RECIPES.items() if spec.family != "pipeline"}
    out: dict[str, list[str]] = {}
    for fl in dataclasses.fields(RECIPES[recipe].config):
        if not dataclasses.is_dataclass(fl.default_factory() if callable(fl.default_factory) else fl.default):
            continue
        owners = [r for r, c in configs.items() if any(g.name == fl.name and g.type == fl.type
                                                       for g in dataclasses.fields(c))]
        if len(owners) < len(configs):
            out[fl.name] = owners
    return out


def show_yaml(cfg, width: int = 120) -> str:
    """:func:`dump_yaml` for reading in a terminal (``rlhfkit config show``): each section that only some recipes
    have is headed by a line naming them, and a comment that would pass ``width`` columns goes, wrapped, above its
    key."""
    specific = specific_sections(cfg.recipe) if cfg.recipe in RECIPES else {}
    lines: list[str] = []
    for line in dump_yaml(cfg).splitlines():
        key = line.split(":", 1)[0]
        if key in specific:
            owners = specific[key]
            lines.append(f"# ── {key}: recipe-specific (only in {', '.join(owners)}) ──")
        code, sep, comment = line.partition("  # ")
        if len(line) <= width or not sep:
            lines.append(line)
            continue
        pad = " " * (len(code) - len(code.lstrip()))
        lines += textwrap.wrap(comment, width, initial_indent=pad + "# ", subsequent_indent=pad + "#   ")
        lines.append(code)
    return "\n".join(lines) + "\n"


def save_config(cfg, run_dir: str | Path) -> Path:
    """Write the resolved config (with comments) to ``run_dir/config.yaml``."""
    files.make_dirs(run_dir)
    return files.write_atomic(Path(run_dir) / "config.yaml", dump_yaml(cfg), fix="rerun")
