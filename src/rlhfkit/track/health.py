"""Health checks that explain bad training dynamics in one line: what is wrong, the likely cause, the knob.

Each rule is a pure function over this step's metrics (TRL names) and the values seen at earlier checks
(``history``: metric -> every earlier finite value, oldest first), returning a message or None. Rules over the
generated texts (repetition, gibberish) are pure functions over the responses of one step. ``HealthMonitor``
runs them all, keeps each distinct warning to at most once every ``repeat_every`` steps, and (``report``) prints
each as one line, appends it to ``run_dir/warnings.jsonl`` as ``{"step", "name", "severity", "knob",
"message"}``, and, with ``stop_on_critical``, raises :class:`CriticalHealthStop` on a critical one (the CLI
prints it as one line, exit 2). The knobs named are keys of ``rlhfkit.config``.

The thresholds are heuristics, chosen to stay silent on the healthy runs of the tests and the quickstart and to
fire on the collapse of issue 12 (GRPO at lr 3e-2: KL 70-82 nats, scores falling to 0) and on the finite divergence
of issue 21 (SFT, RM, DPO and GRPO at lr 1). The main ones (KL, response length, text, reward hacking, tied groups,
loss and gradient bounds) are constructor arguments of ``HealthMonitor``; the others are constants in their rule.
The supervised recipes (SFT, RM, the offline preference losses) run the same monitor on their ``train/loss``,
``eval/loss`` and ``train/grad_norm``; a rule whose metrics a recipe does not log stays silent.
"""

from __future__ import annotations

import math
import re
import statistics
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from ..errors import UserError
from .collapse import reward_collapse
from .console import format_number as fmt
from .console import get_console
from .jsonl import JsonlWriter, StagedFile, read_jsonl

DRIFT_FIX = ("lower optim.lr or algo.ppo_epochs, or tighten the clip range in the policy loss's section "
             "(algo.<section>.clip_low / clip_high, e.g. algo.ppo.clip_low)")
WARNING, CRITICAL = "warning", "critical"
History = Mapping[str, Sequence[float]]


class CriticalHealthStop(UserError):
    """A critical health warning with ``track.stop_on_critical=true``: the run stops (one line, exit 2)."""


@dataclass(frozen=True)
class HealthWarning:
    """One warning: the step, the rule's name, ``warning`` or ``critical``, the knob to turn, the message."""

    step: int
    name: str
    severity: str
    knob: str
    message: str

    def line(self) -> str:
        return f"step {self.step}: {self.message}"


# ── rules over metrics: (metrics of this step, history, monitor) -> message or None ─────────────────────────────


