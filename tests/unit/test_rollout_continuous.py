"""The continuous engine against hf, the reference, as tests/unit/test_rollout_static.py does for ``static``: greedy
tokens identical (ragged prompts, early EOS, stop strings, min_new_tokens, the covered architectures), sampled
log-probs equal to the trainer's recomputed ones, LoRA merged for the call and restored bit for bit. And what is its
own: a request's tokens do not depend on the slot count, the admission order, the block size, the cache budget
(preemptions included) or the check interval; a group's prompt is prefilled once; a long prompt's prefill is chunked
between decode steps; a cache smaller than one sequence is one clear error."""

from __future__ import annotations

import pytest
import torch
from test_rollout_static import (
    COMMON,
    EOS,
    _trainer_logprobs,
    assert_same_rollout,
    check_filtered_logprobs,
    check_sampled_logprobs,
    ragged_prompts,
    random_lora,
    random_model,
)

from rlhfkit.errors import ConfigError
from rlhfkit.models.tokenizer import load_tokenizer
from rlhfkit.rollout import ContinuousEngine, HFEngine, SamplingParams, check_engine, sample_tokens
from rlhfkit.rollout import continuous as continuous_module
from rlhfkit.rollout.continuous import request_seed, request_uniforms, width_bucket


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def cont(tok=None, **kw) -> ContinuousEngine:
    return ContinuousEngine(tok, **COMMON, **kw)


# block size, chunking, slots and cache budget small enough that prefill is chunked, slots are reused, blocks
# are shared and (the last) the pool runs dry
LAYOUTS = [{}, {"batch_size": 2, "block_size": 4, "prefill_chunk": 5, "sync_every": 3},
           {"block_size": 2, "cache_tokens": 72, "sync_every": 1, "batch_size": 5}]


@pytest.mark.parametrize("arch,over", [("llama", {}), ("qwen2", {}), ("mistral", {}),
                                       ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                   "original_max_position_embeddings": 64}})])
def test_greedy_token_identical_to_hf(arch, over):
    model = random_model(arch, eos_bias=3.0, **over)
    for n in (1, 6):
        prompts = ragged_prompts(n, seed=n)
        params = SamplingParams(max_new_tokens=20, greedy=True)
        ref = HFEngine(**COMMON).generate(model, prompts, params)
        assert len(set(ref.lengths.tolist())) > 1 or n == 1  # rows end at different steps (early EOS)
        for layout in LAYOUTS if arch == "llama" and not over else LAYOUTS[:1]:
            assert_same_rollout(ref, cont(**layout).generate(model, prompts, params))


def test_greedy_with_stop_strings_and_min_new_tokens(tok):
    model = random_model(eos_bias=3.0, seed=1)
    prompts = ragged_prompts(7, seed=3)
    for params, kw in [(SamplingParams(max_new_tokens=20, greedy=True, min_new_tokens=6), {}),
                       (SamplingParams(max_new_tokens=20, greedy=True), {"stop_strings": ("o", "e")})]:
        ref = HFEngine(tok, **COMMON, **kw).generate(model, prompts, params)
        assert_same_rollout(ref, cont(tok, sync_every=3, **kw).generate(model, prompts, params))
        if params.min_new_tokens:
            assert (ref.lengths >= 6).all()
        if "stop_strings" in kw:
            assert ref.ended.sum() > (ref.response_ids == EOS).sum()  # some rows did end at a stop string


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_the_trainers(temperature):
    check_sampled_logprobs(cont(batch_size=4, block_size=4), temperature)


def test_top_k_top_p_logprobs_are_of_the_distribution_sampled():
    check_filtered_logprobs(cont())


def test_a_requests_tokens_depend_on_its_seed_and_row_only():
    """The same requests under other slot counts, admission orders, block sizes, cache budgets (the smallest one
    preempts) and check intervals: the same tokens and log-probs, row by row."""
    model = random_model(eos_bias=1.0, seed=2)
    prompts = ragged_prompts(4, seed=4) * 3  # groups of 3 samples, completion-major as the online loop lays them
    params = SamplingParams(max_new_tokens=24, temperature=0.9)
    base = cont().generate(model, prompts, params, seed=5)
    assert len(set(base.lengths.tolist())) > 3 and not base.ended.all()  # long-tailed: some run to the limit
    g = torch.Generator().manual_seed(0)
    orders = [None, lambda n: list(reversed(range(n))), lambda n: torch.randperm(n, generator=g).tolist()]
    preempted = 0
    for layout, order in [({"batch_size": 1}, None), ({"batch_size": 4, "block_size": 4}, orders[1]),
                          ({"batch_size": 7, "block_size": 2, "sync_every": 1, "prefill_chunk": 3}, orders[2]),
                          ({"block_size": 4, "cache_tokens": 80, "sync_every": 2}, orders[2])]:
        engine = cont(**layout)
        engine.arrival = order
        assert_same_rollout(base, engine.generate(model, prompts, params, seed=5), lp_atol=1e-4)  # float32 sums
        preempted += engine.counts["preemptions"]
    assert preempted > 0  # the small cache made the scheduler preempt and recompute, and changed no token
    other = cont().generate(model, prompts, params, seed=6)
    assert not torch.equal(other.response_ids[:, :4], base.response_ids[:, :4])
    # the seed of a request mixes (call seed, row): nearby pairs do not collide
    assert len({request_seed(s, r) for s in range(50) for r in range(50)}) == 2500
    u = request_uniforms(5, 3, 4, torch.device("cpu"))
    assert torch.equal(u[1, :4], request_uniforms(5, 7, 4, torch.device("cpu"))[1, :4])  # not the batch size


