"""What every rollout engine shares: its lifecycle, the finishing of a rollout, the registry.

An engine is built once per run from the ``generation`` config section (:func:`build_engine`), holding the
tokenizer, the EOS ids, the pad id, the stop strings and the micro-batch size. Each call is
``engine.generate(model, prompt_ids, params, seed) -> Rollout`` with one :class:`~.sampling.SamplingParams`.

The model is given per call, not held: it is the trainer's live object, whatever wraps it at that moment (DDP,
FSDP2 units gathered by ``strategy.gathered(model)``, DeepSpeed ZeRO-3's ``GatheredParameters``, a PEFT adapter
merged for the call), and its weights are read in place at the call (no copy, no weight sync). An engine keeps
only what does not depend on the weights' values between calls (a compiled step, a KV cache buffer), and frees the
memory of it on :meth:`Engine.release`.

:meth:`Engine.generate` does the common steps: checks, micro-batches of left-padded prompts, eval mode, no grad,
LoRA merged for the call (:func:`~.lora.merged_lora`), per-micro-batch seeds, and :func:`finish_rollout` (cut at the
first EOS or stop string, right-pad, masks, lengths, sampled log-probs 0 after the end), then the columns that are
padding in every row are dropped. An engine writes only ``_decode``: raw token ids and their sampling log-probs.
Masks are derived from the generated ids themselves; the pad id is never used to find the end (pad may equal EOS).
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
from collections.abc import Callable, Iterator, Sequence

import torch

from ..data.chat import encode_chat_prompts, stop_token_ids
from ..errors import ConfigError, say
from ..models.vision import image_token_ids
from .lora import merged_lora
from .sampling import SamplingParams
from .types import Rollout

# ───────────────────────────────────────────── small helpers ─────────────────────────────────────────────


def strip_parallel_wrappers(model):
    """Strip DDP / DataParallel / FSDP(1) ``.module`` wrappers, KEEPING PEFT wrappers (so LoRA stays active)."""
    for _ in range(8):
        inner = getattr(model, "module", None)
        if isinstance(inner, torch.nn.Module) and type(model).__name__ in _PARALLEL_WRAPPERS:
            model = inner
        else:
            break
    return model


_PARALLEL_WRAPPERS = {"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"}


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Put every submodule in eval mode, then restore each one's own previous ``training`` flag."""
    states = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, was_training in states:
            m.training = was_training


