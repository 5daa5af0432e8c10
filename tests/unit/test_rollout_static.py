"""The static engine against hf, the reference: greedy decoding token-identical (ragged prompts, early EOS, stop
strings, min_new_tokens, batch sizes that cross bucket boundaries, the covered architectures), sampled log-probs
equal to the trainer's recomputed ones, seeded runs reproducible, LoRA merged for the call and the weights restored
bit for bit, ``auto``'s choice and its fallback line.

``make test`` runs the static engine uncompiled (the same step function, called eagerly); the compiled step is
tested under ``-m compile`` (about a minute per compiled variant on 2 CPU cores) and CUDA graphs only on CUDA.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlhfkit.algos import token_logprobs
from rlhfkit.models.tokenizer import load_tokenizer
from rlhfkit.rollout import AutoEngine, ContinuousEngine, HFEngine, Rollout, SamplingParams, StaticEngine, merged_lora
from rlhfkit.rollout import static as static_module
from rlhfkit.train.online.experience import position_ids_of
from rlhfkit.train.shared.forward import response_logits

EOS, PAD = 2, 0
COMMON = dict(eos_token_ids=[EOS], pad_token_id=PAD)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def random_model(arch: str = "llama", eos_bias: float = 0.0, seed: int = 0, **over):
    """A small random decoder whose greedy output depends on the whole prompt (large init); ``eos_bias`` is added
    to the EOS logit so that rows end at different lengths."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=64, max_position_embeddings=256, pad_token_id=PAD, eos_token_id=EOS,
              bos_token_id=None, tie_word_embeddings=arch != "qwen2", initializer_range=0.3, **over)
    cfg, cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                "mistral": (MistralConfig, MistralForCausalLM)}[arch]
    if arch == "mistral":
        kw.setdefault("sliding_window", None)
    model = cls(cfg(**kw)).eval()
    if eos_bias:
        head = model.lm_head if not model.config.tie_word_embeddings else None
        with torch.no_grad():
            if head is None:  # tied: a bias on the head is the only way to favour EOS without touching embeddings
                model.lm_head = torch.nn.Linear(32, 100, bias=True)
                model.lm_head.weight = model.model.embed_tokens.weight
                model.lm_head.bias.zero_()
                model.lm_head.bias[EOS] = eos_bias
            else:
                head.weight[EOS] += eos_bias / 4
    return model


def ragged_prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 100, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def assert_same_rollout(a: Rollout, b: Rollout, lp_atol: float = 1e-5) -> None:
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "ended", "lengths"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    mask = a.response_mask.bool()
    torch.testing.assert_close(a.logprobs[mask], b.logprobs[mask], atol=lp_atol, rtol=0)
    assert torch.all(b.logprobs[~mask] == 0)


def static(tok=None, **kw) -> StaticEngine:
    kw.setdefault("compile", False)
    kw.setdefault("sync_every", 2)
    return StaticEngine(tok, **COMMON, **kw)


@pytest.mark.parametrize("arch,over", [("llama", {}), ("qwen2", {}), ("mistral", {}),
                                       ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                   "original_max_position_embeddings": 64}})])
def test_greedy_token_identical_to_hf(arch, over, monkeypatch):
    model = random_model(arch, eos_bias=3.0, **over)
    moves = []
    take = static_module.Slots.take
    monkeypatch.setattr(static_module.Slots, "take", lambda self, *a: (moves.append(self.size), take(self, *a)))
    for n in (1, 3, 5, 9):  # buckets 1, 4, 8, 16 (9 rows: 7 filler slots at first)
        prompts = ragged_prompts(n, seed=n)
        params = SamplingParams(max_new_tokens=24, greedy=True)
        ref = HFEngine(**COMMON).generate(model, prompts, params)
        assert len(set(ref.lengths.tolist())) > 1 or n == 1  # rows end at different steps (early EOS)
        assert_same_rollout(ref, static().generate(model, prompts, params))
    assert moves and min(moves) == 1  # finished rows dropped out: the live batch moved down to smaller buckets


