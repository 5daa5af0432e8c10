"""Shared helpers of the benchmarks: device choice, timing (warm-up + median), peak CUDA memory, model configs.

Every benchmark reports RATIOS between rlhfkit and a peer measured in the same process, on the same inputs, so
the numbers mean something across machines; absolute times are printed only as context.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
import traceback
from collections.abc import Callable

import torch

# SmolLM2-135M's shape (HuggingFaceTB/SmolLM2-135M config.json), built from config with random weights.
SMOLLM2 = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192,
               rope_theta=100000.0, rms_norm_eps=1e-5, eos_token_id=2, bos_token_id=1, pad_token_id=2)
# A tiny Llama for --quick runs on CPU (same code paths, seconds instead of minutes).
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=2048, tie_word_embeddings=True, max_position_embeddings=512,
            rms_norm_eps=1e-5, eos_token_id=2, bos_token_id=1, pad_token_id=0)


def parse_args(doc: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes (CPU smoke run); default on CPU")
    p.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (median reported)")
    if extra:
        extra(p)
    args = p.parse_args()
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.device.type == "cpu":
        args.quick = True
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], object], device: torch.device, repeats: int = 5, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs, after ``warmup`` untimed runs."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def paired_times(peer: Callable[[], object], ours: Callable[[], object], device: torch.device, repeats: int = 5,
                 warmup: int = 2) -> tuple[float, float]:
    """Median times of ``peer`` and ``ours``, timed in alternation (so clock / load drift hits both alike)."""
    for _ in range(warmup):
        peer()
        ours()
    t_peer, t_ours = [], []
    for _ in range(repeats):
        t_peer.append(median_time(peer, device, 1, warmup=0))
        t_ours.append(median_time(ours, device, 1, warmup=0))
    return statistics.median(t_peer), statistics.median(t_ours)


def peak_memory(fn: Callable[[], object], device: torch.device) -> float | None:
    """Peak CUDA memory allocated by ``fn()`` above what was allocated before it, in bytes (None on CPU)."""
    if device.type != "cuda":
        return None
    gc.collect()
    torch.cuda.empty_cache()
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return float(torch.cuda.max_memory_allocated(device) - base)


def mib(x: float | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:.0f} MiB"


def ratio_line(name: str, peer_t: float, ours_t: float, peer_m: float | None = None,
               ours_m: float | None = None, extra: str = "") -> str:
    """One greppable line: ``RATIO <name>: time peer/rlhfkit = 2.10x; peak-mem peer/rlhfkit = 3.0x``."""
    line = f"RATIO {name}: time peer/rlhfkit = {peer_t / ours_t:.2f}x ({peer_t * 1e3:.1f} ms vs {ours_t * 1e3:.1f} ms)"
    if peer_m is not None and ours_m is not None:
        line += f"; peak-mem peer/rlhfkit = {peer_m / max(ours_m, 1.0):.2f}x ({mib(peer_m)} vs {mib(ours_m)})"
    return line + (f"; {extra}" if extra else "")


def llama(device: torch.device, quick: bool, dtype: torch.dtype | None = None, seq_cls: bool = False, **over):
    """A Llama with random weights: SmolLM2-135M's shape, or :data:`TINY` with ``quick``; bf16 on CUDA."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, LlamaConfig

    cfg = LlamaConfig(**{**(TINY if quick else SMOLLM2), **over})
    if seq_cls:
        cfg.num_labels = 1
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    cls = AutoModelForSequenceClassification if seq_cls else AutoModelForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        return cls.from_config(cfg, dtype=dtype)


def _embedding_only(model) -> None:
    """Zero every layer's output projections (``o_proj``, ``down_proj``) and set the final RMSNorm's weight to 1: the
    last hidden state is then the current token's embedding, RMS-normalised (the rigs below build on it; dense
    matmuls cost the same with zeros, so the compute is the model's)."""
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    model.model.norm.weight.fill_(1.0)


