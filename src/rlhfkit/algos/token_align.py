"""Two tokenisations of one text aligned by character spans (cross-tokenizer on-policy distillation: the student
samples with its tokenizer, the teacher scores the same text with its own).

A tokenisation is given as each token's *end* in the text (a character offset; token i covers
``text[ends[i - 1]:ends[i]]``, ``ends[-1] = len(text)``). A token that completes no character (a byte-level token
holding the first bytes of a multi-byte character) has the end of the token before it: a zero-width token, which
belongs with the next token that completes its character.

:func:`align_spans` cuts both sequences into *chunks*: the shortest runs of tokens on each side that cover the same
text. Chunk boundaries are exactly the character offsets where both sides end a token; inside a chunk no student
boundary is a teacher boundary. With one tokenizer every token is its own chunk.

:func:`chunk_teacher_logprobs` turns the teacher's log-probs of its own tokens into one log-prob per *student*
token, such that ``teacher - student`` is, on the last student token of each chunk, the chunk's log-ratio
``sum(teacher log-probs of its tokens) - sum(student log-probs of its tokens)``, and 0 on the other tokens: the
student's per-token distillation reward (:func:`~rlhfkit.algos.advantages.teacher_token_rewards`) then carries each
chunk's reverse-KL sample where the chunk's text is complete, and a return sums the same chunks as the sequence's.

What is approximated, and why:

* the teacher's probability of a chunk's text is that of *its own tokenisation* of the text (the chain rule over its
  tokens): other tokenisations of the same characters, which the teacher could also have produced, are not summed
  (as in GOLD / ULD and every text-span method; exact when the teacher's tokenisation of the text is the only one it
  gives mass to);
* credit inside a chunk: the student's tokens inside a multi-token chunk get no reward of their own, only the
  chunk's at its last token (with gamma = 1 each of them still sees it in its return);
* text past the last offset both sides end a token at (a response cut mid-character; a teacher tokenizer whose
  decoding departs from the text: a lowercasing normaliser, a character it maps to ``<unk>``) is not aligned: its
  student tokens get no teacher reward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: one aligned chunk: student tokens [s_start, s_stop), teacher tokens [t_start, t_stop)
Chunk = tuple[int, int, int, int]


def align_spans(student_ends: Sequence[int], teacher_ends: Sequence[int]) -> list[Chunk]:
    """The chunks of two tokenisations of one text, given each token's end offset (non-decreasing on each side).

    Returns ``[(s_start, s_stop, t_start, t_stop), ...]`` covering every token of both sides in order. A chunk closes
    at an offset past its start where both sides end a token; zero-width tokens there join the next chunk. The tokens
    of each side past the last common boundary (a text cut mid-character, or a tokenizer whose decoding departs
    from the text) form a one-sided chunk each (student's first), which no teacher signal reaches. Raises
    ``ValueError`` for decreasing ends. O(len(student) + len(teacher)).
    """
    for name, ends in (("student", student_ends), ("teacher", teacher_ends)):
        if any(b < a for a, b in zip(ends, ends[1:])) or (ends and ends[0] < 0):
            raise ValueError(f"{name} token ends must be non-decreasing offsets >= 0, got {list(ends)}")
    chunks: list[Chunk] = []
    n_s, n_t = len(student_ends), len(teacher_ends)
    s0 = t0 = i = j = 0
    start = 0  # the character offset where the open chunk starts
    while i < n_s and j < n_t:
        a, b = student_ends[i], teacher_ends[j]
        if a == b and a > start:
            chunks.append((s0, i + 1, t0, j + 1))
            s0, t0, start = i + 1, j + 1, a
            i, j = i + 1, j + 1
        elif a <= b:
            i += 1
        else:
            j += 1
    if s0 < n_s:  # tokens past the last common boundary cover no common text: one-sided chunks, no teacher signal
        chunks.append((s0, n_s, t0, t0))
    if t0 < n_t:
        chunks.append((n_s, n_s, t0, n_t))
    return chunks


def chunk_teacher_logprobs(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                           chunks: Sequence[Chunk]) -> torch.Tensor:
    """The teacher's log-probs [T_t] of its own tokens of one response, moved onto the student's tokens [T_s]
    through ``chunks`` (:func:`align_spans`): on the last student token of a chunk, ``student log-prob + (sum of the
    chunk's teacher log-probs - sum of its student log-probs)``; on every other student token its own log-prob
    (teacher - student = 0 there). A chunk without teacher tokens or without student tokens gets no teacher signal.

    student_logprobs [T_s] (the student's log-probs of its sampled tokens), teacher_logprobs [T_t] -> [T_s], in the
    student's dtype; no gradient flows (the teacher's reward is a constant of the update). With one tokenizer
    (every chunk one token each side) it returns ``teacher_logprobs`` (up to rounding of s + (t - s)).
    """
    s = student_logprobs.detach()
    t = teacher_logprobs.detach().to(s.dtype)
    both = [c for c in chunks if c[1] > c[0] and c[3] > c[2]]
    if not both:
        return s.clone()
    s_of = torch.tensor([k for k, (s0, s1, _, _) in enumerate(both) for _ in range(s1 - s0)], dtype=torch.long,
                        device=s.device)
    t_of = torch.tensor([k for k, (_, _, t0, t1) in enumerate(both) for _ in range(t1 - t0)], dtype=torch.long,
                        device=s.device)
    s_idx = torch.tensor([i for s0, s1, _, _ in both for i in range(s0, s1)], dtype=torch.long, device=s.device)
    t_idx = torch.tensor([i for _, _, t0, t1 in both for i in range(t0, t1)], dtype=torch.long, device=s.device)
    last = torch.tensor([s1 - 1 for _, s1, _, _ in both], dtype=torch.long, device=s.device)
    s_sum = torch.zeros(len(both), dtype=s.dtype, device=s.device).index_add_(0, s_of, s[s_idx])
    t_sum = torch.zeros(len(both), dtype=s.dtype, device=s.device).index_add_(0, t_of, t[t_idx])
    out = s.clone()
    out[last] = s[last] + (t_sum - s_sum)
    return out


__all__ = ["Chunk", "align_spans", "chunk_teacher_logprobs"]
