""":class:`CombinedRewards`, the weighted sum of several reward functions (loaded by
:func:`~rlhfkit.rewards.loading.load_reward_function`) with per-function metrics, run in worker processes under a
time limit (:mod:`rlhfkit.rewards.workers`).

A reward function is called as ``fn(prompts, completions, **fields)`` (see :mod:`rlhfkit.rewards.rules`) and
returns one ``float`` or ``None`` per completion; ``None`` skips that function for that sample. A function written
for TRL's convention (``def f(completions, **kwargs)``, conversational completions as messages, ``completion_ids``,
``trainer_state``) is recognised by its signature and called TRL's way (:mod:`rlhfkit.rewards.trl_style`). A
callable no worker process can import (:func:`~rlhfkit.rewards.loading.spec_of`: ``python:<name>``) is called in
this process, under the same ``timeout_s`` (a timer signal that a reward's ``except Exception`` does not swallow;
``sys.exit`` inside it fails that call, not the run), said in one line when the functions start.

What a run does with what a function returns (:meth:`CombinedRewards.__call__`). One bad sample costs that sample,
never the run:

- NaN or inf for a sample, or a sample no function has a value for (``None`` from every function): that sample is
  *dropped* from the step (``valid`` is False, its total is 0, counted in ``rewards/dropped``), never propagated;
- ``timeout_s`` bounds one function's whole scoring of a batch (its chunks on the workers side by side, and every
  retry): a hanging reward costs at most ``timeout_s`` per call, never ``timeout_s`` per retry. A chunk that raises,
  or whose worker dies (a crash, the memory limit) or sends a reply that is not the wire's (killed and restarted),
  is made again sample by sample in the time left, so only the samples that fail alone get ``None`` from that
  function; the samples of a chunk that ran out of time get ``None`` (its time is spent). Counted in
  ``rewards/<name>/timeouts`` / ``rewards/<name>/errors`` (samples; said once per run in one line); the run goes on;
  ``rewards/<name>/time_s`` is the wall time the function took in the step;
- a call that returns the wrong shape (a list of the wrong length, a non-list, a string or other non-number in the
  list): its samples get ``None``, counted in ``rewards/<name>/errors``, the run goes on;
- a function that failed on *every* sample of a step, at least one by an error rather than the time limit (or a
  worker killed for a reply that is not the wire's: a program that reached the worker's pipe costs its sample, not
  the run): :class:`~rlhfkit.errors.RewardError` naming the function and what it returned, or
  :class:`RewardFunctionError` naming the function, the exception and the step (one line, exit 2: a function
  that never works is a bug, found on the first rollout);
- ``None`` (or NaN / inf, or failures) for every sample of a batch: ``RewardError`` (nothing to learn from, almost
  always a bug).

The first call (on the first rollout) is the check: it raises before a trainer writes anything, when the trainer
scores its first rollout before it touches the run directory. :meth:`CombinedRewards.probe` runs the same
structural checks on dataset prompts with placeholder completions, before any weights load.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import numbers
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from ..data.formats import message_text
from ..data.images import IMAGE_COLUMNS, as_pil
from ..errors import RewardError, UserError, say
from .loading import WHERE, RewardFunctionError, importable_name, is_in_process, load_reward_function
from .trl_style import EXTRA, LOGGED, TrlStyle, is_trl_style, keyword_callable, named_params, wanted_extra
from .workers import CallFailed, CallTimeout, WorkerPool, _alarm

# ───────────────────────────────────────────── combining ─────────────────────────────────────────────


@dataclass
class RewardFunctionSpec:
    """One reward function of a run: what to load, its weight in the total, its log name, its keyword options."""

    fn: str | Callable[..., list]
    weight: float = 1.0
    name: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    convention: str = "auto"  # rlhfkit | trl | auto (by the signature: rlhfkit.rewards.trl_style.is_trl_style)
    lint: bool = True  # called on the lint's and the probe's synthetic completions (false: it has side effects)


CONVENTIONS = ("auto", "rlhfkit", "trl")


def _as_spec(item: Any) -> RewardFunctionSpec:
    if isinstance(item, RewardFunctionSpec):
        return item
    if isinstance(item, str) or callable(item):
        return RewardFunctionSpec(fn=item)
    if isinstance(item, dict):
        return RewardFunctionSpec(**item)
    if hasattr(item, "fn"):  # e.g. rlhfkit.config.RewardFunction
        return RewardFunctionSpec(
            fn=item.fn,
            weight=getattr(item, "weight", 1.0),
            name=getattr(item, "name", None),
            kwargs=dict(getattr(item, "kwargs", None) or {}),
            convention=getattr(item, "convention", "auto"),
            lint=getattr(item, "lint", True),
        )
    raise TypeError(f"cannot make a reward function spec from {item!r}")


def _default_name(fn: str | Callable) -> str:
    if callable(fn):
        return getattr(fn, "__name__", type(fn).__name__)
    text = fn.strip()
    return text.rpartition(":")[2].rpartition(".")[2] or text


def _label(fn: str | Callable) -> str:
    if callable(fn):
        return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', _default_name(fn))}"
    return fn


@dataclass
class _Loaded:
    name: str
    label: str  # how the user wrote it, for error messages
    fn: str | Callable[..., Any]  # the spec string (loaded again in each worker) or the callable given
    weight: float
    reserved: frozenset  # field names that must not be passed (the spec's kwargs, the positional names)
    accepts: frozenset | None  # named parameters, or None when the function takes **fields
    kwargs: dict = field(default_factory=dict)  # bound to a function per call; a class's constructor arguments
    trl: frozenset | None = None  # TRL's convention: the per-call data it reads (completion_ids, messages)
    local: bool = False  # no worker can import it: called in this process (under the time limit)
    lint: bool = True  # called on synthetic completions (the lint, the probe)
    synthetic: bool = False  # it names a ``synthetic`` parameter: told so on those calls


def _to_float(value: Any, label: str, index: int, at: str = "") -> float | None:
    """One returned value as a float (NaN / inf kept: the caller drops those samples) or None."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        try:
            value = value.item()
        except (TypeError, ValueError):
            pass
    if not isinstance(value, numbers.Real):  # bools are accepted as 1.0 / 0.0
        raise RewardError(
            f"function {label} returned a {type(value).__name__} ({value!r:.40}) at index {index}{at}",
            where=WHERE,
            fix="return a list with one float (or None to skip the sample) per completion",
        )
    return float(value)


