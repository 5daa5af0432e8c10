"""GRPO on a tiny Qwen3-shaped and a tiny Gemma3-shaped model (``tiny:arch=qwen3`` / ``tiny:arch=gemma3``) with
``generation.engine=auto``: the run says in one line which engine and path generated (rlhfkit's decoder for the
family, never eager ``hf``), the engine's sampling log-probs equal the trainer's recomputed ones at every step, and
the final model is written (tests/unit/test_rollout_families.py compares the decoder with ``hf`` token for token)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfkit.config import load_config
from rlhfkit.train.online.synchronous import run_online

pytestmark = pytest.mark.slow

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(("arch", "cls"), [("qwen3", "Qwen3ForCausalLM"), ("gemma3", "Gemma3ForCausalLM")])
def test_grpo_on_the_family_runs_on_rlhfkits_decoder(arch, cls, task_data, tmp_path, capsys):
    out = tmp_path / arch
    cfg = load_config("grpo", CONFIGS / "grpo.yaml", [
        f"data.train={task_data / 'prompts.jsonl'}", f"data.eval={task_data / 'eval_prompts.jsonl'}",
        f"output_dir={out}", f"model.name=tiny:arch={arch},hidden=64,window=8", "generation.engine=auto",
        "algo.rollout_batch_size=4", "algo.num_generations=2", "algo.mini_batch_size=8", "train.batch_size=8",
        "algo.total_episodes=16", "generation.max_new_tokens=12", "data.max_length=64", "track.report=false",
        "track.sample_every=0", "train.save_every=0",
        # a random tiny model earns the same reward in every group: the entropy bonus gives each update a gradient
        "algo.entropy_coef=0.01"])
    run_online(cfg)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[rollout]")]
    assert f"[rollout] auto: static engine on cpu, rlhfkit's decoder for {cls}" in said
    assert not any("hf engine" in line or "with hf" in line for line in said)  # nothing fell back to hf
    from rlhfkit.track.metrics import read_run_metrics

    rows = [r for r in read_run_metrics(out) if "objective/scores" in r]  # rlhfkit's names (it writes TRL's)
    assert len(rows) == 2 and all(r["rollout/logprob_diff_max"] < 1e-4 for r in rows)
    assert (out / "model.safetensors").exists()
