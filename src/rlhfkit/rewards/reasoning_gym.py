"""The verifier of ``reasoning-gym``'s procedural tasks (``data.train=reasoning_gym:NAME?...``,
:func:`rlhfkit.data.sources.load_reasoning_gym`): the answer inside the completion's ``<answer>...</answer>`` tags
(the format the package's system prompts ask for), scored by the task's own ``score_answer`` against the row's
``answer`` and ``metadata`` (its item). Torch-free: it runs in the reward workers.

Scores are the task's own, in [0, 1] (some tasks give partial credit, e.g. ``gsm_symbolic`` 0.01 for a wrong number);
a completion without the tags scores 0.0 (the task's answer format not followed); a row without ``metadata`` (data
that did not come from reasoning-gym) is None, no opinion.
"""

from __future__ import annotations

from functools import cache

from ..errors import RewardError


@cache
def _scorer(task: str):
    try:
        import reasoning_gym
    except ImportError:
        raise RewardError("the reasoning_gym verifier needs the reasoning-gym package", where="reward.functions",
                          fix="pip install 'rlhfkit[tasks]' (or pip install reasoning-gym)") from None
    return reasoning_gym.get_score_answer_fn(task)


def extract_answer(completion: str, tag: str = "answer") -> str | None:
    """The text inside the last ``<tag>...</tag>`` of ``completion``, stripped; None without one."""
    end = completion.rfind(f"</{tag}>")
    start = completion.rfind(f"<{tag}>", 0, end if end >= 0 else None)
    if start < 0 or end < start:
        return None
    return completion[start + len(tag) + 2: end].strip()


def reasoning_gym_score(prompts, completions, answer=None, metadata=None, question=None, tag: str = "answer",
                        **fields) -> list[float | None]:
    """Per completion: the task's ``score_answer(extracted answer, item)`` (see the module docstring)."""
    n = len(completions)
    answer, metadata, question = answer or [None] * n, metadata or [None] * n, question or [None] * n
    out: list[float | None] = []
    for text, ans, meta, q, prompt in zip(completions, answer, metadata, question, prompts):
        if not isinstance(meta, dict) or "source_dataset" not in meta:
            out.append(None)
            continue
        found = extract_answer(text, tag)
        if found is None:
            out.append(0.0)
            continue
        entry = {"question": q if q is not None else prompt, "answer": ans, "metadata": meta}
        out.append(float(_scorer(meta["source_dataset"])(found, entry)))
    return out
