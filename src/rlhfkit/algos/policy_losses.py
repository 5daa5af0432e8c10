"""Policy losses of the online loop, one registry (``POLICY_LOSSES``, config key ``algo.policy_loss``).

Every loss is a pure function with the same inputs and its own settings as keyword arguments::

    fn(logprobs, old_logprobs, advantages, mask, *, <its settings>, aggregation, max_len, log_ratio_clip,
       weights=None) -> (loss, stats)

logprobs (with grad), old_logprobs, mask: [B, T]; advantages: [B, T] or [B]; ``weights``: optional [B, T] per-token
factors without grad (the off-policy correction of :mod:`rlhfkit.algos.corrections`; ``None`` = 1) that multiply
the per-token loss before it is reduced by :func:`~rlhfkit.algos.losses.aggregate_loss`. stats are detached
scalars: clipfrac, approxkl, ratio_mean, ratio_var (token means over the mask).

The registry holds a :class:`PolicyLoss` per name: the function and the name of its config section
(``algo.<section>``, a frozen dataclass whose fields are the function's own keywords, with the paper's defaults).
The loop calls ``spec(logprobs, old_logprobs, advantages, mask, section, aggregation=..., max_len=...,
weights=...)`` and never names a loss; the keywords every loss shares (aggregation, max_len, log_ratio_clip,
weights) are the loop's.

- ``ppo`` (section ``ppo``): token-level clipped ratio (Schulman et al. 2017, eq. 7; DAPO clip-higher),
  :func:`ppo_policy_loss` (padding masked before exp, log-ratio clamped).
- ``gspo`` (section ``gspo``): one importance ratio per sequence, the length-normalised likelihood ratio
  s_i = exp(mean_t log(pi / pi_old)), clipped per sequence (Zheng et al. 2025, GSPO, eq. 5-7).
- ``gspo_token`` (section ``gspo``): GSPO-token (Zheng et al. 2025, eq. 13-14): s_{i,t} = sg[s_i] * pi(y_t) /
  sg[pi(y_t)] — the value of s_i, the gradient of the token's own log-prob — so per-token advantages are allowed.

- ``cispo`` (section ``cispo``): the token IS weight clipped and *detached*, multiplying the log-prob
  (MiniMax-M1, MiniMax et al. 2025, eq. 4-5): a clipped weight scales a token's gradient and never drops it.
- ``sapo`` (section ``sapo``): a smooth gate (4 / tau) sigmoid(tau (r - 1)) in place of the hard clip, tau_pos /
  tau_neg by the advantage's sign (SAPO, Gao et al. 2025): off-policy tokens are damped, none is cut off.
- ``gmpo`` (section ``gmpo``): the geometric mean of the token ratios per sequence, each log-ratio clipped in log space
  (GMPO, Zhao et al. 2025): one outlying token moves the sequence's ratio less than in the arithmetic mean.

- ``dppo`` (section ``dppo``): DPPO (Divergence PPO, "Rethinking the Trust Region in LLM RL", arXiv 2602.04879): the
  trust region is a divergence between the token distributions, not the sampled token's ratio; a token whose update
  moves it further out of the region is masked, the rest get the detached IS weight times log pi (as CISPO). The
  divergence is the paper's *binary* approximation (the distributions collapsed to {sampled token, the rest}), which
  needs only the sampled token's log-probs: the registry's calling convention is kept (see :func:`dppo_loss`).
- ``vespo`` (section ``vespo``): VESPO (arXiv 2602.10693, TRL ``loss_type="vespo"``): the sequence IS ratio W
  reshaped by a Gamma kernel phi(W) = W^k exp(lambda (1 - W)), detached, times A log pi; no hard clip.
- ``luspo`` (section ``luspo``): LUSPO (arXiv 2602.05261, TRL ``loss_type="luspo"``): GSPO with each sequence's loss
  scaled by its length, which removes GSPO's bias against long responses.

GSPO, LUSPO and GMPO use the sequence advantage A_i = the masked mean of the row's advantages (exact for the group
estimators, whose advantage is the same at every token). Their per-sequence loss is spread over the row's tokens before
the aggregation, so ``seq_mean_token_mean`` gives the papers' mean over sequences (the ``gspo`` recipe's default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.algos.losses import aggregate_loss
from rlhfkit.algos.masked import masked_count, masked_mean, masked_quantile, masked_sum, masked_var, zero_outside

Stats = dict[str, torch.Tensor]
_MAX_LOG = 20.0  # the clamp of a log-ratio when log_ratio_clip is None and an exp must still stay finite
PolicyLossFn = Callable[..., tuple[torch.Tensor, Stats]]


# ──────────────────────────────────────────── shared by the clipped losses ────────────────────────────────────────────
def clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """max(-A r, -A clip(r, 1 - lo, 1 + hi)) and whether the clipped term was taken (Schulman et al. 2017, eq. 7).

    ratio, adv: broadcastable tensors -> (per-element loss, bool of the same shape). ``clip_high=None`` = clip_low.
    """
    clip_high = clip_low if clip_high is None else clip_high
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def ratio_stats(ratio: torch.Tensor, log_ratio: torch.Tensor, was_clipped: torch.Tensor, mask: torch.Tensor) -> Stats:
    """The detached stats of a ratio loss, token means over ``mask`` ([B, T] each): clipfrac, approxkl
    = 0.5 * mean(log r^2), ratio_mean, ratio_var (unbiased)."""
    with torch.no_grad():
        return {"clipfrac": masked_mean(was_clipped.float(), mask),
                "approxkl": 0.5 * masked_mean(log_ratio.detach().square(), mask),
                "ratio_mean": masked_mean(ratio.detach(), mask),
                "ratio_var": masked_var(ratio.detach(), mask)}


def clip_fractions(ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip_low: float,
                   clip_high: float | None) -> Stats:
    """Where the clip bound the update, split by side (TRL's ``clip_ratio/low_mean`` and ``high_mean``): the token
    mean over ``mask`` of ``r < 1 - e_lo`` with a negative advantage (the loss would push r lower: clipped) and of
    ``r > 1 + e_hi`` with a positive one. ratio, advantages, mask: [B, T] (advantages broadcast)."""
    clip_high = clip_low if clip_high is None else clip_high
    with torch.no_grad():
        low = (ratio < 1.0 - clip_low) & (advantages < 0)
        high = (ratio > 1.0 + clip_high) & (advantages > 0)
        return {"clip_low_frac": masked_mean(low.float(), mask), "clip_high_frac": masked_mean(high.float(), mask)}


def token_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                    log_ratio_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, log r) of a token-ratio loss: advantages [B, T] (or [B] -> [B, 1]) and log r = log pi - log pi_old
    [B, T], both 0 outside ``mask`` before any arithmetic (NaN / inf in padding reaches neither the loss nor the
    gradient; padding gets r = 1), log r clamped to [-c, c] (as verl, c = 20: e^x is inf in float32 beyond 88;
    nothing changes inside the clamp)."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    valid = mask.bool()
    log_ratio = zero_outside(logprobs - old_logprobs, valid)
    if log_ratio_clip is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    return zero_outside(advantages, valid), log_ratio


def weighted(per_token: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """``per_token`` times the off-policy weights (no gradient through them); ``None`` leaves it unchanged."""
    return per_token if weights is None else per_token * weights.detach()


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_quantile: float,
                      pool: torch.Tensor | None = None) -> torch.Tensor:
    """The tokens whose policy loss counts under "Beyond the 80/20 rule" (Wang et al. 2025, arXiv 2506.01939; TRL's
    ``top_entropy_quantile``): those in ``mask`` whose entropy is at least the (1 - ``top_quantile``)-quantile of
    ``pool``, the entropies the threshold is taken over (default: ``entropy`` over ``mask``; a run of several
    processes passes every process's, as TRL gathers them). ``top_quantile=0.2`` keeps the 20% most uncertain
    tokens, the "forking" ones; 1 keeps every token of ``mask``; 0 only the highest-entropy one(s). Tied entropies
    at the threshold are all kept, so more than the fraction can pass. The quantile interpolates linearly
    (:func:`~rlhfkit.algos.masked.masked_quantile`, as ``torch.quantile`` in TRL).

    entropy, mask: [B, T] -> bool [B, T] (False outside ``mask``, and everywhere for an empty pool); no gradient.
    The caller multiplies the per-token policy loss by it before the loss is reduced over ``mask``, as TRL does:
    masked tokens still count in the normaliser, and the KL term is not masked.
    """
    if not 0.0 <= top_quantile <= 1.0:
        raise ValueError(f"top_quantile={top_quantile} outside [0, 1]")
    valid = mask.bool()
    if top_quantile >= 1.0:
        return valid.clone()
    with torch.no_grad():
        threshold = masked_quantile(entropy, valid, 1.0 - top_quantile) if pool is None \
            else masked_quantile(pool, None, 1.0 - top_quantile)
        if torch.isnan(threshold):
            return torch.zeros_like(valid)
        return valid & (entropy.float() >= threshold)  # padding (NaN / inf there too) is out by ``valid``


# ───────────────────────────────────────────────────── the losses ─────────────────────────────────────────────────────
def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    aggregation: str = "token_mean",
    max_len: int | None = None,
    log_ratio_clip: float | None = 20.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """PPO clipped surrogate max(-A r, -A clip(r, 1 - e_lo, 1 + e_hi)) (Schulman et al. 2017 eq. 7; DAPO clip-higher).

    logprobs, old_logprobs, mask: [B, T]; advantages: [B, T] or [B] (one per sequence, broadcast over tokens).
    ``clip_high=None`` uses ``clip_low``. Reduced with :func:`aggregate_loss` (``aggregation``, ``max_len``).
    ``log_ratio_clip``: log r is clamped to [-c, c] before exp (as verl, c = 20: e^20 ~ 5e8), since e^x is inf in
    float32 beyond 88; inside the clamp nothing changes. Masked positions (and their advantages) are set to 0 before
    any arithmetic, so NaN / inf in padding reaches neither the loss nor the gradient.
    stats (token means over masked tokens): clipfrac (clipped term chosen: pg_losses2 > pg_losses1),
    approxkl = 0.5 * mean((logp - old)^2), ratio_mean, ratio_var (unbiased, over masked tokens), clip_low_frac /
    clip_high_frac (:func:`clip_fractions`).
    ``weights`` (optional [B, T], no gradient): per-token factors on the loss before it is reduced (the off-policy
    correction).
    """
    advantages, log_ratio = token_log_ratio(logprobs, old_logprobs, advantages, mask, log_ratio_clip)
    ratio = torch.exp(log_ratio)
    per_token, was_clipped = clipped_surrogate(ratio, advantages, clip_low, clip_high)
    loss = aggregate_loss(weighted(per_token, weights), mask, aggregation, max_len)
    advantages = advantages.expand_as(ratio)
    return loss, {**ratio_stats(ratio, log_ratio, was_clipped, mask),
                  **clip_fractions(ratio, advantages, mask, clip_low, clip_high)}


def sequence_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor,
                       log_ratio_clip: float | None = 20.0) -> torch.Tensor:
    """GSPO's length-normalised sequence log-ratio log s_i = (1 / |y_i|) sum_t log(pi / pi_old) (Zheng et al. 2025,
    eq. 7). [B, T] -> [B] (0 for a row without tokens); clamped to [-c, c] as the PPO log-ratio is, since its exp
    overflows float32 beyond 88 (nothing changes inside the clamp)."""
    log_s = masked_mean(logprobs - old_logprobs, mask, dim=-1)
    return log_s if log_ratio_clip is None else log_s.clamp(-log_ratio_clip, log_ratio_clip)


def _sequence_advantage(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return advantages if advantages.dim() == 1 else masked_mean(advantages, mask, dim=-1)


def _clipped_sequence(logprobs, old_logprobs, advantages, mask, clip_low, clip_high, log_ratio_clip):
    """GSPO's per-sequence terms: (loss max(-A_i s_i, -A_i clip(s_i)) [B], s [B], log s [B], clipped [B] bool)."""
    log_s = sequence_log_ratio(logprobs, old_logprobs, mask, log_ratio_clip)  # [B]
    s = torch.exp(log_s)
    per_seq, was_clipped = clipped_surrogate(s, _sequence_advantage(advantages, mask), clip_low, clip_high)
    return per_seq, s, log_s, was_clipped


def _sequence_stats(s, log_s, was_clipped, mask) -> Stats:
    """:func:`ratio_stats` of a per-sequence ratio, each row's value counted once per token."""
    B_T = mask.shape
    return ratio_stats(s.unsqueeze(-1).expand(B_T), log_s.unsqueeze(-1).expand(B_T),
                       was_clipped.unsqueeze(-1).expand(B_T), mask)


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
    per_seq, s, log_s, was_clipped = _clipped_sequence(logprobs, old_logprobs, advantages, mask, clip_low, clip_high,
                                                       log_ratio_clip)
    per_token = per_seq.unsqueeze(-1).expand_as(logprobs)
    loss = aggregate_loss(weighted(per_token, weights), mask, aggregation, max_len)
    return loss, _sequence_stats(s, log_s, was_clipped, mask)


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
    per_token, was_clipped = clipped_surrogate(ratio, advantages, clip_low, clip_high)
    loss = aggregate_loss(weighted(per_token, weights), mask, aggregation, max_len)
    return loss, ratio_stats(ratio, log_ratio, was_clipped, mask)


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float | None = None,
    clip_high: float | None = 4.0,
    aggregation: str = "token_mean",
    max_len: int | None = None,
    log_ratio_clip: float | None = 20.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """CISPO: -sg(r_hat) * A * log pi per token, r_hat = clip(r, 1 - e_lo, 1 + e_hi), r = pi / pi_old
    (MiniMax-M1, MiniMax et al. 2025, arXiv 2506.13585, eq. 4-5).

    Shapes in the module doc. The weight carries no gradient, so d loss / d log pi(y_t) = -A_t * r_hat_t: every
    token keeps its gradient, only its size is bounded (PPO's clip zeroes the gradient of a token outside the band).
    ``clip_low=None``: no lower bound (the paper: "we did not impose a lower bound"); ``clip_high=None``: no upper
    bound. With no clipping and r = 1 the gradient is REINFORCE's, -A * grad log pi. The paper reduces with a
    token mean over the group (``aggregation="token_mean"``). Padding (log-probs, advantages) is set to 0 before any
    arithmetic; the log-ratio is clamped to [-c, c] before exp as in :func:`ppo_policy_loss`.
    stats: clipfrac (tokens whose weight was clipped), approxkl, ratio_mean, ratio_var of the unclipped r.
    """
    advantages, log_ratio = token_log_ratio(logprobs.detach(), old_logprobs, advantages, mask, log_ratio_clip)
    ratio = torch.exp(log_ratio)  # the weight has no gradient
    logprobs = zero_outside(logprobs, mask.bool())
    low = None if clip_low is None else 1.0 - clip_low
    high = None if clip_high is None else 1.0 + clip_high
    weight = ratio if low is None and high is None else ratio.clamp(low, high)
    per_token = -advantages * weight * logprobs
    loss = aggregate_loss(weighted(per_token, weights), mask, aggregation, max_len)
    return loss, ratio_stats(ratio, log_ratio, weight != ratio, mask)


def sapo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    aggregation: str = "seq_mean_token_mean",
    max_len: int | None = None,
    log_ratio_clip: float | None = 20.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """SAPO: -f(r) * A per token, f(r) = (4 / tau) * sigmoid(tau * (r - 1)), r = pi / pi_old, tau = tau_pos where
    A > 0 and tau_neg elsewhere (Soft Adaptive Policy Optimization, Gao et al. 2025 (Qwen), arXiv 2511.20347).

    Shapes in the module doc. A smooth gate in place of the hard clip: d loss / d log pi(y_t) = -A_t * w_t * r_t with
    w = 4 sigma(tau (r - 1)) (1 - sigma(tau (r - 1))), which is 1 on-policy (r = 1) and decays smoothly as r leaves 1,
    faster for a larger tau; the paper's tau_neg > tau_pos damps the negative-advantage tokens sooner. Limits: tau -> 0
    gives w -> 1, the unclipped importance-weighted gradient -A r grad log pi (the value is that of -A (r - 1) plus
    -2 A / tau, a constant); tau -> inf gives w -> 0 for every r != 1 (only on-policy tokens move). The paper averages
    over each sequence's tokens, then over the group (``aggregation="seq_mean_token_mean"``).
    Departures: padding is set to 0 and the log-ratio clamped to [-c, c] before exp, as in :func:`ppo_policy_loss`.
    stats: clipfrac = the token mean of 1 - w (0 on-policy, 1 where the gate has closed; SAPO clips nothing),
    approxkl, ratio_mean, ratio_var of r.
    """
    advantages, log_ratio = token_log_ratio(logprobs, old_logprobs, advantages, mask, log_ratio_clip)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, ratio.new_tensor(tau_pos), ratio.new_tensor(tau_neg)).expand_as(ratio)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    per_token = -advantages * gate * (4.0 / tau)
    loss = aggregate_loss(weighted(per_token, weights), mask, aggregation, max_len)
    closed = 1.0 - 4.0 * gate.detach() * (1.0 - gate.detach())
    return loss, ratio_stats(ratio, log_ratio, closed, mask)


def gmpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.4,
    clip_high: float | None = 0.4,
    aggregation: str = "seq_mean_token_mean",
    max_len: int | None = None,
    log_ratio_clip: float | None = 20.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """GMPO: -A_i * exp(mean_t l_{i,t}) per sequence, the geometric mean of the token ratios with each log-ratio
    clipped pessimistically in log space, l = sgn(A) min(sgn(A) log r, sgn(A) clip(log r, -e_lo, e_hi))
    (Geometric-Mean Policy Optimization, Zhao et al. 2025, arXiv 2507.20673; clip range (e^-0.4, e^0.4)).

    Shapes in the module doc; ``advantages`` [B, T] are reduced to one per row by their masked mean (the paper's
    advantage is per sequence). ``clip_high=None`` = clip_low. The geometric mean is less sensitive than the
    arithmetic mean to a token with an outlying ratio, so the paper widens PPO's range; a clipped token's log-ratio
    has no gradient, every other token gets -A_i s_i / |y_i|. On one-token responses this is PPO's clipped loss with
    clip_low = 1 - e^-e_lo, clip_high = e^e_hi - 1. As in GSPO the sequence loss is placed on each of its tokens
    before the aggregation, so ``seq_mean_token_mean`` (the default) gives the paper's mean over sequences.
    Departures: padding is set to 0 and the token log-ratio clamped to [-c, c] first, as in :func:`ppo_policy_loss`.
    stats: clipfrac (tokens whose log-ratio was clipped), approxkl, ratio_mean, ratio_var of the token ratios.
    """
    clip_high = clip_low if clip_high is None else clip_high
    adv = _sequence_advantage(advantages, mask)  # [B]
    sign = torch.sign(adv).unsqueeze(-1)
    _, log_ratio = token_log_ratio(logprobs, old_logprobs, adv, mask, log_ratio_clip)
    clipped = log_ratio.clamp(-clip_low, clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)  # the smaller objective for A's sign
    s = torch.exp(masked_mean(pessimistic, mask, dim=-1))  # [B]; 1 for a row without tokens
    per_token = (-adv * s).unsqueeze(-1).expand_as(logprobs)
    loss = aggregate_loss(weighted(per_token, weights), mask, aggregation, max_len)
    return loss, ratio_stats(torch.exp(log_ratio), log_ratio, sign * clipped < sign * log_ratio, mask)


