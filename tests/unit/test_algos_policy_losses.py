"""Policy losses: PPO clip (hand values, asymmetric clip, masks, weights), GSPO and GSPO-token against hand values, a
slow per-sequence loop and gradients; the registry (its entries pass their config section's fields as keywords) and
its config wiring."""

import dataclasses
import inspect
import math

import pytest
import torch

from rlhfkit.algos import (
    POLICY_LOSSES,
    gspo_loss,
    gspo_token_loss,
    ppo_policy_loss,
    sequence_log_ratio,
    token_stats_from_logits,
)

E = math.e


def _stats_are_detached(stats):
    return all(isinstance(v, torch.Tensor) and not v.requires_grad and v.dim() == 0 for v in stats.values())


# ------------------------------------------------------------------ PPO policy loss
def _ppo(log_ratio, adv, **kw):
    logp = torch.tensor([[log_ratio] * 3])
    return ppo_policy_loss(logp, torch.zeros(1, 3), torch.full((1, 3), adv), torch.ones(1, 3), **kw)


def test_ppo_clip_positive_advantage_above_range():
    # ratio = e (> 1.2), A = 1: unclipped -e, clipped -1.2 -> max is -1.2 (clipped chosen, no gradient)
    loss, stats = _ppo(1.0, 1.0)
    assert loss.item() == pytest.approx(-1.2)
    assert stats["clipfrac"].item() == 1.0
    # approxkl = 0.5 * mean(1^2) = 0.5; ratio_mean = e, ratio_var = 0
    assert stats["approxkl"].item() == pytest.approx(0.5)
    assert stats["ratio_mean"].item() == pytest.approx(E)
    assert stats["ratio_var"].item() == pytest.approx(0.0, abs=1e-6)
    assert _stats_are_detached(stats)


def test_ppo_clip_negative_advantage_above_range():
    # ratio = e, A = -1: unclipped e, clipped 1.2 -> max is e (pessimistic, unclipped)
    loss, stats = _ppo(1.0, -1.0)
    assert loss.item() == pytest.approx(E)
    assert stats["clipfrac"].item() == 0.0


def test_ppo_clip_below_range():
    # ratio = e^-1 = 0.3679 (< 0.8), A = 1: unclipped -0.3679, clipped -0.8 -> max -0.3679, not clipped
    loss, stats = _ppo(-1.0, 1.0)
    assert loss.item() == pytest.approx(-math.exp(-1))
    assert stats["clipfrac"].item() == 0.0
    # A = -1: unclipped 0.3679, clipped 0.8 -> 0.8, clipped
    loss, stats = _ppo(-1.0, -1.0)
    assert loss.item() == pytest.approx(0.8)
    assert stats["clipfrac"].item() == 1.0


def test_ppo_inside_range_and_gradient():
    # ratio = e^0.1 = 1.105 inside [0.8, 1.2], A = 2: loss = -2 * 1.105; d/dlogp = -A * ratio
    logp = torch.full((1, 3), 0.1, requires_grad=True)
    loss, stats = ppo_policy_loss(logp, torch.zeros(1, 3), torch.full((1, 3), 2.0), torch.ones(1, 3))
    assert loss.item() == pytest.approx(-2 * math.exp(0.1))
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.full((1, 3), -2 * math.exp(0.1) / 3))
    # clipped case: no gradient
    logp2 = torch.full((1, 3), 1.0, requires_grad=True)
    ppo_policy_loss(logp2, torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3))[0].backward()
    assert torch.all(logp2.grad == 0)


def test_ppo_asymmetric_clip():
    # ratio = e^0.2 = 1.2214, A = 1. Symmetric 0.2: clipped to 1.2 -> -1.2.
    # clip_high = 0.28 (DAPO clip-higher): 1.2214 < 1.28, not clipped -> -1.2214
    assert _ppo(0.2, 1.0)[0].item() == pytest.approx(-1.2)
    loss, stats = _ppo(0.2, 1.0, clip_high=0.28)
    assert loss.item() == pytest.approx(-math.exp(0.2))
    assert stats["clipfrac"].item() == 0.0
    # the low side still uses clip_low = 0.2: ratio e^-1, A = -1 -> 0.8
    assert _ppo(-1.0, -1.0, clip_high=0.28)[0].item() == pytest.approx(0.8)
    # clip_low = 0.1: ratio e^-1, A = -1 -> 0.9
    assert _ppo(-1.0, -1.0, clip_low=0.1, clip_high=0.28)[0].item() == pytest.approx(0.9)


