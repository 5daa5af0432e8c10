"""TRL's calling convention for reward functions, beside rlhfkit's own (torch-free: worker processes import it).

rlhfkit calls a reward function positionally, ``fn(prompts, completions, **fields)``, with the prompt and completion
texts. TRL's ``GRPOTrainer`` calls it with keywords only, ``fn(prompts=, completions=, completion_ids=,
trainer_state=, **columns)``, so its documented functions name what they read, in any order, and take ``**kwargs``
for the rest: ``def f(completions, **kwargs)``, ``def f(prompts, completions, **kwargs)``, ``def f(completions,
ground_truth, **kwargs)``, ``def f(completions_ids, **kwargs)`` (the spelling of TRL's own docs; its trainer passes
``completion_ids``). And for conversational data (prompts given as lists of messages) TRL passes each prompt as its
messages and each completion as a list of one assistant message (``completion[0]["content"]``).

:func:`is_trl_style` tells the two apart by the signature: a function whose first two positional parameters are not
``(prompts, completions)`` in that order, and that names ``completions`` (or the ids) or takes only ``**kwargs``, is
TRL's. :class:`TrlStyle` wraps such a function into rlhfkit's convention, converting the arguments per call, so
everything that calls reward functions (the workers, the probe, the lint, ``rlhfkit eval``) calls it unchanged. The
per-call data TRL passes that rlhfkit's call does not carry (the prompt messages, the completion token ids, the
trainer's step) arrives as one reserved keyword, :data:`EXTRA` (set by ``CombinedRewards``); without it (a probe,
``rlhfkit eval``) the wrapper derives what it can: one user message per prompt, ``completion_ids`` absent. TRL's
``log_metric(name, value)`` and ``log_extra(column, values)`` are given too: what a function logs comes back beside
its scores (tagged :data:`LOGGED`), and the run logs the metric (the mean of the step's values, under ``name``) and
adds the column to ``samples.jsonl``.

``async def`` functions (TRL accepts them) are run to completion with :func:`asyncio.run`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: the reserved keyword carrying TRL's per-call data to a :class:`TrlStyle` wrapper (never passed to the function)
EXTRA = "_rlhfkit_trl"
#: the names TRL's convention is recognised by (besides ``**kwargs`` alone)
TRL_NAMES = ("completions", "completion_ids", "completions_ids", "trainer_state")


#: the tag of what a TRL-style call returns when its function logged something (a tuple crosses the worker wire)
LOGGED = "rlhfkit.trl_logs"


@dataclass(frozen=True)
class TrainerState:
    """What TRL's ``trainer_state`` offers a reward function for curricula, counted as TRL counts them: the optimizer
    updates done before this rollout (``global_step``: 0 at the first), the run's updates (``max_steps``) and the
    passes over the prompts so far (``epoch``)."""

    global_step: int
    max_steps: int | None = None
    epoch: float | None = None


def _params(fn: Callable) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def named_params(fn: Callable) -> frozenset | None:
    """Keyword-passable parameter names of ``fn``, or ``None`` when it takes ``**kwargs`` (or cannot be inspected)."""
    params = _params(fn)
    if params is None or any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _call_params(fn: Callable) -> list[inspect.Parameter] | None:
    """The parameters a call of ``fn`` fills: a class's instances' ``__call__`` without ``self``."""
    if isinstance(fn, type):
        call = next((vars(k)["__call__"] for k in fn.__mro__ if "__call__" in vars(k)), None)
        params = _params(call) if call is not None else None
        return params[1:] if params else None
    return _params(fn)


def keyword_callable(fn: Callable) -> bool:
    """TRL's trainer can call ``fn``: it takes only ``**kwargs``, or names ``completions`` (or the ids) and takes
    every other parameter it requires by a name TRL passes or a dataset column."""
    params = _call_params(fn)
    if not params or any(p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY) for p in params):
        return False
    if all(p.kind is p.VAR_KEYWORD for p in params):
        return True
    return bool({p.name for p in params} & set(TRL_NAMES))


def is_trl_style(fn: Callable) -> bool:
    """``fn`` follows TRL's convention (keywords by name) rather than rlhfkit's ``(prompts, completions,
    **fields)``: :func:`keyword_callable`, and its first two positional parameters are not ``(prompts,
    completions)`` (both conventions call such a function the same way on text data)."""
    if not keyword_callable(fn):
        return False
    params = _call_params(fn) or []
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    return positional[:2] != ["prompts", "completions"]


def as_messages(prompt: Any) -> list[dict]:
    """A prompt as TRL's conversational form: its messages (a plain text becomes one user message)."""
    if isinstance(prompt, list):
        return prompt
    return [{"role": "user", "content": str(prompt)}]


