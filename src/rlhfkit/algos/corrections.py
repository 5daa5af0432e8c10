"""Off-policy corrections for the rollout / trainer mismatch, one registry (``OFF_POLICY_CORRECTIONS``, config key
``algo.off_policy.correction``), and the metrics that show the mismatch's tail.

The rollout engine samples token y_t with probability pi_rollout(y_t); the trainer's forward pass at the same weights
gives pi_old(y_t) (other kernels, precision, top-p / top-k renormalisation, or an engine holding stale weights). The
PPO ratio pi / pi_old corrects for the trainer's own updates, not for this gap, so the gradient is biased. The
importance ratio rho_t = pi_old(y_t) / pi_rollout(y_t) measures it (Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training"; Liu et al. 2025, masked IS).

Every entry is an :class:`OffPolicyCorrection`: a function ``fn(old_logprobs, rollout_logprobs, mask, *,
<its settings>) -> (weights, mask)``, all [B, T], and where its settings live. ``weights`` (no grad, or None for 1)
multiply the per-token policy loss, the returned mask replaces the policy-loss mask. The loop calls
``spec(old_logprobs, rollout_logprobs, mask, cfg.algo.off_policy)``: a correction without a section of its own reads
the shared fields ``cap, low, high, level`` of ``algo.off_policy``; one with a section reads the fields of
``algo.off_policy.<section>`` (its paper's defaults).
``level``: ``token`` (a ratio per token) or ``sequence`` (the product of the row's token ratios, one per row).

- ``none``: no weights (None: the plain loss), mask unchanged.
- ``tis``: truncated IS, w = min(rho, cap) (Yao et al. 2025).
- ``mis``: masked IS, w = rho where low <= rho <= high, and the token (or the whole row) is dropped from the mask
  outside that band: it leaves every loss and every denominator.
- ``icepop`` (section ``icepop``): IcePop token masking (Ant Group, Ring-1T, 2025; OpenRLHF ``icepop``): w = rho
  inside [low, high] (the paper's [0.5, 5]), 0 outside; the token keeps its place in the mask, so only its
  policy-gradient term is removed (the per-token objective times M(rho) inside the usual normalisation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.algos.masked import masked_quantile

_MAX_LOG = 20.0  # log-ratios are clamped to +-20 before exp (a row's sum can be large; e^20 is far past any cap)


def importance_log_ratio(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                         level: str = "token") -> torch.Tensor:
    """log rho: per token (``token``) or the row's sum broadcast to its tokens (``sequence``); [B, T], 0 off mask."""
    diff = torch.where(mask.bool(), (old_logprobs - rollout_logprobs).detach(), torch.zeros_like(old_logprobs))
    if level == "token":
        return diff
    if level == "sequence":
        return diff.sum(-1, keepdim=True).expand_as(diff) * mask
    raise ValueError(f"unknown importance-ratio level {level!r}; choose token or sequence")


def no_correction(old_logprobs, rollout_logprobs, mask, *, cap=2.0, low=0.5, high=2.0, level="token"):
    """No correction: no weights (the losses read ``weights=None`` as 1), mask unchanged."""
    return None, mask


def truncated_is(old_logprobs, rollout_logprobs, mask, *, cap=2.0, low=0.5, high=2.0, level="token"):
    """TIS: w = min(pi_old / pi_rollout, cap) per token or per sequence (Yao et al. 2025); mask unchanged."""
    log_rho = importance_log_ratio(old_logprobs, rollout_logprobs, mask, level).clamp(-_MAX_LOG, _MAX_LOG)
    return torch.exp(log_rho).clamp(max=cap), mask


def masked_is(old_logprobs, rollout_logprobs, mask, *, cap=2.0, low=0.5, high=2.0, level="token"):
    """MIS: w = pi_old / pi_rollout inside [low, high]; tokens (``token``) or whole rows (``sequence``) outside the
    band leave the mask (Liu et al. 2025, masked importance sampling)."""
    log_rho = importance_log_ratio(old_logprobs, rollout_logprobs, mask, level).clamp(-_MAX_LOG, _MAX_LOG)
    rho = torch.exp(log_rho)
    inside = (rho >= low) & (rho <= high)
    keep = mask.bool() & inside
    return torch.where(keep, rho, torch.zeros_like(rho)), keep.to(mask.dtype)