def test_ppo_mixed_tokens_mask_and_broadcast():
    # row 0: ratios [e, 1, e^-1], A = 1 -> [-1.2, -1, -e^-1]; row 1: ratio 1 first token only, A = -2 -> [2]
    logp = torch.tensor([[1.0, 0.0, -1.0], [0.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv = torch.tensor([1.0, -2.0])  # [B]: one advantage per sequence
    loss, stats = ppo_policy_loss(logp, torch.zeros(2, 3), adv, mask)
    # token mean: (-1.2 - 1 - e^-1 + 2) / 4
    assert loss.item() == pytest.approx((-1.2 - 1 - math.exp(-1) + 2) / 4)
    assert stats["clipfrac"].item() == pytest.approx(1 / 4)
    # approxkl = 0.5 * (1 + 0 + 1 + 0) / 4 = 0.25
    assert stats["approxkl"].item() == pytest.approx(0.25)
    full, _ = ppo_policy_loss(logp, torch.zeros(2, 3), adv[:, None].expand(2, 3), mask)
    assert full.item() == pytest.approx(loss.item())
    # seq_mean_token_mean: mean((-1.2 - 1 - e^-1) / 3, 2)
    seq, _ = ppo_policy_loss(logp, torch.zeros(2, 3), adv, mask, aggregation="seq_mean_token_mean")
    assert seq.item() == pytest.approx(((-2.2 - math.exp(-1)) / 3 + 2) / 2)


def test_ppo_clip_fractions_by_side_against_a_slow_loop():
    # TRL's clip_ratio/low_mean and high_mean: r < 1 - e_lo with A < 0, r > 1 + e_hi with A > 0, token means.
    # Hand values: ratios [e, 1, e^-1] / [1, e, e^-1] with A = +1 / -1 (masks: all / the first two):
    # row 0 (A > 0): e > 1.2 high-clipped; e^-1 < 0.8 but A > 0, not clipped -> 1 high of 3
    # row 1 (A < 0): e^-1 masked out; e > 1.2 with A < 0 is not clipped (the loss keeps r there) -> none
    logp = torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    _, st = ppo_policy_loss(logp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]), mask)
    assert (st["clip_low_frac"].item(), st["clip_high_frac"].item()) == (0.0, pytest.approx(1 / 5))
    _, st = ppo_policy_loss(-logp, torch.zeros(2, 3), torch.tensor([-1.0, 1.0]), mask)  # mirrored: low side
    assert (st["clip_low_frac"].item(), st["clip_high_frac"].item()) == (pytest.approx(1 / 5), 0.0)
    g = torch.Generator().manual_seed(0)
    lp, adv = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    m = (torch.rand(4, 6, generator=g) > 0.3).long()
    _, st = ppo_policy_loss(lp, torch.zeros(4, 6), adv, m, clip_low=0.2, clip_high=0.28)
    low = high = n = 0
    for b in range(4):
        for t in range(6):
            if m[b, t]:
                r, a = math.exp(lp[b, t].item()), adv[b, t].item()
                low, high, n = low + (r < 0.8 and a < 0), high + (r > 1.28 and a > 0), n + 1
    assert st["clip_low_frac"].item() == pytest.approx(low / n)
    assert st["clip_high_frac"].item() == pytest.approx(high / n)
    assert st["clipfrac"].item() == pytest.approx((low + high) / n)  # the two sides together: clipfrac



# ------------------------------------------------------------------ GSPO and the registry
def _random(B=5, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = torch.tensor([7, 3, 1, 5, 0][:B])
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(-1)).long()
    return logp, old, adv, mask


def _slow_gspo(logp, old, adv, mask, lo, hi):
    """The paper's objective written out per sequence: mean over non-empty sequences of
    max(-A s, -A clip(s)), s = (prod_t pi / pi_old) ** (1 / |y|)."""
    losses = []
    for i in range(logp.shape[0]):
        n = int(mask[i].sum())
        if n == 0:
            continue
        prod = 1.0
        for t in range(n):
            prod *= math.exp(float(logp[i, t] - old[i, t]))
        s = prod ** (1.0 / n)
        a = float(adv[i])
        losses.append(max(-a * s, -a * min(max(s, 1 - lo), 1 + hi)))
    return sum(losses) / len(losses)


def test_registry_holds_the_three_losses_with_their_sections():
    assert set(POLICY_LOSSES) >= {"ppo", "gspo", "gspo_token"}
    assert POLICY_LOSSES["gspo"].fn is gspo_loss and POLICY_LOSSES["gspo_token"].fn is gspo_token_loss
    assert {n: POLICY_LOSSES[n].section for n in ("ppo", "gspo", "gspo_token")} == {
        "ppo": "ppo", "gspo": "gspo", "gspo_token": "gspo"}
    assert all(spec.name == name for name, spec in POLICY_LOSSES.items())


@dataclasses.dataclass(frozen=True)
class _Section:  # what a config section looks like to the registry: a frozen dataclass of the loss's own keywords
    clip_low: float = 0.1
    clip_high: float | None = 0.28


@pytest.mark.parametrize("name", ["ppo", "gspo", "gspo_token"])
def test_entry_passes_its_section_fields_and_the_shared_keywords(name):
    spec = POLICY_LOSSES[name]
    logp, old, _, mask = _random(seed=6)
    old = logp + 0.5 * (old - logp).sign()  # every ratio e^(+-0.5): outside both clip ranges, so the settings matter
    adv = torch.tensor([1.0, -1.0, 2.0, 0.5, 1.5], dtype=torch.float64)  # both signs: both clip ends are reached
    w = torch.rand(logp.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    shared = {"aggregation": "seq_mean_token_sum_norm", "max_len": 9, "log_ratio_clip": 0.3, "weights": w}
    direct, direct_st = spec.fn(logp, old, adv, mask, clip_low=0.1, clip_high=0.28, **shared)
    via_section, st = spec(logp, old, adv, mask, _Section(), **shared)
    assert torch.equal(via_section, direct) and all(torch.equal(st[k], direct_st[k]) for k in st)
    assert torch.equal(spec(logp, old, adv, mask, {"clip_low": 0.1, "clip_high": 0.28}, **shared)[0], direct)
    # each setting reaches the function: other values give another loss
    assert not torch.equal(spec(logp, old, adv, mask, _Section(clip_low=0.2), **shared)[0], direct)
    assert not torch.equal(spec(logp, old, adv, mask, _Section(clip_high=0.1), **shared)[0], direct)
    assert not torch.equal(spec(logp, old, adv, mask, _Section(), **{**shared, "max_len": 3})[0], direct)
    # no section: the function's own defaults
    assert torch.equal(spec(logp, old, adv, mask)[0], spec.fn(logp, old, adv, mask)[0])


def test_ppo_entry_is_ppo_policy_loss_and_weights_scale_tokens():
    # one PPO loss: the registry's entry is the function the numerics tests cover (padding masked, log-ratio clamped)
    assert POLICY_LOSSES["ppo"].fn is ppo_policy_loss
    logp, old, adv, mask = _random()
    # all weights 2 -> twice the loss; weights 1 -> exactly the plain loss
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        plain, _ = ppo_policy_loss(logp, old, adv, mask, aggregation=agg, max_len=7)
        ones, _ = ppo_policy_loss(logp, old, adv, mask, aggregation=agg, max_len=7, weights=torch.ones_like(logp))
        twos, _ = ppo_policy_loss(logp, old, adv, mask, aggregation=agg, max_len=7,
                                  weights=torch.full_like(logp, 2.0))
        assert torch.equal(plain, ones)
        torch.testing.assert_close(twos, 2 * plain)


@pytest.mark.parametrize("name", ["gspo", "gspo_token"])
def test_gspo_extreme_log_ratio_stays_finite(name):
    # a sequence log-ratio of +100 overflows exp in float32 (e^88); clamped to 20 the loss and gradient stay finite
    logp = torch.full((1, 3), 100.0, requires_grad=True)
    loss, stats = POLICY_LOSSES[name](logp, torch.zeros(1, 3), torch.ones(1), torch.ones(1, 3))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and torch.isfinite(stats["ratio_mean"])


def test_gspo_hand_values():
    # row 0: log-ratios [0.2, 0.4] -> log s = 0.3, s = e^0.3 = 1.349859; A = 1, clip 0.2 -> min(-1.3499, -1.2) ...
    # max(-A s, -A clip(s)) = max(-1.349859, -1.2) = -1.2 (clipped)
    # row 1: log-ratio [-0.1] -> s = e^-0.1 = 0.904837; A = -2 -> max(1.809675, 2 * 0.904837) = 1.809675 (unclipped)
    logp = torch.tensor([[0.2, 0.4, 9.0], [-0.1, 9.0, 9.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([1.0, -2.0])
    torch.testing.assert_close(sequence_log_ratio(logp, old, mask), torch.tensor([0.3, -0.1]))
    loss, st = gspo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, aggregation="seq_mean_token_mean")
    assert loss.item() == pytest.approx((-1.2 + 2 * math.exp(-0.1)) / 2, rel=1e-6)
    # clipfrac as a token mean: row 0's two tokens clipped, row 1's one not -> 2 / 3
    assert st["clipfrac"].item() == pytest.approx(2 / 3)
    loss.backward()
    # row 0 is clipped: no gradient. row 1: d/dlogp [-A exp(logp)] / 2 sequences = 2 e^-0.1 / 2 = e^-0.1
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, 0.0], [math.exp(-0.1), 0.0, 0.0]]))
    assert all(not v.requires_grad for v in st.values())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_matches_slow_loop_on_random_inputs(seed):
    logp, old, adv, mask = _random(seed=seed)
    loss, _ = gspo_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.15, aggregation="seq_mean_token_mean")
    assert loss.item() == pytest.approx(_slow_gspo(logp, old, adv, mask, 0.1, 0.15), rel=1e-9)


