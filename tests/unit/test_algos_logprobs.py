"""Chunked log-probs / entropy against the direct full-softmax computation (values and gradients)."""

import math

import pytest
import torch

from rlhfkit.algos import entropy_from_logits, token_logprobs


def _direct_logprobs(logits, labels):
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _direct_entropy(logits):
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _rand(B=3, T=7, V=11, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g) * 3).to(dtype)
    labels = torch.randint(0, V, (B, T), generator=g)
    return logits, labels


def test_uniform_logits_hand_values():
    # V = 4 equal logits: log p = -log 4 at every label, entropy = log 4
    logits = torch.zeros(2, 3, 4)
    labels = torch.tensor([[0, 1, 2], [3, 0, 1]])
    torch.testing.assert_close(token_logprobs(logits, labels), torch.full((2, 3), -math.log(4)))
    torch.testing.assert_close(entropy_from_logits(logits), torch.full((2, 3), math.log(4)))


@pytest.mark.parametrize("chunk_size", [1, 2, 5, 7, 8, 15, 100, None])
def test_token_logprobs_chunked_matches_direct(chunk_size):
    logits, labels = _rand()
    out = token_logprobs(logits, labels, chunk_size=chunk_size)
    assert out.dtype == torch.float32 and out.shape == labels.shape
    torch.testing.assert_close(out, _direct_logprobs(logits, labels))
    torch.testing.assert_close(entropy_from_logits(logits, chunk_size=chunk_size), _direct_entropy(logits))


def test_bfloat16_input_computed_in_float32():
    logits, labels = _rand(dtype=torch.bfloat16)
    # each chunk is cast to float32, so the result equals the float32 softmax of the bf16 values
    torch.testing.assert_close(token_logprobs(logits, labels, chunk_size=4), _direct_logprobs(logits, labels))
    torch.testing.assert_close(entropy_from_logits(logits, chunk_size=4), _direct_entropy(logits))
    assert token_logprobs(logits, labels).dtype == torch.float32


def test_non_contiguous_slice_and_2d_input():
    logits, labels = _rand(T=8)
    sliced = logits[:, :-1]  # the usual "drop the last position" view
    torch.testing.assert_close(
        token_logprobs(sliced, labels[:, 1:], chunk_size=3), _direct_logprobs(sliced, labels[:, 1:])
    )
    flat, flat_labels = logits.reshape(-1, 11), labels.reshape(-1)
    torch.testing.assert_close(
        token_logprobs(flat, flat_labels, chunk_size=5), _direct_logprobs(flat, flat_labels)
    )
    torch.testing.assert_close(entropy_from_logits(flat, chunk_size=5), _direct_entropy(flat))


@pytest.mark.parametrize("chunk_size", [1, 4, None])
def test_gradients_match_direct(chunk_size):
    logits, labels = _rand(seed=1)
    w = torch.randn(labels.shape, generator=torch.Generator().manual_seed(2))
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    (
        (token_logprobs(a, labels, chunk_size) * w).sum() + (entropy_from_logits(a, chunk_size) * w).sum()
    ).backward()
    ((_direct_logprobs(b, labels) * w).sum() + (_direct_entropy(b) * w).sum()).backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_gradcheck_float64():
    logits, labels = _rand(B=2, T=3, V=5, dtype=torch.float64, seed=3)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, labels, chunk_size=2), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, chunk_size=2), (logits,))


def test_bf16_gradient_dtype():
    logits, labels = _rand(dtype=torch.bfloat16, seed=4)
    a = logits.clone().requires_grad_(True)
    token_logprobs(a, labels, chunk_size=4).sum().backward()
    b = logits.float().requires_grad_(True)
    _direct_logprobs(b, labels).sum().backward()
    assert a.grad.dtype == torch.bfloat16
    torch.testing.assert_close(a.grad.float(), b.grad, atol=1e-2, rtol=1e-2)


def test_entropy_with_minus_inf_logits_is_finite():
    # logits [0, -inf, -inf]: all mass on one token -> entropy 0 (0 * -inf must not give NaN)
    logits = torch.tensor([[[0.0, -math.inf, -math.inf], [0.0, 0.0, -math.inf]]], requires_grad=True)
    ent = entropy_from_logits(logits)
    torch.testing.assert_close(ent.detach(), torch.tensor([[0.0, math.log(2)]]))
    ent.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_inputs_not_modified():
    logits, labels = _rand()
    l0, y0 = logits.clone(), labels.clone()
    token_logprobs(logits, labels, chunk_size=2)
    entropy_from_logits(logits, chunk_size=2)
    assert torch.equal(logits, l0) and torch.equal(labels, y0)
