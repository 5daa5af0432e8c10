"""Config: overrides and their value types, validation with the key named (and a "did you mean"), the YAML files
in configs/ (each loads into its recipe and comments every key), dump_yaml round trips."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from rlhfkit.config import (
    RECIPES,
    build_config,
    dump_yaml,
    load_config,
    parse_override,
    read_yaml,
    save_config,
)
from rlhfkit.errors import ConfigError

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
KEY_LINE = re.compile(r"^\s*(?:-\s+)?[A-Za-z_][\w.]*\s*:")


# ───────────────────────────────────────────── validation ─────────────────────────────────────────────


def test_unknown_key_names_it_and_suggests_the_right_one():
    with pytest.raises(ConfigError) as e:
        build_config("sft", {}, ["optim.lrr=1"])
    msg = str(e.value)
    assert "unknown key 'optim.lrr'" in msg and "did you mean 'optim.lr'" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("override, suggestion", [
    ("outputdir=x", "output_dir"),
    ("model.lora.alhpa=8", "model.lora.alpha"),
    ("train.batchsize=8", "train.batch_size"),
])
def test_unknown_keys_at_every_level(override, suggestion):
    with pytest.raises(ConfigError, match=f"did you mean '{re.escape(suggestion)}'"):
        build_config("sft", {}, [override])


def test_unknown_key_in_a_file_names_the_file(tmp_path):
    p = tmp_path / "my.yaml"
    p.write_text("optim:\n  lr: 1e-4\n  warmup: 10\n")
    with pytest.raises(ConfigError) as e:
        load_config("sft", p, [])
    assert str(p) in str(e.value) and "optim.warmup" in str(e.value)
    assert "did you mean 'optim.warmup_steps'" in str(e.value) or "warmup_ratio" in str(e.value)


@pytest.mark.parametrize("override, key, expected", [
    ("train.batch_size=abc", "train.batch_size", "an integer"),
    ("train.batch_size=2.5", "train.batch_size", "an integer"),
    ("optim.lr=fast", "optim.lr", "a number"),
    ("model.lora.enabled=maybe", "model.lora.enabled", "true or false"),
    ("optim.betas=0.9", "optim.betas", "a list"),
    ("data.fields=question", "data.fields", "a mapping"),
    ("model=tiny", "model", "a mapping"),
    ("data.max_length=null", "data.max_length", "null"),
])
def test_wrong_type_names_key_and_expected_type(override, key, expected):
    with pytest.raises(ConfigError) as e:
        build_config("sft", {}, [override])
    assert f"'{key}'" in str(e.value) and expected in str(e.value)


def test_choice_fields_list_the_choices():
    with pytest.raises(ConfigError) as e:
        build_config("sft", {}, ["data.overflow=eror"])
    assert "truncate, drop, error" in str(e.value) and "did you mean 'error'" in str(e.value)


def test_unknown_recipe_suggests():
    with pytest.raises(ConfigError, match="did you mean 'grpo'"):
        build_config("gpro", {}, [])


def test_override_without_equals_sign():
    with pytest.raises(ConfigError, match="key.sub=value"):
        build_config("sft", {}, ["optim.lr"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("sft", tmp_path / "nope.yaml", [])
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: 1e-4\n   schedule: [cosine\n")
    with pytest.raises(ConfigError) as e:
        read_yaml(bad)
    assert re.search(rf"{re.escape(str(bad))}:\d+", str(e.value))


def test_file_of_another_recipe_is_refused(tmp_path):
    p = tmp_path / "rm.yaml"
    p.write_text("recipe: rm\n")
    with pytest.raises(ConfigError, match="recipe 'rm', not 'sft'"):
        load_config("sft", p, [])


# ───────────────────────────────────────────── values ─────────────────────────────────────────────


@pytest.mark.parametrize("text, value", [
    ("optim.lr=1e-5", 1e-5),
    ("optim.lr=1E-5", 1e-5),
    ("optim.lr=5.0e-3", 5e-3),
    ("optim.lr=3e2", 300.0),
    ("optim.lr=0.001", 0.001),
    ("optim.lr=2", 2.0),
])
def test_float_overrides_including_scientific_notation(text, value):
    cfg = build_config("sft", {}, [text])
    assert isinstance(cfg.optim.lr, float) and cfg.optim.lr == pytest.approx(value)


def test_scientific_notation_in_a_yaml_file(tmp_path):
    # YAML 1.1 reads 1e-5 (no dot) as a string; users mean a number
    p = tmp_path / "c.yaml"
    p.write_text("optim:\n  lr: 1e-5\n  eps: 1e-8\n")
    cfg = load_config("sft", p, [])
    assert cfg.optim.lr == pytest.approx(1e-5) and cfg.optim.eps == pytest.approx(1e-8)


@pytest.mark.parametrize("text, value", [
    ("model.lora.enabled=true", True), ("model.lora.enabled=True", True), ("model.lora.enabled=yes", True),
    ("model.lora.enabled=false", False), ("model.lora.enabled=no", False), ("model.lora.enabled='0'", False),
])
def test_bool_overrides(text, value):
    assert build_config("sft", {}, [text]).model.lora.enabled is value


def test_int_null_and_string_overrides():
    cfg = build_config("sft", {}, ["train.max_steps=5", "optim.max_grad_norm=null", "model.name=tiny:hidden=64",
                                   "train.epochs=3", "data.limit=100"])
    assert cfg.train.max_steps == 5 and isinstance(cfg.train.max_steps, int)
    assert cfg.optim.max_grad_norm is None
    assert cfg.model.name == "tiny:hidden=64"
    assert cfg.train.epochs == 3.0 and isinstance(cfg.train.epochs, float)
    assert cfg.data.limit == 100


def test_list_and_mapping_overrides():
    cfg = build_config("sft", {}, ["optim.betas=[0.8, 0.95]", "track.backends=[jsonl,tensorboard]",
                                   "model.lora.target_modules=[q_proj,v_proj]", "data.fields.messages=conversation",
                                   "data.fields.prompt=question"])
    assert cfg.optim.betas == [0.8, 0.95]
    assert cfg.track.backends == ["jsonl", "tensorboard"]
    assert cfg.model.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.data.fields == {"messages": "conversation", "prompt": "question"}


def test_list_of_sections_override():
    cfg = build_config("grpo", {}, ["reward.functions=[{fn: exact_match, weight: 2.0}]"])
    assert cfg.reward.functions[0].fn == "exact_match" and cfg.reward.functions[0].weight == 2.0


def test_dashed_override_keys():
    assert parse_override("--output-dir=runs/x") == (["output_dir"], "runs/x")
    assert parse_override("--optim.lr=1e-5") == (["optim", "lr"], 1e-5)


@pytest.mark.parametrize("recipe", ["sft", "rm", "grpo", "dpo", "pipeline"])
def test_output_dir_is_honoured(recipe, tmp_path):
    cfg = build_config(recipe, {}, [f"output_dir={tmp_path / 'my run'}"])
    assert cfg.output_dir == str(tmp_path / "my run")


def test_overrides_win_over_the_file_and_recipe_defaults(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("optim:\n  lr: 1.0e-4\n  schedule: cosine\noutput_dir: runs/a\n")
    cfg = load_config("grpo", p, ["optim.lr=2e-6", "output_dir=runs/b"])
    assert cfg.optim.lr == pytest.approx(2e-6) and cfg.optim.schedule == "cosine" and cfg.output_dir == "runs/b"
    assert cfg.algo.advantage == "grpo" and cfg.algo.num_generations == 4  # the recipe's own defaults


def test_config_is_frozen():
    cfg = build_config("sft", {}, [])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.optim.lr = 1.0  # type: ignore[misc]


# ───────────────────────────────────────────── dump / round trip ─────────────────────────────────────────────


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_dump_yaml_round_trips_defaults(recipe):
    cfg = build_config(recipe, {}, [])
    text = dump_yaml(cfg)
    assert build_config(recipe, yaml.safe_load(text), []) == cfg
    for line in text.splitlines():
        assert "#" in line, line  # every key has its help text


def test_dump_yaml_round_trips_non_defaults(tmp_path):
    tricky = {"output_dir": "runs/a: b #c", "model": {"chat_template": "{% for m in messages %}{{ m['content'] }}"
                                                                   "{% endfor %}"}}
    cfg = build_config("grpo", tricky, [
        "optim.lr=3e-7", "optim.eps=1e-10", "optim.betas=[0.8,0.9]", "data.fields.prompt=question",
        "reward.functions=[{fn: exact_match, weight: 0.5, kwargs: {field: answer, lowercase: true}}]",
        "model.lora.enabled=true", "model.lora.target_modules=[q_proj]", "reward.clip=null",
    ])
    assert cfg.output_dir == "runs/a: b #c"
    assert build_config("grpo", yaml.safe_load(dump_yaml(cfg)), []) == cfg
    save_config(cfg, tmp_path)
    assert load_config("grpo", tmp_path / "config.yaml", []) == cfg


# ───────────────────────────────────────────── configs/*.yaml ─────────────────────────────────────────────


def _recipe_of(path: Path) -> str:
    data = yaml.safe_load(path.read_text()) or {}
    recipe = data.get("recipe") or path.stem
    assert recipe in RECIPES, f"{path.name}: cannot tell its recipe (set `recipe:` to one of {sorted(RECIPES)})"
    return recipe


def test_there_are_config_files():
    assert {"sft.yaml", "rm.yaml"} <= {p.name for p in CONFIGS}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_file_loads_into_its_recipe(path):
    recipe = _recipe_of(path)
    cfg = load_config(recipe, path, [])
    assert isinstance(cfg, RECIPES[recipe].config)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_key_line_has_a_comment(path):
    missing = [f"{path.name}:{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
               if not line.lstrip().startswith("#") and KEY_LINE.match(line) and "#" not in line]
    assert not missing, "keys without a comment:\n" + "\n".join(missing)


def _key_paths(obj, prefix="") -> set[str]:
    out = set()
    for fl in dataclasses.fields(obj):
        value = getattr(obj, fl.name)
        path = f"{prefix}{fl.name}"
        out.add(path)
        if dataclasses.is_dataclass(value):
            out |= _key_paths(value, path + ".")
    return out


def _yaml_paths(tree: dict, prefix="") -> set[str]:
    out = set()
    for k, v in tree.items():
        out.add(f"{prefix}{k}")
        if isinstance(v, dict) and k not in ("fields", "kwargs"):
            out |= _yaml_paths(v, f"{prefix}{k}.")
    return out


@pytest.mark.parametrize("name", ["sft.yaml", "rm.yaml"])
def test_builtin_task_configs_are_complete(name):
    path = next(p for p in CONFIGS if p.name == name)
    recipe = _recipe_of(path)
    cfg = load_config(recipe, path, [])
    assert _yaml_paths(yaml.safe_load(path.read_text())) == _key_paths(cfg)


def test_builtin_task_config_values():
    sft = load_config("sft", next(p for p in CONFIGS if p.name == "sft.yaml"), [])
    assert (sft.data.train, sft.model.name, sft.optim.lr, sft.train.batch_size, sft.train.epochs,
            sft.data.max_length, sft.output_dir) == (
        "data/quickstart/sft.jsonl", "tiny:hidden=64,layers=2,intermediate=128", 5e-3, 32, 7.0, 64, "runs/sft")
    rm = load_config("rm", next(p for p in CONFIGS if p.name == "rm.yaml"), [])
    assert (rm.data.train, rm.data.eval, rm.model.name, rm.optim.lr, rm.train.batch_size, rm.train.epochs,
            rm.data.max_length, rm.output_dir) == ("data/quickstart/preference.jsonl",
                                                   "data/quickstart/eval_preference.jsonl", "runs/sft", 1e-3, 32,
                                                   2.0, 64, "runs/rm")


def test_overrides_never_leak_into_later_configs():
    # dotted overrides on keys the recipe defaults set must not write into the shared defaults
    build_config("dpo", {}, ["algo.reference=on_the_fly", "algo.loss=cdpo"])
    build_config("kto", {}, ["data.format=preference"])
    assert build_config("dpo").algo.reference == "precompute" and build_config("dpo").algo.loss == "dpo"
    assert build_config("kto").data.format == "unpaired"


def test_mixed_precision_no_survives_yaml_booleans():
    # YAML 1.1 reads a bare `no` as false; for a key whose choices include "no" that is what the user meant
    assert build_config("sft", {}, ["train.mixed_precision=no"]).train.mixed_precision == "no"
    assert build_config("sft", yaml.safe_load("train: {mixed_precision: no}")).train.mixed_precision == "no"
