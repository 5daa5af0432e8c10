"""Under bf16 mixed precision a prepared policy's logits stay bf16, not accelerate's float32 copy
(train/run.keep_logits_dtype; bench/README.md e4), and the trainer's fused head computes in bf16 as they did."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from transformers import LlamaConfig, LlamaForCausalLM

from rlhfkit import algos
from rlhfkit.train.lifecycle.run import keep_logits_dtype
from rlhfkit.train.online.learner import Learner


def _prepared():
    AcceleratorState._reset_state()
    acc = Accelerator(mixed_precision="bf16", cpu=True)  # CPU autocast in bf16: what CUDA runs, on the test machine
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    return acc, acc.prepare(model)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded prompt
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "response_ids": ids[:, -4:]}


def test_the_fused_head_computes_in_bf16_as_the_plain_logits_did():
    """The trainer's log-probs (through the LM head in chunks, train/shared/forward.py) equal those of the plain path
    under
    the same bf16 autocast: bf16 logits from the head, then the float32 softmax of them."""
    acc, model = _prepared()
    keep_logits_dtype(acc, model)
    batch = _batch()
    trainer = SimpleNamespace(acc=acc, cfg=SimpleNamespace(generation=SimpleNamespace(temperature=1.0)))
    ours = Learner.logprobs_of(trainer, model, batch)
    with torch.no_grad(), acc.autocast():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, -5:-1]
    assert logits.dtype == torch.bfloat16  # still under autocast: the forward runs in bf16, no float32 copy
    assert ours.dtype == torch.float32
    # the same bf16 matmul per row and the same float32 softmax: equal here (bf16 rounding would allow ~1e-2)
    torch.testing.assert_close(ours, algos.token_logprobs(logits, batch["response_ids"]), atol=1e-3, rtol=0)


def test_without_mixed_precision_nothing_changes():
    AcceleratorState._reset_state()
    acc = Accelerator(mixed_precision="no", cpu=True)
    model = acc.prepare(LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                                                     num_hidden_layers=1, num_attention_heads=4)))
    forward = model.forward
    keep_logits_dtype(acc, model)
    assert model.forward == forward
