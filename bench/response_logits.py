"""Log-probs of the response tokens only: rlhfkit ``response_logits`` (LM head on the last R+1 positions) vs a full
forward that computes logits at every position and slices the response part afterwards.

What is compared, on a SmolLM2-135M-shaped Llama with random weights (bf16 on CUDA), prompt P + response R tokens:

- rlhfkit: ``response_logits(model, batch, 1.0)`` -> ``model(..., logits_to_keep=R + 1)`` (transformers slices the
  hidden states before the LM head), then ``token_logprobs``.
- peer: ``model(...).logits[:, P - 1:-1]`` then the same ``token_logprobs``: the common pattern of PPO trainers
  (DeepSpeed-Chat ``actor_model(seq).logits[:, start - 1:-1]``, TRL's PPOTrainer before ``logits_to_keep``).
  Fair: identical model, inputs and log-prob function, so the ratio isolates the prompt positions' logits
  ([B, P, V] computed and held for nothing). The outputs are checked to agree.

Two modes: ``no_grad`` (old / reference log-probs of the experience phase) and ``train`` (forward + backward of the
summed log-probs, as in a PPO micro-step). Time ratio and, on CUDA, peak-memory ratio (above the model).
Sizes: ``--quick`` tiny Llama, B=4, P=48, R=16 (CPU); default B=16, P=256, R=128.

    .venv/bin/python bench/response_logits.py --quick
    python bench/response_logits.py [--batch 16 --prompt 256 --response 128]
"""

from __future__ import annotations

import torch
from _common import llama, paired_times, parse_args, peak_memory, ratio_line

from rlhfkit.algos import token_logprobs
from rlhfkit.train.online.experience import position_ids_of
from rlhfkit.train.shared.forward import response_logits


def make_batch(model, B: int, P: int, R: int, device: torch.device) -> dict:
    g = torch.Generator(device="cpu").manual_seed(0)
    V = model.config.vocab_size
    ids = torch.randint(3, V, (B, P + R), generator=g)
    mask = torch.ones_like(ids)
    mask[1::2, : P // 4] = 0  # every other prompt left-padded, as rollouts are
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids_of(mask),
             "response_ids": ids[:, P:]}
    return {k: v.to(device) for k, v in batch.items()}


def ours_logprobs(model, batch: dict) -> torch.Tensor:
    return token_logprobs(response_logits(model, batch, 1.0), batch["response_ids"])


def peer_logprobs(model, batch: dict) -> torch.Tensor:
    P = batch["input_ids"].shape[1] - batch["response_ids"].shape[1]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"], use_cache=False).logits[:, P - 1:-1]
    return token_logprobs(logits, batch["response_ids"])


def measure(device: torch.device, quick: bool, repeats: int | None = None, B: int | None = None,
            P: int | None = None, R: int | None = None, model=None) -> dict:
    """Both modes; returns ratio lines and the numbers behind them. ``model``: reuse one (gpu_check)."""
    B, P, R = B or (4 if quick else 16), P or (48 if quick else 256), R or (16 if quick else 128)
    repeats = repeats or (3 if quick else 10)
    model = model if model is not None else llama(device, quick)
    batch = make_batch(model, B, P, R, device)
    out: dict = {"lines": []}
    with torch.no_grad():
        err = (ours_logprobs(model, batch) - peer_logprobs(model, batch)).abs().max().item()
    out["err"] = err
    for mode in ("no_grad", "train"):
        def run(fn, mode=mode):
            if mode == "no_grad":
                with torch.no_grad():
                    return fn(model, batch)
            model.zero_grad(set_to_none=True)
            fn(model, batch).sum().backward()

        ours, peer = (lambda: run(ours_logprobs)), (lambda: run(peer_logprobs))
        t_peer, t_ours = paired_times(peer, ours, device, repeats)
        m_peer, m_ours = peak_memory(peer, device), peak_memory(ours, device)
        model.zero_grad(set_to_none=True)
        extra = f"B={B} P={P} R={R} V={model.config.vocab_size}; max |diff| logp {err:.1e}"
        out["lines"].append(ratio_line(f"response_logits vs full-logits slice ({mode})", t_peer, t_ours,
                                       m_peer, m_ours, extra))
        out[mode] = {"time_ratio": t_peer / t_ours, "mem_ratio": None if m_ours is None else m_peer / max(m_ours, 1)}
    return out


def main() -> None:
    def extra(p):
        p.add_argument("--batch", type=int)
        p.add_argument("--prompt", type=int)
        p.add_argument("--response", type=int)

    args = parse_args(__doc__, extra)
    print(f"device {args.device}, torch {torch.__version__}")
    res = measure(args.device, args.quick, args.repeats, args.batch, args.prompt, args.response)
    print("\n".join(res["lines"]))


if __name__ == "__main__":
    main()