def ratio_out_of_range(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    r = m.get("val/ratio")
    if r is not None and not 0.5 <= r <= 2.0:
        return (f"val/ratio={fmt(r)} is outside [0.5, 2.0]: the policy moved too far from the rollout policy; "
                f"{DRIFT_FIX}")
    return None


def approxkl_spike(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    kl, history = m.get("policy/approxkl_avg"), prev.get("policy/approxkl_avg", [])
    if kl is None or len(history) < 3:
        return None
    median = statistics.median(history[-50:])
    if kl > 0.01 and kl > 5 * median:
        return (
            f"policy/approxkl_avg={fmt(kl)} jumped above 5x its running median {fmt(median)}: "
            f"one update moved the policy too far from the rollout policy; {DRIFT_FIX}"
        )
    return None


def value_loss_rising(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    loss = m.get("loss/value_avg")
    if loss is None or not math.isfinite(loss):
        return None
    recent = list(prev.get("loss/value_avg", []))[-(mon.window - 1):] + [loss]
    if len(recent) < mon.window:
        return None
    increasing = all(a < b for a, b in zip(recent, recent[1:]))
    if increasing and recent[-1] > 2 * recent[0]:
        return (
            f"loss/value_avg rose for {mon.window} checks ({fmt(recent[0])} -> {fmt(recent[-1])}): "
            "the critic is diverging; lower critic.lr, set algo.value_clip (e.g. 0.2), or enable reward.normalize"
        )
    return None


def eos_fraction(m: Mapping[str, float], batch_size: int | None) -> float | None:
    """The fraction of responses that ended with EOS: ``val/eos_frac``, else ``val/num_eos_tokens / batch``."""
    frac = m.get("val/eos_frac")
    if frac is None and m.get("val/num_eos_tokens") is not None and batch_size:
        frac = m["val/num_eos_tokens"] / batch_size
    return frac


def few_eos(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    frac = eos_fraction(m, mon.batch_size)
    if frac is not None and 0 < frac < 0.1:
        return (
            f"only {frac:.0%} of responses end with EOS: almost all are cut at the length limit and scored "
            "unfinished; raise generation.max_new_tokens, or set reward.missing_eos_penalty"
        )
    return None


def all_truncated(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    frac = eos_fraction(m, mon.batch_size)
    if frac is not None and frac == 0:
        return ("every response was cut at generation.max_new_tokens (none ended with EOS): the scores judge "
                "unfinished text; raise generation.max_new_tokens, or set reward.missing_eos_penalty")
    return None


def negative_kl(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    kl = m.get("objective/kl")
    if kl is None:
        return None
    # a negative batch mean is often sampling noise of the k1 estimator on small batches; three negative
    # steps in a row with a negative running mean are not
    recent = (list(prev.get("objective/kl", [])) + [kl])[-mon.window:]
    mean = sum(recent) / len(recent)
    if len(recent) >= 3 and mean < -0.01 and all(v < 0 for v in recent[-3:]):
        return (
            f"objective/kl averaged {fmt(mean)} over the last {len(recent)} steps: negative; "
            "the sampling config differs between rollout and scoring "
            "(temperature/top_p/top_k); use algo.kl.estimator=k3 or check generation.temperature"
        )
    return None


def kl_spike(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """KL to the reference above ``mon.kl_factor`` x its running median (and above ``mon.kl_floor`` nats)."""
    kl, history = m.get("objective/kl"), list(prev.get("objective/kl", []))[-50:]
    median = _jump_over(kl, history if len(history) >= 3 else [], mon.kl_factor, mon.kl_floor)
    if median is not None:
        return (f"objective/kl={fmt(kl)} nats is {kl / median:.0f}x its running median {fmt(median)}: the policy is "
                "running away from the reference; lower optim.lr, raise algo.kl.coef (or set algo.kl.adaptive=true)")
    return None


def _jump_over(value: float | None, history: list[float], factor: float, floor: float) -> float | None:
    """The median of ``history`` when ``value`` is finite, above ``factor`` x that (positive) median and above
    ``floor``; None otherwise (and for an empty history)."""
    if value is None or not math.isfinite(value) or not history:
        return None
    median = statistics.median(history)
    return median if median > 0 and value > factor * median and value > floor else None


def _kl_above(m: dict[str, float], mon: HealthMonitor, floor: float, ceiling: float, what: str) -> str | None:
    """KL to the reference in (``floor``, ``ceiling``] nats per response and, when the response length is logged,
    above ``mon.kl_token_max`` nats per token (long responses with a moderate per-token KL do not trip it): the
    message, ``what`` saying how far the policy went; None otherwise. :func:`kl_blowup` and :func:`kl_high`."""
    kl = m.get("objective/kl")
    if kl is None or not math.isfinite(kl) or not floor < kl <= ceiling:
        return None
    length = m.get("response/length_mean")
    per_token = kl / length if length else None
    if per_token is not None and per_token <= mon.kl_token_max:
        return None
    per = f" ({fmt(per_token)} per token)" if per_token is not None else ""
    return (f"objective/kl={fmt(kl)} nats{per} is above {fmt(floor)} nats: {what}; lower optim.lr, raise "
            "algo.kl.coef (or set algo.kl.adaptive=true)")


def kl_blowup(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """KL to the reference above ``mon.kl_max`` nats per response (and ``mon.kl_token_max`` per token)."""
    return _kl_above(m, mon, mon.kl_max, math.inf, "the policy has run away from the reference")


def kl_per_token(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """KL to the reference above ``mon.kl_token_warn`` nats per token (``objective/kl / response/length_mean``)
    while the response total is still at most ``mon.kl_warn`` (above it :func:`kl_high`, above ``mon.kl_max``
    :func:`kl_blowup` speaks, each naming the per-token KL: one warning per step): on short responses a few nats
    per token is a policy far from its reference long before the total looks large."""
    kl, length = m.get("objective/kl"), m.get("response/length_mean")
    if kl is None or not length or not math.isfinite(kl) or kl > mon.kl_warn:
        return None
    per_token = kl / length
    if per_token > mon.kl_token_warn:
        return (f"objective/kl={fmt(kl)} nats over {fmt(length)} tokens is {fmt(per_token)} nats per token (above "
                f"{fmt(mon.kl_token_warn)}): the policy has moved far from the reference; raise algo.kl.coef or "
                "lower optim.lr")
    return None


def length_growth(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """Mean response length above ``mon.length_growth`` x its early level (the median of the first ``window``
    checks): responses growing several-fold usually chase the reward (or a loss aggregation that favours length)."""
    length, early = m.get("response/length_mean"), list(prev.get("response/length_mean", []))[: mon.window]
    start = _jump_over(length, early if len(early) >= mon.window else [], mon.length_growth, 0.0)
    if start is not None:
        return (f"mean response length {fmt(length)} tokens is {length / start:.1f}x its early {fmt(start)}: the "
                "policy is lengthening its answers (often reward hacking); read the samples, raise algo.kl.coef, or "
                "use algo.loss_aggregation=seq_mean_token_sum_norm / algo.overlong")
    return None


def token_entropy(m: Mapping[str, float]) -> float | None:
    """Mean per-token entropy: ``policy/entropy_avg``, else ``objective/entropy / response/length_mean``."""
    if m.get("policy/entropy_avg") is not None:
        return m["policy/entropy_avg"]
    seq, length = m.get("objective/entropy"), m.get("response/length_mean")
    if seq is not None and length:
        return seq / length
    return None


def entropy_collapse(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """Per-token entropy below 10% of its early level (the highest of the first ``window`` checks, so a collapse
    inside the first checks still counts) and below 0.1 nats."""
    ent, early = token_entropy(m), list(prev.get("entropy/token", []))[: mon.window]
    if ent is None or len(early) < mon.window:
        return None
    start = max(early)
    if ent < 0.1 * start and ent < 0.1:
        return (f"per-token entropy {fmt(ent)} fell from {fmt(start)}: the policy became near-deterministic and "
                "explores no more; lower optim.lr, raise algo.entropy_coef or algo.kl.coef")
    return None


def entropy_explosion(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """Per-token entropy at least 1 nat above its early median and either above 3x it, or (``mon.vocab_size`` known)
    within 10% of the uniform value ln |V|, the most a distribution over |V| tokens can have (on a small vocabulary
    3x the start may lie above ln |V| and could never be reached): the outputs turn to noise."""
    ent, early = token_entropy(m), list(prev.get("entropy/token", []))[: mon.window]
    if ent is None or not math.isfinite(ent) or len(early) < mon.window:
        return None
    start = statistics.median(early)
    uniform = math.log(mon.vocab_size) if mon.vocab_size and mon.vocab_size > 1 else None
    if ent - start <= 1.0:
        return None
    if uniform is not None and ent >= 0.9 * uniform:
        return (f"per-token entropy {fmt(ent)} rose from {fmt(start)} to near the uniform value ln |V| = "
                f"{fmt(uniform)}: the policy samples every token almost alike (noise); lower optim.lr or "
                "algo.entropy_coef, raise algo.kl.coef")
    if ent > 3 * start:
        return (f"per-token entropy {fmt(ent)} rose from {fmt(start)}: the policy is turning to noise; "
                "lower optim.lr or generation.temperature, raise algo.kl.coef")
    return None


def kl_high(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """KL to the reference above ``mon.kl_warn`` (10) nats per response and, when the response length is logged,
    above ``mon.kl_token_max`` (0.2) nats per token, but not above ``mon.kl_max`` (there :func:`kl_blowup` speaks):
    a policy drifting away step by step (KL 0 -> 15 with no single spike for :func:`kl_spike` to see)."""
    return _kl_above(m, mon, mon.kl_warn, mon.kl_max, "the policy is drifting far from the reference")


def lr_extreme(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """The learning rate above ``mon.lr_max`` (1): no AdamW run on a language model works there (1e-7 to 1e-3 is
    the field's range; the tiny model from scratch takes 5e-3): the first update turns the weights to noise, and
    without ``optim.max_grad_norm`` nothing bounds it. Said when the rate first passes it (a warm-up reaches it
    late)."""
    lr = m.get("lr")
    if lr is None or not math.isfinite(lr) or lr <= mon.lr_max or any(v > mon.lr_max for v in prev.get("lr", [])):
        return None
    return (f"the learning rate is {fmt(lr)}, above {fmt(mon.lr_max)}: no AdamW run on a language model trains there "
            "(1e-7 to 1e-3 is usual); every update scrambles the weights; lower optim.lr (and set "
            "optim.max_grad_norm, e.g. 1.0)")


def nonfinite_loss(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    bad = [k for k, v in m.items() if (k == "loss" or k.startswith("loss/")) and not math.isfinite(v)]
    if bad:
        return (f"{', '.join(bad)} not finite: training diverged (step size too large or a bad batch); "
                "lower optim.lr or set optim.max_grad_norm")
    return None


# ── rules of the supervised recipes (SFT, reward model, DPO and the other offline losses) ────────────────────────

LOSS_KEYS = ("train/loss", "eval/loss")


def loss_rising(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """The loss far above its start: ``train/loss`` averaged over the last ``window`` checks above ``mon.loss_rise``
    (2) x its start (the lowest of its first ``window`` checks) and at least ``mon.loss_rise_floor`` (0.5) above it;
    ``eval/loss`` the same against its first value (the model as given). A loss that doubles while being minimised
    is divergence, finite or not (lr 1 on the tiny model: SFT 4.6 -> 27-83, RM 0.69 -> 18, DPO 0.69 -> 2-4)."""
    for key in LOSS_KEYS:
        loss, history = m.get(key), list(prev.get(key, []))
        if loss is None or not math.isfinite(loss):
            continue
        if key == "train/loss":
            if not history or len(history) < mon.window - 1:  # (window 1: one earlier loss is its start)
                continue
            start, now = min(history[: mon.window]), _recent_mean(prev, key, mon.window, loss)
        elif history:
            start, now = history[0], loss
        else:
            continue
        if start > 0 and now > mon.loss_rise * start and now - start > mon.loss_rise_floor:
            return (f"{key} {fmt(now)} is {now / start:.1f}x its start {fmt(start)}: training is diverging; lower "
                    "optim.lr (or set optim.max_grad_norm / optim.warmup_ratio)")
    return None


def loss_at_uniform(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """A per-token cross-entropy (``train/loss`` when ``mon.vocab_size`` is given: SFT) at the uniform value
    ln |V| or above it, for the last ``window`` checks (their mean): within ``mon.uniform_tol`` (5%) of ln |V| after
    it had been more than 10% below it (the model knew something and lost it), or above (1 + ``uniform_tol``) ln |V|
    after the first ``window`` checks (worse than guessing). A model that starts at ln |V| (random weights) and has
    not learned yet is left alone."""
    loss, history = m.get("train/loss"), list(prev.get("train/loss", []))
    if not mon.vocab_size or mon.vocab_size < 2 or loss is None or not math.isfinite(loss):
        return None
    if len(history) < mon.window:
        return None
    uniform, now = math.log(mon.vocab_size), _recent_mean(prev, "train/loss", mon.window, loss)
    tol = mon.uniform_tol
    back = abs(now - uniform) <= tol * uniform and min(history) < 0.9 * uniform
    if not (back or now > (1 + tol) * uniform):
        return None
    what = ("at the uniform value", "no better than a uniform guess (its output collapsed to uniform)") if back else \
        ("above the uniform value", "worse than a uniform guess (confidently wrong: its weights diverged)")
    return (f"train/loss {fmt(now)} per token is {what[0]} ln |V| = {fmt(uniform)} ({mon.vocab_size} tokens): the "
            f"model predicts {what[1]}; lower optim.lr and start again from the model or the last good checkpoint")


def grad_norm_blowup(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """``train/grad_norm`` (before clipping) far above its early level (the median of its first ``window`` values
    before the three judged, at least the first) and above ``mon.grad_floor`` (1): its recent level (the median of
    this step and the two before) above ``mon.grad_factor`` (10) x that, or this step alone above 3 x as much. The
    loss surface the optimizer stands on turned steep (lr 1 on the tiny model: 0.35 -> 110 for RM, 3.3 -> 38, 39, 22
    for SFT). One step's spike of ~10x that the next steps do not repeat is a hard batch, not a blow-up (a healthy
    tiny RM run, 32 pairs a batch: 1.1 -> 2.7 -> 10.6 -> 1.3)."""
    norm, history = m.get("train/grad_norm"), [v for v in prev.get("train/grad_norm", []) if math.isfinite(v)]
    if norm is None or not math.isfinite(norm) or not history:
        return None
    early = history[: max(1, min(mon.window, len(history) - 2))]
    recent = statistics.median(history[-2:] + [norm])
    start = _jump_over(recent, early, mon.grad_factor, mon.grad_floor) or \
        _jump_over(norm, early, 3 * mon.grad_factor, mon.grad_floor)
    if start is not None:
        return (f"train/grad_norm {fmt(norm)} (recent level {fmt(recent)}) is {max(recent, norm) / start:.0f}x its "
                f"early {fmt(start)}: the gradients blew up; lower optim.lr or optim.max_grad_norm (it is set: the "
                "norm is logged only then), or add a warm-up (optim.warmup_ratio)")
    return None


def dynamic_sampling_starved(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """With dynamic sampling (DAPO: ``rollout/dynamic_draws`` logged), every group of the batch tied
    (``rewards/tied_groups_frac`` = 1): groups whose rewards differ are always kept first, so every group of every
    draw tied. The step has no learning signal at all (every advantage is 0), however many draws were made."""
    draws, frac = m.get("rollout/dynamic_draws"), m.get("rewards/tied_groups_frac")
    if draws is None or frac is None or frac < 1.0:
        return None
    return (f"dynamic sampling drew {draws:.0f} batches and every group in them tied: this step has no learning "
            "signal; make the task easier (or harder) for the policy, raise algo.num_generations or "
            "algo.dynamic_sampling.max_draws, or use a denser reward")


def _recent_mean(history: History, key: str, window: int, now: float) -> float:
    """Mean of the last ``window`` values of ``key``: this step's ``now`` and the ``window - 1`` before it in
    ``history`` (fewer at the start)."""
    recent = (list(history.get(key, [])) + [now])[-window:]
    return sum(recent) / len(recent)


def _recent_score(m: Mapping[str, float], prev: History, w: int) -> float | None:
    """Mean of the last ``w`` training scores, this step's included (None when this step has none)."""
    score = m.get("objective/scores")
    return None if score is None or not math.isfinite(score) else _recent_mean(prev, "objective/scores", w, score)


def reward_hacking(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """At an evaluation step: the held-out score fell from its best evaluation by more than ``mon.hack_drop`` of
    max(|best|, its spread) while the training score (mean of the last ``window`` steps) rose above what it was at
    that best evaluation: the policy gets better at the training reward and worse at the task."""
    held = m.get("eval/scores")
    evals, at_eval = list(prev.get("eval/scores", [])), list(prev.get("scores/at_eval", []))
    train = _recent_score(m, prev, mon.window)
    if held is None or train is None or not evals or len(at_eval) != len(evals):
        return None
    best_i = max(range(len(evals)), key=evals.__getitem__)
    best, train_then = evals[best_i], at_eval[best_i]
    scale = max(abs(best), statistics.pstdev(evals + [held]), 1e-8)
    if best - held > mon.hack_drop * scale and train > train_then:
        return (f"eval/scores fell to {fmt(held)} from {fmt(best)} while the training reward rose "
                f"({fmt(train_then)} -> {fmt(train)}): the policy is exploiting the reward, not solving the task "
                "(reward hacking); check the samples and `rlhfkit reward-lint`, raise algo.kl.coef")
    return None


def length_to_limit(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """Responses at ``mon.length_frac`` of the length limit or more on average, their mean length rising over the
    last ``window`` steps, while the reward rises: the reward pays for length (or for what length hides)."""
    length, limit = m.get("response/length_mean"), mon.max_response_len
    lengths, scores = list(prev.get("response/length_mean", [])), list(prev.get("objective/scores", []))
    score = m.get("objective/scores")
    w = mon.window
    if length is None or score is None or not limit or len(lengths) < w or len(scores) < w:
        return None
    if length >= mon.length_frac * limit and length > lengths[-w] and score > scores[-w]:
        return (f"responses run to the length limit (mean {fmt(length)} of {limit} tokens, rising) while the "
                "reward rises: the reward pays for length; check the samples, penalise length "
                "(algo.overlong.cache_len) or raise generation.max_new_tokens")
    return None


def tied_groups(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """At least ``mon.tied_frac`` of the groups had all-equal rewards for the last ``mon.tied_steps`` steps: their
    advantages are 0, so most of each step teaches nothing."""
    frac = m.get("rewards/tied_groups_frac")
    history = list(prev.get("rewards/tied_groups_frac", []))
    if frac is None or len(history) < mon.tied_steps - 1:
        return None
    recent = history[-(mon.tied_steps - 1):] + [frac]
    if all(f >= mon.tied_frac for f in recent):
        return (f"{min(recent):.0%} or more of the groups had tied rewards for {mon.tied_steps} steps: no learning "
                "signal in them; make the task harder or easier for the policy, raise algo.num_generations, use a "
                "denser reward, or set algo.dynamic_sampling.enabled=true")
    return None


def scores_clipped(m: dict[str, float], prev: History, mon: HealthMonitor) -> str | None:
    """At least ``mon.clipped_frac`` of a step's scores sat at +-``reward.clip``: the clip erased their differences,
    so groups tie and advantages shrink (a reward on another scale than the clip, e.g. a reward model's logits or a
    length reward in characters, against the default clip of 10)."""
    frac = m.get("rewards/clipped_frac")
    if frac is None or frac < mon.clipped_frac:
        return None
    return (f"{frac:.0%} of this step's scores were clipped to +-reward.clip: their differences are lost (groups tie, "
            "advantages shrink); raise reward.clip, set reward.normalize=true, or reward.clip=null")


# ── rules over the generated texts ─────────────────────────────────────────────────────────────────────────────


def repetition_score(text: str, n: int = 3) -> float:
    """1 - distinct / total word n-grams (character 4-grams when there are fewer than 2n words): 0 = no
    repetition, near 1 = one phrase over and over. Texts too short to have 4 n-grams score 0."""
    words = text.split()
    units = [tuple(words[i: i + n]) for i in range(len(words) - n + 1)] if len(words) >= 2 * n else \
        [text[i: i + 4] for i in range(len(text) - 3)]
    if len(units) < 4:
        return 0.0
    return 1.0 - len(set(units)) / len(units)


def _odd_char(ch: str) -> bool:
    """Neither a letter or digit (any script), whitespace, punctuation, nor a math / currency / modifier symbol: the
    replacement character, control / private-use / unassigned code points, box drawing, emoji and other symbols."""
    if ch == "\ufffd":
        return True
    if ch.isalnum() or ch.isspace():
        return False
    cat = unicodedata.category(ch)
    return not (cat.startswith("P") or cat in ("Sm", "Sc", "Sk"))


def gibberish_score(text: str) -> float:
    """Fraction of characters that are odd (:func:`_odd_char`), or 1.0 when the mean word is longer than 20
    characters (runs of tokens without spaces). 0 for empty text."""
    stripped = text.strip()
    if not stripped:
        return 0.0
    odd = sum(_odd_char(ch) for ch in stripped)
    words = stripped.split()
    if len(stripped) >= 40 and sum(map(len, words)) / len(words) > 20:
        return 1.0
    return odd / len(stripped)


def repeated_texts(texts: Sequence[str], mon: HealthMonitor) -> str | None:
    scores = [repetition_score(t) for t in texts]
    frac = sum(s > mon.repetition_max for s in scores) / len(scores) if scores else 0.0
    if frac >= mon.texts_frac:
        return (f"{frac:.0%} of responses repeat themselves (over {mon.repetition_max:.0%} repeated n-grams): "
                "degenerate text the reward does not punish; lower optim.lr, raise algo.kl.coef, "
                "or set reward.missing_eos_penalty")
    return None


def gibberish_texts(texts: Sequence[str], mon: HealthMonitor) -> str | None:
    scores = [gibberish_score(t) for t in texts]
    frac = sum(s > mon.gibberish_max for s in scores) / len(scores) if scores else 0.0
    if frac >= mon.texts_frac:
        return (f"{frac:.0%} of responses look like gibberish (symbols, broken characters, no word breaks): "
                "the policy collapsed; lower optim.lr, raise algo.kl.coef")
    return None


@dataclass(frozen=True)
class Rule:
    fn: Callable[..., str | None]
    severity: str
    knob: str
    on: str = "metrics"  # "metrics": fn(m, history, mon); "texts": fn(texts, mon)


RULES: dict[str, Rule] = {
    "ratio": Rule(ratio_out_of_range, WARNING, "optim.lr"),
    "approxkl": Rule(approxkl_spike, WARNING, "optim.lr"),
    "value_loss": Rule(value_loss_rising, WARNING, "critic.lr"),
    "eos": Rule(few_eos, WARNING, "generation.max_new_tokens"),
    "all_truncated": Rule(all_truncated, WARNING, "generation.max_new_tokens"),
    "negative_kl": Rule(negative_kl, WARNING, "algo.kl.estimator"),
    "kl_spike": Rule(kl_spike, WARNING, "optim.lr"),
    "kl_blowup": Rule(kl_blowup, CRITICAL, "optim.lr"),
    "kl_per_token": Rule(kl_per_token, WARNING, "algo.kl.coef"),
    "kl_high": Rule(kl_high, WARNING, "optim.lr"),
    "length_growth": Rule(length_growth, WARNING, "algo.kl.coef"),
    "reward_collapse": Rule(reward_collapse, CRITICAL, "optim.lr"),
    "entropy_collapse": Rule(entropy_collapse, WARNING, "algo.entropy_coef"),
    "entropy_explosion": Rule(entropy_explosion, CRITICAL, "optim.lr"),
    "nonfinite_loss": Rule(nonfinite_loss, CRITICAL, "optim.lr"),
    "lr_extreme": Rule(lr_extreme, WARNING, "optim.lr"),
    "repetition": Rule(repeated_texts, WARNING, "algo.kl.coef", on="texts"),
    "gibberish": Rule(gibberish_texts, CRITICAL, "optim.lr", on="texts"),
    "reward_hacking": Rule(reward_hacking, WARNING, "algo.kl.coef"),
    "length_to_limit": Rule(length_to_limit, WARNING, "algo.overlong.cache_len"),
    "tied_groups": Rule(tied_groups, WARNING, "algo.num_generations"),
    "scores_clipped": Rule(scores_clipped, WARNING, "reward.clip"),
    "dynamic_sampling_starved": Rule(dynamic_sampling_starved, WARNING, "algo.dynamic_sampling.max_draws"),
    "loss_rising": Rule(loss_rising, CRITICAL, "optim.lr"),
    "loss_at_uniform": Rule(loss_at_uniform, CRITICAL, "optim.lr"),
    "grad_norm_blowup": Rule(grad_norm_blowup, WARNING, "optim.lr"),
}
TRACKED = ("policy/approxkl_avg", "loss/value_avg", "objective/kl", "objective/scores", "response/length_mean",
           "rewards/tied_groups_frac", "eval/scores", "train/loss", "eval/loss", "train/grad_norm", "lr")
# (TRACKED: the metrics whose past the rules read)
_SPACE = re.compile(r"\s+")


class HealthMonitor(StagedFile):
    """Runs every rule in ``RULES`` on each logged step; remembers what it said so it does not repeat itself.

    ``batch_size`` turns ``val/num_eos_tokens`` into a fraction when ``val/eos_frac`` is not logged.
    ``vocab_size``: the model's vocabulary |V|, for the uniform value ln |V| of the entropy rule and (supervised runs
    whose ``train/loss`` is a per-token cross-entropy: SFT) of :func:`loss_at_uniform`. With
    ``run_dir`` (main process), ``report`` appends each warning to ``run_dir/warnings.jsonl`` (``resume_step``:
    lines past that step are dropped first, -1 drops them all). ``stop_on_critical``: ``report`` raises
    :class:`CriticalHealthStop` on a critical warning, after writing it.
    """

    def __init__(self, window: int = 5, repeat_every: int = 10, batch_size: int | None = None, *,
                 run_dir: str | Path | None = None, stop_on_critical: bool = False, resume_step: int | None = None,
                 staged: bool = False,
                 kl_max: float = 20.0, kl_token_max: float = 0.2, kl_factor: float = 10.0, kl_floor: float = 1.0,
                 kl_token_warn: float = 1.0, length_growth: float = 4.0,
                 repetition_max: float = 0.5, gibberish_max: float = 0.3, texts_frac: float = 0.5,
                 max_response_len: int | None = None, length_frac: float = 0.85, hack_drop: float = 0.25,
                 tied_frac: float = 0.8, tied_steps: int = 10, vocab_size: int | None = None, kl_warn: float = 10.0,
                 loss_rise: float = 2.0, loss_rise_floor: float = 0.5, uniform_tol: float = 0.05,
                 grad_factor: float = 10.0, grad_floor: float = 1.0, clipped_frac: float = 0.5, lr_max: float = 1.0,
                 rename: Callable[[str], str] | None = None):
        self.window, self.repeat_every, self.batch_size = window, repeat_every, batch_size
        self.kl_max, self.kl_token_max, self.kl_factor, self.kl_floor = kl_max, kl_token_max, kl_factor, kl_floor
        self.kl_token_warn, self.length_growth = kl_token_warn, length_growth
        self.repetition_max, self.gibberish_max, self.texts_frac = repetition_max, gibberish_max, texts_frac
        self.max_response_len, self.length_frac, self.hack_drop = max_response_len, length_frac, hack_drop
        self.tied_frac, self.tied_steps, self.clipped_frac = tied_frac, tied_steps, clipped_frac
        self.vocab_size, self.kl_warn, self.uniform_tol = vocab_size, kl_warn, uniform_tol
        self.loss_rise, self.loss_rise_floor, self.grad_factor, self.grad_floor = (loss_rise, loss_rise_floor,
                                                                                   grad_factor, grad_floor)
        self.stop_on_critical, self.lr_max = stop_on_critical, lr_max
        self.rename = rename  # a message's metric names as the run writes them (TRL's: rlhfkit.track.names)
        self.history: dict[str, list[float]] = {k: [] for k in (*TRACKED, "entropy/token", "scores/at_eval")}
        self._last_warned: dict[str, int] = {}
        self._writer: JsonlWriter | None = None
        if run_dir is not None:  # staged: an earlier run's file is replaced only when the run commits
            self._writer = JsonlWriter(Path(run_dir) / "warnings.jsonl", keep_until=resume_step, staged=staged)

    def evaluate(self, metrics: Mapping[str, Any], step: int, texts: Sequence[str] | None = None
                 ) -> list[HealthWarning]:
        """The warnings this step raises, minus ones given < ``repeat_every`` steps ago; then records history."""
        m = {k: v for k, v in ((k, _to_float(v)) for k, v in metrics.items()) if v is not None}
        out = []
        for name, rule in RULES.items():
            if rule.on == "texts":
                message = rule.fn(list(texts), self) if texts else None
            else:
                message = rule.fn(m, self.history, self)
            last = self._last_warned.get(name)
            if message and (last is None or step - last >= self.repeat_every):
                self._last_warned[name] = step
                message = self.rename(message) if self.rename is not None else message
                out.append(HealthWarning(int(step), name, rule.severity, rule.knob, _SPACE.sub(" ", message)))
        if "eval/scores" in m and math.isfinite(m["eval/scores"]):  # the training reward when each eval was taken
            train = _recent_score(m, self.history, self.window)
            if train is None:
                m = {k: v for k, v in m.items() if k != "eval/scores"}  # no training score to pair it with
            else:
                self.history["scores/at_eval"].append(train)
        for key in TRACKED:
            if key in m and math.isfinite(m[key]):
                self.history[key].append(m[key])
        ent = token_entropy(m)
        if ent is not None and math.isfinite(ent):
            self.history["entropy/token"].append(ent)
        return out

    def thresholds(self) -> str:
        """What the rules watch, with their thresholds (beside "no warnings" in the report)."""
        return (f"KL above {fmt(self.kl_max)} nats per response and {fmt(self.kl_token_max)} per token (critical), "
                f"above {fmt(self.kl_warn)} nats and {fmt(self.kl_token_max)} per token, "
                f"above {fmt(self.kl_token_warn)} nat per token, or {fmt(self.kl_factor)}x its running median; "
                f"response length above {fmt(self.length_growth)}x its start, or at {fmt(self.length_frac)} of the "
                "limit and rising with the reward; scores falling by half from their best and beyond the steps' "
                f"noise; the held-out score falling by {fmt(self.hack_drop)} while the training score rises; "
                f"{fmt(self.tied_frac)} of the groups "
                f"tied for {self.tied_steps} steps; {fmt(self.clipped_frac)} of a step's scores at +-reward.clip; "
                "per-token entropy below 10% or above 3x its start (or near ln |V|); every group tied after dynamic "
                "sampling; the importance ratio outside [0.5, 2]; "
                f"a training loss above {fmt(self.loss_rise)}x its start, a per-token loss at or above ln |V|, the "
                f"gradient norm above {fmt(self.grad_factor)}x its start; "
                f"fewer than 10% of responses ending with EOS; a non-finite loss; a learning rate above "
                f"{fmt(self.lr_max)}; "
                f"repeated (> {fmt(self.repetition_max)}) or garbled (> {fmt(self.gibberish_max)}) text in half the "
                "samples")

    def check(self, metrics: Mapping[str, Any], step: int, texts: Sequence[str] | None = None) -> list[str]:
        """``evaluate`` as lines: ``step N: message``."""
        return [w.line() for w in self.evaluate(metrics, step, texts)]

    def report(self, metrics: Mapping[str, Any], step: int, console: Console | None = None,
               texts: Sequence[str] | None = None) -> list[str]:
        """``evaluate``; print each warning as one line, append it to ``warnings.jsonl``; with ``stop_on_critical``
        raise :class:`CriticalHealthStop` on the first critical one. Returns the lines."""
        warnings = self.evaluate(metrics, step, texts)
        for w in warnings:
            style = "bold red" if w.severity == CRITICAL else "yellow"
            (console or get_console()).print(Text(f"{w.severity}: {w.line()}", style=style), soft_wrap=True)
            if self._writer is not None:
                self._writer.write(asdict(w))
        critical = [w for w in warnings if w.severity == CRITICAL]
        if self.stop_on_critical and critical:
            w = critical[0]
            raise CriticalHealthStop(f"stopped on a critical health warning: {w.message}", where=f"step {w.step}",
                                     fix=f"turn {w.knob} (see warnings.jsonl), or set track.stop_on_critical=false")
        return [w.line() for w in warnings]



def read_warnings(run_dir: str | Path) -> list[dict]:
    """Every record of ``run_dir/warnings.jsonl`` ([] when there is none)."""
    return read_jsonl(Path(run_dir) / "warnings.jsonl")


def _to_float(value: Any) -> float | None:
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
