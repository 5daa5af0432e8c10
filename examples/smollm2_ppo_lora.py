"""PPO with LoRA on a real model, SmolLM2-135M-Instruct from its GGUF file, with a reward model made from it.

    .venv/bin/python examples/smollm2_ppo_lora.py [--gguf PATH] [--out runs/smollm2-ppo-lora] [--steps 4] [--threads 1]

1. find the GGUF file (``examples/smollm2.py``) and convert it once to a safetensors directory (cached);
2. write a small preference set of our own: general questions, the *chosen* answer short and polite
   ("Happy to help! The answer is Paris."), the *rejected* one rude or rambling; and the questions as PPO prompts
   (each asks for "one short sentence", so most sampled answers end at ``<|im_end|>`` within 24 tokens);
3. ``run_rm``: a reward model from the same GGUF (LoRA on the backbone, a fresh ``score`` head), 8 updates of
   batch 4 at 64 tokens (48 for the prompt), held-out accuracy on pairs of other questions;
4. PPO (``recipe=ppo``, GAE with a critic initialised from the reward model) with LoRA on the policy: the reference
   is the policy with its adapter disabled, so no second copy of the model is loaded (checked and printed);
   4 prompts per step, 24 new tokens at most, KL coefficient 0.05 in the reward; per-step metrics, the lengths
   at which responses stopped (at their own ``<|im_end|>``), and per-step times split into rollout / scoring /
   forward passes / PPO update;
5. reload the written policy with plain ``transformers`` (merged weights, no peft) and answer one question.

The trainer is ``rlhfkit.train.online.synchronous.OnlineTrainer`` keeping its rollouts (:class:`RecordingTrainer`); the
phase
times are its own ``time/<phase>`` metrics. :func:`run_timed` does what ``run_online`` does (run directory, trainer,
``train()``), keeping the trainer so its models can be inspected. docs/real-models.md lists measured numbers."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smollm2 import find_smollm2_gguf, search_report  # noqa: E402

from rlhfkit.train.online.synchronous import OnlineTrainer  # noqa: E402

# (question, answer): the first 16 make the training pairs and the PPO prompts, the last 4 the held-out pairs
QUESTIONS = [
    ("What is the capital of France?", "Paris"), ("What colour is the sky on a clear day?", "blue"),
    ("How many days are in a week?", "seven"), ("What do bees make?", "honey"),
    ("What is 2+2?", "4"), ("Which animal says moo?", "a cow"),
    ("What is frozen water called?", "ice"), ("How many legs does a spider have?", "eight"),
    ("What is the opposite of hot?", "cold"), ("Which planet do we live on?", "Earth"),
    ("What do you call a baby dog?", "a puppy"), ("How many hours are in a day?", "24"),
    ("What gas do plants take in?", "carbon dioxide"), ("What is the largest ocean?", "the Pacific"),
    ("Which fruit is yellow and curved?", "a banana"), ("What language is spoken in Spain?", "Spanish"),
    ("What is the capital of Italy?", "Rome"), ("How many wheels does a bicycle have?", "two"),
    ("What colour is grass?", "green"), ("What do cows drink?", "water"),
]
N_TRAIN = 16
# Asked this way, SmolLM2 (with its default system prompt, about 20 tokens) usually answers in 8-22 tokens and stops at
# <|im_end|> (7 of 8 sampled answers within 24 tokens, against 1 of 8 for the bare question).
SUFFIX = " Answer in one short sentence."


def messages(question: str) -> list[dict]:
    return [{"role": "user", "content": question + SUFFIX}]


def preference_records(questions: list[tuple[str, str]]) -> list[dict]:
    """Two pairs per question: a short polite answer preferred over a rude one and over a rambling one."""
    out = []
    for q, a in questions:
        chosen = f"Happy to help! The answer is {a}."
        out.append({"prompt": messages(q), "chosen": chosen,
                    "rejected": f"Ugh, {a}. Obviously. Stop asking me that."})
        out.append({"prompt": messages(q), "chosen": chosen,
                    "rejected": f"Well, it depends, but maybe {a}, or not."})
    return out


def prompt_records(questions: list[tuple[str, str]]) -> list[dict]:
    return [{"prompt": messages(q), "answer": a} for q, a in questions]


class RecordingTrainer(OnlineTrainer):
    """``OnlineTrainer`` keeping the rollouts of its training steps (to check where the responses stopped); the
    time of each phase of a step is the trainer's own ``time/<phase>`` in metrics.jsonl."""

    PHASES = ("rollout", "reward", "old_logprobs", "reference", "values", "update")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rollouts: list = []
        real = self.producer.rollout

        def rollout(policy, prompts, seed, k=None, **kw):
            exp = real(policy, prompts, seed, k=k, **kw)
            if k is None:  # a training rollout (evaluation asks for k=1)
                self.rollouts.append(exp.rollout)
            return exp

        self.producer.rollout = rollout


