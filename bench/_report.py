"""The report of ``bench/vs_trl.py`` (run alone, or as a row of ``bench/gpu_suite.py`` / ``bench/real_shapes.py``):
one summary per (framework, recipe, round) process, the **equal-work check**, the tables, the ``RATIO`` lines and the
JSON of a run.

Equal work: two online rows are compared only when their completions are about as long. Each row carries its tokens
per completion over its measured steps (the mean of the steps' means, and the longest answer); when two rows' means
differ by more than :data:`EQUAL_TOL` (10 %) the comparison prints ``UNEQUAL`` with both figures and no ratio at all.
When they are within it, the headline is generated tokens per second (rlhfkit / peer, which corrects what difference
is left), the time per step beside it. SFT / DPO rows read the same data rows in both frameworks: equal by
construction, their ratio is the time per step.

Long-answer rows now have their lengths set by the prompts (``vs_trl.py --lengths chain``, the default since
2026-11-29): equal by construction, the check a formality there. Elsewhere the lengths are random in every framework
(each samples its own tokens), so even equal distributions differ run to run: with answers ~ Geometric(1/mean)
the mean over n completions has a standard error of about mean / sqrt(n), and the difference of two rows about 1.4 x
that: n = 384 completions a row (16 x 8 x 3 measured steps) gives ~7 %, and a
~15 % chance that two rows of one distribution are refused. A refusal says "measure more completions", not "slower".
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

EQUAL_TOL = 0.10


def summarize(result: dict, warmup: int, completions: int | None) -> dict:
    """One worker's result (step end times, per-step mean / longest answer, phases, peaks) -> its summary:
    ``step_s`` (median over the measured steps), ``tok_mean`` / ``tok_max`` (tokens per completion), ``tok_s``
    (generated tokens per second), ``phases`` (median seconds), ``peak_mib`` (CUDA), ``rss_mib`` (peak resident set
    above the process's before the models loaded)."""
    ends = result["step_ends"]
    deltas = [b - a for a, b in zip(ends, ends[1:])][warmup:]
    means = (result.get("response_len") or [])[warmup:]
    maxes = (result.get("response_max") or [])[warmup:]
    out = {"step_s": statistics.median(deltas) if deltas else float("nan"), "steps": len(deltas),
           "tok_mean": statistics.mean(means) if means else None, "tok_max": max(maxes) if maxes else None,
           "completions": completions * len(means) if completions and means else None,
           "peak_mib": result.get("peak_mib"), "rss_mib": result.get("rss_mib"), "tok_s": None}
    if out["tok_mean"] is not None and deltas and completions:
        out["tok_s"] = out["tok_mean"] * completions / out["step_s"]
    phases = result.get("phases") or []
    kept = phases[warmup:] or phases
    out["phases"] = {k: statistics.median(p[k] for p in kept if k in p)
                     for k in dict.fromkeys(x for p in kept for x in p)}
    return out


def pooled(runs: list[dict]) -> dict:
    """The rounds of one row together: medians of the times, the mean of the tokens per completion (weighted by
    completions), the longest answer, the first round's peaks."""
    def med(key):
        vals = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    weights = [(r["tok_mean"], r["completions"] or 1) for r in runs if r.get("tok_mean") is not None]
    keys = dict.fromkeys(k for r in runs for k in r.get("phases", {}))
    return {"step_s": med("step_s"), "tok_s": med("tok_s"), "rounds": len(runs),
            "tok_mean": sum(m * w for m, w in weights) / sum(w for _, w in weights) if weights else None,
            "tok_max": max((r["tok_max"] for r in runs if r.get("tok_max") is not None), default=None),
            "completions": sum(r["completions"] or 0 for r in runs) or None,
            "peak_mib": runs[0].get("peak_mib"), "rss_mib": med("rss_mib"),
            "phases": {k: statistics.median(r["phases"][k] for r in runs if k in r["phases"]) for k in keys}}


def equal_work(ours: dict, peer: dict, tol: float = EQUAL_TOL) -> tuple[bool, str]:
    """(equal, why): tokens per completion within ``tol`` of each other (rows without generation: equal)."""
    a, b = ours.get("tok_mean"), peer.get("tok_mean")
    if a is None or b is None:
        return True, "same data rows"
    diff = a / b - 1
    return abs(diff) <= tol, f"tokens / completion {a:.1f} vs {b:.1f} ({diff:+.1%})"


def compare(ours: dict, peer: dict, tol: float = EQUAL_TOL) -> dict:
    """The comparison of one rlhfkit row with one peer row: equal work or not, and when equal the headline (tok/s
    rlhfkit / peer for online rows, time peer / rlhfkit otherwise) and the per-step time ratio."""
    ok, why = equal_work(ours, peer, tol)
    out = {"equal": ok, "work": why, "per_token": None, "per_step": None}
    if ok:
        out["per_step"] = peer["step_s"] / ours["step_s"] if ours.get("step_s") else None
        if ours.get("tok_s") and peer.get("tok_s"):
            out["per_token"] = ours["tok_s"] / peer["tok_s"]
    return out


PEER_NAMES = {"trl": "TRL (generate)", "trl[cb]": "TRL + continuous batching"}


def name_of(fw: str) -> str:
    return PEER_NAMES.get(fw, fw)


def _f(v, fmt="{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def rows_table(results: dict, recipes: list[str], where: str) -> list[str]:
    """Every row: s/step, generated tok/s, tokens per completion (mean / max), peak CUDA MiB, peak RSS MiB."""
    lines = [f"| recipe | framework | s/step | generated tok/s | tokens / completion (mean / max) | peak CUDA MiB | "
             f"peak RSS MiB |  ({where})", "|---|---|---|---|---|---|---|"]
    for (recipe, fw), runs in sorted(results.items(), key=lambda kv: (recipes.index(kv[0][0]), kv[0][1])):
        p = pooled(runs)
        tok = f"{_f(p['tok_mean'])} / {_f(p['tok_max'], '{:.0f}')}" if p["tok_mean"] is not None else "-"
        lines.append(f"| {recipe} | {name_of(fw)} | {_f(p['step_s'], '{:.3f}')} | {_f(p['tok_s'])} | {tok} | "
                     f"{_f(p['peak_mib'], '{:.0f}')} | {_f(p['rss_mib'], '{:.0f}')} |")
    return lines


def comparisons(results: dict, recipes: list[str], ours: list[str], peers: list[str],
                tol: float = EQUAL_TOL) -> list[dict]:
    out = []
    for recipe in recipes:
        for fw in ours:
            for peer in peers:
                if (recipe, fw) in results and (recipe, peer) in results:
                    c = compare(pooled(results[(recipe, fw)]), pooled(results[(recipe, peer)]), tol)
                    out.append({"recipe": recipe, "rlhfkit": fw, "peer": peer, **c})
    return out


def comparison_table(comps: list[dict], where: str) -> list[str]:
    lines = [f"| recipe | rlhfkit | against | equal work? | **generated tok/s rlhfkit / peer** (headline) | "
             f"time per step peer / rlhfkit |  ({where})", "|---|---|---|---|---|---|"]
    for c in comps:
        if c["equal"]:
            head = _f(c["per_token"], "**{:.2f}x**") if c["per_token"] is not None else "n/a (no generation)"
            step = _f(c["per_step"], "{:.2f}x")
            if c["per_token"] is None:  # SFT / DPO: the time per step is the equal-work figure
                head, step = _f(c["per_step"], "**{:.2f}x** (time per step)"), _f(c["per_step"], "{:.2f}x")
            lines.append(f"| {c['recipe']} | {c['rlhfkit']} | {name_of(c['peer'])} | yes: {c['work']} | {head} | "
                         f"{step} |")
        else:
            lines.append(f"| {c['recipe']} | {c['rlhfkit']} | {name_of(c['peer'])} | **NO**: {c['work']} | "
                         f"refused (unequal work) | refused |")
    return lines


def ratio_lines(comps: list[dict], device: str) -> list[str]:
    out = []
    for c in comps:
        what = f"vs_trl {c['recipe']} {c['rlhfkit']} vs {name_of(c['peer'])} ({device})"
        if not c["equal"]:
            out.append(f"UNEQUAL {what}: {c['work']}, more than {EQUAL_TOL:.0%} apart: no ratio")
        elif c["per_token"] is not None:
            out.append(f"RATIO {what}: generated tok/s rlhfkit/peer = {c['per_token']:.2f}x (equal work: "
                       f"{c['work']}); time per step peer/rlhfkit = {c['per_step']:.2f}x")
        else:
            out.append(f"RATIO {what}: time per step peer/rlhfkit = {c['per_step']:.2f}x ({c['work']})")
    return out


def phase_lines(results: dict) -> list[str]:
    out = []
    for (recipe, fw), runs in results.items():
        ph = pooled(runs)["phases"]
        if ph:
            out.append(f"PHASES {recipe} {name_of(fw)}: " + ", ".join(f"{k[5:]} {v:.3f} s" for k, v in ph.items()))
    return out


def write_json(path: Path | None, meta: dict, results: dict, comps: list[dict]) -> None:
    """The run so far (rewritten after every process, so a run cut short keeps what it measured)."""
    if path is None:
        return
    rows = [{"recipe": r, "framework": fw, "runs": runs, "pooled": pooled(runs)} for (r, fw), runs in results.items()]
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows, "comparisons": comps}, indent=1))
    tmp.replace(path)
