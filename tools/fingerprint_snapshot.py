"""Write every recipe's default run fingerprint, as the rlhfkit on ``PYTHONPATH`` computes it, to a JSON file.

tests/unit/fingerprints/ keeps such files from earlier versions; tests/unit/test_session.py requires today's
fingerprints to match them (a config key added without its earlier value in ``ADDED_KEYS`` would refuse every older
checkpoint on resume). To keep one more, from a checkout of an earlier commit::

    git worktree add /tmp/old <commit>
    PYTHONPATH=/tmp/old/src .venv/bin/python tools/fingerprint_snapshot.py tests/unit/fingerprints/<date>_<commit>.json
"""

from __future__ import annotations

import json
import sys

from rlhfkit.config import build_config
from rlhfkit.config.recipes import RECIPES
from rlhfkit.train.lifecycle.fingerprint import run_fingerprint

#: runs beyond each recipe's defaults: "recipe override" (a list key's items, whose later settings are ITEM_DEFAULTS)
EXTRA = ("grpo reward.functions=[{fn: exact_match}]",)


def snapshot() -> dict:
    out = {}
    for name in [r for r in RECIPES if r != "pipeline"] + list(EXTRA):
        recipe, *overrides = name.split(" ", 1)
        fingerprint = run_fingerprint(build_config(recipe, {}, ["model.name=x", *overrides]))
        out[name] = {k: v for k, v in fingerprint.items() if not k.startswith(("data.train", "data.eval"))}
    return out


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        json.dump(snapshot(), f, indent=1, sort_keys=True, default=str)
        f.write("\n")
