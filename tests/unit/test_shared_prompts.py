"""train.shared.forward's shared-prompt forward: rows that repeat a prompt run it once and attend to its copied keys /
values. Checked against the whole-batch forward (log-probs and gradients, left-padded ragged prompts, groups in any
order), and where it must not run (no repeat, gradient checkpointing, a wrapped model under grad) or would be wrong
(the cache dropped: an error, never a silent result)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlhfkit.algos import token_logprobs
from rlhfkit.train.online.experience import position_ids_of
from rlhfkit.train.shared.forward import can_share_prompts, response_logits, shared_prompt_logits

PAD = 0


def model_and_batch(order):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64, pad_token_id=PAD,
                                         initializer_range=0.2))
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]  # ragged: left padding differs per prompt
    P, R = 5, 6
    rows = [prompts[i] for i in order]
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, R + 1, (len(rows),), generator=g)  # right-padded responses of different lengths
    resp = torch.randint(1, 64, (len(rows), R), generator=g) * (torch.arange(R)[None] < lengths[:, None])
    ids = torch.tensor([[PAD] * (P - len(p)) + p for p in rows])
    mask = torch.cat([ids != PAD, resp != 0], 1).long()
    batch = {"input_ids": torch.cat([ids, resp], 1), "attention_mask": mask, "position_ids": position_ids_of(mask),
             "response_ids": resp}
    return model, batch, mask[:, P:].bool()


def checkpointing(model) -> None:  # transformers 5.23 renamed it; the image of the GPU machine has 5.17
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()


@pytest.mark.parametrize("order", [[0, 1, 2, 0, 1, 2, 0, 1, 2], [0, 0, 0, 1, 1, 2, 2, 2, 1]])
def test_log_probs_and_gradients_equal_the_whole_batch_forward(order):
    model, batch, keep = model_and_batch(order)
    params = [model.model.layers[0].self_attn.q_proj.weight, model.model.embed_tokens.weight]

    def run(share: bool):
        lp = token_logprobs(response_logits(model, batch, 0.7, share_prompts=share), batch["response_ids"])
        loss = (lp * keep).sum()
        return lp.detach(), torch.autograd.grad(loss, params)

    (lp_whole, g_whole), (lp_shared, g_shared) = run(False), run(True)
    torch.testing.assert_close(lp_shared[keep], lp_whole[keep], atol=1e-5, rtol=0)
    for a, b in zip(g_shared, g_whole):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
        assert b.abs().sum() > 0


def test_it_runs_the_distinct_prompts_once_and_steps_aside_where_it_must():
    model, batch, _ = model_and_batch([0, 1, 2, 0, 1, 2])
    widths = []
    model.register_forward_pre_hook(lambda m, a, kw: widths.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    assert shared_prompt_logits(model, batch) is not None
    assert widths == [(3, 5), (6, 6)]  # three prompts, then six responses against their copied keys / values
    _, distinct, _ = model_and_batch([0, 1, 2])
    assert shared_prompt_logits(model, distinct) is None  # nothing repeats: the caller runs the batch as one
    assert can_share_prompts(model)
    ddp_like = torch.nn.Module()
    ddp_like.module = model  # what DDP / DeepSpeed wrap the policy in
    assert not can_share_prompts(ddp_like)  # with gradients: one forward per backward
    with torch.no_grad():
        assert can_share_prompts(ddp_like)  # the no-grad passes may
    checkpointing(model)
    assert not can_share_prompts(model)
    from transformers import MistralConfig, MistralForCausalLM

    mistral = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                               num_attention_heads=4, num_key_value_heads=2, intermediate_size=64))
    assert not can_share_prompts(mistral)  # a sliding window: the prompt's keys may be dropped from the cache


def test_a_cache_the_responses_did_not_attend_to_is_an_error():
    model, batch, _ = model_and_batch([0, 1, 0, 1])
    checkpointing(model)  # in training mode transformers drops past_key_values
    model.train()
    with pytest.raises(RuntimeError, match="shared-prompt forward"):
        shared_prompt_logits(model, batch)


def test_gradient_checkpointing_under_a_peft_wrapper_is_seen():
    """A PEFT model's own class has no checkpointing flag: the layers transformers set it on are read (a TRL-configured
    LoRA run has TRL's gradient_checkpointing=True; the shared forward then found its cache dropped)."""
    from peft import LoraConfig, get_peft_model

    from rlhfkit.train.shared.forward import response_stats

    model, batch, keep = model_and_batch([0, 1, 2, 0, 1, 2])
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    assert can_share_prompts(peft)
    checkpointing(peft.get_base_model())
    peft.train()
    assert not can_share_prompts(peft)
    lp = response_stats(peft, batch, 1.0).logprobs  # the whole batch at once: correct, no error
    lp.sum().backward()
    with torch.no_grad():
        want = token_logprobs(response_logits(peft, batch, 1.0, share_prompts=False), batch["response_ids"])
    torch.testing.assert_close(lp.detach()[keep], want[keep], atol=1e-5, rtol=1e-5)
