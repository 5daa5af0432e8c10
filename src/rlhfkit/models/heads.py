"""Scalar heads: per-token values and last-token scores of ``AutoModelForSequenceClassification`` models.

Hugging Face's sequence-classification forward pools at the last token that is not the pad id, which goes wrong
when pad == EOS (the EOS itself is skipped). We instead read the head's per-token output (a forward hook on the
``score`` linear layer, so DDP / FSDP / PEFT wrappers keep working) and pick positions with the attention mask.
"""

from __future__ import annotations

import contextlib

import torch


def unwrap(model):
    """Strip DDP / FSDP / accelerate / PEFT wrappers down to the ``transformers`` model."""
    seen = 0
    while seen < 8:
        seen += 1
        if hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
            continue
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
            continue
        break
    return model


def score_head(model) -> torch.nn.Module:
    """The linear head of a sequence-classification model (``score`` in Llama / Qwen / Mistral, …)."""
    base = unwrap(model)
    for name in (getattr(base, "rlhfkit_value_head", "score"), "score", "classifier", "v_head"):
        head = getattr(base, name, None)
        if isinstance(head, torch.nn.Module):
            return head
    raise TypeError(f"{type(base).__name__} has no scalar head (expected a `score` layer)")


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 in each row of ``attention_mask`` [B, T] -> [B] (left or right padding alike)."""
    T = attention_mask.shape[-1]
    return (T - 1) - attention_mask.flip(-1).to(torch.long).argmax(-1)


@contextlib.contextmanager
def _capture(head: torch.nn.Module):
    box: dict[str, torch.Tensor] = {}

    def hook(_mod, _inp, out):
        box["out"] = out

    handle = head.register_forward_hook(hook)
    try:
        yield box
    finally:
        handle.remove()


def token_values(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
    """Per-token scalar outputs [B, T] of a 1-label sequence-classification model (the critic's values)."""
    with _capture(score_head(model)) as box:
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
    out = box["out"]
    if out.shape[-1] != 1:
        raise ValueError(f"expected a 1-label head, got {out.shape[-1]} labels")
    return out.squeeze(-1)


def sequence_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
    """Reward-model scores [B]: the head's output at each row's last real token (attention mask decides)."""
    values = token_values(model, input_ids, attention_mask, **kwargs)
    idx = last_token_index(attention_mask).unsqueeze(-1)
    return values.gather(-1, idx).squeeze(-1)
