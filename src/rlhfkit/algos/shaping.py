"""DAPO's reward shaping and batch shaping (Yu et al. 2025): the soft overlong penalty, and dynamic sampling, which
over-samples prompts and keeps only groups whose rewards differ (a tied group has zero group-relative advantage,
so it carries no learning signal).

Layout: a rollout of P prompts with k completions each is completion-major, row j * P + p is completion j of prompt
p (as everywhere in the online loop, see :func:`~rlhfkit.algos.advantages.group_all_tied`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlhfkit.algos.advantages import group_all_tied


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int, factor: float = 1.0) -> torch.Tensor:
    """Soft overlong punishment (DAPO, Yu et al. 2025, eq. 13): 0 up to max_len - cache_len tokens, then a linear
    ramp ((max_len - cache_len) - L) / cache_len down to -1 at max_len, -1 beyond; times ``factor``.

    lengths: [B] response lengths -> [B] float penalties (<= 0). ``cache_len`` 0 gives zeros.
    """
    lengths = lengths.float()
    if cache_len <= 0:
        return torch.zeros_like(lengths)
    if cache_len > max_len:
        raise ValueError(f"cache_len {cache_len} exceeds max_len {max_len}")
    start = max_len - cache_len
    ramp = (start - lengths) / cache_len
    pen = torch.where(lengths <= start, torch.zeros_like(lengths), ramp.clamp(min=-1.0))
    return factor * pen


@dataclass
class DynamicSample:
    """What :func:`dynamic_sample` chose: ``groups`` a list of (draw, prompt index), the draws' results, and
    counts: draws made, degenerate (tied) groups seen, degenerate groups used to fill the batch at the cap."""

    groups: list[tuple[int, int]]
    results: list = field(default_factory=list)
    draws: int = 0
    degenerate: int = 0
    filled: int = 0


def dynamic_sample(draw: Callable[[int], tuple[object, torch.Tensor, torch.Tensor | None]], need: int,
                   group_size: int, max_draws: int, atol: float = 0.0) -> DynamicSample:
    """DAPO dynamic sampling (Yu et al. 2025, eq. 11): call ``draw(j)`` (j = 0, 1, ...) — it returns (result,
    scores [k * P], valid [k * P] bool or None) for a fresh batch of P prompts — and keep the groups whose valid
    members' scores differ (:func:`~rlhfkit.algos.advantages.group_all_tied`, the test ``filter_tied_groups`` uses
    too) until ``need`` groups are kept, or ``max_draws`` draws were made. At the cap, the batch is filled with tied
    groups (in draw order), so its size never changes; ``filled`` says how many.
    """
    if need < 1 or max_draws < 1:
        raise ValueError("need and max_draws must be >= 1")
    out = DynamicSample(groups=[])
    spare: list[tuple[int, int]] = []
    while len(out.groups) < need and out.draws < max_draws:
        result, scores, valid = draw(out.draws)
        tied = group_all_tied(scores, group_size, atol, valid).reshape(group_size, -1)[0].tolist()
        for p, is_tied in enumerate(tied):
            if is_tied:
                spare.append((out.draws, p))
            elif len(out.groups) < need:
                out.groups.append((out.draws, p))
        out.degenerate += sum(tied)
        out.results.append(result)
        out.draws += 1
    missing = need - len(out.groups)
    if missing > 0:
        out.groups.extend(spare[:missing])
        out.filled = min(missing, len(spare))
    return out


def turn_reward_shift(turn_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-turn credit for multi-turn episodes: each turn's reward on the turn's last token, taken off the episode's
    last token (where the episode score, which includes it, is placed). turn_rewards, mask: [B, T] -> [B, T], 0 off
    the mask; every row sums to 0, so estimators that use only the sequence's total (GRPO, RLOO) are unchanged
    while token-level ones (GAE, REINFORCE++) credit each reward to the turn that earned it.
    """
    valid = mask.bool()
    kept = torch.where(valid, turn_rewards, torch.zeros_like(turn_rewards))
    positions = torch.arange(valid.shape[-1], device=valid.device).expand_as(valid)
    last = torch.where(valid, positions, torch.zeros_like(positions)).amax(-1, keepdim=True)
    total = torch.zeros_like(kept).scatter(-1, last, kept.sum(-1, keepdim=True))
    return torch.where(valid, kept - total, torch.zeros_like(kept))


class RunningMoments:
    """Running mean / std of scores over all processes (Chan et al. parallel update), for reward normalisation."""

    def __init__(self):
        self.mean, self.var, self.count = 0.0, 1.0, 0

    def update(self, x: torch.Tensor) -> None:
        n, mean, var = x.numel(), x.mean().item(), x.var(unbiased=False).item() if x.numel() > 1 else 0.0
        total = self.count + n
        delta = mean - self.mean
        self.var = (self.var * self.count + var * n + delta**2 * self.count * n / total) / total
        self.mean += delta * n / total
        self.count = total

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / math.sqrt(max(self.var, 1e-8))

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]
