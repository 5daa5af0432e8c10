"""The built-in task's reward, failing on rank 1 only (``torchrun`` sets RANK) from its third call with 16 completions
on (a training rollout; the start-up probe sends 4): a user's reward function that breaks on one process
(tests/e2e/test_preemption.py). Run in-process (``reward.workers=0``)."""

from __future__ import annotations

import os

from rlhfkit.tasks.quickstart import reward as quickstart_reward

CALLS = [0]


def reward(prompts, completions, **fields):
    if len(completions) == 16:
        CALLS[0] += 1
        if os.environ.get("RANK") == "1" and CALLS[0] >= 3:
            raise ValueError("rank 1's reward fails on purpose")
    return quickstart_reward(prompts, completions, **fields)
