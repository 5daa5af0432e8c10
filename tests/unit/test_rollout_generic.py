"""The static engine's generic path (rollout/generic.py: a model's own modules over rlhfkit's cache) beyond the
token-for-token comparisons of tests/unit/test_rollout_families.py: what it refuses and how it says so, its check
against the model's own forward, ``auto``'s one line per path, the model's configs restored after a call, and (on
CUDA) its step replayed as a CUDA graph."""

from __future__ import annotations

import pytest
import torch
from test_rollout_families import family_model, prompts, static
from test_rollout_static import COMMON, assert_same_rollout

from rlhfkit.rollout import AutoEngine, HFEngine, SamplingParams, generic

GREEDY = SamplingParams(max_new_tokens=12, greedy=True)


def test_a_layer_mixing_tokens_outside_attention_is_caught_and_generated_by_hf(capsys):
    """A stand-in for recurrent / linear-attention layers: an MLP that mixes the positions it is given (a cumulative
    sum). Without a cache of its own its decode step cannot know the earlier tokens, so the cached decode differs
    from the full forward: the check finds it before any rollout, and hf generates."""
    model = family_model("gpt2")
    for block in model.transformer.h:
        mlp = block.mlp
        mlp.forward = lambda x, f=mlp.forward: f(x.cumsum(1) / (1.0 + torch.arange(x.shape[1])[:, None]))
    engine = static()
    kind, why = engine.path_of(model)
    assert kind == "hf" and "cached decode differs from its own forward" in why
    assert_same_rollout(HFEngine(**COMMON).generate(model, prompts(4, 1), GREEDY),
                        engine.generate(model, prompts(4, 1), GREEDY))
    assert "differs from its own forward" in capsys.readouterr().out


def test_attention_arguments_it_does_not_know_are_refused():
    call = generic._Call("probe", {}, mask=torch.ones(1, 3, dtype=torch.long))
    q, kv = torch.randn(1, 2, 3, 4), torch.randn(1, 1, 3, 4)

    class Attention(torch.nn.Module):
        layer_idx, is_causal = 0, True

    with pytest.raises(RuntimeError, match="only inside rlhfkit's static engine"):
        generic._attention(Attention(), q, kv, kv, None)
    generic._ACTIVE.append(call)
    try:
        with pytest.raises(generic.NotCovered, match="attention argument s_aux"):  # e.g. gpt-oss's attention sinks
            generic._attention(Attention(), q, kv, kv, None, s_aux=torch.zeros(2))
        bidirectional = Attention()
        bidirectional.is_causal = False
        with pytest.raises(generic.NotCovered, match="non-causal"):
            generic._attention(bidirectional, q, kv, kv, None)
        out, _ = generic._attention(Attention(), q, kv, kv, None, position_ids=torch.arange(3), sliding_window=None)
        assert out.shape == (1, 3, 2, 4) and call.layers == {0: 0}  # harmless arguments pass; the layer is learned
    finally:
        generic._ACTIVE.pop()


def test_configs_restored_and_the_hook_left_unused_outside_a_call():
    model = family_model("olmo2")
    before = model.config._attn_implementation
    static().generate(model, prompts(3, 2), GREEDY)
    assert model.config._attn_implementation == before  # the model's own attention for the trainer's forwards
    with torch.no_grad():
        model(input_ids=torch.tensor([prompts(1, 3)[0]]))  # runs without rlhfkit's attention


def test_auto_says_which_path_and_why_in_one_line(capsys):
    engine = AutoEngine(**COMMON)
    for name in ("qwen3", "gpt2"):
        model = family_model(name)
        for _ in range(2):
            engine.generate(model, prompts(2, 4), GREEDY)
    out = [line for line in capsys.readouterr().out.splitlines() if "auto:" in line]
    assert out == ["[rollout] auto: static engine on cpu, rlhfkit's decoder for Qwen3ForCausalLM",
                   "[rollout] auto: static engine on cpu, the model's own modules over rlhfkit's cache "
                   "(architecture GPT2LMHeadModel is not in rlhfkit's decoder)"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (bench/gpu_check.py "
                                                          "checks them on a GPU)")
def test_cuda_graph_step_equals_eager_on_cuda():
    model = family_model("olmo2").cuda()
    eager = static(cuda_graphs=False).generate(model, prompts(5, 5), GREEDY)
    graphed = static(cuda_graphs=True).generate(model, prompts(5, 5), GREEDY)
    assert_same_rollout(eager, graphed)


def test_the_engine_keeps_no_model_alive():
    """What the check learned is kept per model, weakly: a model the run drops (a pipeline's finished stage) is
    freed, and a model of the same shapes reuses the cache buffers."""
    import gc
    import weakref

    engine = static()
    model = family_model("olmo2")
    engine.generate(model, prompts(2, 7), GREEDY)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None and len(engine._checked) == 0
    slots = len(engine._slots)
    engine.generate(family_model("olmo2", seed=3), prompts(2, 7), GREEDY)
    assert len(engine._slots) == slots
