"""Collation: padding tokenised examples into batches, and packing SFT examples into full rows.

All collators return ``torch.long`` tensors (``[B, L]`` unless noted) plus, where useful, plain lists of the
fields they do not turn into tensors. ``attention_mask`` is 1 on real tokens, 0 on padding. Examples with images
add ``media``: one :class:`~rlhfkit.data.media.Media` (or None) per row of the batch, in row order.
"""

from __future__ import annotations

import torch

from .tokenize import IGNORE_INDEX


def pad_sequences(
    seqs: list[list[int]], pad_id: int, side: str = "right", pad_to_multiple_of: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad ``seqs`` to one length on ``side``; returns ``(ids [B, L], mask [B, L])``, both ``torch.long``.

    ``L`` is the longest sequence, rounded up to a multiple of ``pad_to_multiple_of`` when given.
    """
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    if not seqs:
        raise ValueError("pad_sequences needs at least one sequence")
    length = max(len(s) for s in seqs)
    if pad_to_multiple_of:
        length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, s in enumerate(seqs):
        if not s:
            continue
        row = torch.as_tensor(s, dtype=torch.long)
        if side == "right":
            ids[i, : len(s)] = row
            mask[i, : len(s)] = 1
        else:
            ids[i, length - len(s):] = row
            mask[i, length - len(s):] = 1
    return ids, mask


def media_rows(examples: list[dict], repeat: int = 1) -> dict:
    """``{"media": [...]}``: each example's images (None without), the list repeated ``repeat`` times (rows of
    both sides of a pair); {} when no example has images."""
    media = [e.get("media") for e in examples]
    return {"media": media * repeat} if any(m is not None for m in media) else {}


class SFTCollator:
    """``{"input_ids", "attention_mask", "labels"}`` (labels padded with -100), right-padded.

    Packed rows (from :func:`pack_sequences`) also carry ``position_ids`` (padded with 0).
    """

    def __init__(self, pad_id: int, pad_to_multiple_of: int | None = None):
        self.pad_id = pad_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = pad_sequences([e["input_ids"] for e in examples], self.pad_id,
                                                  "right", self.pad_to_multiple_of)
        labels, _ = pad_sequences([e["labels"] for e in examples], IGNORE_INDEX, "right", self.pad_to_multiple_of)
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, **media_rows(examples)}
        if all("position_ids" in e for e in examples):
            batch["position_ids"], _ = pad_sequences([e["position_ids"] for e in examples], 0, "right",
                                                     self.pad_to_multiple_of)
        return batch


def pack_sequences(examples: list[dict], max_length: int) -> list[dict]:
    """Greedily pack SFT examples, in order, into rows of at most ``max_length`` tokens.

    Each row holds ``input_ids``, ``labels`` and ``position_ids`` (restarting at 0 for every example), and the
    first token of every example gets label -100 so it is never predicted from the previous example's last token
    (labels are unshifted: ``labels[t]`` is predicted from position ``t - 1``). An example longer than
    ``max_length`` is cut to it.

    Attention is **not** blocked between the examples of a row by a plain causal mask: a later example can attend
    to earlier ones. Only attention implementations that derive per-example masks from ``position_ids`` (e.g.
    flash-attention's variable-length kernels, used by ``transformers`` when ``position_ids`` restart and there
    is no padding mask) keep them apart. Use packing for throughput when that cross-attention is acceptable.
    """
    rows: list[dict] = []
    cur: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": []}
    for e in examples:
        ids, labels = list(e["input_ids"])[:max_length], list(e["labels"])[:max_length]
        if not ids:
            continue
        if cur["input_ids"] and len(cur["input_ids"]) + len(ids) > max_length:
            rows.append(cur)
            cur = {"input_ids": [], "labels": [], "position_ids": []}
        cur["input_ids"] += ids
        cur["labels"] += [IGNORE_INDEX] + labels[1:]
        cur["position_ids"] += list(range(len(ids)))
    if cur["input_ids"]:
        rows.append(cur)
    return rows


def _concat_with_mask(prompts: list[list[int]], completions: list[list[int]]):
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    masks = [[0] * len(p) + [1] * len(c) for p, c in zip(prompts, completions)]
    return seqs, masks


class PreferenceCollator:
    """One concatenated batch for a single forward over both sides of each pair.

    Returns ``input_ids``, ``attention_mask``, ``completion_mask`` — all ``[2B, L]``, rows ``0..B-1`` are
    prompt + chosen and rows ``B..2B-1`` prompt + rejected (right-padded); ``completion_mask`` is 1 on the
    completion tokens — and ``prompt_lengths`` ``[2B]``.
    """

    def __init__(self, pad_id: int, pad_to_multiple_of: int | None = None):
        self.pad_id = pad_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        prompts = [e["prompt_ids"] for e in examples] * 2
        completions = [e["chosen_ids"] for e in examples] + [e["rejected_ids"] for e in examples]
        seqs, masks = _concat_with_mask(prompts, completions)
        input_ids, attention_mask = pad_sequences(seqs, self.pad_id, "right", self.pad_to_multiple_of)
        completion_mask, _ = pad_sequences(masks, 0, "right", self.pad_to_multiple_of)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask,
                "prompt_lengths": torch.tensor([len(p) for p in prompts], dtype=torch.long),
                **media_rows(examples, 2)}


class PromptCollator:
    """Left-padded prompts for generation: ``input_ids``, ``attention_mask`` ``[B, P]``; every other field of
    the examples (the prompt messages, reference answers, …) is passed through as a list."""

    def __init__(self, pad_id: int, pad_to_multiple_of: int | None = None):
        self.pad_id = pad_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples: list[dict]) -> dict:
        input_ids, attention_mask = pad_sequences([e["prompt_ids"] for e in examples], self.pad_id, "left",
                                                  self.pad_to_multiple_of)
        batch: dict = {"input_ids": input_ids, "attention_mask": attention_mask}
        keys = [k for k in dict.fromkeys(k for e in examples for k in e) if k != "prompt_ids"]  # every example's
        for k in keys:
            batch[k] = [e.get(k) for e in examples]
        return batch


class UnpairedCollator:
    """KTO batches: ``input_ids``, ``attention_mask``, ``completion_mask`` ``[B, L]`` of prompt + completion
    (right-padded) and ``label`` ``[B]`` (bool).

    With ``kl_pairs=True`` it also builds the mismatched pairs of KTO's reference-point KL estimate: prompt *i*
    with the completion of example *i - 1* (``kl_input_ids``, ``kl_attention_mask``, ``kl_completion_mask``).
    """

    def __init__(self, pad_id: int, pad_to_multiple_of: int | None = None, kl_pairs: bool = False):
        self.pad_id = pad_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self.kl_pairs = kl_pairs

    def _pad(self, prompts, completions, prefix: str) -> dict[str, torch.Tensor]:
        seqs, masks = _concat_with_mask(prompts, completions)
        input_ids, attention_mask = pad_sequences(seqs, self.pad_id, "right", self.pad_to_multiple_of)
        completion_mask, _ = pad_sequences(masks, 0, "right", self.pad_to_multiple_of)
        return {f"{prefix}input_ids": input_ids, f"{prefix}attention_mask": attention_mask,
                f"{prefix}completion_mask": completion_mask}

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        prompts = [e["prompt_ids"] for e in examples]
        completions = [e["completion_ids"] for e in examples]
        batch = self._pad(prompts, completions, "")
        batch.update(media_rows(examples))  # a mismatched pair keeps its prompt's images too (kl_ rows)
        batch["label"] = torch.tensor([bool(e["label"]) for e in examples], dtype=torch.bool)
        if self.kl_pairs:
            shifted = completions[-1:] + completions[:-1]
            batch.update(self._pad(prompts, shifted, "kl_"))
        return batch
