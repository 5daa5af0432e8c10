"""TRL 1.16's example scripts run twice: with TRL, and with only their imports changed to rlhfkit; per optimizer step,
side by side: the samples trained on, the prompts they came from, the optimizer updates, the learning rate; and the
metric names each logged. Any difference is flagged (``DIFF``); the exit code is 1 when one is found.

    PYTHONPATH=src nice -n 19 /work/wt/venv-trl/bin/python bench/trl_port.py [--scripts grpo_quickstart,dpo,...]
        [--work DIR] [--markdown FILE]

TRL is installed only in the benchmark's own environment (a venv with ``trl==1.16.0``, ``datasets``, ``peft``; rlhfkit
from the worktree by ``PYTHONPATH``), never as a project dependency.

The scripts (:data:`SCRIPTS`) are written as TRL 1.16's documentation writes them (each trainer's "Quick start", the
GRPO page's "Using a custom reward function" examples with ``log_extra`` / ``log_metric``, the PEFT page's LoRA), on
TRL's defaults but where the docs set a value. Changes, the same for both frameworks: the data is made by the script
(``datasets.Dataset.from_list`` standing for the Hub datasets the docs load, which this machine cannot reach), the
model is a tiny Llama both frameworks load (rlhfkit's ``tiny:...,context=1024``, saved as a Hugging Face directory
with its chat template), and ``use_cpu=True`` is given on a machine without a GPU (TRL 1.16 refuses its own
``bf16=True`` default there otherwise). The rlhfkit run rewrites only the ``from trl...`` import lines
(:func:`port`). Each (framework, script) runs in its own process (``--worker``).

What is measured, per optimizer update, from each framework's own data path: TRL: the batch each ``training_step``
received (its rows; a pair counted once; prompts: the distinct ones among them), one update per ``on_step_end``, the
optimizer's learning rate at ``on_step_begin`` (the one the update uses); rlhfkit: its ``on_update`` event (the
update's rows and distinct prompts), the same ``TrainerCallback`` for the learning rate; both: the metric names of
every ``on_log`` (transformers' end-of-training summary keys left out: they are ``TrainOutput.metrics`` in both).
Metric names TRL logs that rlhfkit does not are a difference; names only rlhfkit logs are listed as its own.
Before the runs, the table of TRL 1.16's defaults rlhfkit uses (``rlhfkit.config.trl_defaults``) is compared with
the TRL config classes themselves (:func:`check_defaults`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import _stop

ROOT = Path(__file__).resolve().parents[1]
TINY = "tiny:hidden=64,layers=2,intermediate=128,context=1024"
SUMMARY_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss"}

# ─────────────────────────────────────────────────── the scripts ────────────────────────────────────────────────────
# MODEL and OUT are given by the harness (the tiny model's directory, this run's output directory).

SCRIPTS: dict[str, tuple[str, str]] = {
    "grpo_quickstart": ("GRPO quick start: GRPOTrainer on TRL's defaults, accuracy_reward, DeepMath-style prompts", '''
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from trl.rewards import accuracy_reward

# stands for load_dataset("trl-lib/DeepMath-103K", split="train"): conversational prompts and a solution column
dataset = Dataset.from_list([
    {"prompt": [{"role": "user", "content": f"What is {a} + {b}? Put the final answer in \\\\boxed{{}}."}],
     "solution": str(a + b)} for a, b in ((1, 2), (3, 4))])

trainer = GRPOTrainer(
    model=MODEL,
    reward_funcs=accuracy_reward,
    train_dataset=dataset,
    args=GRPOConfig(output_dir=OUT, use_cpu=True),
)
trainer.train()
'''),
    "grpo_rewards": ("GRPO custom reward functions: reward_len, Example 6 with log_extra / log_metric", '''
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": f"Count to {n}:", "ground_truth": str(n)} for n in range(1, 9)])


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def reward_func(completions, ground_truth, log_extra=None, log_metric=None, **kwargs):
    extracted = [c.strip().split()[-1] if c.strip() else None for c in completions]
    rewards = [1.0 if e == gt else 0.0 for e, gt in zip(extracted, ground_truth)]
    if log_extra:
        log_extra("golden_answer", list(ground_truth))
        log_extra("extracted_answer", [e or "[none]" for e in extracted])
    if log_metric:
        log_metric("accuracy", sum(rewards) / len(rewards))
    return rewards


training_args = GRPOConfig(output_dir=OUT, use_cpu=True, per_device_train_batch_size=4, num_generations=4,
                           max_completion_length=32, max_steps=6, logging_steps=1, report_to="none")
trainer = GRPOTrainer(model=MODEL, reward_funcs=[reward_len, reward_func], args=training_args, train_dataset=dataset)
trainer.train()
'''),
    "rloo": ("RLOO quick start: RLOOTrainer on TRL's defaults, a reward on unique characters", '''
from datasets import Dataset
from trl import RLOOConfig, RLOOTrainer

dataset = Dataset.from_list([{"prompt": f"Write about the number {n}."} for n in range(8)])


def reward_num_unique_chars(completions, **kwargs):
    return [len(set(c)) for c in completions]


trainer = RLOOTrainer(
    model=MODEL,
    reward_funcs=reward_num_unique_chars,
    train_dataset=dataset,
    args=RLOOConfig(output_dir=OUT, use_cpu=True),
)
trainer.train()
'''),
    "dpo": ("DPO quick start: DPOTrainer on TRL's defaults, standard-format (plain string) pairs", '''
from datasets import Dataset
from trl import DPOConfig, DPOTrainer

dataset = Dataset.from_list([{"prompt": f"The sky on day {i} is", "chosen": " blue.", "rejected": " made of cheese."}
                             for i in range(10)])

training_args = DPOConfig(output_dir=OUT, use_cpu=True)
trainer = DPOTrainer(model=MODEL, args=training_args, train_dataset=dataset)
trainer.train()
'''),
    "sft_lora": ("SFT with LoRA: SFTTrainer, conversational data, peft.LoraConfig", '''
from datasets import Dataset
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

dataset = Dataset.from_list([{"messages": [{"role": "user", "content": f"Say {w}."},
                                           {"role": "assistant", "content": f"{w}!"}]}
                             for w in ("hi", "yes", "no", "ok", "go", "up", "on", "in", "at", "by", "so")])

trainer = SFTTrainer(
    model=MODEL,
    train_dataset=dataset,
    args=SFTConfig(output_dir=OUT, use_cpu=True),
    peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
)
trainer.train()
'''),
    "kto": ("KTO quick start: KTOTrainer with a loaded model and tokenizer, unpaired data", '''
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import KTOConfig, KTOTrainer

model = AutoModelForCausalLM.from_pretrained(MODEL)
tokenizer = AutoTokenizer.from_pretrained(MODEL)
dataset = Dataset.from_list([{"prompt": f"Is {n} even?", "completion": " yes" if n % 2 == 0 else " no",
                              "label": n % 3 != 0} for n in range(12)])

training_args = KTOConfig(output_dir=OUT, use_cpu=True)
trainer = KTOTrainer(model=model, args=training_args, processing_class=tokenizer, train_dataset=dataset)
trainer.train()
'''),
    "reward": ("Reward model quick start: RewardTrainer on TRL's defaults, preference pairs", '''
from datasets import Dataset
from trl import RewardConfig, RewardTrainer

dataset = Dataset.from_list([{"prompt": f"Greet user {i}.", "chosen": " Hello, welcome!", "rejected": " Go away."}
                             for i in range(9)])

trainer = RewardTrainer(model=MODEL, args=RewardConfig(output_dir=OUT, use_cpu=True), train_dataset=dataset)
trainer.train()
'''),
    "online_dpo": ("Online DPO: OnlineDPOTrainer (trl.experimental) with a reward function", '''
from datasets import Dataset
from transformers import AutoTokenizer
from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

dataset = Dataset.from_list([{"prompt": f"Name a colour, {n}:"} for n in range(8)])


def brevity(completions, **kwargs):
    return [-float(len(c)) for c in completions]


trainer = OnlineDPOTrainer(
    model=MODEL,
    reward_funcs=[brevity],
    args=OnlineDPOConfig(output_dir=OUT, use_cpu=True, max_new_tokens=16),
    processing_class=AutoTokenizer.from_pretrained(MODEL),
    train_dataset=dataset,
)
trainer.train()
'''),
}


def port(text: str) -> str:
    """The script for rlhfkit: each ``from trl ... import X`` line becomes ``from rlhfkit import X`` (``trl.rewards``
    becomes ``rlhfkit.rewards``); nothing else changes."""
    text = re.sub(r"^from trl\.rewards import ", "from rlhfkit.rewards import ", text, flags=re.M)
    return re.sub(r"^from trl(\.[\w.]+)? import ", "from rlhfkit import ", text, flags=re.M)


# The scripts run a third time with only the trainer's import changed: TRL's own config object (``trl.GRPOConfig``)
# passed as ``args`` to rlhfkit's trainer.
TRL_ARGS = ("grpo_quickstart", "grpo_rewards", "dpo")


def port_trainer(text: str) -> str:
    """The script with only its ``...Trainer`` import from rlhfkit: the config (and everything else) still TRL's."""
    def one(m: re.Match) -> str:
        names = [n.strip() for n in m.group(2).split(",")]
        trainers = [n for n in names if n.endswith("Trainer")]
        rest = [n for n in names if not n.endswith("Trainer")]
        lines = [f"from trl{m.group(1) or ''} import {', '.join(rest)}"] if rest else []
        return "\n".join(lines + ([f"from rlhfkit import {', '.join(trainers)}"] if trainers else []))

    return re.sub(r"^from trl(\.[\w.]+)? import (.+)$", one, text, flags=re.M)


