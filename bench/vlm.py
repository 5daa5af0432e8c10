"""rlhfkit against TRL 1.16's VLM GRPO at equal settings, in one run: seconds per step, peak memory, TRL / rlhfkit.

    .venv/bin/python bench/vlm.py --trl-python .venv-trl/bin/python [--arch llava] [--steps 4] [--rounds 1]
        [--device cpu|cuda] [--prompts 2] [--k 4] [--max-new 8] [--spec hidden=..,layers=..]

The parent (rlhfkit's environment) writes one model directory (a tiny VLM of ``--arch`` built from config with random
weights and its processor: ``tiny:arch=ARCH,SPEC`` saved with ``save_pretrained``) and the ``shapes`` task's pictures;
each (framework, round) then runs in its own process (``--worker``), frameworks alternating, TRL's in the interpreter
``--trl-python`` names (TRL is never a project dependency). Both workers run the same GRPO script, TRL's documented
VLM form (a ``datasets.Dataset`` with an ``image`` column of PIL images, conversational prompts with an image part, a
reward reading the ``answer`` column), differing only in the import line (``from trl`` / ``from rlhfkit``).

Equal settings: ``prompts x k`` completions per step, one optimizer update per rollout (TRL:
``steps_per_generation=1, num_iterations=1``), KL to the reference with beta 0.04, temperature 1, no gradient
checkpointing, the whole language model trained and the vision tower and projector frozen (rlhfkit's default; TRL
gets the model object with them frozen by the worker), float32 on CPU, bf16 on CUDA. A step's time is the interval
between two step-end callbacks (the first ``--warmup`` left out); peak memory is the worker's peak RSS on CPU (both
load the same weights; TRL's process also imports ``datasets`` / ``accelerate``) and ``max_memory_allocated`` on CUDA.
Equal work, imposed and checked: every answer is ``--max-new`` tokens long in both frameworks by default
(``--min-new``: TRL's ``generation_kwargs={"min_new_tokens": N}``, which rlhfkit's TRL interface takes too) over a
32k vocabulary (``--vocab``: with the tiny tokenizer's ~100 ids the random model samples its image token ~1 % a token,
rlhfkit ends a response there and TRL does not, and rlhfkit's answers came out 19-21 % shorter); the learning rate
is 0 by default (``--lr``; throughput rows as in ``bench/vs_trl.py``: the update does all of its compute but the
weights stay the same); each worker counts the tokens of every measured completion (the reward's
``completion_ids``, which both pass), and ``bench/_report.py``'s ``compare`` (vs_trl's) refuses the speed ratio when
the means differ by more than 10 %, its headline generated tokens per second, the time per step beside it.

``--arch llava`` by default: transformers' Qwen2.5-VL processor needs torchvision (its video processor), which TRL's
environment need not have; ``--arch qwen2_5_vl`` / ``gemma3_vl`` where it does (rlhfkit itself needs no torchvision).
Figures and their date / device go in ``bench/README.md`` and ``docs/vision-language.md``.
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

QUESTION = "Which square is larger, red or blue?"


# ─────────────────────────────────────────── the worker (either framework) ───────────────────────────────────────────


def worker(a: argparse.Namespace) -> None:
    import resource

    import torch
    from datasets import Dataset
    from PIL import Image

    if a.framework == "trl":
        from transformers import AutoModelForImageTextToText, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    else:
        from rlhfkit import GRPOConfig, GRPOTrainer
        TrainerCallback = object

    rows = json.loads((Path(a.workdir) / "rows.json").read_text())
    dataset = Dataset.from_list([{"image": Image.open(Path(a.workdir) / r["image"]).convert("RGB"),
                                  "prompt": [{"role": "user", "content": [{"type": "image"},
                                                                          {"type": "text", "text": QUESTION}]}],
                                  "answer": r["answer"]} for r in rows])

    lengths: list[list[int]] = []  # tokens per completion, one list per scoring call (a step's completions)

    def accuracy_reward(completions, answer, completion_ids=None, **kwargs):
        lengths.append([len(ids) for ids in completion_ids or []])
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [1.0 if t.strip().startswith(want) else 0.0 for t, want in zip(texts, answer)]

    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *args, **kwargs):  # TRL
            ends.append(time.perf_counter())

        def on_step(self, step, metrics):  # rlhfkit
            ends.append(time.perf_counter())

    cuda = a.device == "cuda"
    args = GRPOConfig(output_dir=str(Path(a.workdir) / f"out-{a.framework}"), learning_rate=a.lr,
                      per_device_train_batch_size=a.prompts * a.k, num_generations=a.k,
                      max_completion_length=a.max_new, max_steps=a.steps, beta=0.04, temperature=1.0,
                      steps_per_generation=1, num_iterations=1, gradient_checkpointing=False, logging_steps=1,
                      report_to="none", save_strategy="no", bf16=cuda, seed=a.seed,
                      generation_kwargs={"min_new_tokens": a.min_new} if a.min_new else None,
                      **({"use_cpu": not cuda} if a.framework == "trl" else {}))  # rlhfkit: CUDA when visible
    model = str(Path(a.workdir) / "model")
    if a.framework == "trl":  # the tower and projector frozen, as rlhfkit's default
        model = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.bfloat16 if cuda else torch.float32)
        inner = getattr(model, "model", model)
        for name in ("visual", "vision_tower", "multi_modal_projector"):
            for p in getattr(inner, name).parameters() if hasattr(inner, name) else ():
                p.requires_grad_(False)
    trainer = GRPOTrainer(model=model, reward_funcs=[accuracy_reward], args=args, train_dataset=dataset,
                          callbacks=[Clock()])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer.train()
    steps = [b - e for e, b in zip([start, *ends], ends)][a.warmup:]
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    scored = [step for step in lengths if step]  # a step's scoring (rlhfkit's reward lint calls it without ids first)
    tokens = [n for step in scored[a.warmup:] for n in step]  # the measured steps' completions
    print("RESULT " + json.dumps({"framework": a.framework, "steps": steps, "peak": peak, "tokens": tokens}),
          flush=True)


# ─────────────────────────────────────────── the parent ───────────────────────────────────────────


def prepare(workdir: Path, arch: str, spec: str, n: int, vocab: int = 0) -> None:
    """The model directory (a tiny VLM with random weights and its processor) and ``n`` pictures: one picture of
    ``shapes``, each row's copy with one pixel of its own changed. Every row is then a distinct image (no framework
    reuses an encoding across rows), yet the random model sees nearly the same input in every row, so the answers'
    lengths come from one distribution whichever rows a framework's shuffle puts in its measured steps (with distinct
    scenes, a 13 % gap in mean tokens per completion between the frameworks came from the rows alone)."""
    from PIL import Image

    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import load_causal_lm
    from rlhfkit.tasks import make_task_data

    model, tok = load_causal_lm(ModelConfig(name=f"tiny:arch={arch}" + (f",{spec}" if spec else "")),
                                trainable=False)
    if vocab > len(tok):  # filler words: a real-sized vocabulary (see main's --vocab)
        tok.add_tokens([f"<w{i}>" for i in range(vocab - len(tok))])
        model.resize_token_embeddings(len(tok))
        model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(workdir / "model")
    tok.rlhfkit_processor.save_pretrained(workdir / "model")
    make_task_data("shapes", workdir, n=n, n_eval=1)
    first = json.loads((workdir / "prompts.jsonl").read_text().splitlines()[0])
    picture = Image.open(workdir / first["image"]).convert("RGB")
    rows = []
    for i in range(n):
        copy = picture.copy()
        copy.putpixel((i % copy.width, i // copy.width % copy.height), (i * 37 % 256, i * 91 % 256, i * 13 % 256))
        copy.save(workdir / f"row-{i}.png")
        rows.append({"image": f"row-{i}.png", "answer": first["answer"]})
    (workdir / "rows.json").write_text(json.dumps(rows))


def run_worker(python: str, a: argparse.Namespace, framework: str, workdir: Path, seed: int) -> dict:
    cmd = [python, __file__, "--worker", "--framework", framework, "--workdir", str(workdir), "--device", a.device,
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--prompts", str(a.prompts), "--k", str(a.k),
           "--max-new", str(a.max_new), "--min-new", str(a.min_new), "--lr", str(a.lr), "--seed", str(seed)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")} \
        if framework == "rlhfkit" else dict(os.environ)
    proc = _stop.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{framework} worker failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                     f"{proc.stderr[-3000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--framework", choices=["trl", "rlhfkit"], help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--trl-python", default=".venv-trl/bin/python", help="the interpreter with trl==1.16.0")
    p.add_argument("--arch", default="llava", choices=["llava", "qwen2_5_vl", "gemma3_vl"])
    p.add_argument("--spec", default="hidden=256,layers=4,heads=4,kv_heads=2,intermediate=688",
                   help="the tiny VLM's sizes (tiny:arch=ARCH,SPEC)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-new", dest="max_new", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, default=32000, help="the tiny VLM's vocabulary, filled up with words to this "
                   "size: a random model then samples its EOS or image token about once in --vocab tokens (with the "
                   "tiny tokenizer's ~100 ids, 1 %% a token: rlhfkit ends a response at a sampled image token, TRL "
                   "does not, and the frameworks' answers differed in length by 19-21 %%)")
    p.add_argument("--min-new", dest="min_new", type=int, default=None, help="answers at least this long in both "
                   "frameworks (generation_kwargs min_new_tokens; default --max-new: every answer --max-new tokens, "
                   "equal work imposed; 0: answers end where the model ends them)")
    p.add_argument("--lr", type=float, default=0.0, help="0 (default): throughput rows, the update's full compute "
                   "with the weights kept, so both frameworks sample from one length distribution every step")
    a = p.parse_args()
    a.min_new = a.max_new if a.min_new is None else a.min_new
    if a.worker:
        return worker(a)
    if a.steps <= a.warmup:
        raise SystemExit("--steps must exceed --warmup")
    with tempfile.TemporaryDirectory(prefix="rlhfkit-bench-vlm-") as tmp:
        workdir = Path(tmp)
        prepare(workdir, a.arch, a.spec, n=a.prompts * a.steps, vocab=a.vocab)
        results: dict[str, list[dict]] = {"trl": [], "rlhfkit": []}
        for seed in range(a.rounds):  # a seed per round (both frameworks): more draws of the same lengths
            for framework in ("trl", "rlhfkit"):
                python = a.trl_python if framework == "trl" else sys.executable
                results[framework].append(run_worker(python, a, framework, workdir, seed))
    print(f"GRPO on tiny:arch={a.arch},{a.spec}, {a.prompts} x {a.k} completions of <= {a.max_new} tokens, "
          f"{a.device}, {a.steps} steps ({a.warmup} warm-up) x {a.rounds} round(s)")
    from _report import EQUAL_TOL, compare  # vs_trl.py's equal-work rule and ratios

    rows, peak = {}, {}
    for framework, runs in results.items():
        tokens = [n for r in runs for n in r["tokens"]]
        rows[framework] = {"step_s": statistics.median(t for r in runs for t in r["steps"]),
                           "tok_mean": statistics.fmean(tokens) if tokens else float("nan"),  # none: refused below
                           "tok_s": sum(tokens) / sum(t for r in runs for t in r["steps"])}
        peak[framework] = max(r["peak"] for r in runs)
        print(f"  {framework:8s} {rows[framework]['step_s']:8.3f} s/step  {rows[framework]['tok_s']:8.1f} generated "
              f"tok/s   peak {peak[framework] / 2**20:8.1f} MiB   tokens per completion mean "
              f"{rows[framework]['tok_mean']:6.1f} max {max(tokens, default=0)}")
    c = compare(rows["rlhfkit"], rows["trl"])
    if not c["equal"]:
        print(f"UNEQUAL work ({c['work']}, more than {EQUAL_TOL:.0%} apart): no speed ratio (rerun with more --steps "
              "/ --rounds, or --lr 0 if a learning rate was given)")
    else:
        print(f"RATIO generated tok/s rlhfkit / TRL: {c['per_token']:.2f} (> 1: rlhfkit faster; per step, TRL / "
              f"rlhfkit: {c['per_step']:.2f})")
    print(f"RATIO peak memory TRL / rlhfkit: {peak['trl'] / peak['rlhfkit']:.2f} (> 1: rlhfkit smaller)")


if __name__ == "__main__":
    main()
