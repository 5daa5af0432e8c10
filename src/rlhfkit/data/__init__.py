"""Data: record formats and their normalisation, loaders, chat-template rendering with assistant masks,
tokenisation under a length policy, and collation / packing.

Pipeline: ``load_rows`` (file / directory / cached ``datasets`` name, each row with its location) ->
``normalize_record`` (one canonical shape per kind) -> ``tokenize_dataset`` (ids + masks, counts of
kept / truncated / dropped) -> a collator (tensors).
"""

from .chat import end_of_turn_ids, render_completion_ids, render_conversation, render_prompt_ids
from .collate import (
    PreferenceCollator,
    PromptCollator,
    SFTCollator,
    UnpairedCollator,
    pack_sequences,
    pad_sequences,
)
from .formats import (
    KINDS,
    Record,
    detect_kind,
    drop_tied_pairs,
    normalize_record,
    parse_label,
    require_field,
    to_messages,
    unpair_preferences,
)
from .sources import apply_split, load_dataset_records, load_rows, parse_split
from .tokenize import (
    IGNORE_INDEX,
    LengthPolicy,
    tokenize_dataset,
    tokenize_preference,
    tokenize_prompt_record,
    tokenize_sft,
    tokenize_unpaired,
)

__all__ = [
    "IGNORE_INDEX",
    "KINDS",
    "LengthPolicy",
    "PreferenceCollator",
    "PromptCollator",
    "Record",
    "SFTCollator",
    "UnpairedCollator",
    "apply_split",
    "detect_kind",
    "drop_tied_pairs",
    "end_of_turn_ids",
    "load_dataset_records",
    "load_rows",
    "normalize_record",
    "pack_sequences",
    "pad_sequences",
    "parse_label",
    "parse_split",
    "render_completion_ids",
    "require_field",
    "render_conversation",
    "render_prompt_ids",
    "to_messages",
    "tokenize_dataset",
    "tokenize_preference",
    "tokenize_prompt_record",
    "tokenize_sft",
    "tokenize_unpaired",
    "unpair_preferences",
]
