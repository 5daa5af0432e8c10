"""Under bf16 mixed precision, a prepared policy hands its logits to token_logprobs in bf16, not as accelerate's
float32 copy (train/run.keep_logits_dtype; bench/README.md e4), with the same log-probs."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from transformers import LlamaConfig, LlamaForCausalLM

from rlhfkit import algos
from rlhfkit.train.learner import Learner
from rlhfkit.train.run import keep_logits_dtype


def _prepared():
    AcceleratorState._reset_state()
    acc = Accelerator(mixed_precision="bf16", cpu=True)  # CPU autocast in bf16: what CUDA runs, on the test machine
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    return acc, acc.prepare(model)


def _logprobs_seen(acc, model, monkeypatch) -> tuple[torch.Tensor, list]:
    seen = []
    real = algos.token_logprobs
    monkeypatch.setattr(algos, "token_logprobs", lambda logits, labels: seen.append(logits.dtype) or
                        real(logits, labels))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded prompt
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
             "response_ids": ids[:, -4:]}
    trainer = SimpleNamespace(acc=acc, cfg=SimpleNamespace(generation=SimpleNamespace(temperature=1.0)))
    return Learner.logprobs_of(trainer, model, batch), seen


def test_logits_reach_token_logprobs_in_the_models_dtype(monkeypatch):
    acc, model = _prepared()
    before, seen_before = _logprobs_seen(acc, model, monkeypatch)
    assert seen_before == [torch.float32]  # accelerate's wrapper: a float32 [B, R, V] copy of bf16 logits
    keep_logits_dtype(acc, model)
    after, seen_after = _logprobs_seen(acc, model, monkeypatch)
    assert seen_after == [torch.bfloat16]  # the copy is gone
    # the float32 copy was an exact upcast and token_logprobs works in float32 blocks: the same log-probs
    assert torch.equal(before, after)
    out = model(input_ids=torch.tensor([[1, 2, 3]]))  # still under autocast: the forward runs in bf16
    assert out.logits.dtype == torch.bfloat16


def test_without_mixed_precision_nothing_changes():
    AcceleratorState._reset_state()
    acc = Accelerator(mixed_precision="no", cpu=True)
    model = acc.prepare(LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                                                     num_hidden_layers=1, num_attention_heads=4)))
    forward = model.forward
    keep_logits_dtype(acc, model)
    assert model.forward == forward