# ─────────────────────────────────────────────────── measuring ──────────────────────────────────────────────────────


def _recorder():
    """A ``transformers.TrainerCallback`` recording each update's learning rate and every logged name (both
    frameworks call it), and the counts of what each update was fed (``pending``, filled per framework)."""
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        def __init__(self):
            self.steps, self.names, self.lr, self.pending, self.counts = [], set(), None, [0, set()], []

        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            self.lr = optimizer.param_groups[0]["lr"] if optimizer is not None else None

        def on_step_end(self, args, state, control, **kwargs):
            self.steps.append({"step": state.global_step, "lr": self.lr})

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.names |= {k for k in (logs or {}) if k not in SUMMARY_KEYS}

    return Recorder()


def _trl_rows(trainer, inputs) -> tuple[int, set]:
    """(samples, prompts) of one ``training_step`` batch of TRL."""
    name = type(trainer).__name__
    if isinstance(inputs, list):  # GRPO / RLOO: one row per completion; online DPO: one per prompt, two completions
        prompts = {repr(row.get("prompt")) for row in inputs}
        return (2 * len(inputs) if "OnlineDPO" in name else len(inputs)), prompts
    if "OnlineDPO" in name and isinstance(inputs.get("prompt"), list):  # TRL 1.16: {"prompt": [...]}, no tensor
        return 2 * len(inputs["prompt"]), {repr(p) for p in inputs["prompt"]}
    first = next(v for v in inputs.values() if hasattr(v, "shape"))
    n = int(first.shape[0]) // (2 if name in ("DPOTrainer", "RewardTrainer") else 1)  # pairs: two rows each
    return n, set(range(n))


