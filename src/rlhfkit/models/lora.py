"""Which modules LoRA adapts (``model.lora.target_modules``), read as peft reads them and checked before any work.

An entry is a module name, matched as peft matches a list: the module's full name or its last components
(``q_proj`` adapts every ``...self_attn.q_proj``); an entry holding a regular-expression character (``.*[]()|^$+?\\``)
is a regular expression matched against the whole module name, as peft's single-string form
(``peft.LoraConfig(target_modules="model.layers.*.q_proj")`` reaches ``model.lora.target_modules`` as one such entry).
:func:`check_targets` builds the model's skeleton from its config on the ``meta`` device (no weights, no memory) and
refuses, in one line listing the model's adaptable module names, an entry that matches none of its modules: before
the reward lint, the data, or any weights (peft's own ``NoMatchingPeftModuleError`` came after all of them).
:func:`~rlhfkit.models.loading.lora_targets` turns the entries into the list of full module names peft is given.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import ConfigError
from .loading import (
    _hub_kwargs,
    is_pattern,
    is_tiny,
    load_tokenizer_for,
    lora_candidates,
    matches_target,
    resolve_source,
    tiny_model_config,
)
from .vision import family_of


def unmatched(model: torch.nn.Module, entries: list[str]) -> tuple[list[str], list[str]]:
    """(the entries that match none of ``model``'s adaptable modules, those modules' distinct last names); a
    vision-language model's modules are its language model's (:func:`~.loading.lora_candidates`)."""
    names = lora_candidates(model)
    missing = [e for e in entries if not any(matches_target(e, n) for n in names)]
    return missing, sorted({n.rsplit(".", 1)[-1] for n in names})


def _compiles(entry: str) -> bool:
    import re

    try:
        re.compile(entry)
    except re.error:
        return False
    return True


def skeleton(mcfg) -> torch.nn.Module | None:
    """The policy's modules from its config on the ``meta`` device (no weights are read), or None where its config
    cannot be read here (an adapter directory, a hub name that is not cached: the loader says so itself). A
    vision-language model's whole (its language model's modules among them)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    source, _ = resolve_source(mcfg.name, mcfg.gguf_file)
    if is_tiny(source):
        config = tiny_model_config(source, load_tokenizer_for(mcfg))
    elif (Path(source) / "adapter_config.json").is_file():
        return None
    else:
        try:
            config = AutoConfig.from_pretrained(source, **_hub_kwargs())
        except (OSError, ValueError):
            return None
    with torch.device("meta"):
        for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
            try:
                return auto.from_config(config)
            except ValueError:  # a config class this auto class does not map (a VLM: the next one)
                continue
    return None


def check_targets(mcfg, where: str = "model.lora.target_modules") -> None:
    """:class:`~rlhfkit.errors.ConfigError` (one line listing the model's adaptable module names) when LoRA is on and
    an entry of ``target_modules`` matches none of the model's modules, or is a regular expression that does not
    compile; nothing when LoRA is off or the targets are chosen per architecture."""
    lora = mcfg.lora
    entries = list(lora.target_modules or [])
    if not (lora.enabled or lora.qlora) or not entries:
        return
    bad = [e for e in entries if is_pattern(e) and not _compiles(e)]
    if bad:
        raise ConfigError(f"LoRA target {bad[0]!r} is not a valid regular expression", where=where,
                          fix="write module names (q_proj, v_proj) or one Python regular expression")
    model = skeleton(mcfg)
    if model is None:
        return
    missing, names = unmatched(model, entries)
    if missing:
        vlm = family_of(model) is not None  # LoRA never adapts a VLM's tower: its language model's modules only
        of, its = (f"{mcfg.name}'s language model", "its language model's") if vlm else (mcfg.name, "its")
        raise ConfigError(f"LoRA target{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} "
                          f"match{'' if len(missing) > 1 else 'es'} no module of {of} "
                          f"({type(model).__name__}: {its} adaptable modules are {', '.join(names)})", where=where,
                          fix="name modules the model has, or leave target_modules unset (rlhfkit picks the "
                              "attention and MLP projections per architecture)")


def lora_by_default(cfg):
    """``cfg`` with LoRA on when rlhfkit's default for a vision-language model applies: the policy is a VLM, the run
    uses rlhfkit's defaults (TRL's interface keeps TRL's: every weight trained), and neither ``model.lora.enabled``
    nor ``model.train_vision`` was set. A VLM's language model is then adapted by LoRA (its tower frozen, the reference
    the adapter disabled): the usual way to post-train one, at a fraction of full fine-tuning's memory. Said in one
    line; ``model.lora.enabled=false`` trains every weight of the language model instead.
    Decided from the model's ``config.json`` before any weights load, when the run starts (a pipeline's later stage
    reads the directory its previous stage wrote)."""
    from ..config.parse import replace
    from ..errors import ModelError, say
    from .vision import FAMILIES, vlm_type

    mcfg = getattr(cfg, "model", None)
    if mcfg is None or not mcfg.name or getattr(mcfg, "lora", None) is None or mcfg.lora.enabled or mcfg.train_vision:
        return cfg
    origin = getattr(cfg, "_rlhfkit_origin", None)  # a config not built from settings: take it as it is
    if origin is None or origin.defaults != "rlhfkit" or "model.lora.enabled" in origin.given:
        return cfg
    try:
        kind = vlm_type(mcfg.name)
    except ModelError:  # a family rlhfkit does not cover: refused in one line where the model loads
        return cfg
    if kind is None:
        return cfg
    out = replace(cfg, model={"lora": {"enabled": True}})
    object.__setattr__(out, "_rlhfkit_origin", origin)
    say(f"[model] {FAMILIES[kind].name}: LoRA (r={mcfg.lora.r}) on the language model, rlhfkit's default for a "
        "vision-language model (model.lora.enabled=false trains all of its weights)")
    return out
