"""Real shapes on CPU (issue 41, part 2): GRPO at the Qwen3-0.6B and Llama-3.2-1B shapes against TRL, and ``rlhfkit
plan --device cpu`` against the measured peak resident memory.

Random weights in the published shapes (``bench/shapes/``: head sizes, GQA ratios, vocabularies of 128-152k, RoPE
bases of 5e5-1e6, tied embeddings, positions past 1k), nothing downloaded.

1. **Speed** (``--part speed``): per shape one ``bench/vs_trl.py`` run, answers rigged long-tailed with their
   lengths set by the prompts (``vs_trl.py --lengths chain``: ``--prompts`` lengths, the quantiles of the exponential
   distribution of mean ``--mean-len``, at most ``--max-new``; at the defaults 8 prompts of 8-355 tokens, mean 123;
   every framework generates the same tokens: equal work by construction, and checked; throughput rows at learning
   rate 0), LoRA r=16 in both
   frameworks (a full fine-tune of these shapes does not fit beside TRL's float32 logits in this machine's memory;
   the table says so), ``--micro-batch`` sequences per forward: TRL default, TRL + continuous batching, rlhfkit
   ``auto`` (which takes ``continuous`` for answers of 512 tokens and more: ``rollout/auto.py``) and rlhfkit
   ``static`` uncompiled (the engine auto takes below that), with each framework's phases (where its step goes).
   Equal work by construction, one measured step after the warm-up is a figure (``--steps 2``); ``--lengths random``
   (vs_trl's former rig) needs hundreds of completions a row before two rows agree within 10 %.
2. **Memory** (``--part memory``): rlhfkit alone, GRPO, a full fine-tune of the Qwen3-0.6B shape and LoRA (r=16) on
   the Qwen3-1.7B shape, two steps each (the second holds AdamW's states beside the activations: the peak), every
   prompt exactly ``--prompt-len`` tokens and every answer exactly ``--mem-new`` tokens (random weights without the
   rig: EOS is held back to the limit), so that the run reaches the sizes ``plan`` budgets for. Measured: the peak
   resident set of the process above its resident set before the models loaded (``VmHWM`` - ``VmRSS``, the high-water
   mark reset there; glibc's mmap threshold fixed at 64 KiB as in tests/unit/memory_probe.py, so freed tensors leave
   the resident set and the peak is what was live), against ``plan(cfg, device="cpu")``'s peak for the same config.
   KL coefficient 0 (TRL 1.16's default beta): no reference model, so both cases fit here.

    .venv-trl/bin/python bench/real_shapes.py [--part speed,memory] [--shapes qwen3-0.6b,llama-3.2-1b] [--json F]
    .venv/bin/python bench/real_shapes.py --part memory        # no TRL needed
    .venv/bin/python bench/real_shapes.py --quick              # the tiny versions of the same shapes (a check)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import _stop

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
SHAPES = HERE.parent / "shapes"
sys.path.insert(0, str(HERE.parent))
MEMORY_CASES = [("qwen3-0.6b", None), ("qwen3-1.7b", 16)]  # (shape, LoRA rank or None: every weight trained)


# ─────────────────────────────────────────── speed ───────────────────────────────────────────


def speed(args, out: dict) -> None:
    import vs_trl

    for shape in args.shapes.split(","):
        path = Path(args.work) / f"speed_{shape}.json"
        argv = ["--device", "cpu", "--shape", str(SHAPES / shape), "--recipes", "grpo",
                "--engine", "auto,static:compile=false", "--mean-len", str(args.mean_len), "--max-new",
                str(args.max_new), "--prompts", str(args.prompts), "--k", str(args.k), "--micro-batch",
                str(args.micro_batch), "--lora", "16", "--steps", str(args.steps), "--rounds", "1", "--work",
                str(Path(args.work) / "models"), "--json", str(path)]
        argv += (["--tiny"] if args.quick else []) + (["--threads", str(args.threads)] if args.threads else [])
        argv += ["--no-trl"] if args.no_trl else ["--trl-cb"]
        print(f"[real_shapes] vs_trl.py {' '.join(argv)}", flush=True)
        vs_trl.main(argv)
        out.setdefault("speed", {})[shape] = json.loads(path.read_text()) if path.is_file() else None


def speed_lines(speed_runs: dict) -> list[str]:
    from _report import comparison_table, comparisons, rows_table

    lines = []
    for shape, data in speed_runs.items():
        if data is None:
            lines.append(f"{shape}: no result (the run failed; its output is above)")
            continue
        results = {(r["recipe"], r["framework"]): r["runs"] for r in data["rows"]}
        ours = [fw for _, fw in results if fw.startswith("rlhfkit")]
        peers = [fw for _, fw in results if fw.startswith("trl")]
        meta, s = data["meta"], data["meta"]["settings"]
        lines += [f"**{shape}** ({meta['where']}; {s['prompts']} prompts x {s['k']}, micro-batch {s['micro']}, "
                  f"{meta['date']})", "",
                  *rows_table(results, ["grpo"], shape), ""]
        comps = comparisons(results, ["grpo"], ours, peers)
        lines += [*comparison_table(comps, shape), ""] if comps else []
        for (_, fw), runs in results.items():
            ph = runs[0].get("phases", {})
            if ph:
                lines.append(f"- {fw} phases (s): " + ", ".join(f"{k[5:]} {v:.1f}" for k, v in ph.items()))
        lines.append("")
    return lines


# ─────────────────────────────────────────── memory ──────────────────────────────────────────


def memory_worker(spec: dict) -> dict:
    """One rlhfkit GRPO run of ``spec`` (in its own process): plan's phases for its config, then the measured peak."""
    from vs_trl import LORA_TARGETS, plan_of, rlhfkit_online, rss_peak_mib, rss_start, write_data

    from rlhfkit.config import RECIPES, build_config

    work = Path(spec["work"])
    s = {"prompt_words": spec["prompt_len"]}  # more words than prompt tokens: every prompt is cut to the limit
    data = write_data(work, s)
    out_dir = Path(tempfile.mkdtemp(prefix="real_shapes_mem_"))
    n, k, new = spec["prompts"], spec["k"], spec["new"]
    over = rlhfkit_online("grpo", Path(spec["model"]), out_dir, data["prompts"], prompts=n, k=k, max_new=new, lr=0.0,
                          beta=0.0, reward_fn="bench/vs_trl.py:reward", steps=2, micro=spec["micro"])
    over += ["train.max_steps=2", f"data.max_prompt_length={spec['prompt_len']}",
             f"data.max_length={spec['prompt_len'] + new}", f"generation.min_new_tokens={new}"]
    if spec["lora"]:
        over += ["model.lora.enabled=true", f"model.lora.r={spec['lora']}", f"model.lora.alpha={2 * spec['lora']}",
                 "model.lora.dropout=0", f"model.lora.target_modules=[{','.join(LORA_TARGETS)}]"]
    cfg = build_config("grpo", {}, over, source="real_shapes")
    planned = plan_of(cfg)
    base = rss_start()
    t0 = time.perf_counter()
    RECIPES["grpo"].run(cfg)
    return {"rss_mib": rss_peak_mib(base), "plan": planned, "seconds": time.perf_counter() - t0}


