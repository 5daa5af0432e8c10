"""How an update is made, in both loops: AdamW over the trainable parameters, the LR schedule, and
:func:`clip_and_step` (clip, step optimizer and schedule, zero the gradients; skip a non-finite update).

``clip_and_step`` lives here, beside the optimizer and schedule it steps, because it *is* the update every loop
calls: what a skipped update does to the optimizer (not stepped), the schedule (still stepped, so the LR and the data
position stay aligned) and the gradients (zeroed) is decided next to how they were built. The guard's state
(:class:`~rlhfkit.train.lifecycle.checkpoint.NonFiniteGuard`: the count, the patience) belongs to the run's lifecycle,
which
arms it on resume and logs it, and is read from there.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from ...errors import ConfigError, NonFiniteError
from ...track.console import get_console
from .checkpoint import guard_of
from .memory import restore_optimizer


def build_optimizer(params, optim, lr: float | None = None) -> torch.optim.Optimizer:
    """AdamW over trainable parameters; no weight decay on biases and norms (1-D tensors).

    PyTorch's fused kernel (``fused=True``: one kernel over all parameters) wherever it runs (floating-point
    parameters on CPU or CUDA), as TRL's default ``optim="adamw_torch_fused"``. On CPU PyTorch would otherwise take
    the per-tensor loop: for SmolLM2-135M on 2 cores one step took 0.40 s per-tensor, 0.51 s ``foreach``, 0.075 s
    fused (``bench/step_parts.py``); float32 results equal the loop's to rounding (tests/unit/test_optim_fused.py)."""
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ConfigError("the model has no trainable parameters", where="model.lora",
                          fix="check model.lora.target_modules")
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params) or None
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr if lr is not None else optim.lr,
                             betas=tuple(optim.betas), eps=optim.eps, fused=fused)


# our schedule names -> transformers.get_scheduler's
HF_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup"}


def lr_lambda(schedule: str, warmup: int, total: int, from_zero: bool = False) -> Callable[[int], float]:
    """Multiplier of the peak LR after ``step`` updates: linear warm-up, then linear / cosine decay or constant.

    The curves are ``transformers.get_scheduler``'s, read one update ahead during warm-up: transformers runs the
    first update at LR 0 (``step / warmup``); here it runs at ``1 / warmup`` of the peak and the warm-up's last
    update at the peak, so no update is wasted (``from_zero``: transformers' own reading, as TRL runs it,
    ``optim.warmup_from_zero``). Past ``total`` the multiplier stays at its end value (cosine would rise again).
    """
    from transformers import get_scheduler

    dummy = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)  # only to read transformers' curve
    curve = get_scheduler(HF_SCHEDULES[schedule], dummy, num_warmup_steps=warmup,
                          num_training_steps=total).lr_lambdas[0]

    def fn(step: int) -> float:
        ahead = step + 1 if step < warmup and not from_zero else step
        return float(curve(min(ahead, max(total, warmup))))

    return fn


def build_scheduler(optimizer, optim, total_updates: int):
    """``LambdaLR`` over :func:`lr_lambda` (transformers' schedules), stepped once per optimizer update."""
    import math

    from_zero = getattr(optim, "warmup_from_zero", False)  # transformers' reading: its ratio rounded up too
    ratio = math.ceil(optim.warmup_ratio * total_updates) if from_zero else int(optim.warmup_ratio * total_updates)
    warmup = optim.warmup_steps if optim.warmup_steps > 0 else ratio
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(optim.schedule, warmup, total_updates, from_zero))


def lr_used(scheduler) -> float:
    """The learning rate of the last update made (applied or skipped): the one a step's metrics report (TRL's
    ``learning_rate``), not the next update's (``get_last_lr``); the initial one before any update."""
    step = max(scheduler.last_epoch - 1, 0)
    return float(scheduler.base_lrs[0] * scheduler.lr_lambdas[0](step))


