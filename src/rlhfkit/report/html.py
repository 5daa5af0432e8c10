"""A self-contained HTML report of a run (or of a pipeline of runs): one file, no external assets.

The page opens with a summary that fits the page: where the model is, the recipe's key metrics first (score, the
task's own ``env/*`` metric, KL, ...) from start to end with which way each moved (one value is shown once), and the
health warnings of the run (``warnings.jsonl``) with their step and the knob to turn, or "no warnings" with the
thresholds the rules watch. Then the plots in order of importance (reward, task metrics, KL, length, entropy,
losses): a train metric and its eval twin share a panel (``train/loss`` with ``eval/loss``), sparse series such as
evaluations are drawn as points, metrics that never change are listed instead of plotted (one that moved at all is
plotted), diagnostics that stay near zero (or near their level) are folded into a collapsed section, and the x-axis
is the step of ``metrics.jsonl`` (optimizer updates). Then samples (13 px, wrapped) from the first, middle and last
logged steps; for a pipeline the same prompts answered by
every stage side by side; the config last, collapsed.

Plots are inline base64 PNGs drawn by matplotlib's Agg renderer (no pyplot, no global backend change); without
matplotlib they fall back to inline SVG polylines. Every piece of text from the run is HTML-escaped. Apart from
the "generated at" timestamp the output is a function of its inputs.

Checked in a browser: ``chromium --headless --no-sandbox --screenshot=shot.png --window-size=1400,2000
file://$PWD/report.html``; ``tests/unit/test_report.py::test_report_fits_a_1400_pixel_window_in_chromium`` checks that
the page is no wider than the window when Chromium is installed.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import files
from ..track.health import HealthMonitor, read_warnings
from ..track.metrics import read_run_metrics, run_recipe_of
from ..track.names import public_name
from ..track.samples import read_samples

X_LABEL = "step (optimizer updates, as in metrics.jsonl)"
# (panel title, which metric keys belong to it), in the order they are shown; train/X + eval/X pairs come next
GROUPS: list[tuple[str, Callable[[str], bool]]] = [  # in order of importance: reward, KL, length, entropy, loss
    ("Reward", lambda k: k in ("objective/scores", "objective/rlhf_reward", "eval/scores")),
    ("Task metrics", lambda k: k.startswith(("env/", "eval/env/", "gold/", "eval/gold"))),
    ("KL", lambda k: k == "objective/kl"),
    ("Response length", lambda k: k in ("response/length_mean", "val/response_length")),
    ("Entropy per token", lambda k: k == "policy/entropy_avg"),
    ("Sequence entropy", lambda k: k == "objective/entropy"),
    ("Losses", lambda k: k == "loss" or k.startswith("loss/")),
    ("Time per phase (s)", lambda k: k.startswith("time/") and k not in ("time/rollout_compile", "time/eval")),
    ("Throughput (per s)", lambda k: k.startswith("throughput/")),
]
NEAR_ZERO = 1e-3  # a diagnostic whose every value stays within this of 0 is folded away (log-prob differences, ...)
# the metrics the summary shows from start to end, when the run logged them (at most MAX_KEY_METRICS)
KEY_METRICS = (
    "eval/scores", "objective/scores", "objective/kl", "policy/entropy_avg", "train/loss", "eval/loss",
    "train/accuracy", "eval/accuracy", "train/rewards/accuracies", "eval/rewards/accuracies",
    "eval/rewards/margins", "response/length_mean", "val/eos_frac",
)
MAX_KEY_METRICS = 8
MAX_OTHER_PLOTS = 12
SAMPLES_PER_STEP = 4
MAX_CELL_CHARS = 2000
MAX_SIDE_BY_SIDE = 8
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
Series = dict[str, tuple[list[int], list[float]]]  # metric -> (steps, values)

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{margin-bottom:0}.muted{color:#777;font-size:.9em}
.grid{display:flex;flex-wrap:wrap;gap:12px}.grid figure{margin:0}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:4px 8px;vertical-align:top;text-align:left}
td.text{white-space:pre-wrap;overflow-wrap:anywhere;max-width:480px;font-family:monospace;font-size:13px}
table.samples,table.side-by-side{table-layout:fixed;width:100%}
table.samples th:first-child,table.samples th:last-child{width:8em}
.grid img{max-width:100%;height:auto}summary{cursor:pointer;margin:.5em 0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.critical td{background:#fde8e8}tr.warning td{background:#fff6e0}p.warn{background:#fde8e8;padding:.5em}
pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:13px;white-space:pre-wrap;overflow-wrap:anywhere}
.side{display:flex;gap:24px;align-items:center}section{margin-bottom:2em}
#summary{border:1px solid #ddd;border-radius:6px;padding:.5em 1em;background:#fafafa}
"""


