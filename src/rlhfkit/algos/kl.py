"""KL(pi || ref) estimators from samples of pi, and the KL-coefficient controllers.

With ``log_ratio = log pi(y_t) - log ref(y_t)`` at tokens sampled from pi (Schulman 2020, "Approximating KL
divergence", http://joschu.net/blog/kl-approx.html, with r = ref / pi = exp(-log_ratio)):

- ``k1 = log_ratio``                         unbiased, high variance, can be negative
- ``k2 = 0.5 * log_ratio ** 2``              biased, low variance, >= 0
- ``k3 = exp(-log_ratio) - 1 + log_ratio``   unbiased, low variance, >= 0 (GRPO's KL term)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from rlhfkit.algos.masked import zero_outside


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """k1 = log(pi / ref) (Schulman 2020)."""
    return log_ratio


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """k2 = (log r)^2 / 2 (Schulman 2020)."""
    return 0.5 * log_ratio.square()


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 = (r - 1) - log r with r = ref / pi (Schulman 2020)."""
    return torch.expm1(-log_ratio) + log_ratio


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: str = "k1",
    mask: torch.Tensor | None = None,
    log_ratio_clip: float | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from tokens sampled from pi (Schulman 2020, estimators k1 / k2 / k3).

    logprobs, ref_logprobs: [B, T] -> [B, T]. ``mask`` [B, T] (optional): positions where it is 0 are returned as 0.
    ``log_ratio_clip`` (optional): clamp log pi - log ref to [-c, c] first (k3 = e^-x - 1 + x is inf in float32
    for x < -88; OpenRLHF uses c = 10, the online loop ``algo.kl.log_ratio_clip``); the clamp has no gradient
    outside [-c, c]. Masked positions are set to 0 *before* the estimator, so NaN / inf there reaches neither the
    value nor the gradient. No reduction: sum or average with :mod:`rlhfkit.algos.masked` as the caller needs.
    """
    try:
        fn = KL_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(
            f"unknown KL estimator {estimator!r}; choose one of {sorted(KL_ESTIMATORS)}"
        ) from None
    log_ratio = logprobs - ref_logprobs
    if mask is not None:
        log_ratio = zero_outside(log_ratio, mask)  # before the nonlinearity: padding gives exactly 0 KL and 0 gradient
    if log_ratio_clip is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    kl = fn(log_ratio)
    return kl if mask is None else zero_outside(kl, mask)


def _as_float(x) -> float:
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)


class AdaptiveKLController:
    """KL coefficient steered towards a target KL (Ziegler et al. 2019, eq. 2).

    e = clip(KL / target - 1, -0.2, 0.2);  beta <- beta * (1 + e * min(n_steps / horizon, 1)).

    Departure from the paper: n_steps / horizon is capped at 1, so one update moves beta by at most 20% and beta
    stays > 0 (uncapped, a batch of more than 5 x horizon samples at low KL made it negative).
    """

    def __init__(self, init_coef: float, target: float, horizon: float):
        if target <= 0 or horizon <= 0:
            raise ValueError(f"target and horizon must be > 0, got target={target}, horizon={horizon}")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        """Move the coefficient after a batch whose mean KL was ``current_kl`` over ``n_steps`` samples; returns it."""
        kl = _as_float(current_kl)
        if not math.isfinite(kl):  # a NaN / inf KL carries no direction; keep beta rather than poison it
            return self.value
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value = self.value * (1.0 + error * min(n_steps / self.horizon, 1.0))
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
        self.target = float(state.get("target", self.target))
        self.horizon = float(state.get("horizon", self.horizon))


class FixedKLController:
    """Constant KL coefficient with the :class:`AdaptiveKLController` interface (Ziegler et al. 2019, fixed beta)."""

    def __init__(self, coef: float):
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        """No-op; returns the coefficient."""
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
