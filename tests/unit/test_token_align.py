"""Cross-tokenizer alignment (issue 34): the pure chunking of two tokenisations by character spans against hand cases
and a slow reference (chunk boundaries = the offsets both sides end a token at), the teacher's log-probs moved onto the
student's tokens (hand values, sums kept, identity for one tokenizer), and the tokenizer side on two different
built-in tokenizers: the tiny character tokenizer and a byte-level BPE tokenizer (trained here, offline, on the tiny
task's text), and SmolLM2's from its GGUF file (opt-in: ``-m gguf``)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

from rlhfkit.algos.token_align import align_spans, chunk_teacher_logprobs
from rlhfkit.data.retokenize import align_response, decoded_ends, encode_with_ends
from rlhfkit.models.tokenizer import load_tokenizer

TEXTS = ["Hello world, how are you?", "SHOUT THE WORD: apple!", "a  b\n\nc", "x", "12+34=46. ok"]


# ──────────────────────────────────────────────── align_spans ────────────────────────────────────────────────
def test_align_spans_hand_cases():
    # one tokenisation: every token its own chunk
    assert align_spans([1, 3, 6], [1, 3, 6]) == [(0, 1, 0, 1), (1, 2, 1, 2), (2, 3, 2, 3)]
    # "Hello world": student Hel|lo| wor|ld (3, 5, 9, 11), teacher He|llo| world (2, 5, 11): Hello / " world"
    assert align_spans([3, 5, 9, 11], [2, 5, 11]) == [(0, 2, 0, 2), (2, 4, 2, 3)]
    # a zero-width token (the first bytes of a character, end = the previous end) joins the next chunk
    assert align_spans([1, 2, 2, 3], [2, 3]) == [(0, 2, 0, 1), (2, 4, 1, 2)]
    assert align_spans([1, 1, 2], [2]) == [(0, 3, 0, 1)]
    assert align_spans([0, 2], [2]) == [(0, 2, 0, 1)]  # zero-width at the very start
    # text past the last common boundary: one-sided chunks (student's first), no teacher signal reaches them
    assert align_spans([2, 4, 5], [2, 3, 3]) == [(0, 1, 0, 1), (1, 3, 1, 1), (3, 3, 1, 3)]
    assert align_spans([2, 4, 4], [2, 4]) == [(0, 1, 0, 1), (1, 2, 1, 2), (2, 3, 2, 2)]  # a cut final character
    assert align_spans([], []) == [] and align_spans([3], []) == [(0, 1, 0, 0)] and align_spans([], [3]) == [
        (0, 0, 0, 1)]
    with pytest.raises(ValueError, match="non-decreasing"):
        align_spans([2, 1], [2])


def _random_tokenisation(rng: random.Random, n_chars: int, zero_width: float) -> list[int]:
    """Ends of a random tokenisation of n_chars characters, with zero-width tokens sprinkled in."""
    cuts = sorted(rng.sample(range(1, n_chars), rng.randint(0, n_chars - 1))) + [n_chars]
    ends = []
    for c in cuts:
        while rng.random() < zero_width:
            ends.append(ends[-1] if ends else 0)
        ends.append(c)
    return ends


@pytest.mark.parametrize("seed", range(30))
def test_align_spans_matches_the_slow_reference(seed):
    # the slow definition: chunk boundaries are exactly the offsets > 0 where both sides end a token (set
    # intersection); each chunk's tokens on each side cover the same characters; every token in exactly one chunk
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    a, b = _random_tokenisation(rng, n, 0.2), _random_tokenisation(rng, n, 0.2)
    chunks = align_spans(a, b)
    assert [i for c in chunks for i in range(c[0], c[1])] == list(range(len(a)))
    assert [j for c in chunks for j in range(c[2], c[3])] == list(range(len(b)))
    common = sorted(set(a) & set(b) - {0})
    assert [a[s1 - 1] for s0, s1, t0, t1 in chunks] == common  # both end at the full text: nothing one-sided
    for s0, s1, t0, t1 in chunks:
        start_a = a[s0 - 1] if s0 else 0
        start_b = b[t0 - 1] if t0 else 0
        assert (start_a, a[s1 - 1]) == (start_b, b[t1 - 1])  # the same characters
        assert not set(a[s0:s1 - 1]) & set(b[t0:t1 - 1]) - {start_a}  # no common boundary inside a chunk


# ─────────────────────────────────────────────── chunk_teacher_logprobs ───────────────────────────────────────────────
def test_chunk_teacher_logprobs_hand_values():
    s = torch.tensor([-1.0, -0.5, -2.0, -0.25])  # student tokens Hel|lo| wor|ld
    t = torch.tensor([-0.7, -0.1, -1.5])  # teacher tokens He|llo| world
    chunks = [(0, 2, 0, 2), (2, 4, 2, 3)]
    out = chunk_teacher_logprobs(s, t, chunks)
    # chunk 1: teacher -0.8, student -1.5 -> on token 1: -0.5 + 0.7 = 0.2; chunk 2: -1.5 - -2.25 = 0.75 on token 3
    torch.testing.assert_close(out, torch.tensor([-1.0, 0.2, -2.0, 0.5]))
    torch.testing.assert_close(out - s, torch.tensor([0.0, 0.7, 0.0, 0.75]))  # the reward: each chunk's log-ratio
    # one-sided chunks get no teacher signal; the input is not modified and carries no gradient
    x = s.clone().requires_grad_(True)
    out = chunk_teacher_logprobs(x, t, [(0, 2, 0, 2), (2, 4, 2, 2), (4, 4, 2, 3)])
    torch.testing.assert_close(out, torch.tensor([-1.0, 0.2, -2.0, -0.25]))
    assert not out.requires_grad and torch.equal(x.detach(), s)
    assert torch.equal(chunk_teacher_logprobs(s, t, []), s)


@pytest.mark.parametrize("seed", range(10))
def test_chunk_teacher_logprobs_matches_slow_loop_and_keeps_the_sums(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 30)
    a, b = _random_tokenisation(rng, n, 0.1), _random_tokenisation(rng, n, 0.1)
    chunks = align_spans(a, b)
    g = torch.Generator().manual_seed(seed)
    s, t = -torch.rand(len(a), generator=g, dtype=torch.float64) * 3, -torch.rand(len(b), generator=g,
                                                                                 dtype=torch.float64) * 3
    out = chunk_teacher_logprobs(s, t, chunks)
    want = s.clone()
    for s0, s1, t0, t1 in chunks:  # the slow loop
        if s1 > s0 and t1 > t0:
            want[s1 - 1] = s[s1 - 1] + sum(float(t[j]) for j in range(t0, t1)) - sum(float(s[i]) for i in range(s0, s1))
    torch.testing.assert_close(out, want)
    # the sequence's log-ratio is kept: sum(out - s) = sum(teacher) - sum(student) (every token in a two-sided chunk)
    assert float((out - s).sum()) == pytest.approx(float(t.sum() - s.sum()))


def test_one_tokenizer_gives_the_teacher_log_probs_back():
    g = torch.Generator().manual_seed(0)
    s, t = -torch.rand(9, generator=g), -torch.rand(9, generator=g)
    ends = list(range(1, 10))
    torch.testing.assert_close(chunk_teacher_logprobs(s, t, align_spans(ends, ends)), t)


# ───────────────────────────────────────────── the tokenizer side ─────────────────────────────────────────────
@pytest.fixture(scope="module")
def tiny():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def bpe(bpe_tokenizer):
    """A second tokenizer, byte-level BPE with merges, trained offline on the tiny task's text (tests/conftest.py)."""
    return bpe_tokenizer