def _at(step: int | None) -> str:
    return "" if step is None else f" at step {step}"


class _Scores(NamedTuple):
    """What :class:`CombinedRewards` returns for a batch of B completions.

    total: [B] float32, the weighted sum (0 where not ``valid``); per_function: {name: [B] float32, NaN where the
    function gave None}; metrics: ``rewards/<name>/mean`` and ``/std`` (over valid samples with a value, TRL's
    names), ``rewards/none_frac``,
    ``rewards/dropped`` (number of samples dropped), and what TRL-style functions logged with ``log_metric`` (the
    mean of the values, under the name given); valid: [B] bool, False for the samples dropped from the step;
    extra: the ``log_extra`` columns.
    """

    total: torch.Tensor
    per_function: dict[str, torch.Tensor]
    metrics: dict[str, float]
    valid: torch.Tensor


class RewardScores(_Scores):
    """:class:`_Scores` (unpacked as the four it holds) with ``extra``: TRL's ``log_extra`` columns, one value per
    completion (None where not logged)."""

    extra: dict = {}


class CombinedRewards:
    """The weighted sum of reward functions, skipping ``None`` values and dropping samples without a finite value.

    ``total[b] = sum_f weight_f * r_f[b]`` over the functions with a value for sample ``b`` (a ``None`` contributes
    nothing). Sample ``b`` is dropped (``valid[b]`` False, total 0) when a function returned NaN / inf for it or no
    function gave it a value; see the module docstring for every other case.

    ``workers`` > 0: the functions run in that many worker processes (:class:`~rlhfkit.rewards.workers.WorkerPool`),
    each function's batch split into ``workers`` chunks called concurrently, each call bounded by ``timeout_s``; a
    class named as a function is built once per worker. ``workers`` = 0: called in this process, no time limit.
    Call :meth:`close` (or use ``with``) to stop the workers.
    """

    def __init__(self, specs: Sequence[RewardFunctionSpec | str | dict | Any], *, workers: int = 0,
                 timeout_s: float | None = None, conversational: bool = False):
        """``conversational``: the run's prompts are conversations (the data gave them as messages), so functions of
        TRL's convention get prompts and completions as messages."""
        specs = [_as_spec(s) for s in specs]
        if not specs:
            raise ValueError("CombinedRewards needs at least one reward function")
        self.functions: list[_Loaded] = []
        taken: set[str] = set()
        for spec in specs:
            label = _label(spec.fn)
            obj = spec.fn if callable(spec.fn) else load_reward_function(spec.fn)
            try:
                weight = float(spec.weight)
            except (TypeError, ValueError):
                weight = float("nan")
            if not math.isfinite(weight):
                raise RewardError(
                    f"function {label} has weight {spec.weight!r}", where=WHERE, fix="use a finite number"
                )
            call = _call_signature_of(obj)
            trl = _uses_trl_convention(label, obj, spec.convention)
            if not trl:
                _check_positional(label, call)
            kwargs = dict(spec.kwargs or {})
            if kwargs:
                _check_kwargs(label, obj if isinstance(obj, type) else call, kwargs)
            if spec.name:
                name = spec.name
                if name in taken:
                    raise RewardError(f"two reward functions are named {name!r}", where=WHERE,
                                      fix="give each function its own `name`")  # fmt: skip
            else:
                base = name = _default_name(spec.fn)
                k = 2
                while name in taken:
                    name, k = f"{base}_{k}", k + 1
            taken.add(name)
            target = spec.fn if isinstance(spec.fn, str) else obj
            local = workers > 0 and (is_in_process(spec.fn) or (not isinstance(spec.fn, str)
                                                                and importable_name(obj) is None))
            self.functions.append(
                _Loaded(
                    name=name,
                    label=label,
                    fn=TrlStyle(target, conversational, kwargs, label) if trl else target,
                    weight=weight,
                    reserved=(frozenset() if isinstance(obj, type) else frozenset(kwargs)) | {"prompts",
                                                                                               "completions"},
                    accepts=None if trl else named_params(call),
                    kwargs={} if trl else kwargs,
                    trl=frozenset(wanted_extra(obj)) if trl else None,
                    local=local,
                    lint=bool(spec.lint),
                    synthetic=_names_parameter(call, "synthetic"),
                )
            )
            if local:
                limit = (f"each call under reward.timeout_s={timeout_s:g} s (a timer signal)"
                         if timeout_s and _alarm.available() else "with no time limit (not on the main thread)")
                say(f"[reward] {label} cannot be imported by a worker process (defined in __main__, a lambda or a "
                    f"closure): it runs in this process, {limit}; put it in a module or file to run it in the "
                    "workers")
        self.pool = WorkerPool(workers, timeout_s)
        self.local_pool = WorkerPool(0, timeout_s, limit_local=True)
        self._ready = False
        self._told: set[str] = set()  # functions whose failure on some samples was said (once per run)
        self.timed_out_on_probe: set[str] = set()  # names of the functions whose probe call ran out of time

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.functions]

    def start(self) -> None:
        """Set every function up (in each worker): imports, and the constructors of reward classes. A constructor
        that fails, or a worker that cannot start, is one :class:`RewardError` line."""
        if self._ready:
            return
        for f in self.functions:
            try:
                self._pool(f).setup(f.name, f.fn, f.kwargs, f.label)
            except (CallFailed, CallTimeout) as exc:
                raise RewardError(f"reward function {f.label} could not be set up in a worker process ({exc})",
                                  where=WHERE, fix="import it in Python to see the error, or set reward.workers=0 "
                                  "to call it in the trainer's process") from None
        self._ready = True

    def _pool(self, f: _Loaded) -> WorkerPool:
        return self.local_pool if f.local else self.pool

    def close(self) -> None:
        self.pool.close()
        self._ready = False

    def __enter__(self) -> CombinedRewards:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], rows: Sequence[dict], *, step: int | None = None,
        allow_all_dropped: bool = False, messages: Sequence[list] | None = None, rollout: Any = None,
        max_steps: int | None = None, trainer_state: tuple | None = None, group: int = 1, synthetic: bool = False,
        skip: Collection[str] = (),
    ) -> RewardScores:
        """Score ``completions`` -> :class:`RewardScores` (total, per_function, metrics, valid).

        ``rows`` are the dataset records of the prompts (their columns become the functions' ``**fields``);
        ``step`` (optional) is named in errors. For functions of TRL's convention: ``messages`` (each prompt's
        messages), ``rollout`` (its ``response_ids`` / ``lengths`` give ``completion_ids``, computed only when a
        function reads them), ``trainer_state`` (``(global_step, max_steps, epoch)`` as TRL counts them; without
        it, ``step`` and ``max_steps``). ``group``: completions per prompt: a batch split over the workers is split
        between groups, never inside one (a function of TRL's convention, or one run in this process, gets the
        whole batch in one call, as TRL calls it). ``synthetic``: the completions are the lint's, not a policy's:
        functions with ``lint`` false are not called (None), those naming ``synthetic`` get ``synthetic=True``.
        Raises :class:`RewardError` /
        :class:`RewardFunctionError` as the module docstring says (``allow_all_dropped``: a batch without any valid
        sample is returned, not an error — for evaluation, whose batches may be a single prompt); never returns a
        non-finite total. ``skip``: names of functions not called this time (counted as timed out: the lint skips
        those whose probe ran out of time, :attr:`timed_out_on_probe`, rather than wait for them again).
        """
        B = len(completions)
        if len(prompts) != B or len(rows) != B:
            raise ValueError(f"got {len(prompts)} prompts, {B} completions and {len(rows)} rows")
        extra = {"messages": None if messages is None else list(messages), "rollout": rollout, "step": step,
                 "max_steps": max_steps, "trainer_state": trainer_state}
        self._group, self._logged, self._synthetic = max(1, int(group)), ({}, {}), synthetic
        outputs, metrics = self._call_each(list(prompts), list(completions), list(rows), step, extra, skip)
        total = torch.zeros(B, dtype=torch.float32)
        covered = torch.zeros(B, dtype=torch.bool)
        finite = torch.ones(B, dtype=torch.bool)
        per_function: dict[str, torch.Tensor] = {}
        for f, values in zip(self.functions, outputs):
            present = torch.tensor([v is not None for v in values], dtype=torch.bool)
            scores = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float32)
            per_function[f.name] = scores
            bad = present & ~torch.isfinite(scores)
            finite &= ~bad
            total += f.weight * torch.where(present & ~bad, scores, torch.zeros_like(scores))
            covered |= present
        valid = covered & finite
        if B and not valid.any() and not allow_all_dropped:
            what = ", ".join(f"{f.label} -> {_summary(v)}{self._failures(f, metrics)}"
                             for f, v in zip(self.functions, outputs))
            raise RewardError(f"no completion of the batch{_at(step)} got a finite reward ({what})", where=WHERE,
                              fix="return a float for (most) completions; None only for those a function cannot "
                                  "judge; raise reward.timeout_s if calls time out")
        total = torch.where(valid, total, torch.zeros_like(total))
        for f in self.functions:
            scores = per_function[f.name]
            kept = valid & ~torch.isnan(scores)
            if kept.any():
                metrics[f"rewards/{f.name}/mean"] = float(scores[kept].mean())
                metrics[f"rewards/{f.name}/std"] = float(scores[kept].std()) if int(kept.sum()) > 1 else 0.0
        metrics["rewards/none_frac"] = float((~covered).float().mean()) if B else 0.0
        metrics["rewards/dropped"] = float((~valid).sum())
        logged, columns = self._logged
        metrics.update({name: sum(v) / len(v) for name, v in logged.items() if v})  # TRL's log_metric: the mean
        out = RewardScores(total, per_function, metrics, valid)
        out.extra = {k: v[:B] for k, v in columns.items()}
        return out

    def of_rows(self, rows: Sequence[dict], completions: Sequence[str], rollout: Any = None, **kwargs) -> RewardScores:
        """Score the completions of the prompt records ``rows`` (``{"prompt": messages, **columns}``, one per
        completion): the prompts as their last message's text (rlhfkit's convention) and as messages (TRL's), the
        other columns as fields; ``rollout`` gives TRL's ``completion_ids``; ``kwargs`` as :meth:`__call__`."""
        messages = [row["prompt"] for row in rows]
        fields = [{k: v for k, v in row.items() if k not in ("prompt", "media")} for row in rows]
        return self([message_text(m[-1]["content"]) for m in messages], completions, fields, messages=messages,
                    rollout=rollout,
                    **kwargs)

    @staticmethod
    def _failures(f: _Loaded, metrics: dict) -> str:
        t, e = metrics.get(f"rewards/{f.name}/timeouts", 0), metrics.get(f"rewards/{f.name}/errors", 0)
        return f" ({int(t)} samples timed out, {int(e)} failed)" if t or e else ""

    def probe(self, prompts: Sequence[str], rows: Sequence[dict], completions: Sequence[str] | None = None) -> None:
        """Structural check before any weights load: each function is set up (in its workers) and called on dataset
        prompts with placeholder completions (default: the empty string); it must return a list of one number /
        None per completion. Wrong length, a non-list, strings, a :class:`RewardError` raised by the function (a
        built-in rule missing an option), a constructor or worker that fails: :class:`RewardError`. Other
        exceptions, timeouts and None / NaN are *not* errors here (a function may legitimately fail on a
        placeholder); the first real rollout checks those."""
        completions = list(completions) if completions is not None else [""] * len(prompts)
        self.start()
        for f in self.functions:
            if not f.lint:  # spared synthetic calls (side effects): the first rollout checks it
                continue
            fields = {**self._fields(f, rows), **({"synthetic": True} if f.synthetic else {})}
            [outcome] = self._pool(f).map(f.name, [((list(prompts), completions), fields)])
            if isinstance(outcome.error, CallTimeout):
                self.timed_out_on_probe.add(f.name)
            if isinstance(outcome.error, RewardError):
                raise outcome.error
            if outcome.ok:
                self._logged = ({}, {})  # what a probe logs is not the run's
                value = self._take_logs(outcome.value, list(range(len(completions))), len(completions))
                self._validate(f.label, value, len(completions), "on a probe with placeholder completions")

    @staticmethod
    def _fields(f: _Loaded, rows: Sequence[dict]) -> dict[str, list]:
        """The dataset columns ``f`` takes, as lists over ``rows`` (missing values None)."""
        names: dict[str, None] = {}
        for row in rows:
            names.update(dict.fromkeys(row))
        # images arrive as PIL images (TRL's convention: the image / images column in **kwargs)
        return {k: [as_pil(row.get(k)) if k in IMAGE_COLUMNS else row.get(k) for row in rows] for k in names
                if k not in f.reserved and k != "media" and (f.accepts is None or k in f.accepts)}

    def _chunks(self, B: int, f: _Loaded | None = None) -> list[list[int]]:
        """The calls a batch of ``B`` goes out in: one for a function run in this process or of TRL's convention
        (the whole generation batch, as TRL calls it); else one per worker, each with whole groups: the batch is
        completion-major (``k`` = ``group`` responses of ``P`` prompts: sample ``i + j P``), a call gets its
        prompts' ``k`` responses each, completion-major too."""
        if f is not None and (f.local or f.trl is not None or self.pool.n <= 1):
            return [list(range(B))] if B else []
        k = getattr(self, "_group", 1)
        k = k if k > 0 and B % k == 0 else 1
        prompts = B // k
        n = max(1, min(self.pool.n, prompts))
        bounds = [round(i * prompts / n) for i in range(n + 1)]
        return [[i + j * prompts for j in range(k) for i in range(a, b)] for a, b in zip(bounds, bounds[1:])]

    def _call_each(self, prompts: list, completions: list, rows: list, step: int | None, extra: dict | None = None,
                   skip: Collection[str] = ()):
        """Each function on the batch (in chunks over the workers) -> (values per function, metrics: time_s,
        timeouts, errors per function, in samples). One bad sample costs that sample: see :meth:`_score`. A
        function that failed on every sample, at least one by an error (not a time limit), stops the run with
        one line (its first error)."""
        self.start()
        outputs, metrics = [], {}
        ids = None
        for f in self.functions:
            if getattr(self, "_synthetic", False) and not f.lint:  # spared the lint's calls: no value, no call
                outputs.append([None] * len(completions))
                continue
            t0 = time.perf_counter()
            if f.trl is not None and extra and ids is None and "completion_ids" in f.trl \
                    and extra.get("rollout") is not None:
                ids = _completion_ids(extra["rollout"])
            trl = None if f.trl is None or not extra else {
                "messages": extra.get("messages"), "completion_ids": ids if "completion_ids" in f.trl else None,
                "step": extra.get("step"), "max_steps": extra.get("max_steps"),
                "trainer_state": extra.get("trainer_state")}
            if f.name in skip:  # not called (the lint, for a function whose probe ran out of time): timed out
                values = [None] * len(completions)
                failed = dict.fromkeys(range(len(completions)), CallTimeout("not called"))
            else:
                values, failed = self._score(f, prompts, completions, rows, step, trl)
            metrics[f"rewards/{f.name}/time_s"] = time.perf_counter() - t0
            timeouts = sum(isinstance(e, CallTimeout) for e in failed.values())
            errors = len(failed) - timeouts
            metrics[f"rewards/{f.name}/timeouts"] = float(timeouts)
            metrics[f"rewards/{f.name}/errors"] = float(errors)
            own = [e for e in failed.values() if not isinstance(e, CallTimeout) and not _forged(e)]
            if own and len(failed) == len(completions):  # every sample failed, by its own errors: almost always a bug
                first = own[0]
                if isinstance(first, RewardError):  # what it returned (the wrong length, a string)
                    raise first
                raise RewardFunctionError(
                    f"reward function {f.label} {'raised ' + first.kind if first.kind != 'died' else 'crashed'}"
                    f"{': ' + first.message if first.message else ''}{_at(step)}", where=WHERE,
                    fix="fix the function (call it on these completions in Python to see the traceback), or "
                        "return None for completions it cannot judge")
            if failed and f.name not in self._told and f.name not in skip:
                self._told.add(f.name)
                first = next(iter(failed.values()))
                say(f"[reward] warning: {f.label} failed on {len(failed)} of {len(completions)} samples"
                    f"{_at(step)} ({_reason(first)}): those samples are dropped and counted in "
                    f"rewards/{f.name}/errors and /timeouts (said once)")
            outputs.append(values)
        return outputs, metrics

    def _score(self, f: _Loaded, prompts: list, completions: list, rows: list, step: int | None,
               trl: dict | None = None):
        """``f`` on the batch -> (one value or None per sample, {sample index: what made it fail}).

        The batch goes out in chunks (one per worker), all of it, retries included, within one ``timeout_s`` from
        here. A chunk that raised or lost its worker is called again sample by sample (side by side on the workers)
        in the time left, so the one sample that crashes or raises loses its own value only; a chunk that ran out of
        time loses its samples (no time is left to find the one that hangs); a call that returned the wrong shape
        (a list of the wrong length, a string) loses its chunk. A :class:`~rlhfkit.errors.UserError` the function
        raised itself (a built-in rule missing an option) stops the run at once. ``trl``: TRL's per-call data of a
        TRL-style function (each list cut to the call's samples)."""
        fields = self._fields(f, rows)
        self._pool(f).revive()  # workers killed at the last call restart now, outside this call's time
        deadline = time.perf_counter() + self.pool.timeout_s if self.pool.timeout_s else None

        def job(idx: list[int]) -> tuple[tuple, dict]:
            kwargs = {k: [v[i] for i in idx] for k, v in fields.items()}
            if f.synthetic and getattr(self, "_synthetic", False):
                kwargs["synthetic"] = True
            if trl is not None:
                kwargs[EXTRA] = {k: [v[i] for i in idx] if isinstance(v, list) else v for k, v in trl.items()}
            return ([prompts[i] for i in idx], [completions[i] for i in idx]), kwargs

        values: list[float | None] = [None] * len(completions)
        failed: dict[int, Exception] = {}
        todo, alone = self._chunks(len(completions), f), False
        while todo:
            retry = []
            for idx, outcome in zip(todo, self._pool(f).map(f.name, [job(c) for c in todo], deadline=deadline)):
                if isinstance(outcome.error, UserError):
                    raise outcome.error
                error = outcome.error
                if error is None:
                    value = self._take_logs(outcome.value, idx, len(completions))
                    try:
                        got = self._validate(f.label, value, len(idx), _at(step).strip())
                    except RewardError as exc:
                        error = exc
                    else:
                        for i, v in zip(idx, got):
                            values[i] = v
                        continue
                if isinstance(error, CallFailed) and len(idx) > 1 and not alone:  # timed out: its time is spent
                    retry += [[i] for i in idx]
                else:
                    failed.update(dict.fromkeys(idx, error))
            todo, alone = retry, True
        return values, failed

    def _take_logs(self, value: Any, idx: list[int], n: int) -> Any:
        """A TRL-style call's scores, its ``log_metric`` values and ``log_extra`` columns kept for the batch
        (:data:`~rlhfkit.rewards.trl_style.LOGGED`; a column of the call's length goes to its samples)."""
        if not (isinstance(value, tuple) and len(value) == 4 and value[0] == LOGGED):
            return value
        _, scores, metrics, columns = value
        logged, extra = getattr(self, "_logged", ({}, {}))
        for name, values in (metrics.items() if isinstance(metrics, dict) else ()):
            logged.setdefault(str(name), []).extend(float(v) for v in values if isinstance(v, (int, float)))
        for column, values in (columns.items() if isinstance(columns, dict) else ()):
            cells = extra.setdefault(str(column), [None] * n)
            if isinstance(values, (list, tuple)) and len(values) == len(idx):
                for i, v in zip(idx, values):
                    cells[i] = v if isinstance(v, (str, int, float, bool)) or v is None else str(v)
        return scores

    @staticmethod
    def _validate(label: str, out: Any, n: int, when: str = "") -> list[float | None]:
        at = f" {when}" if when else ""
        if isinstance(out, torch.Tensor) or type(out).__module__ == "numpy":
            out = out.tolist() if hasattr(out, "tolist") else out
        if not isinstance(out, (list, tuple)):
            raise RewardError(
                f"function {label} returned a {type(out).__name__} ({out!r:.40}), not a list{at}",
                where=WHERE,
                fix="return a list with one float (or None) per completion",
            )
        if len(out) != n:
            raise RewardError(
                f"function {label} returned {len(out)} values for {n} completions{at}",
                where=WHERE,
                fix="return exactly one value per completion (None to skip one)",
            )
        return [_to_float(v, label, i, at) for i, v in enumerate(out)]


