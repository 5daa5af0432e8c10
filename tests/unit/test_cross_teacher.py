"""The cross-tokenizer teacher pass (issue 34): with the student's own tokenizer it reproduces the same-tokenizer
teacher log-probs; with another tokenizer (a byte-level BPE teacher, the student the tiny character model) each
chunk's log-ratio lands on its last student token, the teacher's log-probs are those of a forward of each row alone
(batching and padding change nothing), and the sums over the aligned tokens are kept."""

from __future__ import annotations

import pytest
import torch

from rlhfkit import algos
from rlhfkit.algos.token_align import chunk_teacher_logprobs
from rlhfkit.data.chat import render_prompt_ids, stop_token_ids
from rlhfkit.models.tokenizer import load_tokenizer
from rlhfkit.train.online.experience import position_ids_of
from rlhfkit.train.online.teacher import CrossTokenizerTeacher
from rlhfkit.train.shared.forward import response_logits

MESSAGES = [[{"role": "user", "content": "Shout the word: apple"}], [{"role": "user", "content": "Say hi."}]] * 2
TEXTS = ["APPLE!", "hi there", "APPLE APPLE", "h"]


def _model(tok, seed=0):
    from transformers import LlamaForCausalLM

    from rlhfkit.models.tiny import tiny_llama_config

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config("tiny:hidden=32,layers=2,heads=2,kv_heads=2,intermediate=64",
                                              tok)).eval()


def _responses(tok, stop: bool):
    """Right-padded response ids / mask of TEXTS (the last two without their stop token when ``stop``)."""
    rows = [tok(t, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if stop and i < 2 else [])
            for i, t in enumerate(TEXTS)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
    return ids, mask


def _alone(model, tok, msgs, response):
    """The model's log-probs of ``response`` after ``msgs``, one row, no padding: the slow reference."""
    prompt = render_prompt_ids(tok, msgs)
    ids = torch.tensor([prompt + response])
    mask = torch.ones_like(ids)
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids_of(mask),
             "response_ids": torch.tensor([response])}
    with torch.no_grad():
        return algos.token_logprobs(response_logits(model, batch, 1.0), batch["response_ids"]).float()[0]


def test_same_tokenizer_gives_the_teacher_log_probs_of_the_student_tokens():
    tiny = load_tokenizer("tiny")
    teacher = _model(tiny, seed=1)
    ids, mask = _responses(tiny, stop=True)
    student_lp = -torch.rand(ids.shape)
    cross = CrossTokenizerTeacher(tiny, tiny, stop_token_ids(tiny))
    out, aligned = cross.logprobs(teacher, MESSAGES, ids, mask, student_lp, temperature=1.0, budget=64)
    assert torch.equal(aligned, mask.bool())
    for i, msgs in enumerate(MESSAGES):
        n = int(mask[i].sum())
        torch.testing.assert_close(out[i, :n], _alone(teacher, tiny, msgs, ids[i, :n].tolist()), atol=1e-5, rtol=1e-5)
        assert torch.equal(out[i, n:], student_lp[i, n:])  # padding untouched


@pytest.mark.parametrize("stop", [True, False])
def test_another_tokenizer_moves_each_chunk_onto_its_last_student_token(bpe_tokenizer, stop):
    tiny = load_tokenizer("tiny")
    teacher_tok = bpe_tokenizer  # byte-level BPE (tests/conftest.py)
    teacher = _model(teacher_tok, seed=2)
    ids, mask = _responses(tiny, stop=stop)
    g = torch.Generator().manual_seed(0)
    student_lp = -torch.rand(ids.shape, generator=g)
    cross = CrossTokenizerTeacher(tiny, teacher_tok, stop_token_ids(tiny))
    out, aligned = cross.logprobs(teacher, MESSAGES, ids, mask, student_lp, temperature=1.0, budget=40)
    assert out.shape == ids.shape and torch.equal(aligned, mask.bool())  # ASCII text: every token aligned
    n_chunks = 0
    for i, msgs in enumerate(MESSAGES):
        n = int(mask[i].sum())
        t_prompt, t_ids, chunks = cross.inputs([msgs], [ids[i, :n].tolist()])[0]
        assert t_prompt == render_prompt_ids(teacher_tok, msgs)
        assert teacher_tok.decode(t_ids).replace("<|im_end|>", "") == TEXTS[i]
        assert (t_ids[-1] == teacher_tok.eos_token_id) == (stop and i < 2)
        t_lp = _alone(teacher, teacher_tok, msgs, t_ids)  # the slow reference: this row alone, no padding
        want = chunk_teacher_logprobs(student_lp[i, :n], t_lp, chunks)
        torch.testing.assert_close(out[i, :n], want, atol=1e-5, rtol=1e-5)
        # the reward sums to the sequence's log-ratio: teacher's tokens minus the student's
        assert float((out[i, :n] - student_lp[i, :n]).sum()) == pytest.approx(float(t_lp.sum() - student_lp[i, :n]
                                                                                    .sum()), abs=1e-4)
        assert torch.equal(out[i, n:], student_lp[i, n:])
        n_chunks += len(chunks)
    assert n_chunks < int(mask.sum())  # some BPE tokens span several characters: multi-token chunks
