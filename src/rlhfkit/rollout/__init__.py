"""Rollout engines: built once per run from ``generation``, prompts in, a :class:`Rollout` out (responses cut at the
first EOS / stop string, masks after the end, sampling log-probs). ``ENGINES``: hf (transformers ``generate``, the
reference), static (our compiled static-cache decode loop), continuous (continuous batching over a paged cache
sized by a token budget), auto (the fastest measured for the device and model)."""

from ..data.chat import encode_chat_prompts, render_chat
from .auto import AutoEngine
from .continuous import ContinuousEngine
from .engine import (
    ENGINES,
    Engine,
    build_engine,
    check_engine,
    decode_responses,
    drop_padding_columns,
    eval_mode,
    finalize_responses,
    finish_rollout,
    first_stop_end,
    generate_text,
    left_pad,
    make_engine,
    strip_parallel_wrappers,
)
from .hf import HFEngine
from .lora import merged_lora
from .sampling import SamplingParams, sample_tokens
from .static import StaticEngine
from .types import Rollout

__all__ = [
    "ENGINES",
    "AutoEngine",
    "ContinuousEngine",
    "Engine",
    "HFEngine",
    "Rollout",
    "SamplingParams",
    "StaticEngine",
    "build_engine",
    "check_engine",
    "decode_responses",
    "drop_padding_columns",
    "encode_chat_prompts",
    "eval_mode",
    "finalize_responses",
    "finish_rollout",
    "first_stop_end",
    "generate_text",
    "left_pad",
    "make_engine",
    "merged_lora",
    "render_chat",
    "sample_tokens",
    "strip_parallel_wrappers",
]