def _forged(error: Exception) -> bool:
    """A call lost to a worker killed for a reply that is not the wire's (a program that reached its pipe)."""
    return isinstance(error, CallFailed) and error.kind == "bad reply"


def _reason(error: Exception) -> str:
    """One failure in a few words: "timed out", "raised KeyError: 'x'", "crashed", "returned 3 values for 4 ..."."""
    if isinstance(error, CallTimeout):
        return "timed out"
    if isinstance(error, CallFailed):
        return "crashed" if error.kind == "died" else f"raised {error.kind}" + (f": {error.message}"[:200]
                                                                                if error.message else "")
    return getattr(error, "message", str(error))[:200]


def _completion_ids(rollout) -> list[list[int]]:
    """Each response's token ids up to its end (TRL's ``completion_ids``)."""
    ids, lengths = rollout.response_ids.cpu().tolist(), rollout.lengths.cpu().tolist()
    return [row[:n] for row, n in zip(ids, lengths)]


def _summary(values: list[float | None]) -> str:
    """What a function returned for a batch, in a few words: "None x 8", "nan x 3, None x 5"."""
    counts: dict[str, int] = {}
    for v in values:
        key = "None" if v is None else ("a number" if math.isfinite(v) else repr(v))
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{k} x {n}" for k, n in counts.items())


