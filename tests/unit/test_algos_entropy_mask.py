"""``algos.masked_quantile`` and ``algos.high_entropy_mask`` (Wang et al. 2025, "Beyond the 80/20 rule"; TRL's
``top_entropy_quantile``): checked against numpy's quantile, hand-computed masks, a slow loop, ties, empty masks, a
pool from other processes, bf16, and the gradient of a policy loss restricted by the mask (closed form)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfkit import algos


def _rand(seed, shape, p_mask=0.7):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g) * 5
    mask = torch.rand(shape, generator=g) < p_mask
    return x, mask


@pytest.mark.parametrize("q", [0.0, 0.2, 0.5, 0.8, 0.95, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_quantile_is_numpys_linear_quantile(q, seed):
    x, mask = _rand(seed, (6, 13))
    want = np.quantile(x[mask].double().numpy(), q)  # numpy's default method: linear
    assert algos.masked_quantile(x, mask, q).item() == pytest.approx(want, rel=1e-6, abs=1e-6)


def test_masked_quantile_by_hand_padding_bf16_and_edges():
    x = torch.tensor([[4.0, 1.0, float("nan")], [3.0, 2.0, float("inf")]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    # sorted 1, 2, 3, 4: q = 0.5 -> position 1.5 -> 2.5; q = 0.8 -> 2.4 -> 3.4; NaN / inf padding never read
    assert algos.masked_quantile(x, mask, 0.5).item() == pytest.approx(2.5)
    assert algos.masked_quantile(x, mask, 0.8).item() == pytest.approx(3.4)
    assert algos.masked_quantile(x, mask, 0.0).item() == 1.0 and algos.masked_quantile(x, mask, 1.0).item() == 4.0
    q = algos.masked_quantile(x.bfloat16(), mask, 0.5)
    assert q.dtype == torch.float32 and q.item() == pytest.approx(2.5)
    assert torch.isnan(algos.masked_quantile(x, torch.zeros_like(mask), 0.5))
    ties = torch.full((3, 4), 0.7)
    assert algos.masked_quantile(ties, torch.ones(3, 4), 0.37).item() == pytest.approx(0.7)
    with pytest.raises(ValueError, match="outside"):
        algos.masked_quantile(x, mask, 1.5)


def test_masked_quantile_above_torch_quantiles_size_limit():
    """torch.quantile refuses more than 2^24 values; a sort does not (the reason it is not used)."""
    n = 2**24 + 3
    x = torch.arange(n, dtype=torch.float32).flip(0)
    assert algos.masked_quantile(x, torch.ones(n, dtype=torch.bool), 0.5).item() == pytest.approx((n - 1) / 2)


def test_high_entropy_mask_by_hand():
    ent = torch.tensor([[0.1, 0.9, 0.5, 0.7, 9.0], [0.3, 0.2, 0.8, float("nan"), float("inf")]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    # pool sorted: 0.1 0.2 0.3 0.5 0.7 0.8 0.9 (n = 7)
    # top 0.5: the 0.5-quantile, position 3 -> 0.5: keeps 0.9, 0.5, 0.7, 0.8
    half = algos.high_entropy_mask(ent, mask, 0.5)
    assert half.tolist() == [[False, True, True, True, False], [False, False, True, False, False]]
    # top 0.2: the 0.8-quantile, position 4.8 -> 0.7 + 0.8 * 0.1 = 0.78: keeps 0.9, 0.8
    top = algos.high_entropy_mask(ent, mask, 0.2)
    assert top.tolist() == [[False, True, False, False, False], [False, False, True, False, False]]
    # 0: the highest only; 1: every token of the mask (never the padding, whatever its entropy)
    assert algos.high_entropy_mask(ent, mask, 0.0).nonzero().tolist() == [[0, 1]]
    assert torch.equal(algos.high_entropy_mask(ent, mask, 1.0), mask.bool())


def _slow(ent, mask, top, pool=None):
    """The mask by a Python loop: the threshold interpolated by hand over the sorted pool, then every token."""
    values = sorted(float(v) for v, m in zip(ent.flatten(), mask.flatten()) if m) if pool is None \
        else sorted(float(v) for v in pool)
    out = torch.zeros(ent.shape, dtype=torch.bool)
    if not values:
        return out
    pos = (1 - top) * (len(values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    threshold = values[lo] + (pos - lo) * (values[hi] - values[lo])
    for i in range(ent.shape[0]):
        for j in range(ent.shape[1]):
            out[i, j] = bool(mask[i, j]) and float(ent[i, j]) >= threshold
    return out


@pytest.mark.parametrize("top", [0.05, 0.2, 0.5, 0.9])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_high_entropy_mask_matches_a_slow_loop(top, seed):
    ent, mask = _rand(seed, (5, 17))
    got = algos.high_entropy_mask(ent.double(), mask, top)
    assert torch.equal(got, _slow(ent.double(), mask, top))
    kept = int(got.sum())
    n = int(mask.sum())
    assert kept == pytest.approx(top * n, abs=1.0 + 1e-9)  # distinct values: the fraction, to one token


def test_high_entropy_mask_ties_pool_empty_and_bf16():
    mask = torch.ones(2, 3, dtype=torch.bool)
    ties = torch.full((2, 3), 1.25)
    assert algos.high_entropy_mask(ties, mask, 0.2).all()  # all tied at the threshold: all kept
    assert algos.high_entropy_mask(ties, mask, 0.0).all()
    ent = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    # other processes' tokens all more uncertain: none of this process's passes the common threshold
    assert not algos.high_entropy_mask(ent, mask, 0.5, pool=torch.tensor([2.0, 3.0, 4.0, 0.1])).any()
    pool = torch.tensor([0.05, 0.15, 0.35, 0.55])  # 0.5-quantile 0.25: keeps 0.3 .. 0.6
    got = algos.high_entropy_mask(ent, mask, 0.5, pool=pool)
    assert torch.equal(got, _slow(ent, mask, 0.5, pool=pool.tolist()))
    assert got.tolist() == [[False, False, True], [True, True, True]]
    empty = torch.zeros_like(mask)
    assert not algos.high_entropy_mask(ent, empty, 0.2).any()
    assert not algos.high_entropy_mask(ent, mask, 0.2, pool=torch.zeros(0)).any()
    bf = algos.high_entropy_mask(ent.bfloat16(), mask, 0.5)
    assert torch.equal(bf, algos.high_entropy_mask(ent.bfloat16().float(), mask, 0.5))
    with pytest.raises(ValueError, match="outside"):
        algos.high_entropy_mask(ent, mask, -0.1)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_policy_loss_on_the_high_entropy_tokens_gradient(aggregation):
    """The mask as the loss's per-token weights: on-policy (r = 1) the gradient of the PPO loss wrt log pi_t is
    -A_t / N (token_mean, N = tokens of the mask) or -A_t / (B |y_i|) (seq_mean_token_mean) on a kept token and 0 on a
    dropped one: masked tokens leave the loss but stay in its normaliser (TRL's placement)."""
    ent, mask = _rand(7, (4, 9), p_mask=0.8)
    mask[:, 0] = True
    adv = torch.tensor([1.5, -0.5, 2.0, -1.0])
    logp = (-torch.rand(4, 9)).requires_grad_(True)
    keep = algos.high_entropy_mask(ent, mask, 0.3)
    loss, _ = algos.ppo_policy_loss(logp, logp.detach(), adv, mask, aggregation=aggregation, weights=keep.float())
    loss.backward()
    if aggregation == "token_mean":
        want = -adv[:, None] * keep / mask.sum()
    else:
        want = -adv[:, None] * keep / (mask.sum(-1, keepdim=True) * mask.shape[0])
    torch.testing.assert_close(logp.grad, want.float(), rtol=1e-5, atol=1e-7)
    assert logp.grad[mask & ~keep].abs().max() == 0


def test_the_learner_takes_one_threshold_over_every_process():
    """Learner.high_entropy_tokens on "rank 0" of two: the other rank's tokens (here all more uncertain) enter the
    threshold through the gather, as TRL's accelerator.gather does, so rank 0 keeps fewer than its own half."""
    from types import SimpleNamespace

    from rlhfkit.train.online.learner import Learner

    other = torch.tensor([[5.0], [6.0], [7.0], [8.0], [9.0], [0.0]])  # the other rank's entropies, [n, 1] rows

    class TwoRanks:
        num_processes = 2

        def pad_across_processes(self, t, dim=0):
            n = max(t.shape[0], other.shape[0])
            return torch.cat([t, t.new_zeros(n - t.shape[0], *t.shape[1:])])

        def gather(self, t):  # rank 0's padded rows, then rank 1's (valid flag 1 as gather_rows appends)
            theirs = self.pad_across_processes(torch.cat([other, torch.ones_like(other)], 1))
            return torch.cat([t, theirs])

    ent = torch.tensor([[0.5, 1.0, 1.5, 2.0, 2.5]])
    mask = torch.ones_like(ent, dtype=torch.bool)
    me = SimpleNamespace(acc=TwoRanks(), cfg=SimpleNamespace(algo=SimpleNamespace(top_entropy_quantile=0.5)))
    got = Learner.high_entropy_tokens(me, ent, mask)
    # pool: 0.5 1 1.5 2 2.5 (rank 0) and 5 6 7 8 9 0 (rank 1): 11 values, 0.5-quantile = the 6th sorted = 2.5
    assert got.tolist() == [[False, False, False, False, True]]
    alone = algos.high_entropy_mask(ent, mask, 0.5)
    assert alone.sum() == 3  # rank 0's own tokens alone: 1.5, 2, 2.5


def test_the_mask_is_trls_own():
    """Against TRL 1.16's GRPOTrainer.get_high_entropy_mask itself (one process: its gather is the identity), on
    random batches with ties, padding and every fraction; runs where TRL is installed (the bench's .venv-trl)."""
    from unittest.mock import Mock

    trl = pytest.importorskip("trl", reason="TRL is not a dependency (bench/learning.py's .venv-trl has it)")
    trainer = Mock(spec=trl.GRPOTrainer)
    trainer.accelerator = Mock()
    trainer.accelerator.pad_across_processes = lambda x, dim=0, pad_index=0: x
    trainer.accelerator.gather = lambda x: x
    for seed in range(60):
        g = torch.Generator().manual_seed(seed)
        b, t = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 40, (1,), generator=g))
        ent = torch.rand(b, t, generator=g) * 4
        if seed % 3 == 0:
            ent = (ent * 4).round() / 4  # ties
        mask = (torch.rand(b, t, generator=g) < 0.8).long()
        for top in (0.0, 0.05, 0.2, 0.5, 0.99):
            want = trl.GRPOTrainer.get_high_entropy_mask(trainer, ent, mask, 1 - top)
            assert torch.equal(algos.high_entropy_mask(ent, mask, top), want), (seed, top)


