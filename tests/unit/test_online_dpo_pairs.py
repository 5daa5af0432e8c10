"""Online DPO's pairs (issue 34): the best and the worst valid completion of each prompt, completion-major, ties and
prompts with fewer than two valid completions left out; hand values and a slow loop."""

import random

import pytest
import torch

from rlhfkit.algos.preference import preference_pairs


def test_hand_values_k2_and_k4():
    # k = 2, P = 3, completion-major: prompt j's completions are rows j and 3 + j
    scores = torch.tensor([1.0, 0.0, 0.5, 0.0, 2.0, 0.5])
    chosen, rejected = preference_pairs(scores, 2)
    assert chosen.tolist() == [0, 4] and rejected.tolist() == [3, 1]  # prompt 2 ties: no pair
    # k = 4, P = 2: prompt 0 rows 0, 2, 4, 6 (scores 0, 3, 1, 3: best first of the two 3s -> row 2, worst row 0)
    scores = torch.tensor([0.0, 5.0, 3.0, 5.0, 1.0, 5.0, 3.0, 4.0])
    chosen, rejected = preference_pairs(scores, 4)
    assert chosen.tolist() == [2, 1] and rejected.tolist() == [0, 7]
    # an invalid completion (its reward dropped) is neither chosen nor rejected
    valid = torch.tensor([False, True, True, True, True, True, True, True])
    chosen, rejected = preference_pairs(scores, 4, valid)
    assert chosen.tolist() == [2, 1] and rejected.tolist() == [4, 7]
    # one valid completion left: no pair; none at all: empty
    c, r = preference_pairs(torch.tensor([1.0, 0.0]), 2, torch.tensor([True, False]))
    assert c.numel() == 0 and r.numel() == 0
    with pytest.raises(ValueError, match="groups of >= 2"):
        preference_pairs(torch.tensor([1.0, 0.0, 2.0]), 2)


@pytest.mark.parametrize("seed", range(20))
def test_matches_slow_loop(seed):
    rng = random.Random(seed)
    k, P = rng.randint(2, 5), rng.randint(1, 6)
    scores = torch.tensor([float(rng.randint(0, 3)) for _ in range(k * P)])
    valid = torch.tensor([rng.random() > 0.2 for _ in range(k * P)])
    chosen, rejected = preference_pairs(scores, k, valid)
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