@contextlib.contextmanager
def seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed torch's RNG for the block (``seed=None``: no-op) and restore the global RNG state afterwards."""
    if seed is None:
        yield
        return
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()]
        if device.type == "cuda"
        else []
    )
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def model_device(model) -> torch.device:
    """The device of the model's first parameter (CPU for a parameter-less model)."""
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def left_pad(rows: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad lists of ids -> ``(ids [B, P], mask [B, P])`` (long tensors)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, width - len(r) :] = torch.as_tensor(list(r), dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return ids, mask


def decode_responses(tokenizer, rollout: Rollout, *, skip_special_tokens: bool = True) -> list[str]:
    """Response texts of a rollout (masked tokens only; EOS dropped with ``skip_special_tokens=True``)."""
    ids = rollout.response_ids.cpu().tolist()
    lengths = rollout.lengths.cpu().tolist()
    return tokenizer.batch_decode(
        [r[:n] for r, n in zip(ids, lengths)], skip_special_tokens=skip_special_tokens
    )



# ───────────────────────────────────────────── end of responses ─────────────────────────────────────────────


def has_stop(tokenizer, ids: Sequence[int], stop_strings: Sequence[str]) -> bool:
    """The decoded ``ids`` hold one of ``stop_strings``."""
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    return any(s in text for s in stop_strings)


def stop_window(stop_strings: Sequence[str], new_tokens: int) -> int:
    """How many trailing tokens to decode to see a stop string completed by the last ``new_tokens`` tokens (a
    string's tokens may start before them; + 8 for tokens that decode to nothing alone)."""
    return new_tokens + max(len(s) for s in stop_strings) + 8


def first_stop_end(tokenizer, ids: Sequence[int], stop_strings: Sequence[str]) -> int | None:
    """Number of leading tokens of ``ids`` up to and including the token that completes the first stop string,
    or ``None`` when no stop string occurs (binary search over decoded prefixes: O(log n) decodes)."""

    def hit(k: int) -> bool:
        return has_stop(tokenizer, ids[:k], stop_strings)

    if not ids or not hit(len(ids)):
        return None
    lo, hi = 1, len(ids)  # hit(hi) is True; find the smallest such k
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def finalize_responses(
    response_ids: torch.Tensor,
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    stop_strings: Sequence[str] | None = None,
    tokenizer=None,
    cut_ids: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cut raw generated ids [B, R] at each row's end -> ``(ids, mask, ended, lengths)``.

    A row ends at its first EOS (kept, mask 1) or at the token completing a stop string before it (kept, mask 1);
    positions after the end get the pad id and mask 0. A row with neither is cut by the length limit (ended False).
    ``cut_ids``: tokens a response may not hold (a VLM's image tokens: a forward would take them for an image's):
    a row that sampled one is cut before it, as if cut by the length limit (ended False).
    """
    B, R = response_ids.shape
    device = response_ids.device
    eos = torch.as_tensor(list(eos_token_ids), dtype=response_ids.dtype, device=device)
    is_eos = torch.isin(response_ids, eos)
    has_eos = is_eos.any(-1)
    first_eos = is_eos.to(torch.long).argmax(-1)  # 0 when no EOS, masked by has_eos below
    length = torch.where(has_eos, first_eos + 1, torch.full_like(first_eos, R))
    ended = has_eos.clone()
    if stop_strings:
        if tokenizer is None:
            raise ValueError("stop_strings need the tokenizer (to decode responses)")
        before_eos = torch.where(has_eos, first_eos, torch.full_like(first_eos, R)).tolist()
        rows = response_ids.tolist()
        for b in range(B):
            cut = first_stop_end(tokenizer, rows[b][: before_eos[b]], stop_strings)
            if cut is not None:
                length[b] = cut
                ended[b] = True
    if cut_ids:
        bad = torch.isin(response_ids, torch.as_tensor(list(cut_ids), dtype=response_ids.dtype, device=device))
        first_bad = torch.where(bad.any(-1), bad.to(torch.long).argmax(-1), torch.full_like(length, R))
        ended = ended & (length <= first_bad)
        length = torch.minimum(length, first_bad)
    mask = torch.arange(R, device=device).unsqueeze(0) < length.unsqueeze(-1)
    ids = response_ids.masked_fill(~mask, pad_token_id)
    return ids, mask.to(torch.long), ended, length.to(torch.long)


def finish_rollout(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, raw_ids: torch.Tensor,
                   raw_logprobs: torch.Tensor, *, eos_token_ids: Sequence[int], pad_token_id: int,
                   stop_strings: Sequence[str] = (), tokenizer=None, cut_ids: Sequence[int] = ()) -> Rollout:
    """The steps every engine shares, on one micro-batch: raw ids [B, R] cut at each row's first EOS / stop string
    (:func:`finalize_responses`; before a token of ``cut_ids``), right-padded with the pad id, masks and lengths,
    and the sampling log-probs [B, R] set to 0 after the end."""
    r_ids, r_mask, ended, lengths = finalize_responses(raw_ids, eos_token_ids=eos_token_ids,
                                                       pad_token_id=pad_token_id, stop_strings=stop_strings,
                                                       tokenizer=tokenizer, cut_ids=cut_ids)
    logprobs = torch.where(r_mask.bool(), raw_logprobs.float(), torch.zeros((), device=raw_logprobs.device))
    return Rollout(prompt_ids, prompt_mask, r_ids, r_mask, ended, lengths, logprobs=logprobs)


def drop_padding_columns(rollout: Rollout) -> Rollout:
    """The rollout without the trailing response columns that are padding in every row (at least one kept)."""
    width = max(int(rollout.lengths.max()), 1)
    if width < rollout.response_ids.shape[1]:
        rollout.response_ids = rollout.response_ids[:, :width].contiguous()
        rollout.response_mask = rollout.response_mask[:, :width].contiguous()
        if rollout.logprobs is not None:
            rollout.logprobs = rollout.logprobs[:, :width].contiguous()
    return rollout


# ───────────────────────────────────────────── the engine ─────────────────────────────────────────────


class Engine:
    """Base of every engine: built once per run, ``generate`` per batch. A subclass sets ``name`` and writes
    :meth:`_decode`; its own settings (``generation.engine_kwargs``) are its constructor's keyword arguments."""

    name = "base"

    def __init__(self, tokenizer=None, *, eos_token_ids: Sequence[int], pad_token_id: int,
                 stop_strings: Sequence[str] = (), batch_size: int | None = None):
        if not eos_token_ids:
            raise ValueError("eos_token_ids is empty: responses could never end")
        self.tokenizer = tokenizer
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.pad_token_id = int(pad_token_id)
        self.stop_strings = tuple(s for s in stop_strings if s)
        if self.stop_strings and tokenizer is None:
            raise ValueError("stop_strings need the tokenizer (to decode responses)")
        self.batch_size = batch_size
        self.compile_seconds = 0.0  # spent compiling since the last take_stats()
        self._said: set[str] = set()

    def say_once(self, line: str) -> None:
        """Print ``line`` (main process, stderr) the first time this engine says it."""
        if line not in self._said:
            self._said.add(line)
            say(line)

    def release(self) -> None:
        """Free what the engine keeps between calls (KV cache buffers, CUDA graphs and their memory pools) so the
        trainer's forwards and update can use that memory; the next :meth:`generate` allocates it again (and
        re-captures a CUDA graph; a compiled step is not compiled again). The online loop calls it after each
        rollout (``memory.release_engine_cache``). An engine that keeps nothing has nothing to free."""

    def take_stats(self) -> dict[str, float]:
        """Metrics of the engine since the last call (``time/rollout_compile``: seconds spent compiling decode
        steps, 0 for engines that do not compile), then reset."""
        out = {"time/rollout_compile": self.compile_seconds}
        self.compile_seconds = 0.0
        return out

    def generate(self, model, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                 seed: int | None = None, on_rows: Callable[[int], None] | None = None,
                 media: Sequence | None = None,
                 on_progress: Callable[[int, int, int | None], None] | None = None) -> Rollout:
        """One response per prompt (prompts: unpadded id lists) as a cut, masked :class:`Rollout`.

        ``seed`` makes sampling reproducible without touching the global RNG (None: a seed drawn from it); greedy
        decoding needs none. ``on_rows(n)`` is called after each micro-batch with its number of rows (a progress
        display counts them); ``on_progress(t, max_new_tokens, ended)`` during a micro-batch's decoding, at the
        engine's own host checks (no extra device sync): the tokens drawn so far and the rows already ended (None
        when the engine does not know without a sync). The model is put in eval mode and each submodule's training
        flag restored after; a PEFT LoRA adapter is merged into the weights for the call and the weights restored
        bit for bit after. ``media``: a vision-language model's prompt images, one
        :class:`~rlhfkit.data.media.Media` (or None) per prompt, handed to ``_decode`` as its ``media`` keyword (an
        engine without it refuses images); a response is cut before an image token it samples
        (:func:`finalize_responses`).
        """
        self.on_progress = on_progress
        if not prompt_ids:
            raise ValueError("generate() got no prompts")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("generate() got an empty prompt; every prompt needs at least one token")
        outer = strip_parallel_wrappers(model)
        device = model_device(outer)
        if media is not None and not any(m is not None for m in media):
            media = None
        if media is not None and "media" not in inspect.signature(self._decode).parameters:
            raise ConfigError(f"rollout engine {self.name!r} takes no images", where="generation.engine",
                              fix="use generation.engine=auto, static, continuous or hf with a vision-language model")
        cut = image_token_ids(outer)
        if seed is None and not params.greedy:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        seeds = torch.Generator().manual_seed(seed or 0)
        step = self.batch_size or len(prompt_ids)
        parts: list[Rollout] = []
        with eval_mode(outer), torch.no_grad(), merged_lora(outer):
            for start in range(0, len(prompt_ids), step):
                ids, mask = left_pad(prompt_ids[start: start + step], self.pad_token_id)
                ids, mask = ids.to(device), mask.to(device)
                chunk_seed = int(torch.randint(0, 2**62, (1,), generator=seeds).item())
                extra = {} if media is None else {"media": list(media[start: start + step])}
                raw_ids, raw_lp = self._decode(outer, ids, mask, params, chunk_seed, **extra)
                parts.append(finish_rollout(ids, mask, raw_ids, raw_lp, eos_token_ids=self.eos_token_ids,
                                            pad_token_id=self.pad_token_id, stop_strings=self.stop_strings,
                                            tokenizer=self.tokenizer, cut_ids=cut))
                if on_rows is not None:
                    on_rows(len(ids))
        self.on_progress = None
        return drop_padding_columns(Rollout.concat(parts, self.pad_token_id))

    on_progress: Callable[[int, int, int | None], None] | None = None  # generate()'s, while it runs

    def tell_progress(self, t: int, max_new: int, ended: int | None) -> None:
        """An engine's decode loop reports where it is (``generate``'s ``on_progress``), at its own host checks."""
        if self.on_progress is not None:
            self.on_progress(t, max_new, ended)

    def _decode(self, model, ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams,
                seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw response ids [B, R'] (R' <= max_new_tokens; anything after a row's end is ignored) and the log-prob
        [B, R'] of each under the distribution it was drawn from, for left-padded ``ids`` / ``mask`` [B, P] on the
        model's device. The model is the bare module (parallel wrappers stripped), in eval mode, under no_grad."""
        raise NotImplementedError(f"{type(self).__name__} must implement _decode")


# ───────────────────────────────────────────── registry ─────────────────────────────────────────────

ENGINES: dict[str, type[Engine]] = {}  # filled by rollout/__init__.py: hf, static, continuous, auto


def register(cls: type[Engine]) -> type[Engine]:
    """Class decorator: ``ENGINES[cls.name] = cls``."""
    ENGINES[cls.name] = cls
    return cls


def check_engine(name: str, engine_kwargs: dict | None = None, cache_tokens: int | None = None) -> None:
    """ConfigError for an unknown engine name, a setting its constructor does not take, or a value it refuses
    (the engine is built once with placeholder EOS / pad ids to find out; that touches no model); a cache budget
    (``generation.cache_tokens``) for an engine without a token-budget cache."""
    import inspect

    if name not in ENGINES:
        close = difflib.get_close_matches(name, list(ENGINES), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"unknown rollout engine {name!r}", where="generation.engine",
                          fix=f"{hint}choose one of {sorted(ENGINES)}")
    known = [p for p in inspect.signature(ENGINES[name].__init__).parameters
             if p not in ("self", "tokenizer", "eos_token_ids", "pad_token_id", "stop_strings", "batch_size")]
    for key in engine_kwargs or {}:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            fix = (f"{hint}settings of {name!r}: {', '.join(known)}" if known else
                   f"{name!r} takes no settings: choose the engine itself (generation.engine=static or hf) to set them")
            raise ConfigError(f"engine {name!r} has no setting {key!r}", where=f"generation.engine_kwargs.{key}",
                              fix=fix)
    if cache_tokens is not None:
        if "cache_tokens" not in known:
            raise ConfigError(f"engine {name!r} has no token-budget cache", where="generation.cache_tokens",
                              fix="set generation.engine=continuous, or generation.cache_tokens=null")
        engine_kwargs = {**(engine_kwargs or {}), "cache_tokens": cache_tokens}
    try:
        ENGINES[name](None, eos_token_ids=[0], pad_token_id=0, **(engine_kwargs or {}))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"engine {name!r}: {err}", where="generation.engine_kwargs",
                          fix="see `rlhfkit config show` for the engine's settings") from None


def make_engine(name: str, tokenizer, model=None, *, stop_strings: Sequence[str] = (), batch_size: int | None = None,
                engine_kwargs: dict | None = None, eos_token_ids: Sequence[int] | None = None,
                cache_tokens: int | None = None) -> Engine:
    """An engine by name (``auto``, ``hf``, ``static``, ``continuous``; its settings ``engine_kwargs`` checked first;
    ``cache_tokens``: the continuous engine's budget). EOS ids: ``eos_token_ids``, else
    :func:`~rlhfkit.data.chat.stop_token_ids` of the tokenizer and the model's generation config (the model is only
    read for that, not held); pad: the tokenizer's, else the first EOS id."""
    kwargs = dict(engine_kwargs or {})
    check_engine(name, kwargs, cache_tokens)
    if cache_tokens is not None:
        kwargs["cache_tokens"] = cache_tokens
    if eos_token_ids is None:
        gen_cfg = getattr(strip_parallel_wrappers(model), "generation_config", None) if model is not None else None
        eos_token_ids = stop_token_ids(tokenizer, gen_cfg)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_token_ids[0]
    return ENGINES[name](tokenizer, eos_token_ids=eos_token_ids, pad_token_id=pad, stop_strings=tuple(stop_strings),
                         batch_size=batch_size, **kwargs)


def build_engine(generation, tokenizer, model=None, *, eos_token_ids: Sequence[int] | None = None) -> Engine:
    """The run's engine from a ``generation`` config section (``engine``, ``engine_kwargs``, ``stop_strings``,
    ``batch_size``, ``cache_tokens``): :func:`make_engine`."""
    return make_engine(generation.engine, tokenizer, model, stop_strings=generation.stop_strings,
                       batch_size=generation.batch_size, engine_kwargs=generation.engine_kwargs,
                       eos_token_ids=eos_token_ids, cache_tokens=getattr(generation, "cache_tokens", None))


def generate_text(engine: Engine, model, tokenizer, messages_list: Sequence[list[dict]], params: SamplingParams,
                  seed: int | None = None) -> list[str]:
    """Reply to each conversation: chat template with the generation prompt, generate, decode the responses
    (special tokens skipped)."""
    rollout = engine.generate(model, encode_chat_prompts(tokenizer, messages_list), params, seed)
    return decode_responses(tokenizer, rollout)
