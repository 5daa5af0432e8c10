"""Tokenisation of normalised records, with loss masks and an explicit length policy.

Outputs (lists of ints; the collators in :mod:`rlhfkit.data.collate` turn them into tensors):

* sft:        ``{"input_ids", "labels"}`` — ``labels`` are aligned with ``input_ids`` (the model shifts them), -100
              where nothing is trained: everything but the assistant turns when ``completion_only`` (each turn's
              content + end-of-turn token, see :mod:`rlhfkit.data.chat`); text records train every token and get
              EOS appended;
* preference: ``{"prompt_ids", "chosen_ids", "rejected_ids"}``;
* prompt:     ``{"prompt_ids", "prompt", **other_fields}`` (``prompt`` = the messages, for reward functions);
* unpaired:   ``{"prompt_ids", "completion_ids", "label"}``.

A record with images (``images``: :mod:`rlhfkit.data.images`) is tokenised by the model's processor (each image's
tokens in place of its placeholder, :mod:`rlhfkit.data.media`) and its example carries ``media`` (a
:class:`~rlhfkit.data.media.Media`); the image tokens lie in the prompt, never in a label. A prompt with images is
never cut (its image tokens would be cut from their features): over the prompt limit it is dropped (counted), or
an error under ``data.overflow=error``.

Length policy (:class:`LengthPolicy`), never silent — :func:`tokenize_dataset` returns counts the caller logs:

* a prompt longer than the prompt limit is truncated **from the left** (the end of a prompt holds the question),
  dropped, or an error naming the record, by ``on_overflow``; the prompt limit is ``max_prompt_length``, or when
  unset: ``max_length`` for prompt records, ``max_length // 2`` for preference / unpaired records, none for SFT
  (for SFT the "prompt" is everything before the first assistant turn);
* then prompt + completion longer than ``max_length`` is truncated **from the right** (the completion's end),
  dropped, or an error. A record left with no completion token to train on is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DataError
from .chat import render_completion_media, render_conversation_media, render_prompt_media
from .media import image_token_ids, processor_of

IGNORE_INDEX = -100
OVERFLOW_MODES = ("truncate", "drop", "error")

_PROMPT_FIX = "raise data.max_prompt_length or set data.overflow=drop"
_TOTAL_FIX = "raise data.max_length or set data.overflow=truncate (or drop)"


@dataclass(frozen=True)
class LengthPolicy:
    """How long a tokenised record may be, and what happens to longer ones."""

    max_length: int
    """Most tokens in prompt + completion (or in an SFT sequence)."""
    max_prompt_length: int | None = None
    """Most prompt tokens (see the module docstring for the default when unset)."""
    on_overflow: str = "truncate"
    """``truncate`` (prompt from the left, completion from the right), ``drop`` the record, or ``error``."""

    def __post_init__(self):
        if self.on_overflow not in OVERFLOW_MODES:
            raise DataError(f"unknown overflow policy {self.on_overflow!r}", where="data.overflow",
                            fix=f"use one of {', '.join(OVERFLOW_MODES)}")
        if self.max_length < 2:
            raise DataError(f"max_length must be at least 2, got {self.max_length}", where="data.max_length",
                            fix="set data.max_length to the longest sequence to train on, e.g. 1024")
        if self.max_prompt_length is not None and not 0 < self.max_prompt_length <= self.max_length:
            raise DataError(
                f"max_prompt_length must be between 1 and max_length ({self.max_length}), "
                f"got {self.max_prompt_length}", where="data.max_prompt_length",
                fix="set data.max_prompt_length below data.max_length",
            )

    def prompt_limit(self, kind: str) -> int | None:
        """The prompt token limit for records of ``kind`` (``None``: no separate prompt limit)."""
        if self.max_prompt_length is not None:
            return self.max_prompt_length
        return {"prompt": self.max_length, "sft": None}.get(kind, self.max_length // 2)


def _policy(p: LengthPolicy | int) -> LengthPolicy:
    return p if isinstance(p, LengthPolicy) else LengthPolicy(max_length=int(p))


class _Overflow(Exception):
    """Raised inside a tokenizer function to drop the record."""


def _overflow(policy: LengthPolicy, where: str, message: str, fix: str) -> None:
    """Handle an over-long record under a non-truncating policy: raise DataError or drop it."""
    if policy.on_overflow == "error":
        raise DataError(message, where=where, fix=fix)
    if policy.on_overflow == "drop":
        raise _Overflow


def _cut_prompt(ids: list[int], limit: int | None, policy: LengthPolicy, where: str,
                media=None) -> tuple[list[int], bool]:
    if limit is None or len(ids) <= limit:
        return ids, False
    _overflow(policy, where, f"prompt has {len(ids)} tokens, more than the limit of {limit}", _PROMPT_FIX)
    if media is not None:  # a prompt with images is never cut (see the module docstring): dropped
        raise _Overflow
    return ids[len(ids) - limit:], True


def _with_media(example: dict, media) -> dict:
    if media is not None:
        example["media"] = media
    return example


def _fit_completions(prompt_len: int, completions: list[list[int]], policy: LengthPolicy, where: str):
    room = policy.max_length - prompt_len
    longest = max(len(c) for c in completions)
    if longest <= room:
        return completions, False
    _overflow(policy, where, f"prompt + completion has {prompt_len + longest} tokens, more than "
              f"max_length={policy.max_length}", _TOTAL_FIX)
    if room <= 0:
        raise _Overflow
    return [c[:room] for c in completions], True


# ---------------------------------------------------------------------------------------------------------------
# one record each; the underscored versions return (example or None, status)


def _sft(record, tok, policy: LengthPolicy, completion_only: bool | None, where: str):
    if completion_only is None:  # TRL's rule: a prompt / completion row trains its completion, anything else all
        completion_only = bool(getattr(record, "prompt_completion", False))
    if "text" in record:
        ids = list(tok(record["text"], add_special_tokens=True)["input_ids"])
        if tok.eos_token_id is not None and (not ids or ids[-1] != tok.eos_token_id):
            ids.append(int(tok.eos_token_id))
        labels, prompt_len, media = list(ids), 0, None
    else:
        ids, mask, media = render_conversation_media(tok, record["messages"], record.get("images"), where=where)
        if not any(mask):
            raise DataError("no assistant tokens to train on after rendering the chat template", where=where,
                            fix="check that the conversation has an assistant turn")
        skip = image_token_ids(processor_of(tok)) if media is not None else ()  # never a label, in any mode
        labels = [t if (m or not completion_only) and t not in skip else IGNORE_INDEX for t, m in zip(ids, mask)]
        prompt_len = mask.index(1)
    truncated = False
    limit = policy.prompt_limit("sft")
    if limit is not None and prompt_len > limit:
        _overflow(policy, where, f"prompt has {prompt_len} tokens, more than the limit of {limit}", _PROMPT_FIX)
        if media is not None:
            raise _Overflow
        cut = prompt_len - limit
        ids, labels, truncated = ids[cut:], labels[cut:], True
    if len(ids) > policy.max_length:
        _overflow(policy, where, f"sequence has {len(ids)} tokens, more than max_length={policy.max_length}",
                  _TOTAL_FIX)
        ids, labels, truncated = ids[: policy.max_length], labels[: policy.max_length], True
    if all(lab == IGNORE_INDEX for lab in labels[1:]):  # position 0 is never predicted
        raise _Overflow
    return _with_media({"input_ids": ids, "labels": labels}, media), truncated


def _preference(record, tok, policy: LengthPolicy, where: str):
    images = record.get("images")
    prompt_ids, chosen, media = render_completion_media(tok, record["prompt"], record["chosen"], images, where=where)
    _, rejected, _ = render_completion_media(tok, record["prompt"], record["rejected"], images, where=where)
    prompt_ids, t1 = _cut_prompt(prompt_ids, policy.prompt_limit("preference"), policy, where, media)
    (chosen, rejected), t2 = _fit_completions(len(prompt_ids), [chosen, rejected], policy, where)
    return _with_media({"prompt_ids": prompt_ids, "chosen_ids": chosen, "rejected_ids": rejected}, media), t1 or t2


def _unpaired(record, tok, policy: LengthPolicy, where: str):
    prompt_ids, completion, media = render_completion_media(tok, record["prompt"], record["completion"],
                                                            record.get("images"), where=where)
    prompt_ids, t1 = _cut_prompt(prompt_ids, policy.prompt_limit("unpaired"), policy, where, media)
    (completion,), t2 = _fit_completions(len(prompt_ids), [completion], policy, where)
    return _with_media({"prompt_ids": prompt_ids, "completion_ids": completion, "label": bool(record["label"])},
                       media), t1 or t2


def _prompt(record, tok, policy: LengthPolicy, where: str):
    prompt_ids, media = render_prompt_media(tok, record["prompt"], record.get("images"), where=where)
    prompt_ids, truncated = _cut_prompt(prompt_ids, policy.prompt_limit("prompt"), policy, where, media)
    return _with_media({**record, "prompt_ids": prompt_ids}, media), truncated


def _run(fn, record, *args):
    """Call ``fn``; return ``(example, "kept" | "truncated")`` or ``(None, "dropped")``."""
    try:
        example, truncated = fn(record, *args)
    except _Overflow:
        return None, "dropped"
    return example, ("truncated" if truncated else "kept")


def _where(record, default: str = "record") -> str:
    return getattr(record, "where", None) or default


def tokenize_sft(record: dict, tok, max_length: LengthPolicy | int, completion_only: bool | None = True, *,
                 where: str | None = None) -> dict | None:
    """``{"input_ids", "labels"}`` for an SFT record, or ``None`` when the length policy drops it."""
    return _run(_sft, record, tok, _policy(max_length), completion_only, where or _where(record))[0]


def tokenize_preference(record: dict, tok, max_length: LengthPolicy | int, max_prompt_length: int | None = None,
                        *, where: str | None = None) -> dict | None:
    """``{"prompt_ids", "chosen_ids", "rejected_ids"}`` for a preference record (``None`` when dropped)."""
    policy = _policy(max_length)
    if max_prompt_length is not None:
        policy = LengthPolicy(policy.max_length, max_prompt_length, policy.on_overflow)
    return _run(_preference, record, tok, policy, where or _where(record))[0]


def tokenize_unpaired(record: dict, tok, max_length: LengthPolicy | int, max_prompt_length: int | None = None,
                      *, where: str | None = None) -> dict | None:
    """``{"prompt_ids", "completion_ids", "label"}`` for an unpaired (KTO) record (``None`` when dropped)."""
    policy = _policy(max_length)
    if max_prompt_length is not None:
        policy = LengthPolicy(policy.max_length, max_prompt_length, policy.on_overflow)
    return _run(_unpaired, record, tok, policy, where or _where(record))[0]


def tokenize_prompt_record(record: dict, tok, max_length: LengthPolicy | int, *,
                           where: str | None = None) -> dict | None:
    """``{"prompt_ids", "prompt", **other_fields}`` for a prompt record, the prompt ending with the assistant
    header (``None`` when dropped). ``max_length`` here limits the prompt (a :class:`LengthPolicy`'s
    ``max_prompt_length``, else its ``max_length``)."""
    return _run(_prompt, record, tok, _policy(max_length), where or _where(record))[0]


def tokenize_dataset(records: list[dict], kind: str, tok, policy: LengthPolicy, *,
                     completion_only: bool | None = True) -> tuple[list[dict], dict[str, int]]:
    """Tokenise all ``records`` of ``kind``; returns ``(examples, {"kept", "truncated", "dropped"})``.

    ``kept`` counts the examples returned (``truncated`` of them were shortened); ``dropped`` were left out. The
    caller logs the counts. Raises :class:`DataError` when every record is dropped.
    """
    calls = {
        "sft": lambda r, w: _run(_sft, r, tok, policy, completion_only, w),
        "preference": lambda r, w: _run(_preference, r, tok, policy, w),
        "unpaired": lambda r, w: _run(_unpaired, r, tok, policy, w),
        "prompt": lambda r, w: _run(_prompt, r, tok, policy, w),
    }
    if kind not in calls:
        raise DataError(f"unknown record kind {kind!r}", where="data.format", fix=f"use one of {', '.join(calls)}")
    examples, stats = [], {"kept": 0, "truncated": 0, "dropped": 0}
    for i, record in enumerate(records):
        example, status = calls[kind](record, _where(record, f"record {i}"))
        if example is None:
            stats["dropped"] += 1
            continue
        examples.append(example)
        stats["kept"] += 1
        if status == "truncated":
            stats["truncated"] += 1
    if not examples:
        raise DataError(
            f"all {len(records)} records were dropped by the length limits (max_length={policy.max_length}, "
            f"max_prompt_length={policy.max_prompt_length}, overflow={policy.on_overflow})",
            where="data", fix="raise data.max_length / data.max_prompt_length, or set data.overflow=truncate",
        )
    return examples, stats
