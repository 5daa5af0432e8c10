"""Rewrite every recipe YAML in configs/ from the config classes: same values, the current set of keys, and each
key's help string as its comment (the header comment lines of each file are kept). Run after adding or
documenting a config key: `.venv/bin/python tools/sync_configs.py` (the pipeline YAML is hand-written). It also
rewrites docs/coming-from-trl.md's tables of TRL names from ``config.trl.TRL_NAMES`` (between the ``trl-names``
markers) and its table of TRL 1.16's defaults from ``config.trl_defaults`` (between ``trl-defaults``)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from rlhfkit.config import RECIPES, dump_yaml, load_config
from rlhfkit.config.startup import markdown_table
from rlhfkit.config.trl import markdown_tables

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
    docs = ROOT / "docs" / "coming-from-trl.md"
    for marker, table, what in (("trl-names", markdown_tables(), "tables of TRL names"),
                                ("trl-defaults", markdown_table(), "table of TRL defaults")):
        text = docs.read_text()
        begin, end = f"<!-- {marker}:begin -->\n", f"\n<!-- {marker}:end -->"
        new = text[: text.index(begin) + len(begin)] + table + text[text.index(end):]
        if new != text:
            docs.write_text(new)
            changed += 1
            print(f"rewrote docs/coming-from-trl.md's {what}")
    print(f"{changed} file(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
