"""Config keys and dataclass field names: the same words, except a key that is a Python keyword (``algo.async``),
whose field carries a trailing underscore (``async_``). A leaf module: every part of ``config`` may import it."""

from __future__ import annotations

import keyword


def key_of(name: str) -> str:
    """The config key of a field: its name, except that a field named after a Python keyword carries a trailing
    underscore that its key does not (the field ``async_`` is the key ``algo.async``)."""
    return name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name


def field_of(key: str) -> str:
    """The field name of config key ``key`` (the inverse of :func:`key_of`)."""
    return f"{key}_" if keyword.iskeyword(key) else key
