"""Where an rlhfkit online step goes, for any checkout (also one older than the per-phase metrics): runs
``vs_trl.run_rlhfkit`` at vs_trl's CPU settings with the step's ``rollout / score / forward_passes / ppo_update``
wrapped in timers (``Producer`` / ``Learner`` methods; ``OnlineTrainer``'s in a checkout older than their split),
and prints the mean of each over the steps after the first, with its share of the step.

    python bench/phase_split.py ROOT RECIPE STEPS [override ...]   # ROOT: the checkout to measure (its src/, bench/)

Run it from ROOT (the reward function is ``bench/vs_trl.py:reward``). Used for the before / after split in
bench/README.md; newer checkouts also log ``time/<phase>`` in metrics.jsonl (vs_trl.py prints those)."""

from __future__ import annotations

import collections
import sys
import tempfile
import time
from pathlib import Path

root, recipe, steps, extra = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4:]
sys.path[:0] = [str(root / "src"), str(root / "bench")]
import vs_trl  # noqa: E402

try:
    from rlhfkit.train.online.learner import Learner  # noqa: E402
    from rlhfkit.train.online.producer import Producer  # noqa: E402
except ImportError:  # a checkout older than the producer / learner split
    from rlhfkit.train.online.synchronous import OnlineTrainer as Learner  # noqa: E402

    Producer = Learner

seconds: dict[str, list[float]] = collections.defaultdict(list)


def timed(cls, name: str) -> None:
    real = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = real(self, *args, **kwargs)
        seconds[name].append(time.perf_counter() - t0)
        return out

    setattr(cls, name, wrapper)


for cls, method in ((Producer, "rollout"), (Producer, "score"), (Learner, "forward_passes"), (Learner, "ppo_update")):
    timed(cls, method)
build = vs_trl.build_config
vs_trl.build_config = lambda r, d, over, **kw: build(r, d, list(over) + extra, **kw)
work = Path(tempfile.mkdtemp())
s = vs_trl.settings("cpu", None)
result = vs_trl.run_rlhfkit(recipe, vs_trl.model_dir("cpu", work), vs_trl.write_data(work, s), s, steps, work / "out")
ends = result["step_ends"]
step = sum(b - a for a, b in list(zip(ends, ends[1:]))[1:]) / max(len(ends) - 2, 1)
split = {k: sum(v[1:]) / max(len(v) - 1, 1) for k, v in seconds.items()}
print(recipe, f"step {step:.3f} s", " ".join(f"{k} {v:.3f} ({100 * v / step:.0f}%)" for k, v in split.items()),
      "mean lengths", result["response_len"])