# ──────────────────────────────────────────────── DPPO, VESPO, LUSPO ───────────────────────────────────────────────
def _log1m_exp(log_p: torch.Tensor) -> torch.Tensor:
    """log(1 - p) from log p <= 0, finite at p = 1 (log p is kept below -1e-12 first: log(1 - p) >= -27.6)."""
    return torch.log(-torch.expm1(log_p.clamp(max=-1e-12)))


def binary_tv(logprobs: torch.Tensor, anchor_logprobs: torch.Tensor) -> torch.Tensor:
    """Total variation between two token distributions collapsed to {sampled token, the rest}: |p - mu|
    (DPPO's Binary-TV; a lower bound of the full TV). [B, T] log-probs of the sampled tokens -> [B, T]."""
    return (torch.exp(logprobs) - torch.exp(anchor_logprobs)).abs()


def binary_kl(logprobs: torch.Tensor, anchor_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(mu || p) of the same Bernoulli collapse: mu log(mu / p) + (1 - mu) log((1 - mu) / (1 - p)), mu the anchor's
    probability of the sampled token (DPPO's Binary-KL; a lower bound of the full KL by the data-processing
    inequality). Computed from the log-probs, finite when either probability is 1. [B, T] -> [B, T]."""
    mu = torch.exp(anchor_logprobs)
    return mu * (anchor_logprobs - logprobs) + (1.0 - mu) * (_log1m_exp(anchor_logprobs) - _log1m_exp(logprobs))


#: DPPO's divergence between the token distributions, from the sampled tokens' log-probs (``algo.dppo.divergence``)
BINARY_DIVERGENCES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "binary_tv": binary_tv,
    "binary_kl": binary_kl,
}


def dppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    divergence: str = "binary_tv",
    delta_low: float = 0.2,
    delta_high: float = 0.2,
    ratio_cap: float | None = 20.0,
    kl_coef: float = 0.0,
    aggregation: str = "token_mean",
    max_len: int | None = None,
    log_ratio_clip: float | None = 20.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """DPPO: -M_t sg(min(r_t, C)) A_t log pi(y_t) + kl_coef (log r_t)^2 per token, r = pi / pi_old, with the trust
    region mask M_t = 0 where the update moves the token's distribution further past the divergence threshold:
    A_t > 0, pi > pi_old and D_t > delta_high, or A_t < 0, pi < pi_old and D_t > delta_low (1 elsewhere)
    ("Rethinking the Trust Region in LLM Reinforcement Learning", DPPO, arXiv 2602.04879; verl ``dppo_tv`` /
    ``dppo_kl``; prime-rl's default loss, which adds the squared log-ratio term with kl_coef = 1e-3).

    Shapes in the module doc. D_t = ``BINARY_DIVERGENCES[divergence](log pi, log pi_old)``: the divergence between
    the two distributions at position t collapsed to {y_t, everything else} (``binary_tv`` |pi - pi_old|,
    ``binary_kl`` the Bernoulli KL), which needs only the sampled token's log-probs, so this loss keeps the registry's
    calling convention. A token that moves back toward the anchor is never masked. The weight min(r, C) carries no
    gradient (as in CISPO): d / d log pi = -M A min(r, C) + 2 kl_coef log r, so the cap C bounds a rare token's
    weight without dropping its gradient (``ratio_cap=None``: no cap). The paper reduces with a token mean.
    Departures: the anchor is ``old_logprobs`` (the trainer's recomputed pi_old, the registry's convention); the
    paper anchors on the rollout engine's probabilities, which rlhfkit's engines compute from the same weights (the
    rollout / trainer gap is the off-policy correction's). The top-K divergences (TRL's ``topk_tv`` / ``topk_kl``)
    would need the old policy's top-K log-probs kept per token and are not built. Padding is set to 0 and the
    log-ratio clamped to [-c, c] before exp, as in :func:`ppo_policy_loss`.
    stats: clipfrac (tokens masked by the trust region), approxkl, ratio_mean, ratio_var of r.
    """
    try:
        div_fn = BINARY_DIVERGENCES[divergence]
    except KeyError:
        raise ValueError(f"unknown DPPO divergence {divergence!r}; choose one of "
                         f"{sorted(BINARY_DIVERGENCES)}") from None
    advantages, log_ratio = token_log_ratio(logprobs.detach(), old_logprobs, advantages, mask, log_ratio_clip)
    ratio = torch.exp(log_ratio)  # no gradient
    valid = mask.bool()
    logprobs_in = zero_outside(logprobs, valid)  # padding: log pi = 0 (p = 1) in both, so D = 0 there
    div = div_fn(logprobs_in.detach(), zero_outside(old_logprobs, valid))
    blocked = ((advantages > 0) & (log_ratio > 0) & (div > delta_high)) | \
        ((advantages < 0) & (log_ratio < 0) & (div > delta_low))
    weight = ratio if ratio_cap is None else ratio.clamp(max=ratio_cap)
    per_token = -torch.where(blocked, torch.zeros_like(weight), weight) * advantages * logprobs_in
    if kl_coef:
        _, log_ratio_grad = token_log_ratio(logprobs, old_logprobs, advantages, mask, log_ratio_clip)
        per_token = per_token + kl_coef * log_ratio_grad.square()
    loss = aggregate_loss(weighted(per_token, weights), mask, aggregation, max_len)
    return loss, ratio_stats(ratio, log_ratio, blocked, mask)


def vespo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    aggregation: str = "token_mean",
    max_len: int | None = None,
    log_ratio_clip: float | None = 20.0,
    weights: torch.Tensor | None = None,
    token_keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """VESPO: -sg(phi(W_i)) A_t log pi(y_t) per token, W_i = prod_t pi / pi_old over the row (the sequence IS ratio),
    phi(W) = W^k exp(lambda (1 - W)) (= 1 at W = 1), k, lambda = k_pos, lambda_pos for a sequence advantage >= 0 and
    k_neg, lambda_neg below 0 (Variational Sequence-Level Soft Policy Optimization, arXiv 2602.10693; TRL
    ``loss_type="vespo"``, whose defaults these are: c1, c2 of the paper's section 3.4).

    Shapes in the module doc. A smooth, asymmetric kernel in place of a clip: phi peaks at W = k / lambda and decays
    to 0 for W -> 0 and W -> inf, so stale or mismatched sequences are damped, none cut off; the weight carries no
    gradient (d / d log pi = -phi A). phi is computed in log space, lambda + k log W - lambda W, with log W clamped to
    [-c, c] (c = ``log_ratio_clip``, 20 when None), and the token log-ratios clamped first.
    ``weights`` (the off-policy correction) are read as the rollout / trainer importance ratio and folded into W,
    as TRL does (the paper's W is the ratio to the behaviour policy that sampled): log W += sum_t log w_t; they do not
    multiply the loss again. They must be token ratios: a sequence-level correction (its row ratio on every token)
    is refused when the config is built (``PolicyLoss.sequence_weights``), as TRL refuses its sequence modes. A token
    of weight 0 (``icepop`` outside its band) enters neither W nor the loss.
    ``token_keep`` (optional [B, T] 0/1, no gradient): the tokens whose loss counts once W is taken (the high-entropy
    tokens of ``algo.top_entropy_quantile``): the others still enter W and the normaliser, as TRL multiplies its
    per-token loss by the entropy mask after the kernel. (``weights`` cannot carry it: they are folded into W.)
    ``advantages`` [B, T] keep their per-token values; the kernel's sign is the row's (masked mean). TRL reduces with
    a token mean over the batch (``aggregation="token_mean"``).
    stats: clipfrac = token mean of max(0, 1 - phi) (how much the kernel damps; it clips nothing), approxkl,
    ratio_mean, ratio_var of the token ratios.
    """
    advantages_tok, log_ratio = token_log_ratio(logprobs.detach(), old_logprobs, advantages, mask, log_ratio_clip)
    keep = mask.bool() if weights is None else mask.bool() & (weights > 0)
    log_w = masked_sum(log_ratio, keep, dim=-1)  # [B]
    if weights is not None:  # the correction's ratio pi_old / pi_rollout, folded into the sequence ratio
        log_w = log_w + masked_sum(torch.log(weights.detach().clamp_min(torch.finfo(weights.dtype).tiny)), keep, -1)
    c = _MAX_LOG if log_ratio_clip is None else log_ratio_clip
    log_w = log_w.clamp(-c, c)
    nonneg = _sequence_advantage(advantages, mask) >= 0
    k = torch.where(nonneg, log_w.new_tensor(k_pos), log_w.new_tensor(k_neg))
    lam = torch.where(nonneg, log_w.new_tensor(lambda_pos), log_w.new_tensor(lambda_neg))
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).detach()  # [B], 0 (not NaN) far from W = 1
    per_token = -phi.unsqueeze(-1) * advantages_tok * zero_outside(logprobs, keep)
    if token_keep is not None:
        per_token = per_token * token_keep.detach().to(per_token.dtype)
    loss = aggregate_loss(per_token, mask, aggregation, max_len)
    damped = (1.0 - phi).clamp_min(0.0).unsqueeze(-1).expand_as(log_ratio)
    return loss, ratio_stats(torch.exp(log_ratio), log_ratio, damped, mask)


def luspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 2e-3,
    clip_high: float | None = 2.5e-3,
    aggregation: str = "seq_mean_token_mean",
    max_len: int | None = None,
    log_ratio_clip: float | None = 20.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """LUSPO: |y_i| max(-A_i s_i, -A_i clip(s_i, 1 - lo, 1 + hi)) per sequence: GSPO's clipped sequence loss scaled
    by the sequence's length (Length-Unbiased Sequence Policy Optimization, arXiv 2602.05261, section 5.1's range
    2e-3 / 2.5e-3; TRL ``loss_type="luspo"`` with ``importance_sampling_level="sequence"``).

    Shapes in the module doc; ``advantages`` [B, T] are reduced to one per row by their masked mean. s_i is GSPO's
    length-normalised ratio, so each token's gradient in GSPO is 1 / |y_i| of its row's: long responses learn less
    per token. Scaling by |y_i| gives every token the same weight. As in GSPO the sequence loss is placed on each
    of its tokens before the aggregation: ``seq_mean_token_mean`` (the default) gives TRL's mean over sequences of
    |y_i| l_i.
    stats (of the sequence ratio s, counted once per token): clipfrac, approxkl, ratio_mean, ratio_var.
    """
    per_seq, s, log_s, was_clipped = _clipped_sequence(logprobs, old_logprobs, advantages, mask, clip_low, clip_high,
                                                       log_ratio_clip)
    lengths = masked_count(logprobs, mask, dim=-1).to(per_seq.dtype)
    per_token = (per_seq * lengths).unsqueeze(-1).expand_as(logprobs)
    loss = aggregate_loss(weighted(per_token, weights), mask, aggregation, max_len)
    return loss, _sequence_stats(s, log_s, was_clipped, mask)


# ──────────────────────────────────────────────────── the registry ────────────────────────────────────────────────────
@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: its pure function and the config section that holds its own settings.

    ``section`` names ``algo.<section>`` of the online config: a frozen dataclass whose fields are keywords of
    ``fn`` (several losses may share one, as ``gspo`` and ``gspo_token`` do). Calling the entry passes the section's
    fields as those keywords, and the keywords every loss shares from the caller.
    """

    name: str
    fn: PolicyLossFn
    section: str
    # False: ``weights`` are read as token ratios folded into the loss's own sequence ratio (a sequence-level correction
    # refused), so a 0/1 token selection goes as ``token_keep`` instead
    sequence_weights: bool = True

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        settings: Any = None,
        **shared: Any,
    ) -> tuple[torch.Tensor, Stats]:
        """``fn`` with ``settings`` (the config section, a dataclass; or a mapping of some of its fields; None = the
        function's defaults) as its own keywords, and ``shared`` (aggregation, max_len, log_ratio_clip, weights: the
        keywords every loss takes; those not given keep the function's defaults). Shapes as in the module doc."""
        return self.fn(logprobs, old_logprobs, advantages, mask, **settings_kwargs(settings), **shared)


def settings_kwargs(settings: Any) -> dict[str, Any]:
    """The keywords a config section gives its function (a loss's here, an advantage estimator's in
    ``advantages.py``): a dataclass's fields, a mapping's items, nothing for None."""
    if settings is None:
        return {}
    if isinstance(settings, Mapping):
        return dict(settings)
    return {fl.name: getattr(settings, fl.name) for fl in dataclasses.fields(settings)}


POLICY_LOSSES: dict[str, PolicyLoss] = {
    p.name: p
    for p in (
        PolicyLoss("ppo", ppo_policy_loss, section="ppo"),
        PolicyLoss("gspo", gspo_loss, section="gspo"),
        PolicyLoss("gspo_token", gspo_token_loss, section="gspo"),
        PolicyLoss("cispo", cispo_loss, section="cispo"),
        PolicyLoss("sapo", sapo_loss, section="sapo"),
        PolicyLoss("gmpo", gmpo_loss, section="gmpo"),
        PolicyLoss("dppo", dppo_loss, section="dppo"),
        PolicyLoss("vespo", vespo_loss, section="vespo", sequence_weights=False),
        PolicyLoss("luspo", luspo_loss, section="luspo"),
    )
}
