"""The pipeline chains stages through their output directories, reports the gold metric, and skips finished
stages when started again; the shipped quickstart YAML is the built-in quickstart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlhfkit.config import build_config
from rlhfkit.pipeline import QUICKSTART, plan_stages, quickstart_config, run_pipeline

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_yaml_is_the_builtin_quickstart():
    shipped = build_config("pipeline", yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text()))
    assert shipped == build_config("pipeline", QUICKSTART)


def test_plan_chains_models_and_data(tmp_path):
    cfg = quickstart_config(str(tmp_path / "q"))
    (sft_name, _, sft), (_, _, rm), (_, _, ppo) = plan_stages(cfg)
    assert sft.model.name == cfg.base_model and sft.data.train.endswith("data/sft.jsonl")
    assert rm.model.name == sft.output_dir and rm.data.train.endswith("preference.jsonl")
    assert ppo.model.name == sft.output_dir and ppo.reward.model == rm.output_dir
    assert ppo.critic.init == "reward"


def test_a_stage_needing_a_file_the_task_does_not_write_is_refused_at_plan(tmp_path):
    """The calculator task writes SFT and prompt files only: a pipeline giving it an RM stage fails at plan time,
    before the first stage trains, naming the file; the stage's own data.train is accepted instead."""
    from rlhfkit.errors import ConfigError

    stages = [{"name": "sft", "recipe": "sft"}, {"name": "rm", "recipe": "rm"}]
    cfg = build_config("pipeline", {"output_dir": str(tmp_path / "p"), "task": "calculator", "stages": stages,
                                    "base_model": "tiny"})
    with pytest.raises(ConfigError, match="writes no preference.jsonl for the rm stage"):
        plan_stages(cfg)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "What is 1 + 1?", "chosen": "2", "rejected": "3"}\n')
    stages[1]["config"] = {"data": {"train": str(pairs), "eval": None}}
    cfg = build_config("pipeline", {"output_dir": str(tmp_path / "p"), "task": "calculator", "stages": stages,
                                    "base_model": "tiny"})
    assert plan_stages(cfg)[1][2].data.train == str(pairs)


@pytest.mark.cluster  # one of the longest checks (~10 s): make test-cluster, which CI runs
def test_small_pipeline_runs_reports_and_skips_finished_stages(tmp_path, capsys):
    tree = {
        "output_dir": str(tmp_path / "pipe"), "task": "quickstart", "task_size": 256, "eval_prompts": 32,
        "base_model": "tiny:hidden=32,layers=1,intermediate=64",
        "stages": [
            {"name": "sft", "recipe": "sft", "config": {"train": {"batch_size": 16, "max_steps": 8},
                                                        "optim": {"lr": 5e-3}, "data": {"max_length": 64}}},
            {"name": "rm", "recipe": "rm", "config": {"train": {"batch_size": 16, "max_steps": 4},
                                                      "data": {"max_length": 64}}},
            {"name": "ppo", "recipe": "ppo", "config": {
                "algo": {"rollout_batch_size": 8, "mini_batch_size": 8, "total_episodes": 16},
                "train": {"batch_size": 8}, "generation": {"max_new_tokens": 8}, "data": {"max_length": 64}}},
        ],
    }
    cfg = build_config("pipeline", tree)
    summary = run_pipeline(cfg)
    out = Path(cfg.output_dir)
    for stage in ("sft", "rm", "ppo"):
        assert (out / stage / "model.safetensors").is_file()
    assert set(summary["gold"]) == {"untrained", "sft", "ppo"}
    html = (out / "report.html").read_text()
    assert "untrained" in html and "ppo" in html
    assert "Same prompts, every stage" in html and "<table class='stages'>" in html  # side by side
    assert json.loads((out / "summary.json").read_text())["stages"]["rm"]["recipe"] == "rm"
    mtime = (out / "sft" / "model.safetensors").stat().st_mtime
    capsys.readouterr()
    run_pipeline(cfg)
    assert "already done" in capsys.readouterr().out
    assert (out / "sft" / "model.safetensors").stat().st_mtime == mtime
