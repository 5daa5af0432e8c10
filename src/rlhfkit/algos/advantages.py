"""Advantage estimators: GAE (with a critic), group baselines (GRPO, Dr. GRPO, RLOO), REINFORCE++, W-REINFORCE (no
baseline, right answers down-weighted), and on-policy distillation (the teacher's per-token reward,
:func:`teacher_token_rewards`, under the ``distill`` estimator).

Token-level estimators take [B, T] tensors with a response ``mask`` (1 from the first response token up to and
including EOS, 0 after). Positions where the mask is 0 are *skipped*: the reverse scan links each valid token to
the next valid one, so right padding behaves as a terminal state (value 0) and masked holes inside a response
(e.g. tool output) are stepped over. Masked positions are returned as 0.

Group estimators take one score per completion. LAYOUT: k completions of P prompts are laid out
completion-major — a flat tensor of length N = k * P whose index ``i * P + j`` is completion ``i`` of prompt
``j`` (the prompt batch repeated k times, as ``prompts.repeat(k, 1)`` gives). We reshape to (k, P) and reduce
over dim 0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.algos.masked import masked_whiten, zero_outside
from rlhfkit.algos.policy_losses import settings_kwargs


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over response tokens (Schulman et al. 2016, eq. 16).

    delta_t = r_t + gamma * V_{t+1} - V_t;  A_t = delta_t + gamma * lam * A_{t+1}; V and A after the last valid
    token are 0 (terminal). rewards, values, mask: [B, T] -> (advantages [B, T], returns = A + V [B, T]),
    both 0 where ``mask`` is 0. Vectorised over the batch; one reverse loop over time.
    """
    valid = mask.bool()
    zero = torch.zeros_like(rewards[:, 0])
    next_value, next_adv = zero, zero
    advs = []
    for t in range(rewards.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        m = valid[:, t]
        next_adv = torch.where(m, adv, next_adv)
        next_value = torch.where(m, values[:, t], next_value)
        advs.append(torch.where(m, adv, zero))
    advantages = torch.stack(advs[::-1], dim=1)
    returns = zero_outside(advantages + values, valid)
    return advantages, returns


def _groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Flat completion-major scores [k * P] -> [k, P] (row i = completion i of every prompt)."""
    if scores.dim() != 1:
        raise ValueError(f"group scores must be 1-D [k * P], got shape {tuple(scores.shape)}")
    if group_size < 1 or scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    return scores.reshape(group_size, -1)


def _group_moments(scores: torch.Tensor, group_size: int, valid: torch.Tensor | None):
    """Per-prompt statistics over the valid members of each group, shifted for exactness.

    -> (d [k, P]: r - pivot, 0 where invalid; v [k, P] bool; n [P] valid count; sum of d [P]). The pivot is one
    valid member of the group (the largest): d is exactly 0 for equal rewards, so a group of ties gets a mean and a
    std of exactly 0 (a float32 mean of eight 1.2s is not 1.2, and that rounding divided by eps gave every member an
    advantage of ~0.1). Baselines are shift-invariant, so nothing else changes."""
    g = _groups(scores, group_size)
    v = torch.ones_like(g, dtype=torch.bool) if valid is None else _groups(valid.bool(), group_size)
    with torch.no_grad():
        top = torch.where(v, g, torch.full_like(g, -torch.inf)).amax(dim=0, keepdim=True)
        pivot = torch.where(torch.isneginf(top), torch.zeros_like(top), top)
    d = torch.where(v, g - pivot, torch.zeros_like(g))
    n = v.sum(dim=0, keepdim=True).to(g.dtype)
    return d, v, n, d.sum(dim=0, keepdim=True)


def grpo_advantages(
    scores: torch.Tensor,
    group_size: int,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO advantage (r - group mean) / (group std + eps) (Shao et al. 2024, DeepSeekMath, GRPO).

    scores: [N = k * P] completion-major -> [N]. std is the unbiased (n - 1) sample std over the k completions
    (torch's default, as in TRL / verl); ``scale_by_std=False`` is Dr. GRPO (Liu et al. 2025): r - mean_group.
    A group whose rewards are all equal gets exactly 0. ``valid`` [N] bool (optional): only valid members enter
    their group's mean and std, and invalid ones (samples dropped from the step) get 0; a group with fewer than two
    valid members gets 0 (its std is undefined; with ``scale_by_std=False`` a single member is its own mean).
    """
    if scale_by_std and group_size < 2:
        raise ValueError("grpo with scale_by_std needs group_size >= 2 (std of one sample is undefined)")
    d, v, n, total = _group_moments(scores, group_size, valid)
    adv = torch.where(v, d - total / n.clamp_min(1), torch.zeros_like(d))
    if scale_by_std:
        std = (adv.square().sum(dim=0, keepdim=True) / (n - 1).clamp_min(1)).sqrt()
        adv = adv / (std + eps)
    return adv.reshape(-1)


def rloo_advantages(scores: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Leave-one-out advantage r_i - mean_{j != i} r_j within a prompt's group (Ahmadian et al. 2024, RLOO).

    scores: [N = k * P] completion-major -> [N]. Needs k >= 2. Equal rewards in a group give exactly 0.
    ``valid`` [N] bool (optional): the baseline averages the other *valid* members; invalid members, and the members
    of a group with fewer than two valid ones, get 0.
    """
    if group_size < 2:
        raise ValueError("rloo needs group_size >= 2 (the baseline is the mean of the other completions)")
    d, v, n, total = _group_moments(scores, group_size, valid)
    others = (total - d) / (n - 1).clamp_min(1)
    return torch.where(v & (n >= 2), d - others, torch.zeros_like(d)).reshape(-1)


def group_all_tied(
    scores: torch.Tensor, group_size: int, atol: float = 0.0, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """True for each member of a group whose scores all tie (within ``atol``) (DAPO dynamic sampling, Yu et al. 2025).

    scores: [N = k * P] completion-major -> bool [N]. ``valid`` [N] bool (optional): only valid members are
    compared (a group with at most one valid member is tied: it carries no signal either).
    """
    g = _groups(scores, group_size)
    v = torch.ones_like(g, dtype=torch.bool) if valid is None else _groups(valid.bool(), group_size)
    inf = torch.full_like(g, torch.inf)
    top, bottom = torch.where(v, g, -inf).amax(dim=0), torch.where(v, g, inf).amin(dim=0)
    tied = ~(top - bottom > atol)  # [P]; no valid member: -inf - inf = -inf, tied
    return tied.unsqueeze(0).expand_as(g).reshape(-1)


def reinforce_pp_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted return-to-go G_t = r_t + gamma * G_{t+1} of per-token rewards (REINFORCE++, Hu 2025).

    rewards, mask: [B, T] -> [B, T], 0 where ``mask`` is 0 (masked positions skipped as in :func:`gae`).
    The rewards are usually the score at EOS minus beta * per-token KL.
    """
    valid = mask.bool()
    zero = torch.zeros_like(rewards[:, 0])
    running = zero
    out = []
    for t in range(rewards.shape[1] - 1, -1, -1):
        m = valid[:, t]
        running = torch.where(m, rewards[:, t] + gamma * running, running)
        out.append(torch.where(m, running, zero))
    return torch.stack(out[::-1], dim=1)


def reinforce_pp_advantages(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++ advantages: returns-to-go whitened over all valid tokens of the whole batch (Hu 2025).

    rewards, mask: [B, T] -> [B, T], 0 where ``mask`` is 0.
    """
    return masked_whiten(reinforce_pp_returns(rewards, mask, gamma), mask)


def w_reinforce_advantages(
    scores: torch.Tensor, positive_weight: float = 0.1, center: float = 0.0, valid: torch.Tensor | None = None,
    negative_weight: float = 1.0,
) -> torch.Tensor:
    """W-REINFORCE advantages (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
    Reasoning", arXiv 2506.01347): the objective lambda * L_PSR + L_NSR, REINFORCE with no baseline in which
    a positive sample's reward counts ``positive_weight`` (lambda; the paper: 0.1) times and a negative's
    ``negative_weight`` times (the paper: 1). The paper's decomposition: ``negative_weight=0`` is PSR (right answers
    only, an on-policy rejection-sampling fine-tune), ``positive_weight=0`` NSR (wrong answers only).

    r = score - ``center``; advantage = lambda * r where r > 0, negative_weight * r elsewhere (r = 0: 0). The
    paper's rewards are +1 / -1 with ``center`` 0, giving +lambda / -1; a 0 / 1 verifier with ``center`` 0.5 gives
    +lambda / 2 and -1 / 2 (the same direction, half the scale), and a score below the verifier's 0 (a penalty) a
    larger push down. scores: [N] one score per sample -> [N]. ``valid`` [N] bool (optional): invalid samples get 0.
    No groups: every sample is measured against the fixed ``center``, so the answers of a prompt that all fail are
    each pushed down.
    """
    r = scores - center
    adv = torch.where(r > 0, positive_weight * r, negative_weight * r)
    return adv if valid is None else torch.where(valid.bool(), adv, torch.zeros_like(adv))


def shaped_token_rewards(
    scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float, kl_in_reward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards of the online loop: the sequence score on the last response token, minus ``kl_coef`` times
    the per-token KL when the KL lives in the reward (Ziegler et al. 2019, eq. 2; Ouyang et al. 2022, eq. 2).

    scores [B], kl [B, T], mask [B, T] -> (token_rewards [B, T], non_score [B, T] = the KL part alone), both 0 where
    ``mask`` is 0. The score goes on the last position where ``mask`` is 1 (a multi-turn mask has holes at the
    environment's tokens). A row with an empty mask gets no score (there is no token to put it on).
    """
    valid = mask.bool()
    positions = torch.arange(valid.shape[-1], device=valid.device).expand_as(valid)
    last = torch.where(valid, positions, torch.zeros_like(positions)).amax(-1, keepdim=True)  # masks may have holes
    score = torch.zeros_like(kl).scatter(-1, last, scores.unsqueeze(-1).to(kl.dtype))
    non_score = -kl_coef * kl if kl_in_reward else torch.zeros_like(kl)
    return zero_outside(score + non_score, valid), zero_outside(non_score, valid)


def teacher_token_rewards(
    teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor, mask: torch.Tensor, coef: float = 1.0,
    log_ratio_clip: float | None = 20.0,
) -> torch.Tensor:
    """The on-policy distillation reward of each sampled token: ``coef * (log p_teacher(y_t) - log p_student(y_t))``
    (Agarwal et al. 2024, GKD, eq. 2 with lambda = 1; Lu & Thinking Machines 2025, "On-Policy Distillation").

    Its negative is the one-sample estimate of the per-token reverse KL(student || teacher) on the student's own
    tokens, so maximising the return of these rewards minimises the reverse KL. teacher_logprobs, student_logprobs,
    mask: [B, T] -> [B, T] in float32 (at least), 0 where ``mask`` is 0. The log-ratio is clamped to
    ``[-log_ratio_clip, log_ratio_clip]`` (None: no clamp) so a token the teacher gives ~0 probability (log-prob
    -inf or -1e4) yields a large finite penalty, not -inf; a 0 * inf or inf - inf (NaN) counts as 0.
    How it departs from GKD: no gradient through the teacher-forced sum over the vocabulary; the sampled token's
    log-ratio is the reward of a policy-gradient update (as in the Thinking Machines recipe and TRL's).
    """
    dtype = torch.promote_types(teacher_logprobs.dtype, torch.float32)
    ratio = teacher_logprobs.to(dtype) - student_logprobs.to(dtype)
    ratio = torch.where(torch.isnan(ratio), torch.zeros_like(ratio), ratio)
    if log_ratio_clip is not None:
        ratio = ratio.clamp(-log_ratio_clip, log_ratio_clip)
    return zero_outside(coef * ratio, mask.bool())


# ─────────────────────────────────────────── the estimator registry ───────────────────────────────────────────
# One calling convention, so the online loop calls the registered function once and never branches on a name:
#   fn(token_rewards [B, T], mask [B, T], *, values [B, T] | None, group_size k, gamma, lam)
#       -> (advantages [B, T] (0 where mask is 0), returns [B, T] for a critic | None)
# Group estimators reduce the token rewards to one sequence reward (their masked sum: the score plus the KL
# penalty when it lives in the reward) and broadcast the sequence advantage over the sequence's tokens. A row whose
# mask is all 0 (a sample dropped from the step, e.g. its reward was NaN) takes no part in its group's statistics.


def _gae_estimator(token_rewards, mask, *, values=None, group_size=1, gamma=1.0, lam=1.0):
    if values is None:
        raise ValueError("gae needs the critic's values")
    return gae(token_rewards, values, mask, gamma, lam)


def _sequence_estimator(fn: Callable[[torch.Tensor, int], torch.Tensor]):
    def estimator(token_rewards, mask, *, values=None, group_size=1, gamma=1.0, lam=1.0):
        seq = zero_outside(token_rewards, mask.bool()).sum(-1)
        valid = mask.bool().any(-1)  # a row with no token (a sample dropped from the step) is not in its group
        return fn(seq, group_size, valid=valid).unsqueeze(-1) * mask, None

    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "estimator")
    estimator.__doc__ = f"{name} over the sequence rewards, broadcast over each sequence's tokens."
    return estimator


def _reinforce_pp_estimator(token_rewards, mask, *, values=None, group_size=1, gamma=1.0, lam=1.0):
    return reinforce_pp_advantages(token_rewards, mask, gamma), None


def _w_reinforce_estimator(token_rewards, mask, *, values=None, group_size=1, gamma=1.0, lam=1.0,
                           positive_weight=0.1, center=0.0, negative_weight=1.0):
    seq = zero_outside(token_rewards, mask.bool()).sum(-1)
    adv = w_reinforce_advantages(seq, positive_weight, center, valid=mask.bool().any(-1),
                                 negative_weight=negative_weight)
    return adv.unsqueeze(-1) * mask, None


def _distill_estimator(token_rewards, mask, *, values=None, group_size=1, gamma=1.0, lam=1.0):
    """On-policy distillation: the advantage of a token is the discounted return of the per-token rewards from it on,
    neither baselined nor whitened (``gamma=0``, the distill recipe's default: each token's own reward, i.e. its
    teacher - student log-ratio, plus a task score on the last token). The loop adds the teacher's rewards
    (:func:`teacher_token_rewards`) to the shaped token rewards whenever ``teacher.model`` is set."""
    return reinforce_pp_returns(token_rewards, mask, gamma), None


@dataclass(frozen=True)
class AdvantageEstimator:
    """How the online loop uses an estimator.

    fn: the registry's calling convention (above). needs_critic: train a value model and pass its values;
    group_based: needs k >= 2 completions per prompt (completion-major layout); kl_in_reward_default: where
    ``algo.kl.placement=auto`` puts the KL penalty — in the per-token reward (True) or in the loss (False, GRPO's
    beta term); needs_teacher: its advantages are meaningful only with the teacher's per-token rewards
    (``teacher.model`` set; the config refuses it otherwise); section: ``algo.<section>`` of the online config holds
    the estimator's own settings, passed to ``fn`` as keywords (:meth:`settings`); None = it has none.
    """

    name: str
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
    needs_critic: bool
    group_based: bool
    kl_in_reward_default: bool
    needs_teacher: bool = False
    section: str | None = None

    def settings(self, algo: Any) -> dict[str, Any]:
        """The keywords ``algo.<section>`` (a frozen dataclass) gives ``fn``; {} without a section."""
        return settings_kwargs(None if self.section is None else getattr(algo, self.section))


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    e.name: e
    for e in (
        AdvantageEstimator("gae", _gae_estimator, needs_critic=True, group_based=False, kl_in_reward_default=True),
        AdvantageEstimator("grpo", _sequence_estimator(grpo_advantages), needs_critic=False, group_based=True,
                           kl_in_reward_default=False),
        AdvantageEstimator("dr_grpo", _sequence_estimator(functools.partial(grpo_advantages, scale_by_std=False)),
                           needs_critic=False, group_based=True, kl_in_reward_default=False),
        AdvantageEstimator("rloo", _sequence_estimator(rloo_advantages), needs_critic=False, group_based=True,
                           kl_in_reward_default=True),
        AdvantageEstimator("reinforce_pp", _reinforce_pp_estimator, needs_critic=False, group_based=False,
                           kl_in_reward_default=True),
        AdvantageEstimator("w_reinforce", _w_reinforce_estimator, needs_critic=False, group_based=False,
                           kl_in_reward_default=False, section="w_reinforce"),
        AdvantageEstimator("distill", _distill_estimator, needs_critic=False, group_based=False,
                           kl_in_reward_default=True, needs_teacher=True),
    )
}
