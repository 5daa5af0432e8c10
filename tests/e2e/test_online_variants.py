"""End-to-end runs of the online variants of issue 11 on the tiny model: GSPO, DAPO (dynamic sampling, overlong
shaping), off-policy correction, and the multi-turn calculator environment. Same task and reward as
tests/e2e/test_online.py: the SFT policy shouts about 40 % of the time; the exact-match reward prefers shouting."""

from __future__ import annotations

import json

import pytest

from rlhfkit.config import build_config
from rlhfkit.train.online import run_online

REWARD_FN = "reward.functions=[{fn: 'rlhfkit.tasks.quickstart:reward'}]"


def overrides(task_data, sft_dir, out, *extra) -> list[str]:
    return [f"data.train={task_data / 'prompts.jsonl'}", f"data.eval={task_data / 'eval_prompts.jsonl'}",
            f"output_dir={out}", f"model.name={sft_dir}", "optim.lr=1e-4", "train.batch_size=32",
            "generation.max_new_tokens=12", "track.report=false", "data.max_length=64", "track.sample_every=0",
            "train.resume=never", REWARD_FN, *extra]


def metrics_of(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_gspo_raises_gold(task_data, sft_dir, gold_of, tmp_path):
    """GSPO-token equals GSPO in value and gradient for group advantages (unit test), so only GSPO runs here."""
    loss = "gspo"
    out = tmp_path / loss
    cfg = build_config("grpo", {}, overrides(
        task_data, sft_dir, out, f"algo.policy_loss={loss}", "algo.clip_low=3e-3", "algo.clip_high=4e-3",
        "algo.rollout_batch_size=8", "algo.num_generations=4", "algo.mini_batch_size=16", "train.batch_size=16",
        "algo.total_episodes=1024"))
    run_online(cfg)
    sft, new = gold_of(sft_dir), gold_of(out)
    assert new > sft + 0.15, (loss, sft, new)
