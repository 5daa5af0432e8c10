"""GRPO with LoRA on a real model, SmolLM2-135M-Instruct from its GGUF file, with rule rewards (no reward model).

    .venv/bin/python examples/smollm2_grpo.py [--gguf PATH] [--out runs/smollm2-grpo] [--steps 4] [--threads 1]

1. find the GGUF file (``examples/smollm2.py``) and convert it once (cached);
2. write a tiny prompt set: "What is 2+3? Answer with the number only." with an ``answer`` field ("5");
3. GRPO (``recipe=grpo``: group-normalised advantages, no critic, k3 KL to the reference in the loss) with LoRA;
   the reference is the policy with its adapter disabled. Each step: 2 prompts x 4 completions (24 new tokens at
   most). The reward is the weighted sum of three built-in rules on the ``answer`` field: ``regex_match`` (the
   reply's last number is the answer, weight 1), ``exact_match`` (the reply is only the number, weight 0.5) and
   ``length_target`` (0 at 10 characters, -1 at 20; weight 0.1), so even a group without a right answer has a
   signal; responses that never reach ``<|im_end|>`` lose 1 more (``reward.missing_eos_penalty``);
4. per step: reward mean (and per rule), KL, ratio, response lengths, and the time in rollout / scoring / forward
   passes / update; then the written policy is reloaded with plain ``transformers`` and answers a question.

The phase timers and the summary printing come from ``examples/smollm2_ppo_lora.py``. docs/real-models.md lists
measured numbers.
"""

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
from smollm2_ppo_lora import (  # noqa: E402
    check_eos_stops,
    print_steps,
    print_timing_summary,
    read_metrics,
    reload_and_generate,
    run_timed,
)

SUMS = [(2, 3), (4, 4), (1, 6), (3, 5), (2, 7), (5, 4), (6, 3), (1, 1)]
HELD_OUT = (3, 4)


def question(a: int, b: int) -> str:
    return f"What is {a}+{b}? Answer with the number only."


def prompt_records() -> list[dict]:
    return [{"prompt": question(a, b), "answer": str(a + b)} for a, b in SUMS]


# The reward: a weighted sum of built-in rules, each logged as rewards/<name>/mean (raw values, before the weight).
REWARD_FUNCTIONS = [
    # 1 when the last number in the reply is the answer ("3 + 4 = 7" counts), else 0
    {"fn": "regex_match", "name": "correct", "weight": 1.0, "kwargs": {"pattern": r"(\d+)\D*$"}},
    # 1 when the reply is exactly the number ("7"), as the prompt asks
    {"fn": "exact_match", "name": "number_only", "weight": 0.5},
    # -|characters - 10| / 10: shorter replies score higher, so a group where every reply is wrong still has a signal
    {"fn": "length_target", "name": "length", "weight": 0.1, "kwargs": {"target": 10}},
]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", help="path to SmolLM2-135M-Instruct.Q4_1.gguf (default: found by examples/smollm2.py)")
    ap.add_argument("--out", default="runs/smollm2-grpo", help="run directory (the merged policy lands here)")
    ap.add_argument("--steps", type=int, default=4, help="GRPO steps (each: 2 prompts x 4 completions, 2 updates)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--lr", type=float, default=1e-4, help="LoRA learning rate")
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

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"[smollm2] GGUF: {gguf}; torch threads {torch.get_num_threads()}")
    resolve_source(gguf)  # converts once; a lookup afterwards

    out = Path(args.out)
    write_jsonl(out / "data" / "prompts.jsonl", prompt_records())

    # GRPO recipe defaults: advantage grpo, num_generations 4, KL k3 in the loss (coef 0.04), no reward normalisation.
    # model.lora.dropout=0: old log-probs are computed with the policy in train mode (see smollm2_ppo_lora.py).
    k, prompts_per_step = 4, 2
    cfg = build_config("grpo", {"reward": {"functions": REWARD_FUNCTIONS}}, [
        f"model.name={gguf}", "model.lora.enabled=true", "model.lora.dropout=0",
        f"data.train={out / 'data' / 'prompts.jsonl'}", "data.eval_fraction=0", f"output_dir={out}",
        f"generation.max_new_tokens={args.max_new_tokens}", f"algo.num_generations={k}",
        f"algo.rollout_batch_size={prompts_per_step}", f"algo.mini_batch_size={k * prompts_per_step}",
        "train.batch_size=4", f"algo.total_episodes={k * prompts_per_step * args.steps}", f"optim.lr={args.lr}",
        "track.sample_every=1", "track.report=false", "train.resume=never",
        "algo.ppo_epochs=2",  # two passes per rollout, as the runs docs/real-models.md shows (grpo's default: one)
        "reward.missing_eos_scope=all",  # as those runs: the penalty on every unended answer (grpo's default: varied)
    ], source="examples/smollm2_grpo.py")

    def check(trainer):
        print(f"[smollm2] critic: {trainer.critic}; reference model: "
              f"{'none loaded (the policy with its adapter disabled)' if trainer.ref is None else 'loaded'}; "
              f"reward functions: {trainer.functions.names}")
        assert trainer.ref is None and is_peft(trainer.policy) and trainer.critic is None

    t = time.perf_counter()
    trainer, last = run_timed(cfg, check=check)
    total = time.perf_counter() - t

    rows = read_metrics(out)
    print(f"[smollm2] GRPO per step ({prompts_per_step} prompts x {k}; lengths in tokens incl. <|im_end|>; "
          "* = cut at max_new_tokens):")
    print_steps("grpo", rows, trainer.steps, [
        ("objective/scores", "reward"), ("rewards/correct/mean", "correct"),
        ("rewards/number_only/mean", "number_only"), ("rewards/length/mean", "length_rule"),
        ("objective/kl", "seq_kl"), ("val/ratio", "ratio"),
        ("policy/approxkl_avg", "approxkl"), ("loss/policy_avg", "loss"), ("response/length_mean", "len"),
        ("val/num_eos_tokens", "eos")])
    ended, n, lengths = check_eos_stops(trainer, trainer.eos_ids)
    print(f"[smollm2] {ended}/{n} responses stopped at <|im_end|>, at {len(lengths)} different lengths "
          f"{sorted(lengths)}")
    assert all(math.isfinite(v) for v in last.values() if isinstance(v, float)), last
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines() if x.strip()]
    last_step = max(s["step"] for s in samples)
    print("[smollm2] the last step's group(s):")
    for s in (s for s in samples if s["step"] == last_step):
        print(f"  {s['prompt']!r} -> {s['response']!r} (reward {s['score']:.3f})")

    t = time.perf_counter()
    held_out = question(*HELD_OUT)
    reply, n_new, at_eos = reload_and_generate(out, [{"role": "user", "content": held_out}], max_new_tokens=24)
    reload_s = time.perf_counter() - t
    print(f"[smollm2] reloaded {out} with AutoModelForCausalLM (merged, no peft)\n[smollm2] user: {held_out!r}\n"
          f"[smollm2] assistant ({n_new} tokens, ended at EOS: {at_eos}): {reply!r}")

    print("[smollm2] timings:")
    print(f"  {'GRPO total (load, steps, merge + save)':<40} {total:7.1f} s")
    print(f"  {'reload + greedy generation':<40} {reload_s:7.1f} s")
    print_timing_summary("GRPO step", trainer.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
