"""The online step's rollout metrics in one gather (``train/online/step_metrics.py``) equal the metrics computed one by
one
over every process's samples (the former eight gathers), here with two simulated processes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlhfkit import algos
from rlhfkit.train.online.step_metrics import rollout_metrics


def _exp(seed: int, n: int = 8, t: int = 5):
    g = torch.Generator().manual_seed(seed)
    action = (torch.rand(n, t, generator=g) > 0.3).float()
    scores = torch.randint(0, 2, (n,), generator=g).float()
    return SimpleNamespace(action=action, old_logprobs=-torch.rand(n, t, generator=g), kl=torch.rand(n, t, generator=g),
                           raw_scores=scores + 0.5, scores=scores, valid=torch.ones(n, dtype=torch.bool),
                           rollout=SimpleNamespace(ended=torch.rand(n, generator=g) > 0.5,
                                                   lengths=torch.randint(1, t + 1, (n,), generator=g),
                                                   prompt_mask=(torch.rand(n, 3, generator=g) > 0.2).long()))


class TwoProcesses:
    """An accelerator of process 0 whose gather appends process 1's rows (``other``), and counts the gathers."""

    num_processes = 2

    def __init__(self, other: torch.Tensor):
        self.other, self.gathers = other, 0

    def gather(self, x):
        self.gathers += 1
        return torch.cat([x, self.other])


def test_one_gather_gives_the_metrics_of_every_sample():
    a, b = _exp(0), _exp(1)
    kwargs = dict(kl_coef=0.1, kl_in_reward=True, group_size=4, group_based=True)
    sent = {}  # process 1's stacked columns, as rollout_metrics gives them to its gather
    rollout_metrics(SimpleNamespace(num_processes=2, gather=lambda x: sent.setdefault("rows", x)), b, **kwargs)
    acc = TwoProcesses(sent["rows"])
    got = rollout_metrics(acc, a, **kwargs)
    assert acc.gathers == 1  # one collective for the whole step

    cat = lambda f: torch.cat([f(a), f(b)])  # noqa: E731 - every sample of both processes
    entropy = cat(lambda e: (-e.old_logprobs * e.action).sum(-1))
    rlhf = cat(lambda e: e.scores - (0.1 * e.kl * e.action).sum(-1))
    lengths = cat(lambda e: e.rollout.lengths.float())
    tied = cat(lambda e: algos.group_all_tied(e.scores, 4, valid=e.valid).float())
    ended = cat(lambda e: e.rollout.ended)
    scores = cat(lambda e: e.raw_scores)
    done = [n for n, x in zip(lengths.tolist(), ended.tolist()) if x]  # TRL: the lengths of the answers that ended
    expected = {
        "objective/scores": scores.mean().item(),
        "objective/scores_std": scores.std().item(),
        "objective/entropy": entropy.mean().item(),
        "objective/rlhf_reward": rlhf.mean().item(),
        "val/num_eos_tokens": float(ended.float().sum()),
        "val/eos_frac": ended.float().mean().item(),
        "response/clipped_frac": 1 - ended.float().mean().item(),
        "response/length_mean": lengths.mean().item(),
        "response/length_std": lengths.std().item(),
        "response/length_min": min(lengths.tolist()),
        "response/length_max": max(lengths.tolist()),
        "response/terminated_length_mean": sum(done) / len(done),
        "response/terminated_length_min": min(done),
        "response/terminated_length_max": max(done),
        "tokens/step": float(cat(lambda e: e.rollout.prompt_mask.sum(-1) + e.rollout.lengths).sum()),
        "rewards/tied_groups_frac": tied.mean().item(),
    }
    assert got == pytest.approx(expected, rel=1e-6)


def test_one_process_needs_no_gather_and_skips_tied_groups_without_groups():
    acc = SimpleNamespace(num_processes=1, gather=None)
    got = rollout_metrics(acc, _exp(2), kl_coef=0.1, kl_in_reward=False, group_size=1, group_based=False)
    assert "rewards/tied_groups_frac" not in got
    e = _exp(2)
    assert got["objective/rlhf_reward"] == pytest.approx(e.scores.mean().item())  # no KL in the reward
    assert got["val/num_eos_tokens"] == float(e.rollout.ended.sum())


def test_clipped_fraction_counts_kept_scores_at_the_clip():
    e = _exp(3)
    e.scores = torch.tensor([10.0, -10.0, 9.99, 0.0, -12.0, 10.0, 3.0, 10.0])  # shaped scores after the clip
    e.valid = torch.tensor([True, True, True, True, True, True, True, False])  # the last was dropped
    acc = SimpleNamespace(num_processes=1, gather=None)
    got = rollout_metrics(acc, e, kl_coef=0.0, kl_in_reward=False, group_size=4, group_based=True, clip=10.0)
    assert got["rewards/clipped_frac"] == pytest.approx(4 / 8)  # 10, -10, -12, 10 of the 8 (not 9.99, not dropped)
    assert got["rewards/tied_groups_frac"] == pytest.approx(0.0)  # the tied column keeps its place beside it
    assert "rewards/clipped_frac" not in rollout_metrics(acc, e, kl_coef=0.0, kl_in_reward=False, group_size=4,
                                                         group_based=True)  # reward.clip=null: not logged
    e.valid = None  # an experience before any sample was dropped
    assert rollout_metrics(acc, e, kl_coef=0.0, kl_in_reward=False, group_size=1, group_based=False,
                           clip=10.0)["rewards/clipped_frac"] == pytest.approx(5 / 8)


def test_kl_per_token_is_the_token_weighted_mean_over_every_process():
    # TRL 1.16's kl: sum of the per-token KL over every response token of the step / their count. Two processes of
    # two answers each, with masks of different sizes: the per-process per-token means (1.0 / 4, 0.6 / 7) would
    # average to 0.168; the global figure is 1.6 / 11 = 0.145.
    from rlhfkit.train.shared.batches import kl_per_token

    kl = [torch.tensor([[0.1, 0.2, 0.0, 0.0], [0.4, 0.3, 0.0, 0.0]]),
          torch.tensor([[0.1, 0.1, 0.1, 0.0], [0.1, 0.1, 0.0, 0.1]])]
    mask = [torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0]]), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])]
    per = [{"objective/kl": float((k * m).sum(-1).mean()), "objective/kl_tokens": float(m.sum(-1).float().mean())}
           for k, m in zip(kl, mask)]  # what Learner.kl_metrics gives on each process
    reduced = {key: (per[0][key] + per[1][key]) / 2 for key in per[0]}  # reduce_metrics: the mean of processes
    got = kl_per_token(dict(reduced))
    want = float(sum((k * m).sum() for k, m in zip(kl, mask)) / sum(m.sum() for m in mask))
    assert want == pytest.approx(1.6 / 11)
    assert got["objective/kl_per_token"] == pytest.approx(want, rel=1e-6)
    assert got["objective/kl"] == reduced["objective/kl"] and "objective/kl_tokens" not in got
    empty = kl_per_token({"objective/kl": 0.0, "objective/kl_tokens": 0.0})  # every answer masked out
    assert empty == {"objective/kl": 0.0, "objective/kl_per_token": 0.0}
    assert kl_per_token({"loss": 1.0}) == {"loss": 1.0}  # a step without a KL (no reference) gets none
