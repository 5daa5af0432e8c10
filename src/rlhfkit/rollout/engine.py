"""Generation engines: prompts in, a :class:`~rlhfkit.rollout.types.Rollout` out.

Whatever the engine, the masks of a rollout are derived here, from the generated ids themselves: a response ends
at its first EOS (any of ``eos_token_ids``) or at the token that completes a stop string, whichever comes first;
everything after is set to the pad id and masked. The pad id is never used to find the end (pad may equal EOS).

:class:`HFGenerateEngine` wraps ``model.generate`` (transformers 5): left-padded micro-batches, KV cache on,
``min_new_tokens`` 0 unless asked (a response is never forced to the maximum length), every EOS id passed so each
row stops at its own end, greedy when ``do_sample=False`` or ``temperature == 0``. It reports the log-prob of each
sampled token under the distribution it was drawn from (``Rollout.logprobs``).
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from ..data.chat import encode_chat_prompts, stop_token_ids
from ..errors import ConfigError
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


def first_stop_end(tokenizer, ids: Sequence[int], stop_strings: Sequence[str]) -> int | None:
    """Number of leading tokens of ``ids`` up to and including the token that completes the first stop string,
    or ``None`` when no stop string occurs (binary search over decoded prefixes: O(log n) decodes)."""

    def hit(k: int) -> bool:
        text = tokenizer.decode(list(ids[:k]), skip_special_tokens=False)
        return any(s in text for s in stop_strings)

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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cut raw generated ids [B, R] at each row's end -> ``(ids, mask, ended, lengths)``.

    A row ends at its first EOS (kept, mask 1) or at the token completing a stop string before it (kept, mask 1);
    positions after the end get the pad id and mask 0. A row with neither is cut by the length limit (ended False).
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
    mask = torch.arange(R, device=device).unsqueeze(0) < length.unsqueeze(-1)
    ids = response_ids.masked_fill(~mask, pad_token_id)
    return ids, mask.to(torch.long), ended, length.to(torch.long)


def _stop_criterion(stop_strings: Sequence[str], tokenizer, prompt_width: int):
    """A transformers ``StoppingCriteria`` that ends a row once the tail of its response holds a stop string
    (an early exit only: :func:`finalize_responses` finds the exact end afterwards)."""
    from transformers import StoppingCriteria

    window = max(len(s) for s in stop_strings) + 8

    class StopOnStrings(StoppingCriteria):
        def __call__(self, input_ids: torch.LongTensor, scores=None, **kwargs) -> torch.BoolTensor:
            tails = input_ids[:, prompt_width:][:, -window:].tolist()
            texts = tokenizer.batch_decode(tails, skip_special_tokens=False)
            done = [any(s in t for s in stop_strings) for t in texts]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StopOnStrings()


def _sampling_processors(temperature: float, top_k: int, top_p: float, sample: bool):
    """transformers' own warpers, in the order ``generate`` applies them (temperature, top-k, top-p), followed by a
    recorder of the log-probs of the distribution each token is then drawn from. We pass the warpers ourselves
    (and neutral values in the GenerationConfig) because ``generate`` runs user processors *before* its own
    warpers, so a recorder could not otherwise see the distribution actually sampled."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    procs = LogitsProcessorList()
    if sample and temperature != 1.0:
        procs.append(TemperatureLogitsWarper(float(temperature)))
    if sample and top_k > 0:
        procs.append(TopKLogitsWarper(top_k=int(top_k)))
    if sample and top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=float(top_p)))
    recorder = _SampledLogprobs()
    procs.append(recorder)
    return procs, recorder


class _SampledLogprobs:
    """A logits processor (``generate`` calls it with (input_ids, scores)) that keeps log softmax of the final,
    warped scores of each step; at the next step, where ``input_ids`` ends with the token drawn from them, it
    records that token's log-prob. ``finish`` records the last token."""

    def __init__(self):
        self.prev: torch.Tensor | None = None
        self.out: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.out.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """Log-probs [B, R] of the R generated tokens (``generated``: [B, R] ids)."""
        if self.prev is not None and len(self.out) < generated.shape[1]:
            self.out.append(self.prev.gather(-1, generated[:, len(self.out)].unsqueeze(-1)).squeeze(-1))
        self.prev = None
        if len(self.out) != generated.shape[1]:
            raise RuntimeError(f"recorded {len(self.out)} sampling log-probs for {generated.shape[1]} tokens")
        return torch.stack(self.out, dim=1)


# ───────────────────────────────────────────── engines ─────────────────────────────────────────────


@runtime_checkable
class RolloutEngine(Protocol):
    """Anything that turns prompt ids into a :class:`Rollout` (see :meth:`HFGenerateEngine.generate`)."""

    def generate(
        self,
        model,
        prompt_ids: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_new_tokens: int = 0,
        do_sample: bool = True,
        eos_token_ids: list[int],
        pad_token_id: int,
        stop_strings: list[str] | None = None,
        tokenizer=None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        batch_size: int | None = None,
        on_rows: Callable[[int], None] | None = None,
    ) -> Rollout: ...


