"""The rollout engine's sampling log-probs equal the trainer's forward on the tiny model (float32), at temperature
1 and 0.7; with top-k / top-p they are those of the renormalised distribution actually sampled."""

import pytest
import torch

from rlhfkit.algos import token_logprobs
from rlhfkit.config import ModelConfig
from rlhfkit.models.loading import load_causal_lm
from rlhfkit.rollout import HFEngine, Rollout, SamplingParams


@pytest.fixture(scope="module")
def tiny():
    return load_causal_lm(ModelConfig(name="tiny:hidden=32,layers=1", dtype="float32"), device=torch.device("cpu"),
                          seed=0)


def _hf(tok) -> HFEngine:
    return HFEngine(tok, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)


def _trainer_logprobs(model, r: Rollout, temperature: float, top_k: int = 0) -> torch.Tensor:
    am = r.attention_mask
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    R = r.response_ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=r.sequences, attention_mask=am, position_ids=pos).logits[:, -R - 1:-1] / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return token_logprobs(logits, r.response_ids)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_the_trainer_forward(tiny, temperature):
    model, tok = tiny
    r = _hf(tok).generate(model, [[5, 6, 7], [8, 9], [10, 11, 12, 13]] * 2,
                          SamplingParams(max_new_tokens=12, temperature=temperature), seed=3)
    assert r.logprobs is not None and r.logprobs.shape == r.response_ids.shape
    mask = r.response_mask.bool()
    torch.testing.assert_close(r.logprobs[mask], _trainer_logprobs(model, r, temperature)[mask], atol=1e-5, rtol=0)
    assert torch.all(r.logprobs[~mask] == 0)
    assert torch.all(r.logprobs[mask] <= 0)


def test_top_k_logprobs_are_of_the_renormalised_distribution(tiny):
    model, tok = tiny
    r = _hf(tok).generate(model, [[5, 6, 7], [8, 9]] * 2, SamplingParams(max_new_tokens=8, temperature=0.7, top_k=5),
                          seed=4)
    mask = r.response_mask.bool()
    plain = _trainer_logprobs(model, r, 0.7)[mask]
    topk = _trainer_logprobs(model, r, 0.7, top_k=5)[mask]
    torch.testing.assert_close(r.logprobs[mask], topk, atol=1e-5, rtol=0)
    assert torch.all(r.logprobs[mask] >= plain - 1e-6)  # renormalised over 5 tokens: never less likely


def test_rollout_carries_logprobs_through_select_and_concat(tiny):
    model, tok = tiny
    eng = _hf(tok)
    a = eng.generate(model, [[5, 6]], SamplingParams(max_new_tokens=3), seed=0)
    b = eng.generate(model, [[5, 6, 7, 8]], SamplingParams(max_new_tokens=6), seed=0)
    both = Rollout.concat([a, b], tok.pad_token_id)
    assert both.logprobs.shape == both.response_ids.shape
    torch.testing.assert_close(both[1].logprobs[:, : b.logprobs.shape[1]], b.logprobs)
    assert both[0].logprobs[0, a.logprobs.shape[1]:].abs().sum() == 0
    no_lp = Rollout(a.prompt_ids, a.prompt_mask, a.response_ids, a.response_mask, a.ended, a.lengths)
    assert Rollout.concat([no_lp, b], tok.pad_token_id).logprobs is None
    assert no_lp.to("cpu").logprobs is None
