"""One :class:`SamplingParams` object for every caller of a rollout engine (online loop, evaluation, gold metric,
chat), instead of the same dozen keyword arguments spelled out at each call."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How responses are sampled. ``temperature == 0`` or ``do_sample=False`` is greedy decoding.

    max_new_tokens: the most response tokens (a response usually ends earlier, at its first EOS / stop string);
    min_new_tokens: 0 = never force length; top_p 1.0 / top_k 0 = off; stop_strings: extra strings that end a
    response; batch_size: generation micro-batch (None = all prompts at once).
    """

    max_new_tokens: int = 64
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    do_sample: bool = True
    stop_strings: tuple[str, ...] = field(default_factory=tuple)
    batch_size: int | None = None

    @classmethod
    def from_config(cls, generation, greedy: bool = False) -> SamplingParams:
        """From a ``GenerationConfig`` section (``greedy``: the same limits, decoded greedily)."""
        return cls(max_new_tokens=generation.max_new_tokens, min_new_tokens=generation.min_new_tokens,
                   temperature=generation.temperature, top_p=generation.top_p, top_k=generation.top_k,
                   do_sample=not greedy, stop_strings=tuple(generation.stop_strings), batch_size=generation.batch_size)

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0

    def engine_kwargs(self) -> dict:
        """The keyword arguments of ``RolloutEngine.generate`` these parameters stand for."""
        return {"max_new_tokens": self.max_new_tokens, "min_new_tokens": self.min_new_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "do_sample": self.do_sample, "stop_strings": list(self.stop_strings) or None,
                "batch_size": self.batch_size}