def rig_lengths(model, mean_len: float, eos_id: int, keep: tuple[int, ...] = (), seed: int = 0) -> int:
    """Make a Llama-family model (any shape, tied or untied head) answer with lengths drawn from Geometric(1 /
    ``mean_len``) when sampled at temperature 1, in any framework (no hook: the weights do it). Returns the number
    of trigger tokens.

    Every layer's output projections (``o_proj``, ``down_proj``) are zeroed, so the last hidden state is the current
    token's embedding: the next-token logits are ``E @ rmsnorm(e_cur)`` with the embeddings E (the head: E as well).
    E's rows are small random vectors orthogonal to one unit vector u, so the next token is close to uniform over the
    vocabulary; V / ``mean_len`` *trigger* tokens have the embedding a u, and EOS has A u with A large: after a
    trigger EOS is certain, after any other token EOS has logit 0 like the rest. So each token ends the answer with
    probability 1 / ``mean_len``: the same long-tailed (exponential) length distribution for every framework, the
    longest of 64 answers about 4.7 x the mean, cut at max_new_tokens. The compute is the model's (dense matmuls cost
    the same with zeros); ``keep`` (and ``eos_id``): token ids never made triggers (pad, bos, the other EOS ids)."""
    emb = model.get_input_embeddings().weight
    V, H = emb.shape
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        _embedding_only(model)
        u = torch.randn(H, generator=g, dtype=torch.float64)
        u /= u.norm()
        E = torch.randn(V, H, generator=g, dtype=torch.float64)
        E -= (E @ u)[:, None] * u[None, :]  # orthogonal to u: no token but a trigger points at EOS
        E /= H  # logits ~ N(0, 1/H): close to uniform sampling
        candidates = torch.tensor([i for i in range(V) if i != eos_id and i not in keep])
        n = max(1, round(V / mean_len))
        triggers = candidates[torch.randperm(len(candidates), generator=g)[:n]]
        E[triggers] = u / H ** 0.5  # the same norm as the others
        E[eos_id] = u * 40.0 / H ** 0.5  # after a trigger (hidden state sqrt(H) u): EOS logit 40
        emb.copy_(E.to(emb.dtype))
        head = model.get_output_embeddings()
        if head is not None and head.weight is not emb:
            head.weight.copy_(E.to(head.weight.dtype))
            if getattr(head, "bias", None) is not None:
                head.bias.zero_()
    return n


def chain_lengths(prompts: int, mean_len: float, max_new: int) -> list[int]:
    """Answer lengths (tokens, EOS included) for ``prompts`` prompts under :func:`rig_chain`: the quantiles
    ``(i + 1/2) / prompts`` of the exponential distribution of mean ``mean_len``, each in [1, ``max_new``]. A long
    tail (the longest of 32 ~4.2 x the mean) that every framework generates exactly: equal work by construction."""
    return [min(max_new, max(1, round(-mean_len * math.log(1 - (i + 0.5) / prompts)))) for i in range(prompts)]