def install_trl(rec) -> None:
    import transformers

    init = transformers.Trainer.__init__

    def patched(self, *args, **kwargs):
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), rec]
        init(self, *args, **kwargs)
        step = self.training_step

        def counted(model, inputs, *a, **k):
            n, prompts = _trl_rows(self, inputs)
            rec.pending[0] += n
            rec.pending[1] |= prompts
            return step(model, inputs, *a, **k)

        self.training_step = counted

    transformers.Trainer.__init__ = patched
    end = type(rec).on_step_end

    def on_step_end(self, args, state, control, **kwargs):
        rec.counts.append((rec.pending[0], len(rec.pending[1])))
        rec.pending = [0, set()]
        return end(self, args, state, control, **kwargs)

    type(rec).on_step_end = on_step_end


def install_rlhfkit(rec) -> None:
    import rlhfkit.api as api

    class Counts:  # rlhfkit's own event: what each update was fed
        def on_update(self, step, payload):
            rec.counts.append((int(payload.get("rows") or 0), int(payload.get("prompts") or 0)))

        def on_step(self, step, metrics):  # (an rlhfkit callback: accepted by the trainer)
            return None

    init = api.Trainer.__init__

    def patched(self, *args, callbacks=None, **kwargs):
        init(self, *args, callbacks=[*(callbacks or []), rec, Counts()], **kwargs)

    api.Trainer.__init__ = patched


