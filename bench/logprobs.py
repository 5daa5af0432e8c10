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

``--head``: the LM head included (what training runs since issue 32): from the final hidden states [B, T, H] and the
head's weight [V, H] at Qwen's vocabulary (V = 151,936) to the label log-probs (with gradient) and the entropies (a
metric), forward + backward, in four ways, each a row:

- ``naive``: logits = h W^T, then the float32 ``log_softmax`` of all of them (DeepSpeed-Chat's ``gather_log_probs``);
- ``trl``: logits, TRL's ``selective_log_softmax`` and ``entropy_from_logits`` (TRL's GRPO / PPO trainers; only when
  ``trl`` imports, i.e. under ``.venv-trl``: the row says so otherwise);
- ``logits + chunked``: logits, then rlhfkit's chunked ``token_logprobs`` / ``entropy_from_logits`` (rlhfkit before
  issue 32);
- ``fused``: rlhfkit's ``linear_token_stats`` (no logits: chunks of tokens through the head, recomputed in backward).

Per row: the bytes autograd keeps between forward and backward beyond the inputs (counted by saved-tensor hooks), the
peak bytes above the inputs (CPU: every tensor the ops allocate and free, by ``torch.distributed._tools.MemTracker``;
CUDA: ``torch.cuda.max_memory_allocated``), and the time. These byte counts do not depend on the machine's load.
Sizes: CPU B=4, T=256, H=256 float32; CUDA B=8, T=1024, H=4096 (Qwen3-8B's head) bf16.

    .venv/bin/python bench/logprobs.py --quick       # CPU smoke (time only)
    .venv/bin/python bench/logprobs.py --head        # the head rows, CPU (bytes are exact; times only context)
    python bench/logprobs.py [--head]                # CUDA
"""

from __future__ import annotations

import torch
from _common import median_time, paired_times, parse_args, peak_memory, ratio_line

from rlhfkit.algos import entropy_from_logits, linear_token_stats, token_logprobs

QWEN_VOCAB = 151_936


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


# ─────────────────────────────────────────── the LM head included ────────────────────────────────────────────


def head_sizes(device: torch.device, quick: bool) -> dict:
    if device.type == "cpu" or quick:
        return {"B": 4, "T": 256, "H": 256, "V": QWEN_VOCAB, "dtype": torch.float32}
    return {"B": 8, "T": 1024, "H": 4096, "V": QWEN_VOCAB, "dtype": torch.bfloat16}


def head_methods() -> dict:
    """name -> fn(hidden, weight, labels) -> (log-probs with gradient, entropies detached), or a reason it is absent."""

    def naive(h, w, y):
        logp = torch.log_softmax((h @ w.t()).float(), -1)
        with torch.no_grad():
            ent = -(logp.exp() * logp).sum(-1)
        return logp.gather(-1, y[..., None]).squeeze(-1), ent

    def chunked(h, w, y):
        logits = h @ w.t()
        return token_logprobs(logits, y), entropy_from_logits(logits.detach())

    def fused(h, w, y):
        st = linear_token_stats(h, w, y, entropy=True)
        return st.logprobs, st.entropy.detach()

    out = {"naive": naive}
    try:
        from trl.trainer.utils import entropy_from_logits as trl_entropy
        from trl.trainer.utils import selective_log_softmax

        def trl(h, w, y):
            logits = h @ w.t()
            with torch.no_grad():
                ent = trl_entropy(logits)
            return selective_log_softmax(logits, y), ent

        out["trl"] = trl
    except ImportError:
        out["trl"] = "trl not importable here: run under .venv-trl (make bench-trl builds it)"
    out["logits + chunked"] = chunked
    out["fused"] = fused
    return out


def saved_bytes(fn, inputs: tuple) -> int:
    """Bytes of the distinct storages autograd keeps for backward, the inputs' own left out."""
    own = {t.untyped_storage().data_ptr() for t in inputs}
    kept: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            kept[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _ = fn(*inputs)
    del lp
    return sum(kept.values())


def peak_bytes(run, inputs: tuple, device: torch.device) -> float | None:
    """Peak bytes above the inputs while ``run()`` (forward + backward) goes: CUDA's allocator, or on CPU every
    tensor the ops make and free (``MemTracker``)."""
    if device.type == "cuda":
        return peak_memory(run, device)
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:  # pragma: no cover - a torch without it
        return None
    mt = MemTracker()
    mt.track_external(*inputs)
    with mt:
        run()
    snap = mt.get_tracker_snapshot("peak")
    dev = next(iter(snap))
    return float(snap[dev]["Total"] - sum(t.untyped_storage().nbytes() for t in inputs))


def head_rows(device: torch.device, quick: bool, repeats: int | None = None, sizes: dict | None = None) -> dict:
    """The four ways side by side (see the module docstring): rows of saved bytes, peak bytes, time, errors."""
    z = sizes or head_sizes(device, quick)
    B, T, H, V, dtype = z["B"], z["T"], z["H"], z["V"], z["dtype"]
    g = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(B, T, H, generator=g).to(device, dtype).requires_grad_(True)
    weight = (torch.randn(V, H, generator=g) / H**0.5).to(device, dtype).requires_grad_(True)
    labels = torch.randint(0, V, (B, T), generator=g).to(device)
    inputs = (hidden, weight, labels)
    rows, ref = [], None
    for name, fn in head_methods().items():
        if isinstance(fn, str):
            rows.append({"name": name, "absent": fn})
            continue

        def run(fn=fn):
            lp, ent = fn(*inputs)
            grads = torch.autograd.grad(lp.sum(), (hidden, weight))
            return lp.detach(), ent, grads

        lp, ent, grads = run()
        if ref is None:
            ref = (lp, ent, grads)
        err = max((lp - ref[0]).abs().max().item(), (ent - ref[1]).abs().max().item(),
                  *((a.float() - b.float()).abs().max().item() for a, b in zip(grads, ref[2])))
        del lp, ent, grads
        saved = saved_bytes(fn, inputs)
        peak = peak_bytes(run, inputs, device)
        t = median_time(run, device, repeats or (1 if device.type == "cpu" else 5), warmup=1)
        rows.append({"name": name, "saved": saved, "peak": peak, "seconds": t, "err": err})
    return {"sizes": z, "rows": rows}


def print_head_rows(result: dict) -> None:
    z = result["sizes"]
    gib = lambda x: "n/a" if x is None else f"{x / 2**20:,.0f} MiB"  # noqa: E731
    logits = z["B"] * z["T"] * z["V"] * torch.finfo(z["dtype"]).bits // 8
    print(f"LM head + log-probs (+ entropy), forward + backward: B={z['B']} T={z['T']} H={z['H']} V={z['V']} "
          f"{str(z['dtype']).replace('torch.', '')}; one [B, T, V] logits tensor = {gib(logits)}")
    print(f"{'way':18} {'kept for backward':>18} {'peak above inputs':>18} {'time':>10}  max |diff| vs naive")
    fused = next(r for r in result["rows"] if r["name"] == "fused")
    for r in result["rows"]:
        if "absent" in r:
            print(f"{r['name']:18} {r['absent']}")
            continue
        print(f"{r['name']:18} {gib(r['saved']):>18} {gib(r['peak']):>18} {r['seconds'] * 1e3:8.1f}ms  {r['err']:.1e}")
    for r in result["rows"]:
        if "absent" not in r and r is not fused and fused["peak"]:
            print(f"RATIO fused head vs {r['name']}: peak-mem {r['name']}/rlhfkit = {r['peak'] / fused['peak']:.1f}x "
                  f"({gib(r['peak'])} vs {gib(fused['peak'])}); kept for backward {gib(r['saved'])} vs "
                  f"{gib(fused['saved'])}; time {r['seconds'] / fused['seconds']:.2f}x")


def main() -> None:
    args = parse_args(__doc__, lambda p: p.add_argument("--head", action="store_true",
                                                        help="the LM head included: plain vs fused (bytes)"))
    torch.manual_seed(0)
    print(f"device {args.device}, torch {torch.__version__}")
    if args.head:
        print_head_rows(head_rows(args.device, args.quick, args.repeats))
        return
    print(measure(args.device, args.quick, args.repeats)["line"])


if __name__ == "__main__":
    main()