def test_vespo_keeps_its_kernel_on_every_token_and_learns_on_the_kept_ones():
    """vespo_loss(token_keep=...): the kernel phi(W) is taken over every token (detached), so the gradient is the
    all-token gradient times the selection, token for token; selecting through ``weights`` instead would fold the
    0/1 factors into W and change the kernel (TRL multiplies its per-token loss after the kernel)."""
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(4, 7, generator=g) < 0.85
    mask[:, 0] = True
    old = -torch.rand(4, 7, generator=g) * 2
    new = old + 0.3 * torch.randn(4, 7, generator=g)
    adv = torch.tensor([1.0, -2.0, 0.5, -0.7])
    keep = algos.high_entropy_mask(torch.rand(4, 7, generator=g), mask, 0.4)

    def grad(**kw):
        lp = new.clone().requires_grad_(True)
        loss, _ = algos.vespo_loss(lp, old, adv, mask, **kw)
        loss.backward()
        return loss, lp.grad

    loss_all, g_all = grad()
    loss_keep, g_keep = grad(token_keep=keep)
    torch.testing.assert_close(g_keep, g_all * keep)
    _, g_weights = grad(weights=keep.float())  # the wrong channel: the kernel changes
    assert not torch.allclose(g_weights[keep], g_keep[keep])
