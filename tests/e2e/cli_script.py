"""The ``rlhfkit`` command line as the end-to-end tests launch it (one process, or one per rank under torchrun), with
``launched.slow_updates``: ``RLHFKIT_TEST_SLOW_AFTER=N`` sleeps ``RLHFKIT_TEST_PAUSE`` seconds (default 0.3) after
every optimizer update past update N, so a test can signal the run while it trains; ``RLHFKIT_TEST_PAUSE_RANK=R``:
on rank R only (the others do not wait: a rank that hangs).

    python tests/e2e/cli_script.py sft key=value ...
"""

from __future__ import annotations

import os
import sys

from launched import slow_updates  # offline settings too

if __name__ == "__main__":
    if os.environ.get("RLHFKIT_TEST_PAUSE_RANK", os.environ.get("RANK", "0")) == os.environ.get("RANK", "0"):
        slow_updates(float(os.environ.get("RLHFKIT_TEST_PAUSE", "0.3")))
    from rlhfkit.cli import main

    sys.exit(main(sys.argv[1:]))