def icepop(old_logprobs, rollout_logprobs, mask, *, low=0.5, high=5.0):
    """IcePop: w = rho = pi_old / pi_rollout per token where low <= rho <= high, 0 outside; mask unchanged (Ant Group
    2025, "IcePop", the Ring-1T report: the objective of each token times M(rho), M(k) = k inside [alpha, beta] and
    0 outside, alpha = 0.5, beta = 5; OpenRLHF ``is_correction_type=icepop``).

    Unlike ``mis``, a token outside the band stays in the mask: its policy-gradient term is 0, but it still counts in
    the loss's normalisation (token / sequence means) and in the KL-in-loss and entropy terms, as in the paper's
    objective. Token level only (the paper's). [B, T] each -> (weights [B, T], 0 off mask; mask unchanged)."""
    rho = torch.exp(importance_log_ratio(old_logprobs, rollout_logprobs, mask, "token").clamp(-_MAX_LOG, _MAX_LOG))
    inside = mask.bool() & (rho >= low) & (rho <= high)
    return torch.where(inside, rho, torch.zeros_like(rho)), mask


CorrectionFn = Callable[..., tuple[torch.Tensor | None, torch.Tensor]]
SHARED_FIELDS = ("cap", "low", "high", "level")  # the fields of algo.off_policy read by a correction without a section


@dataclass(frozen=True)
class OffPolicyCorrection:
    """A registered correction: its pure function and where its settings live (``section``: the name of a field of
    ``algo.off_policy`` holding its own settings section; None = the shared ``cap, low, high, level``)."""

    name: str
    fn: CorrectionFn
    section: str | None = None

    def __call__(self, old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                 settings: Any = None, **kwargs: Any) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``fn`` with its keywords read from ``settings`` (the ``algo.off_policy`` section; None = the function's
        defaults) and then ``kwargs`` (explicit keywords win). Shapes as in the module doc."""
        given: dict[str, Any] = {}
        if settings is not None:
            own = getattr(settings, self.section) if self.section else settings
            names = [fl.name for fl in dataclasses.fields(own)] if self.section else SHARED_FIELDS
            given = {n: getattr(own, n) for n in names}
        return self.fn(old_logprobs, rollout_logprobs, mask, **{**given, **kwargs})


OFF_POLICY_CORRECTIONS: dict[str, OffPolicyCorrection] = {
    c.name: c
    for c in (
        OffPolicyCorrection("none", no_correction),
        OffPolicyCorrection("tis", truncated_is),
        OffPolicyCorrection("mis", masked_is),
        OffPolicyCorrection("icepop", icepop, section="icepop"),
    )
}


def mismatch_stats(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                   low: float = 0.5, high: float = 2.0) -> dict[str, torch.Tensor]:
    """How far the rollout engine's log-probs are from the trainer's, tail included (detached scalars).

    logprob_diff_mean / _max: mean / max of |log pi_old - log pi_rollout| over masked tokens; is_ratio_mean,
    is_ratio_p99: mean and 99th percentile of the token ratio rho; is_ratio_outside_frac: fraction of tokens with
    rho outside [low, high]. An empty mask gives zeros (ratio stats 1). The percentile is ``masked_quantile``'s
    (``torch.quantile``'s linear rule, without its 2^24-value limit: a step's tokens of every process pass it).
    """
    with torch.no_grad():
        m = mask.bool()
        diff = (old_logprobs - rollout_logprobs).float()[m]
        if diff.numel() == 0:
            zero, one = torch.zeros(()), torch.ones(())
            return {"logprob_diff_mean": zero, "logprob_diff_max": zero, "is_ratio_mean": one, "is_ratio_p99": one,
                    "is_ratio_outside_frac": zero}
        rho = torch.exp(diff.clamp(-_MAX_LOG, _MAX_LOG))
        return {"logprob_diff_mean": diff.abs().mean(), "logprob_diff_max": diff.abs().max(),
                "is_ratio_mean": rho.mean(), "is_ratio_p99": masked_quantile(rho, None, 0.99),
                "is_ratio_outside_frac": ((rho < low) | (rho > high)).float().mean()}


__all__ = ["OFF_POLICY_CORRECTIONS", "OffPolicyCorrection", "icepop", "importance_log_ratio", "masked_is",
           "mismatch_stats", "no_correction", "truncated_is"]
