"""LoRA merged into the weights for one generation call, and the weights restored bit for bit afterwards.

Generation through an unmerged adapter pays two extra small matmuls per adapted layer per token, and an engine that
reads the weights directly (the static engine) would not see the adapter at all. So every engine generates inside
:func:`merged_lora`: each active LoRA layer's base weight (and bias, with ``lora_bias``) is copied aside, peft merges
the adapter into it in place (``layer.merge()``), and on exit peft's ``unmerge()`` keeps its bookkeeping while the
copies are written back. Floating-point merge + unmerge is not exact (``(W + BA) - BA != W`` in general), so the
values come from the copies, never from the subtraction: the trained weights are bit-identical after a rollout.

Memory: a copy of the adapted layers' base weights during the call (for the usual attention-only targets a small
fraction of the model; with ``all-linear`` the linear layers, never the embeddings). Quantized base weights (QLoRA),
disabled adapters and non-LoRA PEFT methods are left as they are (generation then runs through the adapter).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def mergeable_lora_layers(model: torch.nn.Module) -> list:
    """The LoRA layers of ``model`` whose active adapters can be merged into floating-point base weights now."""
    if not hasattr(model, "peft_config"):
        return []
    from peft.tuners.lora import LoraLayer

    out = []
    for m in model.modules():
        if not isinstance(m, LoraLayer) or m.merged or m.disable_adapters:
            continue
        if not any(name in m.lora_A for name in m.active_adapters):
            continue
        weight = getattr(m.get_base_layer(), "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dtype.is_floating_point:
            out.append(m)
    return out


@contextlib.contextmanager
def merged_lora(model: torch.nn.Module) -> Iterator[int]:
    """Merge every mergeable LoRA layer for the block (yields how many); restore the exact weights after."""
    layers = mergeable_lora_layers(model)
    if not layers:
        yield 0
        return
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    for m in layers:
        base = m.get_base_layer()
        for p in (base.weight, getattr(base, "bias", None)):
            if isinstance(p, torch.Tensor):
                saved.append((p, p.detach().clone()))
    try:
        with torch.no_grad():
            for m in layers:
                m.merge()
        yield len(layers)
    finally:
        with torch.no_grad():
            for m in layers:
                if m.merged:
                    m.unmerge()  # peft's bookkeeping (merged_adapters); the values come from the copies below
            for p, value in saved:
                p.data.copy_(value)
