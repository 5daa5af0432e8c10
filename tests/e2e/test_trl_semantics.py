"""A TRL user's GRPO run on the command line: TRL's names and defaults=trl print the step's geometry and what still
differs from TRL before any weights load, and the run has TRL's geometry (one update per step of
per_device_train_batch_size samples) and length (max_steps optimizer updates)."""

from __future__ import annotations

import json
from pathlib import Path

from rlhfkit.cli import main

FN = f"{Path(__file__).parents[1] / 'unit' / 'reward_fns_for_tests.py'}:pays_for_target_length"
REWARD = f"reward_funcs=[{FN}]"  # lengths differ between a random model's samples: no group ties
TINY = "tiny:hidden=64,layers=2,intermediate=128"  # the policy's weights do not matter here: the step's shape does


def _steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_trl_names_and_defaults_run_trls_step(task_data, tmp_path, capsys):
    out = tmp_path / "grpo-trl"
    argv = ["grpo", "defaults=trl", f"model_name_or_path={TINY}", f"data.train={task_data / 'prompts.jsonl'}",
            f"output_dir={out}", REWARD, "per_device_train_batch_size=8", "num_generations=4", "max_steps=3",
            "max_completion_length=12", "learning_rate=1e-4", "data.max_length=64", "track.report=false",
            "track.sample_every=0"]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "[grpo] step: 2 prompts x 4 generations = 8 samples (1 process) -> 1 update of 8 samples" in said
    assert "[grpo] run: 3 steps = 3 updates, from train.max_steps=3 updates" in said
    flat = said.replace("\n    ", " ")
    assert "set otherwise than TRL 1.16's GRPOConfig defaults" in flat
    assert "algo.num_generations=4 [num_generations=8]" in flat and "optim.lr=0.0001 [learning_rate=1e-6]" in flat
    assert said.index("[grpo] step:") < said.index("[grpo] policy")  # before any weights load
    assert _steps(out) == [1, 2, 3]


def test_max_steps_counts_updates_in_rlhfkits_geometry(task_data, tmp_path, capsys):
    out = tmp_path / "grpo"
    argv = ["grpo", f"model.name={TINY}", f"data.train={task_data / 'prompts.jsonl'}", f"output_dir={out}",
            f"reward.functions=[{{fn: '{FN}'}}]", "algo.rollout_batch_size=2",
            "algo.mini_batch_size=4", "train.batch_size=4", "max_steps=3", "generation.max_new_tokens=8",
            "data.max_length=64", "track.report=false", "track.sample_every=0", "data.eval_fraction=0"]
    assert main(argv) == 0  # 2 prompts x 4 = 8 samples: 2 updates of 4, 2 epochs -> 4 updates a step
    assert "[grpo] run: 1 step = 4 updates, from train.max_steps=3 updates" in capsys.readouterr().out
    assert _steps(out) == [4]
