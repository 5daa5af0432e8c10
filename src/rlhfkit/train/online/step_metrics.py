"""The rollout metrics of an online step, over every process's samples in **one** gather.

Each process holds the same number of samples (``algo.rollout_batch_size x algo.num_generations``); their per-sample
values (raw score, entropy, RLHF reward, EOS reached, length, group tied) are stacked into one ``[B, C]`` tensor and
gathered once, instead of one gather per metric (eight per step before). Means, the EOS count and the length
spread are then taken over all the samples of the step, on every process alike, and copied to the host together
(one device sync, not one ``.item()`` each).
"""

from __future__ import annotations

import torch

from ... import algos


def rollout_metrics(acc, exp, *, kl_coef: float, kl_in_reward: bool, group_size: int, group_based: bool,
                    clip: float | None = None) -> dict:
    """TRL's rollout metrics of ``exp`` (an ``Experience`` after its advantages): ``objective/scores`` and its std
    ``objective/scores_std``, ``objective/entropy`` (sum of the sampled tokens' negative log-probs),
    ``objective/rlhf_reward`` (score + the KL penalty when it is in the reward), ``val/num_eos_tokens``,
    ``val/eos_frac``, ``response/clipped_frac`` (its complement: answers cut at the length limit),
    ``response/length_mean`` / ``_std`` / ``_min`` / ``_max``, ``response/terminated_length_mean`` / ``_min`` /
    ``_max`` (the answers that ended; 0 when none did, as TRL), ``tokens/step`` (prompt + response tokens of every
    process), for group estimators ``rewards/tied_groups_frac`` and, with ``clip`` (``reward.clip``),
    ``rewards/clipped_frac``: the fraction of the samples whose shaped score sits at +-clip (kept samples only), whose
    differences the clip erased. Every process must call it (one gather)."""
    mask = exp.action  # the model's own tokens
    entropy = (-exp.old_logprobs * mask).sum(-1)
    non_score = -(kl_coef * exp.kl * mask).sum(-1) if kl_in_reward else torch.zeros_like(entropy)
    tokens = exp.rollout.prompt_mask.sum(-1) + exp.rollout.lengths  # padding left out (TRL's num_tokens)
    columns = [exp.raw_scores, entropy, exp.scores + non_score, exp.rollout.ended, exp.rollout.lengths, tokens]
    fractions = {}  # per-sample 0 / 1 columns whose mean over every process's samples is the metric
    if group_based and group_size >= 2:  # per sample: its group's value, so the mean is the fraction of groups
        fractions["rewards/tied_groups_frac"] = algos.group_all_tied(exp.scores, group_size, valid=exp.valid)
    if clip is not None:
        at_clip = exp.scores.abs() >= clip
        fractions["rewards/clipped_frac"] = at_clip if exp.valid is None else at_clip & exp.valid
    local = torch.stack([c.detach().float().reshape(-1) for c in [*columns, *fractions.values()]], dim=1)
    every = acc.gather(local) if acc.num_processes > 1 else local
    scores, ent, rlhf, ended, lengths, tokens = every[:, :len(columns)].unbind(1)
    done = ended > 0
    term = lengths[done] if bool(done.any()) else lengths.new_zeros(1)  # TRL: 0 when no answer ended
    std = (lambda t: t.std() if len(t) > 1 else t.new_zeros(()))  # noqa: E731
    names = ["objective/scores", "objective/scores_std", "objective/entropy", "objective/rlhf_reward",
             "val/num_eos_tokens", "val/eos_frac", "response/clipped_frac", "response/length_mean",
             "response/length_std", "response/length_min", "response/length_max", "response/terminated_length_mean",
             "response/terminated_length_min", "response/terminated_length_max", "tokens/step", *fractions]
    values = [scores.mean(), std(scores), ent.mean(), rlhf.mean(), ended.sum(), ended.mean(), 1 - ended.mean(),
              lengths.mean(), std(lengths), lengths.min(), lengths.max(), term.mean(), term.min(), term.max(),
              tokens.sum(), *every[:, len(columns):].mean(0)]
    return dict(zip(names, torch.stack(values).tolist()))  # one device-to-host copy for all of them
