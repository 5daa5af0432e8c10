"""Memory between the phases of an online step: what the rollout does not need leaves the device while the engine
generates, and what the forwards and the update do not need (the engine's KV cache) leaves it after.

- ``memory.offload_optimizer``: the optimizer's state (AdamW's two moments and step count: 12 bytes per trained
  parameter, the largest resident term of a full fine-tune) is copied into host buffers before each rollout and its
  device tensors freed; :func:`~rlhfkit.train.lifecycle.optim.clip_and_step` brings it back before the first update of
  the step
  (:func:`restore_optimizer`). The host buffers are kept (pinned when CUDA is there) and reused, so each step costs
  one copy out and one back, no allocation. The update computes exactly what it would have (the same tensors, moved
  and back: tested bit for bit).
- ``memory.release_engine_cache``: the rollout engine's caches (the static engine's KV cache of each batch bucket and
  its CUDA graphs) are freed after each rollout (``Engine.release``) and allocated again by the next one.

Both through :func:`rollout_phase`, the context the online loop's rollout runs in. The reference, reward model and
teacher have their own offload (``memory.offload_reference`` / ``offload_reward`` / ``offload_teacher``).
"""

from __future__ import annotations

import contextlib

import torch


def _inner(optimizer):
    """The torch optimizer under accelerate's ``AcceleratedOptimizer`` (its ``.optimizer``)."""
    return getattr(optimizer, "optimizer", optimizer)


def is_offloaded(optimizer) -> bool:
    return bool(getattr(_inner(optimizer), "rlhfkit_offloaded", None))


def offload_optimizer(optimizer) -> int:
    """Copy every state tensor of ``optimizer`` into a host buffer (made once, pinned when CUDA is available, then
    reused) and let the device tensors go; returns the bytes moved. Their devices are remembered for
    :func:`restore_optimizer`. Idempotent."""
    opt = _inner(optimizer)
    if is_offloaded(opt):
        return 0
    buffers: dict = getattr(opt, "rlhfkit_host_state", None) or {}
    devices: dict = {}
    moved = 0
    pin = torch.cuda.is_available()
    for p, state in opt.state.items():
        for key, t in state.items():
            if not isinstance(t, torch.Tensor):
                continue
            host = buffers.get((id(p), key))
            if host is None or host.shape != t.shape or host.dtype != t.dtype:
                host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin and t.device.type == "cuda")
                buffers[(id(p), key)] = host
            host.copy_(t, non_blocking=host.is_pinned())
            devices[(id(p), key)] = t.device
            state[key] = host
            moved += t.numel() * t.element_size()
    if pin:
        torch.cuda.synchronize()  # the host copies complete before anything reads them
    opt.rlhfkit_host_state, opt.rlhfkit_offloaded = buffers, devices
    return moved


def restore_optimizer(optimizer) -> int:
    """The state :func:`offload_optimizer` moved, back on the devices it came from (new device tensors; the host
    buffers are kept for the next offload); returns the bytes moved. A no-op when nothing is offloaded."""
    opt = _inner(optimizer)
    devices = getattr(opt, "rlhfkit_offloaded", None)
    if not devices:
        return 0
    moved = 0
    for p, state in opt.state.items():
        for key, t in state.items():
            device = devices.get((id(p), key))
            if device is None or not isinstance(t, torch.Tensor):
                continue
            state[key] = torch.empty(t.shape, dtype=t.dtype, device=device).copy_(t, non_blocking=t.is_pinned())
            moved += t.numel() * t.element_size()
    opt.rlhfkit_offloaded = None
    return moved


def _trains_on_an_accelerator(optimizer) -> bool:
    return any(p.device.type != "cpu" for group in _inner(optimizer).param_groups for p in group["params"])


@contextlib.contextmanager
def rollout_phase(memory, engine, *optimizers):
    """The context of a rollout (``Producer.memory_phase``): with ``memory.offload_optimizer``, each optimizer's state
    (``None`` skipped; of models trained on an accelerator: on CPU there is nowhere to move it) goes to host memory
    first (back at the next update, in ``clip_and_step``); with ``memory.release_engine_cache``, the engine's caches
    are freed after."""
    if memory.offload_optimizer:
        for opt in optimizers:
            if opt is not None and isinstance(_inner(opt), torch.optim.Optimizer) and _trains_on_an_accelerator(opt):
                offload_optimizer(opt)
    try:
        yield
    finally:
        if memory.release_engine_cache:
            engine.release()