def clip_and_step(accelerator, model, optimizer, scheduler, max_grad_norm: float | None, *,
                  loss: torch.Tensor | None = None) -> torch.Tensor | None:
    """Clip gradients (when asked), step optimizer and schedule, zero gradients. Returns the pre-clip grad norm.

    NaN guard (every recipe steps through here): when the gradient norm (or ``loss``, when given) is not finite,
    the update is skipped (gradients zeroed, the optimizer not stepped; the schedule still steps, so update counts
    and LR stay aligned with the data position), counted (``train/skipped_updates``) and warned about; after
    ``train.max_nonfinite_skips`` consecutive skips the run stops with :class:`NonFiniteError` (nothing saved).
    The decisions cost one device-to-host copy per update (the non-finite flag and the norm together).

    An update whose gradient is exactly zero (or absent) carries no learning signal (every sample of the step
    dropped, every group tied and filtered, every token filtered): it is not applied either (AdamW would still move
    the weights by its moments and weight decay), and is counted (``train/empty_updates``). A run in which no
    update was applied does not end as a success (:meth:`~rlhfkit.train.lifecycle.session.Session.finish`)."""
    params = [p for p in model.parameters() if p.grad is not None]
    clip = max_grad_norm if max_grad_norm is not None and max_grad_norm > 0 else float("inf")
    norm = accelerator.clip_grad_norm_(model.parameters(), clip) if params else torch.zeros(())
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a replicated DTensor
    bad = ~torch.isfinite(torch.as_tensor(norm, dtype=torch.float32))
    if loss is not None:
        bad = bad | ~torch.isfinite(loss.detach().float()).all().to(bad.device)
    if accelerator.num_processes > 1:
        bad = accelerator.reduce(bad.float().to(accelerator.device), "max") > 0
    flag, value = torch.stack([bad.float().reshape(()), torch.as_tensor(norm, dtype=torch.float32).reshape(())
                               .to(bad.device)]).tolist()  # the one host sync: the flag and the norm together
    bad = flag > 0
    guard = guard_of(optimizer)
    guard.updates += 1
    if bad and getattr(accelerator, "scaler", None) is not None:
        bad = False  # fp16: the grad scaler skips this step and lowers its scale
    if bad:
        guard.skipped += 1
        guard.consecutive += 1
        optimizer.zero_grad(set_to_none=True)
        _advance(scheduler)
        lr = optimizer.param_groups[0]["lr"]
        knob = (f"lower optim.max_grad_norm (now {max_grad_norm:g})" if max_grad_norm else "set optim.max_grad_norm")
        if guard.consecutive >= guard.max_consecutive:
            raise NonFiniteError(
                f"update {guard.updates} of the {guard.name}: loss or gradient not finite in {guard.consecutive} "
                f"consecutive updates; stopped, nothing more saved (earlier checkpoints are intact)", where="optim.lr",
                fix=f"lower optim.lr (now {lr:g}) or {knob}; train.max_nonfinite_skips sets the patience")
        if accelerator.is_main_process:
            get_console().print(
                f"[nan] warning: update {guard.updates} of the {guard.name}: loss or gradient norm not finite "
                f"({value:g}); update skipped ({guard.consecutive} in a row, stop at {guard.max_consecutive}). "
                f"If it repeats: lower optim.lr (now {lr:g}) or {knob}", markup=False,
                highlight=False)
        return norm if max_grad_norm is not None and max_grad_norm > 0 else None
    guard.consecutive = 0
    if value == 0.0:  # nothing in the loss: no learning signal, nothing applied
        guard.empty += 1
        optimizer.zero_grad(set_to_none=True)
        _advance(scheduler)
        return norm if max_grad_norm is not None and max_grad_norm > 0 else None
    guard.applied += 1
    restore_optimizer(optimizer)  # its state back on the device when memory.offload_optimizer moved it out
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm if max_grad_norm is not None and max_grad_norm > 0 else None


def _advance(scheduler) -> None:
    """The schedule counts every update, applied or skipped; a skipped one may come before the first
    ``optimizer.step()``, which torch's scheduler reports with a UserWarning meant for a mistaken call order (here it
    is the intended order), so that one warning is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before",
                                category=UserWarning)
        scheduler.step()
