"""End-to-end proof that each policy loss of issues 19 and 34 learns on the tiny model: CISPO, SAPO, GMPO, DPPO, VESPO
and LUSPO each raise the built-in task's gold metric in the run the GSPO test uses
(tests/e2e/test_online_variants.py::test_gspo_raises_gold: GRPO advantages, the same budget and threshold), with its
paper's settings. Same task and reward as
tests/e2e/test_online.py: the SFT policy shouts about 40 % of the time; the exact-match reward prefers shouting."""

from __future__ import annotations

import pytest
from test_online_variants import overrides  # tests/e2e is on sys.path (pytest prepend mode, no __init__)

from rlhfkit.config import build_config
from rlhfkit.train.online.synchronous import run_online


@pytest.mark.slow
@pytest.mark.parametrize("loss, settings", [
    ("cispo", ["algo.loss_aggregation=token_mean"]),  # the paper's: no lower bound, cap 1 + 4; token mean
    ("sapo", ["algo.loss_aggregation=seq_mean_token_mean"]),  # the paper's: tau_pos 1, tau_neg 1.05; sequence mean
    ("gmpo", ["algo.loss_aggregation=seq_mean_token_mean"]),  # the paper's: range (e^-0.4, e^0.4); sequence mean
    ("dppo", ["algo.loss_aggregation=token_mean"]),  # the paper's Binary-TV, delta 0.2; token mean
    ("vespo", ["algo.loss_aggregation=token_mean"]),  # TRL's kernel (2, 3) / (3, 2); token mean
    ("luspo", ["algo.loss_aggregation=seq_mean_token_mean", "algo.luspo.clip_low=3e-3",  # GSPO's test range, as
               "algo.luspo.clip_high=4e-3"]),  # test_gspo_raises_gold widens the paper's for 4 updates a rollout
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


@pytest.mark.slow
def test_icepop_learns_under_a_real_rollout_mismatch(task_data, sft_dir, gold_of, tmp_path):
    """IcePop (issue 34) in GRPO with a real rollout / trainer gap: nucleus sampling (top_p 0.8) reports each token's
    log-prob under the truncated distribution, so rho = pi_old / pi_rollout is the nucleus's mass (< 1). Its band
    low 0.95 masks the tokens drawn from a nucleus of less mass; the run still raises the gold metric as the other
    variants do. algo.off_policy.low = the same 0.95, so rollout/is_ratio_outside_frac counts what icepop masked."""
    from test_online_variants import metrics_of

    out = tmp_path / "icepop"
    cfg = build_config("grpo", {}, overrides(
        task_data, sft_dir, out, "algo.off_policy.correction=icepop", "algo.off_policy.icepop.low=0.95",
        "algo.off_policy.low=0.95", "generation.top_p=0.8", "algo.rollout_batch_size=8", "algo.num_generations=4",
        "algo.mini_batch_size=16", "train.batch_size=16", "algo.total_episodes=1024"))
    run_online(cfg)
    masked = [m["rollout/is_ratio_outside_frac"] for m in metrics_of(out) if "rollout/is_ratio_outside_frac" in m]
    weights = [m["rollout/is_weight_mean"] for m in metrics_of(out) if "rollout/is_weight_mean" in m]
    sft, new = gold_of(sft_dir), gold_of(out)
    print(f"[icepop] gold {sft:.3f} (sft) -> {new:.3f}; masked {sum(masked) / len(masked):.3f} of tokens a step")
    assert any(f > 0 for f in masked) and all(f < 1 for f in masked) and all(w < 1 for w in weights)
    assert new > sft + 0.15, ("icepop", sft, new)


@pytest.mark.slow
def test_high_entropy_tokens_alone_raise_gold(task_data, sft_dir, gold_of, tmp_path):
    """algo.top_entropy_quantile=0.2 (Wang et al. 2025; TRL's top_entropy_quantile): the policy loss on each
    micro-batch's 20% most uncertain tokens only still raises the gold metric in the same run, and the logged share of
    tokens that learned is about the fifth asked for (ties at the threshold may add a few)."""
    from test_online_variants import metrics_of

    out = tmp_path / "top_entropy"
    cfg = build_config("grpo", {}, overrides(
        task_data, sft_dir, out, "algo.top_entropy_quantile=0.2", "algo.rollout_batch_size=8",
        "algo.num_generations=4", "algo.mini_batch_size=16", "train.batch_size=16", "algo.total_episodes=1024"))
    run_online(cfg)
    share = [m["policy/high_entropy_frac"] for m in metrics_of(out) if "policy/high_entropy_frac" in m]
    sft, new = gold_of(sft_dir), gold_of(out)
    print(f"[top_entropy_quantile=0.2] gold {sft:.3f} (sft) -> {new:.3f}; share {min(share):.3f}-{max(share):.3f}")
    assert share and all(0.15 <= s <= 0.35 for s in share)
    assert new > sft + 0.15, ("top_entropy_quantile", sft, new)
