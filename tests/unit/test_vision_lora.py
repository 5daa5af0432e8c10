"""LoRA on a vision-language model: on by default under rlhfkit's defaults (TRL's interface and an explicit setting
keep theirs), its targets always the language model's modules, named or matched by a regular expression, never the
vision tower's (whose blocks share names with the text stack's: LLaVA's CLIP tower has ``layers.N.self_attn.q_proj``,
Qwen2.5-VL's vision MLP ``gate_proj`` / ``up_proj`` / ``down_proj``); the tower trained with LoRA refused."""

from __future__ import annotations

import re

import pytest

from rlhfkit.config import build_config
from rlhfkit.config.schema import LoraConfig, ModelConfig
from rlhfkit.errors import ConfigError
from rlhfkit.models.loading import adaptable, load_causal_lm, lora_targets
from rlhfkit.models.lora import check_targets, lora_by_default
from rlhfkit.models.vision import language_model_name

VLM = "tiny:arch={arch},hidden=32,layers=2"


def _targets(arch: str, entries=None) -> tuple[list[str], list[str], str]:
    """(lora_targets' names, every adaptable module name, the language model's prefix) of a tiny VLM."""
    mcfg = ModelConfig(name=VLM.format(arch=arch), lora=LoraConfig(enabled=True, target_modules=entries))
    model, _ = load_causal_lm(mcfg, trainable=False)
    return lora_targets(model, mcfg), adaptable(model), language_model_name(model) + "."


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "llava", "idefics3"])
def test_default_targets_are_the_language_models_projections_only(arch):
    chosen, every, prefix = _targets(arch)
    tower_twins = [n for n in every if not n.startswith(prefix) and n.rsplit(".", 1)[-1] in
                   {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}]
    assert tower_twins, "the tiny tower must share a projection name with the text stack, or this proves nothing"
    assert chosen and all(n.startswith(prefix) for n in chosen)
    assert {n.rsplit(".", 1)[-1] for n in chosen} == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                       "up_proj", "down_proj"}
    assert len(chosen) == 2 * 7  # two layers, seven projections each


def test_a_regular_expression_target_reaches_the_language_model_only():
    pattern = r".*layers\.0\.self_attn\.(q|v)_proj"  # LLaVA's CLIP tower has model.vision_tower...layers.0.self_attn
    chosen, every, prefix = _targets("llava", [pattern])
    in_tower = [n for n in every if re.fullmatch(pattern, n) and not n.startswith(prefix)]
    assert in_tower, "the pattern must also match the tower's modules, or this proves nothing"
    assert sorted(chosen) == sorted(n for n in every if re.fullmatch(pattern, n) and n.startswith(prefix))
    assert len(chosen) == 2


def test_a_name_only_the_tower_has_is_refused_before_any_weights():
    mcfg = ModelConfig(name=VLM.format(arch="qwen2_5_vl"), lora=LoraConfig(enabled=True, target_modules=["qkv"]))
    with pytest.raises(ConfigError, match="no module of .*'s language model .*its language model's adaptable"):
        check_targets(mcfg)


def _cfg(arch: str, *overrides: str, recipe: str = "sft"):
    return build_config(recipe, {}, [f"model.name={VLM.format(arch=arch)}", "output_dir=/tmp/unused", *overrides])


def test_lora_is_on_by_default_for_a_vlm_and_said(capsys):
    cfg = lora_by_default(_cfg("qwen2_5_vl"))
    assert cfg.model.lora.enabled
    assert "LoRA (r=16) on the language model, rlhfkit's default for a vision-language model" in capsys.readouterr().out
    again = lora_by_default(cfg)  # resolved once: the origin kept, nothing said twice
    assert again.model.lora.enabled and capsys.readouterr().out == ""


@pytest.mark.parametrize("why, cfg", [
    ("set off by the user", lambda: _cfg("qwen2_5_vl", "model.lora.enabled=false")),
    ("the tower trained", lambda: _cfg("qwen2_5_vl", "model.train_vision=true")),
    ("a text model", lambda: build_config("sft", {}, ["model.name=tiny", "output_dir=/tmp/unused"])),
    ("TRL's interface (TRL: every weight trained)", lambda: _cfg("qwen2_5_vl", "defaults=trl")),
])
def test_lora_stays_off_where_the_default_does_not_apply(why, cfg, capsys):
    out = lora_by_default(cfg())
    assert not out.model.lora.enabled, why
    assert "rlhfkit's default for a vision-language model" not in capsys.readouterr().out


def test_the_tower_trained_with_lora_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="model.train_vision=true .* LoRA .* not built") as info:
        _cfg("qwen2_5_vl", "model.train_vision=true", "model.lora.enabled=true")
    assert info.value.where == "model.train_vision"