def rig_chain(model, levels: int, eos_ids: tuple[int, ...], keep: tuple[int, ...] = (), per_level: int = 64,
              seed: int = 0, strength: float = 40.0) -> list[list[int]]:
    """Make a Llama-family model answer a prompt whose last token is at *level* r with exactly r more tokens and
    then EOS, whatever the sampling (temperature 1, top-k, top-p): the answer's length is set by the prompt, so
    every framework generates the same number of tokens for the same prompts (:func:`rig_lengths` draws lengths at
    random instead, which needs hundreds of answers per row before two rows agree within 10 %). Returns the token
    ids of each level (``levels`` of them, ``per_level`` each, fewer when the vocabulary is small).

    As in :func:`rig_lengths` the layers' output projections are zeroed, so the last hidden state is the current
    token's embedding after the final RMSNorm (weight 1): level r's tokens have the embedding of one unit vector
    d_r (orthonormal across levels while ``levels`` <= the hidden size), level r-1's tokens the head row
    ``strength`` d_r / sqrt(H), EOS (every id in ``eos_ids`` but the first left at 0) the row of d_0, and every
    other head row is 0. After a level-r token, level r-1's tokens have logit ``strength`` and every other token 0:
    the next token is one of level r-1's (uniformly: the answers' words differ, their lengths do not) with
    probability 1 - V e^-strength. The head is untied from the embeddings (a tied head cannot point from level r to
    r-1 rather than to r itself): under LoRA both frameworks freeze it, so the step's compute is the tied model's,
    and its memory one V x H matrix more. The transitions are checked with the model's own forward."""
    emb = model.get_input_embeddings().weight
    V, H = emb.shape
    g = torch.Generator().manual_seed(seed)
    reserved = set(eos_ids) | set(keep)
    candidates = torch.tensor([i for i in range(V) if i not in reserved])
    per_level = min(per_level, len(candidates) // levels)
    if per_level < 1:
        raise ValueError(f"rig_chain: {levels} levels do not fit a vocabulary of {V}")
    chosen = candidates[torch.randperm(len(candidates), generator=g)[: levels * per_level]].view(levels, per_level)
    basis = torch.randn(H, levels, generator=g, dtype=torch.float64)
    if levels <= H:
        basis, _ = torch.linalg.qr(basis)  # orthonormal columns: no level's logits leak into another's
    dirs = (basis / basis.norm(dim=0, keepdim=True)).T  # (levels, H), unit rows
    with torch.no_grad():
        _embedding_only(model)
        head = model.get_output_embeddings()
        if head.weight.data_ptr() == emb.data_ptr():
            head.weight = torch.nn.Parameter(emb.detach().clone())
        model.config.get_text_config().tie_word_embeddings = False  # the model's own config for a causal LM
        E = emb.detach().to(torch.float64).clone()
        W = torch.zeros(V, H, dtype=torch.float64)
        scale = float(E.norm(dim=1).mean())
        for r in range(levels):
            E[chosen[r]] = dirs[r] * scale
            if r + 1 < levels:
                W[chosen[r]] = dirs[r + 1] * strength / H ** 0.5
        W[eos_ids[0]] = dirs[0] * strength / H ** 0.5
        emb.copy_(E.to(emb.dtype))
        head.weight.copy_(W.to(head.weight.dtype))
        if getattr(head, "bias", None) is not None:
            head.bias.zero_()
        # the check, with the model's forward: each level's first token, one position each
        ids = chosen[:, :1]
        probs = torch.cat([model(input_ids=ids[i:i + 64]).logits[:, -1].float().softmax(-1)
                           for i in range(0, levels, 64)])
        for r in range(levels):
            target = chosen[r - 1] if r else torch.tensor([eos_ids[0]])
            if float(probs[r, target].sum()) < 1 - 1e-4:
                raise RuntimeError(f"rig_chain: level {r} goes on the chain with probability "
                                   f"{float(probs[r, target].sum()):.6f} only")
    return chosen.tolist()


ROWS: list[tuple[str, str, str]] = []  # (check, status, result) rows of gpu_check's table
ONLY: list[str] = []  # letters of the checks to run (gpu_check --only c,h); empty: all


def check(name: str):
    """Decorator that runs the function at once; its ``(status, text)`` or its error becomes a table row. A check
    whose letter ("(c) ..." -> "c") is not in :data:`ONLY` (when set) is skipped without a row."""
    def wrap(fn):
        if ONLY and name[1:2] not in ONLY:
            return fn
        t0 = time.perf_counter()
        try:
            status, text = fn()
        except Exception as e:  # every failure becomes a FAIL row, never a crash
            traceback.print_exc()
            status, text = "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
        ROWS.append((name, status, text))
        print(f"[{time.perf_counter() - t0:6.1f}s] {name}: {status} {text}", flush=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return fn
    return wrap


def print_table(where: str) -> None:
    print("\n" + f"{'check':44} {'status':6} result")
    print("-" * 110)
    for row in ROWS:
        print(f"{row[0]:44} {row[1]:6} {row[2]}")
    fails = sum(r[1] == "FAIL" for r in ROWS)
    print(f"{len(ROWS) - fails}/{len(ROWS)} without FAIL on {where}")
