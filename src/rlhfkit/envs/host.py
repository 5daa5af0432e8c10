"""Environments run as user code under limits: :class:`EnvHost` holds the episodes' environment objects inside a
worker process (:mod:`rlhfkit.rewards.workers`, the mechanism reward functions run in), and :class:`EnvCalls` is
the trainer's side: it sends each episode's ``reset`` / ``step`` / ``metrics`` to the worker that holds the episode,
each call under ``env.timeout_s``, and checks everything that comes back.

What a run does with what an environment does (one line names the class, the method and the rollout step):

- returns the wrong thing (``reset`` not a non-empty list of ``{role, content}`` messages with a known role and a
  string content; ``step`` not ``(messages, reward, done)`` with a number reward and a bool ``done``; ``metrics``
  not a dict of numbers), or raises: :class:`~rlhfkit.envs.base.EnvError` (exit 2);
- a call that passes ``env.timeout_s``, or whose worker dies (a crash, the memory limit) or sends back what is not
  plain data (:mod:`rlhfkit.rewards.wire`; the worker is killed for it): the episode fails, and so does every live
  episode on that worker (a killed worker loses their state); failed episodes are dropped from the step (their
  reward is NaN, so the online loop's ``valid`` drops them) and counted: ``env/timeouts``, ``env/errors`` (calls),
  ``env/dropped`` (episodes);
- a NaN / inf turn reward: the episode is dropped and counted in ``env/dropped``, as NaN function rewards are.

What comes back from a worker is JSON plain data (:mod:`rlhfkit.rewards.wire`: lists, tuples, dicts with their
keys, strings, numbers; nothing is unpickled), and the checks below take it field by field; a value of another type
arrives as a description whose type name the check's line names. ``env.workers=0`` runs the environments in the
trainer's process, without a time limit (objects that cannot be sent to a worker, debugging).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from ..errors import UserError, say
from ..rewards.workers import CallFailed, CallTimeout, Job, Outcome, WorkerPool
from .base import WHERE, EnvError, load_environment

ROLES = ("system", "user", "assistant", "tool", "function", "ipython", "developer")
HOST = "rlhfkit.envs.host:EnvHost"


class EnvHost:
    """The environment objects of the episodes played in one process, by episode id (see the module docstring)."""

    def __init__(self, spec: str, kwargs: dict):
        self.cls = load_environment(spec)
        self.kwargs = dict(kwargs)
        self.envs: dict[int, Any] = {}

    def new(self, eid: int) -> None:
        self.envs[eid] = self.cls(**self.kwargs)

    def call(self, eid: int, method: str, *args) -> Any:
        return getattr(self._env(eid), method)(*args)

    def metrics(self, eid: int) -> dict:
        fn = getattr(self._env(eid), "metrics", None)
        return fn() if callable(fn) else {}

    def _env(self, eid: int) -> Any:
        if eid not in self.envs:  # this worker was restarted (killed for a timeout) since the episode began
            raise EpisodeLost(f"episode {eid} is not on this worker")
        return self.envs[eid]

    def drop(self, eids: list[int]) -> None:
        for eid in eids:
            self.envs.pop(eid, None)


class EpisodeLost(Exception):
    """Raised in a worker for an episode whose state went with a restart."""


class EpisodeFailed(Exception):
    """An episode's call timed out or its worker died (or was killed for another episode's timeout)."""


def _real(value: Any) -> float | None:
    """A number as float (NaN / inf kept), None when it is not one (bools count as 0 / 1)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy / torch scalars
        try:
            value = value.item()
        except (TypeError, ValueError):
            return None
    return float(value) if isinstance(value, numbers.Real) else None


