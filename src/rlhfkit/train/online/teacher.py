"""A distillation teacher with another tokenizer than the student's (cross-tokenizer on-policy distillation).

The student samples with its tokenizer; the teacher reads the same conversation with its own: the prompt rendered by
the teacher's chat template, the student's response decoded and re-tokenised (its final stop token matched with the
teacher's end of turn). One teacher forward scores the teacher's tokens, and the two tokenisations are aligned by
character spans (:mod:`rlhfkit.data.retokenize`, :mod:`rlhfkit.algos.token_align`): each chunk's log-ratio lands on
the chunk's last student token, so the student's per-token reward is the same function as with one tokenizer
(:func:`rlhfkit.algos.teacher_token_rewards`). What is approximated is said in :mod:`rlhfkit.algos.token_align`;
what is not built: multi-turn episodes (environment tokens between the model's), and the greedy-agreement metric
(the two models' argmax tokens are not in one vocabulary).
"""

from __future__ import annotations

import torch

from ...algos.token_align import chunk_teacher_logprobs
from ...data.chat import render_prompt_ids, stop_token_ids
from ...data.retokenize import align_response
from ...rollout.engine import left_pad
from ..shared.forward import response_stats
from .experience import position_ids_of, token_budget_batches


class CrossTokenizerTeacher:
    """The teacher's log-probs of a student's responses, moved onto the student's tokens (one per response token).

    ``student_tok`` / ``teacher_tok``: the two tokenizers (each with its chat template); ``student_stop``: the ids
    that end a student reply (its EOS, ``<|im_end|>``); the teacher's end of turn is its first stop id."""

    def __init__(self, student_tok, teacher_tok, student_stop: list[int]):
        self.student_tok, self.teacher_tok = student_tok, teacher_tok
        self.student_stop = list(student_stop)
        self.teacher_eos = stop_token_ids(teacher_tok)[0]

    def inputs(self, messages: list[list[dict]], responses: list[list[int]]):
        """The teacher's rows: (prompt ids, response ids, chunks) per response, for the conversations ``messages``
        (one per response) and the student's response ids (without padding)."""
        rows = []
        for msgs, ids in zip(messages, responses, strict=True):
            t_ids, chunks = align_response(self.student_tok, self.teacher_tok, ids, student_stop=self.student_stop,
                                           teacher_eos=self.teacher_eos)
            rows.append((render_prompt_ids(self.teacher_tok, msgs), t_ids, chunks))
        return rows

    @torch.no_grad()
    def logprobs(self, teacher, messages: list[list[dict]], response_ids: torch.Tensor, response_mask: torch.Tensor,
                 student_logprobs: torch.Tensor, *, temperature: float, budget: int,
                 autocast=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(teacher log-probs on the student's tokens [B, R], aligned [B, R] bool: the student tokens in a chunk the
        teacher scored). ``response_ids`` / ``response_mask`` [B, R]: the student's responses (a row's tokens are the
        masked ones, from its start); ``student_logprobs`` [B, R]: the student's log-probs of them (the rewards'
        other term). The teacher runs in batches of <= ``budget`` tokens (``memory.forward_tokens``), on its own
        device, logits divided by ``temperature`` as the student's are; ``autocast``: a context factory (mixed
        precision) or None."""
        lengths = response_mask.long().sum(-1).tolist()
        ids = response_ids.cpu().tolist()
        rows = self.inputs(messages, [row[:n] for row, n in zip(ids, lengths)])
        device = next(teacher.parameters()).device
        pad = self.teacher_tok.pad_token_id
        t_lp: list[torch.Tensor] = [torch.zeros(0)] * len(rows)
        for batch_rows in token_budget_batches([len(p) for p, _, _ in rows], [len(r) for _, r, _ in rows], budget):
            p_ids, p_mask = left_pad([rows[i][0] for i in batch_rows], pad)
            width = max(1, max(len(rows[i][1]) for i in batch_rows))
            r_ids = torch.full((len(batch_rows), width), pad, dtype=torch.long)
            r_mask = torch.zeros_like(r_ids)
            for k, i in enumerate(batch_rows):
                n = len(rows[i][1])
                r_ids[k, :n], r_mask[k, :n] = torch.as_tensor(rows[i][1], dtype=torch.long), 1
            mask = torch.cat([p_mask, r_mask], 1)
            batch = {"input_ids": torch.cat([p_ids, r_ids], 1).to(device), "attention_mask": mask.to(device),
                     "position_ids": position_ids_of(mask).to(device), "response_ids": r_ids.to(device)}
            with autocast() if autocast is not None else torch.autocast(device.type, enabled=False):
                lp = response_stats(teacher, batch, temperature).logprobs.float().cpu()
            for k, i in enumerate(batch_rows):
                t_lp[i] = lp[k, :len(rows[i][1])]
        student = student_logprobs.detach().float().cpu()  # one copy to the host and one back, not one a row
        out = student.clone()
        aligned = torch.zeros(response_mask.shape, dtype=torch.bool)
        for i, (n, (_, _, chunks)) in enumerate(zip(lengths, rows)):
            out[i, :n] = chunk_teacher_logprobs(student[i, :n], t_lp[i], chunks)
            for s0, s1, t0, t1 in chunks:
                if s1 > s0 and t1 > t0:
                    aligned[i, s0:s1] = True
        return (out.to(student_logprobs.device, student_logprobs.dtype),
                aligned.to(response_mask.device))


__all__ = ["CrossTokenizerTeacher"]
