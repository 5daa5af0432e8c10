"""Every GPU figure of issue 41 in one command: rows in priority order, each row's result written to the output folder
as soon as it is measured, one table printed last.

    python3 bench/gpu_wheels.py         # here, right before the call: TRL 1.16 and what the GPU image lacks, as
                                        # wheels in .whl/ (ignored), the commit stamped, the exact `run` call printed
    PYTHONPATH=src:/tmp/site python3 bench/gpu_suite.py --out $OUT [--rows 3,4]          # the GPU machine
    .venv/bin/python bench/gpu_suite.py --dry-run [--out DIR]    # CPU: every row's code path at tiny sizes

Rows (``ROWS``, most important first; one function per row, so a row is added by writing one and listing it):

1. ``long_qwen3``, 2. ``long_llama``: GRPO at the Qwen3-0.6B, then the Llama-3.2-1B shape, with long-tailed answers
   (32 prompts of 4 to 1,024 tokens, mean 252, each prompt setting its answers' length: equal work by construction,
   and checked; ``bench/vs_trl.py --shape --mean-len --trl-cb``, throughput rows at learning rate 0 so the weights
   stay the rig's; the head untied for the rig, trained in both frameworks alike): TRL default, TRL + continuous
   batching, rlhfkit ``static`` and ``continuous`` (``auto`` is one of them: the row names which, from
   ``rollout/auto.py``'s rule): s/step, generated tok/s, tokens per completion, peak memory, the phases of each
   framework's step;
3. ``seeds_ppo``: the seeds' case, PPO with a Llama-2-7B-shaped policy and Pythia-1.4B-shaped reward model and
   critic, LoRA then every weight trained (FSDP2 CPU offload): each phase's peak against ``rlhfkit plan``, s/step
   (``bench/big_models.py`` cases 1-2);
4. ``qwen3_8b_lora``: GRPO with a Qwen3-8B-shaped policy, LoRA (and QLoRA when bitsandbytes is carried): peak
   against ``plan``, s/step (cases 3-4);
5. ``families``: each family's static and continuous decode against ``generate`` (greedy teacher-forced check,
   tok/s; ``bench/families.py``);
6. ``fused_head``: the fused LM head's bytes and speed at V = 151,936 against the plain logits paths
   (``bench/logprobs.py --head``);
7. ``vlm_3b``: GRPO on a Qwen2.5-VL-3B-shaped vision-language model (the real tower and language model, random
   weights), 8 prompts x 8 completions with one 448 x 448 picture each (256 image tokens), LoRA on the language model,
   the tower frozen: each phase's peak against ``plan``, s/step (``bench/big_models.py`` case 5; the least urgent).

How a call goes: each row runs in its own process (its own CUDA context: a row that fails or runs out of memory
leaves the next ones a clean device), started only when its expected time (``Row.seconds``: an H100 / H200
*estimate*, never measured yet) fits what is left of ``--budget`` (default :data:`BUDGET_S`, 500 s: with the
wheels' install and Python's start the call stays within 9 minutes), and stopped at the budget's end. The first row
asked for always starts; a row too long for what is left is passed over and a shorter later one may still run. Each
row writes its parts as it measures them (rows 1-2: after every framework's process; row 5: after every family),
and after each row the suite rewrites ``results.json``, ``table.md`` and ``suite.log`` (every process's output) in
``--out``: three files, whatever the number of rows (the device machine sends back at most 8). A row cut by the
budget keeps its finished parts; a row not started says so, with the ``--rows`` that runs the rest in a next call.
The rows add up to ~27 minutes of estimates: one call measures row 1 (and row 6 in what is left), the next calls
take the ``--rows`` the table's last line gives. ``table.md`` begins with the summary table in
docs/performance.md's format (:data:`SUMMARY_HEADER`: status, date, device, commit per row), ready to paste there.
Needs no network: TRL, datasets, dill and multiprocess travel as wheels (``bench/gpu_wheels.py``), everything else
is the image's (torch 2.11, transformers 5.17, peft, pillow for row 7's pictures).

``--dry-run``: the same rows on CPU at tiny sizes (tiny shapes of the same families, a few tokens, two steps; TRL's
rows only where TRL is importable), every code path but CUDA graphs; ``tests/e2e/test_gpu_suite.py`` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Ctx:
    """What a row's function gets: the device, whether this is the dry run, its folder for parts and scratch."""

    device: str
    dry: bool
    parts: Path
    work: Path

    def save(self, name: str, data: dict) -> None:
        """One finished part of the row (written at once: a row cut short keeps it)."""
        tmp = self.parts / f"{name}.json.tmp"
        tmp.write_text(json.dumps(data, indent=1, default=str))
        tmp.replace(self.parts / f"{name}.json")

    def part_path(self, name: str) -> Path:
        return self.parts / f"{name}.json"