class EnvCalls:
    """The trainer's side of the environment: a pool of ``workers`` processes holding one :class:`EnvHost` each;
    episode ``eid`` lives on worker ``eid % workers``. Use as a context manager (the workers stop at exit)."""

    def __init__(self, spec: str, cls: type, kwargs: dict, *, workers: int, timeout_s: float | None):
        self.spec, self.name = spec, getattr(cls, "__name__", str(spec))
        self.pool = WorkerPool(workers, timeout_s if workers else None)
        self.counts = {"timeouts": 0, "errors": 0, "overlong": 0}
        self._said: set[str] = set()
        try:
            self.pool.setup("env", HOST, {"spec": spec, "kwargs": dict(kwargs)}, label=f"environment {self.name}")
        except (CallFailed, CallTimeout) as exc:
            self.close()
            raise EnvError(f"environment {self.name} could not be loaded in a worker process: {exc}", where=WHERE,
                           fix="import it in Python to see the traceback, or set env.workers=0") from None
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> EnvCalls:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def fail(self, method: str, step: int | None, problem: str, fix: str, where: str = WHERE) -> EnvError:
        at = "" if step is None else f" at rollout step {step}"
        return EnvError(f"environment {self.name}: {method}(){at} {problem}", where=where, fix=fix)

    def raised(self, method: str, step: int | None, error: Exception, fix: str, where: str = WHERE) -> EnvError:
        """What the environment raised, as one line with one fix: its own one-line complaint (a
        :class:`~rlhfkit.errors.UserError`, e.g. the OpenEnv adapter's) keeps its fix and its key, another exception
        gets ``fix``."""
        if isinstance(error, UserError):
            return self.fail(method, step, f"raised: {error.message}", error.fix or fix, error.where or where)
        return self.fail(method, step, f"raised {error}", fix, where)

    def say_once(self, key: str, line: str) -> None:
        """``line`` the first time ``key`` comes up in this run."""
        if key not in self._said:
            self._said.add(key)
            say(line)

    def calls(self, method: str, items: list[tuple[int, tuple]], step: int | None) -> list[Any]:
        """``method`` for each ``(eid, args)`` on the episode's worker; per item its value, or an
        :class:`EpisodeFailed` (a timeout, a dead worker, a worker killed under another episode). An exception the
        environment raised stops the run with one line."""
        before = [w.restarts for w in self.pool.workers]
        jobs = [Job("env", method, (eid,), on=eid) if method in ("new", "metrics")
                else Job("env", "call", (eid, method, *args), on=eid) for eid, args in items]
        outcomes: list[Outcome] = self.pool.run(jobs)
        lost = {i for i, w in enumerate(self.pool.workers) if w.restarts != before[i]}
        out: list[Any] = []
        for (eid, _), o in zip(items, outcomes):
            if isinstance(o.error, CallTimeout) or (isinstance(o.error, CallFailed) and o.error.worker_lost):
                self.counts["timeouts" if isinstance(o.error, CallTimeout) else "errors"] += 1
                out.append(EpisodeFailed(str(o.error)))
            elif isinstance(o.error, CallFailed) and o.error.kind == EpisodeLost.__name__:
                out.append(EpisodeFailed("its worker was restarted"))
            elif o.error is not None and method == "new":  # the constructor: env.kwargs, as make_environment says
                raise self.raised("__init__", step, o.error, "check the keyword arguments against the "
                                  "environment's __init__", where="env.kwargs") from None
            elif o.error is not None:
                raise self.raised(method, step, o.error, "fix the environment (call it in Python to see the "
                                                         "traceback)") from None
            elif self.pool.n and eid % self.pool.n in lost:
                out.append(EpisodeFailed("its worker was restarted"))  # the episode's state is gone
            else:
                out.append(o.value)
        return out

    def take_counts(self) -> dict[str, int]:
        """Timed-out and crashed calls since the last call (``env/timeouts``, ``env/errors`` of one step)."""
        out, self.counts = self.counts, {"timeouts": 0, "errors": 0, "overlong": 0}
        return out

    def drop(self, eids: list[int]) -> None:
        by_worker: dict[int, list[int]] = {}  # no workers: run() calls the local host
        for eid in eids:
            by_worker.setdefault(eid % max(1, self.pool.n), []).append(eid)
        self.pool.run([Job("env", "drop", (ids,), on=w) for w, ids in by_worker.items()])

    # ── checks of what comes back ────────────────────────────────────────────────────────────────────────────
    def check_messages(self, value: Any, method: str, step: int | None, *, empty_ok: bool) -> list[dict]:
        fix = ("return [{'role': 'user', 'content': '...'}, ...] from reset()" if method == "reset" else
               "return (list of {'role', 'content'} messages, float reward, bool done) from step()")
        if not isinstance(value, (list, tuple)):
            raise self.fail(method, step, f"returned a {type(value).__name__} where a list of messages belongs", fix)
        if not value and not empty_ok:
            raise self.fail(method, step, "returned no messages", fix)
        for i, m in enumerate(value):
            if not isinstance(m, dict):
                problem = f"message {i} is a {type(m).__name__}, not a dict"
            elif not isinstance(m.get("role"), str) or m["role"] not in ROLES:
                problem = f"message {i} has role {m.get('role')!r} (one of {', '.join(ROLES)})"
            elif not isinstance(m.get("content"), str):
                problem = f"message {i} has content of type {type(m.get('content')).__name__}, not a string"
            else:
                continue
            raise self.fail(method, step, f"returned a bad message: {problem}", fix)
        return [dict(m) for m in value]

    def check_step(self, value: Any, step: int | None) -> tuple[list[dict], float, bool]:
        """``(new messages, reward, done)``; the reward may be NaN / inf (the caller drops the episode)."""
        fix = "return (list of {'role', 'content'} messages, float reward, bool done) from step()"
        if not isinstance(value, tuple) or len(value) != 3:
            got = f"a {len(value)}-tuple" if isinstance(value, tuple) else f"a {type(value).__name__}"
            raise self.fail("step", step, f"returned {got}", fix)
        new, reward, done = value
        new = self.check_messages(new, "step", step, empty_ok=True)
        r = _real(reward) if reward is not None else math.nan
        if r is None:
            raise self.fail("step", step, f"returned a {type(reward).__name__} reward ({reward!r:.40})", fix)
        d = _real(done)
        if d is None or d not in (0.0, 1.0):
            raise self.fail("step", step, f"returned done={done!r:.40} (a bool belongs there)", fix)
        return new, r, bool(d)

    def check_metrics(self, value: Any, step: int | None) -> dict[str, float]:
        fix = "return a dict {name: float} from metrics()"
        if not isinstance(value, dict):
            raise self.fail("metrics", step, f"returned a {type(value).__name__}", fix)
        out = {}
        for key, v in value.items():
            r = _real(v)
            if not isinstance(key, str) or r is None:
                raise self.fail("metrics", step, f"returned {key!r:.40}: {v!r:.40} (a str key and a number belong "
                                "there)", fix)
            out[key] = r
        return out
