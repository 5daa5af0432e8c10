"""Off-policy corrections (none / TIS / MIS, token and sequence level; IcePop) and the mismatch metrics: hand values, a
slow loop, TIS at equal log-probs is exactly the plain loss, IcePop against MIS, and the registry / config wiring."""

import math

import pytest
import torch

from rlhfkit.algos import OFF_POLICY_CORRECTIONS, POLICY_LOSSES, importance_log_ratio, mismatch_stats

LN2 = math.log(2.0)


def _case():
    # row 0: log rho = [ln 2, -ln 2, ln 4(pad)] on mask [1, 1, 0]; row 1: log rho = [ln 3, pad, pad]
    old = torch.tensor([[LN2, -LN2, 2 * LN2], [math.log(3.0), 5.0, 5.0]])
    rollout = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    return old, rollout, mask


def test_registry_and_none():
    assert set(OFF_POLICY_CORRECTIONS) == {"none", "tis", "mis", "icepop"}
    old, rollout, mask = _case()
    w, m = OFF_POLICY_CORRECTIONS["none"](old, rollout, mask)
    assert w is None and torch.equal(m, mask)  # None: every policy loss reads it as weight 1


def test_tis_token_and_sequence_hand_values():
    old, rollout, mask = _case()
    # token: rho = [2, 0.5, -], [3, -, -]; cap 2.5 -> [2, 0.5, 1(e^0 off mask)], [2.5, 1, 1]
    w, m = OFF_POLICY_CORRECTIONS["tis"](old, rollout, mask, cap=2.5, level="token")
    torch.testing.assert_close(w * mask, torch.tensor([[2.0, 0.5, 0.0], [2.5, 0.0, 0.0]]))
    assert torch.equal(m, mask)
    # sequence: row 0 rho = 2 * 0.5 = 1, row 1 rho = 3 -> capped at 2.5
    w, _ = OFF_POLICY_CORRECTIONS["tis"](old, rollout, mask, cap=2.5, level="sequence")
    torch.testing.assert_close(w * mask, torch.tensor([[1.0, 1.0, 0.0], [2.5, 0.0, 0.0]]))


def test_mis_token_and_sequence_hand_values():
    old, rollout, mask = _case()
    # token band [0.6, 2.5]: 2 in, 0.5 out, 3 out -> weights [2, 0, 0], [0, 0, 0]; mask [1, 0, 0], [0, 0, 0]
    w, m = OFF_POLICY_CORRECTIONS["mis"](old, rollout, mask, low=0.6, high=2.5, level="token")
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    assert m.tolist() == [[1, 0, 0], [0, 0, 0]]
    # sequence: row 0 rho 1 (kept whole, weight 1), row 1 rho 3 (dropped whole)
    w, m = OFF_POLICY_CORRECTIONS["mis"](old, rollout, mask, low=0.6, high=2.5, level="sequence")
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert m.tolist() == [[1, 1, 0], [0, 0, 0]]


def test_sequence_log_ratio_matches_slow_loop():
    g = torch.Generator().manual_seed(0)
    old, roll = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    mask = (torch.arange(6) < torch.tensor([[6], [2], [0], [4]])).long()
    got = importance_log_ratio(old, roll, mask, "sequence")
    for i in range(4):
        total = sum(float(old[i, t] - roll[i, t]) for t in range(6) if mask[i, t])
        for t in range(6):
            assert got[i, t].item() == pytest.approx(total if mask[i, t] else 0.0, abs=1e-5)


@pytest.mark.parametrize("loss_name", ["ppo", "gspo", "gspo_token"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_tis_with_equal_logprobs_is_exactly_the_plain_loss(loss_name, level):
    g = torch.Generator().manual_seed(1)
    logp = (-torch.rand(3, 5, generator=g)).requires_grad_(True)
    old = logp.detach() + 0.1 * torch.randn(3, 5, generator=g)
    adv, mask = torch.randn(3, generator=g), torch.tensor([[1, 1, 1, 0, 0], [1] * 5, [1, 0, 0, 0, 0]])
    spec = POLICY_LOSSES[loss_name]
    plain, _ = spec(logp, old, adv, mask, {"clip_low": 0.2})
    (g_plain,) = torch.autograd.grad(plain, logp)
    for corr in ("tis", "mis", "icepop"):
        w, m = OFF_POLICY_CORRECTIONS[corr](old, old.clone(), mask, **({} if corr == "icepop" else {"level": level}))
        corrected, _ = spec(logp, old, adv, m, {"clip_low": 0.2}, weights=w)
        (g_corr,) = torch.autograd.grad(corrected, logp)
        assert torch.equal(corrected, plain), corr
        assert torch.equal(g_corr, g_plain), corr


def test_tis_weights_scale_the_gradient_per_token():
    # two tokens, plain PPO term -A r at r = 1 (old == logp): d/dlogp = -A * w / 2 (token mean over 2 tokens)
    logp = torch.zeros(1, 2, requires_grad=True)
    rollout = torch.tensor([[0.0, math.log(4.0)]])  # rho = [1, 0.25]
    w, m = OFF_POLICY_CORRECTIONS["tis"](torch.zeros(1, 2), -rollout, torch.ones(1, 2), cap=2.0)
    # old - rollout = [0, ln 4] -> rho [1, 4] -> capped [1, 2]
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0]]))
    loss, _ = POLICY_LOSSES["ppo"](logp, torch.zeros(1, 2), torch.tensor([1.0]), m, weights=w)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, -1.0]]))


