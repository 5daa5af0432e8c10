"""The ``hf`` engine: ``transformers`` ``model.generate``, the reference every other engine is tested against.

Left-padded micro-batches, KV cache on, ``min_new_tokens`` 0 unless asked (a response is never forced to the maximum
length), every EOS id passed so each row stops at its own end, greedy when ``params.greedy``. It reports the log-prob
of each sampled token under the distribution it was drawn from (``Rollout.logprobs``): transformers' own warpers
(temperature, top-k, top-p) are passed as logits processors followed by a recorder.

Settings (``generation.engine_kwargs``): ``cache_implementation="static"`` uses transformers' static cache, and
``compile=True`` with it compiles the decoding forward with ``torch.compile`` (transformers' auto-compile, which it
otherwise enables on CUDA only); a call during which it compiled counts as compile time in ``take_stats``. Measured
with ``bench/engines.py`` (see ``rollout/auto.py`` for the figures).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch._dynamo.utils import counters

from ..models.vision import generate_inputs
from .engine import Engine, register, seeded
from .sampling import SamplingParams


def _stop_criterion(stop_strings, tokenizer, prompt_width: int):
    """A transformers ``StoppingCriteria`` that ends a row once the tail of its response holds a stop string
    (an early exit only: :func:`~.engine.finalize_responses` finds the exact end afterwards)."""
    from transformers import StoppingCriteria

    window = max(len(s) for s in stop_strings) + 8

    class StopOnStrings(StoppingCriteria):
        def __call__(self, input_ids: torch.LongTensor, scores=None, **kwargs) -> torch.BoolTensor:
            tails = input_ids[:, prompt_width:][:, -window:].tolist()
            texts = tokenizer.batch_decode(tails, skip_special_tokens=False)
            done = [any(s in t for s in stop_strings) for t in texts]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StopOnStrings()


def _sampling_processors(params: SamplingParams):
    """transformers' own warpers, in the order ``generate`` applies them (temperature, top-k, top-p), followed by a
    recorder of the log-probs of the distribution each token is then drawn from. We pass the warpers ourselves
    (and neutral values in the GenerationConfig) because ``generate`` runs user processors *before* its own
    warpers, so a recorder could not otherwise see the distribution actually sampled."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    procs = LogitsProcessorList()
    if not params.greedy and params.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(float(params.temperature)))
    if not params.greedy and params.top_k > 0:
        procs.append(TopKLogitsWarper(top_k=int(params.top_k)))
    if not params.greedy and params.top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=float(params.top_p)))
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


@register
class HFEngine(Engine):
    """``transformers`` ``model.generate`` in left-padded micro-batches of ``batch_size`` rows (None: all)."""

    name = "hf"

    def __init__(self, tokenizer=None, *, eos_token_ids, pad_token_id, stop_strings=(), batch_size=None,
                 cache_implementation: str | None = None, compile: bool = False):
        super().__init__(tokenizer, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                         stop_strings=stop_strings, batch_size=batch_size)
        if cache_implementation not in (None, "dynamic", "static"):
            raise ValueError(f"hf engine: cache_implementation must be dynamic or static, got {cache_implementation!r}")
        if compile and cache_implementation != "static":
            raise ValueError("hf engine: compile=True needs cache_implementation='static' (transformers compiles "
                             "the decoding forward only with a static cache)")
        self.cache_implementation = cache_implementation
        self.compile = compile

    def generation_config(self, params: SamplingParams):
        """The ``GenerationConfig`` of one call: every knob set explicitly, so nothing is inherited from the model's
        own generation_config (a checkpoint's top_k=20 would silently change the sampling distribution)."""
        from transformers import CompileConfig, GenerationConfig

        kwargs: dict[str, Any] = dict(
            max_new_tokens=int(params.max_new_tokens), min_new_tokens=int(params.min_new_tokens),
            do_sample=not params.greedy, num_beams=1, num_return_sequences=1, eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id, use_cache=True, repetition_penalty=1.0, no_repeat_ngram_size=0,
            return_dict_in_generate=False, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0,
            # sampling: the warpers go in as processors (see _sampling_processors), neutral values here; greedy
            # ignores them and gets transformers' own neutral defaults, which it does not warn about
            temperature=1.0, top_p=1.0, top_k=0 if not params.greedy else 50,
        )
        if self.cache_implementation == "static":
            kwargs["cache_implementation"] = "static"
            if self.compile:
                cc = CompileConfig()  # transformers' defaults: mode="reduce-overhead" (CUDA graphs on CUDA)
                cc._compile_all_devices = True  # transformers' own switch to compile off CUDA too
                kwargs["compile_config"] = cc
            else:
                kwargs["disable_compile"] = True
        return GenerationConfig(**kwargs)

    def _decode(self, model, ids, mask, params, seed, media=None):
        from transformers import StoppingCriteriaList

        criteria = StoppingCriteriaList()
        if self.stop_strings:
            criteria.append(_stop_criterion(self.stop_strings, self.tokenizer, ids.shape[1]))
        if self.on_progress is not None:
            criteria.append(_ProgressReport(self, ids.shape[1], params.max_new_tokens))
        processors, recorder = _sampling_processors(params)
        graphs_before = counters["stats"]["unique_graphs"]
        t0 = time.perf_counter()
        images = {} if media is None else generate_inputs(model, ids, media)  # pixels: generate runs the tower
        with seeded(None if params.greedy else seed, ids.device):
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=self.generation_config(params),
                                 stopping_criteria=criteria, logits_processor=processors, **images)
        if counters["stats"]["unique_graphs"] > graphs_before:  # torch.compile made a graph during this call
            self.compile_seconds += time.perf_counter() - t0  # (the call's generation is counted with it)
        raw = out[:, ids.shape[1]:]
        return raw, recorder.finish(raw)


class _ProgressReport:
    """A stopping criterion that never stops: it tells the engine's ``on_progress`` how many tokens were drawn, every
    8 (the ids' width: no device sync; the rows ended are not known without one)."""

    def __init__(self, engine, prompt_len: int, max_new: int, every: int = 8):
        self.engine, self.prompt_len, self.max_new, self.every = engine, prompt_len, max_new, every

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        t = input_ids.shape[1] - self.prompt_len
        if t % self.every == 0:
            self.engine.tell_progress(t, self.max_new, None)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
