"""Losses of every recipe: SFT, Bradley–Terry reward model, PPO clip + value clip, KL-in-loss, DPO family, KTO.

Every loss returns ``(loss, stats)``: ``loss`` a scalar tensor with grad, ``stats`` a dict of detached scalar
tensors (no ``.item()``: the caller decides when to sync). Token losses take ``[B, T]`` tensors with a response
mask; "token mean" means the sum over every valid token of the batch divided by the number of valid tokens.
Preference losses take per-sequence log-probabilities ``[B]`` and average over the batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlhfkit.algos.kl import kl_penalty
from rlhfkit.algos.masked import _count, _where, masked_mean, masked_sum, masked_var

Stats = dict[str, torch.Tensor]


# --------------------------------------------------------------------------------------------- aggregation
def _token_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len: int | None) -> torch.Tensor:
    """sum over all valid tokens of the batch / number of valid tokens (DAPO, Yu et al. 2025, token-level loss)."""
    return masked_mean(per_token, mask)


def _seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len: int | None) -> torch.Tensor:
    """Per-sequence token mean, then mean over sequences with >= 1 valid token (GRPO, Shao et al. 2024, eq. 3)."""
    per_seq = masked_mean(per_token, mask, dim=-1)
    has_tokens = _count(per_token, mask, dim=-1) > 0
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
    return loss, {"nll": loss.detach(), "num_tokens": _count(logprobs, mask, None).detach()}


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


# --------------------------------------------------------------------------------------------- online RL
def _clipped(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float | None):
    """max(-A r, -A clip(r, 1 - lo, 1 + hi)) and whether the clipped term was taken (same shape as ratio)."""
    clip_high = clip_low if clip_high is None else clip_high
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def _stats(ratio: torch.Tensor, log_ratio: torch.Tensor, was_clipped: torch.Tensor, mask: torch.Tensor) -> Stats:
    with torch.no_grad():
        return {"clipfrac": masked_mean(was_clipped.float(), mask),
                "approxkl": 0.5 * masked_mean(log_ratio.detach().square(), mask),
                "ratio_mean": masked_mean(ratio.detach(), mask),
                "ratio_var": masked_var(ratio.detach(), mask)}


def _weighted(per_token: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return per_token if weights is None else per_token * weights.detach()


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    aggregation: str = "token_mean",
    max_len: int | None = None,
    log_ratio_clip: float | None = 20.0,
    *,
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
    correction); this is the ``ppo`` entry of :data:`~rlhfkit.algos.policy_losses.POLICY_LOSSES`.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    valid = mask.bool()
    advantages = _where(advantages, valid)
    log_ratio = _where(logprobs - old_logprobs, valid)  # before exp: padding gives ratio 1 and no gradient
    if log_ratio_clip is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    ratio = torch.exp(log_ratio)
    per_token, was_clipped = _clipped(ratio, advantages, clip_low, clip_high)
    loss = aggregate_loss(_weighted(per_token, weights), mask, aggregation, max_len)
    return loss, _stats(ratio, log_ratio, was_clipped, mask)


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
    values, old_values, returns = _where(values, valid), _where(old_values, valid), _where(returns, valid)
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


# --------------------------------------------------------------------------------------------- offline preference
def _reward_stats(
    chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, chosen_logps, rejected_logps
) -> Stats:
    """The TRL-style preference metrics (batch means), detached."""
    stats = {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "logps/chosen": chosen_logps.mean(),
        "logps/rejected": rejected_logps.mean(),
    }
    return {k: v.detach() for k, v in stats.items()}


def _dpo_sigmoid(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h) (Rafailov et al. 2023, eq. 7; cDPO, Mitchell 2023)."""
    return -(1.0 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)


def _dpo_ipo(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """(h - 1 / (2 beta))^2 (Azar et al. 2023, eq. 17)."""
    if label_smoothing:
        raise ValueError("label_smoothing applies to the sigmoid (cDPO) loss, not to IPO")
    return (h - 1.0 / (2.0 * beta)).square()


DPO_LOSS_TYPES: dict[str, Callable[[torch.Tensor, float, float], torch.Tensor]] = {
    "sigmoid": _dpo_sigmoid,
    "ipo": _dpo_ipo,
}


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, Stats]:
    """DPO -log sigmoid(beta h), h = (pi_c - ref_c) - (pi_r - ref_r) (Rafailov et al. 2023, eq. 7); IPO / cDPO variants.

    All inputs: [B] summed log-probabilities of the completions -> (batch mean, stats). ``loss_type``: "sigmoid"
    (DPO; with ``label_smoothing`` eps > 0 the conservative cDPO -(1-eps) log sig(beta h) - eps log sig(-beta h))
    or "ipo" ((h - 1/(2 beta))^2, Azar et al. 2023 eq. 17, on the log-probabilities given: the paper's sums;
    TRL feeds length-averaged ones). stats: rewards/chosen = beta (pi_c - ref_c), rewards/rejected,
    rewards/accuracies, rewards/margins, logps/chosen, logps/rejected (batch means).
    """
    try:
        fn = DPO_LOSS_TYPES[loss_type]
    except KeyError:
        raise ValueError(
            f"unknown DPO loss_type {loss_type!r}; choose one of {sorted(DPO_LOSS_TYPES)}"
        ) from None
    chosen_logratios = policy_chosen_logps - ref_chosen_logps
    rejected_logratios = policy_rejected_logps - ref_rejected_logps
    loss = fn(chosen_logratios - rejected_logratios, beta, label_smoothing).mean()
    stats = _reward_stats(
        beta * chosen_logratios, beta * rejected_logratios, policy_chosen_logps, policy_rejected_logps
    )
    return loss, stats


