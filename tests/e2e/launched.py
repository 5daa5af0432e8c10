"""What the scripts that the end-to-end tests launch (``ddp_sft_script.py``, ``fsdp_script.py``) share: offline
settings, and slowing the updates down so a test has time to kill a run between a checkpoint and the end."""

from __future__ import annotations

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def slow_updates(pause: float) -> None:
    """``RLHFKIT_TEST_SLOW_AFTER=N`` (environment): sleep ``pause`` seconds after every optimizer update past update
    N, in every loop that steps through ``clip_and_step`` (the shared loop and the online one)."""
    slow_after = int(os.environ.get("RLHFKIT_TEST_SLOW_AFTER", "0"))
    if not slow_after:
        return
    import rlhfkit.train.online.learner as learner
    import rlhfkit.train.supervised.loop as loop

    real_step, updates = loop.clip_and_step, [0]

    def slow_clip_and_step(*args, **kwargs):
        updates[0] += 1
        if updates[0] > slow_after:
            time.sleep(pause)
        return real_step(*args, **kwargs)

    loop.clip_and_step = learner.clip_and_step = slow_clip_and_step
