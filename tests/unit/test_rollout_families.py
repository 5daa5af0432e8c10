"""The static engine on every family, against ``hf`` (transformers ``generate``, the reference), on tiny random models
built from config dicts (no download): greedy tokens identical with ragged prompts, rows ending at different steps
(early EOS), stop strings and micro-batches; sampled log-probs equal to the trainer's recomputed ones within 1e-4 in
float32; LoRA merged for the call and the weights restored bit for bit. The families of rlhfkit's decoder
(:data:`FAMILIES`) and, for the generic path (the model's own modules over rlhfkit's cache, rollout/generic.py),
families it does not cover (:data:`OWN_MODULES`: GPT-2's learned positions, OLMo 2's norms, Cohere 2's sliding layers
and parallel block, Phi-3 with LongRoPE).

Each config exercises what its family adds over Llama: Qwen2's q/k/v biases and sliding layers above
``max_window_layers``, Qwen3's per-head q/k norms, Mistral's and Phi-3's window on every layer, Gemma's norms, scaled
embeddings, ``query_pre_attn_scalar`` and soft caps, Gemma 3's local / global layers with their own RoPE tables,
Phi-3's fused projections and partial rotary, Llama 3.x and YaRN RoPE scaling. Windows are a few tokens wide, so
prompts (up to 19 tokens) and responses (up to 16) run past them (tests/unit/test_rollout_static.py checks that
dropping the window changes the tokens).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from test_rollout_static import COMMON, EOS, PAD, _trainer_logprobs, assert_same_rollout, ragged_prompts

from rlhfkit.models.tokenizer import load_tokenizer
from rlhfkit.rollout import HFEngine, SamplingParams, StaticEngine, finalize_responses
from rlhfkit.rollout.decoder import read_weights

V = 100  # the tiny tokenizer's vocabulary, so stop strings can be decoded
BASE = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=256, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None,
            initializer_range=0.3, tie_word_embeddings=False)
GEMMA = dict(head_dim=32, query_pre_attn_scalar=24, sliding_window=6)  # head_dim * heads != hidden, as in Gemma 3
FAMILIES = {  # name -> (config class prefix, what it sets beyond BASE); Llama, Llama 3.x RoPE, Qwen2 / Qwen2.5 and
    # Mistral without a window: tests/unit/test_rollout_static.py
    "llama-yarn": ("Llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 64}, "eos_bias": 1.0}),
    "qwen2-sliding": ("Qwen2", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1}),
    "qwen3": ("Qwen3", {"head_dim": 24}),  # head_dim * heads != hidden, as in Qwen3-0.6B (128 x 16 vs 1024)
    "qwen3-sliding": ("Qwen3", {"head_dim": 16, "use_sliding_window": True, "sliding_window": 5,
                                "max_window_layers": 0}),
    "mistral-sliding": ("Mistral", {"sliding_window": 6}),
    "gemma2": ("Gemma2", {**GEMMA, "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0}),
    "gemma3": ("Gemma3Text", {**GEMMA, "layer_types": ["sliding_attention", "full_attention"],
                              "final_logit_softcapping": 30.0}),
    "gemma3-multimodal": ("Gemma3", {"eos_bias": 2.0}),
    "phi3": ("Phi3", {"partial_rotary_factor": 0.5, "sliding_window": 7}),
    # the generic path
    "gpt2": ("GPT2", {"eos_bias": 0.2}),
    "olmo2": ("Olmo2", {}),
    "cohere2-sliding": ("Cohere2", {"sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"]}),
    "phi3-longrope": ("Phi3", {"original_max_position_embeddings": 64, "rope_scaling": {
        "rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}, "eos_bias": 0.6}),
}
OWN_MODULES = ("gpt2", "olmo2", "cohere2-sliding", "phi3-longrope")


def family_model(name: str, seed: int = 0):
    """A tiny random model of the family, in eval mode, its EOS logit raised so that rows end at different steps."""
    prefix, over = FAMILIES[name]
    over = dict(over)
    eos_bias = over.pop("eos_bias", 0.3)
    if prefix == "Gemma3":  # the multimodal class AutoModelForCausalLM gives for Gemma 3 4B and up; text-only here
        text = {**BASE, **GEMMA, "layer_types": ["sliding_attention", "full_attention"]}
        cfg = transformers.Gemma3Config(text_config=text, vision_config=dict(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16,
            patch_size=4), mm_tokens_per_image=4, image_token_index=V - 1, boi_token_index=V - 2,
            eoi_token_index=V - 3, pad_token_id=PAD, eos_token_id=EOS)
        cls = transformers.Gemma3ForConditionalGeneration
    elif prefix == "GPT2":
        cfg = transformers.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                      eos_token_id=EOS, bos_token_id=EOS, pad_token_id=PAD, initializer_range=0.3)
        cls = transformers.GPT2LMHeadModel
    else:
        cfg = getattr(transformers, f"{prefix}Config")(**{**BASE, **over})
        cls = getattr(transformers, f"{prefix.removesuffix('Text')}ForCausalLM")
    if prefix == "Gemma2":
        cfg._attn_implementation = "eager"  # Gemma 2's soft-capped attention exists in eager only
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        if prefix == "GPT2":  # its final LayerNorm centres the hidden state: a bias gives the EOS row a direction
            model.transformer.ln_f.bias.fill_(0.3)
        model.get_output_embeddings().weight[EOS] += eos_bias
    return model


def prompts(n: int, seed: int) -> list[list[int]]:
    return [[t % (V - 4) for t in p] for p in ragged_prompts(n, seed)]  # ids below the multimodal special tokens


def static(tok=None, **kw) -> StaticEngine:
    return StaticEngine(tok, **COMMON, compile=False, sync_every=2, **kw)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_token_identical_to_hf(name, tok):
    model = family_model(name)
    assert static().path_of(model)[0] == ("modules" if name in OWN_MODULES else "decoder")
    params = SamplingParams(max_new_tokens=16, greedy=True)
    ps = prompts(9, seed=1)
    ref = HFEngine(**COMMON).generate(model, ps, params)  # bucket 16, moving down as rows end
    assert len(set(ref.lengths.tolist())) > 1  # rows end at different steps (early EOS)
    assert_same_rollout(ref, static().generate(model, ps, params), lp_atol=1e-4)
    # stop strings, in micro-batches of 4: a character the longest row generates mid-way ends it (and any row that
    # generates it earlier); greedy rows do not depend on their batch, so hf's rows cut there are the reference
    longest = int(ref.lengths.argmax())
    stop = tok.decode([int(ref.response_ids[longest, ref.lengths[longest] // 2])])
    ids, mask, ended, lengths = finalize_responses(ref.response_ids, eos_token_ids=[EOS], pad_token_id=PAD,
                                                   stop_strings=(stop,), tokenizer=tok)
    r = static(tok, stop_strings=(stop,), batch_size=4).generate(model, ps, params)
    assert int(lengths[longest]) < int(ref.lengths[longest]) and r.ended[longest]  # cut by the stop string
    assert torch.equal(r.response_ids, ids[:, :r.response_ids.shape[1]]) and torch.equal(r.lengths, lengths)
    assert torch.equal(r.ended, ended)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_sampled_logprobs_equal_the_trainers(name):
    model = family_model(name, seed=1)
    r = static().generate(model, prompts(4, seed=3) * 2, SamplingParams(max_new_tokens=12, temperature=0.8), seed=5)
    mask = r.response_mask.bool()
    assert mask.sum() > 20
    torch.testing.assert_close(r.logprobs[mask], _trainer_logprobs(model, r, 0.8)[mask], atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["qwen3", "gemma3", "phi3", "gpt2"])
def test_lora_merged_for_the_call_and_weights_bit_identical_after(name):
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(family_model(name, seed=2), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                                 init_lora_weights=False))
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.3)
    before = {n: t.detach().clone() for n, t in lora.state_dict().items()}
    ps = prompts(4, seed=4)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    with torch.no_grad():  # the reference: generate() through the unmerged adapter, one prompt at a time
        unmerged = [lora.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                  max_new_tokens=10, do_sample=False, eos_token_id=EOS,
                                  pad_token_id=PAD)[0, len(p):].tolist() for p in ps]
    r = static().generate(lora, ps, params)
    got = [row[:n] for row, n in zip(r.response_ids.tolist(), r.lengths.tolist())]
    assert got == [u[:len(g)] for u, g in zip(unmerged, got)]  # the adapter is in the generated tokens
    after = lora.state_dict()
    assert all(torch.equal(before[n], after[n]) for n in before)  # bit for bit, every tensor
    with lora.disable_adapter():
        assert not torch.equal(static().generate(lora, ps, params).response_ids, r.response_ids)


def test_each_family_reads_what_it_adds():
    """The settings read from each family's modules: the layers' windows, RoPE tables, norms, scales and caps."""
    w = read_weights(family_model("gemma3"))
    assert [layer.window for layer in w.layers] == [6, None] and [layer.rope for layer in w.layers] == [1, 0]
    assert w.gemma_norm and w.act == "gelu_pytorch_tanh" and w.scale == 24 ** -0.5 and w.final_softcap == 30.0
    assert w.embed_scale == pytest.approx(64 ** 0.5) and w.layers[0].q_norm is not None
    w = read_weights(family_model("qwen2-sliding"))
    assert [layer.window for layer in w.layers] == [None, 6] and w.layers[0].q_bias is not None
    w = read_weights(family_model("phi3"))
    assert w.layers[0].qkv is not None and w.layers[0].q is None and w.layers[0].gate_up is not None
    assert [layer.window for layer in w.layers] == [7, 7]
    w = read_weights(family_model("gemma2"))
    assert w.attn_softcap == 5.0 and w.final_softcap == 3.0 and w.layers[0].q_norm is None


@pytest.mark.compile
@pytest.mark.parametrize("name", ["gemma3", "phi3"])
def test_compiled_step_equals_hf(name):
    """The decoder's step compiled (fullgraph) with a family's settings: windows, several RoPE tables, soft caps,
    fused projections (about a minute per family on 2 CPU cores)."""
    model = family_model(name)
    params = SamplingParams(max_new_tokens=12, greedy=True)
    ref = HFEngine(**COMMON).generate(model, prompts(5, seed=6), params)
    got = StaticEngine(**COMMON, compile=True, sync_every=4).generate(model, prompts(5, seed=6), params)
    assert_same_rollout(ref, got, lp_atol=1e-4)
