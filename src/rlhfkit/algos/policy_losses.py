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

GSPO and GMPO use the sequence advantage A_i = the masked mean of the row's advantages (exact for the group estimators,
whose advantage is the same at every token). Its per-sequence loss is spread over the row's tokens before the
aggregation, so ``seq_mean_token_mean`` gives the paper's mean over sequences (the ``gspo`` recipe's default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.algos.losses import aggregate_loss
from rlhfkit.algos.masked import masked_mean, masked_var, zero_outside

Stats = dict[str, torch.Tensor]
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
    approxkl = 0.5 * mean((logp - old)^2), ratio_mean, ratio_var (unbiased, over masked tokens).
    ``weights`` (optional [B, T], no gradient): per-token factors on the loss before it is reduced (the off-policy
    correction).
    """
    advantages, log_ratio = token_log_ratio(logprobs, old_logprobs, advantages, mask, log_ratio_clip)
    ratio = torch.exp(log_ratio)
    per_token, was_clipped = clipped_surrogate(ratio, advantages, clip_low, clip_high)
    loss = aggregate_loss(weighted(per_token, weights), mask, aggregation, max_len)
    return loss, ratio_stats(ratio, log_ratio, was_clipped, mask)


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
    per_seq, was_clipped = clipped_surrogate(s, _sequence_advantage(advantages, mask), clip_low, clip_high)
    per_token = per_seq.unsqueeze(-1).expand_as(logprobs)
    loss = aggregate_loss(weighted(per_token, weights), mask, aggregation, max_len)
    B_T = logprobs.shape
    return loss, ratio_stats(s.unsqueeze(-1).expand(B_T), log_s.unsqueeze(-1).expand(B_T),
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
        return self.fn(logprobs, old_logprobs, advantages, mask, **_settings_kwargs(settings), **shared)


def _settings_kwargs(settings: Any) -> dict[str, Any]:
    """The keywords a section gives its loss: a dataclass's fields, a mapping's items, nothing for None."""
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
    )
}