def test_mismatch_stats_hand_values_and_tail():
    # 100 tokens: 98 with diff 0, one with log rho = ln 3, one with -ln 4
    old = torch.zeros(1, 101)
    old[0, 0], old[0, 1] = math.log(3.0), -math.log(4.0)
    mask = torch.ones(1, 101)
    mask[0, 100] = 0
    old[0, 100] = 50.0  # masked: must not count
    st = mismatch_stats(old, torch.zeros(1, 101), mask, low=0.5, high=2.0)
    assert st["logprob_diff_max"].item() == pytest.approx(math.log(4.0))
    assert st["logprob_diff_mean"].item() == pytest.approx((math.log(3.0) + math.log(4.0)) / 100)
    assert st["is_ratio_outside_frac"].item() == pytest.approx(2 / 100)
    ratios = torch.sort(torch.tensor([3.0, 0.25] + [1.0] * 98)).values
    # position 0.99 x 99 = 98.01 between 1.0 and 3.0: 1.02 (torch.quantile's float32 position gives 1.0200043)
    assert st["is_ratio_p99"].item() == pytest.approx(1.02)
    assert st["is_ratio_p99"].item() == pytest.approx(torch.quantile(ratios, 0.99).item(), rel=1e-5)
    assert st["is_ratio_p99"].item() > 1.0  # the tail shows where the mean (about 1.02) hides it
    empty = mismatch_stats(old, old, torch.zeros(1, 101))
    assert empty["logprob_diff_max"].item() == 0.0 and empty["is_ratio_p99"].item() == 1.0


def test_mismatch_stats_past_torch_quantiles_size_limit():
    """A step of more than 2^24 tokens (every process's, gathered): torch.quantile refused it; the p99 is taken."""
    n = 2**24 + 5
    old = torch.zeros(1, n)
    old[0, :1000] = math.log(2.0)  # the top 1000 tokens: rho 2, far inside the top 1 %
    st = mismatch_stats(old, torch.zeros(1, n), torch.ones(1, n, dtype=torch.bool))
    assert st["is_ratio_p99"].item() == 1.0 and st["logprob_diff_max"].item() == pytest.approx(math.log(2.0))


def test_config_off_policy_choices_and_bounds():
    from rlhfkit.config import build_config
    from rlhfkit.errors import ConfigError

    cfg = build_config("grpo", {}, ["algo.off_policy.correction=mis", "algo.off_policy.level=sequence"])
    assert cfg.algo.off_policy.correction == "mis"
    with pytest.raises(ConfigError, match="tis"):
        build_config("grpo", {}, ["algo.off_policy.correction=tsi"])
    with pytest.raises(ConfigError, match="algo.off_policy.low"):
        build_config("grpo", {}, ["algo.off_policy.low=1.5"])


# ───────────────────────────────────────────────────── IcePop ─────────────────────────────────────────────────────
def test_icepop_hand_values_keep_the_mask():
    old, rollout, mask = _case()
    # rho = [2, 0.5, -], [3, -, -]; band [0.6, 2.5]: weights [2, 0, 0], [0, 0, 0]; the mask is unchanged (mis drops)
    w, m = OFF_POLICY_CORRECTIONS["icepop"](old, rollout, mask, low=0.6, high=2.5)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(m, mask)
    # the paper's band [0.5, 5] by default: every ratio here is inside (ends included)
    w, m = OFF_POLICY_CORRECTIONS["icepop"](old, rollout, mask)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 0.0], [3.0, 0.0, 0.0]]))
    # NaN / inf in the padding of either log-prob reaches no weight
    old_nan = torch.where(mask.bool(), old, torch.tensor(math.nan))
    w, _ = OFF_POLICY_CORRECTIONS["icepop"](old_nan, torch.where(mask.bool(), rollout, torch.tensor(math.inf)), mask)
    assert torch.isfinite(w).all() and torch.all(w[~mask.bool()] == 0)


