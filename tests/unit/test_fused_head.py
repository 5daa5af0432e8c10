"""Log-probs, entropies and greedy tokens from the hidden states through the LM head in chunks
(``algos.linear_token_stats``, ``train.shared.forward.HeadStats``): values and gradients equal the plain path (the full
logits, then the float32 softmax), in float32, with the hand-checked edge cases (temperature, ignored positions, tied
embeddings, a bias, LoRA on the head, bf16 inputs, a head that is not linear, a model that changes its logits after
the head), and no tensor of [B, T, V] elements ever exists in a training step."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlhfkit.algos import linear_token_stats, token_logprobs
from rlhfkit.train.online.experience import position_ids_of
from rlhfkit.train.shared.forward import (
    IGNORE,
    HeadStats,
    completion_stats,
    module_token_stats,
    response_logits,
    response_stats,
)
from rlhfkit.train.supervised.preference import sequence_logps

V, H = 67, 16


def _plain(hidden, weight, labels, bias=None, lows=(), temperature=1.0):
    """The plain path: every logit in float32, log_softmax, gather; entropy -sum p log p; argmax."""
    logits = hidden.float() @ weight.float().t()
    if bias is not None:
        logits = logits + bias.float()
    for x, w in lows:
        logits = logits + x.float() @ w.float().t()
    logits = logits / temperature
    logp = torch.log_softmax(logits, -1)
    keep = labels != IGNORE
    lp = torch.where(keep, logp.gather(-1, torch.where(keep, labels, 0)[..., None]).squeeze(-1), 0.0)
    ent = torch.where(keep, -(logp.exp() * logp).sum(-1), 0.0)
    return lp, ent, torch.where(keep, logits.argmax(-1), -1)


def _inputs(N=11, seed=0, dtype=torch.float32, r=3):
    g = torch.Generator().manual_seed(seed)
    t = {"hidden": torch.randn(N, H, generator=g), "weight": torch.randn(V, H, generator=g) * 0.5,
         "bias": torch.randn(V, generator=g), "x": torch.randn(N, r, generator=g), "w": torch.randn(V, r, generator=g)}
    t = {k: v.to(dtype).requires_grad_(True) for k, v in t.items()}
    labels = torch.randint(0, V, (N,), generator=g)
    return t, labels


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 11, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_plain_path(chunk_size, temperature):
    t, labels = _inputs()
    labels[[2, 7]] = IGNORE  # ignored positions: 0, no gradient, not computed
    g = torch.Generator().manual_seed(9)
    a, c = torch.randn(labels.shape, generator=g), torch.randn(labels.shape, generator=g)

    def grads(lp, ent):
        return torch.autograd.grad((lp * a).sum() + (ent * c).sum(), list(t.values()))

    st = linear_token_stats(t["hidden"], t["weight"], labels, bias=t["bias"], low_rank=((t["x"], t["w"]),),
                            temperature=temperature, entropy=True, argmax=True, chunk_size=chunk_size)
    lp, ent, top = _plain(t["hidden"], t["weight"], labels, t["bias"], ((t["x"], t["w"]),), temperature)
    torch.testing.assert_close(st.logprobs, lp)
    torch.testing.assert_close(st.entropy, ent)
    assert torch.equal(st.argmax, top)
    assert st.logprobs[2] == 0 and st.entropy[7] == 0 and st.argmax[2] == -1
    ours = grads(st.logprobs, st.entropy)
    for mine, plain in zip(ours, grads(lp, ent)):
        torch.testing.assert_close(mine, plain, atol=1e-5, rtol=1e-4)
    assert ours[0][[2, 7]].abs().sum() == 0  # an ignored position sends nothing back


def test_hand_values_uniform_head():
    # W = 0: every logit 0, V equal probabilities: log p = -log V, entropy log V; argmax the first id (ties)
    hidden = torch.randn(2, 3, H)
    st = linear_token_stats(hidden, torch.zeros(V, H), torch.tensor([[0, 5, 66], [1, IGNORE, 3]]), entropy=True,
                            argmax=True, chunk_size=2)
    want = torch.tensor([[-math.log(V)] * 3, [-math.log(V), 0.0, -math.log(V)]])
    torch.testing.assert_close(st.logprobs, want)
    torch.testing.assert_close(st.entropy, -want)
    assert st.argmax.tolist() == [[0, 0, 0], [0, -1, 0]]
    # the gradient of log p(y) w.r.t. the logits is onehot(y) - 1/V; through W: d/dW_v = (onehot - 1/V) x h
    w = torch.zeros(V, H, requires_grad=True)
    h = torch.randn(1, H)
    linear_token_stats(h, w, torch.tensor([4])).logprobs.sum().backward()
    want_w = (torch.nn.functional.one_hot(torch.tensor(4), V).float() - 1 / V)[:, None] * h
    torch.testing.assert_close(w.grad, want_w)


def test_gradcheck_float64_every_input():
    g = torch.Generator().manual_seed(3)
    N, Hs, Vs, r = 5, 4, 9, 2  # small: gradcheck perturbs every input element
    t = {k: torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(True) for k, shape in
         (("hidden", (N, Hs)), ("weight", (Vs, Hs)), ("bias", (Vs,)), ("x", (N, r)), ("w", (Vs, r)))}
    labels = torch.randint(0, Vs, (N,), generator=g)
    labels[1] = IGNORE

    def f(*xs):
        hidden, weight, bias, x, w = xs
        st = linear_token_stats(hidden, weight, labels, bias=bias, low_rank=((x, w),), temperature=0.6,
                                entropy=True, chunk_size=3)
        return st.logprobs, st.entropy

    assert torch.autograd.gradcheck(f, tuple(t.values()))


def test_bf16_inputs_accumulate_in_float32():
    t, labels = _inputs(dtype=torch.bfloat16, seed=4)
    st = linear_token_stats(t["hidden"], t["weight"], labels, entropy=True, chunk_size=4)
    assert st.logprobs.dtype == torch.float32 and st.entropy.dtype == torch.float32
    # the plain path of a bf16 model: bf16 logits, then the float32 softmax of them
    logits = (t["hidden"] @ t["weight"].t()).float()
    torch.testing.assert_close(st.logprobs, token_logprobs(logits, labels))
    st.logprobs.sum().backward()
    assert t["hidden"].grad.dtype == torch.bfloat16 and t["weight"].grad.dtype == torch.bfloat16


def test_no_labels_and_bad_input():
    t, _ = _inputs()
    st = linear_token_stats(t["hidden"], t["weight"], torch.full((11,), IGNORE), entropy=True)
    assert st.logprobs.abs().sum() == 0 and st.entropy.abs().sum() == 0
    with pytest.raises(ValueError, match="disagree"):
        linear_token_stats(t["hidden"], t["weight"], torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        linear_token_stats(t["hidden"], t["weight"], torch.zeros(11, dtype=torch.long), temperature=0.0)


# ─────────────────────────────────────────────── through a model ────────────────────────────────────────────────


def _model(tied: bool, seed: int = 0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, pad_token_id=0,
                                        tie_word_embeddings=tied, initializer_range=0.2))


def _batch(order=(0, 1, 0, 1, 2, 2)):
    prompts = [[5, 6, 7, 8], [10, 11], [12, 13, 14]]
    P, R = 4, 5
    rows = [prompts[i] for i in order]
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, R + 1, (len(rows),), generator=g)
    resp = torch.randint(1, V, (len(rows), R), generator=g) * (torch.arange(R)[None] < lengths[:, None])
    ids = torch.tensor([[0] * (P - len(p)) + p for p in rows])
    mask = torch.cat([ids != 0, resp != 0], 1).long()
    return {"input_ids": torch.cat([ids, resp], 1), "attention_mask": mask, "position_ids": position_ids_of(mask),
            "response_ids": resp, "mask": mask[:, P:]}


def _plain_response(model, batch, temperature, share):
    logits = response_logits(model, batch, temperature, share_prompts=share)
    logp = torch.log_softmax(logits.float(), -1)
    lp = logp.gather(-1, batch["response_ids"][..., None]).squeeze(-1)
    return lp, -(logp.exp() * logp).sum(-1), logits.argmax(-1)


def _compare(model, batch, temperature=0.7, share=True, params=None):
    params = [p for p in model.parameters() if p.requires_grad] if params is None else params
    keep = batch["mask"].float()
    g = torch.Generator().manual_seed(5)
    a, c = torch.randn(keep.shape, generator=g), torch.randn(keep.shape, generator=g)

    def grads(lp, ent):
        return torch.autograd.grad(((lp * a + ent * c) * keep).sum(), params, allow_unused=True)

    st = response_stats(model, batch, temperature, entropy=True, entropy_grad=True, argmax=True, share_prompts=share,
                        chunk_size=4)
    lp, ent, top = _plain_response(model, batch, temperature, share)
    torch.testing.assert_close(st.logprobs, lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(st.entropy, ent, atol=1e-5, rtol=1e-5)
    assert torch.equal(st.argmax, top)
    if not params:
        return
    n = 0
    for ours, plain in zip(grads(st.logprobs, st.entropy), grads(lp, ent)):
        if plain is None:
            assert ours is None or ours.abs().sum() == 0
            continue
        torch.testing.assert_close(ours, plain, atol=1e-5, rtol=1e-4)
        n += plain.abs().sum() > 0
    assert n >= 2


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("share", [False, True])
def test_response_stats_equal_the_logits_path(tied, share):
    model = _model(tied)
    _compare(model, _batch(), share=share)


def test_temperature_zero_is_the_plain_logits_and_one_is_unscaled():
    model, batch = _model(False), _batch()
    for t in (0.0, 1.0):
        st = response_stats(model, batch, t)
        torch.testing.assert_close(st.logprobs, _plain_response(model, batch, t, True)[0], atol=1e-5, rtol=1e-5)


def test_head_with_a_bias():
    model = _model(False)
    head = torch.nn.Linear(32, V, bias=True)
    torch.nn.init.normal_(head.bias, std=1.0)
    model.lm_head = head
    _compare(model, _batch(), share=False)
    _compare(model, _batch(), share=True)


def test_peft_lora_on_the_head_and_its_disabled_adapter():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_model(False), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"],
                                                     lora_dropout=0.0, init_lora_weights=False))
    head = model.get_output_embeddings()
    assert hasattr(head, "lora_A")  # the head itself is adapted
    trained = [head.lora_A["default"].weight, head.lora_B["default"].weight]
    _compare(model, _batch(), share=False, params=trained)
    _compare(model, _batch(), share=False)  # every trained parameter: the head's adapter and q_proj's
    with model.disable_adapter():  # the reference: the base head alone, the same as its plain logits
        _compare(model, _batch(), share=True, params=[])


def test_a_head_that_is_not_linear_takes_the_generic_chunked_path():
    model = _model(False)

    class Scaled(torch.nn.Module):  # a head rlhfkit cannot see through: its output over chunks, recomputed
        def __init__(self, inner):
            super().__init__()
            self.inner, self.weight = inner, inner.weight

        def forward(self, x):
            return torch.tanh(self.inner(x) / 3) * 3

    model.lm_head = Scaled(model.lm_head)
    _compare(model, _batch(), share=False)
    # module_token_stats alone, several chunks and an ignored position, against the plain path
    x = torch.randn(2, 5, 32, requires_grad=True)
    labels = torch.randint(0, V, (2, 5))
    labels[0, 1] = IGNORE
    st = module_token_stats(model.lm_head, x, labels, 0.8, entropy=True, chunk_size=3)
    logits = model.lm_head(x) / 0.8
    keep = labels != IGNORE
    torch.testing.assert_close(st.logprobs, torch.where(keep, token_logprobs(logits, labels.clamp(min=0)), 0.0))


def test_a_model_that_changes_its_logits_after_the_head_is_computed_plainly(capsys):
    model = _model(False)
    forward = model.forward

    def capped(*args, **kwargs):  # soft-capping after the head, as Gemma-2 does
        out = forward(*args, **kwargs)
        out.logits = torch.tanh(out.logits / 2) * 2
        return out

    model.forward = capped
    batch = _batch()
    st = response_stats(model, batch, 1.0, share_prompts=False)
    torch.testing.assert_close(st.logprobs, _plain_response(model, batch, 1.0, False)[0], atol=1e-5, rtol=1e-5)
    assert "changed after the LM head" in capsys.readouterr().out
    response_stats(model, batch, 1.0)  # said once
    assert capsys.readouterr().out == ""
    assert HeadStats(model).plain


def test_completion_stats_and_the_preference_sequence_logps():
    model = _model(True)
    batch = _batch()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    labels = torch.where(mask.bool(), ids, IGNORE)
    labels[:, :3] = IGNORE  # the prompt: not trained, not computed
    st = completion_stats(model, ids, mask, labels)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    keep = labels[:, 1:] != IGNORE
    want = torch.where(keep, token_logprobs(logits, ids[:, 1:]), 0.0)
    torch.testing.assert_close(st.logprobs, want, atol=1e-5, rtol=1e-5)
    completion = torch.zeros_like(mask)
    completion[:, 4:] = batch["mask"]
    summed, count = sequence_logps(model, ids, mask, completion, start=2)
    torch.testing.assert_close(summed, (token_logprobs(logits, ids[:, 1:]) * completion[:, 1:]).sum(-1),
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(count, completion[:, 3:].sum(-1).float())


def test_no_tensor_of_batch_x_tokens_x_vocab_elements_in_a_training_step():
    """Every tensor over the vocabulary made while the policy's response log-probs, entropy and their gradients are
    computed holds at most a chunk of logits (4 tokens x V here), never the B x R x V of the plain path."""
    from torch.utils._python_dispatch import TorchDispatchMode

    model, batch = _model(False), _batch()
    B, R = batch["response_ids"].shape
    over_vocab = []

    class Watch(TorchDispatchMode):  # every tensor an op makes whose last dimension is the vocabulary (views aside)
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                    if isinstance(a, torch.Tensor)}
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == V and \
                        t.untyped_storage().data_ptr() not in seen:  # new memory, not a view of an input
                    over_vocab.append((t.numel() // V, str(func)))
            return out

    with Watch():
        st = response_stats(model, batch, 0.7, entropy=True, entropy_grad=True, share_prompts=False, chunk_size=4)
        ((st.logprobs + st.entropy) * batch["mask"]).sum().backward()
    assert over_vocab and max(over_vocab)[0] <= 4, max(over_vocab)  # rows of V: a chunk at most
    over_vocab.clear()
    with Watch():  # the plain path does make one (the check sees it)
        response_logits(model, batch, 0.7, share_prompts=False).sum().backward()
    assert max(over_vocab)[0] >= B * R


def _fake_liger(monkeypatch) -> list:
    """A CPU stand-in for liger_kernel's fused linear cross-entropy (its signature, its per-token loss -log p, 0 where
    ignored), served whenever no entropy and no LoRA are asked; returns the list of reductions it was called with."""
    import sys
    import types

    import rlhfkit.train.shared.forward as fwd

    calls = []

    def fake(h, weight, target, bias=None, ignore_index=-100, reduction="mean", return_predicted_tokens=False,
             accum_dtype=None):
        calls.append(reduction)
        logits = h @ weight.t() + (0 if bias is None else bias)
        keep = target != ignore_index
        loss = torch.where(keep, torch.nn.functional.cross_entropy(logits, target.clamp(min=0), reduction="none"), 0.0)
        return types.SimpleNamespace(loss=loss, predicted_tokens=torch.where(keep, logits.argmax(-1), -1))

    mod = types.ModuleType("liger_kernel.transformers.functional")
    mod.liger_fused_linear_cross_entropy = fake
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.functional", mod)
    monkeypatch.setattr(fwd, "liger_serves", lambda x, lows, entropy: not entropy and not lows)
    return calls


def test_liger_adapter_maps_temperature_bias_and_ignored_positions(monkeypatch):
    """Liger's kernel needs CUDA; here a stand-in with its signature and its per-token loss (-log p, 0 where ignored)
    checks what rlhfkit hands it and reads back (bench/gpu_check.py compares the real kernel on a GPU)."""
    calls = _fake_liger(monkeypatch)
    model = _model(False)
    model.lm_head = torch.nn.Linear(32, V, bias=True)
    batch = _batch()
    st = response_stats(model, batch, 0.7, argmax=True, share_prompts=False)
    lp, _, top = _plain_response(model, batch, 0.7, False)
    assert calls == ["none"]
    torch.testing.assert_close(st.logprobs, lp, atol=1e-5, rtol=1e-5)
    assert torch.equal(st.argmax, top)
    response_stats(model, batch, 0.7, entropy=True, share_prompts=False)  # the entropy: rlhfkit's own path
    assert calls == ["none"]


@pytest.mark.parametrize("chunk_size", [3, None])
def test_mean_logits_equal_the_plain_mean_over_the_vocabulary(chunk_size):
    """TRL's ``logits/chosen``: the mean logit over the vocabulary of each trained position, computed here as the head
    applied to the weights' mean row (bias, LoRA path and temperature included), checked against every logit made."""
    from rlhfkit.algos import token_stats_from_logits
    from rlhfkit.algos.logprobs import linear_mean_logits

    t, labels = _inputs()
    labels[[2, 7]] = IGNORE
    lows = ((t["x"], t["w"]),)
    logits = (t["hidden"] @ t["weight"].t() + t["bias"] + t["x"] @ t["w"].t()) / 0.7
    keep = labels != IGNORE
    want = torch.where(keep, logits.mean(-1), 0.0).detach()
    st = linear_token_stats(t["hidden"], t["weight"], labels, bias=t["bias"], low_rank=lows, temperature=0.7,
                            mean_logits=True, chunk_size=chunk_size)
    torch.testing.assert_close(st.mean_logits, want, atol=1e-5, rtol=1e-5)
    assert st.mean_logits[2] == 0 and not st.mean_logits.requires_grad  # a metric: no gradient
    assert linear_token_stats(t["hidden"], t["weight"], labels).mean_logits is None  # not asked: not computed
    torch.testing.assert_close(linear_mean_logits(t["hidden"], t["weight"]), (t["hidden"] @ t["weight"].t()).mean(-1),
                               atol=1e-5, rtol=1e-5)
    ml = token_stats_from_logits(logits, labels, mean_logits=True).mean_logits
    torch.testing.assert_close(ml, want, atol=1e-5, rtol=1e-5)
    # hand values: logits [1, 2, 6] -> 3; an ignored position -> 0
    hand = token_stats_from_logits(torch.tensor([[1.0, 2.0, 6.0], [0.0, 0.0, 9.0]]), torch.tensor([0, IGNORE]),
                                   mean_logits=True)
    assert hand.mean_logits.tolist() == [3.0, 0.0]