def test_greedy_with_stop_strings_min_new_tokens_and_micro_batches(tok):
    model = random_model(eos_bias=3.0, seed=1)
    prompts = ragged_prompts(7, seed=3)
    for params, kw in [(SamplingParams(max_new_tokens=20, greedy=True, min_new_tokens=6), {}),
                       (SamplingParams(max_new_tokens=20, greedy=True), {"batch_size": 3}),
                       (SamplingParams(max_new_tokens=20, greedy=True), {"stop_strings": ("o", "e")})]:
        ref = HFEngine(tok, **COMMON, **kw).generate(model, prompts, params)
        assert_same_rollout(ref, static(tok, **kw).generate(model, prompts, params))
        if params.min_new_tokens:
            assert (ref.lengths >= 6).all()
        if "stop_strings" in kw:
            assert ref.ended.sum() > (ref.response_ids == EOS).sum()  # some rows did end at a stop string


def _trainer_logprobs(model, r: Rollout, temperature: float) -> torch.Tensor:
    """What the trainer computes for the old policy: ``response_logits`` then ``algos.token_logprobs``."""
    batch = {"input_ids": r.sequences, "attention_mask": r.attention_mask,
             "position_ids": position_ids_of(r.attention_mask), "response_ids": r.response_ids}
    with torch.no_grad():
        return token_logprobs(response_logits(model, batch, temperature), r.response_ids)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_the_trainers(temperature):
    check_sampled_logprobs(static(), temperature)


def check_sampled_logprobs(engine, temperature: float) -> None:
    """``engine``'s sampling log-probs of ragged rows ending early equal the trainer's recomputation, 0 past the end."""
    model = random_model(eos_bias=2.0, seed=2)
    r = engine.generate(model, ragged_prompts(6, seed=4) * 2, SamplingParams(max_new_tokens=16,
                                                                           temperature=temperature), seed=3)
    mask = r.response_mask.bool()
    assert mask.sum() > 50 and len(set(r.lengths.tolist())) > 1
    torch.testing.assert_close(r.logprobs[mask], _trainer_logprobs(model, r, temperature)[mask], atol=1e-4, rtol=0)
    assert torch.all(r.logprobs[~mask] == 0)


def test_top_k_top_p_logprobs_are_of_the_distribution_sampled():
    check_filtered_logprobs(static())