def test_icepop_matches_slow_loop():
    g = torch.Generator().manual_seed(3)
    old, roll = -torch.rand(4, 6, generator=g), -torch.rand(4, 6, generator=g) * 3
    mask = (torch.arange(6) < torch.tensor([[6], [2], [0], [4]])).long()
    w, m = OFF_POLICY_CORRECTIONS["icepop"](old, roll, mask, low=0.5, high=5.0)
    for i in range(4):
        for t in range(6):
            rho = math.exp(float(old[i, t] - roll[i, t]))
            want = rho if mask[i, t] and 0.5 <= rho <= 5.0 else 0.0
            assert w[i, t].item() == pytest.approx(want, rel=1e-6)
    assert torch.equal(m, mask) and 0 < int((w == 0).sum() - (mask == 0).sum()) < int(mask.sum())


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_icepop_removes_the_token_gradient_but_keeps_it_in_the_normalisation(aggregation):
    # two tokens at r = 1 (old == logp), A = 1, PPO's -A r; token 1 out of band (rho = 8): icepop gives it weight 0
    # but leaves it in the mean: d/dlogp = [-1 / 2, 0] (token mean over 2); mis drops it from the mask: [-1, 0]
    logp = torch.zeros(1, 2, requires_grad=True)
    old, rollout = torch.zeros(1, 2), torch.tensor([[0.0, -math.log(8.0)]])
    grads = {}
    for corr in ("icepop", "mis"):
        w, m = OFF_POLICY_CORRECTIONS[corr](old, rollout, torch.ones(1, 2), low=0.5, high=5.0)
        loss, _ = POLICY_LOSSES["ppo"](logp, old, torch.tensor([1.0]), m, aggregation=aggregation, weights=w * m)
        (grads[corr],) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grads["icepop"], torch.tensor([[-0.5, 0.0]]))
    torch.testing.assert_close(grads["mis"], torch.tensor([[-1.0, 0.0]]))


def test_the_registry_reads_each_correction_s_settings_from_its_section():
    from rlhfkit.config import build_config

    old, rollout, mask = _case()  # rho = [2, 0.5], [3]
    cfg = build_config("grpo", {}, ["algo.off_policy.correction=icepop", "algo.off_policy.icepop.high=2.5",
                                    "algo.off_policy.high=10"])
    op = cfg.algo.off_policy
    assert (op.icepop.low, op.icepop.high) == (0.5, 2.5)
    # icepop reads algo.off_policy.icepop (band [0.5, 2.5]: 3 is out), not the shared low / high of mis
    w, _ = OFF_POLICY_CORRECTIONS["icepop"](old, rollout, mask, op)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 0.0], [0.0, 0.0, 0.0]]))
    # mis reads the shared fields (high 10: 3 is in)
    w, m = OFF_POLICY_CORRECTIONS["mis"](old, rollout, mask, op)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 0.0], [3.0, 0.0, 0.0]]))
    assert OFF_POLICY_CORRECTIONS["icepop"].section == "icepop" and OFF_POLICY_CORRECTIONS["tis"].section is None
    # an explicit keyword wins over the section
    w, _ = OFF_POLICY_CORRECTIONS["icepop"](old, rollout, mask, op, high=5.0)
    assert w[1, 0].item() == pytest.approx(3.0)


def test_icepop_settings_never_block_a_resume_of_another_correction(tmp_path):
    from rlhfkit.config import build_config
    from rlhfkit.train.lifecycle.checkpoint import fingerprint_diff, run_fingerprint

    base = run_fingerprint(build_config("grpo", {}, [f"output_dir={tmp_path}"]))
    assert not any(k.startswith("algo.off_policy.icepop.") for k in base)  # a run before icepop existed matches
    other = run_fingerprint(build_config("grpo", {}, [f"output_dir={tmp_path}", "algo.off_policy.icepop.high=3.5"]))
    assert fingerprint_diff(base, other) == []
    used = run_fingerprint(build_config("grpo", {}, [f"output_dir={tmp_path}", "algo.off_policy.correction=icepop"]))
    assert used["algo.off_policy.icepop.high"] == 5.0
    changed = run_fingerprint(build_config("grpo", {}, [f"output_dir={tmp_path}", "algo.off_policy.correction=icepop",
                                                        "algo.off_policy.icepop.high=3.5"]))
    assert fingerprint_diff(used, changed) == ["algo.off_policy.icepop.high: 5.0 -> 3.5"]


def test_config_icepop_bounds():
    from rlhfkit.config import build_config
    from rlhfkit.errors import ConfigError

    with pytest.raises(ConfigError, match="algo.off_policy.icepop.low"):
        build_config("grpo", {}, ["algo.off_policy.correction=icepop", "algo.off_policy.icepop.low=2"])
    with pytest.raises(ConfigError, match="algo.off_policy.icepop.high"):
        build_config("grpo", {}, ["algo.off_policy.icepop.high=0.5"])
