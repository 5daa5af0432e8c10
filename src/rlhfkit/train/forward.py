"""The model calls of the online step (``online.py``): the response positions' logits and the critic's values,
an offloaded model on the device for one block, dropout off. Kept apart so the loop stays one readable file."""

from __future__ import annotations

import contextlib

import torch

from ..models.heads import token_values


def response_logits(model, batch: dict, temperature: float) -> torch.Tensor:
    """Logits [B, R, V] predicting each response token; only the last R+1 positions go through the LM head."""
    R = batch["response_ids"].shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], use_cache=False, logits_to_keep=R + 1)
    logits = out.logits[:, :-1]
    return logits / temperature if temperature > 0 and temperature != 1.0 else logits


def response_values(critic, batch: dict) -> torch.Tensor:
    """Critic values [B, R]: the value at the position *before* each response token (the state it is taken in)."""
    R = batch["response_ids"].shape[1]
    values = token_values(critic, batch["input_ids"], batch["attention_mask"], position_ids=batch["position_ids"])
    return values[:, -R - 1:-1].float()


@contextlib.contextmanager
def on_device(model, device, offload: bool):
    """Move an offloaded model to ``device`` for the duration of the block, and back to CPU after."""
    if offload:
        model.to(device)
    try:
        yield model
    finally:
        if offload:
            model.to("cpu")


def disable_dropout(model) -> None:
    """Dropout off in online RL (LoRA dropout included): old and new log-probs must agree at equal weights, or the
    PPO ratio and the KL estimate carry noise that no learning can remove."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    for key in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if isinstance(getattr(model.config, key, None), float):
            setattr(model.config, key, 0.0)