def run_timed(cfg, trainer_cls=RecordingTrainer, check=None):
    """What ``rlhfkit.train.online.synchronous.run_online`` does (without the HTML report), keeping the trainer:
    ``check(trainer)`` runs after the models are loaded and before training. Returns (trainer, last metrics)."""
    from rlhfkit.train.supervised.loop import start_run

    cfg.check_inputs()
    with start_run(cfg) as run:  # the run's Session: lock, resume or start over, staged files, finish
        if run.session.begin() is not None:
            raise SystemExit(f"{run.run_dir} holds a finished run: give another --out or delete it")
        trainer = trainer_cls(cfg, run)
        if check is not None:
            check(trainer)
        metrics = trainer.train()
        run.print(f"[{cfg.recipe}] done: policy saved to {run.run_dir}")
    return trainer, metrics


def read_metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "objective/scores" in r]


def print_steps(tag: str, rows: list[dict], rollouts: list, keys: list[tuple[str, str]]) -> None:
    """One line per step: the chosen metrics, the phase times, and the response lengths (``*`` = no EOS)."""
    for i, (row, r) in enumerate(zip(rows, rollouts), 1):
        vals = " ".join(f"{short}={row[k]:.3f}" for k, short in keys if k in row)
        phases = " ".join(f"{p}={row.get(f'time/{p}', 0.0):.1f}s" for p in RecordingTrainer.PHASES)
        lengths = " ".join(f"{n}" + ("" if e else "*") for n, e in zip(r.lengths.tolist(), r.ended.tolist()))
        print(f"[{tag}] step {i}: {vals}\n[{tag}]   time {row.get('time/step', 0.0):.1f}s ({phases}); "
              f"lengths [{lengths}]")


def print_timing_summary(tag: str, rows: list[dict]) -> None:
    rest = rows[1:] or rows
    for label, sel in (("first step (incl. warm-up)", rows[:1]), ("mean of the other steps", rest)):
        parts = {p: sum(r.get(f"time/{p}", 0.0) for r in sel) / len(sel) for p in RecordingTrainer.PHASES}
        total = sum(r.get("time/step", 0.0) for r in sel) / len(sel)
        print(f"  {tag} {label:<27} {total:6.1f} s  = " + " + ".join(f"{p} {v:.1f}" for p, v in parts.items()))


def check_eos_stops(trainer, eos_ids: list[int]) -> tuple[int, int, set[int]]:
    """(responses that ended, all responses, distinct lengths of those that ended), asserting that every response
    that ended has its EOS as its last unmasked token and nothing unmasked after it."""
    ended_n, total, lengths = 0, 0, set()
    for r in trainer.rollouts:
        for ids, mask, n, ended in zip(r.response_ids, r.response_mask, r.lengths.tolist(), r.ended.tolist()):
            total += 1
            assert int(mask.sum()) == n, "response mask does not match the length"
            if ended:
                ended_n += 1
                lengths.add(n)
                assert int(ids[n - 1]) in eos_ids, "a response marked as ended does not end with EOS"
    return ended_n, total, lengths