def worker(framework: str, script: str, work: Path, out: Path) -> None:
    os.environ.update({"RLHFKIT_CACHE": str(work / "cache"), "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
                       "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"})
    rec = _recorder()
    (install_trl if framework == "trl" else install_rlhfkit)(rec)  # "trl-args": rlhfkit's trainer
    text = {"trl": SCRIPTS[script][1], "trl-args": port_trainer(SCRIPTS[script][1])}.get(framework) or \
        port(SCRIPTS[script][1])
    run_dir = work / f"{framework}-{script}"
    scope = {"__name__": "__main__", "MODEL": str(work / "tiny"), "OUT": str(run_dir)}
    error = None
    t0 = time.time()
    try:
        exec(compile(text, f"{script}.py ({framework})", "exec"), scope)  # noqa: S102 - the benchmark's own scripts
    except BaseException as err:  # noqa: BLE001 - reported in the table
        error = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
    steps = [{**s, "samples": c[0], "prompts": c[1]} for s, c in zip(rec.steps, rec.counts)]
    out.write_text(json.dumps({"steps": steps, "names": sorted(rec.names), "error": error,
                               "seconds": time.time() - t0}))


def make_model(work: Path) -> Path:
    """The tiny Llama both frameworks load: rlhfkit's built-in one, saved as a Hugging Face directory (once)."""
    out = work / "tiny"
    if not (out / "config.json").is_file():
        from rlhfkit.config import ModelConfig
        from rlhfkit.models.loading import load_causal_lm, save_model

        model, tok = load_causal_lm(ModelConfig(name=TINY), trainable=False, seed=0)
        save_model(model, tok, out)
    return out


def check_defaults() -> list[str]:
    """rlhfkit's table of TRL 1.16's defaults against the TRL config classes: each ``name=value`` it states, read on a
    default instance (``use_cpu=True``). Returns the lines that disagree ([]: none)."""
    import warnings

    import trl
    from trl.experimental import cpo, online_dpo, orpo

    from rlhfkit.config.trl_defaults import TRL_DEFAULTS

    classes = {"grpo": trl.GRPOConfig, "rloo": trl.RLOOConfig, "online-dpo": online_dpo.OnlineDPOConfig,
               "sft": trl.SFTConfig, "rm": trl.RewardConfig, "dpo": trl.DPOConfig, "ipo": trl.DPOConfig,
               "kto": trl.KTOConfig, "simpo": cpo.CPOConfig, "orpo": orpo.ORPOConfig}
    bad = []
    for recipe, rows in TRL_DEFAULTS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = classes[recipe](output_dir="x", use_cpu=True)
        for row in rows:
            for part in row.trl.split(", "):
                m = re.fullmatch(r"(\w+)=(\S+)", part.split(" ")[0])
                if not m or not hasattr(obj, m.group(1)):
                    continue
                got = getattr(obj, m.group(1))
                got = getattr(got, "value", got)
                want = m.group(2)
                if not _agree(got, want):
                    bad.append(f"{recipe}: rlhfkit says {part} ({row.key}), {classes[recipe].__name__} has {got!r}")
    return bad


def _agree(got, want: str) -> bool:
    if isinstance(got, bool) or want in ("True", "False"):
        return str(got) == want
    try:
        return math.isclose(float(got), float(want), rel_tol=1e-9)
    except (TypeError, ValueError):
        return str(got).lower() == want.lower() or (got is None and want == "None")


# ─────────────────────────────────────────────────── the table ──────────────────────────────────────────────────────