@dataclass
class Row:
    key: str
    title: str
    run: Callable[[Ctx], None]  # measures, writing parts with ctx.save
    lines: Callable[[dict], list[str]]  # the row's table from its parts {name: data}
    seconds: int  # expected seconds on one H100 / H200 (the budget's unit)
    dry_seconds: int = 30


# ─────────────────────────────────────── row 1: long answers against TRL ───────────────────────────────────────

BUDGET_S = 500.0  # the rows' seconds: with the wheels' install and the start, one `run` call of 9 minutes
STATIC = "static:compile=false"
LONG = {"mean": 256, "max": 1024, "prompts": 32, "k": 8, "micro": 16, "steps": 3}
DRY_SHAPE = "qwen3-0.6b"  # the dry run's long-answer row (one shape shows every code path)


def trl_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("trl") is not None


def long_answers(shape: str) -> Callable[[Ctx], None]:
    """``vs_trl.py`` at one shape (in this process; it runs each framework in its own), its JSON kept as the part."""

    def run(ctx: Ctx) -> None:
        import vs_trl

        from rlhfkit.rollout.auto import auto_choice

        if ctx.dry and shape != DRY_SHAPE:  # the same code path as the dry run's other long-answer row
            ctx.save("dry", {"note": f"dry run: {shape} takes row {DRY_SHAPE}'s code path (vs_trl.py); the Llama "
                                     "family's decode is checked by the families row"})
            return
        size = dict(mean=8, max=32, prompts=2, k=4, micro=4, steps=2) if ctx.dry else LONG
        # static as auto runs it when it takes static (uncompiled; CUDA graphs on CUDA), and continuous
        argv = ["--device", ctx.device, "--shape", str(HERE.parent / "shapes" / shape), "--recipes", "grpo",
                "--engine", f"{STATIC},continuous", "--mean-len", str(size["mean"]), "--max-new", str(size["max"]),
                "--prompts", str(size["prompts"]), "--k", str(size["k"]), "--micro-batch", str(size["micro"]),
                "--steps", str(size["steps"]), "--rounds", "1", "--work", str(ctx.work),
                "--json", str(ctx.part_path(f"vs_trl_{shape}"))]
        argv += (["--tiny"] if ctx.dry else []) + (["--trl-cb"] if trl_importable() else ["--no-trl"])
        name, why = auto_choice(ctx.device, size["prompts"] * size["k"], size["max"], batch_size=None)
        ctx.save(f"auto_{shape}", {"auto": name, "why": why, "trl": trl_importable()})
        print(f"[suite] vs_trl.py {' '.join(argv)}", flush=True)
        vs_trl.main(argv)

    return run


def long_answers_lines(parts: dict) -> list[str]:
    from _report import comparison_table, comparisons, rows_table

    out = [parts["dry"]["note"], ""] if "dry" in parts else []
    for name, data in parts.items():
        if not name.startswith("vs_trl_"):
            continue
        shape = name.removeprefix("vs_trl_")
        results = {(r["recipe"], r["framework"]): r["runs"] for r in data["rows"]}
        meta = data["meta"]
        auto = parts.get(f"auto_{shape}", {})
        out.append(f"**{shape}**: {meta['where']}; {meta['args']['prompts']} prompts x {meta['args']['k']}, "
                   f"{meta['args']['steps']} steps ({meta['args']['warmup']} warm-up), {meta['device_name']}, TRL "
                   f"{meta['trl']}; `auto` takes `{auto.get('auto', '?')}` here ({auto.get('why', '')}; "
                   "rollout/auto.py)")
        out += ["", *rows_table(results, ["grpo"], shape), ""]
        ours = [fw for _, fw in results if fw.startswith("rlhfkit")]
        peers = [fw for _, fw in results if fw.startswith("trl")]
        comps = comparisons(results, ["grpo"], ours, peers)
        out += ([*comparison_table(comps, shape), ""] if comps else ["(no TRL row: no ratio)", ""])
    return out