class HFGenerateEngine:
    """``transformers`` ``model.generate`` in left-padded micro-batches of ``batch_size`` rows (None: all)."""

    name = "hf"

    def __init__(self, batch_size: int | None = None):
        self.batch_size = batch_size

    def generate(
        self,
        model,
        prompt_ids: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_new_tokens: int = 0,
        do_sample: bool = True,
        eos_token_ids: list[int],
        pad_token_id: int,
        stop_strings: list[str] | None = None,
        tokenizer=None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        batch_size: int | None = None,
        on_rows: Callable[[int], None] | None = None,
    ) -> Rollout:
        """Generate one response per prompt (prompts: unpadded id lists) and return the cut, masked rollout.

        ``seed`` (or a ``generator``, from which a seed is drawn) makes sampling reproducible without touching the
        global RNG; greedy decoding (``do_sample=False`` or ``temperature <= 0``) needs neither. ``on_rows(n)`` is
        called after each micro-batch with its number of rows (a progress display counts them). The model is put
        in eval mode for generation and each submodule's training flag is restored afterwards.
        """
        from transformers import GenerationConfig, StoppingCriteriaList

        if not prompt_ids:
            raise ValueError("generate() got no prompts")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("generate() got an empty prompt; every prompt needs at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not eos_token_ids:
            raise ValueError("eos_token_ids is empty: responses could never end")
        stop_strings = [s for s in (stop_strings or []) if s]
        if stop_strings and tokenizer is None:
            raise ValueError("stop_strings need the tokenizer (to decode responses)")

        sample = bool(do_sample) and temperature > 0
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=int(max_new_tokens),
            min_new_tokens=int(min_new_tokens),
            do_sample=sample,
            num_beams=1,
            num_return_sequences=1,
            eos_token_id=[int(i) for i in eos_token_ids],
            pad_token_id=int(pad_token_id),
            use_cache=True,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            return_dict_in_generate=False,
        )
        # Set explicitly, so nothing is inherited from the model's generation_config (a checkpoint's top_k=20 would
        # silently change the sampling distribution). Greedy ignores them; there we give transformers' own neutral
        # defaults, which it does not warn about.
        if sample:  # the warpers go in as processors (see _sampling_processors), neutral values here
            gen_kwargs.update(temperature=1.0, top_p=1.0, top_k=0)
        else:
            gen_kwargs.update(temperature=1.0, top_p=1.0, top_k=50)
        gen_kwargs.update(typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)
        gen_config = GenerationConfig(**gen_kwargs)

        outer = strip_parallel_wrappers(model)
        device = model_device(outer)
        if seed is None and generator is not None and sample:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
        step = batch_size or self.batch_size or len(prompt_ids)

        parts: list[Rollout] = []
        with eval_mode(outer), torch.no_grad(), seeded(seed if sample else None, device):
            for start in range(0, len(prompt_ids), step):
                rows = prompt_ids[start : start + step]
                ids, mask = left_pad(rows, pad_token_id)
                ids, mask = ids.to(device), mask.to(device)
                criteria = StoppingCriteriaList()
                if stop_strings:
                    criteria.append(_stop_criterion(stop_strings, tokenizer, ids.shape[1]))
                processors, recorder = _sampling_processors(temperature, top_k, top_p, sample)
                out = outer.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    generation_config=gen_config,
                    stopping_criteria=criteria,
                    logits_processor=processors,
                )
                raw = out[:, ids.shape[1] :]
                sampled_lp = recorder.finish(raw)
                r_ids, r_mask, ended, lengths = finalize_responses(
                    raw,
                    eos_token_ids=eos_token_ids,
                    pad_token_id=pad_token_id,
                    stop_strings=stop_strings,
                    tokenizer=tokenizer,
                )
                sampled_lp = torch.where(r_mask.bool(), sampled_lp, torch.zeros((), device=sampled_lp.device))
                parts.append(Rollout(ids, mask, r_ids, r_mask, ended, lengths, logprobs=sampled_lp))
                if on_rows is not None:
                    on_rows(len(rows))

        rollout = Rollout.concat(parts, pad_token_id)
        width = max(int(rollout.lengths.max()), 1)  # drop columns that are padding in every row
        if width < rollout.response_ids.shape[1]:
            rollout.response_ids = rollout.response_ids[:, :width].contiguous()
            rollout.response_mask = rollout.response_mask[:, :width].contiguous()
            rollout.logprobs = rollout.logprobs[:, :width].contiguous()
        return rollout


ENGINES: dict[str, Callable[..., RolloutEngine]] = {"hf": HFGenerateEngine}


def get_engine(name: str, **kwargs) -> RolloutEngine:
    """An engine instance by registry name (``generation.engine``)."""
    if name not in ENGINES:
        close = difflib.get_close_matches(name, list(ENGINES), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"unknown rollout engine {name!r}",
            where="generation.engine",
            fix=f"{hint}choose one of {sorted(ENGINES)}",
        )
    return ENGINES[name](**kwargs)


def generate_text(
    model,
    tokenizer,
    messages_list: Sequence[list[dict]],
    *,
    max_new_tokens: int = 256,
    engine: str | RolloutEngine = "hf",
    eos_token_ids: list[int] | None = None,
    pad_token_id: int | None = None,
    **gen_kwargs,
) -> list[str]:
    """Reply to each conversation: chat template with the generation prompt, generate, decode the responses
    (special tokens skipped). ``gen_kwargs`` go to the engine (temperature, do_sample, seed, stop_strings, …)."""
    if isinstance(engine, str):
        engine = get_engine(engine)
    if eos_token_ids is None:
        eos_token_ids = stop_token_ids(
            tokenizer, getattr(strip_parallel_wrappers(model), "generation_config", None)
        )
    if pad_token_id is None:
        pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_token_ids[0]
    gen_kwargs.setdefault("tokenizer", tokenizer)
    rollout = engine.generate(
        model,
        encode_chat_prompts(tokenizer, messages_list),
        max_new_tokens=max_new_tokens,
        eos_token_ids=eos_token_ids,
        pad_token_id=pad_token_id,
        **gen_kwargs,
    )
    return decode_responses(tokenizer, rollout)