@pytest.mark.parametrize("name", ["tiny", "bpe"])
def test_decoded_ends_are_the_text_of_each_prefix(name, tiny, bpe):
    tok = {"tiny": tiny, "bpe": bpe}[name]
    for text in TEXTS + ["é ü 日本"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        decoded, ends = decoded_ends(tok, ids)
        assert decoded == tok.decode(ids)
        assert len(ends) == len(ids) and ends[-1] == len(decoded)
        for k in range(len(ids)):  # a token's end: the longest prefix of the text its tokens so far complete
            prefix = tok.decode(ids[:k + 1]).rstrip("\ufffd")
            assert decoded.startswith(prefix) and ends[k] == len(prefix)


def test_decoded_ends_without_a_fast_backend_match(tiny, bpe):
    # the fallback (a tokenizer with no backend_tokenizer: prefix decoding) gives the same ends as DecodeStream
    class Slow:
        def __init__(self, tok):
            self.tok = tok

        def decode(self, ids, **kw):
            return self.tok.decode(ids, **kw)

    for tok in (tiny, bpe):
        ids = tok("SHOUT é!", add_special_tokens=False)["input_ids"]
        assert decoded_ends(Slow(tok), ids) == decoded_ends(tok, ids)


def _check_alignment(s_tok, t_tok, s_ids, t_ids, chunks, stop: bool):
    """Every two-sided chunk covers the same text on both sides; the chunks cover every token; the stop chunk last."""
    body_s, body_t = (s_ids[:-1], t_ids[:-1]) if stop else (s_ids, t_ids)
    text, s_ends = decoded_ends(s_tok, body_s)
    _, t_ends = decoded_ends(t_tok, body_t)
    assert [i for c in chunks for i in range(c[0], c[1])] == list(range(len(s_ids)))
    assert [j for c in chunks for j in range(c[2], c[3])] == list(range(len(t_ids)))
    two_sided = [c for c in chunks if c[1] > c[0] and c[3] > c[2]]
    for s0, s1, t0, t1 in two_sided[:-1] if stop else two_sided:
        start = s_ends[s0 - 1] if s0 else 0
        assert start == (t_ends[t0 - 1] if t0 else 0) and s_ends[s1 - 1] == t_ends[t1 - 1] > start
    if stop:
        assert chunks[-1] == (len(s_ids) - 1, len(s_ids), len(t_ids) - 1, len(t_ids))
    return text


@pytest.mark.parametrize("direction", ["tiny->bpe", "bpe->tiny"])
def test_align_response_across_two_tokenizers(direction, tiny, bpe):
    s_tok, t_tok = (tiny, bpe) if direction == "tiny->bpe" else (bpe, tiny)
    n_chunks = n_tokens = 0
    for text in TEXTS:
        s_ids = s_tok(text, add_special_tokens=False)["input_ids"] + [s_tok.eos_token_id]
        t_ids, chunks = align_response(s_tok, t_tok, s_ids, student_stop=[s_tok.eos_token_id],
                                       teacher_eos=t_tok.eos_token_id)
        assert t_ids[-1] == t_tok.eos_token_id and t_tok.decode(t_ids[:-1]) == text
        assert _check_alignment(s_tok, t_tok, s_ids, t_ids, chunks, stop=True) == text
        # a text of ASCII words is fully aligned: every token of both sides is in a two-sided chunk
        assert all(c[1] > c[0] and c[3] > c[2] for c in chunks)
        n_chunks, n_tokens = n_chunks + len(chunks), n_tokens + len(s_ids)
    if direction == "tiny->bpe":
        assert n_chunks < n_tokens  # BPE tokens span several characters: chunks of several tiny tokens
    # a response cut at max_new_tokens (no stop token) is aligned without an end-of-turn chunk
    s_ids = s_tok("SHOUT apple", add_special_tokens=False)["input_ids"]
    t_ids, chunks = align_response(s_tok, t_tok, s_ids, student_stop=[s_tok.eos_token_id],
                                   teacher_eos=t_tok.eos_token_id)
    assert t_tok.eos_token_id not in t_ids and _check_alignment(s_tok, t_tok, s_ids, t_ids, chunks, stop=False)


def test_text_a_teacher_cannot_spell_is_left_unaligned(tiny, bpe):
    # the tiny tokenizer maps 'é' to <unk>: the student's text from there on gets no teacher chunk (one-sided)
    s_ids = bpe("ok café ok", add_special_tokens=False)["input_ids"]
    t_ids, chunks = align_response(bpe, tiny, s_ids, student_stop=[], teacher_eos=tiny.eos_token_id)
    text, s_ends = decoded_ends(bpe, s_ids)
    aligned_to = max(s_ends[c[1] - 1] for c in chunks if c[1] > c[0] and c[3] > c[2])
    assert text[:aligned_to] in ("ok ", "ok caf", "ok") and aligned_to <= text.index("é")
    assert any(c[3] == c[2] and c[1] > c[0] for c in chunks)  # the rest: student tokens with no teacher tokens
    # a byte-level student splitting 'é' into bytes, and a teacher that has it: the zero-width byte joins its char
    ids = bpe("é", add_special_tokens=False)["input_ids"]
    _, ends = decoded_ends(bpe, ids)
    if len(ids) > 1:
        assert ends[:-1] == [0] * (len(ids) - 1) and ends[-1] == 1
    t_ids, chunks = align_response(tiny, bpe, tiny("caf", add_special_tokens=False)["input_ids"], student_stop=[],
                                   teacher_eos=bpe.eos_token_id)
    assert _check_alignment(tiny, bpe, tiny("caf", add_special_tokens=False)["input_ids"], t_ids, chunks, stop=False)


def test_same_tokenizer_is_one_chunk_per_token(tiny):
    ids = tiny("SHOUT apple!", add_special_tokens=False)["input_ids"] + [tiny.eos_token_id]
    t_ids, chunks = align_response(tiny, tiny, ids, student_stop=[tiny.eos_token_id], teacher_eos=tiny.eos_token_id)
    assert t_ids == ids and chunks == [(i, i + 1, i, i + 1) for i in range(len(ids))]


def test_encode_with_ends_cuts_at_the_first_difference(tiny):
    ids, ends = encode_with_ends(tiny, "ab é cd")
    assert tiny.decode(ids) == "ab <unk> cd" and ends == [1, 2, 3, 3, 3, 3, 3]


# ─────────────────────────────────────────────── SmolLM2 (opt-in) ───────────────────────────────────────────────
def _smollm2_tokenizer():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    try:
        from smollm2 import find_smollm2_gguf, search_report
    finally:
        sys.path.pop(0)
    path = find_smollm2_gguf()
    if path is None:
        pytest.skip(search_report())
    from rlhfkit.models.tokenizer import _tokenizer_from_files

    return _tokenizer_from_files(path)


@pytest.mark.gguf
def test_smollm2_and_tiny_tokenizers_align(tiny):
    smol, stop = _smollm2_tokenizer()
    assert smol.eos_token == "<|im_end|>" and len(smol) > 40000
    for s_tok, s_stop, t_tok, t_eos in ((smol, stop, tiny, tiny.eos_token_id), (tiny, [tiny.eos_token_id], smol,
                                                                                   stop[0])):
        for text in TEXTS:
            s_ids = s_tok(text, add_special_tokens=False)["input_ids"] + [s_stop[0]]
            t_ids, chunks = align_response(s_tok, t_tok, s_ids, student_stop=s_stop, teacher_eos=t_eos)
            assert _check_alignment(s_tok, t_tok, s_ids, t_ids, chunks, stop=True) == text
            assert all(c[1] > c[0] and c[3] > c[2] for c in chunks)
    # SmolLM2's byte-level tokens of a multi-byte character: zero-width until the byte that completes it
    ids = smol("日本", add_special_tokens=False)["input_ids"]
    text, ends = decoded_ends(smol, ids)
    assert text == "日本" and ends[-1] == 2 and all(e in (0, 1, 2) for e in ends)
    # a student that sampled a non-canonical split ("Hel" + "lo" where SmolLM2 has "Hello") aligns to one chunk
    hel, lo = smol("Hel", add_special_tokens=False)["input_ids"], smol("lo", add_special_tokens=False)["input_ids"]
    t_ids, chunks = align_response(smol, smol, hel + lo, student_stop=stop, teacher_eos=stop[0])
    assert t_ids == smol("Hello", add_special_tokens=False)["input_ids"] and len(t_ids) == 1
    assert chunks == [(0, len(hel + lo), 0, 1)]
