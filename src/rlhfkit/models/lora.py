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
    adaptable,
    is_pattern,
    is_tiny,
    load_tokenizer_for,
    matches_target,
    resolve_source,
    tiny_model_config,
)


def unmatched(model: torch.nn.Module, entries: list[str]) -> tuple[list[str], list[str]]:
    """(the entries that match none of ``model``'s adaptable modules, those modules' distinct last names)."""
    names = adaptable(model)
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
        raise ConfigError(f"LoRA target{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} "
                          f"match{'' if len(missing) > 1 else 'es'} no module of {mcfg.name} "
                          f"({type(model).__name__}: its adaptable modules are {', '.join(names)})", where=where,
                          fix="name modules the model has, or leave target_modules unset (rlhfkit picks the "
                              "attention and MLP projections per architecture)")
