"""Health checks that explain bad training dynamics in one line: what is wrong, the likely cause, the knob.

Each rule is a small function over this step's metrics (TRL names) and the values seen at earlier checks;
``HealthMonitor.check`` runs them all and returns each distinct warning at most once every ``repeat_every``
steps. ``check`` only returns strings; ``report`` also prints them. The knobs named are keys of
``rlhfkit.config`` (``optim.lr``, ``algo.clip_low``, ``critic.lr``, ``reward.normalize``, ...).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.text import Text

from .console import get_console
from .progress import format_number as fmt

DRIFT_FIX = "lower optim.lr or algo.ppo_epochs, or tighten algo.clip_low / algo.clip_high"


def ratio_out_of_range(m: dict[str, float], prev: dict[str, list[float]], mon: HealthMonitor) -> str | None:
    r = m.get("val/ratio")
    if r is not None and not 0.5 <= r <= 2.0:
        return (f"val/ratio={fmt(r)} is outside [0.5, 2.0]: the policy moved too far from the rollout policy; "
                f"{DRIFT_FIX}")
    return None


def approxkl_spike(m: dict[str, float], prev: dict[str, list[float]], mon: HealthMonitor) -> str | None:
    kl, history = m.get("policy/approxkl_avg"), prev["policy/approxkl_avg"]
    if kl is None or len(history) < 3:
        return None
    median = statistics.median(history)
    if kl > 0.01 and kl > 5 * median:
        return (
            f"policy/approxkl_avg={fmt(kl)} jumped above 5x its running median {fmt(median)}: "
            f"one update moved the policy too far from the rollout policy; {DRIFT_FIX}"
        )
    return None


def value_loss_rising(m: dict[str, float], prev: dict[str, list[float]], mon: HealthMonitor) -> str | None:
    loss = m.get("loss/value_avg")
    if loss is None or not math.isfinite(loss):
        return None
    recent = prev["loss/value_avg"][-(mon.window - 1) :] + [loss]
    if len(recent) < mon.window:
        return None
    increasing = all(a < b for a, b in zip(recent, recent[1:]))
    if increasing and recent[-1] > 2 * recent[0]:
        return (
            f"loss/value_avg rose for {mon.window} checks ({fmt(recent[0])} -> {fmt(recent[-1])}): "
            "the critic is diverging; lower critic.lr, set algo.value_clip (e.g. 0.2), or enable reward.normalize"
        )
    return None


def few_eos(m: dict[str, float], prev: dict[str, list[float]], mon: HealthMonitor) -> str | None:
    frac = m.get("val/eos_frac")
    if frac is None and m.get("val/num_eos_tokens") is not None and mon.batch_size:
        frac = m["val/num_eos_tokens"] / mon.batch_size
    if frac is not None and frac < 0.1:
        return (
            f"only {frac:.0%} of responses end with EOS: almost all are cut at the length limit and scored "
            "unfinished; raise generation.max_new_tokens, or set reward.missing_eos_penalty"
        )
    return None


def negative_kl(m: dict[str, float], prev: dict[str, list[float]], mon: HealthMonitor) -> str | None:
    kl = m.get("objective/kl")
    if kl is None:
        return None
    # a negative batch mean is often sampling noise of the k1 estimator on small batches; three negative
    # steps in a row with a negative running mean are not
    recent = (list(prev.get("objective/kl", [])) + [kl])[-mon.window:]
    mean = sum(recent) / len(recent)
    if len(recent) >= 3 and mean < -0.01 and all(v < 0 for v in recent[-3:]):
        return (
            f"objective/kl averaged {fmt(mean)} over the last {len(recent)} steps: negative; "
            "the sampling config differs between rollout and scoring "
            "(temperature/top_p/top_k); use algo.kl.estimator=k3 or check generation.temperature"
        )
    return None


def nonfinite_loss(m: dict[str, float], prev: dict[str, list[float]], mon: HealthMonitor) -> str | None:
    bad = [k for k, v in m.items() if (k == "loss" or k.startswith("loss/")) and not math.isfinite(v)]
    if bad:
        return (f"{', '.join(bad)} not finite: training diverged (step size too large or a bad batch); "
                "lower optim.lr or set optim.max_grad_norm")
    return None


Rule = Callable[[dict[str, float], dict[str, list[float]], "HealthMonitor"], "str | None"]
RULES: dict[str, Rule] = {
    "ratio": ratio_out_of_range,
    "approxkl": approxkl_spike,
    "value_loss": value_loss_rising,
    "eos": few_eos,
    "negative_kl": negative_kl,
    "nonfinite_loss": nonfinite_loss,
}
TRACKED = ("policy/approxkl_avg", "loss/value_avg", "objective/kl")  # metrics whose past values the rules read


class HealthMonitor:
    """Runs every rule in ``RULES`` on each logged step; remembers what it said so it does not repeat itself.

    ``batch_size`` turns ``val/num_eos_tokens`` into a fraction when ``val/eos_frac`` is not logged.
    """

    def __init__(self, window: int = 5, repeat_every: int = 10, batch_size: int | None = None):
        self.window, self.repeat_every, self.batch_size = window, repeat_every, batch_size
        self._prev: dict[str, deque[float]] = {k: deque(maxlen=max(window, 50)) for k in TRACKED}
        self._last_warned: dict[str, int] = {}

    def check(self, metrics: Mapping[str, Any], step: int) -> list[str]:
        """The warnings this step raises (each prefixed with the step), minus ones given < repeat_every ago."""
        m = {k: v for k, v in ((k, _to_float(v)) for k, v in metrics.items()) if v is not None}
        prev = {k: list(q) for k, q in self._prev.items()}
        warnings = []
        for name, rule in RULES.items():
            message = rule(m, prev, self)
            last = self._last_warned.get(name)
            if message and (last is None or step - last >= self.repeat_every):
                self._last_warned[name] = step
                warnings.append(f"step {step}: {message}")
        for key in TRACKED:
            if key in m and math.isfinite(m[key]):
                self._prev[key].append(m[key])
        return warnings

    def report(self, metrics: Mapping[str, Any], step: int, console: Console | None = None) -> list[str]:
        """``check``, then print each warning in yellow; returns the warnings."""
        warnings = self.check(metrics, step)
        for warning in warnings:
            (console or get_console()).print(Text(f"warning: {warning}", style="yellow"), soft_wrap=True)
        return warnings


def _to_float(value: Any) -> float | None:
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