def memory(args, out: dict) -> None:
    from _shapes import random_model

    rows = out.setdefault("memory", [])
    for shape, lora in MEMORY_CASES:
        if shape not in args.mem_cases.split(","):
            continue
        model = random_model(SHAPES / shape, Path(args.work) / "models", tiny=args.quick)
        spec = {"model": str(model), "lora": lora, "prompts": args.mem_prompts, "k": args.mem_k,
                "new": args.mem_new, "prompt_len": args.prompt_len, "micro": args.mem_micro,
                "work": str(Path(args.work) / f"mem_{shape}")}
        Path(spec["work"]).mkdir(parents=True, exist_ok=True)
        result_path = Path(spec["work"]) / "result.json"
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", PYTHONPATH=os.pathsep.join(
            [str(ROOT / "src"), str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
        if args.threads:
            env["OMP_NUM_THREADS"] = str(args.threads)
        cmd = [sys.executable, str(HERE), "--memory-worker", json.dumps(spec), "--result", str(result_path)]
        print(f"[real_shapes] memory: {shape} {'LoRA r=' + str(lora) if lora else 'full fine-tune'}", flush=True)
        proc = _stop.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
            rows.append({"shape": shape, "lora": lora, "error": f"exit {proc.returncode}: {tail}"[:400]})
        else:
            rows.append({"shape": shape, "lora": lora, **spec, **json.loads(result_path.read_text())})
        print(f"  {rows[-1]}", flush=True)


def memory_lines(rows: list[dict]) -> list[str]:
    lines = ["| shape | trained | sequences x (prompt + answer) | micro-batch | plan peak (phase) | "
             "measured peak RSS | measured / plan |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        what = f"LoRA r={r['lora']}" if r["lora"] else "every weight"
        if "error" in r:
            lines.append(f"| {r['shape']} | {what} | | | | {r['error']} | |")
            continue
        plan, rss = r["plan"], r["rss_mib"]
        ratio = f"{rss / plan['peak_mib']:.2f}" if rss and plan.get("peak_mib") else "n/a"
        lines.append(f"| {r['shape']} | {what} | {r['prompts'] * r['k']} x ({r['prompt_len']} + {r['new']}) | "
                     f"{r['micro']} | {plan.get('peak_mib', 0) / 1024:.2f} GiB ({plan.get('peak_phase')}) | "
                     f"{(rss or 0) / 1024:.2f} GiB | {ratio} |")
    return lines


# ─────────────────────────────────────────── main ────────────────────────────────────────────


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", default="speed,memory")
    p.add_argument("--shapes", default="qwen3-0.6b,llama-3.2-1b", help="speed: the shapes (bench/shapes/)")
    p.add_argument("--mean-len", type=int, default=128)
    p.add_argument("--max-new", type=int, default=512)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=2, help="speed: steps per process, the first a warm-up")
    p.add_argument("--no-trl", action="store_true", help="speed: rlhfkit's rows only")
    p.add_argument("--prompt-len", type=int, default=64, help="memory: prompt tokens (every prompt cut to it)")
    p.add_argument("--mem-new", type=int, default=192, help="memory: answer tokens (every answer this long)")
    p.add_argument("--mem-cases", default=",".join(s for s, _ in MEMORY_CASES), help="memory: the cases, by shape")
    p.add_argument("--mem-prompts", type=int, default=2)
    p.add_argument("--mem-k", type=int, default=2)
    p.add_argument("--mem-micro", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="tiny versions of the shapes, a few tokens: the script's check")
    p.add_argument("--work", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--memory-worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_worker:
        Path(args.result).write_text(json.dumps(memory_worker(json.loads(args.memory_worker))))
        return 0
    if args.quick:
        args.mean_len, args.max_new, args.prompts, args.k, args.micro_batch, args.steps = 8, 32, 2, 4, 4, 2
        args.prompt_len, args.mem_new = 16, 16
    args.work = args.work or tempfile.mkdtemp(prefix="real_shapes_")
    out: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args)}
    parts = args.part.split(",")
    if "memory" in parts:
        memory(args, out)
    if "speed" in parts:
        speed(args, out)
    lines = []
    if out.get("speed"):
        lines += ["## Speed against TRL (LoRA r=16 in both)", "", *speed_lines(out["speed"])]
    if out.get("memory"):
        lines += ["## plan --device cpu against the measured peak", "", *memory_lines(out["memory"])]
    print("\n" + "\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