def simpo_loss(
    chosen_avg_logps: torch.Tensor, rejected_avg_logps: torch.Tensor, beta: float = 2.0, gamma: float = 0.5
) -> tuple[torch.Tensor, Stats]:
    """SimPO -log sigmoid(beta avg_c - beta avg_r - gamma), reference-free (Meng et al. 2024, eq. 6).

    chosen_avg_logps, rejected_avg_logps: [B] length-normalised (mean per token) log-probabilities -> batch mean.
    ``gamma`` is the target reward margin of eq. 6 itself, in reward units (TRL's ``simpo_gamma``); the SimPO
    repository's configs give ``gamma_beta_ratio`` instead: pass gamma = beta * gamma_beta_ratio.
    stats as :func:`dpo_loss` with rewards = beta * avg logp.
    """
    chosen_rewards = beta * chosen_avg_logps
    rejected_rewards = beta * rejected_avg_logps
    loss = -F.logsigmoid(chosen_rewards - rejected_rewards - gamma).mean()
    return loss, _reward_stats(chosen_rewards, rejected_rewards, chosen_avg_logps, rejected_avg_logps)


_LN2 = 0.6931471805599453


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, stable on both ends (Mächler 2012, "Accurately computing log(1 - exp(-|a|))").

    Each branch of the ``where`` gets an input that is safe for it (the unused branch's gradient is multiplied by
    0, and 0 * inf = NaN: log1p(-e^x) at x ~ -1e-8 in float32 is log(0)). x is first clamped to <= -tiny (the
    smallest normal of its dtype): at x = 0 (a completion of probability 1) the value is log(tiny) ~ -87 in float32
    rather than -inf, and the gradient there is 0.
    """
    x = x.clamp(max=-torch.finfo(x.dtype).tiny)
    near = x > -_LN2
    x_near = torch.where(near, x, torch.full_like(x, -_LN2))  # log(-expm1(x)) needs x < 0
    x_far = torch.where(near, torch.full_like(x, -_LN2), x)  # log1p(-exp(x)) needs exp(x) < 1 in the dtype
    return torch.where(near, torch.log(-torch.expm1(x_near)), torch.log1p(-torch.exp(x_far)))


def orpo_loss(
    chosen_avg_logps: torch.Tensor,
    rejected_avg_logps: torch.Tensor,
    chosen_nll: torch.Tensor,
    lam: float = 0.1,
) -> tuple[torch.Tensor, Stats]:
    """ORPO: NLL_chosen + lam * -log sigmoid(log odds_c - log odds_r), odds(p) = p / (1 - p).

    Hong et al. 2024, eq. 6-7.

    chosen_avg_logps, rejected_avg_logps: [B] length-normalised log-probabilities (must be < 0);
    chosen_nll: [B] or scalar SFT loss on the chosen completions (averaged). log odds = logp - log(1 - e^logp),
    computed with a stable log1mexp. Batch means. stats: log_odds_ratio (mean log sigmoid(...)), log_odds_chosen
    (mean log-odds difference), nll, and the :func:`dpo_loss` keys with rewards = lam * avg logp (as TRL).
    """
    log_odds = (chosen_avg_logps - _log1mexp(chosen_avg_logps)) - (
        rejected_avg_logps - _log1mexp(rejected_avg_logps)
    )
    ratio = F.logsigmoid(log_odds)
    nll = chosen_nll.mean()
    loss = nll - lam * ratio.mean()
    stats = _reward_stats(
        lam * chosen_avg_logps, lam * rejected_avg_logps, chosen_avg_logps, rejected_avg_logps
    )
    stats.update(
        {
            "log_odds_ratio": ratio.mean().detach(),
            "log_odds_chosen": log_odds.mean().detach(),
            "nll": nll.detach(),
        }
    )
    return loss, stats


def kto_kl_estimate(policy_kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """KTO reference point z0 = max(0, mean(pi - ref)) on mismatched pairs, detached (Ethayarajh et al. 2024).

    policy_kl_logps, ref_kl_logps: [B] -> scalar. (Batch mean on this process; gather across processes first
    for the paper's batch-wide estimate.)
    """
    return (policy_kl_logps - ref_kl_logps).mean().clamp_min(0.0).detach()


def kto_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    labels: torch.Tensor,
    kl_ref: torch.Tensor,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, Stats]:
    """KTO: w_d (1 - sig(beta (r - z0))) if desirable else w_u (1 - sig(beta (z0 - r))) (Ethayarajh et al. 2024 eq. 8).

    policy_logps, ref_logps: [B] summed log-probabilities; labels: [B] bool (True = desirable); kl_ref: scalar
    z0 (see :func:`kto_kl_estimate`; detached and clamped >= 0 again here). r = pi - ref. loss = mean over all B
    examples of the weighted terms (as TRL; not a per-class mean). stats: rewards/chosen, rewards/rejected
    (mean beta * r over desirable / undesirable examples, 0 when there are none — implicit reward as in DPO),
    kl (z0), count/chosen, count/rejected.
    """
    labels = labels.bool()
    z0 = kl_ref.detach().clamp_min(0.0)
    r = policy_logps - ref_logps
    desirable = desirable_weight * (1.0 - torch.sigmoid(beta * (r - z0)))
    undesirable = undesirable_weight * (1.0 - torch.sigmoid(beta * (z0 - r)))
    loss = torch.where(labels, desirable, undesirable).mean()
    with torch.no_grad():
        rewards = beta * r
        stats = {
            "rewards/chosen": masked_mean(rewards, labels),
            "rewards/rejected": masked_mean(rewards, ~labels),
            "kl": z0,
            "count/chosen": labels.sum().float(),
            "count/rejected": (~labels).sum().float(),
        }
    return loss, stats


# ──────────────────────────────────────── the preference-loss registry ────────────────────────────────────────
# Each paired loss reads one dict of [B] tensors (what the preference recipe's forward gives): ``chosen`` /
# ``rejected`` (log-probs summed over completion tokens), ``chosen_tokens`` / ``rejected_tokens`` (counts) and
# ``ref_chosen`` / ``ref_rejected``; its ``inputs(lp, params)`` picks the arguments of ``fn`` from it and from the
# hyper-parameters ``params`` (any object with beta, label_smoothing, simpo_gamma, orpo_lambda, kto_*_weight).


def _dpo_inputs(lp: dict, params) -> tuple[tuple, dict]:
    kw = {"label_smoothing": params.label_smoothing} if params.label_smoothing > 0 else {}  # cdpo: 0.1 when unset
    return (lp["chosen"], lp["rejected"], lp["ref_chosen"], lp["ref_rejected"]), {"beta": params.beta, **kw}


def _avg(lp: dict, side: str) -> torch.Tensor:
    """Per-token mean log-prob of one side; a completion with no token (cut away entirely) gives 0, not 0 / 0."""
    return lp[side] / lp[f"{side}_tokens"].clamp_min(1)


def _simpo_inputs(lp: dict, params) -> tuple[tuple, dict]:
    avg_c, avg_r = _avg(lp, "chosen"), _avg(lp, "rejected")
    return (avg_c, avg_r), {"beta": params.beta, "gamma": params.simpo_gamma}


def _orpo_inputs(lp: dict, params) -> tuple[tuple, dict]:
    avg_c, avg_r = _avg(lp, "chosen"), _avg(lp, "rejected")
    nll = -lp["chosen"].sum() / lp["chosen_tokens"].sum().clamp_min(1)  # token mean over every chosen token
    return (avg_c, avg_r, nll), {"lam": params.orpo_lambda}


@dataclass(frozen=True)
class PreferenceLoss:
    """How the preference trainer feeds a loss.

    needs_reference: ``fn`` takes reference-model log-probs (computed once, no grad); paired: inputs are
    (chosen, rejected) pairs (False: KTO's single labelled completions, fed by the recipe's KTO objective);
    length_normalised: log-probs are per-token means rather than sums; inputs: the arguments of ``fn`` from the
    log-prob dict and the hyper-parameters (paired losses).
    """

    name: str
    fn: Callable[..., tuple[torch.Tensor, Stats]]
    needs_reference: bool
    paired: bool
    length_normalised: bool
    inputs: Callable[[dict, object], tuple[tuple, dict]] | None = None

    def from_logps(self, lp: dict, params) -> tuple[torch.Tensor, Stats]:
        """The loss and stats of a paired loss from the log-prob dict (see the registry's comment)."""
        args, kwargs = self.inputs(lp, params)
        return self.fn(*args, **kwargs)


PREFERENCE_LOSSES: dict[str, PreferenceLoss] = {
    p.name: p
    for p in (
        PreferenceLoss("dpo", functools.partial(dpo_loss, loss_type="sigmoid"), True, True, False, _dpo_inputs),
        PreferenceLoss("ipo", functools.partial(dpo_loss, loss_type="ipo"), True, True, False, _dpo_inputs),
        # conservative DPO: the sigmoid loss with label smoothing; 0.1 unless the caller passes label_smoothing=
        PreferenceLoss("cdpo", functools.partial(dpo_loss, loss_type="sigmoid", label_smoothing=0.1), True, True,
                       False, _dpo_inputs),
        PreferenceLoss("simpo", simpo_loss, needs_reference=False, paired=True, length_normalised=True,
                       inputs=_simpo_inputs),
        PreferenceLoss("orpo", orpo_loss, needs_reference=False, paired=True, length_normalised=True,
                       inputs=_orpo_inputs),
        PreferenceLoss("kto", kto_loss, needs_reference=True, paired=False, length_normalised=False),
    )
}
