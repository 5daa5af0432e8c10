"""The reward-collapse rule of :mod:`rlhfkit.track.health` (a pure function over this step's metrics and the values
seen at earlier checks, as every rule there): the scores fell and stay down, beyond the noise of the steps, in one of
two shapes: a slide of the rolling means, or a fall from the level before (:func:`_level_shift`). Kept in its own
module for its statistics; :data:`rlhfkit.track.health.RULES` names it ``reward_collapse`` (critical)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .console import format_number as fmt

COLLAPSE_Z = 3.0  # standard errors a fall of the scores must pass (reward_collapse)
History = Mapping[str, Sequence[float]]


def _rolling_means(values: Sequence[float], w: int) -> list[float]:
    return [sum(values[i: i + w]) / w for i in range(len(values) - w + 1)]


def reward_collapse(m: dict[str, float], prev: History, mon: Any) -> str | None:
    """The scores fell and stay down (``mon``: the :class:`~rlhfkit.track.health.HealthMonitor`, for its window and
    batch size), beyond what the noise of the steps allows; silent while the held-out score
    (``eval/scores``) is at its best (a policy getting better on held-out prompts is not unlearning, whatever its
    training batches scored). Two shapes, each judged against the step noise (read from the scores' step-to-step
    differences, which a slow trend hardly moves: 8 samples a step, a score that jumps by 0.2 between steps, needs a
    far larger fall than 512):

    - a slide: the mean of the last ``window`` scores fell from its best by more than half of max(|best|, 2 std)
      and by more than :data:`COLLAPSE_Z` standard errors of the difference of two ``window``-step means, plus the
      allowance for having picked the best of many means (sqrt(2 ln N));
    - a fall (:func:`_level_shift`): the last 3 to ``window`` scores all lie below the halfway line between the
      level before them and that level's half, as a whole more than :data:`COLLAPSE_Z` standard errors (plus the
      same allowance) below it, the noise read within the two stretches (the one step of the fall excluded) and
      taken at its 95% upper bound, never below the scores' granularity: scores of 0.95, 0.96, then 0.0 are named on
      the third 0.0, where the slide's means have too little past to judge."""
    score = m.get("objective/scores")
    if score is None or not math.isfinite(score):
        return None
    values = list(prev.get("objective/scores", [])) + [score]
    evals = list(prev.get("eval/scores", [])) + ([m["eval/scores"]] if "eval/scores" in m else [])
    if len(evals) >= 2 and evals[-1] >= max(evals[:-1]):
        return None
    w, fix = mon.window, ("the policy is unlearning (often after a KL blow-up or reward hacking); lower optim.lr, "
                          "raise algo.kl.coef, and check the samples")
    shift = _level_shift(values, w, mon.batch_size)
    if shift is not None:
        before, now, k, noise = shift
        return (f"objective/scores collapsed: the last {k} steps average {fmt(now)} after {fmt(before)} before them "
                f"(the steps vary by about {fmt(noise)}); {fix}")
    if len(values) < 2 * w:
        return None
    means = _rolling_means(values, w)
    best, now = max(means), means[-1]
    scale = max(abs(best), 2 * statistics.pstdev(values))
    noise = math.sqrt(sum((b - a) ** 2 for a, b in zip(values, values[1:])) / (2 * (len(values) - 1)))
    allowed = (COLLAPSE_Z + math.sqrt(2 * math.log(len(means)))) * noise * math.sqrt(2 / w)
    if scale > 0 and best - now > 0.5 * scale and best - now > allowed:
        return (f"objective/scores collapsed: mean of the last {w} steps {fmt(now)} vs best {fmt(best)} (the steps "
                f"vary by about {fmt(noise)}); {fix}")
    return None


def _level_shift(values: Sequence[float], w: int, batch: int | None = None
                 ) -> tuple[float, float, int, float] | None:
    """A fall of the last ``k`` (3..``w``) values from the (up to ``4 w``) before them (:func:`reward_collapse`):
    (level before, level now, k, step noise) for the first ``k`` that passes, None when none does. The noise is never
    taken below what the scores' granularity implies: for scores in [0, 1] over ``batch`` samples a step, the
    binomial standard error of the level; otherwise half the smallest step between two scores seen (0 / 1 rewards over
    8 samples move by 0.125: 0.125, 0.125, 0, 0, 0 is one sample's luck, where 0.95, 0.96, 0, 0, 0 is not)."""
    n = len(values)
    diffs = [b - a for a, b in zip(values, values[1:])]
    steps = [abs(d) for d in diffs if abs(d) > 1e-12]
    bounded = batch and all(0.0 <= v <= 1.0 for v in values)
    for k in range(3, w + 1):
        split = n - k
        before, after = values[max(0, split - 4 * w): split], values[split:]
        if len(before) < 2:
            break
        level, now = statistics.fmean(before), statistics.fmean(after)
        line = level - 0.25 * abs(level)  # halfway between the level and its half
        if not (level - now > 0.5 * abs(level) and max(after) < line):
            continue
        within = [d for i, d in enumerate(diffs) if i != split - 1]  # the step of the fall itself excluded
        noise = math.sqrt(sum(d * d for d in within) / (2 * len(within))) if within else 0.0
        # a few steps tell the noise badly (8-sample scores repeat): judged against its 95% upper bound
        # (chi-square with len(within) degrees of freedom, Wilson-Hilferty), not against the estimate
        df = len(within)
        low = df * max(1e-6, 1 - 2 / (9 * df) - 1.645 * math.sqrt(2 / (9 * df))) ** 3 if df else 0.0
        bound = noise * math.sqrt(df / low) if low > 0 else math.inf
        p = min(1.0, max(0.0, level))
        floor = math.sqrt(max(p * (1 - p), 1 / batch) / batch) if bounded else (min(steps) / 2 if steps else 0.0)
        bound = max(bound, floor)
        allowed = (COLLAPSE_Z + math.sqrt(2 * math.log(n))) * bound * math.sqrt(1 / len(before) + 1 / k)
        if level - now > allowed:
            return level, now, k, noise
    return None