def _uses_trl_convention(label: str, obj: Callable, convention: str) -> bool:
    """``convention`` (``reward.functions[].convention``) resolved for ``obj``: ``auto`` by its signature; ``trl``
    holds only a signature TRL can call (keywords by name, or ``(prompts, completions, ...)``)."""
    if convention not in CONVENTIONS:
        raise RewardError(f"function {label} has convention {convention!r}", where=WHERE,
                          fix=f"use one of {', '.join(CONVENTIONS)}")
    if convention == "auto":  # an async function is TRL's (rlhfkit's convention has none): called through its wrapper
        return is_trl_style(obj) or (inspect.iscoroutinefunction(obj) and keyword_callable(obj))
    if convention == "rlhfkit":
        return False
    if keyword_callable(obj):
        return True
    raise RewardError(f"function {label} cannot be called with TRL's keywords (it names neither prompts nor "
                      "completions)", where=WHERE, fix="name its parameters as TRL does (prompts, completions, "
                      "**kwargs), or set its convention to rlhfkit")


def _names_parameter(fn: Callable, name: str) -> bool:
    """``fn`` has a parameter called ``name`` (whatever else it takes)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _check_positional(label: str, fn: Callable) -> None:
    """``fn`` must take (prompts, completions) positionally: a function written for one argument is answered when
    the run starts, not as a TypeError on the first rollout."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2:
        names = ", ".join(p.name for p in params) or "no parameters"
        raise RewardError(f"function {label} takes ({names}), not (prompts, completions, **fields)", where=WHERE,
                          fix="define it as def fn(prompts, completions, **fields) -> list[float | None]")


