"""Rewrite every recipe YAML in configs/ from the config classes: same values, the current set of keys, and each
key's help string as its comment (the header comment lines of each file are kept). Run after adding or
documenting a config key: `.venv/bin/python tools/sync_configs.py` (the pipeline YAML is hand-written)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from rlhfkit.config import RECIPES, dump_yaml, load_config

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    changed = 0
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        recipe = data.get("recipe") or path.stem
        if recipe not in RECIPES or RECIPES[recipe].family == "pipeline":
            continue
        header = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            header.append(line)
        text = "\n".join(header) + "\n" + dump_yaml(load_config(recipe, path, []))
        if text != path.read_text():
            path.write_text(text)
            changed += 1
            print(f"rewrote {path.relative_to(ROOT)}")
    print(f"{changed} config file(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
