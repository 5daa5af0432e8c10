"""Memory between the phases of an online step (train/lifecycle/memory.py): the optimizer's state moved to host buffers
and
back with bit-equal training, and the rollout engine's caches released after a rollout and rebuilt by the next one
with the same results."""

from __future__ import annotations

import types

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState

from rlhfkit.config.schema import OptimConfig
from rlhfkit.rollout import SamplingParams, StaticEngine
from rlhfkit.train.lifecycle.memory import is_offloaded, offload_optimizer, restore_optimizer, rollout_phase
from rlhfkit.train.lifecycle.optim import build_optimizer, build_scheduler, clip_and_step


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _train(offload: bool, steps: int = 4):
    """``steps`` updates through clip_and_step; with ``offload`` the state leaves between updates (as it does for
    each rollout) and clip_and_step brings it back."""
    AcceleratorState._reset_state()
    acc = Accelerator(cpu=True)
    model = _model()
    opt = build_optimizer(model.parameters(), OptimConfig(lr=1e-2, weight_decay=0.1))
    sched = build_scheduler(opt, OptimConfig(lr=1e-2), steps)
    model, opt, sched = acc.prepare(model, opt, sched)
    g = torch.Generator().manual_seed(3)
    seen = []
    for _ in range(steps):
        x, y = torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)
        if offload and opt.state:
            before = [v.clone() for s in opt.state.values() for v in s.values()]
            moved = offload_optimizer(opt)
            assert is_offloaded(opt) and moved == sum(v.numel() * v.element_size() for v in before)
            for v, b in zip((v for s in opt.state.values() for v in s.values()), before):
                assert torch.equal(v, b)
            # the state now lives in the host buffers, with the same values
            hosts = {id(t) for t in opt.optimizer.rlhfkit_host_state.values()}
            assert all(id(v) in hosts for s in opt.state.values() for v in s.values())
            seen.append(hosts)
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        clip_and_step(acc, model, opt, sched, 1.0)
        assert not is_offloaded(opt)
        if offload and seen:  # back on its device in tensors of its own (the host buffers kept for the next time)
            assert not any(id(v) in seen[-1] for s in opt.state.values() for v in s.values())
    if offload:
        assert len(seen) == steps - 1 and all(s == seen[0] for s in seen)  # one set of host buffers, reused
    return [p.detach().clone() for p in model.parameters()], opt


def test_offloaded_state_comes_back_and_training_is_bit_equal():
    plain, opt_a = _train(False)
    moved, opt_b = _train(True)
    for a, b in zip(plain, moved):
        assert torch.equal(a, b)
    assert any((a - b).abs().sum() > 0 for a, b in zip(plain, [p.detach() for p in _model().parameters()]))
    for sa, sb in zip(opt_a.state.values(), opt_b.state.values()):
        for key in sa:
            assert torch.equal(sa[key], sb[key]) and sa[key].device == sb[key].device


def test_restore_without_offload_and_offload_twice_are_no_ops():
    model = _model()
    opt = build_optimizer(model.parameters(), OptimConfig())
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    assert restore_optimizer(opt) == 0
    assert offload_optimizer(opt) > 0 and offload_optimizer(opt) == 0
    assert restore_optimizer(opt) > 0 and not is_offloaded(opt)


class _Engine:
    def __init__(self):
        self.released = 0

    def release(self):
        self.released += 1


@pytest.mark.parametrize("offload,release", [(True, True), (True, False), (False, True), (False, False)])
def test_rollout_phase_releases_the_engine_and_leaves_a_cpu_optimizer_in_place(offload, release):
    model = _model()
    opt = build_optimizer(model.parameters(), OptimConfig())
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    memory, engine = types.SimpleNamespace(offload_optimizer=offload, release_engine_cache=release), _Engine()
    with rollout_phase(memory, engine, opt, None):
        assert not is_offloaded(opt)  # trained on the CPU: there is nowhere else to put the state
    assert engine.released == int(release)


def test_static_engine_release_frees_its_buckets_and_the_next_call_rebuilds_them():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64, eos_token_id=2,
                                         pad_token_id=0, initializer_range=0.3)).eval()
    engine = StaticEngine(None, eos_token_ids=[2], pad_token_id=0, compile=False, sync_every=2)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    params = SamplingParams(max_new_tokens=8)
    a = engine.generate(model, prompts, params, seed=1)
    cache_bytes = sum(t.numel() * t.element_size() for slots in engine._slots.values() for t in slots.cache)
    assert cache_bytes > 0
    engine.release()
    assert engine._slots == {}
    b = engine.generate(model, prompts, params, seed=1)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert engine._slots


def test_continuous_engine_release_drops_its_block_pool_and_the_next_call_is_the_same():
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlhfkit.rollout import ContinuousEngine

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64, eos_token_id=2,
                                         pad_token_id=0, initializer_range=0.3)).eval()
    engine = ContinuousEngine(None, eos_token_ids=[2], pad_token_id=0, batch_size=2, block_size=4)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    a = engine.generate(model, prompts, params, seed=1)
    assert engine.pool is not None and engine.pool.blocks > 0
    engine.release()
    assert engine.pool is None and engine.graphs == {}
    b = engine.generate(model, prompts, params, seed=1)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
