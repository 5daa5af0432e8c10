"""What a worker process (:mod:`rlhfkit.rewards.workers`) sends back to the trainer: JSON plain data, checked field by
field on arrival. Nothing that crosses from a worker to the trainer is unpickled: a reply is data, never code, so
a worker whose pipe a program reached (at the ``process`` level of the sandbox a program can, see
``docs/sandbox.md``) can at worst make that call fail: without the request's id (in the worker's memory, which that
level also lets a program read) its reply is refused and the worker killed.

A reply is one JSON object, one of::

    {"s": "ok", "n": ID, "v": VALUE}
    {"s": "user_error", "n": ID, "cls": "RewardError" | "RewardFunctionError" | "SandboxError" | "EnvError",
     "message": str, "where": str | null, "fix": str | null}
    {"s": "error", "n": ID, "kind": str, "message": str, "trace": str}

where ``ID`` is the request's id (a random string the trainer sent with it): a reply that answers another request,
or none (written into the pipe by a program that reached it), is refused like any other that breaks the wire, so it
costs the call it arrived in, never the run, and never shifts the replies of later calls.

and a ``VALUE`` is ``null``, a boolean, a number (an integer within 64 bits, a float, ``NaN`` / ``Infinity`` as
Python's :mod:`json` writes them), a string, an array (a Python list), or one of three tagged objects (every JSON
object in a value is a tag, so no user dict can pass for one): ``{"t": [...]}`` a tuple, ``{"d": [[key, value],
...]}`` a dict, ``{"o": [type name, repr]}`` anything else, which arrives as an :class:`Unsent` (its type's name and
its repr, so that a check can say what the code returned). Arrays and tensors (anything with ``tolist``) travel as
their ``tolist()``. Limits: :data:`MAX_REPLY_BYTES` per reply, :data:`MAX_DEPTH` levels of nesting; strings of an
error at most :data:`MAX_TEXT` characters. A reply that breaks any of this is a :class:`ProtocolError`, and so is a
frame that stops halfway (:func:`read_frame` reads it within the call's time, never blocking on a cut one).

Requests (trainer to worker) stay pickled: they are made by the trainer only (the call's arguments, a callable the
user gave to the Python API), and a process that could write into a worker's request pipe could as well write into
the worker's memory (same user), so a second format there would protect nothing.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import struct
import time
from typing import Any

MAX_REPLY_BYTES = 64 << 20
MAX_DEPTH = 64
MAX_TEXT = 20_000
INT64 = 1 << 63
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,99}")


class ProtocolError(Exception):
    """A worker's reply that is not what this module describes (the worker is then killed, never trusted again)."""