def test_seeded_runs_reproducible_and_the_global_rng_untouched():
    model = random_model(eos_bias=2.0, seed=7)
    prompts = ragged_prompts(5, seed=8)
    params = SamplingParams(max_new_tokens=16)
    engine = cont()
    a = engine.generate(model, prompts, params, seed=11)
    state = torch.get_rng_state()
    b = cont().generate(model, prompts, params, seed=11)
    assert torch.equal(torch.get_rng_state(), state)
    assert_same_rollout(a, engine.generate(model, prompts, params, seed=11), lp_atol=0)
    assert_same_rollout(a, b, lp_atol=0)


def test_a_groups_prompt_is_prefilled_once_and_its_blocks_shared():
    model = random_model(eos_bias=2.0, seed=3)
    prompts = ragged_prompts(3, seed=9)
    k = 4
    engine = cont(block_size=4)
    shared = engine.generate(model, prompts * k, SamplingParams(max_new_tokens=12), seed=2)
    assert engine.counts["prefill_tokens"] == sum(map(len, prompts))  # each distinct prompt written once
    # every sample generated from the shared prompt equals the same request prefilled on its own: row r of the
    # shared call against a call whose prompts differ only in another row's first token (other groups)
    distinct = [[(p[0] + 1 + j) % 96 + 4] + p[1:] if j else p for j in range(k) for p in prompts]
    alone = cont(block_size=4).generate(model, distinct, SamplingParams(max_new_tokens=12), seed=2)
    n = len(prompts)
    assert torch.equal(alone.response_ids[:n], shared.response_ids[:n])  # rows 0..n-1 have the same prompts
    full = sum(len(p) // 4 for p in prompts)
    assert engine.counts["peak_blocks"] < k * full + len(prompts) * k * 4  # full prompt blocks held once


def test_long_prompt_prefill_is_chunked_between_decode_steps(monkeypatch):
    model = random_model(eos_bias=-5.0, seed=4)  # no early EOS: the short request decodes all along
    long_prompt = torch.randint(4, 100, (60,), generator=torch.Generator().manual_seed(1)).tolist()
    events = []
    real_step, real_chunk = continuous_module.Scheduler.decode_step, continuous_module.Scheduler.prefill_chunk
    monkeypatch.setattr(continuous_module.Scheduler, "decode_step",
                        lambda self: (events.append("d"), real_step(self))[1])
    monkeypatch.setattr(continuous_module.Scheduler, "prefill_chunk",
                        lambda self: (events.append("p"), real_chunk(self))[1])
    engine = cont(batch_size=2, prefill_chunk=8, sync_every=2)
    engine.arrival = lambda n: [0, 1]
    short = [5, 6, 7]
    params = SamplingParams(max_new_tokens=20, greedy=True)
    r = engine.generate(model, [short, long_prompt], params)
    # both prompts admitted at once; the short one is written in the first chunk and decodes while the long one
    # goes on in chunks of at most 8 tokens: decode steps between the long prompt's chunks
    text = "".join(events)
    first_d, last_p = text.index("d"), text.rindex("p")
    assert text[:first_d] == "p" and text.count("p") >= 60 // 8 and "d" in text[first_d:last_p]
    assert_same_rollout(HFEngine(**COMMON).generate(model, [short, long_prompt], params), r)


def test_cache_budget_checks_and_the_engine_settings():
    model = random_model(seed=1)
    with pytest.raises(ConfigError, match="generation.cache_tokens"):
        cont(cache_tokens=16).generate(model, ragged_prompts(2), SamplingParams(max_new_tokens=20, greedy=True))
    with pytest.raises(ConfigError, match="no token-budget cache"):
        check_engine("static", {}, cache_tokens=1000)
    check_engine("continuous", {"block_size": 8}, cache_tokens=1000)
    with pytest.raises(ConfigError, match="did you mean 'block_size'"):
        check_engine("continuous", {"block_sise": 8})
    with pytest.raises(ConfigError, match="memory_fraction"):
        check_engine("continuous", {"memory_fraction": 1.5})
    assert [width_bucket(n, 100) for n in (1, 2, 3, 4, 5, 7, 9, 13, 17, 25)] == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    assert width_bucket(90, 70) == 70


def test_lora_merged_for_the_call_and_weights_bit_identical_after():
    lora, before = random_lora()
    prompts = ragged_prompts(4, seed=10)
    params = SamplingParams(max_new_tokens=12, greedy=True)
    ref = HFEngine(**COMMON).generate(lora, prompts, params)  # through the merged adapter too (tested against
    r = cont().generate(lora, prompts, params)  # generate() through the unmerged one in test_rollout_static.py)
    assert_same_rollout(ref, r)
    after = lora.state_dict()
    assert all(torch.equal(before[n], after[n]) for n in before)  # bit for bit, every tensor
    assert not any(m.merged for m in lora.modules() if hasattr(m, "merged_adapters"))
    with lora.disable_adapter():
        plain = cont().generate(lora, prompts, params)
    assert not torch.equal(plain.response_ids, r.response_ids)


def test_inverse_cdf_draws_follow_the_distribution_and_never_a_removed_token():
    g = torch.Generator().manual_seed(0)
    x = torch.tensor([[1.0, 0.0, -1.0, 2.0, -30.0]]).expand(40_000, 5)
    u = torch.rand(40_000, generator=g, dtype=torch.float64)
    tokens, lp = sample_tokens(x, None, uniform=u, temperature=torch.tensor(0.8), top_k=torch.tensor(0),
                               top_p=torch.tensor(1.0), filters=False)
    freq = torch.bincount(tokens, minlength=5).float() / 40_000
    assert (freq - torch.softmax(x[0] / 0.8, -1)).abs().max() < 0.01  # about 5 sigma
    torch.testing.assert_close(lp, torch.log_softmax(x / 0.8, -1).gather(-1, tokens[:, None]).squeeze(-1))
    # top-k 2: only tokens 3 and 0 can come out, also for numbers at the very ends of [0, 1)
    edge = torch.tensor([0.0, 1e-12, 0.5, 1 - 1e-12, 1 - 2**-53], dtype=torch.float64)
    tokens, lp = sample_tokens(x[:5], None, uniform=edge, temperature=torch.tensor(1.0), top_k=torch.tensor(2),
                               top_p=torch.tensor(1.0))
    assert set(tokens.tolist()) <= {0, 3} and torch.isfinite(lp).all()
    banned = torch.zeros(5, dtype=torch.bool)
    banned[3] = True
    tokens, _ = sample_tokens(x, None, uniform=u, temperature=torch.tensor(1.0), top_k=torch.tensor(0),
                              top_p=torch.tensor(1.0), banned=banned, filters=False)
    assert not (tokens == 3).any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (bench/gpu_check.py "
                                                          "checks them on a GPU)")
def test_cuda_graph_steps_equal_eager_on_cuda():
    model = random_model(eos_bias=3.0, seed=4).cuda()
    prompts = ragged_prompts(5, seed=5) * 2
    for params in (SamplingParams(max_new_tokens=16, greedy=True), SamplingParams(max_new_tokens=16)):
        eager = cont(cuda_graphs=False, block_size=4).generate(model, prompts, params, seed=1)
        graphed = cont(cuda_graphs=True, block_size=4).generate(model, prompts, params, seed=1)
        assert_same_rollout(eager, graphed)


DECODER_FAMILIES = ("qwen3", "qwen3-sliding", "mistral-sliding", "gemma2", "gemma3", "phi3")


@pytest.mark.parametrize("name", DECODER_FAMILIES)
def test_every_decoder_family_greedy_equals_hf_and_samples_the_trainers_distribution(name):
    """The families rlhfkit's decoder covers (tests/unit/test_rollout_families.py builds them), on the paged cache:
    sliding windows within each layer's window, Gemma's scale / soft caps / RoPE tables, Qwen3's q/k norms."""
    from test_rollout_families import family_model, prompts

    model = family_model(name)
    ps = prompts(5, seed=3) * 2
    greedy = SamplingParams(max_new_tokens=16, greedy=True)
    assert_same_rollout(HFEngine(**COMMON).generate(model, ps, greedy),
                        cont(block_size=4, batch_size=4, prefill_chunk=6).generate(model, ps, greedy),
                        lp_atol=1e-4)  # greedy tokens identical; their log-probs within float32 sums
    r = cont(block_size=4).generate(model, ps, SamplingParams(max_new_tokens=12, temperature=0.8), seed=1)
    mask = r.response_mask.bool()
    torch.testing.assert_close(r.logprobs[mask], _trainer_logprobs(model, r, 0.8)[mask], atol=1e-4, rtol=0)
