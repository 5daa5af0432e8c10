"""Generation engines: EOS-aware sampling, responses cut at the first EOS / stop string, masks after the end."""

from ..data.chat import encode_chat_prompts, render_chat
from .engine import (
    ENGINES,
    HFGenerateEngine,
    RolloutEngine,
    decode_responses,
    eval_mode,
    finalize_responses,
    first_stop_end,
    generate_text,
    get_engine,
    left_pad,
    strip_parallel_wrappers,
)
from .sampling import SamplingParams
from .types import Rollout

__all__ = [
    "ENGINES",
    "HFGenerateEngine",
    "Rollout",
    "RolloutEngine",
    "SamplingParams",
    "decode_responses",
    "encode_chat_prompts",
    "eval_mode",
    "finalize_responses",
    "first_stop_end",
    "generate_text",
    "get_engine",
    "left_pad",
    "render_chat",
    "strip_parallel_wrappers",
]
