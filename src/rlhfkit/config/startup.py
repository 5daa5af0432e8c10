"""The block every run starts with, before any weights load (:func:`startup_block`): whose defaults the run has
(rlhfkit's, or TRL 1.16's and why: :func:`.aliases.defaults_mode`), for an online run the step's geometry and the run's
length (:mod:`.geometry`), the rows of what stays different from TRL that apply to this run, and rlhfkit's practices
beside TRL's defaults (one line, never switched on). The user's own values are never listed: only the defaults they
did not write that TRL would set otherwise (:func:`differences`). The tables are :mod:`.trl_defaults`."""

from __future__ import annotations

import textwrap

from .aliases import origin_of
from .geometry import show_value as _show
from .geometry import step_lines
from .parse import build_config
from .recipes import RECIPES
from .trl_defaults import (
    PRACTICES,
    TRL_CLASSES,
    TRL_DEFAULTS,
    TRL_DIFFERENCES,
    _get,
    _same,
    trl_defaults,
    trl_unmatched,
)


def _irrelevant(cfg) -> set[str]:
    """Keys whose value does not matter for this config (the KL estimator at coefficient 0, the PPO clip range under
    another policy loss, a length setting another one overrides)."""
    skip: set[str] = set()
    algo = getattr(cfg, "algo", None)
    if RECIPES[cfg.recipe].family == "online":
        if algo.kl.coef == 0 and not algo.kl.adaptive:
            skip.add("algo.kl.estimator")
        if algo.policy_loss != "ppo":
            skip |= {"algo.ppo.clip_low", "algo.ppo.clip_high"}
        if not cfg.reward.missing_eos_penalty:
            skip.add("reward.missing_eos_scope")  # no penalty: where it would apply does not matter
        if cfg.train.max_steps > 0:
            skip |= {"train.epochs", "algo.total_episodes"}
        elif algo.total_episodes is not None:
            skip.add("train.epochs")
    elif cfg.train.max_steps > 0:
        skip.add("train.epochs")
    if cfg.optim.warmup_steps > 0:
        skip.add("optim.warmup_ratio")
    return skip


def differences(cfg) -> list[str]:
    """The defaults of ``cfg`` the user did not write that differ from TRL 1.16's for its recipe (``key=value
    [TRL's]``), those that do not matter for this config left out; [] for a recipe TRL 1.16 has no trainer for, or a
    run on TRL's defaults. The online batch geometry is TRL's derivation, shown by the step line."""
    table = trl_defaults(cfg.recipe)
    if table is None:
        return []
    origin, skip = origin_of(cfg), _irrelevant(cfg)
    out = []
    for d in table:
        if d.key in skip or origin.set_by_user(d.key):
            continue
        value = _get(cfg, d.key)
        if d.key == "algo.ppo.clip_high" and value is not None and _same(value, cfg.algo.ppo.clip_low):
            value = None  # clip_high = clip_low is TRL's epsilon_high=None
        if not _same(value, d.value):
            out.append(f"{d.key}={_show(value)} [{d.trl}]")
    return out


def unmatched(cfg, world: int = 1) -> list[str]:
    """The rows of what stays different from TRL 1.16 that apply to this run (those that depend on the data are said
    where they happen)."""
    return [d.text for d in trl_unmatched(cfg.recipe) if d.applies is not None and d.applies(cfg, world)]


def practices(cfg) -> list[str]:
    """rlhfkit's practices for this recipe that the run does not follow and the user did not decide on."""
    origin = origin_of(cfg)
    return [f"{p.say or p.trl} ({p.why})" for p in PRACTICES
            if cfg.recipe in p.recipes and not origin.set_by_user(p.key) and not _same(_get(cfg, p.key), p.value)
            and (p.applies is None or p.applies(cfg, origin))]


def startup_lines(cfg, world: int = 1, n_records: int | None = None) -> list[str]:
    """The lines of :func:`startup_block`, unwrapped."""
    name, lines = f"[{cfg.recipe}]", []
    cls = TRL_CLASSES.get(cfg.recipe)
    if cls is not None and getattr(cfg, "defaults", "rlhfkit") == "trl":
        why = origin_of(cfg).why or "defaults=trl"
        lines.append(f"{name} defaults: TRL 1.16's {cls} ({why}); rlhfkit's own keys keep rlhfkit's "
                     "(docs/coming-from-trl.md)")
    elif cls is not None:
        diffs = differences(cfg)
        if diffs:
            lines.append(f"{name} rlhfkit's defaults where TRL 1.16's {cls} differs (defaults=trl for TRL's): "
                         + ", ".join(diffs))
    if RECIPES[cfg.recipe].family == "online":
        lines += step_lines(cfg, world, n_records)
    if cls is not None and getattr(cfg, "defaults", "rlhfkit") == "trl":
        rows = unmatched(cfg, world)
        if rows:
            lines.append(f"{name} unlike TRL 1.16 here: " + "; ".join(rows))
        advice = practices(cfg)
        if advice:
            lines.append(f"{name} rlhfkit's practice, not switched on: " + ", ".join(advice))
    return lines


def startup_block(cfg, world: int = 1, n_records: int | None = None, width: int = 120) -> str:
    """The block a run starts with (module docstring), wrapped at ``width``; empty when there is nothing to say."""
    return "\n".join(textwrap.fill(line, width, subsequent_indent="    ", break_on_hyphens=False,
                                   break_long_words=False) for line in startup_lines(cfg, world, n_records))


def markdown_table() -> str:
    """The docs' tables (docs/coming-from-trl.md, between its ``trl-defaults`` markers): per recipe, the TRL class
    and the defaults that differ from rlhfkit's own, then every difference that stays, then the practices."""
    rows = ["| recipe | TRL 1.16 class | where rlhfkit's own defaults differ (TRL's value under `defaults=trl`) |",
            "|---|---|---|"]
    for recipe, table in TRL_DEFAULTS.items():
        own = build_config(recipe, {"model": {"name": "tiny"}, "defaults": "rlhfkit"}, source="defaults")
        cells = []
        for d in table:
            value = _get(own, d.key)
            if not _same(value, d.value):
                cells.append(f"`{d.key}` {_show(value)} (TRL: `{d.trl}`)")
        rows.append(f"| {recipe} | `{TRL_CLASSES[recipe]}` | {'; '.join(cells) or 'none'} |")
    rows += ["", "What stays different whatever the settings (a run prints the rows that apply to it):", "",
             "| recipes | TRL 1.16, then rlhfkit | said |", "|---|---|---|"]
    for d in TRL_DIFFERENCES:
        said = "at start-up, when it applies" if d.applies is not None else "where it happens"
        rows.append(f"| {', '.join(d.recipes)} | {d.text} | {said} |")
    rows += ["", "rlhfkit's practice beside TRL's defaults, recommended in one line, never switched on:", "",
             "| recipes | rlhfkit | TRL | why |", "|---|---|---|---|"]
    for p in PRACTICES:
        rows.append(f"| {', '.join(p.recipes)} | `{p.key}={_show(p.value)}` | `{p.trl}` | {p.why} |")
    return "\n".join(rows)
