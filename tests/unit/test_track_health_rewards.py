"""The reward health rules on synthetic metric sequences: the training reward rising while the held-out reward
falls (reward hacking), responses running to the length limit while the reward rises, most groups tied for many
steps; each silent on a healthy sequence."""

from rlhfkit.track import HealthMonitor


def warnings_of(seq, **kw) -> list[tuple[int, str]]:
    mon = HealthMonitor(**kw)
    return [(step, w.name) for step, m in enumerate(seq) for w in mon.evaluate(m, step)]


def test_reward_rising_while_held_out_falls():
    # training reward climbs 0.2 -> 0.9; the held-out reward (every 5 steps) 0.30, 0.45, 0.40, 0.20
    seq = [{"objective/scores": 0.2 + 0.035 * s} for s in range(21)]
    for step, held in ((5, 0.30), (10, 0.45), (15, 0.40), (20, 0.20)):
        seq[step]["eval/scores"] = held
    got = warnings_of(seq)
    assert got == [(20, "reward_hacking")]  # 0.40 is within the margin of 0.45; 0.20 is not
    # held-out falling with the training reward falling too is a collapse, not hacking
    down = [{"objective/scores": 0.9 - 0.03 * s} for s in range(21)]
    for step, held in ((5, 0.5), (10, 0.45), (20, 0.2)):
        down[step]["eval/scores"] = held
    assert ("reward_hacking" not in {n for _, n in warnings_of(down)})
    # both rising: healthy
    up = [{"objective/scores": 0.2 + 0.03 * s, **({"eval/scores": 0.1 + 0.01 * s} if s % 5 == 0 else {})}
          for s in range(21)]
    assert warnings_of(up) == []


def test_length_runs_to_the_limit_while_reward_rises():
    seq = [{"objective/scores": 0.1 * s, "response/length_mean": 40 + 8 * s} for s in range(8)]  # 40 -> 96 of 100
    assert warnings_of(seq, max_response_len=100) == [(6, "length_to_limit")]  # 88 >= 0.85 * 100 from step 6
    assert warnings_of(seq) == []  # no limit known: silent
    flat = [{"objective/scores": 0.5, "response/length_mean": 95} for _ in range(8)]  # long but not rising
    assert warnings_of(flat, max_response_len=100) == []


def test_most_groups_tied_for_many_steps():
    seq = [{"rewards/tied_groups_frac": f} for f in [0.5] * 3 + [0.9] * 10]
    assert warnings_of(seq, tied_steps=10) == [(12, "tied_groups")]
    # one informative step in between resets the count
    broken = [{"rewards/tied_groups_frac": f} for f in [0.9] * 9 + [0.3] + [0.9] * 9]
    assert warnings_of(broken, tied_steps=10) == []


def test_most_scores_at_the_clip_warns_once_per_window():
    seq = [{"rewards/clipped_frac": f} for f in (0.0, 0.2, 0.49, 0.5, 1.0, 1.0)]
    assert warnings_of(seq) == [(3, "scores_clipped")]  # from half of the scores; not repeated within 10 steps
    assert warnings_of(seq, clipped_frac=0.9) == [(4, "scores_clipped")]
    assert warnings_of([{"objective/scores": 1.0}] * 3) == []  # reward.clip=null: no metric, no warning
