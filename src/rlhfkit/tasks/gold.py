"""The gold metric of a built-in task, measured on a model: sample an answer per held-out prompt and score it
with the task's program. Sampling is at temperature 1 by default — the policy as a distribution, the quantity RL
optimises — so a model that answers right 40 % of the time scores 0.4, not 0 or 1 as greedy decoding would."""

from __future__ import annotations

import torch

from ..data.formats import message_text
from ..rollout import Engine, SamplingParams, generate_text, make_engine


@torch.no_grad()
def gold_metric(model, tokenizer, task, prompt_records: list[dict], *, temperature: float = 1.0,
                max_new_tokens: int = 16, seed: int = 0, batch_size: int = 128, engine: Engine | str = "auto") -> dict:
    """``{"gold": mean score, "n": count, "samples": [(prompt, answer, score), …]}``. ``engine``: the run's rollout
    engine, or the name of one to build (``generation.engine``; ``auto`` by default)."""
    if isinstance(engine, str):
        engine = make_engine(engine, tokenizer, model, batch_size=batch_size)
    prompts = [r["prompt"] if isinstance(r["prompt"], str) else message_text(r["prompt"][-1]["content"])
               for r in prompt_records]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    answers: list[str] = []
    if getattr(task, "uses_images", False):  # a visual task: its records' images, with their prompts as given
        from ..data.chat import render_prompt_media
        from ..rollout import decode_responses

        for start in range(0, len(prompts), batch_size):
            encoded = [render_prompt_media(tokenizer, r["prompt"], r.get("images"))
                       for r in prompt_records[start: start + batch_size]]
            rollout = engine.generate(model, [e[0] for e in encoded], params, seed=seed + start,
                                      media=[e[1] for e in encoded])
            answers += decode_responses(tokenizer, rollout)
        scores = [task.gold(p, a, images=r.get("images")) for p, a, r in zip(prompts, answers, prompt_records)]
        return {"gold": sum(scores) / max(1, len(scores)), "n": len(scores),
                "samples": list(zip(prompts, answers, scores))}
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start: start + batch_size]
        answers += generate_text(engine, model, tokenizer, [[{"role": "user", "content": p}] for p in chunk], params,
                                 seed=seed + start)
    scores = [task.gold(p, a) for p, a in zip(prompts, answers)]
    return {"gold": sum(scores) / max(1, len(scores)), "n": len(scores),
            "samples": list(zip(prompts, answers, scores))}