def check_filtered_logprobs(engine) -> None:
    """Sampled with top-k and top-p: the log-probs are those of transformers' filtered distribution (shared with
    the other engines' tests)."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    model = random_model(seed=5)
    r = engine.generate(model, ragged_prompts(4, seed=6), SamplingParams(max_new_tokens=10, temperature=0.8,
                                                                         top_k=7, top_p=0.6), seed=1)
    batch = {"input_ids": r.sequences, "attention_mask": r.attention_mask,
             "position_ids": position_ids_of(r.attention_mask), "response_ids": r.response_ids}
    with torch.no_grad():
        logits = response_logits(model, batch, 0.8)
    B, R, V = logits.shape
    flat = TopPLogitsWarper(0.6)(None, TopKLogitsWarper(7)(None, logits.reshape(B * R, V)))  # transformers' filters
    want = token_logprobs(flat.view(B, R, V), r.response_ids)
    mask = r.response_mask.bool()
    torch.testing.assert_close(r.logprobs[mask], want[mask], atol=1e-4, rtol=0)
    assert torch.isfinite(want[mask]).all()  # every sampled token survived the filters


def test_seeded_runs_reproducible():
    model = random_model(eos_bias=2.0, seed=7)
    prompts = ragged_prompts(5, seed=8)
    params = SamplingParams(max_new_tokens=16)
    engine = static()
    a = engine.generate(model, prompts, params, seed=11)
    state = torch.get_rng_state()
    b = static().generate(model, prompts, params, seed=11)  # a fresh engine: nothing carried over
    c = engine.generate(model, prompts, params, seed=12)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left alone
    assert_same_rollout(a, b, lp_atol=0)
    assert not torch.equal(a.response_ids[:, :4], c.response_ids[:, :4])
    assert len(set(a.lengths.tolist())) > 1


def random_lora(seed: int = 9):
    """A random model with a LoRA adapter of non-zero weights on q, v and gate, and a copy of its state dict."""
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(random_model(seed=seed), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"], init_lora_weights=False))
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.5)
    return lora, {n: t.detach().clone() for n, t in lora.state_dict().items()}


def test_lora_merged_for_the_call_and_weights_bit_identical_after(tok):
    lora, before = random_lora()
    prompts = ragged_prompts(4, seed=10)
    params = SamplingParams(max_new_tokens=12, greedy=True)
    ids = [torch.tensor(p)[None] for p in prompts]
    with torch.no_grad():  # the reference: generate() through the unmerged adapter, one prompt at a time
        unmerged = [lora.generate(input_ids=i, attention_mask=torch.ones_like(i), max_new_tokens=12, do_sample=False,
                                  eos_token_id=EOS, pad_token_id=PAD)[0, i.shape[1]:].tolist() for i in ids]
    for engine in (HFEngine(**COMMON), static()):
        r = engine.generate(lora, prompts, params)
        got = [row[:n] for row, n in zip(r.response_ids.tolist(), r.lengths.tolist())]
        assert got == [u[:len(g)] for u, g in zip(unmerged, got)]  # the adapter is in the generated tokens
        after = lora.state_dict()
        assert all(torch.equal(before[n], after[n]) for n in before)  # bit for bit, every tensor
        assert not any(m.merged for m in lora.modules() if hasattr(m, "merged_adapters"))
    with lora.disable_adapter():  # a disabled adapter is not merged, so the base model generates
        plain = static().generate(lora, prompts, params)
    assert not torch.equal(plain.response_ids, r.response_ids)
    # the copy-back is what makes it exact: peft's merge + unmerge alone does not give the same bits back
    with merged_lora(lora) as n:
        assert n == 3 * 2
    q = lora.base_model.model.model.layers[0].self_attn.q_proj
    q.merge()
    q.unmerge()
    drift = (q.base_layer.weight - before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
    assert drift.abs().max() > 0
    q.base_layer.weight.data.copy_(before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])


def test_a_model_neither_path_covers_falls_back_to_hf_with_one_line(capsys):
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)  # Bloom: ALiBi attention, no custom attention function (not transformers' attention backend)
    bloom = BloomForCausalLM(BloomConfig(vocab_size=100, hidden_size=32, n_layer=1, n_head=2, eos_token_id=EOS,
                                         bos_token_id=EOS, pad_token_id=PAD)).eval()
    prompts = ragged_prompts(3, seed=2)
    params = SamplingParams(max_new_tokens=6, greedy=True)
    ref = HFEngine(**COMMON).generate(bloom, prompts, params)
    for engine in (static(), ContinuousEngine(**COMMON), AutoEngine(**COMMON)):
        for _ in range(2):
            assert_same_rollout(ref, engine.generate(bloom, prompts, params))
    lines = [line for line in capsys.readouterr().out.splitlines() if "BloomForCausalLM" in line]
    # once each: static; continuous, then its static fallback; auto
    assert len(lines) == 4 and "generating with hf" in lines[0] and "auto: hf engine on cpu" in lines[3]
    assert "does not take a custom attention function" in lines[3]
    assert "continuous engine" in lines[1] and "generating with the static engine" in lines[1]
    assert lines[2] == lines[0]


def test_auto_uses_the_table_and_reports_compile_time(capsys):
    from rlhfkit.rollout import auto

    model = random_model(seed=3)
    engine = AutoEngine(**COMMON)
    picked = engine.pick(model)
    name, kwargs = auto.TABLE["cpu"]
    assert picked.name == name and all(getattr(picked, k) == v for k, v in kwargs.items())
    params = SamplingParams(max_new_tokens=8, greedy=True)
    assert_same_rollout(HFEngine(**COMMON).generate(model, ragged_prompts(3), params),
                        engine.generate(model, ragged_prompts(3), params))
    assert engine.take_stats() == {"time/rollout_compile": 0.0}  # the CPU entry does not compile
    assert f"auto: {name} engine on cpu, rlhfkit's decoder for LlamaForCausalLM" in capsys.readouterr().out


def test_sample_tokens_against_transformers_warpers_and_frequencies():
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from rlhfkit.rollout import sample_tokens
    from rlhfkit.rollout.sampling import gumbel_noise

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=g) * 3
    tied = logits.clone()
    fifth = tied.topk(5, dim=-1).values[:, -1:]
    tied[:, :3] = fifth  # three more tokens tied with the 5th largest: top-k keeps all the ties (as transformers)
    for x, k, p in [(tied, 5, 1.0), (logits, 5, 1.0), (logits, 0, 0.5), (logits, 8, 0.7), (logits, 0, 1.0),
                    (logits, 60, 0.999)]:
        want = TemperatureLogitsWarper(0.9)(None, x)
        if k:
            want = TopKLogitsWarper(k)(None, want)
        if p < 1:
            want = TopPLogitsWarper(p)(None, want)
        tokens, lp = sample_tokens(x, gumbel_noise((64, 50), g, torch.device("cpu")),
                                   temperature=torch.tensor(0.9), top_k=torch.tensor(k), top_p=torch.tensor(p))
        ref = torch.log_softmax(want, -1).gather(-1, tokens[:, None]).squeeze(-1)
        torch.testing.assert_close(lp, ref, atol=1e-6, rtol=0)
        assert torch.isfinite(lp).all()
    assert (torch.isfinite(TopKLogitsWarper(5)(None, tied)).sum(-1) > 5).all()  # ties at the k-th were in play
    # greedy: the argmax (banned tokens excluded) and its untempered log-prob
    banned = torch.zeros(50, dtype=torch.bool)
    top = logits.argmax(-1)
    banned[top[0]] = True
    tokens, lp = sample_tokens(logits, None, temperature=torch.tensor(0.5), top_k=torch.tensor(0),
                               top_p=torch.tensor(1.0), banned=banned)
    assert tokens[0] != top[0] and torch.equal(tokens[1:][top[1:] != top[0]], top[1:][top[1:] != top[0]])
    # draws follow softmax(logits / T): 40,000 draws over 4 tokens, each frequency within 0.01 (about 5 sigma)
    x = torch.tensor([[1.0, 0.0, -1.0, 2.0]]).expand(40_000, 4)
    tokens, _ = sample_tokens(x, gumbel_noise((40_000, 4), g, torch.device("cpu")), temperature=torch.tensor(0.8),
                              top_k=torch.tensor(0), top_p=torch.tensor(1.0), filters=False)
    freq = torch.bincount(tokens, minlength=4).float() / 40_000
    assert (freq - torch.softmax(x[0] / 0.8, -1)).abs().max() < 0.01


@pytest.mark.compile
def test_compiled_step_equals_uncompiled_and_reports_compile_time(capsys):
    model = random_model(eos_bias=3.0, seed=4)
    prompts = ragged_prompts(5, seed=5)
    greedy = SamplingParams(max_new_tokens=16, greedy=True)
    engine = static(compile=True, sync_every=4)
    assert_same_rollout(HFEngine(**COMMON).generate(model, prompts, greedy), engine.generate(model, prompts, greedy))
    stats = engine.take_stats()
    assert stats["time/rollout_compile"] > 0 and "compiled in" in capsys.readouterr().out
    sampled = SamplingParams(max_new_tokens=16, temperature=0.7)
    r = engine.generate(model, prompts, sampled, seed=3)
    mask = r.response_mask.bool()
    torch.testing.assert_close(r.logprobs[mask], _trainer_logprobs(model, r, 0.7)[mask], atol=1e-4, rtol=0)
    again = engine.generate(model, prompts, sampled, seed=3)
    assert torch.equal(r.response_ids, again.response_ids)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (bench/gpu_check.py "
                                                          "checks them on a GPU)")
def test_cuda_graph_step_equals_eager_on_cuda():
    model = random_model(eos_bias=3.0, seed=4).cuda()
    prompts = ragged_prompts(5, seed=5)
    greedy = SamplingParams(max_new_tokens=16, greedy=True)
    eager = static(cuda_graphs=False).generate(model, prompts, greedy)
    graphed = static(cuda_graphs=True).generate(model, prompts, greedy)
    assert_same_rollout(eager, graphed)


def test_coverage_reasons():
    from rlhfkit.rollout.decoder import coverage

    model = random_model()
    assert coverage(model) is None
    model.__class__ = type("FSDPLlamaForCausalLM", (type(model),), {})  # what FSDP2's fully_shard does to a class
    assert coverage(model) is None
    sliding = random_model("mistral")
    sliding.config.sliding_window = 8
    assert coverage(sliding) is None  # a window on every layer, masked by the decoder
    qwen = random_model("qwen2")
    qwen.config.layer_types = ["sliding_attention", "chunked_attention"]
    assert "layer types ['chunked_attention']" in coverage(qwen)
    assert "RoPE type 'dynamic'" in coverage(random_model(rope_scaling={"rope_type": "dynamic", "factor": 2.0}))


def test_dropping_the_window_changes_the_tokens(monkeypatch):
    """The sliding-window mask matters in these tests: a decoder that ignored it would not give hf's tokens."""
    from rlhfkit.rollout import decoder

    model = random_model("mistral", eos_bias=3.0, sliding_window=4)
    prompts, params = ragged_prompts(6, seed=2), SamplingParams(max_new_tokens=16, greedy=True)
    ref = HFEngine(**COMMON).generate(model, prompts, params)
    assert_same_rollout(ref, static().generate(model, prompts, params))
    monkeypatch.setattr(decoder, "layer_windows", lambda arch, cfg: (None,) * cfg.num_hidden_layers)
    assert not torch.equal(ref.response_ids, static().generate(model, prompts, params).response_ids)


