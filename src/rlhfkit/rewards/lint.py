"""The reward lint: each reward called on adversarial completions built from the run's own prompts, to show which
of them a reward pays for (a reward that pays for them can be hacked), before a single weight loads.

The completions, for each prompt (those marked * need the row's reference, ``answer`` by default):

=================== ================================================================================
``empty``           the empty string
``whitespace``      spaces, tabs and newlines only
``prompt_echo``     the prompt, copied back
``reference_only``  \\* the reference answer and nothing else
``format_only``     the common answer forms with nothing in them: ``\\boxed{}``, ``####``, ``<answer></answer>``,
                    an empty code block
``repetition``      one short phrase repeated to about 4,000 characters
``answer_repeated`` \\* the reference answer repeated (200 times, fewer for a long one)
``two_answers``     \\* the reference, then a second, different answer in the same form (``\\boxed{ref}`` ...
                    ``\\boxed{other}``, ``#### ref`` ... ``#### other``, "the answer is ref ... the answer is other")
``truncated``       \\* a worked answer cut in the middle of its final answer (references of 2 characters or more)
=================== ================================================================================

:func:`lint_rewards` scores them with the run's own :class:`~rlhfkit.rewards.functions.CombinedRewards` (the same
workers, limits and kwargs: the verifiers run in their time-limited workers, never in this process) and reports, per
function and for the weighted total, the mean score of each kind. It warns about the kinds the *total* (what the
policy is trained on) pays high: at least halfway from the low end (the lower quartile of the kinds' means) to the
highest mean it gave any kind. Two kinds are never warned about: ``reference_only`` and ``answer_repeated`` state
the right answer and nothing else, and a verifier that pays for a right answer is right (they stay in the table).
One function paying for a kind is not a warning either when the total does not (a format reward weighed 0.1 beside
a verifier pays for ``format_only`` by design). The empty (or whitespace-only) completion getting the highest total
of all the kinds while some kind gets less is said the loudest (a policy trained on it learns to say nothing), but a
reward may want it (a brevity reward): the lint never stops a run. Every warning names its off switch,
``reward.lint=false``; what is certainly a bug (a function that returns the wrong number of values, or strings) is
stopped by the probe before it (:meth:`~rlhfkit.rewards.functions.CombinedRewards.probe`), not by a judgment here.

The lint's calls (and the probe's) are calls on synthetic completions. A reward with side effects (a paid judge API,
a counter, a database write) is spared them with ``reward.functions[].lint=false`` (the remote judge is spared by
default: ``reward.remote.lint``); a function can also tell them apart itself: one that names a ``synthetic``
parameter gets ``synthetic=True`` on them (and never on a rollout's).

When nothing could be scored (every call timed out or failed, every value None / NaN / inf) the lint says so and
why, never that no completion scores high. Its time is bounded: each function's call is bounded by ``reward.timeout_s``
as a whole (retries included, :class:`~rlhfkit.rewards.functions.CombinedRewards`), and a function whose probe ran out
of time is not called again (a hanging reward costs the probe's ``timeout_s`` once before any weights load).

Given the run's ``reward.clip`` (and no ``reward.normalize``, which rescales the scores before the clip), the lint
also warns when half or more of its completions score at or beyond +-clip: the scores are then on another scale
than the clip, which ties them (a reward in characters, a reward model's logits against the default clip of 10).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import RewardError
from .loading import RewardFunctionError

KINDS = ("empty", "whitespace", "prompt_echo", "reference_only", "format_only", "repetition", "answer_repeated",
         "two_answers", "truncated")
RIGHT_ANSWER_KINDS = ("reference_only", "answer_repeated")  # the right answer alone: paying for it is no hack
FORMAT_SKELETONS = ("\\boxed{}", "#### ", "<think>\n</think>\n<answer>\n</answer>", "```python\n\n```")
REPEATED_CHARS = 20_000  # answer_repeated: about this many characters (200 repeats of a short answer)


def _other_answer(ref: str) -> str:
    """A different answer of the same kind: a whole number with its last digit changed (no integer conversion, so a
    5,000-digit reference costs nothing), a decimal plus one, else the reference with a letter added."""
    m = re.fullmatch(r"\s*(-?\d+)\s*", ref)
    if m:
        digits = m.group(1)
        return digits[:-1] + str((int(digits[-1]) + 1) % 10)
    try:
        other = float(ref) + 1.0
    except (ValueError, OverflowError):
        return ref + "x"
    return repr(other) if math.isfinite(other) else ref + "x"


def adversarial_completions(prompt: str, reference: str | None) -> list[tuple[str, str]]:
    """``(kind, completion)`` pairs for one prompt (module docstring); kinds that need a reference are left out
    when ``reference`` is None."""
    out = [("empty", ""), ("whitespace", "  \n\t \n "), ("prompt_echo", prompt)]
    out += [("format_only", skeleton) for skeleton in FORMAT_SKELETONS]
    out.append(("repetition", ("the answer is " * 300)[:4000]))
    if reference is not None:
        ref, other = reference, _other_answer(reference)
        out += [
            ("reference_only", ref),
            ("answer_repeated", "\n".join([ref] * max(2, min(200, REPEATED_CHARS // max(1, len(ref)))))),
            ("two_answers", f"The answer is \\boxed{{{ref}}}. Hmm, on second thought it is \\boxed{{{other}}}."),
            ("two_answers", f"#### {ref}\nWait, that is wrong.\n#### {other}"),
            ("two_answers", f"The answer is {ref}.\nNo, let me check again: the answer is {other}."),
        ]
        if len(ref) >= 2:  # a reference of one character has no middle to cut
            out.append(("truncated", f"Let me work it out step by step. So the final answer is "
                                     f"\\boxed{{{ref[: len(ref) // 2]}"))
    return out


@dataclass
class LintReport:
    """Per reward (each function, and ``total``): the mean score of each kind; ``high``: (reward, kind, mean) that
    score high; ``warnings``: other lines to say (an empty answer paid the most, scores beyond the clip);
    ``notes``: functions that failed on the lint's completions (judged on the first rollout instead), scored none of
    them, or were spared the lint's calls, and why. Nothing here stops a run."""

    means: dict[str, dict[str, float]] = field(default_factory=dict)
    high: list[tuple[str, str, float]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    scored: bool = False  # some completion got a finite total: the lint judged something

    def lines(self) -> list[str]:
        """The report as lines to print: a table of mean scores, then the warnings and notes."""
        kinds = [k for k in KINDS if any(k in m for m in self.means.values())]
        width = max([len(r) for r in self.means] + [6])
        out = ["reward lint: mean score of adversarial completions built from the run's prompts",
               " " * width + "  " + " ".join(f"{k[:10]:>10}" for k in kinds)]
        for reward, means in self.means.items():
            cells = " ".join(f"{_cell(means.get(k)):>10}" for k in kinds)
            out.append(f"{reward:<{width}}  {cells}")
        out += [f"warning: {w}" for w in self.warnings]
        for reward, kind, mean in self.high:
            out.append(f"warning: {reward} pays for {kind} completions (mean {mean:.3g}): a policy can learn that")
        out += [f"note: {n}" for n in self.notes]
        if self.high or self.warnings:
            out.append("note: warnings only, the run goes on; if the reward means it, reward.lint=false turns the lint "
                       "off (reward.functions[].lint=false spares one function its calls)")
        if not self.high and not self.warnings and self.scored:
            out.append("no adversarial completion scores high")
        return out


def _cell(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3g}"


def lint_rewards(combo, prompts: Sequence[str], rows: Sequence[dict], *, field: str = "answer",
                 max_prompts: int = 4, clip: float | None = None) -> LintReport:
    """Score the adversarial completions of the first ``max_prompts`` prompts with ``combo`` (a
    :class:`~rlhfkit.rewards.functions.CombinedRewards`) and judge them (module docstring); ``clip``: the run's
    ``reward.clip`` when its scores are clipped as they come (no ``reward.normalize``)."""
    batch_prompts, batch_rows, kinds = [], [], []
    for prompt, row in list(zip(prompts, rows))[:max_prompts]:
        ref = row.get(field)
        reference = None if ref is None else str(ref)
        if reference is not None and ("####" in reference or "\\boxed" in reference):
            from .maths import reference_answer

            reference = reference_answer(reference)
        for kind, completion in adversarial_completions(prompt, reference):
            batch_prompts.append(prompt)
            batch_rows.append((row, completion))
            kinds.append(kind)
    report = LintReport()
    if not kinds:
        return report
    completions = [c for _, c in batch_rows]
    hung = sorted(getattr(combo, "timed_out_on_probe", ()))  # the lint's time: never waited for twice
    for name in hung:
        report.notes.append(f"{name} ran out of time on the probe (reward.timeout_s): not called again by the lint")
    spared = [f for f in getattr(combo, "functions", ()) if not getattr(f, "lint", True)]
    for f in spared:
        report.notes.append(f"{f.name} is not called on the lint's completions (lint: false: a reward with side "
                            "effects); the first rollout checks it")
    try:
        scores = combo(batch_prompts, completions, [r for r, _ in batch_rows], allow_all_dropped=True, skip=hung,
                       synthetic=True)
    except RewardFunctionError as exc:
        report.notes.append(f"{exc.message} (on the lint's completions; the first rollout will judge it)")
        return report
    totals = [t if v else math.nan for t, v in zip(scores.total.tolist(), scores.valid.tolist())]
    columns = {name: values.tolist() for name, values in scores.per_function.items()
               if name not in {f.name for f in spared}}
    for name, values in columns.items():  # a function that scored none of them: say so, and why
        if not any(math.isfinite(v) for v in values) and name not in hung:
            report.notes.append(f"{name} scored none of the {len(values)} lint completions ("
                                f"{_why_unscored(name, scores.metrics)})")
    report.scored = any(math.isfinite(t) for t in totals)
    if not report.scored:
        report.notes.append("nothing was scored, so nothing was judged: no adversarial completion got a finite "
                            "total reward (see the notes above); raise reward.timeout_s if calls time out, and "
                            "call the reward on a few completions in Python")
    if len(columns) > 1:
        columns["total"] = totals
    total_name = "total" if "total" in columns else next(iter(columns))
    for reward, values in columns.items():
        means = _means(kinds, values)
        report.means[reward] = means
        finite = [m for m in means.values() if not math.isnan(m)]
        if reward != total_name or not finite or max(finite) - min(finite) < 1e-9:
            continue  # warnings judge the total, what the policy is trained on
        lo, hi = _low_end(finite), max(finite)
        report.high += [(reward, k, m) for k, m in means.items()
                        if not math.isnan(m) and m >= lo + 0.5 * (hi - lo) and k not in RIGHT_ANSWER_KINDS]
    scored = [t for t in totals if math.isfinite(t)]
    at_clip = sum(abs(t) >= clip for t in scored) if clip is not None else 0
    if scored and at_clip >= 0.5 * len(scored):
        report.warnings.append(f"{at_clip} of the {len(scored)} lint completions score at or beyond reward.clip="
                               f"{clip:g} (e.g. {scored[0]:.3g}): the clip ties such scores, so groups tie and nothing "
                               "is learned; raise reward.clip, set reward.normalize=true, or reward.clip=null")
    total = report.means[total_name]
    finite = {k: m for k, m in total.items() if not math.isnan(m)}
    if finite and max(finite.values()) > min(finite.values()) + 1e-9:
        top = max(finite.values())
        for kind in ("empty", "whitespace"):
            if kind in finite and finite[kind] >= top - 1e-9:
                report.warnings.insert(0, f"an {kind} completion gets the highest reward of all the lint's completions "
                                          f"({finite[kind]:.3g}, {total_name}): a policy trained on it learns to "
                                          "answer nothing, unless that is the reward's intent (a brevity reward)")
                report.high = [h for h in report.high if h[1] != kind]  # said once, above
                break
    return report


def _why_unscored(name: str, metrics: dict) -> str:
    """Why a function has no finite value for any lint completion, in a few words."""
    timeouts, errors = (int(metrics.get(f"rewards/{name}/{k}", 0)) for k in ("timeouts", "errors"))
    if timeouts or errors:
        return f"{timeouts} timed out, {errors} failed"
    return "every value it returned was None, NaN or inf"


def _low_end(means: list[float]) -> float:
    """The low end that "high" is measured from: the lower quartile of the kinds' means, not their minimum, so that
    one kind scored far below the rest (a 4,000-character repetition under a length reward: -48) does not make every
    other kind look high; the minimum where the quartile already is the top (most kinds paid the most)."""
    quartile = statistics.quantiles(means, n=4, method="inclusive")[0]
    return quartile if max(means) - quartile > 1e-9 else min(means)


def _means(kinds: list[str], values: list[float]) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for kind, v in zip(kinds, values):
        if v is not None and not math.isnan(v):
            sums.setdefault(kind, []).append(v)
        else:
            sums.setdefault(kind, [])
    return {k: (sum(v) / len(v) if v else math.nan) for k, v in sums.items()}


def lint_config(cfg, max_prompts: int = 4) -> LintReport:
    """The lint of an online config's reward functions (and remote judge) on the first ``max_prompts`` prompts of
    ``data.train``, with the run's workers and limits; what ``rlhfkit reward-lint CONFIG`` prints. No weights load
    (a reward model, if any, is not linted: only functions)."""
    from ..data import load_dataset_records
    from ..data.formats import message_text
    from .functions import rewards_from_config

    d = cfg.data
    if not d.train:
        raise RewardError("no prompts to build the lint's completions from", where="data.train",
                          fix="set data.train=path/to/prompts.jsonl")
    records = load_dataset_records(d.train, "prompt" if d.format == "auto" else d.format, fields=d.fields or None,
                                   split=d.split, limit=max_prompts)
    combo = rewards_from_config(cfg.reward)
    if combo is None:
        raise RewardError("no reward functions to lint", where="reward.functions",
                          fix="set reward.functions (a reward model is not linted)")
    with combo:
        prompts, rows = [message_text(r["prompt"][-1]["content"]) for r in records], [_fields(r) for r in records]
        combo.probe(prompts, rows)
        return lint_rewards(combo, prompts, rows, max_prompts=max_prompts, clip=clip_of(cfg.reward))


def clip_of(reward_cfg) -> float | None:
    """The clip the raw scores meet as they are (``reward.clip``), or None when ``reward.normalize`` rescales them
    first (or there is no clip)."""
    return None if reward_cfg.normalize else reward_cfg.clip


def _fields(record) -> dict:
    return {k: v for k, v in record.items() if k not in ("prompt", "media")}


def probe_rewards(combo, prompts: Sequence[str], rows: Sequence[dict], *, lint: bool = True, say=print,
                  max_prompts: int = 2, clip: float | None = None) -> LintReport | None:
    """What a run does with its reward functions before any weights load: set them up in their workers and check
    their output on placeholder completions (:meth:`~rlhfkit.rewards.functions.CombinedRewards.probe`: a certain bug,
    such as the wrong number of values, raises :class:`~rlhfkit.errors.RewardError`), then (with ``lint``) the reward
    lint on ``max_prompts`` prompts (``clip``: :func:`clip_of` the run's reward config): its warnings are printed
    with ``say``, never stopping the run. The workers are stopped when this raises."""
    try:
        combo.probe(list(prompts[:4]), list(rows[:4]))
        if not lint:
            return None
        report = lint_rewards(combo, prompts, rows, max_prompts=max_prompts, clip=clip)
        for line in report.lines()[2 + len(report.means):]:
            say(f"[reward lint] {line}")
        return report
    except BaseException:
        combo.close()
        raise