def _check_kwargs(label: str, fn: Callable, kwargs: dict) -> None:
    """The configured ``kwargs`` must be parameters of ``fn`` (unless it takes ``**kwargs``): a misspelt option is
    answered when the run starts, not as a TypeError on the first rollout."""
    accepted = named_params(fn)
    if accepted is None:
        return
    for key in kwargs:
        if key not in accepted:
            close = difflib.get_close_matches(key, sorted(accepted - {"prompts", "completions"}), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise RewardError(f"function {label} has no parameter {key!r} (given in kwargs)", where=WHERE,
                              fix=f"{hint}pass only the function's own keyword arguments")


def _call_signature_of(obj: Callable) -> Callable:
    """What a run calls: the function itself, or for a class the ``__call__`` of its instances (bound to nothing:
    the signature is read without ``self``)."""
    if isinstance(obj, type):
        call = next((vars(k)["__call__"] for k in obj.__mro__ if "__call__" in vars(k)), None)
        if call is None:
            raise RewardError(f"reward class {_label(obj)} has no __call__", where=WHERE,
                              fix="define __call__(self, prompts, completions, **fields) -> list[float | None]")
        return functools.partial(call, None)
    return obj



def rewards_from_config(rc, records: Sequence[dict] = ()) -> CombinedRewards | None:
    """The run's reward functions from its ``reward`` section: ``reward.functions`` plus the remote judge when
    ``reward.remote.url`` is set (as the function ``remote_judge`` named ``reward.remote.name``, weight
    ``reward.remote.weight``), run on ``reward.workers`` workers under ``reward.timeout_s``; None without any. The
    code sandbox's level is decided here, once (:func:`~rlhfkit.rewards.code.settle_sandboxes`). ``records``: the
    run's prompt records; when their data gave the prompts as messages (:func:`rlhfkit.data.sources.is_conversational`),
    TRL-style functions get conversational completions. The caller closes it (its workers stop) when the run ends."""
    from .code import settle_sandboxes

    specs = settle_sandboxes(list(rc.functions), getattr(rc, "sandbox", None))  # the sandbox's one line, or refusal
    remote = getattr(rc, "remote", None)
    if remote is not None and remote.url:
        kwargs = {k: getattr(remote, k) for k in remote.__dataclass_fields__ if k not in ("weight", "name")}
        kwargs.pop("lint", None)
        specs.append(RewardFunctionSpec("remote_judge", weight=remote.weight, name=remote.name, kwargs=kwargs,
                                        lint=getattr(remote, "lint", False)))
    if not specs:
        return None
    from ..data.sources import is_conversational

    return CombinedRewards(specs, workers=rc.workers, timeout_s=rc.timeout_s,
                           conversational=is_conversational(records))
