"""Padding, collators and packing."""

import torch

from rlhfkit.data import (
    IGNORE_INDEX,
    PreferenceCollator,
    PromptCollator,
    SFTCollator,
    UnpairedCollator,
    pack_sequences,
    pad_sequences,
)


def test_pad_sequences_right_left_multiple():
    ids, mask = pad_sequences([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    ids, mask = pad_sequences([[1, 2, 3], [4]], pad_id=9, side="left", pad_to_multiple_of=4)
    assert ids.tolist() == [[9, 1, 2, 3], [9, 9, 9, 4]] and mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    assert ids.dtype == torch.long and mask.dtype == torch.long


def test_sft_collator():
    batch = SFTCollator(pad_id=0)([
        {"input_ids": [5, 6, 7], "labels": [IGNORE_INDEX, 6, 7]},
        {"input_ids": [8], "labels": [8]},
    ])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 6, 7], [8, IGNORE_INDEX, IGNORE_INDEX]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert "position_ids" not in batch


def test_packing_position_ids_and_boundary_labels():
    examples = [
        {"input_ids": [1, 2, 3], "labels": [1, 2, 3]},
        {"input_ids": [4, 5], "labels": [IGNORE_INDEX, 5]},
        {"input_ids": [6, 7, 8, 9], "labels": [6, 7, 8, 9]},
        {"input_ids": [10], "labels": [10]},
    ]
    rows = pack_sequences(examples, max_length=6)
    assert [r["input_ids"] for r in rows] == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    assert [r["position_ids"] for r in rows] == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]
    # the first token of each packed example is never a target (it would be predicted from the previous one)
    assert rows[0]["labels"] == [IGNORE_INDEX, 2, 3, IGNORE_INDEX, 5]
    assert rows[1]["labels"] == [IGNORE_INDEX, 7, 8, 9, IGNORE_INDEX]
    batch = SFTCollator(pad_id=0)(rows)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]


def test_preference_collator_shapes_and_completion_mask():
    examples = [
        {"prompt_ids": [1, 2], "chosen_ids": [3, 4, 5], "rejected_ids": [6]},
        {"prompt_ids": [7], "chosen_ids": [8], "rejected_ids": [9, 10]},
    ]
    b = PreferenceCollator(pad_id=0)(examples)
    assert b["input_ids"].shape == (4, 5) == b["completion_mask"].shape == b["attention_mask"].shape
    assert b["input_ids"].tolist() == [[1, 2, 3, 4, 5], [7, 8, 0, 0, 0], [1, 2, 6, 0, 0], [7, 9, 10, 0, 0]]
    assert b["completion_mask"].tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 1, 1, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]]
    assert b["prompt_lengths"].tolist() == [2, 1, 2, 1]


def test_prompt_collator_left_pads_and_passes_fields():
    b = PromptCollator(pad_id=0)([{"prompt_ids": [1, 2, 3], "answer": "a"}, {"prompt_ids": [4], "answer": "b"}])
    assert b["input_ids"].tolist() == [[1, 2, 3], [0, 0, 4]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert b["answer"] == ["a", "b"]


def test_unpaired_collator_with_kl_pairs():
    examples = [
        {"prompt_ids": [1], "completion_ids": [2, 3], "label": True},
        {"prompt_ids": [4, 5], "completion_ids": [6], "label": False},
    ]
    b = UnpairedCollator(pad_id=0, kl_pairs=True)(examples)
    assert b["input_ids"].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert b["completion_mask"].tolist() == [[0, 1, 1], [0, 0, 1]]
    assert b["label"].tolist() == [True, False]
    assert b["kl_input_ids"].tolist() == [[1, 6, 0, 0], [4, 5, 2, 3]]
    assert b["kl_completion_mask"].tolist() == [[0, 1, 0, 0], [0, 0, 1, 1]]
