"""Policy losses of the online loop, one registry (``POLICY_LOSSES``, config key ``algo.policy_loss``).

Every entry has the same calling convention::

    fn(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, aggregation, max_len, log_ratio_clip,
       weights=None) -> (loss, stats)

logprobs (with grad), old_logprobs, mask: [B, T]; advantages: [B, T] or [B]; ``weights``: optional [B, T] per-token
factors without grad (the off-policy correction of :mod:`rlhfkit.algos.corrections`; ``None`` = 1) that multiply
the per-token loss before it is reduced by :func:`~rlhfkit.algos.losses.aggregate_loss`. stats are detached
scalars: clipfrac, approxkl, ratio_mean, ratio_var (token means over the mask).

- ``ppo``: token-level clipped ratio (Schulman et al. 2017, eq. 7; DAPO clip-higher):
  :func:`~rlhfkit.algos.losses.ppo_policy_loss` itself (padding masked before exp, log-ratio clamped).
- ``gspo``: one importance ratio per sequence, the length-normalised likelihood ratio
  s_i = exp(mean_t log(pi / pi_old)), clipped per sequence (Zheng et al. 2025, GSPO, eq. 5-7).
- ``gspo_token``: GSPO-token (Zheng et al. 2025, eq. 13-14): s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)] — the value
  of s_i, the gradient of the token's own log-prob — so per-token advantages are allowed.

GSPO uses the sequence advantage A_i = the masked mean of the row's advantages (exact for the group estimators,
whose advantage is the same at every token). Its per-sequence loss is spread over the row's tokens before the
aggregation, so ``seq_mean_token_mean`` gives the paper's mean over sequences (the ``gspo`` recipe's default).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlhfkit.algos.losses import _clipped, _stats, _weighted, aggregate_loss, ppo_policy_loss
from rlhfkit.algos.masked import masked_mean

Stats = dict[str, torch.Tensor]


def sequence_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor,
                       log_ratio_clip: float | None = 20.0) -> torch.Tensor:
    """GSPO's length-normalised sequence log-ratio log s_i = (1 / |y_i|) sum_t log(pi / pi_old) (Zheng et al. 2025,
    eq. 7). [B, T] -> [B] (0 for a row without tokens); clamped to [-c, c] as the PPO log-ratio is, since its exp
    overflows float32 beyond 88 (nothing changes inside the clamp)."""
    log_s = masked_mean(logprobs - old_logprobs, mask, dim=-1)
    return log_s if log_ratio_clip is None else log_s.clamp(-log_ratio_clip, log_ratio_clip)


def _sequence_advantage(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return advantages if advantages.dim() == 1 else masked_mean(advantages, mask, dim=-1)


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float | None = 4e-4,
    aggregation: str = "seq_mean_token_mean",
    max_len: int | None = None,
    log_ratio_clip: float | None = 20.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """GSPO: max(-A_i s_i, -A_i clip(s_i, 1 - lo, 1 + hi)) per sequence, s_i = exp(mean_t log pi / pi_old)
    (Zheng et al. 2025, eq. 5-7); the sequence loss is placed on each of its tokens, then aggregated.

    Shapes in the module doc; ``advantages`` [B, T] are reduced to one per row by their masked mean.
    """
    log_s = sequence_log_ratio(logprobs, old_logprobs, mask, log_ratio_clip)  # [B]
    s = torch.exp(log_s)
    per_seq, was_clipped = _clipped(s, _sequence_advantage(advantages, mask), clip_low, clip_high)
    per_token = per_seq.unsqueeze(-1).expand_as(logprobs)
    loss = aggregate_loss(_weighted(per_token, weights), mask, aggregation, max_len)
    B_T = logprobs.shape
    return loss, _stats(s.unsqueeze(-1).expand(B_T), log_s.unsqueeze(-1).expand(B_T),
                        was_clipped.unsqueeze(-1).expand(B_T), mask)


def gspo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float | None = 4e-4,
    aggregation: str = "seq_mean_token_mean",
    max_len: int | None = None,
    log_ratio_clip: float | None = 20.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """GSPO-token: s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)], loss max(-A_t s_{i,t}, -A_t clip(s_{i,t})) per token
    (Zheng et al. 2025, eq. 13-14). Equals :func:`gspo_loss` in value and gradient when A is constant per row.

    Shapes in the module doc.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    log_s = sequence_log_ratio(logprobs, old_logprobs, mask, log_ratio_clip).detach()  # [B], no gradient via s_i
    log_ratio = logprobs - logprobs.detach() + log_s.unsqueeze(-1)  # value log s_i, gradient d log pi(y_t)
    ratio = torch.exp(log_ratio)
    per_token, was_clipped = _clipped(ratio, advantages, clip_low, clip_high)
    loss = aggregate_loss(_weighted(per_token, weights), mask, aggregation, max_len)
    return loss, _stats(ratio, log_ratio, was_clipped, mask)


PolicyLossFn = Callable[..., tuple[torch.Tensor, Stats]]

POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "ppo": ppo_policy_loss,
    "gspo": gspo_loss,
    "gspo_token": gspo_token_loss,
}