class TrlStyle:
    """A TRL-convention reward function called as rlhfkit calls reward functions (see the module docstring).

    ``target``: the function, a class (built once, on first use, as ``Class(**kwargs)``) or a spec string that
    :func:`~rlhfkit.rewards.loading.load_reward_function` reads (loaded where the wrapper is first called: in the
    worker process); ``conversational``: give prompts as messages and completions as ``[{"role": "assistant",
    "content": text}]``; ``kwargs``: the configured keyword arguments (``reward.functions[].kwargs``): a function's,
    passed on every call, or a class's constructor's. Pickled by reference to its target.
    """

    def __init__(self, target: Callable | str, conversational: bool = False, kwargs: dict | None = None,
                 label: str = ""):
        self.target, self.conversational, self.kwargs = target, conversational, dict(kwargs or {})
        self.label = label or str(target)
        self._fn: Callable | None = None

    def __getstate__(self):
        return {**self.__dict__, "_fn": None}

    def _load(self) -> Callable:
        from .loading import instantiate, load_reward_function

        obj = load_reward_function(self.target) if isinstance(self.target, str) else self.target
        made = instantiate(obj, self.kwargs, self.label)
        self._call_kwargs = {} if isinstance(obj, type) else self.kwargs
        params = _params(made)
        self._names = {p.name for p in params or ()}
        self._needs_ids = any(p.name in ("completion_ids", "completions_ids") and p.default is p.empty
                              for p in params or ())
        self._accepts = named_params(made)
        return made

    def __call__(self, prompts, completions, **fields):
        if self._fn is None:
            self._fn = self._load()
        extra = fields.pop(EXTRA, None) or {}
        messages = extra.get("messages") or [as_messages(p) for p in prompts]
        if self.conversational:
            prompts = messages
            completions = [[{"role": "assistant", "content": c}] for c in completions]
        given: dict[str, Any] = {**fields, **self._call_kwargs, "prompts": list(prompts),
                                 "completions": list(completions)}
        if extra.get("completion_ids") is not None:
            given["completion_ids"] = extra["completion_ids"]
            if "completions_ids" in self._names:  # the spelling of TRL's docs
                given["completions_ids"] = extra["completion_ids"]
        elif self._needs_ids:  # a probe or `rlhfkit eval` without token ids: no opinion rather than a TypeError
            return [None] * len(completions)
        state = extra.get("trainer_state")
        given["trainer_state"] = TrainerState(*state) if state is not None else \
            TrainerState(extra.get("step") or 0, extra.get("max_steps"))
        metrics: dict[str, list[float]] = {}
        columns: dict[str, list] = {}
        given["log_metric"] = lambda name, value: metrics.setdefault(str(name), []).append(float(value))
        given["log_extra"] = lambda column, values: columns.setdefault(str(column), []).extend(list(values))
        if self._accepts is not None:
            given = {k: v for k, v in given.items() if k in self._accepts}
        out = self._fn(**given)
        if inspect.iscoroutine(out):
            out = asyncio.run(out)
        if metrics or columns:  # TRL's log_metric / log_extra: carried back beside the scores (functions.py)
            return (LOGGED, out, metrics, columns)
        return out


def wanted_extra(fn: Callable) -> set[str]:
    """Which of TRL's per-call data ``fn`` (a function or class as loaded) reads, of {completion_ids, messages}:
    everything for ``**kwargs``, so a caller computes only that."""
    params = _call_params(fn) or []
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return {"completion_ids", "messages"}
    named = {p.name for p in params}
    return ({"completion_ids"} if named & {"completion_ids", "completions_ids"} else set()) | {"messages"}
