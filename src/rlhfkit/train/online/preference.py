"""Online preference learning (online DPO): the learner's step 6 when ``algo.objective=preference``.

The producer is the online step's own (prompts -> ``num_generations`` sampled completions each -> scores by the reward
model / functions / judge); the learner's forwards are its own (old and reference log-probs). Instead of advantages
and a policy loss, each prompt's best- and worst-scored completions form a pair (:func:`rlhfkit.algos.preference_pairs`;
ties give none) and the pair loss of ``algo.preference`` — a paired entry of ``algos.PREFERENCE_LOSSES``, the offline
recipes' own functions (DPO, IPO, cDPO, SimPO, ORPO) — is taken on the policy's log-probs of the fresh pair (Guo et
al. 2024, "Direct Language Model Alignment from Online AI Feedback"; TRL ``OnlineDPOTrainer``, whose two completions
per prompt are ``num_generations=2``).

Mini-batches: the step's prompts split into ``len(rollout) / algo.mini_batch_size`` updates per epoch (at most one
per prompt: the number :meth:`Learner.plan` counts), each in micro-batches of ``train.batch_size / 2`` pairs (two
responses each); every prompt is forwarded, tied or not, so each process makes the same forwards (DDP / FSDP2), and
a micro-batch without a kept pair adds a zero loss. The loss of an update is the mean over its kept pairs (this
process's). Departure from TRL: a tie is no pair (TRL keeps it, the first completion as chosen, which teaches noise).
"""

from __future__ import annotations

import contextlib

import torch

from ... import algos
from ..lifecycle.optim import clip_and_step
from ..shared.forward import response_stats
from .experience import Experience

#: what one online-preference update logs (TRL's names where OnlineDPOTrainer has them), weighted by kept pairs
STATS = ("loss/policy_avg", "logps/chosen", "logps/rejected", "rewards/chosen", "rewards/rejected",
         "rewards/margins", "rewards/accuracies", "objective/scores_margin")


def preference_update(learner, exp: Experience, step: int) -> dict:
    """Step 6 of ``learner`` (a :class:`~rlhfkit.train.online.learner.Learner`) on ``exp`` (old / reference log-probs
    taken): the pairs, then ``algo.ppo_epochs`` passes of updates over them. Returns the step's metrics (every process
    the same: one all-reduce), ``objective/kl`` included (the KL controller reads it)."""
    cfg, acc = learner.cfg, learner.acc
    algo = cfg.algo
    spec = algos.PREFERENCE_LOSSES[algo.preference.loss]
    metrics = learner.kl_metrics(exp)  # objective/kl of the sampled responses (the DPO loss holds its own KL term)
    chosen, rejected, keep = algos.preference_pairs(exp.scores, learner.k, exp.valid)
    n = len(keep)
    updates = learner.updates_per_step // algo.ppo_epochs  # Learner.plan: at most one per pair
    per_micro = max(1, cfg.train.batch_size // 2)
    mask = exp.sample_mask
    sums = torch.zeros(len(STATS) + 1, device=learner.device)  # weighted by kept pairs; the last one: their count
    g = torch.Generator().manual_seed(cfg.train.seed * 7919 + step)
    learner.policy.train()
    learner.phases.phase("update", total=algo.ppo_epochs * updates)
    norms = []  # each update's gradient norm (TRL's grad_norm: their mean)
    update = step * learner.updates_per_step  # the run's optimizer updates before this step's (callbacks)
    for _ in range(algo.ppo_epochs):
        order = torch.randperm(n, generator=g).to(keep.device)
        for mini in torch.tensor_split(order, updates):
            learner.run.tell("on_step_begin", update)
            kept_in_update = max(int(keep[mini].sum()), 1)
            starts = range(0, len(mini), per_micro)
            for i, s in enumerate(starts):
                part = mini[s: s + per_micro]
                with (contextlib.nullcontext() if i == len(starts) - 1 else acc.no_sync(learner.policy)):
                    sums += _micro_step(learner, exp, spec, chosen[part], rejected[part], keep[part], mask,
                                        1.0 / kept_in_update)
            norm = clip_and_step(acc, learner.policy, learner.opt, learner.sched, cfg.optim.max_grad_norm)
            if norm is not None:
                norms.append(float(norm))
            update += 1
            learner.run.tell("on_update", update, {"tokens": learner.tokens_seen, "rows": len(mini) * 2,
                                                   "prompts": len(mini)})
            learner.phases.advance()
    total = acc.reduce(sums, "sum") if acc.num_processes > 1 else sums
    count = float(total[-1])
    metrics.update({k: float(v) / max(count, 1.0) for k, v in zip(STATS, total[:-1])})
    metrics["rollout/preference_pairs_frac"] = count / (algo.ppo_epochs * n * acc.num_processes)
    metrics["preference/beta"] = algo.preference.beta  # TRL's OnlineDPOTrainer logs its beta
    if norms:
        metrics["policy/grad_norm"] = sum(norms) / len(norms)
    return metrics


def _micro_step(learner, exp: Experience, spec, chosen, rejected, keep, mask, scale: float) -> torch.Tensor:
    """Forward the pairs' responses (chosen then rejected), the loss of the kept pairs times ``scale`` backward;
    returns the kept-pair-weighted sums of :data:`STATS` and the number of kept pairs."""
    cfg, algo = learner.cfg, learner.cfg.algo
    rows = torch.cat([chosen, rejected])
    m = len(chosen)
    batch = exp.forward_rows(rows)
    with learner.acc.autocast():
        logprobs = response_stats(learner.policy, batch, cfg.generation.temperature).logprobs.float()
        idx = torch.arange(m, device=logprobs.device)[keep.to(logprobs.device)]
        ref = None if exp.ref_logprobs is None else exp.ref_logprobs[rows]
        stats = None
        if len(idx):
            lp = algos.pair_logps(logprobs, mask[rows], idx, idx + m, ref)
            loss, stats = spec.from_logps(lp, algo.preference)
        else:  # no pair to learn from here: a zero loss that still reaches every parameter (DDP)
            loss = logprobs.sum() * 0.0
    learner.acc.backward(loss * len(idx) * scale)
    if stats is None:
        return torch.zeros(len(STATS) + 1, device=learner.device)
    # the loss's own batch means (as the offline recipe logs them: ORPO's rewards are lam x its mean log-prob, SimPO's
    # and ORPO's logps per token), weighted by the kept pairs; the scores' margin and the count beside them
    margin = exp.scores[chosen[keep]] - exp.scores[rejected[keep]]
    means = [loss.detach(), *(stats[k] for k in STATS[1:-1])]
    values = [v.detach().float().to(learner.device) * len(idx) for v in means]
    return torch.stack([*values, margin.sum().float().to(learner.device),
                        torch.tensor(float(len(idx)), device=learner.device)])
