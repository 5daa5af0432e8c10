"""DAPO shaping: the soft overlong penalty (hand values, slow loop) and dynamic sampling (fills with non-degenerate
groups only, stops at its cap, fills with tied groups there), and the completion-major row layout."""

import pytest
import torch

from rlhfkit.algos import dynamic_sample, overlong_penalty


def test_overlong_penalty_hand_values():
    # max 20, cache 4: free up to 16; 17 -> -1/4, 18 -> -2/4, 20 -> -1, beyond -> -1
    got = overlong_penalty(torch.tensor([0, 16, 17, 18, 20, 25]), max_len=20, cache_len=4, factor=1.0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    torch.testing.assert_close(overlong_penalty(torch.tensor([18]), 20, 4, factor=0.5), torch.tensor([-0.25]))
    assert torch.all(overlong_penalty(torch.tensor([20, 5]), 20, 0) == 0)
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([1]), 4, 8)


def test_overlong_penalty_matches_the_paper_formula_in_a_loop():
    L_max, L_cache = 12, 5
    lengths = torch.arange(0, 16)
    got = overlong_penalty(lengths, L_max, L_cache)
    for L, g in zip(lengths.tolist(), got.tolist()):
        want = 0.0 if L <= L_max - L_cache else ((L_max - L_cache - L) / L_cache if L <= L_max else -1.0)
        assert g == pytest.approx(want)


def _fake_draws(tied_pattern: list[list[bool]], k=2):
    """draw(j) -> (j, scores, None) where group p of draw j ties when tied_pattern[j][p]."""
    calls = []

    def draw(j):
        calls.append(j)
        pattern = tied_pattern[j]
        P = len(pattern)
        scores = torch.zeros(k * P)
        for p, tied in enumerate(pattern):
            if not tied:
                scores[P + p] = 1.0  # completion 1 of prompt p differs
        return j, scores, None
    return draw, calls


def test_dynamic_sampling_fills_with_non_degenerate_groups_only():
    draw, calls = _fake_draws([[True, False, True, False], [False, True, True, True], [False, False, False, False]])
    out = dynamic_sample(draw, need=4, group_size=2, max_draws=10)
    # draw 0 gives p1, p3; draw 1 gives p0; draw 2 gives p0 (the 4th) and stops
    assert out.groups == [(0, 1), (0, 3), (1, 0), (2, 0)]
    assert calls == [0, 1, 2] and out.draws == 3
    assert out.degenerate == 2 + 3 + 0 and out.filled == 0
    assert out.results == [0, 1, 2]


def test_dynamic_sampling_stops_at_its_cap_and_fills_with_tied_groups():
    draw, calls = _fake_draws([[True, True, True], [True, False, True], [False] * 3, [False] * 3])
    out = dynamic_sample(draw, need=3, group_size=2, max_draws=2)
    assert calls == [0, 1] and out.draws == 2  # never a third draw
    assert out.groups == [(1, 1), (0, 0), (0, 1)]  # the one informative group, then tied ones in draw order
    assert out.filled == 2 and out.degenerate == 5


def test_dynamic_sampling_compares_valid_members_only():
    """A dropped sample (valid False, its score set to 0) does not make its group informative: the same rule as
    algo.filter_tied_groups (group_all_tied with valid)."""
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0])  # k = 2, P = 2: p0 (1, 0) with the 0 dropped; p1 (1, 1)
    valid = torch.tensor([True, True, False, True])
    out = dynamic_sample(lambda j: (j, scores, valid), need=1, group_size=2, max_draws=1)
    assert out.degenerate == 2 and out.filled == 1  # both tied; without valid p0 would count as informative
    out = dynamic_sample(lambda j: (j, scores, None), need=1, group_size=2, max_draws=1)
    assert out.groups == [(0, 0)] and out.degenerate == 1


def test_dynamic_sampling_first_draw_enough():
    draw, calls = _fake_draws([[False, False]])
    out = dynamic_sample(draw, need=2, group_size=2, max_draws=3)
    assert calls == [0] and out.groups == [(0, 0), (0, 1)] and out.filled == 0


def test_config_rules_for_dapo_keys():
    from rlhfkit.config import build_config, load_config
    from rlhfkit.errors import ConfigError

    with pytest.raises(ConfigError, match="algo.overlong.cache_len"):
        build_config("grpo", {}, ["algo.overlong.cache_len=100", "generation.max_new_tokens=64"])
    with pytest.raises(ConfigError, match="algo.dynamic_sampling.enabled"):
        build_config("ppo", {}, ["algo.dynamic_sampling.enabled=true"])
    cfg = load_config("grpo", "configs/dapo.yaml")
    assert cfg.algo.dynamic_sampling.enabled and cfg.algo.overlong.cache_len == 4 and cfg.algo.ppo.clip_high == 0.28
    assert load_config("grpo", "configs/gspo.yaml").algo.policy_loss == "gspo"


def test_shaped_token_rewards_put_the_score_on_the_last_token_of_a_mask_with_holes():
    """Multi-turn masks have holes (environment tokens): the score must land on the last model token, not at
    position (number of tokens - 1), which may be an environment token where it would be masked away."""
    from rlhfkit.algos import shaped_token_rewards

    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0, 0], [0] * 8])
    rewards, _ = shaped_token_rewards(torch.tensor([2.0, 3.0, 5.0]), torch.zeros(3, 8), mask, 0.0, True)
    want = torch.zeros(3, 8)
    want[0, 6], want[1, 2] = 2.0, 3.0
    torch.testing.assert_close(rewards, want)


def test_turn_reward_shift_hand_values_and_zero_sum():
    from rlhfkit.algos import turn_reward_shift

    # row 0: turns end at 1 (reward 0.2) and 6 (reward 1.0), environment tokens 2-4 -> +0.2 at 1, -0.2 at 6
    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0, 0]])
    turns = torch.zeros(2, 8)
    turns[0, 1], turns[0, 6], turns[1, 2] = 0.2, 1.0, 0.5
    shift = turn_reward_shift(turns, mask)
    want = torch.zeros(2, 8)
    want[0, 1], want[0, 6] = 0.2, -0.2
    torch.testing.assert_close(shift, want)
    # with the episode score (1.2) on the last token, the per-token rewards become 0.2 at turn 1, 1.0 at turn 2
    from rlhfkit.algos import shaped_token_rewards

    rewards, _ = shaped_token_rewards(torch.tensor([1.2, 0.5]), torch.zeros(2, 8), mask, 0.0, True)
    total = rewards + shift
    assert total[0, 1].item() == pytest.approx(0.2) and total[0, 6].item() == pytest.approx(1.0)
    torch.testing.assert_close(total.sum(-1), torch.tensor([1.2, 0.5]))
