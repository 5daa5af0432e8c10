"""Two savings of the online step, each against the way it was done before, in one process on the real
SmolLM2-135M-Instruct (float32; random weights of the same shape with ``--random``):

- the optimizer step: ``torch.optim.AdamW`` per-tensor loop (PyTorch's default on CPU) and ``foreach`` against the
  fused kernel that ``train.lifecycle.optim.build_optimizer`` takes (TRL's default ``adamw_torch_fused``), over the
  model's
  parameters with random gradients;
- the forward of a GRPO batch (``--prompts`` prompts x ``--k`` completions, the prompt ``--prompt-len`` tokens, the
  responses ``--response-len``): ``train.shared.forward.response_logits`` with each prompt run once
  (``share_prompts=True``, the default) against the whole batch (``share_prompts=False``), no-grad and forward +
  backward, the log-probs checked equal.

    .venv/bin/python bench/step_parts.py [--random] [--repeats 5] [--prompts 2 --k 4 --prompt-len 43 --response-len 40]

Timings alternate peer / rlhfkit (``_common.paired_times``); the median of ``--repeats`` after one warm-up. Prints
``RATIO`` lines (peer / rlhfkit: above 1, rlhfkit faster).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from _common import paired_times, ratio_line

CPU = torch.device("cpu")


def load(random: bool):
    from transformers import AutoConfig, AutoModelForCausalLM
    from vs_trl import model_dir

    path = model_dir("cpu", Path(tempfile.mkdtemp(prefix="step_parts_")))
    if random:
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def optimizer_rows(model, repeats: int) -> list[tuple]:
    from rlhfkit.config.schema import OptimConfig
    from rlhfkit.train.lifecycle.optim import build_optimizer

    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    ours = build_optimizer(params, OptimConfig(lr=1e-6))
    loop = torch.optim.AdamW(params, lr=1e-6, foreach=False)
    foreach = torch.optim.AdamW(params, lr=1e-6, foreach=True)
    return [("AdamW step, per-tensor loop (CPU default)", *paired_times(loop.step, ours.step, CPU, repeats, 1)),
            ("AdamW step, foreach", *paired_times(foreach.step, ours.step, CPU, repeats, 1))]


def forward_rows(model, args) -> list[tuple]:
    from rlhfkit.algos import token_logprobs
    from rlhfkit.train.online.experience import position_ids_of
    from rlhfkit.train.shared.forward import response_logits

    g = torch.Generator().manual_seed(0)
    V, P, R = model.config.vocab_size, args.prompt_len, args.response_len
    prompts = torch.randint(0, V, (args.prompts, P), generator=g)
    ids = torch.cat([prompts.repeat(args.k, 1), torch.randint(0, V, (args.prompts * args.k, R), generator=g)], 1)
    mask = torch.ones_like(ids)
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids_of(mask),
             "response_ids": ids[:, P:]}

    def logprobs(share: bool):
        return token_logprobs(response_logits(model, batch, 1.0, share_prompts=share), batch["response_ids"])

    def train(share: bool):
        def run():
            logprobs(share).sum().backward()
            model.zero_grad(set_to_none=True)
        return run

    def no_grad(share: bool):
        def run():
            with torch.no_grad():
                logprobs(share)
        return run

    with torch.no_grad():
        diff = (logprobs(True) - logprobs(False)).abs().max().item()
    print(f"step_parts: shared-prompt log-probs differ from the whole batch's by at most {diff:.2e}")
    model.train()
    shape = f"{args.prompts} prompts x {args.k}, whole batch"
    return [(f"forward + backward, {shape}", *paired_times(train(False), train(True), CPU, args.repeats, 1)),
            (f"no-grad forward, {shape}", *paired_times(no_grad(False), no_grad(True), CPU, args.repeats, 1))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--random", action="store_true", help="random weights of SmolLM2's shape (no GGUF needed)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=43)
    p.add_argument("--response-len", type=int, default=40)
    args = p.parse_args()
    model = load(args.random)
    rows = forward_rows(model, args) + optimizer_rows(model, args.repeats)
    print(f"\n| peer | peer s | rlhfkit s | peer / rlhfkit |  (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)")
    print("|---|---|---|---|")
    for name, peer, ours in rows:
        print(f"| {name} | {peer:.3f} | {ours:.3f} | **{peer / ours:.2f}x** |")
    for name, peer, ours in rows:
        print(ratio_line(f"step_parts {name}", peer, ours))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