def test_gspo_gradient_matches_autograd_of_slow_formula():
    """d loss / d logp from the vectorised loss == the gradient of the per-sequence formula in plain torch ops."""
    logp, old, adv, mask = _random(seed=3)
    logp = logp.clone().requires_grad_(True)
    loss, _ = gspo_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.1, aggregation="seq_mean_token_mean")
    (g_fast,) = torch.autograd.grad(loss, logp)
    x = logp.detach().clone().requires_grad_(True)
    terms = []
    for i in range(x.shape[0]):
        n = int(mask[i].sum())
        if n == 0:
            continue
        s = torch.exp((x[i, :n] - old[i, :n]).sum() / n)
        terms.append(torch.maximum(-adv[i] * s, -adv[i] * s.clamp(0.9, 1.1)))
    (g_slow,) = torch.autograd.grad(torch.stack(terms).mean(), x)
    torch.testing.assert_close(g_fast, g_slow)
    assert torch.all(g_fast[mask == 0] == 0)


def test_gspo_token_equals_gspo_in_value_and_gradient_for_sequence_advantages():
    logp, old, adv, mask = _random(seed=4)
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    adv_tok = adv.unsqueeze(-1).expand_as(logp) * mask  # per-token, constant over each row
    la, _ = gspo_loss(a, old, adv, mask, clip_low=0.1, clip_high=0.2, aggregation="seq_mean_token_mean")
    lb, _ = gspo_token_loss(b, old, adv_tok, mask, clip_low=0.1, clip_high=0.2, aggregation="seq_mean_token_mean")
    torch.testing.assert_close(la, lb)
    la.backward()
    lb.backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_gspo_token_uses_per_token_advantages():
    # one row, log-ratios [0, 0] -> s = 1 (inside the clip); A = [1, -3]
    # per token: -A_t * s -> [-1, 3], token mean over the row = 1; gradient -A_t * s / 2 = [-0.5, 1.5]
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = gspo_token_loss(logp, torch.zeros(1, 2), torch.tensor([[1.0, -3.0]]), torch.ones(1, 2),
                              clip_low=0.2, clip_high=0.2, aggregation="seq_mean_token_mean")
    assert loss.item() == pytest.approx(1.0)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, 1.5]]))


