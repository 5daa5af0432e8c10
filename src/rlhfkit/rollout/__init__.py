"""Generation engines: EOS-aware sampling, responses cut at the first EOS / stop string, masks after the end."""

from .engine import (
    ENGINES,
    HFGenerateEngine,
    RolloutEngine,
    chat_ids,
    decode_responses,
    encode_chat_prompts,
    eval_mode,
    finalize_responses,
    first_stop_end,
    generate_text,
    get_engine,
    left_pad,
    render_chat,
    strip_parallel_wrappers,
)
from .types import Rollout

__all__ = [
    "ENGINES",
    "HFGenerateEngine",
    "Rollout",
    "RolloutEngine",
    "chat_ids",
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
