"""Losses of the supervised, reward-model and critic steps, and what every token loss shares: the aggregations.

SFT (NLL), Bradley–Terry reward model, PPO value clip, KL-in-loss, and ``LOSS_AGGREGATIONS`` / ``aggregate_loss``
(the reduction of a per-token loss, also used by every policy loss). The online policy losses live in
:mod:`rlhfkit.algos.policy_losses`, the offline preference losses (DPO family, SimPO, ORPO, KTO) in
:mod:`rlhfkit.algos.preference`.

Every loss returns ``(loss, stats)``: ``loss`` a scalar tensor with grad, ``stats`` a dict of detached scalar
tensors (no ``.item()``: the caller decides when to sync). Token losses take ``[B, T]`` tensors with a response
mask; "token mean" means the sum over every valid token of the batch divided by the number of valid tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from rlhfkit.algos.kl import kl_penalty
from rlhfkit.algos.masked import masked_count, masked_mean, masked_sum, zero_outside

Stats = dict[str, torch.Tensor]


# --------------------------------------------------------------------------------------------- aggregation
def _token_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len: int | None) -> torch.Tensor:
    """sum over all valid tokens of the batch / number of valid tokens (DAPO, Yu et al. 2025, token-level loss)."""
    return masked_mean(per_token, mask)


def _seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len: int | None) -> torch.Tensor:
    """Per-sequence token mean, then mean over sequences with >= 1 valid token (GRPO, Shao et al. 2024, eq. 3)."""
    per_seq = masked_mean(per_token, mask, dim=-1)
    has_tokens = masked_count(per_token, mask, dim=-1) > 0
    return masked_mean(per_seq, has_tokens)


def _seq_mean_token_sum_norm(
    per_token: torch.Tensor, mask: torch.Tensor, max_len: int | None
) -> torch.Tensor:
    """Per-sequence token sum / constant max_len (default padded T), mean over all B rows.

    Dr. GRPO (Liu et al. 2025)."""
    norm = per_token.shape[-1] if max_len is None else max_len
    return (masked_sum(per_token, mask, dim=-1) / norm).mean()


LOSS_AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, int | None], torch.Tensor]] = {
    "token_mean": _token_mean,
    "seq_mean_token_mean": _seq_mean_token_mean,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}


def aggregate_loss(
    per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean", max_len: int | None = None
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar by one of ``LOSS_AGGREGATIONS`` (DAPO / GRPO / Dr. GRPO conventions).

    per_token, mask: [B, T] -> scalar. ``max_len`` is the constant normaliser of ``seq_mean_token_sum_norm``
    (default T, the padded length); ignored by the other modes.
    """
    try:
        fn = LOSS_AGGREGATIONS[mode]
    except KeyError:
        raise ValueError(
            f"unknown loss aggregation {mode!r}; choose one of {sorted(LOSS_AGGREGATIONS)}"
        ) from None
    return fn(per_token, mask, max_len)


# --------------------------------------------------------------------------------------------- SFT and reward model
def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, Stats]:
    """Negative log-likelihood, token mean over every masked token of the batch (SFT, Ouyang et al. 2022).

    logprobs, mask: [B, T] (log-probabilities of the target tokens) -> (scalar, {"nll", "num_tokens"}).
    """
    loss = -masked_mean(logprobs, mask)
    return loss, {"nll": loss.detach(), "num_tokens": masked_count(logprobs, mask, None).detach()}


def bradley_terry_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | float | None = None,
    center_coef: float = 0.0,
) -> tuple[torch.Tensor, Stats]:
    """Pairwise reward loss -log sigmoid(r_c - r_r - m).

    Ouyang et al. 2022, eq. 1; margin m: Touvron et al. 2023, eq. 2.

    chosen, rejected: [B] rewards; margin: [B], scalar or None (0). ``center_coef`` adds
    center_coef * mean((r_c + r_r)^2) to keep rewards centred on 0 (Eisenstein et al. 2023).
    Batch mean. stats: accuracy (fraction r_c > r_r), chosen_mean, rejected_mean, margin_mean (mean r_c - r_r).
    """
    diff = chosen - rejected
    logits = diff if margin is None else diff - margin
    loss = -F.logsigmoid(logits).mean()
    if center_coef:
        loss = loss + center_coef * (chosen + rejected).square().mean()
    stats = {
        "accuracy": (diff > 0).float().mean(),
        "chosen_mean": chosen.mean(),
        "rejected_mean": rejected.mean(),
        "margin_mean": diff.mean(),
    }
    return loss, {k: v.detach() for k, v in stats.items()}


# --------------------------------------------------------------------------------------------- value and KL
def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None = 0.2,
) -> tuple[torch.Tensor, Stats]:
    """0.5 max((V - R)^2, (clip(V, V_old +- c) - R)^2), token mean (PPO2 value clipping; Engstrom et al. 2020).

    values, old_values, returns, mask: [B, T] -> scalar. ``clip_range=None``: plain 0.5 * (V - R)^2.
    Masked positions are set to 0 before the square (no NaN / inf from padding in the gradient).
    stats (token means over masked tokens): clipfrac (clipped term larger), value_mean, error (mean (V - R)^2).
    """
    valid = mask.bool()
    values, old_values, returns = (zero_outside(x, valid) for x in (values, old_values, returns))
    err_unclipped = (values - returns).square()
    if clip_range is None:
        per_token = err_unclipped
        clipped_chosen = torch.zeros_like(err_unclipped, dtype=torch.bool)
    else:
        v_clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
        err_clipped = (v_clipped - returns).square()
        per_token = torch.maximum(err_unclipped, err_clipped)
        clipped_chosen = err_clipped > err_unclipped
    loss = 0.5 * masked_mean(per_token, mask)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean(clipped_chosen.float(), mask),
            "value_mean": masked_mean(values, mask),
            "error": masked_mean(err_unclipped, mask),
        }
    return loss, stats


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    estimator: str = "k3",
    aggregation: str = "token_mean",
    max_len: int | None = None,
    log_ratio_clip: float | None = None,
) -> tuple[torch.Tensor, Stats]:
    """KL(pi || ref) as a loss term, the beta * D_KL of GRPO (Shao et al. 2024, eq. 3-4; k3 estimator by default).

    logprobs, ref_logprobs, mask: [B, T] -> scalar (unscaled: the caller multiplies by beta), reduced with
    :func:`aggregate_loss`. ``log_ratio_clip`` as in :func:`~rlhfkit.algos.kl.kl_penalty`; masked positions are
    zeroed before the estimator. stats: kl = token mean of the per-token estimate over masked tokens.
    """
    per_token = kl_penalty(logprobs, ref_logprobs, estimator, mask=mask, log_ratio_clip=log_ratio_clip)
    loss = aggregate_loss(per_token, mask, aggregation, max_len)
    return loss, {"kl": masked_mean(per_token.detach(), mask)}