def _lr(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def compare(script: str, trl: dict, ours: dict, title: str | None = None) -> tuple[list[str], int]:
    """The side-by-side lines of one script and its number of differences."""
    lines = [f"== {script}: {title or SCRIPTS[script][0]}"]
    diffs = 0
    for name, res in (("TRL", trl), ("rlhfkit", ours)):
        if res.get("error"):
            lines.append(f"   DIFF {name} failed: {res['error']}")
            diffs += 1
    lines.append(f"   {'step':>4}  {'samples TRL/rlhfkit':>19}  {'prompts':>9}  {'updates':>9}  {'learning rate':>21}")
    a, b = trl.get("steps", []), ours.get("steps", [])
    for i in range(max(len(a), len(b))):
        x, y = (a[i] if i < len(a) else {}), (b[i] if i < len(b) else {})
        same = bool(x) and bool(y) and x["samples"] == y["samples"] and x["prompts"] == y["prompts"] and \
            x["lr"] is not None and y["lr"] is not None and math.isclose(x["lr"], y["lr"], rel_tol=1e-6)
        diffs += not same
        lines.append(f"   {i + 1:>4}  {x.get('samples', '-'):>9}/{y.get('samples', '-'):<9}  "
                     f"{x.get('prompts', '-'):>4}/{y.get('prompts', '-'):<4}  {('1' if x else '-'):>4}/"
                     f"{('1' if y else '-'):<4}  {_lr(x.get('lr')):>10}/{_lr(y.get('lr')):<10}"
                     + ("" if same else "  DIFF"))
    missing = sorted(set(trl.get("names", [])) - set(ours.get("names", [])))
    own = sorted(set(ours.get("names", [])) - set(trl.get("names", [])))
    diffs += bool(missing)
    lines.append(f"   updates: {len(a)} / {len(b)}; metric names: TRL {len(trl.get('names', []))}, "
                 + ("all logged by rlhfkit" if not missing else f"DIFF not logged by rlhfkit: {', '.join(missing)}"))
    if own:
        lines.append(f"   rlhfkit's own names beside them: {', '.join(own)}")
    return lines, diffs


def markdown(results: dict, when: str) -> str:
    """The docs' table: one row per script."""
    rows = [f"Measured {when} (`bench/trl_port.py`, CPU, the tiny Llama):", "",
            "| script | updates TRL / rlhfkit | samples, prompts, learning rate per update | TRL's metric names logged "
            "by rlhfkit |", "|---|---|---|---|"]
    for script, (trl, ours, lines) in results.items():  # a script's "trl-args" run keyed "<script> (trl args)"
        per_step = "equal at every update" if not any("DIFF" in x for x in lines if x.lstrip()[:1].isdigit()) \
            else "differ (see the bench output)"
        missing = next((x.split("rlhfkit: ", 1)[1] for x in lines if "not logged by rlhfkit" in x), None)
        names = f"all {len(trl.get('names', []))}" if not missing else f"not: {missing}"
        err = "; ".join(f"{n} failed" for n, r in (("TRL", trl), ("rlhfkit", ours)) if r.get("error"))
        rows.append(f"| {script} | {len(trl.get('steps', []))} / {len(ours.get('steps', []))} | "
                    f"{err or per_step} | {names} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scripts", default=",".join(SCRIPTS))
    ap.add_argument("--work", default="/tmp/rlhfkit-trl-port")
    ap.add_argument("--markdown", default=None, help="write the docs' table there too")
    ap.add_argument("--worker", nargs=3, metavar=("FRAMEWORK", "SCRIPT", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.work)
    if args.worker:
        worker(args.worker[0], args.worker[1], work, Path(args.worker[2]))
        return 0
    work.mkdir(parents=True, exist_ok=True)
    make_model(work)
    bad = check_defaults()
    print("TRL 1.16's defaults in rlhfkit's table: " + ("all agree with TRL's config classes" if not bad else
                                                         "DIFF\n   " + "\n   ".join(bad)))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    results, total = {}, len(bad)
    for script in args.scripts.split(","):
        got = {}
        for fw in ("trl", "rlhfkit") + (("trl-args",) if script in TRL_ARGS else ()):
            out = work / f"{fw}-{script}.json"
            proc = _stop.run([sys.executable, __file__, "--work", str(work), "--worker", fw, script, str(out)],
                             env=env, capture_output=True, text=True, cwd=work)
            got[fw] = json.loads(out.read_text()) if out.is_file() else \
                {"error": f"the worker died: {proc.stderr.strip().splitlines()[-1:]}"}
            out.unlink(missing_ok=True)
        lines, diffs = compare(script, got["trl"], got["rlhfkit"])
        results[script] = (got["trl"], got["rlhfkit"], lines)
        total += diffs
        print("\n".join(lines), flush=True)
        if "trl-args" in got:
            config = re.search(r"\b(\w+Config)\(", SCRIPTS[script][1]).group(1)
            key = f"{script} (trl.{config} as args)"
            lines, diffs = compare(key, got["trl"], got["trl-args"],
                                   f"only the trainer from rlhfkit, args=trl.{config}(...)")
            results[key] = (got["trl"], got["trl-args"], lines)
            total += diffs
            print("\n".join(lines), flush=True)
    when = time.strftime("%Y-%m-%d")
    print(f"\n{total} difference(s)")
    if args.markdown:
        Path(args.markdown).write_text(markdown(results, when) + "\n")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
