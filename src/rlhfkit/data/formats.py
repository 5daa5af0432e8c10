"""Record kinds and their normalisation.

Every recipe reads one *kind* of record. Users bring them in several common shapes; :func:`normalize_record`
turns each row into one canonical shape (all messages are lists of ``{"role": str, "content": str}``):

==============  ==========================================================  ==========================================
kind            accepted input rows                                          normalised record
==============  ==========================================================  ==========================================
``sft``         ``{"prompt", "completion"}`` (str or messages),              ``{"messages": [...]}`` / ``{"text": str}``
                ``{"messages": [...]}``, ``{"text": str}``
``preference``  ``{"prompt", "chosen", "rejected"}``; or chosen / rejected   ``{"prompt": [..., user],``
                as full conversations (implicit prompt = common prefix)       ``"chosen": [asst], "rejected": [asst]}``
``prompt``      ``{"prompt"}`` or ``{"messages"}`` (a final assistant turn   ``{"prompt": [..., user], **other_fields}``
                is dropped); other fields are kept for rewards
``unpaired``    ``{"prompt", "completion", "label"}`` (label: bool, 0/1,     ``{"prompt": [...], "completion": [asst],``
                "true"/"false"); or a full conversation + label               ``"label": bool}``
==============  ==========================================================  ==========================================

A plain string prompt becomes one user turn, a plain string completion one assistant turn. ShareGPT rows
(``{"conversations": [{"from": "human", "value": ...}]}``) are accepted wherever ``messages`` is.

Columns with other names are mapped with ``fields`` (canonical name -> column), e.g. ``{"prompt": "question"}``,
which the config spells ``data.fields.prompt=question``.

Preference pairs whose chosen equals rejected are dropped by :func:`drop_tied_pairs` (an error when all are).
An SFT conversation must end with the assistant's turn.

Normalised records are :class:`Record` objects: plain dicts that also remember ``where`` they came from
(``"train.jsonl:12"``), so later stages (tokenisation, length checks) can name the offending line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import DataError
from .images import IMAGE_COLUMNS, is_image_part, part_image, place_images, row_images

KINDS = ("sft", "preference", "prompt", "unpaired")
ROLES = ("system", "user", "assistant", "tool")  # tool: a tool's result in a multi-turn conversation
CANONICAL_FIELDS = ("prompt", "completion", "chosen", "rejected", "messages", "text", "label")

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "system": "system", "model": "assistant", "bot": "assistant", "tool": "tool",
                   "observation": "tool", "function_response": "tool"}
_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f"}

_HINTS = {
    "sft": "each line needs 'prompt' and 'completion', or 'messages', or 'text'",
    "preference": "each line needs 'prompt', 'chosen' and 'rejected' (or 'chosen' and 'rejected' as full "
                  "conversations)",
    "prompt": "each line needs 'prompt' or 'messages'",
    "unpaired": "each line needs 'prompt', 'completion' and 'label' (true/false)",
}


class Record(dict):
    """A normalised record: a plain ``dict`` that also carries ``where`` it came from (for error messages)."""

    def __init__(self, *args: Any, where: str = "record", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.where = where

    def __reduce__(self):
        return (_make_record, (dict(self), self.where))


def _make_record(data: dict, where: str) -> Record:
    return Record(data, where=where)


# ---------------------------------------------------------------------------------------------------------------
# helpers


def _fix(kind: str, fields: dict[str, str] | None) -> str:
    example = {"sft": "data.fields.prompt=question", "preference": "data.fields.chosen=good",
               "prompt": "data.fields.prompt=question", "unpaired": "data.fields.label=is_good"}[kind]
    mapped = ""
    if fields:
        mapped = "; current mapping: " + ", ".join(f"{k}={v}" for k, v in fields.items())
    return f"{_HINTS[kind]} (or map your columns with {example}){mapped}"


def _content_text(content: Any, where: str, field: str, i: int) -> str | list[dict]:
    """Message content as a string (OpenAI-style lists of text parts are joined), or, when it holds image parts, a
    list of ``{"type": "text", "text": ...}`` and ``{"type": "image", "src": <the image given inline or None>}``
    parts (:func:`~.images.place_images` moves the inline images into the record's image list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if all(p.get("type") == "text" for p in content):
            return "".join(str(p.get("text", "")) for p in content)
        if all(p.get("type") == "text" or is_image_part(p) for p in content):
            return [{"type": "image", "src": part_image(p)} if is_image_part(p) else
                    {"type": "text", "text": str(p.get("text", ""))} for p in content]
        bad = next(p.get("type") for p in content if p.get("type") != "text" and not is_image_part(p))
        raise DataError(f"'{field}[{i}].content' has a part of type {bad!r}", where=where,
                        fix="use text and image parts only ({\"type\": \"text\"}, {\"type\": \"image\"})")
    raise DataError(
        f"'{field}[{i}].content' must be a string, got {type(content).__name__}",
        where=where, fix="give every message a text 'content'",
    )


def message_text(content: Any) -> str:
    """The text of a message's content: the string, or its text parts joined (image parts left out)."""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")


def has_image_parts(messages: Any) -> bool:
    """Whether any message of ``messages`` holds an image part."""
    return isinstance(messages, list) and any(isinstance(m, dict) and isinstance(m.get("content"), list) and any(
        isinstance(p, dict) and p.get("type") == "image" for p in m["content"]) for m in messages)


def to_messages(value: Any, default_role: str, *, where: str, field: str) -> list[dict[str, str]]:
    """Turn a string / message / list of messages into a validated list of ``{"role", "content"}`` dicts."""
    if isinstance(value, str):
        if not value:
            raise DataError(f"'{field}' is empty", where=where, fix=f"give a non-empty '{field}'")
        return [{"role": default_role, "content": value}]
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise DataError(
            f"'{field}' must be a string or a list of messages, got {type(value).__name__}",
            where=where, fix=f"give '{field}' as text or as [{{\"role\": ..., \"content\": ...}}, ...]",
        )
    if not value:
        raise DataError(f"'{field}' is an empty list", where=where, fix=f"give at least one message in '{field}'")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise DataError(
                f"'{field}[{i}]' must be a message object, got {type(m).__name__}",
                where=where, fix='write messages as {"role": "user", "content": "..."}',
            )
        if "role" in m:
            role, content = m.get("role"), m.get("content")
        elif "from" in m:  # ShareGPT
            role, content = _SHAREGPT_ROLES.get(str(m.get("from")).lower(), m.get("from")), m.get("value")
        else:
            raise DataError(f"'{field}[{i}]' has no 'role'", where=where,
                            fix='write messages as {"role": "user", "content": "..."}')
        if role not in ROLES:
            raise DataError(f"'{field}[{i}]' has role {role!r}", where=where,
                            fix="use one of the roles 'system', 'user', 'assistant', 'tool'")
        if content is None and m.get("tool_calls"):
            raise DataError(f"'{field}[{i}]' has structured 'tool_calls' and no 'content'", where=where,
                            fix="write the call into 'content' as the model writes it, e.g. "
                                '<tool_call>{"name": ..., "arguments": {...}}</tool_call>')
        if content is None:
            raise DataError(f"'{field}[{i}]' has no 'content'", where=where,
                            fix="give every message a non-empty 'content' string")
        text = _content_text(content, where, field, i)
        if not text or (isinstance(text, list) and not any(p["type"] == "image" or p["text"] for p in text)):
            raise DataError(f"'{field}[{i}].content' is empty", where=where,
                            fix="give every message a non-empty 'content' (or remove that message)")
        out.append({"role": role, "content": text})
    return out


def _require_role(msgs: list[dict], roles: tuple[str, ...], *, where: str, field: str) -> None:
    for i, m in enumerate(msgs):
        if m["role"] not in roles:
            raise DataError(
                f"'{field}[{i}]' has role {m['role']!r}, expected {' or '.join(map(repr, roles))}",
                where=where, fix=f"'{field}' holds only the {'/'.join(roles)} turn(s)",
            )


def _prompt_ends_with_user(msgs: list[dict], *, where: str, field: str) -> None:
    if msgs[-1]["role"] != "user":
        raise DataError(
            f"'{field}' must end with a user turn, it ends with {msgs[-1]['role']!r}",
            where=where, fix=f"end '{field}' with the user message the model should answer",
        )


def _split_at_last_user(msgs: list[dict]) -> tuple[list[dict], list[dict]]:
    """(messages up to and including the last user turn, the assistant turns after it)."""
    last = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=-1)
    return msgs[: last + 1], msgs[last + 1:]


