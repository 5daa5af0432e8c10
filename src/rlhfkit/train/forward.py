"""The model calls of the online step (``online.py``): the response positions' logits and the critic's values,
an offloaded model on the device for one block, dropout off. Kept apart so the loop stays one readable file."""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.fsdp import FSDPModule
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..models.heads import token_values
from ..rollout.decoder import distinct_rows


def response_logits(model, batch: dict, temperature: float, share_prompts: bool = True) -> torch.Tensor:
    """Logits [B, R, V] predicting each response token; only the last R+1 positions go through the LM head.

    ``share_prompts``: rows whose prompt columns are equal (a GRPO group: ``num_generations`` responses to one
    prompt) run their prompt once (:func:`shared_prompt_logits`); the others as one batch."""
    R = batch["response_ids"].shape[1]
    logits = shared_prompt_logits(model, batch) if share_prompts and can_share_prompts(model) else None
    if logits is None:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"], use_cache=False, logits_to_keep=R + 1)
        logits = out.logits[:, :-1]
    return logits / temperature if temperature > 0 and temperature != 1.0 else logits


def can_share_prompts(model) -> bool:
    """Whether :func:`shared_prompt_logits` may run ``model``: not under gradient checkpointing (transformers then
    drops the cache the responses attend to), a model whose every layer is full attention keeping every key (no
    sliding window, no linear-attention or recurrent layers), and with gradients only a model that no engine wraps
    (DDP, DeepSpeed, FSDP2 expect one forward per backward)."""
    lm = getattr(model, "module", model)  # DDP / DeepSpeed's wrapped model
    if (lm is not model or isinstance(model, FSDPModule)) and torch.is_grad_enabled():
        return False
    cfg = getattr(lm, "config", None)
    flag = next((n for n in ("is_activation_checkpointing", "is_gradient_checkpointing") if hasattr(type(lm), n)),
                None)  # transformers 5.23 renamed it (the old name warns)
    checkpointing = bool(flag and getattr(lm, flag))
    if cfg is None or checkpointing:
        return False
    text = cfg.get_text_config()
    return not getattr(text, "sliding_window", None) and set(getattr(text, "layer_types", None) or
                                                             ["full_attention"]) == {"full_attention"}


def shared_prompt_logits(model, batch: dict) -> torch.Tensor | None:
    """:func:`response_logits` with each distinct prompt run once: its keys / values (with their autograd graph)
    are copied to the rows that repeat it, and the responses attend to them, as ``generate`` runs a decode after the
    prefill. None when no prompt repeats (the caller runs the whole batch).

    Why: in GRPO / RLOO every prompt comes ``num_generations`` times and is often longer than its responses, so the
    policy's update and the no-grad passes spent most of their forward (and backward) on identical prompt columns.
    Measured on 2 CPU cores (``bench/step_parts.py``: SmolLM2-135M, 2 prompts of 43 tokens x 4 responses of 40):
    forward + backward 3.77 -> 2.77 s, no-grad forward 1.03 -> 0.79 s. Equal to the whole-batch forward to float
    rounding (tested: log-probs and gradients)."""
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    B, R = ids.shape[0], batch["response_ids"].shape[1]
    P = ids.shape[1] - R
    if P < 1 or R < 1:
        return None
    first, inverse = distinct_rows(ids[:, :P], mask[:, :P])  # a row of each distinct prompt
    if len(first) == B:
        return None
    out = model(input_ids=ids[first, :P], attention_mask=mask[first, :P], position_ids=pos[first, :P], use_cache=True,
                logits_to_keep=1)
    if out.past_key_values is not None and any(type(layer) is not DynamicLayer for layer in out.past_key_values.layers):
        return None  # a cache of another kind (a model the config check let through): the whole batch, correct
    columns = 0 if out.past_key_values is None else out.past_key_values.get_seq_length()
    if columns == P:
        cache = DynamicCache(ddp_cache_data=[(layer.keys.index_select(0, inverse), layer.values.index_select(
            0, inverse)) for layer in out.past_key_values.layers])
        rest = model(input_ids=ids[:, P:], attention_mask=mask, position_ids=pos[:, P:], past_key_values=cache,
                     use_cache=True, logits_to_keep=R)
        columns = cache.get_seq_length() - R
    if columns != P:  # the responses would not attend to their prompts: never a silent wrong result
        raise RuntimeError(f"shared-prompt forward: the model kept {columns} prompt columns in its cache, not {P}")
    return torch.cat([out.logits[:, -1:].index_select(0, inverse), rest.logits[:, :-1]], 1)


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
