"""Online DPO's pairs (issue 34): the best and the worst valid completion of each prompt, completion-major, ties and
prompts with fewer than two valid completions left out; hand values and a slow loop."""

import random

import pytest
import torch

from rlhfkit.algos.preference import preference_pairs


def _kept(scores, k, valid=None):
    chosen, rejected, keep = preference_pairs(scores, k, valid)
    assert chosen.shape == rejected.shape == keep.shape == (scores.numel() // k,)
    return chosen[keep], rejected[keep]


def test_hand_values_k2_and_k4():
    # k = 2, P = 3, completion-major: prompt j's completions are rows j and 3 + j
    scores = torch.tensor([1.0, 0.0, 0.5, 0.0, 2.0, 0.5])
    assert preference_pairs(scores, 2)[2].tolist() == [True, True, False]
    chosen, rejected = _kept(scores, 2)
    assert chosen.tolist() == [0, 4] and rejected.tolist() == [3, 1]  # prompt 2 ties: no pair
    # k = 4, P = 2: prompt 0 rows 0, 2, 4, 6 (scores 0, 3, 1, 3: best first of the two 3s -> row 2, worst row 0)
    scores = torch.tensor([0.0, 5.0, 3.0, 5.0, 1.0, 5.0, 3.0, 4.0])
    chosen, rejected = _kept(scores, 4)
    assert chosen.tolist() == [2, 1] and rejected.tolist() == [0, 7]
    # an invalid completion (its reward dropped) is neither chosen nor rejected
    valid = torch.tensor([False, True, True, True, True, True, True, True])
    chosen, rejected = _kept(scores, 4, valid)
    assert chosen.tolist() == [2, 1] and rejected.tolist() == [4, 7]
    # one valid completion left: no pair; none at all: empty
    c, r = _kept(torch.tensor([1.0, 0.0]), 2, torch.tensor([True, False]))
    assert c.numel() == 0 and r.numel() == 0
    with pytest.raises(ValueError, match="groups of >= 2"):
        preference_pairs(torch.tensor([1.0, 0.0, 2.0]), 2)


@pytest.mark.parametrize("seed", range(20))
def test_matches_slow_loop(seed):
    rng = random.Random(seed)
    k, P = rng.randint(2, 5), rng.randint(1, 6)
    scores = torch.tensor([float(rng.randint(0, 3)) for _ in range(k * P)])
    valid = torch.tensor([rng.random() > 0.2 for _ in range(k * P)])
    chosen, rejected = _kept(scores, k, valid)
    want_c, want_r = [], []
    for j in range(P):
        members = [i * P + j for i in range(k) if valid[i * P + j]]
        if len(members) < 2:
            continue
        hi = max(float(scores[m]) for m in members)
        lo = min(float(scores[m]) for m in members)
        if hi > lo:
            want_c.append(next(m for m in members if float(scores[m]) == hi))
            want_r.append(next(m for m in members if float(scores[m]) == lo))
    assert chosen.tolist() == want_c and rejected.tolist() == want_r


def test_pair_logps_feed_each_paired_loss_as_the_offline_recipe_does():
    import math
    from types import SimpleNamespace

    from rlhfkit.algos import PREFERENCE_LOSSES, dpo_loss, pair_logps

    # 2 prompts x 2 completions, completion-major; row lengths 3, 1, 2, 0 (NaN padding)
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, math.nan, math.nan], [-1.5, -0.5, math.nan],
                       [math.nan, math.nan, math.nan]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.2, -1.8, -0.4], [-0.2, 9.0, 9.0], [-1.0, -1.0, 9.0], [9.0, 9.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
    chosen, rejected = _kept(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2)  # prompt 0: row 0 > 2; 1: 3 > 1
    assert chosen.tolist() == [0, 3] and rejected.tolist() == [2, 1]
    got = pair_logps(lp, mask, chosen, rejected, ref)
    torch.testing.assert_close(got["chosen"], torch.tensor([-3.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(got["rejected"], torch.tensor([-2.0, -0.3], dtype=torch.float64))
    torch.testing.assert_close(got["ref_chosen"], torch.tensor([-3.4, 0.0], dtype=torch.float64))
    torch.testing.assert_close(got["ref_rejected"], torch.tensor([-2.0, -0.2], dtype=torch.float64))
    assert got["chosen_tokens"].tolist() == [3.0, 0.0] and got["rejected_tokens"].tolist() == [2.0, 1.0]
    params = SimpleNamespace(beta=0.1, label_smoothing=0.0, simpo_gamma=0.5, orpo_lambda=0.1)
    loss, _ = PREFERENCE_LOSSES["dpo"].from_logps(got, params)
    want, _ = dpo_loss(got["chosen"], got["rejected"], got["ref_chosen"], got["ref_rejected"], beta=0.1)
    assert loss.item() == pytest.approx(want.item())
    (g,) = torch.autograd.grad(loss, lp)
    assert torch.isfinite(g).all() and torch.all(g[~mask.bool()] == 0) and torch.all(g[mask.bool()] != 0)
    for name in ("ipo", "cdpo", "simpo", "orpo"):  # every paired loss reads the dict
        loss, _ = PREFERENCE_LOSSES[name].from_logps(got, params)
        assert torch.isfinite(loss)
    assert "ref_chosen" not in pair_logps(lp, mask, chosen, rejected)