def test_a_repeated_prompt_is_prefilled_once_with_the_same_cache_and_logits(monkeypatch):
    from rlhfkit.rollout import decoder

    model = random_model(seed=5)
    w = decoder.read_weights(model)
    prompts = ragged_prompts(3, seed=6)
    P = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (P - len(p)) + p for p in prompts])
    mask = (torch.arange(P)[None] >= torch.tensor([P - len(p) for p in prompts])[:, None]).long()
    order = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 1])  # completion-major groups, and one row more
    cos, sin = decoder.rope_tables(model, 64, ids.device, torch.float32)

    def cache():
        return tuple(torch.zeros(10, w.kv_heads, 64, w.head_dim) for _ in range(2 * len(w.layers)))

    rows_run = []
    real = decoder._prefill
    monkeypatch.setattr(decoder, "_prefill", lambda w, i, *a: (rows_run.append(len(i)), real(w, i, *a))[1])
    with torch.no_grad():
        once, each = cache(), cache()
        logits = decoder.prefill(w, ids[order], mask[order], once, cos, sin)
        slow = []  # row by row, the slow way, each into its own row of `each`
        for r, j in enumerate(order.tolist()):
            slow.append(real(w, ids[j:j + 1], mask[j:j + 1], tuple(x[r:r + 1] for x in each), cos, sin)[0])
        slow = torch.stack(slow)
    assert rows_run == [3]  # the three distinct prompts went through the layers, not ten rows
    torch.testing.assert_close(logits, slow, atol=1e-5, rtol=0)
    for a, b in zip(once, each):
        torch.testing.assert_close(a[:, :, :P], b[:, :, :P], atol=1e-5, rtol=0)