class Unsent:
    """A value of a type that does not travel (a set, an object of the user's class): its repr, and, as the name of
    its class, the name of its type, so that ``type(x).__name__`` in a check's message names what the code
    returned. Only a description: it is equal to nothing but itself."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


_UNSENT_TYPES: dict[str, type] = {}


def _unsent_type(name: str) -> type:
    if not _NAME.fullmatch(name) or len(_UNSENT_TYPES) >= 1000:
        return Unsent
    if name not in _UNSENT_TYPES:
        _UNSENT_TYPES[name] = type(name.rpartition(".")[2], (Unsent,), {"__slots__": ()})
    return _UNSENT_TYPES[name]


# ── the worker's side ────────────────────────────────────────────────────────────────────────────────────────────
def pack(value: Any, depth: int = 0) -> Any:
    """``value`` as the JSON-ready ``VALUE`` of the module docstring. Raises ``ValueError`` past :data:`MAX_DEPTH`."""
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, int):
        if -INT64 <= value < INT64:
            return int(value)
        return math.inf if value > 0 else -math.inf  # too large to be a score: as the float it overflows to (even
        # past float's range: 10**400 cannot be converted, so no float() here)
    if depth >= MAX_DEPTH:
        raise ValueError(f"the value is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, list):
        return [pack(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"t": [pack(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"d": [[pack(k, depth + 1), pack(v, depth + 1)] for k, v in value.items()]}
    if callable(getattr(value, "tolist", None)) and not isinstance(value, type):  # numpy arrays / scalars, tensors
        try:
            plain = value.tolist()
        except Exception:  # noqa: BLE001 - a tolist that fails: described below instead
            plain = value
        if plain is not value:
            return pack(plain, depth + 1)
    try:
        text = repr(value)[:200]
    except Exception:  # noqa: BLE001
        text = f"<{type(value).__name__}>"
    return {"o": [type(value).__name__[:100], text]}


def ok(value: Any, n: str | None = None) -> bytes:
    """The reply carrying ``value`` to request ``n``."""
    return _dump({"s": "ok", "n": n, "v": pack(value)})


def user_error(exc: BaseException, n: str | None = None) -> bytes:
    """A :class:`~rlhfkit.errors.RewardError` raised by the code (a built-in rule's own one-line complaint)."""
    return _dump({"s": "user_error", "n": n, "cls": type(exc).__name__,
                  "message": _text(getattr(exc, "message", str(exc))),
                  "where": _text_or_none(getattr(exc, "where", None)), "fix": _text_or_none(getattr(exc, "fix", None))})


def error(kind: str, message: str, trace: str = "", n: str | None = None) -> bytes:
    return _dump({"s": "error", "n": n, "kind": _text(kind)[:200], "message": _text(message),
                  "trace": _text(trace, tail=True)})


def _text(value: Any, tail: bool = False) -> str:
    text = str(value)
    return text[-MAX_TEXT:] if tail else text[:MAX_TEXT]


def _text_or_none(value: Any) -> str | None:
    return None if value is None else _text(value)


def _dump(message: dict) -> bytes:
    data = json.dumps(message, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")
    if len(data) > MAX_REPLY_BYTES:
        raise ValueError(f"the reply is {len(data) >> 20} MiB, more than {MAX_REPLY_BYTES >> 20} MiB")
    return data


# ── the trainer's side ───────────────────────────────────────────────────────────────────────────────────────────
def read_reply(data: bytes, n: str | None = None) -> tuple[str, Any]:
    """``("ok", value)``, ``("user_error", RewardError)`` or ``("error", (kind, message, trace))`` from a reply's
    bytes, every field checked, answering request ``n``; anything else raises :class:`ProtocolError`."""
    try:
        message = json.loads(data.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise ProtocolError("not a JSON object")
    if message.get("n") != n or "n" not in message:
        raise ProtocolError("a reply to no request awaited (its id is not the request's)")
    status = message.get("s")
    if status == "ok":
        _keys(message, {"s", "n", "v"})
        return "ok", unpack(message["v"])
    if status == "user_error":
        _keys(message, {"s", "n", "cls", "message", "where", "fix"})
        cls = _field(message, "cls")
        return "user_error", _user_error_class(cls)(_field(message, "message"), where=_field(message, "where", True),
                                                    fix=_field(message, "fix", True))
    if status == "error":
        _keys(message, {"s", "n", "kind", "message", "trace"})
        return "error", (_field(message, "kind"), _field(message, "message"), _field(message, "trace"))
    raise ProtocolError(f"unknown status {str(status)[:40]!r}")


def _keys(message: dict, expected: set) -> None:
    if set(message) != expected:
        raise ProtocolError(f"fields {sorted(message)[:10]} where {sorted(expected)} belong")


def _field(message: dict, key: str, optional: bool = False) -> str | None:
    value = message[key]
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ProtocolError(f"field {key!r} is not a string of at most {MAX_TEXT} characters")
    return value


def _user_error_class(name: str) -> type:
    from ..errors import EnvError, RewardError
    from .loading import RewardFunctionError
    from .sandbox import SandboxError

    return {c.__name__: c for c in (RewardError, RewardFunctionError, SandboxError, EnvError)}.get(name, RewardError)


def unpack(value: Any, depth: int = 0) -> Any:
    """The Python value of a checked ``VALUE`` (module docstring); :class:`ProtocolError` for anything else."""
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, int):
        if not -INT64 <= value < INT64:
            raise ProtocolError("an integer beyond 64 bits")
        return value
    if depth >= MAX_DEPTH:
        raise ProtocolError(f"nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, list):
        return [unpack(v, depth + 1) for v in value]
    if not isinstance(value, dict) or len(value) != 1:
        raise ProtocolError("an object that is not one tag")
    (tag, body), = value.items()
    if tag == "t" and isinstance(body, list):
        return tuple(unpack(v, depth + 1) for v in body)
    if tag == "d" and isinstance(body, list):
        out = {}
        for pair in body:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ProtocolError("a dict entry that is not a [key, value] pair")
            try:
                out[unpack(pair[0], depth + 1)] = unpack(pair[1], depth + 1)
            except TypeError:  # a key that cannot be one (a list, a tuple holding a list)
                raise ProtocolError("a dict key that cannot be a key") from None
        return out
    if tag == "o" and isinstance(body, list) and len(body) == 2 and all(isinstance(s, str) for s in body) and len(
            body[0]) <= 100 and len(body[1]) <= 200:
        return _unsent_type(body[0])(body[1])
    raise ProtocolError(f"an unknown tag {str(tag)[:20]!r}")


# ── reading a reply's frame ──────────────────────────────────────────────────────────────────────────────────────
def read_frame(fd: int, deadline: float | None, stall_s: float = 2.0) -> bytes:
    """One frame of :class:`multiprocessing.connection.Connection`'s format (a 4-byte big-endian length, -1 then an
    8-byte one for large frames, the bytes) from ``fd``, complete by ``deadline`` and never stalling ``stall_s``
    between two reads (an honest worker writes its frame at once): a forged or cut frame never blocks the trainer
    (:class:`ProtocolError`, as past :data:`MAX_REPLY_BYTES`)."""
    (size,) = struct.unpack("!i", _read_exact(fd, 4, deadline, stall_s))
    if size == -1:
        (size,) = struct.unpack("!Q", _read_exact(fd, 8, deadline, stall_s))
    if not 0 <= size <= MAX_REPLY_BYTES:
        raise ProtocolError(f"a frame of {size} bytes (at most {MAX_REPLY_BYTES})")
    return _read_exact(fd, size, deadline, stall_s)


def _read_exact(fd: int, n: int, deadline: float | None, stall_s: float) -> bytes:
    chunks, got = [], 0
    while got < n:
        left = stall_s if deadline is None else min(stall_s, deadline - time.perf_counter())
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise ProtocolError(f"the reply stopped after {got} of {n} bytes")
        data = os.read(fd, min(n - got, 1 << 20))
        if not data:
            raise EOFError
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)
