"""A response sampled with one tokenizer, re-tokenised with another and aligned to it by character spans
(cross-tokenizer on-policy distillation; the alignment itself is :mod:`rlhfkit.algos.token_align`).

* :func:`decoded_ends`: the text of token ids and each token's end in it. Tokens are decoded one at a time with
  tokenizers' ``DecodeStream`` (a fast tokenizer; O(n)), which holds back the bytes of a character split across
  tokens until the token that completes it: the tokens before get the end of the token before them (zero width).
  A tokenizer without a backend decodes each prefix instead (O(n^2) characters).
* :func:`encode_with_ends`: ``text`` tokenised by another tokenizer (no special tokens added), its ends the same way;
  where its decoding differs from ``text`` (a normaliser that lowercases, a character it maps to ``<unk>``), its
  ends stop at the first difference, so the rest of the text is left unaligned rather than misaligned.
* :func:`align_response`: the two together for one response, the stop token handled apart: a response ending with
  one of the student's stop ids (EOS, ``<|im_end|>``) is aligned to the teacher's own end-of-turn token, one chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..algos.token_align import Chunk, align_spans


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def decoded_ends(tok, ids: Sequence[int]) -> tuple[str, list[int]]:
    """(text, ends): the text of ``ids`` under ``tok`` (special tokens kept as their text) and each token's end
    offset in it (non-decreasing; a token that completes no character has the previous token's end)."""
    ids = [int(i) for i in ids]
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        from tokenizers.decoders import DecodeStream

        stream, parts, ends, n = DecodeStream(skip_special_tokens=False), [], [], 0
        for i in ids:
            piece = stream.step(backend, i)
            if piece:
                parts.append(piece)
                n += len(piece)
            ends.append(n)
        return "".join(parts), ends
    text = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    ends, prev = [], 0
    for k in range(1, len(ids) + 1):
        prefix = tok.decode(ids[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False).rstrip("\ufffd")
        prev = max(prev, _common_prefix(prefix, text))
        ends.append(prev)
    return text, ends


def encode_with_ends(tok, text: str) -> tuple[list[int], list[int]]:
    """(ids, ends) of ``text`` tokenised by ``tok`` without added special tokens; ends as :func:`decoded_ends`,
    cut at the first character where the tokens' decoding differs from ``text``."""
    ids = [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]
    decoded, ends = decoded_ends(tok, ids)
    if decoded != text:
        same = _common_prefix(decoded, text)
        ends = [min(e, same) for e in ends]
    return ids, ends


def align_response(student_tok, teacher_tok, response_ids: Sequence[int], *, student_stop: Sequence[int],
                   teacher_eos: int) -> tuple[list[int], list[Chunk]]:
    """The teacher's ids of one student response and the chunks aligning them
    (:func:`~rlhfkit.algos.token_align.align_spans`): the response's text (without a final stop token) re-tokenised
    by ``teacher_tok``; a final student stop token (``student_stop``) is matched with ``teacher_eos`` as the last chunk.
    ``response_ids``: the response's tokens only (no padding). Returns (teacher ids, chunks over the student's and
    the teacher's tokens)."""
    ids = [int(i) for i in response_ids]
    stop = bool(ids) and ids[-1] in set(int(s) for s in student_stop)
    body = ids[:-1] if stop else ids
    text, s_ends = decoded_ends(student_tok, body)
    t_ids, t_ends = encode_with_ends(teacher_tok, text)
    chunks = align_spans(s_ends, t_ends)
    if stop:
        t_ids = t_ids + [int(teacher_eos)]
        chunks.append((len(body), len(body) + 1, len(t_ids) - 1, len(t_ids)))
    return t_ids, chunks


__all__ = ["align_response", "decoded_ends", "encode_with_ends"]
