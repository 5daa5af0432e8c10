"""The batch one online step carries (:class:`Experience`), and how its loss mask is made.

The loss mask is never edited in place. Each step that decides which tokens leave the losses sets one
**keep-factor** on the Experience, once; :func:`compose_mask` multiplies them, and
:meth:`Experience.compose_loss_mask` does that once for the loss, when every factor is decided (end of step 5, before
the update), masking the advantages and the importance weights with the result (once). ``Experience.mask`` reads the
product of the factors set so far (after step 3: the samples with a finite reward), and from then on the loss mask.
The factors, in the order the steps of ``online.py`` decide them:

======================  =======  ======  ==================================================================
factor                  shape    step    keeps
======================  =======  ======  ==================================================================
``action``              [B, R]   2       the model's own tokens (the response up to its first EOS; multi-turn:
                                         without the environment's tokens)
``valid``               [B]      3       samples with a finite reward (the others are dropped from the step)
``untied``              [B]      5       groups whose scores differ (``algo.filter_tied_groups``, group estimators)
``finished``            [B]      5       responses that ended (``algo.overlong.filter``, DAPO overlong filtering)
``in_band``             [B, R]   5       what the off-policy correction keeps (``mis``: ratios inside the band)
======================  =======  ======  ==================================================================

A factor not set (None) keeps everything. Two partial products are read before the loss mask exists: the
*sample mask* (``action`` x ``valid``: the tokens of the samples in the step, over which the KL, the shaped rewards
and the estimator's group statistics are taken, so a tied or truncated sample still counts in its group), and the
mask before the correction (every factor but ``in_band``: the tokens whose rollout / trainer mismatch is measured and
corrected).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ... import algos
from ...rollout import Rollout

#: the keep-factors after ``action``, in the order the steps decide them (see the module doc)
KEEP_FACTORS = ("valid", "untied", "finished", "in_band")


def compose_mask(action: torch.Tensor, *factors: torch.Tensor | None) -> torch.Tensor:
    """The tokens kept by every factor: ``action`` [B, R] times each factor given, as float 0 / 1 [B, R].

    A factor is a row factor [B] (broadcast over the row's tokens), a token factor [B, R], or None (keeps all);
    bool or 0 / 1 numbers. The product of 0 / 1 values is exact, so the order of the factors does not matter.
    """
    mask = action.float()
    for keep in factors:
        if keep is not None:
            mask = mask * (keep.unsqueeze(-1) if keep.dim() == 1 else keep).float()
    return mask


def position_ids_of(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens, as ``generate`` uses them for left-padded prompts."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class Experience:
    """One rollout step, born at the rollout and filled by each numbered step of ``online.py``; tensors are [B, R]
    over response tokens unless noted. rows: the prompt records (extra fields feed reward functions), one per
    response. The keep-factors and the loss mask: see the module doc."""

    rollout: Rollout
    rows: list[dict]
    position_ids: torch.Tensor  # [B, P+R]
    action: torch.Tensor  # 2. float: the model's own tokens (keep-factor)
    texts: list[str] = field(default_factory=list)  # 3. decoded responses
    raw_scores: torch.Tensor | None = None  # [B] reward model + functions, before any shaping
    scores: torch.Tensor | None = None  # [B] scores used for learning (after penalty / normalisation / clipping)
    reward_metrics: dict = field(default_factory=dict)
    reward_extra: dict = field(default_factory=dict)  # 3. TRL's log_extra columns, one value per response
    valid: torch.Tensor | None = None  # 3. [B] bool: the sample has a finite reward (keep-factor)
    old_logprobs: torch.Tensor | None = None  # 4.
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None  # distillation: the teacher's log-prob of each sampled token
    greedy_agree: torch.Tensor | None = None  # distillation: [B, R] bool, the student's argmax is the teacher's
    teacher_aligned: torch.Tensor | None = None  # cross-tokenizer distillation: [B, R] bool, in a chunk the teacher
    #                                              scored (train/online/teacher.py); None with one tokenizer
    kl: torch.Tensor | None = None  # 5.
    returns: torch.Tensor | None = None
    untied: torch.Tensor | None = None  # 5. [B] bool: its group's scores differ (keep-factor, when filtering)
    finished: torch.Tensor | None = None  # 5. [B] bool: ended with EOS (keep-factor, with overlong filtering)
    in_band: torch.Tensor | None = None  # 5. what the off-policy correction keeps (keep-factor)
    loss_mask: torch.Tensor | None = None  # 5. every keep-factor, composed once (compose_loss_mask)
    advantages: torch.Tensor | None = None  # 5. masked with the loss mask
    is_weights: torch.Tensor | None = None  # 5. off-policy correction weights, masked (None: no correction)
    env_returns: torch.Tensor | None = None  # 2. multi-turn: [B] sum of the environment's per-turn rewards
    env_metrics: dict = field(default_factory=dict)
    turn_rewards: torch.Tensor | None = None  # multi-turn: [B, R] each turn's reward on its last model token

    @classmethod
    def of(cls, rollout: Rollout, rows: list[dict]) -> Experience:
        action = rollout.response_mask if rollout.action_mask is None else rollout.action_mask
        return cls(rollout=rollout, rows=rows, position_ids=position_ids_of(rollout.attention_mask),
                   action=action.float())

    @property
    def mask(self) -> torch.Tensor:
        """The loss mask once composed; before, the tokens kept by the keep-factors set so far."""
        return self.loss_mask if self.loss_mask is not None else self.keep_mask()

    def keep_mask(self, *factors: str) -> torch.Tensor:
        """``action`` times the named keep-factors (every one of :data:`KEEP_FACTORS` when none is named)."""
        return compose_mask(self.action, *(getattr(self, name) for name in factors or KEEP_FACTORS))

    @property
    def sample_mask(self) -> torch.Tensor:
        """The tokens of the samples in the step (``action`` x ``valid``): KL, shaped rewards, estimator."""
        return self.keep_mask("valid")

    def compose_loss_mask(self, advantages: torch.Tensor, is_weights: torch.Tensor | None) -> None:
        """Once, when every keep-factor is decided (end of step 5, before the update): the loss mask, and the
        advantages and importance weights (None: no correction) masked with it."""
        self.loss_mask = self.keep_mask()
        self.advantages = advantages * self.loss_mask
        self.is_weights = None if is_weights is None else is_weights * self.loss_mask

    def forward_rows(self, idx) -> dict:
        """What a forward pass over rows ``idx`` (a slice or an index tensor) needs; rows with images add
        ``media`` (one per row: their prompts' images)."""
        r = self.rollout
        out = {"input_ids": r.sequences[idx], "attention_mask": r.attention_mask[idx],
               "position_ids": self.position_ids[idx], "response_ids": r.response_ids[idx]}
        media = [row.get("media") for row in self.rows]
        if any(m is not None for m in media):
            picked = range(len(media))[idx] if isinstance(idx, slice) else idx.tolist()
            out["media"] = [media[i] for i in picked]
        return out

    def token_batches(self, budget: int) -> list[tuple[torch.Tensor, dict]]:
        """The rows in forward batches of at most ``budget`` tokens (:func:`token_budget_batches`), each as (row
        indices, :meth:`forward_rows` of them cut to the batch's own width: without the prompt padding every row of
        it has on the left and the response columns after its longest response)."""
        r = self.rollout
        prompt_len = r.prompt_mask.sum(-1)
        ends = r.response_mask.shape[1] - r.response_mask.flip(-1).long().argmax(-1)  # one past each row's last token
        response_len = torch.where(r.response_mask.bool().any(-1), ends, torch.ones_like(ends))
        out, p_len, r_len = [], prompt_len.tolist(), response_len.tolist()  # one host copy, not one per batch
        for rows in token_budget_batches(p_len, r_len, budget):
            idx = torch.tensor(rows, dtype=torch.long, device=r.prompt_ids.device)
            P, width = r.prompt_length, max(r_len[i] for i in rows)
            start = P - max(p_len[i] for i in rows)
            batch = self.forward_rows(idx)
            cut = {k: v[:, start: P + width] for k, v in batch.items() if isinstance(v, torch.Tensor)
                   and k != "response_ids"}
            out.append((idx, {**batch, **cut, "response_ids": batch["response_ids"][:, :width]}))
        return out

    def per_token(self, batches: list[tuple[torch.Tensor, dict]], parts: list[torch.Tensor]) -> torch.Tensor:
        """[B, R] of ``parts`` (one [b, width] tensor per batch of :meth:`token_batches`, computed from it) put back
        in row order, in the parts' dtype (float32 for floats); 0 after each batch's width (response padding,
        outside every mask)."""
        r = self.rollout
        dtype = torch.float32 if parts and parts[0].is_floating_point() else parts[0].dtype if parts else torch.float32
        out = torch.zeros(r.response_ids.shape, dtype=dtype, device=r.response_ids.device)
        for (idx, _), part in zip(batches, parts, strict=True):
            out[idx, : part.shape[1]] = part.to(dtype)
        return out

    def rows_of(self, idx: torch.Tensor) -> dict:
        """The tensors of rows ``idx`` needed by one PPO micro-batch (no ``old_logprobs`` when the step took none:
        the update is on-policy and uses its own, see ``Learner.on_policy_update``)."""
        out = {**self.forward_rows(idx), "mask": self.loss_mask[idx], "advantages": self.advantages[idx]}
        for name in ("old_logprobs", "ref_logprobs", "values", "returns", "is_weights"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value[idx]
        return out


def distill_metrics(exp: Experience, log_ratio_clip: float | None) -> dict:
    """Per-token means over the samples of the step (``exp.sample_mask``): ``distill/reverse_kl`` (student - teacher
    log-prob of the sampled token, the one-sample reverse KL, clamped as the teacher's reward is), the teacher's and
    the student's log-prob, and ``distill/argmax_agreement`` (the student's greedy token is the teacher's; one
    tokenizer only) or, across tokenizers, ``distill/aligned_frac`` (the student tokens the teacher's chunks cover);
    {} when the step has no teacher log-probs."""
    if exp.teacher_logprobs is None:
        return {}
    mask = exp.sample_mask
    reverse_kl = -algos.teacher_token_rewards(exp.teacher_logprobs, exp.old_logprobs, mask, 1.0, log_ratio_clip)
    mean = lambda x: float(algos.masked_mean(x, mask))  # noqa: E731
    out = {"distill/reverse_kl": mean(reverse_kl), "distill/teacher_logprob_mean": mean(exp.teacher_logprobs),
           "distill/student_logprob_mean": mean(exp.old_logprobs)}
    if exp.greedy_agree is not None:
        out["distill/argmax_agreement"] = mean(exp.greedy_agree.float())
    if exp.teacher_aligned is not None:
        out["distill/aligned_frac"] = mean(exp.teacher_aligned.float())
    return out


def token_budget_batches(prompt_lens: list[int], response_lens: list[int], budget: int) -> list[list[int]]:
    """Row indices in batches whose padded size (rows x (longest prompt + longest response)) stays within
    ``budget`` tokens; a row longer than the budget goes alone. Rows are taken longest first, so rows of like length
    share a batch and little padding is computed; a batch's rows keep ascending index order."""
    order = sorted(range(len(prompt_lens)), key=lambda i: (-(prompt_lens[i] + response_lens[i]), i))
    batches: list[list[int]] = []
    rows: list[int] = []
    p_max = r_max = 0
    for i in order:
        p, r = max(p_max, prompt_lens[i]), max(r_max, response_lens[i])
        if rows and (len(rows) + 1) * (p + r) > budget:
            batches.append(sorted(rows))
            rows, p, r = [], prompt_lens[i], response_lens[i]
        rows.append(i)
        p_max, r_max = p, r
    if rows:
        batches.append(sorted(rows))
    return batches


def merge_groups(parts: list[Experience], groups: list[tuple[int, int]], k: int, pad_token_id: int,
                 device) -> Experience:
    """One scored Experience of the groups ``groups`` ((part, prompt index) pairs) of ``parts`` (each ``k``
    completions per prompt), completion-major (row j * G + g is completion j of the g-th group): rows, texts, raw
    scores, ``valid``, turn rewards and reference log-probs carried with their rows; reward metrics averaged over the
    parts."""
    offsets, n = [], 0
    for e in parts:
        offsets.append(n)
        n += len(e.rollout)
    rows: list[int] = []
    for j in range(k):
        for part, p in groups:
            P = len(parts[part].rollout) // k
            rows.append(offsets[part] + j * P + p)
    idx = torch.tensor(rows, dtype=torch.long)
    rollout = Rollout.concat([e.rollout for e in parts], pad_token_id).index_select(idx)
    all_rows = [r for e in parts for r in e.rows]
    all_texts = [t for e in parts for t in e.texts]
    exp = Experience.of(rollout.to(device), [all_rows[i] for i in rows])
    exp.texts = [all_texts[i] for i in rows]
    exp.raw_scores = torch.cat([e.raw_scores for e in parts])[idx.to(device)]
    exp.valid = torch.cat([e.valid for e in parts])[idx.to(device)]
    R = rollout.response_ids.shape[1]
    for name in ("turn_rewards", "ref_logprobs"):  # [B, R] per token: padded to the merged width
        if all(getattr(e, name) is not None for e in parts):
            padded = [torch.nn.functional.pad(getattr(e, name), (0, R - getattr(e, name).shape[1])) for e in parts]
            setattr(exp, name, torch.cat(padded)[idx.to(device)])
    keys = set().union(*(e.reward_metrics for e in parts))
    exp.reward_metrics = {k_: sum(e.reward_metrics.get(k_, 0.0) for e in parts) / len(parts) for k_ in keys}
    return exp
