"""The asynchronous mode's pieces that need no second process: the layout (which rank makes which piece of which
learner's share), its refusals, the wire format of an experience, the weights' buckets, the ``algo.async`` key and
the correction it turns on. The processes themselves: tests/e2e/test_async_processes.py (make test-cluster)."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.config import build_config, dump_yaml
from rlhfkit.errors import ConfigError
from rlhfkit.rollout import Rollout
from rlhfkit.train.lifecycle.checkpoint import fingerprint_diff, run_fingerprint
from rlhfkit.train.online.bridge import (
    BUCKET_BYTES,
    Layout,
    _buckets,
    _dumps,
    _loads,
    experience_of,
    experience_state,
    layout_of,
)
from rlhfkit.train.online.experience import Experience


def _cfg(*extra):
    return build_config("grpo", {}, ["algo.async.max_staleness=1", "algo.rollout_batch_size=4", *extra])


def test_the_key_is_algo_async_and_auto_turns_the_correction_on():
    sync, stale = build_config("grpo", {}, []), _cfg("algo.async.producers=2")
    assert sync.algo.async_.max_staleness == 0 and sync.algo.correction == "none"  # synchronous by default
    assert stale.algo.async_.max_staleness == 1 and stale.algo.async_.producers == 2
    assert stale.algo.correction == "tis"  # stale samples are corrected unless told otherwise
    assert _cfg("algo.off_policy.correction=none").algo.correction == "none"
    assert _cfg("algo.off_policy.correction=mis").algo.correction == "mis"
    text = dump_yaml(stale)
    assert "  async:" in text and "async_" not in text  # the key as users write it
    assert run_fingerprint(stale)["algo.async.max_staleness"] == 1
    with pytest.raises(ConfigError, match="algo.async_"):
        build_config("grpo", {}, ["algo.async_.max_staleness=1"])


def test_a_checkpoint_from_before_the_async_keys_still_resumes():
    # an online run's fingerprint written before algo.async existed, with correction none (then the default)
    today = run_fingerprint(build_config("grpo", {}, []))
    old = {k: v for k, v in today.items() if not k.startswith("algo.async.")}
    old["algo.off_policy.correction"] = "none"
    assert fingerprint_diff(old, today) == []
    stale = run_fingerprint(build_config("grpo", {}, ["algo.async.max_staleness=1"]))
    assert fingerprint_diff(old, stale) == ["algo.async.max_staleness: 0 -> 1"]  # a change that needs a new run


@pytest.mark.parametrize("learners, producers", [(1, 1), (1, 2), (1, 4), (2, 1), (4, 2), (2, 2), (3, 3)])
def test_every_piece_of_every_share_is_made_once(learners, producers):
    layouts = [Layout(rank=r, learners=learners, producers=producers) for r in range(learners + producers)]
    pieces = layouts[0].pieces
    made = [(rank, sp) for rank in range(learners, learners + producers) for sp in layouts[0].made_by(rank)]
    assert sorted(sp for _, sp in made) == [(s, p) for s in range(learners) for p in range(pieces)]
    for rank, (share, piece) in made:
        assert layouts[0].producer_rank(share, piece) == rank
    counts = [len(layouts[0].made_by(rank)) for rank in range(learners, learners + producers)]
    assert max(counts) == min(counts)  # every producer has as much to make
    assert [x.is_learner for x in layouts] == [True] * learners + [False] * producers


def test_the_layout_refuses_what_cannot_run_in_one_line():
    with pytest.raises(ConfigError, match="is one process.*torchrun --nproc_per_node 2"):
        layout_of(_cfg(), env={})
    with pytest.raises(ConfigError, match="leaves no learner.*at most 1"):
        layout_of(_cfg("algo.async.producers=2"), env={"WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match=r"2 producers and 3 learners do not divide.*one of \[1, 4\]"):
        layout_of(_cfg("algo.async.producers=2"), env={"WORLD_SIZE": "5"})
    with pytest.raises(ConfigError, match="do not split into 4 pieces"):
        layout_of(_cfg("algo.async.producers=4", "algo.rollout_batch_size=2", "algo.mini_batch_size=8"),
                  env={"WORLD_SIZE": "5"})
    lay = layout_of(_cfg("algo.async.producers=2"), env={"WORLD_SIZE": "3", "RANK": "2"})
    assert (lay.learners, lay.producers, lay.pieces, lay.is_learner) == (1, 2, 2, False)


def test_an_experience_crosses_as_plain_tensors_and_comes_back_the_same():
    g = torch.Generator().manual_seed(0)
    rollout = Rollout(prompt_ids=torch.randint(0, 50, (4, 3), generator=g), prompt_mask=torch.ones(4, 3).long(),
                      response_ids=torch.randint(0, 50, (4, 5), generator=g),
                      response_mask=torch.tensor([[1] * 5, [1, 1, 0, 0, 0], [1] * 5, [1, 0, 0, 0, 0]]),
                      ended=torch.tensor([False, True, False, True]), lengths=torch.tensor([5, 2, 5, 1]),
                      logprobs=-torch.rand(4, 5, generator=g))
    exp = Experience.of(rollout, [{"prompt": [{"role": "user", "content": "x"}], "answer": [1, None, "é"]}] * 4)
    exp.texts, exp.raw_scores = ["a", "b", "c", "d"], torch.tensor([1.0, math.nan, 0.5, 2.0])
    exp.valid, exp.reward_metrics = torch.tensor([True, False, True, True]), {"rewards/dropped": 1.0}
    back = experience_of(_loads(_dumps(experience_state(exp))), "cpu")  # weights_only: no object can travel
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "ended", "lengths", "logprobs"):
        assert torch.equal(getattr(back.rollout, name), getattr(rollout, name)), name
    assert back.rollout.action_mask is None and back.turn_rewards is None
    assert back.rows == exp.rows and back.texts == exp.texts and back.reward_metrics == exp.reward_metrics
    assert torch.equal(back.valid, exp.valid) and torch.equal(back.action, exp.action)
    assert torch.allclose(back.raw_scores, exp.raw_scores, equal_nan=True)
    assert torch.equal(back.position_ids, exp.position_ids)


def test_weights_travel_in_buckets_of_one_dtype_and_bounded_size():
    n = BUCKET_BYTES // 4  # float32 elements in one bucket
    params = [torch.zeros(n // 2), torch.zeros(n // 2), torch.zeros(3), torch.zeros(n + 1), torch.zeros(2)]
    dtypes = [torch.float32, torch.float32, torch.bfloat16, torch.float32, torch.float32]
    # [0, 1] fill one bucket; 2 is another dtype; 3 is bigger than a bucket: alone; 4 after it
    assert _buckets(params, dtypes) == [[0, 1], [2], [3], [4]]
    assert _buckets([], []) == []


def test_one_process_asking_for_async_gets_one_line_before_any_weights(tmp_path, monkeypatch):
    from rlhfkit.train.online.synchronous import run_online

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi"}\n' * 8)
    cfg = _cfg(f"data.train={data}", f"output_dir={tmp_path / 'out'}", "model.name=tiny:hidden=32,layers=1",
               "reward.functions=[{fn: exact_match}]")
    with pytest.raises(ConfigError, match="algo.async.max_staleness"):
        run_online(cfg)
    assert not (tmp_path / "out").exists()


def test_plan_says_which_online_mode_a_config_asks_for():
    from rlhfkit.plan import online_mode

    sync = build_config("grpo", {}, [])
    assert online_mode(sync, 1).status == "ok" and "synchronous" in online_mode(sync, 1).message
    assert "algo.async.max_staleness=1 would run" in online_mode(sync, 4).message
    one = online_mode(_cfg(), 1)
    assert one.status == "fail" and "is one process" in one.message
    three = online_mode(_cfg("algo.async.producers=2"), 3)
    assert three.status == "ok" and "1 learner(s) and 2 producer(s)" in three.message