def build_report(
    run_dir: str | Path,
    out_path: str | Path | None = None,
    title: str | None = None,
    gold: Mapping[str, float] | None = None,
    stages: Sequence[Mapping[str, Any]] | None = None,
    answers: Mapping[str, Sequence[Sequence[Any]]] | None = None,
    status: str | None = None,
) -> Path:
    """Write the HTML report of ``run_dir`` (default ``run_dir/report.html``) and return its path.

    ``gold``: gold metric per model, e.g. ``{"untrained": 0.02, "sft": 0.41, "ppo": 0.83}``.
    ``stages``: ``[{"name", "run_dir", "summary"}]`` for a pipeline; relative stage dirs are looked up under
    ``run_dir``. ``answers``: per model, ``[(prompt, answer, score), ...]`` on the same prompts in the same order,
    shown side by side. ``status``: how a run that did not finish ended (a failure, a stop by a signal), shown
    first.
    """
    run_dir = Path(run_dir)
    out_path = Path(out_path) if out_path is not None else run_dir / "report.html"
    title = title or f"rlhfkit report: {run_dir.name}"
    has_metrics = (run_dir / "metrics.jsonl").exists()
    body = [f"<h1>{_e(title)}</h1>", f'<p class="muted">{_e(str(run_dir))}</p>']
    if status:
        body.append(f'<p id="status" class="warn"><b>Not finished:</b> {_e(status)}</p>')
    body.append(_summary(run_dir, stages, out_path.parent) if stages else _summary(run_dir))
    if gold:
        body.append(_gold_section(gold))
    if answers:
        body.append(_side_by_side(answers))
    if has_metrics or not stages:
        body.append(_metrics_block(run_dir))
        body.append(_samples_block(run_dir))
    for stage in stages or ():
        body.append(_stage_section(stage, run_dir, out_path.parent))
    body.append(_config_block(run_dir))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    body.append(f'<p class="muted">generated by rlhfkit at {stamp}</p>')
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head>\n<body>\n"
        + "\n".join(b for b in body if b)
        + "\n</body></html>\n"
    )
    files.make_dirs(out_path.parent)
    files.write_atomic(out_path, page, what="the report", fix="rerun (a finished run only writes its report)")
    return out_path


# -- summary --------------------------------------------------------------------------------------------------
def _summary(run_dir: Path, stages: Sequence[Mapping[str, Any]] | None = None, out_dir: Path | None = None) -> str:
    parts = ["<section id='summary'><h2>Summary</h2>"]
    if stages:
        parts.append(_stages_table(stages, run_dir))
    else:
        parts.append(f"<p>{_where_model(run_dir)}</p>")
        recipe = run_recipe_of(run_dir)
        series = _series(read_run_metrics(run_dir, recipe))
        parts.append(_key_metrics(series, recipe))
        parts.append(_warnings_table(read_warnings(run_dir), (run_dir / "warnings.jsonl").exists()))
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def _where_model(run_dir: Path) -> str:
    """Where the trained model is: the merged model directory, the LoRA adapter, or the newest checkpoint."""
    saved = [p for p in run_dir.glob("*.safetensors")] + [p for p in run_dir.glob("pytorch_model*.bin")]
    out = []
    if saved and (run_dir / "config.json").exists():
        out.append(f"Model: <code>{_e(run_dir.resolve())}</code> (a Hugging Face model directory: "
                   "<code>AutoModelForCausalLM.from_pretrained</code>, <code>rlhfkit eval</code>, the next stage)")
    if (run_dir / "adapter").is_dir():
        out.append(f"LoRA adapter: <code>{_e((run_dir / 'adapter').resolve())}</code>")
    ckpts = sorted((p for p in run_dir.glob("checkpoint-*") if p.is_dir() and not p.name.endswith(".tmp")),
                   key=lambda p: _int_suffix(p.name))
    if ckpts:
        out.append(f"Newest checkpoint: <code>{_e(ckpts[-1].name)}</code> (resume with train.resume=auto)")
    if not out:
        return "No model saved in this directory yet (the run did not finish)."
    return "<br>".join(out)


