"""Per-token log-probs with gradient: rlhfkit ``token_logprobs`` vs the naive full-vocabulary float32 log_softmax.

What is compared: forward + backward of the log-probability of each label token, from the same bf16 logits
[B, T, V] (the LM head's output), with ``torch.autograd.grad`` of their sum (so no ``.grad`` accumulates).

- rlhfkit: ``token_logprobs(logits, labels)``: chunked fused log_softmax (bf16 in, float32 out) + gather, custom
  backward that recomputes the softmax block by block (never a float32 [B, T, V] kept for backward).
- peer: ``torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None])``, the line found in many trainers
  (DeepSpeed-Chat ``gather_log_probs``, OpenRLHF / TRL before their chunked helpers). Fair: same inputs, same
  outputs (checked below), same float32 accumulation, plain autograd; it is what the naive code really runs.

Reported: time ratio peer/rlhfkit and (CUDA only) peak-memory ratio peer/rlhfkit, measured above the logits.
Sizes: ``--quick`` B=4, T=64, V=4096 (CPU); default B=8, T=1024, V=49152 (SmolLM2's vocabulary), bf16.

    .venv/bin/python bench/logprobs.py --quick       # CPU smoke (time only)
    python bench/logprobs.py                         # CUDA
"""

from __future__ import annotations

import torch
from _common import paired_times, parse_args, peak_memory, ratio_line

from rlhfkit.algos import token_logprobs


def naive_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def sizes(quick: bool) -> tuple[int, int, int]:
    return (4, 64, 4096) if quick else (8, 1024, 49152)


def measure(device: torch.device, quick: bool, repeats: int | None = None) -> dict:
    """Run the comparison; returns the ratio line and the numbers behind it."""
    B, T, V = sizes(quick)
    repeats = repeats or (5 if quick else 10)
    g = torch.Generator(device="cpu").manual_seed(0)
    logits = (torch.randn(B, T, V, generator=g) * 3).to(device=device, dtype=torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, V, (B, T), generator=g).to(device)

    def step(fn):
        def run():
            lp = fn(logits, labels)
            (grad,) = torch.autograd.grad(lp.sum(), logits)
            return lp, grad
        return run

    ours, peer = step(token_logprobs), step(naive_logprobs)
    lp_o, g_o = ours()
    lp_p, g_p = peer()
    err_lp = (lp_o - lp_p).abs().max().item()
    err_g = (g_o.float() - g_p.float()).abs().max().item()
    del lp_o, g_o, lp_p, g_p
    t_peer, t_ours = paired_times(peer, ours, device, repeats)
    m_peer = peak_memory(peer, device)
    m_ours = peak_memory(ours, device)
    extra = f"B={B} T={T} V={V} bf16 fwd+bwd; max |diff| logp {err_lp:.1e}, grad {err_g:.1e}"
    line = ratio_line("token_logprobs vs naive log_softmax(float)", t_peer, t_ours, m_peer, m_ours, extra)
    return {"line": line, "time_ratio": t_peer / t_ours,
            "mem_ratio": None if m_ours is None else m_peer / max(m_ours, 1.0), "err_logp": err_lp, "err_grad": err_g}


def main() -> None:
    args = parse_args(__doc__)
    torch.manual_seed(0)
    print(f"device {args.device}, torch {torch.__version__}")
    print(measure(args.device, args.quick, args.repeats)["line"])


if __name__ == "__main__":
    main()
