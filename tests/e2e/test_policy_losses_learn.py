"""End-to-end proof that each policy loss of issue 19 learns on the tiny model: CISPO, SAPO and GMPO each raise the
built-in task's gold metric in the run the GSPO test uses (tests/e2e/test_online_variants.py::test_gspo_raises_gold:
GRPO advantages, the same budget and threshold), with its paper's settings. Same task and reward as
tests/e2e/test_online.py: the SFT policy shouts about 40 % of the time; the exact-match reward prefers shouting."""

from __future__ import annotations

import pytest
from test_online_variants import overrides  # tests/e2e is on sys.path (pytest prepend mode, no __init__)

from rlhfkit.config import build_config
from rlhfkit.train.online import run_online


@pytest.mark.slow
@pytest.mark.parametrize("loss, settings", [
    ("cispo", ["algo.loss_aggregation=token_mean"]),  # the paper's: no lower bound, cap 1 + 4; token mean
    ("sapo", ["algo.loss_aggregation=seq_mean_token_mean"]),  # the paper's: tau_pos 1, tau_neg 1.05; sequence mean
    ("gmpo", ["algo.loss_aggregation=seq_mean_token_mean"]),  # the paper's: range (e^-0.4, e^0.4); sequence mean
])
def test_policy_loss_raises_gold(loss, settings, task_data, sft_dir, gold_of, tmp_path):
    out = tmp_path / loss
    cfg = build_config("grpo", {}, overrides(
        task_data, sft_dir, out, f"algo.policy_loss={loss}", *settings, "algo.rollout_batch_size=8",
        "algo.num_generations=4", "algo.mini_batch_size=16", "train.batch_size=16", "algo.total_episodes=1024"))
    run_online(cfg)
    sft, new = gold_of(sft_dir), gold_of(out)
    print(f"[{loss}] gold {sft:.3f} (sft) -> {new:.3f}")
    assert new > sft + 0.15, (loss, sft, new)
