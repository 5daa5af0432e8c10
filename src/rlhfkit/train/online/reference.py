"""The frozen reference of an online run: whether the run needs one, the model, and who computes its log-probs of
the sampled tokens.

The learner computes them in the synchronous mode (``learner.py``, step 4). In the asynchronous mode a producer can
instead, right after its rollout (``algo.async.reference``, :func:`on_producer`): the reference is frozen, so no
weights ever travel for it, and the learners' cycle shrinks to the update. Which side should carry it is a question
of balance, measured: on 2 CPU processes the learner is the busier side (SmolLM2, ``bench/async.py``, 2026-11-26:
reference 4.8 s + update 15.4 s a step against an 11.3-s rollout), on an H100 the rollout is (78% of the synchronous
GRPO step, 2026-11-24); ``auto`` follows that. Same model, same token batches, same precision on either side: the
numbers do not depend on where they are computed.
"""

from __future__ import annotations

import contextlib

import torch

from ... import algos
from ...models.loading import is_peft, load_causal_lm
from ..shared.batches import model_named
from ..shared.forward import on_device, response_stats


def needs_reference(cfg) -> bool:
    """A KL to the reference (in the reward or the loss), or online DPO's pair loss reading one."""
    algo = cfg.algo
    return algo.kl.coef > 0 or algo.kl.adaptive or (
        algo.objective == "preference" and algos.PREFERENCE_LOSSES[algo.preference.loss].needs_reference)


def on_producer(cfg, cuda: bool | None = None) -> bool:
    """Whether the asynchronous producers compute the reference log-probs (``algo.async.reference``; ``auto``:
    on CPU, not on CUDA, see the module doc). False in the synchronous mode and without a reference."""
    side = cfg.algo.async_.reference
    if cfg.algo.async_.max_staleness == 0 or not needs_reference(cfg):
        return False
    if side == "auto":
        side = "learner" if (torch.cuda.is_available() if cuda is None else cuda) else "producer"
    return side == "producer"


def load_reference(cfg, policy, tok, device):
    """The reference model (``ref_model``, else the policy's own checkpoint), on ``device`` or on the CPU with
    ``memory.offload_reference``; None for a LoRA policy without ``ref_model``: its reference is itself with the
    adapter disabled (:func:`reference_of`)."""
    if is_peft(policy) and cfg.ref_model is None:
        return None
    ref, _ = load_causal_lm(model_named(cfg.model, cfg.ref_model or cfg.model.name), tokenizer=tok, device=device,
                            seed=cfg.train.seed, trainable=False)
    ref.to("cpu" if cfg.memory.offload_reference else device)
    return ref


def reference_of(ref, policy, device, offload: bool, unwrap=lambda m: m):
    """(the model to run, a context to run it in): ``ref`` on the device for the block, or the (unwrapped) LoRA
    policy with its adapter disabled when ``ref`` is None."""
    if ref is None:
        return policy, unwrap(policy).disable_adapter()
    return ref, on_device(ref, device, offload)


def autocast_of(cfg, device) -> contextlib.AbstractContextManager:
    """The mixed precision a learner's forwards run under (accelerate's, from ``train.mixed_precision``), for a
    process without an accelerator (a producer)."""
    from ..lifecycle.run import mixed_precision

    mp = mixed_precision(cfg.train.mixed_precision, cfg.train.device == "cpu")
    if mp == "no":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16 if mp == "bf16" else torch.float16)


class ProducerReference:
    """A producer's reference: loaded once, frozen; :meth:`annotate` sets an experience's ``ref_logprobs`` as the
    learner's step 4 would (the same token batches of ``memory.forward_tokens``, the same precision)."""

    def __init__(self, cfg, policy, tok, device):
        self.cfg, self.policy, self.device = cfg, policy, device
        self.ref = load_reference(cfg, policy, tok, device)

    @torch.no_grad()
    def annotate(self, exp) -> None:
        cfg = self.cfg
        batches = exp.token_batches(cfg.memory.forward_tokens)
        model, context = reference_of(self.ref, self.policy, self.device, cfg.memory.offload_reference)
        with context, autocast_of(cfg, self.device):
            parts = [response_stats(model, b, cfg.generation.temperature).logprobs for _, b in batches]
        exp.ref_logprobs = exp.per_token(batches, parts)