def test_gspo_ratio_is_one_on_policy_and_empty_rows_are_harmless():
    logp, _, adv, mask = _random(seed=5)
    for fn in (gspo_loss, gspo_token_loss):
        loss, st = fn(logp, logp.clone(), adv, mask)
        assert st["ratio_mean"].item() == pytest.approx(1.0)
        assert st["clipfrac"].item() == 0.0
        assert torch.isfinite(loss)
    # all rows empty: loss 0, no NaN
    loss, _ = gspo_loss(logp, logp, adv, torch.zeros_like(mask))
    assert loss.item() == 0.0


def test_config_reads_policy_loss_from_registry():
    from rlhfkit.config import build_config
    from rlhfkit.errors import ConfigError

    cfg = build_config("grpo", {}, ["algo.policy_loss=gspo"])
    assert cfg.algo.policy_loss == "gspo"
    with pytest.raises(ConfigError, match="gspo"):
        build_config("grpo", {}, ["algo.policy_loss=gpso"])


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_loss_has_its_config_section_with_its_own_keywords_and_defaults(name):
    # the section named by the entry exists in the online config, frozen, each field a keyword of the function with
    # the same default (the paper's), so the loop can pass the section and a new loss needs no change elsewhere
    from rlhfkit.config import OnlineAlgoConfig

    spec = POLICY_LOSSES[name]
    section = getattr(OnlineAlgoConfig(), spec.section)
    assert dataclasses.is_dataclass(section) and type(section).__dataclass_params__.frozen
    params = inspect.signature(spec.fn).parameters
    for fl in dataclasses.fields(section):
        assert params[fl.name].kind is inspect.Parameter.KEYWORD_ONLY, fl.name
        assert params[fl.name].default == getattr(section, fl.name), fl.name
        assert fl.metadata.get("help"), fl.name
    shared = {"aggregation", "max_len", "log_ratio_clip", "weights"}  # the loop's, never a section's
    assert shared <= set(params) and not shared & {fl.name for fl in dataclasses.fields(section)}


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_the_loop_passes_the_chosen_loss_its_section(monkeypatch, name):
    # Learner.policy_micro_step on a stand-in learner: the registered entry receives getattr(cfg.algo, section)
    # as its own keywords (a changed value included) and the loop's shared keywords, and the loop names no loss
    import contextlib
    import types

    import rlhfkit.train.online.learner as learner
    from rlhfkit.config import build_config

    spec, seen = POLICY_LOSSES[name], {}
    default = getattr(build_config("grpo", {}, [f"algo.policy_loss={name}"]).algo, spec.section)
    changed = next(fl.name for fl in dataclasses.fields(default) if isinstance(getattr(default, fl.name), float))
    value = getattr(default, changed) * 0.5  # a setting away from its default, which must reach the function
    cfg = build_config("grpo", {}, [f"algo.policy_loss={name}", f"algo.{spec.section}.{changed}={value}"])

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return spec.fn(*args, **kwargs)

    logits = torch.randn(2, 3, 5, requires_grad=True)
    monkeypatch.setattr(learner, "response_stats", lambda model, batch, temperature, **kw: token_stats_from_logits(
        logits, batch["response_ids"], entropy=True))
    trainer = types.SimpleNamespace(
        cfg=cfg, policy=None, policy_loss=dataclasses.replace(spec, fn=spy), max_response_len=11, kl_in_reward=True,
        acc=types.SimpleNamespace(autocast=contextlib.nullcontext, backward=lambda t: t.backward()))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    weights = torch.full((2, 3), 0.5)
    batch = {"response_ids": torch.zeros(2, 3, dtype=torch.long), "old_logprobs": torch.full((2, 3), -1.6),
             "advantages": torch.tensor([1.0, -1.0]), "mask": mask, "is_weights": weights}
    out = learner.Learner.policy_micro_step(trainer, batch, 1.0)
    section = getattr(cfg.algo, spec.section)
    assert {fl.name: seen[fl.name] for fl in dataclasses.fields(section)} == dataclasses.asdict(section)
    assert seen[changed] == value
    assert seen["aggregation"] == cfg.algo.loss_aggregation and seen["max_len"] == 11 and seen["weights"] is weights
    assert torch.isfinite(out["loss/policy_avg"]) and logits.grad is not None