def test_mean_logits_and_metric_entropy_through_a_model_and_a_generic_head():
    model = _model(False)
    batch = _batch()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    labels = torch.where(mask.bool(), ids, IGNORE)
    labels[:, :3] = IGNORE
    keep = labels[:, 1:] != IGNORE
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1)
    st = completion_stats(model, ids, mask, labels, entropy="metric", argmax=True, mean_logits=True)  # fused path
    torch.testing.assert_close(st.mean_logits, torch.where(keep, logits.mean(-1), 0.0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(st.entropy, torch.where(keep, -(logp.exp() * logp).sum(-1), 0.0), atol=1e-5,
                               rtol=1e-5)
    assert not st.entropy.requires_grad  # a metric: detached
    x = torch.randn(2, 5, 32)  # a head that is not linear: its logits per chunk, their mean
    y = torch.randint(0, V, (2, 5))
    y[1, 3] = IGNORE
    head = torch.nn.Sequential(model.lm_head, torch.nn.Tanh())
    got = module_token_stats(head, x, y, 0.5, mean_logits=True, chunk_size=3).mean_logits
    torch.testing.assert_close(got, torch.where(y != IGNORE, (head(x) / 0.5).mean(-1), 0.0), atol=1e-5, rtol=1e-5)


def test_liger_stats_give_mean_logits_and_no_entropy(monkeypatch):
    """Under Liger's kernel (a CPU stand-in with its signature) the mean logits still come (a cheap matmul with the
    mean row), the metric entropy does not (Liger has none)."""
    _fake_liger(monkeypatch)
    model = _model(False)
    model.lm_head = torch.nn.Linear(32, V, bias=True)
    batch = _batch()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    labels = torch.where(mask.bool(), ids, IGNORE)
    st = completion_stats(model, ids, mask, labels, entropy="metric", argmax=True, mean_logits=True)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    keep = labels[:, 1:] != IGNORE
    torch.testing.assert_close(st.mean_logits, torch.where(keep, logits.mean(-1), 0.0), atol=1e-5, rtol=1e-5)
    assert st.entropy is None
    forced = completion_stats(model, ids, mask, labels, entropy=True)  # asked for as a loss term: rlhfkit's path
    assert forced.entropy is not None