def parse_label(value: Any, *, where: str, field: str = "label") -> bool:
    """``True``/``False``, 0/1, or the strings "true"/"false"/"1"/"0"/"yes"/"no" (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise DataError(f"'{field}' must be true/false (or 1/0), got {value!r}", where=where,
                    fix="mark desirable completions with label=true and undesirable ones with label=false")


def _apply_fields(row: dict, fields: dict[str, str] | None, *, where: str) -> dict:
    """Rename mapped columns (``name -> column``); the source column is removed.

    Names are the canonical fields (prompt, chosen, ...) or any extra field a reward function reads
    (``answer=solution``). A misspelt source column fails here with the row's columns listed.
    """
    if not fields:
        return dict(row)
    out = dict(row)
    for canonical, column in fields.items():
        if not isinstance(column, str) or not canonical.isidentifier():
            raise DataError(
                f"data.fields.{canonical}={column!r} is not a column mapping", where="data.fields",
                fix="map a field name to one of your columns, e.g. data.fields.prompt=question",
            )
        if column == canonical:
            continue
        if column not in row:
            have = ", ".join(map(repr, list(row)[:8]))
            raise DataError(
                f"missing field {column!r} (mapped from data.fields.{canonical}); the row has {have}",
                where=where, fix=f"set data.fields.{canonical} to one of the row's columns",
            )
        out.pop(column)
        out[canonical] = row[column]
    return out


def _get(row: dict, name: str) -> Any:
    value = row.get(name)
    if value is None and name == "messages":
        value = row.get("conversations")
    return value


# ---------------------------------------------------------------------------------------------------------------
# public


def detect_kind(row: dict, fields: dict[str, str] | None = None, where: str = "record") -> str:
    """Guess the record kind of one row (for ``data.format=auto``)."""
    if not isinstance(row, dict):
        raise DataError(f"expected a JSON object, got {type(row).__name__}", where=where,
                        fix="write one object per record")
    r = _apply_fields(row, fields, where=where)
    has = {k for k in CANONICAL_FIELDS if _get(r, k) is not None}
    if {"chosen", "rejected"} <= has:
        return "preference"
    if "label" in has and ({"completion", "messages"} & has):
        return "unpaired"
    if "completion" in has or "text" in has:
        return "sft"
    if "messages" in has:
        msgs = _get(r, "messages")
        if isinstance(msgs, list) and msgs and isinstance(msgs[-1], dict):
            last = msgs[-1].get("role", _SHAREGPT_ROLES.get(str(msgs[-1].get("from")).lower()))
            return "sft" if last == "assistant" else "prompt"
        return "sft"
    if "prompt" in has:
        return "prompt"
    nulls = [k for k in CANONICAL_FIELDS if k in r and r[k] is None]
    if nulls:  # a column the data has, holding None: say that, not that it is missing
        raise _null(nulls[0], where)
    raise DataError(
        f"cannot tell the record kind from the fields {sorted(row)}", where=where,
        fix="use 'prompt'+'completion' or 'messages' (sft), 'prompt'+'chosen'+'rejected' (preference), "
            "'prompt' (prompt), 'prompt'+'completion'+'label' (unpaired), or set data.format",
    )


def normalize_record(row: dict, kind: str, fields: dict[str, str] | None = None, where: str = "record",
                     base: Path | None = None) -> Record:
    """Normalise one input row of ``kind`` (or ``"auto"``) into its canonical :class:`Record` (module docstring).

    ``fields`` maps canonical names to the row's column names. Raises :class:`DataError` naming ``where``, the
    missing / malformed field and the fix. Images (an ``images`` / ``image`` column, image content parts) are placed
    in the conversation's user turns and listed in ``images`` (:func:`~.images.place_images`); ``base``: the
    directory relative image paths are read from (the data file's).
    """
    if not isinstance(row, dict):
        raise DataError(f"expected a JSON object, got {type(row).__name__}", where=where,
                        fix="write one object per record")
    if kind == "auto":
        kind = detect_kind(row, fields, where)
    if kind not in _NORMALIZERS:
        raise DataError(f"unknown data format {kind!r}", where="data.format",
                        fix=f"use one of {', '.join(KINDS)} or auto")
    r = _apply_fields(row, fields, where=where)
    return Record(_with_images(_NORMALIZERS[kind](r, fields, where), r, base, where), where=where)


def _with_images(out: dict, r: dict, base: Path | None, where: str) -> dict:
    """``out`` with its images placed (see :func:`normalize_record`): in ``messages`` (SFT) or ``prompt``; a
    completion with an image part, or a text record with images, is a :class:`DataError`."""
    images = row_images(r, base=base, where=where)
    for side in ("chosen", "rejected", "completion"):
        if has_image_parts(out.get(side)):
            raise DataError(f"'{side}' holds an image part: images in completions are not built", where=where,
                            fix="put the images in the prompt")
    key = "messages" if "messages" in out else "prompt" if "prompt" in out else None
    if key is None:
        if images:
            raise DataError("a 'text' record takes no images", where=where,
                            fix="give the images with 'prompt' + 'completion' or 'messages'")
        return out
    for column in IMAGE_COLUMNS:
        out.pop(column, None)
    if images or has_image_parts(out[key]):
        out[key], out["images"] = place_images(out[key], images, base=base, where=where, field=key)
        if r.get("image") is not None and r.get("images") is None:  # TRL's single-image column, as it was named
            out["image"] = out["images"][0]
    return out


def _null(name: str, where: str) -> DataError:
    return DataError(f"'{name}' is None (null) in this row", where=where,
                     fix=f"give '{name}' a value (or drop the row before training)")


def _missing(kind: str, names: list[str], fields, where: str, row: dict) -> DataError:
    nulls = [n for n in names if n in row and row[n] is None]
    if nulls:  # the column is there and holds None: not missing
        return _null(nulls[0], where)
    have = ", ".join(map(repr, list(row)[:8])) or "no fields"
    return DataError(f"missing field {' / '.join(map(repr, names))} for {kind} data (the row has {have})",
                     where=where, fix=_fix(kind, fields))


def _norm_sft(r: dict, fields, where: str) -> dict:
    if _get(r, "prompt") is not None and _get(r, "completion") is not None:
        prompt = to_messages(r["prompt"], "user", where=where, field="prompt")
        completion = to_messages(r["completion"], "assistant", where=where, field="completion")
        _require_role(completion, ("assistant",), where=where, field="completion")
        _prompt_ends_with_user(prompt, where=where, field="prompt")
        return {"messages": prompt + completion}
    if _get(r, "messages") is not None:
        msgs = to_messages(_get(r, "messages"), "user", where=where, field="messages")
        if not any(m["role"] == "assistant" for m in msgs):
            raise DataError("'messages' has no assistant turn to train on", where=where,
                            fix="add the assistant's reply to the conversation")
        if msgs[-1]["role"] != "assistant":
            raise DataError(f"'messages' ends with a {msgs[-1]['role']!r} turn, not the assistant's reply",
                            where=where, fix="end each SFT conversation with the assistant turn to train on "
                                             "(drop the trailing turns, or use the row as a prompt)")
        return {"messages": msgs}
    if _get(r, "text") is not None:
        text = r["text"]
        if not isinstance(text, str) or not text:
            raise DataError("'text' must be a non-empty string", where=where, fix="give the text to train on")
        return {"text": text}
    if _get(r, "prompt") is not None:
        raise _missing("sft", ["completion"], fields, where, r)
    if _get(r, "completion") is not None:
        raise _missing("sft", ["prompt"], fields, where, r)
    raise _missing("sft", ["prompt", "completion", "messages", "text"], fields, where, r)


def _norm_preference(r: dict, fields, where: str) -> dict:
    missing = [k for k in ("chosen", "rejected") if _get(r, k) is None]
    if missing:
        raise _missing("preference", missing, fields, where, r)
    if _get(r, "prompt") is not None:
        prompt = to_messages(r["prompt"], "user", where=where, field="prompt")
        sides = {}
        for side in ("chosen", "rejected"):
            msgs = to_messages(r[side], "assistant", where=where, field=side)
            if len(msgs) > len(prompt) and msgs[: len(prompt)] == prompt:  # full conversation given anyway
                msgs = msgs[len(prompt):]
            _require_role(msgs, ("assistant",), where=where, field=side)
            sides[side] = msgs
        _prompt_ends_with_user(prompt, where=where, field="prompt")
        return {**_extras(r, ("prompt", "chosen", "rejected")), "prompt": prompt, **sides}
    # implicit prompt: chosen / rejected are whole conversations; the prompt is their common prefix
    if isinstance(r["chosen"], str) or isinstance(r["rejected"], str):
        raise _missing("preference", ["prompt"], fields, where, r)
    chosen = to_messages(r["chosen"], "assistant", where=where, field="chosen")
    rejected = to_messages(r["rejected"], "assistant", where=where, field="rejected")
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    prompt, _ = _split_at_last_user(chosen[:n])
    if not prompt:
        raise DataError("'chosen' and 'rejected' share no user turn to use as the prompt", where=where,
                        fix="give a 'prompt', or start both conversations with the same user message")
    out = {"prompt": prompt, "chosen": chosen[len(prompt):], "rejected": rejected[len(prompt):]}
    for side in ("chosen", "rejected"):
        if not out[side]:
            raise DataError(f"'{side}' has no assistant turn after the prompt", where=where,
                            fix=f"end '{side}' with the assistant's reply")
        _require_role(out[side], ("assistant",), where=where, field=side)
    return {**_extras(r, ("prompt", "chosen", "rejected")), **out}


def _extras(r: dict, used: tuple[str, ...]) -> dict:
    """The row's other fields (a pair's margin, an id, …), kept so recipes can read them."""
    return {k: v for k, v in r.items() if k not in used}


def _norm_prompt(r: dict, fields, where: str) -> dict:
    if _get(r, "prompt") is not None:
        key = "prompt"
    elif _get(r, "messages") is not None:
        key = "messages" if "messages" in r else "conversations"
    else:
        raise _missing("prompt", ["prompt", "messages"], fields, where, r)
    msgs = to_messages(r[key], "user", where=where, field=key)
    if msgs[-1]["role"] == "assistant":  # a full conversation: drop the final assistant answer
        msgs = msgs[:-1]
        if not msgs:
            raise DataError(f"'{key}' has only an assistant turn", where=where,
                            fix="give the user message the model should answer")
    _prompt_ends_with_user(msgs, where=where, field=key)
    extras = {k: v for k, v in r.items() if k != key}
    return {"prompt": msgs, **extras}


def _norm_unpaired(r: dict, fields, where: str) -> dict:
    if _get(r, "label") is None:
        raise _missing("unpaired", ["label"], fields, where, r)
    label = parse_label(r["label"], where=where)
    if _get(r, "prompt") is not None and _get(r, "completion") is not None:
        prompt = to_messages(r["prompt"], "user", where=where, field="prompt")
        completion = to_messages(r["completion"], "assistant", where=where, field="completion")
        if len(completion) > len(prompt) and completion[: len(prompt)] == prompt:
            completion = completion[len(prompt):]
    else:
        key = next((k for k in ("completion", "messages") if _get(r, k) is not None
                    and not isinstance(_get(r, k), str)), None)
        if key is None:
            missing = [k for k in ("prompt", "completion") if _get(r, k) is None]
            raise _missing("unpaired", missing, fields, where, r)
        prompt, completion = _split_at_last_user(to_messages(_get(r, key), "user", where=where, field=key))
        if not prompt or not completion:
            raise DataError(f"'{key}' must be a conversation: user turn(s) then the assistant's reply",
                            where=where, fix="give 'prompt' and 'completion' separately")
    _prompt_ends_with_user(prompt, where=where, field="prompt")
    _require_role(completion, ("assistant",), where=where, field="completion")
    return {"prompt": prompt, "completion": completion, "label": label}


def require_field(records: list[dict], name: str, key: str) -> None:
    """Every record carries the (extra) field ``name`` with a number, as config key ``key`` asks; else a
    :class:`DataError` naming the first record without it."""
    for r in records:
        value = r.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            what = "has no field" if name not in r else f"has a non-number {value!r:.30} in field"
            raise DataError(f"record {what} {name!r} ({key}={name})", where=getattr(r, "where", "record"),
                            fix=f"give every record a number in '{name}', or unset {key}")


def drop_tied_pairs(records: list[dict], source: str = "data") -> tuple[list[dict], list[dict]]:
    """(kept, dropped): preference records whose ``chosen`` equals ``rejected`` (after normalisation) carry no
    preference and are dropped; records of other kinds pass through. Raises :class:`DataError` when every
    pair is tied (naming ``source``)."""
    dropped = [r for r in records if "chosen" in r and "rejected" in r and r["chosen"] == r["rejected"]]
    if not dropped:
        return records, []
    if len(dropped) == len(records):
        raise DataError(f"all {len(records)} preference pairs have chosen equal to rejected (first at "
                        f"{getattr(dropped[0], 'where', 'record')})", where=source,
                        fix="give pairs whose chosen and rejected completions differ")
    ids = {id(r) for r in dropped}
    return [r for r in records if id(r) not in ids], dropped


def unpair_preferences(records: list[dict]) -> list[Record]:
    """Split normalised preference records into unpaired (KTO) ones: chosen -> label True, rejected -> False."""
    out = []
    for r in records:
        where = getattr(r, "where", "record")
        out.append(Record({"prompt": r["prompt"], "completion": r["chosen"], "label": True}, where=where))
        out.append(Record({"prompt": r["prompt"], "completion": r["rejected"], "label": False}, where=where))
    return out


_NORMALIZERS = {"sft": _norm_sft, "preference": _norm_preference, "prompt": _norm_prompt,
                "unpaired": _norm_unpaired}
