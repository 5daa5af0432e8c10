"""The :class:`Rollout` batch: prompts (left-padded) and the responses generated for them (right-padded), with
masks that end at each response's first EOS or stop string."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Rollout:
    """Prompts and generated responses of one batch; every tensor has the batch in dim 0::

        prompt_ids     [B, P] long   prompt tokens, LEFT-padded (pad id, mask 0 on the left)
        prompt_mask    [B, P] long   1 on real prompt tokens
        response_ids   [B, R] long   generated tokens, RIGHT-padded with the pad id after the end
        response_mask  [B, R] long   1 on every generated token up to AND including the first EOS (or the token that
                                     completes a stop string), 0 after
        ended          [B]    bool   True when the response ended with EOS / a stop string, False when it was cut at
                                     ``max_new_tokens``
        lengths        [B]    long   ``response_mask.sum(-1)``
        logprobs       [B, R] float  log-probability of each response token under the distribution it was SAMPLED from
                                     (after temperature / top-k / top-p), as the engine computed it; 0 after the end.
                                     None when the engine does not report them. The trainer's own log-probs may differ
                                     (other kernels, precision, top-p): the off-policy correction compares the two.
        action_mask    [B, R] long   multi-turn episodes (``envs``): 1 on the model's own tokens, 0 on tool /
                                     environment tokens (which ``response_mask`` covers: the model attends to them).
                                     None for single-turn rollouts, where it equals ``response_mask``.

    Padding is never found by comparing ids with the pad id (pad may equal EOS); use the masks.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    ended: torch.Tensor
    lengths: torch.Tensor
    logprobs: torch.Tensor | None = None
    action_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def sequences(self) -> torch.Tensor:
        """Prompt and response ids side by side, [B, P + R]."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """Masks of :attr:`sequences`, [B, P + R] (0 on the left prompt padding and after each response's end)."""
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def prompt_length(self) -> int:
        """P: the padded prompt width (the response of row b starts at column P of :attr:`sequences`)."""
        return int(self.prompt_ids.shape[1])

    def _map(self, fn) -> Rollout:
        return Rollout(**{f.name: None if getattr(self, f.name) is None else fn(getattr(self, f.name))
                          for f in fields(self)})

    def to(self, device) -> Rollout:
        """A copy with every tensor on ``device``."""
        return self._map(lambda t: t.to(device))

    def index_select(self, rows: torch.Tensor) -> Rollout:
        """The rows ``rows`` (a 1-D long tensor of row indices) of every tensor."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        return self._map(lambda t: t.index_select(0, rows.to(t.device)))

    def __getitem__(self, rows) -> Rollout:
        """Row selection by slice, int, index list / tensor or boolean mask; always keeps the batch dim."""
        if isinstance(rows, int):
            rows = slice(rows, rows + 1 if rows != -1 else None)
        if isinstance(rows, slice):
            return self._map(lambda t: t[rows])
        rows = torch.as_tensor(rows)
        if rows.dtype == torch.bool:
            rows = rows.nonzero().flatten()
        return self.index_select(rows)

    @staticmethod
    def concat(rollouts: list[Rollout], pad_token_id: int) -> Rollout:
        """Stack rollouts of possibly different widths: prompts re-padded on the left, responses on the right."""
        if not rollouts:
            raise ValueError("Rollout.concat needs at least one rollout")
        if len(rollouts) == 1:
            return rollouts[0]
        P = max(r.prompt_ids.shape[1] for r in rollouts)
        R = max(r.response_ids.shape[1] for r in rollouts)

        def pad(t: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
            extra = width - t.shape[1]
            if extra == 0:
                return t
            return torch.nn.functional.pad(t, (extra, 0) if left else (0, extra), value=value)

        return Rollout(
            prompt_ids=torch.cat([pad(r.prompt_ids, P, pad_token_id, True) for r in rollouts]),
            prompt_mask=torch.cat([pad(r.prompt_mask, P, 0, True) for r in rollouts]),
            response_ids=torch.cat([pad(r.response_ids, R, pad_token_id, False) for r in rollouts]),
            response_mask=torch.cat([pad(r.response_mask, R, 0, False) for r in rollouts]),
            ended=torch.cat([r.ended for r in rollouts]),
            lengths=torch.cat([r.lengths for r in rollouts]),
            logprobs=None if any(r.logprobs is None for r in rollouts)
            else torch.cat([pad(r.logprobs, R, 0.0, False) for r in rollouts]),
            action_mask=None if all(r.action_mask is None for r in rollouts)
            else torch.cat([pad(r.response_mask if r.action_mask is None else r.action_mask, R, 0, False)
                            for r in rollouts]),
        )
