"""Wall time per phase of a step (``time/<phase>`` in metrics.jsonl), so a user sees where a step goes.

A phase is timed with ``time.perf_counter`` around its block. CUDA runs asynchronously, so on a CUDA device the timer
synchronizes once at the end of each phase (never per token or per micro-batch inside it): the phase's time then
holds the GPU work it queued, and the next phase starts with an idle GPU. Phases do not nest: a phase opened inside
another counts in the outer one (evaluation's rollouts count in ``time/eval``, not in the step's ``time/rollout``).
A phase entered several times in a step (dynamic sampling's draws) adds up.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch


class PhaseTimer:
    """Seconds per named phase since the last :meth:`take`; ``device``: where the phases' work runs (CUDA: one
    synchronize at the end of each phase)."""

    def __init__(self, device: torch.device | str | None = None, clock=time.perf_counter):
        device = torch.device(device) if device is not None else torch.device("cpu")
        self._sync = device if device.type == "cuda" else None
        self._clock = clock
        self._open: str | None = None
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name`` (inside another phase: counted in that one, see the module doc)."""
        if self._open is not None:
            yield
            return
        self._open, t0 = name, self._clock()
        try:
            yield
        finally:
            if self._sync is not None:
                torch.cuda.synchronize(self._sync)
            self.seconds[name] = self.seconds.get(name, 0.0) + self._clock() - t0
            self._open = None

    def take(self) -> dict[str, float]:
        """``{"time/<phase>": seconds}`` since the last call, then reset."""
        out = {f"time/{name}": s for name, s in self.seconds.items()}
        self.seconds = {}
        return out