# ─────────────────────────────────────── rows 3-4: big models against plan ──────────────────────────────────────


def big_cases(cases: list[int]) -> Callable[[Ctx], None]:
    def run(ctx: Ctx) -> None:
        import big_models
        import torch

        for c in cases:  # one part per case: a case cut by the budget leaves the others
            ctx.save(f"case_{c}", {"result": big_models.run(torch.device(ctx.device), ctx.dry, [c])[0]})
    return run


def big_lines(parts: dict) -> list[str]:
    import big_models

    results = [parts[k]["result"] for k in sorted(parts) if k.startswith("case_")]
    ok = big_models.within(results)
    return ["```", *big_models.table(results), "```",
            f"plan within 10 % of every measured phase: {'n/a (no CUDA peaks)' if ok is None else ok}", ""]


# ─────────────────────────────────────── row 4: families ───────────────────────────────────────────────────────


def families(ctx: Ctx) -> None:
    import families as fam
    import torch

    for i, name in enumerate(fam.SHAPES):
        r = fam.measure(name, torch.device(ctx.device), ctx.dry)
        status, text = fam.verdict(r)
        ctx.save(f"family_{i:02d}_{name.replace('/', '_')}", {"family": name, "status": status, "text": text,
                                                               "raw": r})


def families_lines(parts: dict) -> list[str]:
    rows = [p for k, p in parts.items() if k.startswith("family_")]
    return ["| family | status | result |", "|---|---|---|",
            *(f"| {p['family']} | {p['status']} | {p['text']} |" for p in rows), ""]


# ─────────────────────────────────────── row 5: the fused LM head ──────────────────────────────────────────────


def fused_head(ctx: Ctx) -> None:
    import logprobs
    import torch

    dev = torch.device(ctx.device)
    tiny = {"B": 2, "T": 32, "H": 32, "V": logprobs.QWEN_VOCAB, "dtype": torch.float32}
    r = logprobs.head_rows(dev, ctx.dry, sizes=tiny if ctx.dry else None)
    ctx.save("head", {**r, "sizes": {k: str(v) for k, v in r["sizes"].items()}})


def fused_head_lines(parts: dict) -> list[str]:
    r = parts.get("head")
    if r is None:
        return []
    z = r["sizes"]
    mib = lambda x: "n/a" if x is None else f"{x / 2**20:,.0f} MiB"  # noqa: E731
    out = [f"B={z['B']} T={z['T']} H={z['H']} V={z['V']} {z['dtype']}: forward + backward of label log-probs and "
           "entropies", "", "| way | kept for backward | peak above inputs | time | max diff vs naive |",
           "|---|---|---|---|---|"]
    for row in r["rows"]:
        if "absent" in row:
            out.append(f"| {row['name']} | {row['absent']} | | | |")
        else:
            out.append(f"| {row['name']} | {mib(row['saved'])} | {mib(row['peak'])} | {row['seconds'] * 1e3:.1f} ms | "
                       f"{row['err']:.1e} |")
    return out + [""]


# ─────────────────────────────────────── row 7: a vision-language model against plan ──────────────────────────


def vlm_lines(parts: dict) -> list[str]:
    about = [p["result"].get("about") for k, p in sorted(parts.items()) if k.startswith("case_")]
    return [*(a for a in about if a), "", *big_lines(parts)]


ROWS: list[Row] = [
    Row("long_qwen3", "GRPO long answers vs TRL, Qwen3-0.6B shape", long_answers("qwen3-0.6b"), long_answers_lines,
        seconds=360, dry_seconds=70),
    Row("long_llama", "GRPO long answers vs TRL, Llama-3.2-1B shape", long_answers("llama-3.2-1b"),
        long_answers_lines, seconds=420, dry_seconds=5),
    Row("seeds_ppo", "PPO Llama-2-7B + Pythia-1.4B: plan vs peak (LoRA; full, FSDP2 CPU offload)", big_cases([1, 2]),
        big_lines, seconds=300, dry_seconds=40),
    Row("qwen3_8b_lora", "GRPO Qwen3-8B LoRA (QLoRA when carried): plan vs peak", big_cases([3, 4]), big_lines,
        seconds=150, dry_seconds=20),
    Row("families", "each family: static and continuous vs generate", families, families_lines, seconds=200,
        dry_seconds=25),
    Row("fused_head", "fused LM head at V = 151,936: bytes and speed", fused_head, fused_head_lines, seconds=60,
        dry_seconds=10),
    Row("vlm_3b", "GRPO Qwen2.5-VL-3B LoRA, tower frozen, 448 x 448 pictures: plan vs peak", big_cases([5]),
        vlm_lines, seconds=120, dry_seconds=20),
]