def reload_and_generate(out: Path, conversation: list[dict], max_new_tokens: int = 40) -> tuple[str, int, bool]:
    """Load ``out`` with plain transformers (no rlhfkit, no peft), answer ``conversation`` greedily through the chat
    template; (reply, new tokens, ended at EOS)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert not (out / "adapter_config.json").exists(), "the root must hold merged weights, not an adapter"
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert not any("lora_" in n for n, _ in model.named_parameters())
    ids = tok.apply_chat_template(conversation, add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        gen = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    new = gen[0, ids["input_ids"].shape[1]:]
    return tok.decode(new, skip_special_tokens=True).strip(), len(new), bool((new == tok.eos_token_id).any())


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", help="path to SmolLM2-135M-Instruct.Q4_1.gguf (default: found by examples/smollm2.py)")
    ap.add_argument("--out", default="runs/smollm2-ppo-lora", help="directory: data/, rm/ and ppo/ (the policy)")
    ap.add_argument("--rm-steps", type=int, default=8, help="reward-model updates (batch 4)")
    ap.add_argument("--steps", type=int, default=4, help="PPO steps (each: 4 prompts -> 4 responses, 2 updates)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--lr", type=float, default=1e-4, help="policy (LoRA) learning rate")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice, one per core); on a "
                                                 "machine busy with other jobs, 1 can be several times faster")
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    gguf = args.gguf or find_smollm2_gguf()
    if not gguf or not Path(gguf).is_file():
        print(search_report() if not args.gguf else f"not a file: {args.gguf}", file=sys.stderr)
        return 1
    import torch

    from rlhfkit.config import build_config
    from rlhfkit.models.loading import is_peft, resolve_source
    from rlhfkit.tasks import write_jsonl
    from rlhfkit.train.supervised.reward import run_rm

    if args.threads:
        torch.set_num_threads(args.threads)
    timings: dict[str, float] = {}
    print(f"[smollm2] GGUF: {gguf}; torch threads {torch.get_num_threads()}")
    t = time.perf_counter()
    resolve_source(gguf)  # converts once; a lookup afterwards
    timings["GGUF conversion / cache lookup"] = time.perf_counter() - t

    # 2. data: preference pairs (train / held out) and PPO prompts
    out = Path(args.out)
    data = out / "data"
    write_jsonl(data / "pref.jsonl", preference_records(QUESTIONS[:N_TRAIN]))
    write_jsonl(data / "pref_eval.jsonl", preference_records(QUESTIONS[N_TRAIN:]))
    write_jsonl(data / "prompts.jsonl", prompt_records(QUESTIONS[:N_TRAIN]))

    # 3. reward model from the GGUF: LoRA backbone + fresh score head, Bradley-Terry on the pairs
    rm_dir = out / "rm"
    rm_cfg = build_config("rm", {}, [
        f"model.name={gguf}", "model.lora.enabled=true", f"train.max_steps={args.rm_steps}", "train.batch_size=4",
        "data.max_length=64", "data.max_prompt_length=48", "optim.lr=5e-4", f"data.train={data / 'pref.jsonl'}",
        f"data.eval={data / 'pref_eval.jsonl'}", f"output_dir={rm_dir}", "track.report=false", "train.resume=never",
    ], source="examples/smollm2_ppo_lora.py")
    t = time.perf_counter()
    rm_metrics = run_rm(rm_cfg)
    timings["run_rm total"] = time.perf_counter() - t

    # 4. PPO with LoRA; critic initialised from the reward model; reference = policy without its adapter.
    #    model.lora.dropout=0: the trainer computes old log-probs and values with the models in train mode, where
    #    LoRA dropout makes them random (and the KL estimate noisy, even negative); without dropout they are exact.
    ppo_dir = out / "ppo"
    episodes = 4 * args.steps
    cfg = build_config("ppo", {}, [
        f"model.name={gguf}", "model.lora.enabled=true", "model.lora.dropout=0", f"reward.model={rm_dir}",
        "critic.init=reward",
        f"data.train={data / 'prompts.jsonl'}", "data.eval_fraction=0", f"output_dir={ppo_dir}",
        f"generation.max_new_tokens={args.max_new_tokens}", "algo.rollout_batch_size=4", "algo.mini_batch_size=4",
        "train.batch_size=2", f"algo.total_episodes={episodes}", "algo.kl.coef=0.05", f"optim.lr={args.lr}",
        "critic.lr=1e-4", "track.sample_every=1", "track.report=false", "train.resume=never",
    ], source="examples/smollm2_ppo_lora.py")

    def check(trainer):
        learner, scorer = trainer.learner, trainer.producer.scorer
        lora_ref = learner.ref is None and is_peft(learner.policy)
        print(f"[smollm2] reference model: {'none loaded' if learner.ref is None else type(learner.ref).__name__}; "
              f"policy is a LoRA (peft) model: {is_peft(learner.policy)} -> the reference is the policy with its "
              f"adapter disabled: {lora_ref}")
        print(f"[smollm2] models in memory: policy (LoRA), critic {type(learner.critic).__name__} (LoRA: "
              f"{is_peft(learner.critic)}), reward model {type(scorer.model).__name__}; reward model reads "
              f"the policy's ids directly: {scorer.same_tokenizer}")
        assert lora_ref, "with LoRA on the policy no separate reference model should be loaded"

    t = time.perf_counter()
    trainer, last = run_timed(cfg, check=check)
    timings["PPO total (load, steps, merge + save)"] = time.perf_counter() - t

    rows = read_metrics(ppo_dir)
    print("[smollm2] PPO per step (lengths in tokens incl. <|im_end|>; * = cut at max_new_tokens, no EOS):")
    print_steps("ppo", rows, trainer.rollouts, [
        ("objective/scores", "score"), ("rewards/model/mean", "rm"), ("objective/kl", "seq_kl"),
        ("objective/rlhf_reward", "rlhf_reward"), ("val/ratio", "ratio"), ("policy/approxkl_avg", "approxkl"),
        ("loss/policy_avg", "pg_loss"), ("loss/value_avg", "vf_loss"), ("response/length_mean", "len"),
        ("response/length_std", "len_std"), ("val/num_eos_tokens", "eos")])
    ended, total, lengths = check_eos_stops(trainer, trainer.producer.eos_ids)
    print(f"[smollm2] {ended}/{total} responses stopped at <|im_end|>, at {len(lengths)} different lengths "
          f"{sorted(lengths)}")
    if rows:
        print(f"[smollm2] step 1 KL {rows[0]['objective/kl']:.4f} (0 = the adapter starts at zero, so the policy "
              f"equals the adapter-disabled reference)")
    assert all(math.isfinite(v) for v in last.values() if isinstance(v, float)), last
    samples = [json.loads(x) for x in (ppo_dir / "samples.jsonl").read_text().splitlines() if x.strip()]
    if samples:
        s = samples[-1]
        print(f"[smollm2] sample of the last step (raw score {s.get('score', float('nan')):.3f}):\n"
              f"  user: {s.get('prompt')!r}\n  assistant: {s.get('response')!r}")

    # 5. reload with plain transformers and answer once (a held-out question)
    prompt = QUESTIONS[N_TRAIN][0]
    t = time.perf_counter()
    reply, n_new, at_eos = reload_and_generate(ppo_dir, messages(prompt))
    timings["reload + greedy generation"] = time.perf_counter() - t
    print(f"[smollm2] reloaded {ppo_dir} with AutoModelForCausalLM (merged, no peft)\n"
          f"[smollm2] user: {messages(prompt)[-1]['content']!r}\n"
          f"[smollm2] assistant ({n_new} tokens, ended at EOS: {at_eos}): {reply!r}")

    print(f"[smollm2] reward model: held-out accuracy {rm_metrics.get('eval/accuracy', float('nan')):.3f}, "
          f"margin {rm_metrics.get('eval/margin_mean', float('nan')):.3f}")
    print("[smollm2] timings:")
    for name, sec in timings.items():
        print(f"  {name:<40} {sec:7.1f} s")
    print_timing_summary("PPO step", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
