"""The gold metric of a built-in task, measured on a model: sample an answer per held-out prompt and score it
with the task's program. Sampling is at temperature 1 by default — the policy as a distribution, the quantity RL
optimises — so a model that answers right 40 % of the time scores 0.4, not 0 or 1 as greedy decoding would."""

from __future__ import annotations

import torch

from ..rollout import SamplingParams, generate_text


@torch.no_grad()
def gold_metric(model, tokenizer, task, prompt_records: list[dict], *, temperature: float = 1.0,
                max_new_tokens: int = 16, seed: int = 0, batch_size: int = 128) -> dict:
    """``{"gold": mean score, "n": count, "eos_frac": …, "samples": [(prompt, answer, score), …]}``."""
    prompts = [r["prompt"] if isinstance(r["prompt"], str) else r["prompt"][-1]["content"] for r in prompt_records]
    answers: list[str] = []
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, do_sample=temperature > 0)
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start: start + batch_size]
        answers += generate_text(model, tokenizer, [[{"role": "user", "content": p}] for p in chunk],
                                 **params.engine_kwargs(), seed=seed + start)
    scores = [task.gold(p, a) for p, a in zip(prompts, answers)]
    return {"gold": sum(scores) / max(1, len(scores)), "n": len(scores),
            "samples": list(zip(prompts, answers, scores))}