# ─────────────────────────────────────── the harness ───────────────────────────────────────────────────────────


def read_parts(folder: Path) -> dict:
    parts = {}
    for p in sorted(folder.glob("*.json")):
        try:
            parts[p.stem] = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):  # a part being written when the row was stopped
            pass
    return parts


def write_outputs(out: Path, report: dict) -> None:
    (out / "results.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "table.md").write_text("\n".join(table(report)) + "\n")


PENDING = "pending (not run when this table was written)"  # a call stopped from outside leaves these
SUMMARY_HEADER = ["| # | row | status | date | device | commit | seconds (CPU seconds) |",
                  "|---|---|---|---|---|---|---|"]  # docs/performance.md holds this table (tested): paste it there


def summary_lines(report: dict) -> list[str]:
    """One line per row of ``ROWS``, in docs/performance.md's format: a row this call did not ask for says so."""
    meta = report["meta"]
    where = f"{meta['device_name']}{' (dry run)' if meta['dry'] else ''}"
    lines = list(SUMMARY_HEADER)
    for i, row in enumerate(ROWS, 1):
        r = report["rows"].get(row.key)
        if r is None:
            lines.append(f"| {i} | {row.title} | not asked in this call | | | | |")
            continue
        took = f"{r['seconds']:.0f} ({r.get('cpu_seconds', 0):.0f})" if "seconds" in r else ""
        lines.append(f"| {i} | {row.title} | {r['status']} | {meta['date']} | {where} | {meta['commit']} | "
                     f"{took} |")
    return lines


def table(report: dict) -> list[str]:
    meta = report["meta"]
    lines = [f"# bench/gpu_suite.py{' --dry-run' if meta['dry'] else ''}: {meta['device_name']}, {meta['date']}, "
             f"commit {meta['commit']}, torch {meta['torch']}, transformers {meta['transformers']}, TRL {meta['trl']}",
             "", *summary_lines(report)]
    for i, row in enumerate(ROWS, 1):
        r = report["rows"].get(row.key)
        if r is None or not r.get("parts"):
            continue
        lines += ["", f"## {i}. {row.title} ({r['status']})", ""]
        try:
            lines += row.lines(r["parts"])
        except Exception as err:  # noqa: BLE001 - a table that cannot be drawn says why, the others still are
            lines.append(f"(table failed: {type(err).__name__}: {err})")
    left = [str(i) for i, row in enumerate(ROWS, 1) if report["rows"].get(row.key, {}).get("status", "").startswith(
        ("not reached", "stopped", PENDING))]
    if left:
        lines += ["", f"Not measured in this call: rows {','.join(left)}; the next call: "
                      f"`python3 bench/gpu_suite.py --out $OUT --rows {','.join(left)}`"]
    return lines


def meta_of(args) -> dict:
    import torch
    import transformers

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    stamp = ROOT / ".whl" / "COMMIT"  # bench/gpu_wheels.py's: the device machine's tree may have no .git
    commit = commit or (stamp.read_text().strip() + " (.whl/COMMIT)" if stamp.is_file() else "unknown")
    try:
        import trl

        trl_v = trl.__version__
    except ImportError:
        trl_v = "not installed"
    return {"dry": args.dry_run, "device": args.device, "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M"),
            "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl_v,
            "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "CPU", "budget_s": args.budget}


def _stop(signum: int, frame=None) -> None:
    """The suite's SIGTERM handler: unwind (run_row stops the running row's process group), exit 128 + the signal."""
    raise SystemExit(128 + signum)


def run_row(args, row: Row, folder: Path, log: Path, limit: float) -> tuple[str, float, float]:
    """The row in its own process (its own process group: stopped whole at ``limit`` seconds): its status, wall
    seconds and CPU seconds (its processes', finished ones)."""
    cmd = [sys.executable, str(HERE), "--row", row.key, "--parts", str(folder), "--device", args.device,
           "--work", str(Path(args.work) / row.key)] + (["--dry-run"] if args.dry_run else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(HERE.parent),
                                                      os.environ.get("PYTHONPATH", "")]), PYTHONUNBUFFERED="1")
    import resource

    t0, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    with log.open("a") as fh:
        fh.write(f"\n===== row {row.key}: {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(1.0, limit))
            status = "ok" if rc == 0 else f"failed (exit {rc}; suite.log has its output)"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = f"stopped at the budget after {limit:.0f} s (its finished parts kept)"
        except BaseException:  # the suite stopped (SIGTERM, Ctrl-C): the row's own group, outside the signal's
            os.killpg(proc.pid, signal.SIGKILL)  # reach, would go on holding the device after the call ended
            proc.wait()
            raise
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    return status, time.perf_counter() - t0, cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu_suite_out", help="output folder (default $OUT)")
    p.add_argument("--dry-run", action="store_true", help="every row's code path on CPU at tiny sizes")
    p.add_argument("--rows", default=None, help="rows to run, by number or key (default: all, in order)")
    p.add_argument("--budget", type=float, default=None,
                   help=f"seconds for the rows (default {BUDGET_S:.0f}; dry: 600)")
    p.add_argument("--device", default=None)
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--parts", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import torch

    args.device = args.device or ("cpu" if args.dry_run or not torch.cuda.is_available() else "cuda")
    if args.row:  # a child: one row
        row = next(r for r in ROWS if r.key == args.row)
        Path(args.work).mkdir(parents=True, exist_ok=True)
        row.run(Ctx(args.device, args.dry_run, Path(args.parts), Path(args.work)))
        return 0
    previous = signal.signal(signal.SIGTERM, _stop)  # `timeout` / a kill: the running row stops with the suite
    try:
        return _suite(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _suite(args) -> int:
    """The parent: the rows asked for, each in its own process group (:func:`run_row`), within the budget."""
    import tempfile

    args.budget = args.budget or (600.0 if args.dry_run else BUDGET_S)
    args.work = args.work or tempfile.mkdtemp(prefix="gpu_suite_")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "suite.log"
    wanted = [r.strip() for r in (args.rows or "").split(",") if r.strip()]
    rows = [r for i, r in enumerate(ROWS, 1) if not wanted or str(i) in wanted or r.key in wanted]
    report = {"meta": meta_of(args), "rows": {r.key: {"status": PENDING} for r in rows}}
    deadline = time.monotonic() + args.budget
    print(f"gpu_suite: {report['meta']['device_name']}, torch {report['meta']['torch']}, transformers "
          f"{report['meta']['transformers']}, TRL {report['meta']['trl']}; rows {', '.join(r.key for r in rows)}; "
          f"budget {args.budget:.0f} s; output {out}", flush=True)
    for row in rows:
        left = deadline - time.monotonic()
        need = row.dry_seconds if args.dry_run else row.seconds
        if left < need and row is not rows[0]:
            report["rows"][row.key] = {"status": f"not reached (needs ~{need} s, {max(0.0, left):.0f} s left)"}
            print(f"[suite] {row.key}: not reached", flush=True)
            continue
        folder = Path(args.work) / "parts" / row.key
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        try:
            status, seconds, cpu = run_row(args, row, folder, log, left)
        except (SystemExit, KeyboardInterrupt) as stop:  # the table says where the call stopped; it goes on stopping
            why = "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else f"a signal (exit {stop.code})"
            report["rows"][row.key] = {"status": f"stopped by {why} after {time.perf_counter() - t0:.0f} s (its "
                                                 "finished parts kept)", "parts": read_parts(folder)}
            write_outputs(out, report)
            print(f"[suite] {row.key}: {report['rows'][row.key]['status']}", flush=True)
            raise
        report["rows"][row.key] = {"status": status, "seconds": seconds, "cpu_seconds": cpu,
                                   "parts": read_parts(folder)}
        write_outputs(out, report)
        print(f"[suite] {row.key}: {status} in {seconds:.0f} s ({cpu:.0f} s of CPU)", flush=True)
    write_outputs(out, report)
    print("\n" + "\n".join(table(report)))
    failed = [k for k, r in report["rows"].items() if r["status"].startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