def _int_suffix(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def key_metric_names(series: Series) -> list[str]:
    """The summary's metrics, the recipe's key ones first: reward / score, the task's own (``env/*``, e.g.
    ``env/tool_call_success``), KL, then the rest of :data:`KEY_METRICS`; a run with other names: its first varying
    metrics."""
    task = [k for k in series if k.startswith(("env/", "eval/env/"))][:2]
    keys = list(dict.fromkeys([k for k in KEY_METRICS[:2] if k in series] + task
                              + [k for k in KEY_METRICS[2:] if k in series]))[:MAX_KEY_METRICS]
    return keys or [k for k in series if not _constant(series[k]) and not k.startswith("data/")][:MAX_KEY_METRICS]


def movement(v0: float, v1: float) -> str:
    """Which way a metric moved: ``up 0.5 (+250%)``, ``down``, or ``unchanged``."""
    if v1 == v0:
        return "unchanged"
    rel = f" ({(v1 - v0) / abs(v0):+.0%})" if v0 else ""
    return f"{'&uarr; up' if v1 > v0 else '&darr; down'} {_num(abs(v1 - v0))}{rel}"


def _label(recipe: str | None, key: str) -> str:
    """A metric as the run wrote it (TRL's name for the recipes TRL has; the report reads rlhfkit's)."""
    return public_name(recipe or "", key) or key


def _shown(recipe: str | None, series: Series) -> Series:
    return {_label(recipe, k): v for k, v in series.items()}


def _key_metrics(series: Series, recipe: str | None = None) -> str:
    rows = []
    for key in key_metric_names(series):
        finite = [(s, v) for s, v in zip(*series[key]) if math.isfinite(v)]
        (s0, v0), (s1, v1) = finite[0], finite[-1]
        key = _label(recipe, key)
        if len(finite) == 1:  # one evaluation: shown once
            rows.append(f"<tr><td>{_e(key)}</td><td class='num' colspan='2'>{_num(v1)} at step {s1}</td>"
                        "<td class='muted'>one value</td></tr>")
            continue
        rows.append(f"<tr><td>{_e(key)}</td><td class='num'>{_num(v0)} <span class='muted'>@{s0}</span></td>"
                    f"<td class='num'>{_num(v1)} <span class='muted'>@{s1}</span></td><td>{movement(v0, v1)}</td></tr>")
    if not rows:
        return "<p>No metrics yet (metrics.jsonl is missing or empty).</p>"
    head = "<tr><th>metric</th><th>start @step</th><th>end @step</th><th>moved</th></tr>"
    return f"<table class='key-metrics'>{head}{''.join(rows)}</table>"


def _warnings_table(records: list[dict], checked: bool) -> str:
    if not records:
        return (f"<p>Health checks: no warnings. <span class='muted'>They watch: {_e(HealthMonitor().thresholds())}."
                "</span></p>") if checked else ""
    rows = "".join(
        f"<tr class='{_e(r.get('severity', ''))}'><td class='num'>{_e(r.get('step', ''))}</td>"
        f"<td>{_e(r.get('severity', ''))}</td><td><code>{_e(r.get('knob', ''))}</code></td>"
        f"<td>{_e(r.get('message', ''))}</td></tr>" for r in records)
    n_crit = sum(r.get("severity") == "critical" for r in records)
    head = "<tr><th>step</th><th>severity</th><th>knob</th><th>warning</th></tr>"
    return (f"<h3>Health warnings ({len(records)}, {n_crit} critical)</h3>"
            f"<table class='warnings'>{head}{rows}</table>")


def _stages_table(stages: Sequence[Mapping[str, Any]], base: Path) -> str:
    """One row per stage: its output directory, its health warnings and its summary metrics side by side."""
    keys = list(dict.fromkeys(k for s in stages for k in (s.get("summary") or {})))
    head = "<tr><th>stage</th><th>model directory</th><th>health warnings</th>" + "".join(
        f"<th>{_e(k)}</th>" for k in keys) + "</tr>"
    rows = []
    for stage in stages:
        stage_dir = _stage_dir(stage, base)
        warns = read_warnings(stage_dir)
        crit = sum(w.get("severity") == "critical" for w in warns)
        summary = stage.get("summary") or {}
        rows.append(f"<tr><td>{_e(stage.get('name', 'stage'))}</td><td><code>{_e(stage_dir)}</code></td>"
                    f"<td class='num'>{len(warns)} ({crit} critical)</td>"
                    + "".join(f"<td class='num'>{_cell(summary.get(k))}</td>" for k in keys) + "</tr>")
    return f"<table class='stages'>{head}{''.join(rows)}</table>"


# -- sections -------------------------------------------------------------------------------------------------
def _config_block(run_dir: Path) -> str:
    path = run_dir / "config.yaml"
    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8", errors="replace")
    return f"<details><summary>config.yaml</summary><pre>{_e(text)}</pre></details>"


def _metrics_block(run_dir: Path, heading: str = "h2") -> str:
    recipe = run_recipe_of(run_dir)
    series = _series(read_run_metrics(run_dir, recipe))  # grouped by rlhfkit's names, shown by the run's
    if not series:
        return f"<{heading}>Metrics</{heading}><p>No metrics yet (metrics.jsonl is missing or empty).</p>"
    constant = _shown(recipe, {k: v for k, v in series.items() if _constant(v)})
    varying = {k: v for k, v in series.items() if not _constant(v)}
    panels = [(_label(recipe, name) if other else name, _shown(recipe, group), other)
              for name, group, other in _panels(varying)]
    near_zero = [(name, group) for name, group, other in panels if other and _near_zero(group)]
    others = [(name, group) for name, group, other in panels if other and not _near_zero(group)]
    figures = [_plot(name, group) for name, group, other in panels if not other]
    figures += [_plot(name, group) for name, group in others[:MAX_OTHER_PLOTS]]
    folded = ""
    if near_zero:
        folded = (f"<details><summary>{len(near_zero)} diagnostics that stay within {NEAR_ZERO:g} of zero or of "
                  "their level</summary>"
                  f"<div class='grid'>{''.join(_plot(n, g) for n, g in near_zero)}</div></details>")
    notes = []
    if len(others) > MAX_OTHER_PLOTS:
        notes.append(f"{len(others) - MAX_OTHER_PLOTS} more metrics not plotted (see the table below).")
    if constant:
        notes.append("Constant, not plotted: " + ", ".join(
            f"{_e(k)}={_num(_finite(v)[-1])}" for k, v in constant.items()) + ".")
    note = "".join(f"<p class='muted'>{n}</p>" for n in notes)
    return (f"<{heading}>Metrics</{heading}><p class='muted'>x-axis: {_e(X_LABEL)}; "
            f"points: sparse series (evaluations)</p><div class='grid'>{''.join(figures)}</div>{folded}{note}"
            f"{_last_values(_shown(recipe, series))}")


def _panels(series: Series) -> list[tuple[str, Series, bool]]:
    """(title, series, is_other): the fixed groups, then train/X with eval/X overlaid, then one panel per metric."""
    out, used = [], set()
    for name, belongs in GROUPS:
        group = {k: v for k, v in series.items() if belongs(k)}
        if group:
            out.append((name, group, False))
            used |= set(group)
    for key in series:
        if key in used or not key.startswith("train/"):
            continue
        twin = "eval/" + key[len("train/"):]
        group = {k: series[k] for k in (key, twin) if k in series and k not in used}
        if twin in group:
            out.append((key[len("train/"):], group, False))
            used |= set(group)
    out += [(k, {k: series[k]}, True) for k in series if k not in used]
    return out


def _last_values(series: Series) -> str:
    cells = []
    for key, (steps, values) in series.items():
        finite = [(s, v) for s, v in zip(steps, values) if math.isfinite(v)]
        if finite:
            cells.append(f"<tr><td>{_e(key)}</td><td>{_num(finite[-1][1])}</td><td>{finite[-1][0]}</td></tr>")
    rows = "".join(cells)
    head = "<tr><th>metric</th><th>value</th><th>step</th></tr>"
    return f"<details><summary>last values of every metric</summary><table>{head}{rows}</table></details>"


def sample_steps(steps: Sequence[int]) -> list[tuple[int, str]]:
    """The first, middle and last of the distinct ``steps`` (fewer when there are fewer), labelled."""
    distinct = sorted(set(steps))
    if not distinct:
        return []
    picked = {distinct[0]: "first", distinct[len(distinct) // 2]: "middle", distinct[-1]: "last"}
    return sorted(picked.items())


def _samples_block(run_dir: Path, heading: str = "h2", per_step: int = SAMPLES_PER_STEP) -> str:
    rows = read_samples(run_dir)
    chosen = sample_steps([r["step"] for r in rows if isinstance(r.get("step"), int)])
    if not chosen:
        return ""
    keys = [k for k in dict.fromkeys(k for row in rows for k in row) if k != "step"]
    head = "<tr><th>step</th>" + "".join(f"<th>{_e(k)}</th>" for k in keys) + "</tr>"
    body = []
    for step, label in chosen:
        of_step = [r for r in rows if r.get("step") == step][:per_step]
        for row in of_step:
            body.append(f"<tr><td class='num'>{step} ({label})</td>"
                        + "".join(f"<td class='text'>{_cell(row.get(k))}</td>" for k in keys) + "</tr>")
    steps = ", ".join(f"{s} ({label})" for s, label in chosen)
    return (f"<{heading}>Samples across training</{heading}><p class='muted'>up to {per_step} per step at steps "
            f"{_e(steps)}; all of them in samples.jsonl</p><table class='samples'>{head}{''.join(body)}</table>")


def _side_by_side(answers: Mapping[str, Sequence[Sequence[Any]]]) -> str:
    """The same prompts answered by every model: one row per prompt, one column per model."""
    names = list(answers)
    first = answers[names[0]]
    head = "<tr><th>prompt</th>" + "".join(f"<th>{_e(n)}</th>" for n in names) + "</tr>"
    rows = []
    for i, item in enumerate(first[:MAX_SIDE_BY_SIDE]):
        cells = []
        for name in names:
            got = answers[name][i] if i < len(answers[name]) else None
            if got is None or got[0] != item[0]:
                cells.append("<td class='text'></td>")
                continue
            score = f" <span class='muted'>[{_num(got[2])}]</span>" if len(got) > 2 and got[2] is not None else ""
            cells.append(f"<td class='text'>{_cell(got[1])}{score}</td>")
        rows.append(f"<tr><td class='text'>{_cell(item[0])}</td>{''.join(cells)}</tr>")
    return ("<section><h2>Same prompts, every stage</h2><p class='muted'>sampled answers to held-out prompts "
            f"[score]</p><table class='side-by-side'>{head}{''.join(rows)}</table></section>")


def _gold_section(gold: Mapping[str, float]) -> str:
    rows = "".join(f"<tr><td>{_e(name)}</td><td>{_num(value)}</td></tr>" for name, value in gold.items())
    table = f"<table><tr><th>model</th><th>gold metric</th></tr>{rows}</table>"
    return f"<section><h2>Gold metric</h2><div class='side'>{table}{_bar_svg(gold)}</div></section>"


def _stage_dir(stage: Mapping[str, Any], base: Path) -> Path:
    stage_dir = Path(stage["run_dir"])
    if not stage_dir.is_absolute() and (base / stage_dir).exists():
        stage_dir = base / stage_dir
    return stage_dir


def _stage_section(stage: Mapping[str, Any], base: Path, out_dir: Path) -> str:
    name = str(stage.get("name", "stage"))
    stage_dir = _stage_dir(stage, base)
    parts = [f"<section><h2>Stage: {_e(name)}</h2>"]
    if (stage_dir / "report.html").exists():
        href = os.path.relpath(stage_dir / "report.html", out_dir).replace(os.sep, "/")
        parts.append(f"<p><a href='{_e(href)}'>full report of this stage</a></p>")
    parts.append(_warnings_table(read_warnings(stage_dir), False))
    parts += [
        _metrics_block(stage_dir, "h3"),
        _samples_block(stage_dir, "h3", per_step=2),
        _config_block(stage_dir),
        "</section>",
    ]
    return "\n".join(p for p in parts if p)


# -- data -----------------------------------------------------------------------------------------------------
def _series(rows: list[dict]) -> Series:
    """Numeric metrics over step, keys in order of first appearance; only keys with a finite value."""
    series: Series = {}
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int):
            continue
        for key, value in row.items():
            if key in ("step", "time") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            steps, values = series.setdefault(key, ([], []))
            steps.append(step)
            values.append(float(value))
    return {k: v for k, v in series.items() if any(math.isfinite(x) for x in v[1])}


def _finite(s: tuple[list[int], list[float]]) -> list[float]:
    return [v for v in s[1] if math.isfinite(v)]


def _constant(s: tuple[list[int], list[float]]) -> bool:
    """All finite values equal: a flat line tells nothing a number does not (a metric that moved at all, even from
    0 to 1e-9, is plotted: it is never listed as constant)."""
    vals = _finite(s)
    return max(vals) == min(vals)


def _near_zero(group: Series) -> bool:
    """Every value within :data:`NEAR_ZERO` of zero, or of the series' own level (an importance ratio that stays at
    1 to 1e-7): a diagnostic that says "fine" and is folded away, not a curve to read."""
    for s in group.values():
        vals = _finite(s)
        level = max(abs(v) for v in vals)
        if not (level <= NEAR_ZERO or max(vals) - min(vals) <= NEAR_ZERO * level):
            return False
    return True


def is_sparse(s: tuple[list[int], list[float]], densest: int) -> bool:
    """Drawn as points: at most 3 values, or fewer than a third of the densest series of its panel."""
    n = len(_finite(s))
    return n <= 3 or 3 * n < densest


# -- drawing --------------------------------------------------------------------------------------------------
def _plot(title: str, series: Series) -> str:
    try:
        img = _png(title, series)
    except ImportError:
        img = _line_svg(title, series)
    return f"<figure>{img}</figure>"


def _png(title: str, series: Series) -> str:
    from matplotlib.figure import Figure  # no pyplot: leaves the user's backend alone
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(4.8, 3.0), dpi=90)
    ax = fig.add_subplot()
    densest = max(len(_finite(s)) for s in series.values())
    for i, (key, (steps, values)) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        if is_sparse((steps, values), densest):
            ax.plot(steps, values, label=key, color=color, linestyle=":", linewidth=0.8, marker="o", markersize=5)
        else:
            ax.plot(steps, values, label=key, color=color, linewidth=1.3)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(X_LABEL, fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole updates
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if len(series) > 1 or title not in series:
        ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.15, right=0.97, top=0.9, bottom=0.16)  # fixed margins: tight_layout is slow
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f"<img alt='{_e(title)}' src='data:image/png;base64,{data}'>"


def _line_svg(title: str, series: Series, w: int = 430, h: int = 270) -> str:
    """The matplotlib-free fallback: one polyline per metric (split at NaN), with the axis ranges as text."""
    pts = [(s, v) for steps, values in series.values() for s, v in zip(steps, values) if math.isfinite(v)]
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    left, top, pw, ph = 50, 28, w - 60, h - 70

    def xy(s: float, v: float) -> str:
        x = left + (s - x0) / ((x1 - x0) or 1) * pw
        y = top + ph - (v - y0) / ((y1 - y0) or 1) * ph
        return f"{x:.1f},{y:.1f}"

    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-size='10' font-family='sans-serif'>",
        f"<text x='{w / 2}' y='16' text-anchor='middle' font-size='12'>{_e(title)}</text>",
        f"<rect x='{left}' y='{top}' width='{pw}' height='{ph}' fill='none' stroke='#ccc'/>",
        f"<text x='{left - 4}' y='{top + 8}' text-anchor='end'>{_num(y1)}</text>",
        f"<text x='{left - 4}' y='{top + ph}' text-anchor='end'>{_num(y0)}</text>",
        f"<text x='{left}' y='{top + ph + 14}'>{x0}</text>",
        f"<text x='{left + pw}' y='{top + ph + 14}' text-anchor='end'>step {x1}</text>",
    ]
    densest = max(len(_finite(s)) for s in series.values())
    for i, (key, (steps, values)) in enumerate(series.items()):
        color, runs, run = COLORS[i % len(COLORS)], [], []
        if is_sparse((steps, values), densest):
            for s, v in zip(steps, values):
                if math.isfinite(v):
                    cx, cy = xy(s, v).split(",")
                    out.append(f"<circle cx='{cx}' cy='{cy}' r='3.5' fill='{color}'/>")
            out.append(
                f"<text x='{left + (i % 2) * 200}' y='{h - 12 - 12 * (i // 2)}' fill='{color}'>{_e(key)}</text>"
            )
            continue
        for s, v in zip(steps, values):
            if math.isfinite(v):
                run.append(xy(s, v))
            elif run:
                runs, run = runs + [run], []
        for r in runs + [run]:
            if r:
                out.append(
                    f"<polyline fill='none' stroke='{color}' stroke-width='1.5' points='{' '.join(r)}'/>"
                )
        out.append(
            f"<text x='{left + (i % 2) * 200}' y='{h - 12 - 12 * (i // 2)}' fill='{color}'>{_e(key)}</text>"
        )
    return "".join(out) + "</svg>"


