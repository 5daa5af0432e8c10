"""Rewards that differ by process. ``reward``: the built-in task's reward, failing on rank 1 only (``torchrun`` sets
RANK) from its third call with 16 completions on (a training rollout; the start-up probe sends 4), on every sample: a
user's reward function that breaks on one process (tests/e2e/test_preemption.py; one bad sample alone would only be
dropped and counted). Run in-process (``reward.workers=0``)."""

from __future__ import annotations

import os
import zlib

from rlhfkit.tasks.quickstart import reward as quickstart_reward

CALLS = [0]


def reward(prompts, completions, **fields):
    if len(completions) == 16:
        CALLS[0] += 1
    if os.environ.get("RANK") == "1" and CALLS[0] >= 3:  # from then on broken for every sample, so that the
        raise ValueError("rank 1's reward fails on purpose")  # call made again sample by sample fails too
    return quickstart_reward(prompts, completions, **fields)


def ties_on_rank0(prompts, completions, **fields):
    """In a training rollout every completion scores the same on rank 0 (every group tied: dynamic sampling draws
    up to its cap there) and a score of its text on rank 1 (different texts differ: its first draw fills the batch),
    so the processes draw different numbers of times (tests/e2e/test_fsdp.py)."""
    if len(completions) != 16:
        return quickstart_reward(prompts, completions, **fields)
    if os.environ.get("RANK") == "0":
        return [0.5] * len(completions)
    return [zlib.crc32(c.encode()) % 1000 / 1000 for c in completions]


def hangs_on_rank1(prompts, completions, **fields):
    """On rank 1 (an asynchronous run's producer) the third training call of 16 completions never returns (a reward
    stuck on a dead service): the learner must end at the collective timeout (tests/e2e/test_async_processes.py)."""
    if len(completions) == 16:
        CALLS[0] += 1
        if os.environ.get("RANK") == "1" and CALLS[0] >= 3:
            import time

            time.sleep(600)
    return quickstart_reward(prompts, completions, **fields)
