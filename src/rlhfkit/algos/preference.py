"""Offline preference losses: the DPO family (DPO, IPO, cDPO), SimPO, ORPO, KTO, and their registry.

``PREFERENCE_LOSSES`` maps ``algo.loss`` to a :class:`PreferenceLoss`: the pure function and how the preference
trainer feeds it. Every loss takes per-sequence log-probabilities ``[B]`` and returns ``(batch mean, stats)`` with
TRL's metric names (``rewards/chosen``, ``rewards/margins``, ...), stats detached.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlhfkit.algos.masked import masked_mean

Stats = dict[str, torch.Tensor]


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


def log1mexp(x: torch.Tensor) -> torch.Tensor:
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
    log_odds = (chosen_avg_logps - log1mexp(chosen_avg_logps)) - (
        rejected_avg_logps - log1mexp(rejected_avg_logps)
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


# ─────────────────────────────────────── online pairs (online DPO) ───────────────────────────────────────
def preference_pairs(scores: torch.Tensor, group_size: int,
                     valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The preference pair of each prompt's completions, judged by their scores (online DPO: Guo et al. 2024,
    "Direct Language Model Alignment from Online AI Feedback"; TRL ``OnlineDPOTrainer``): the best-scored valid
    completion is chosen, the worst-scored rejected.

    scores, valid: [N = k * P] completion-major (index ``i * P + j`` is completion i of prompt j, as the online
    step lays them out) -> (chosen [P], rejected [P], keep [P] bool): row indices of each prompt's pair, and whether
    it is one: its valid scores are not all equal. With k = 2 this is TRL's pair; a group of ties (or with fewer
    than two valid completions) carries no preference and is not kept (TRL keeps a tie, taking the first completion
    as chosen). Among equal best (worst) scores the first completion is taken. Every prompt has an entry, so each
    process of a distributed run makes the same number of forwards whatever its ties.
    """
    if group_size < 2 or scores.dim() != 1 or scores.numel() % group_size:
        raise ValueError(f"preference pairs need groups of >= 2 completions; got {scores.numel()} scores in groups of "
                         f"{group_size}")
    g = scores.detach().reshape(group_size, -1)  # [k, P]
    v = torch.ones_like(g, dtype=torch.bool) if valid is None else valid.reshape(group_size, -1).bool()
    inf = torch.tensor(torch.inf, dtype=g.dtype, device=g.device)
    best = torch.where(v, g, -inf).argmax(0)  # first of the equal best
    worst = torch.where(v, g, inf).argmin(0)
    cols = torch.arange(g.shape[1], device=g.device)
    keep = (v.sum(0) >= 2) & (g[best, cols] > g[worst, cols])
    P = g.shape[1]
    return best * P + cols, worst * P + cols, keep


def pair_logps(logprobs: torch.Tensor, mask: torch.Tensor, chosen: torch.Tensor, rejected: torch.Tensor,
               ref_logprobs: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The log-prob dict a paired loss of :data:`PREFERENCE_LOSSES` reads (``spec.from_logps``), from per-token
    log-probs of sampled responses and the pairs of :func:`preference_pairs`.

    logprobs [B, T] (with grad: the policy's), mask [B, T], chosen / rejected [M] row indices, ref_logprobs [B, T]
    (no grad; None for losses without a reference) -> {chosen, rejected, chosen_tokens, rejected_tokens[, ref_chosen,
    ref_rejected]} of [M] tensors: sums over each response's masked tokens, and their counts (what the offline
    recipe's forward gives for a pair). Padding is selected away before the sums (NaN there reaches nothing).
    """
    valid = mask.bool()
    seq = torch.where(valid, logprobs, torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)).sum(-1)
    tokens = valid.sum(-1).to(seq.dtype)
    out = {"chosen": seq[chosen], "rejected": seq[rejected], "chosen_tokens": tokens[chosen],
           "rejected_tokens": tokens[rejected]}
    if ref_logprobs is not None:
        ref = torch.where(valid, ref_logprobs.detach(), torch.zeros((), dtype=ref_logprobs.dtype,
                                                                    device=ref_logprobs.device)).sum(-1)
        out.update(ref_chosen=ref[chosen], ref_rejected=ref[rejected])
    return out


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