def _bar_svg(values: Mapping[str, float], w: int = 360, bar_h: int = 22) -> str:
    """Horizontal bars, one per entry, scaled from min(0, smallest) to the largest value."""
    nums = [float(v) for v in values.values()]
    lo, hi = min(0.0, *nums), max(0.0, *nums)
    label_w, pw = 110, w - 170
    scale = pw / ((hi - lo) or 1)
    zero = label_w + (0 - lo) * scale
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{bar_h * len(nums) + 8}' font-size='11'>"
    ]
    for i, (name, v) in enumerate(zip(values, nums)):
        y = 4 + i * bar_h
        x, width = (zero, v * scale) if v >= 0 else (zero + v * scale, -v * scale)
        color = COLORS[i % len(COLORS)]
        out.append(f"<text x='{label_w - 6}' y='{y + 15}' text-anchor='end'>{_e(name)}</text>")
        out.append(f"<rect x='{x:.1f}' y='{y + 3}' width='{width:.1f}' height='{bar_h - 6}' fill='{color}'/>")
        out.append(f"<text x='{max(x + width, zero) + 4:.1f}' y='{y + 15}'>{_num(v)}</text>")
    return "".join(out) + "</svg>"


# -- text -----------------------------------------------------------------------------------------------------
def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _num(value: Any) -> str:
    return _e(f"{value:.4g}") if isinstance(value, float) else _e(value)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return _e(text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…")
