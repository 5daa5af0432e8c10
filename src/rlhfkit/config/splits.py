"""The split syntax of ``data.split`` / ``data.eval_split`` (``train``, ``train[:500]``, ``train[10:20]``,
``train[:10%]``): config syntax, checked when a config is built; ``data`` applies it to the rows it loads."""

from __future__ import annotations

import re

from ..errors import DataError

_SPLIT_RE = re.compile(r"^\s*(?P<name>[\w\-.]*)\s*(?:\[\s*(?P<start>-?\d+%?)?\s*(?::\s*(?P<stop>-?\d+%?)?\s*)?\])?\s*$")


def parse_split(split: str | None) -> tuple[str | None, str | None, str | None, bool]:
    """Parse ``name[start:stop]`` into ``(name, start, stop, is_slice)``; bounds are strings (may end in ``%``).

    ``train[5]`` (a single index, no colon) is read as ``train[5:6]``.
    """
    if split is None or split == "":
        return None, None, None, False
    m = _SPLIT_RE.match(split)
    if not m:
        raise DataError(f"cannot parse the split {split!r}", where="data.split",
                        fix="write a split like train, train[:500], train[100:200] or train[:10%]")
    name = m.group("name") or None
    start, stop = m.group("start"), m.group("stop")
    is_slice = "[" in split
    if is_slice and ":" not in split:  # single index
        if start is None or start.endswith("%"):
            raise DataError(f"cannot parse the split {split!r}", where="data.split",
                            fix="write a split like train[:500] or train[10:20]")
        stop = str(int(start) + 1) if int(start) != -1 else None
    return name, start, stop, is_slice
