"""Each model family's static and continuous decode against ``hf`` (eager ``generate``) on the same prompts:
tokens/s, the path the static engine took (rlhfkit's decoder or the model's own modules over its cache), whether the
continuous engine's paged decoder covers it (else it hands the model to the static engine, as it does in a run),
and whether each engine's greedy tokens are hf's (teacher-forced: each token the argmax of the model's own full
forward, up to bf16 near-ties).

Models: random weights in the shape of a published checkpoint (config.json values; bf16 on CUDA), or with ``--quick``
(the default on CPU) a tiny model of each family (2 layers, hidden 64, windows of 8 tokens), float32. Shapes:

    qwen3-0.6b      Qwen3-0.6B (per-head q/k norms)              decoder
    qwen2.5-0.5b    Qwen2.5-0.5B (q/k/v biases, tied)            decoder
    llama-3.2-1b    Llama-3.2-1B (llama3 RoPE scaling)           decoder
    gemma3-1b       Gemma-3-1B (local 512-token windows + global) decoder
    gemma2-2b/8     Gemma-2-2B's layer, 8 of its 26 layers       decoder (soft-capped eager attention)
    mistral-sw      SmolLM2-135M's shape as Mistral, window 128  decoder
    phi3.5-mini/8   Phi-3.5-mini's layer, 8 of its 32 layers     decoder (fused qkv / gate_up)
    olmo2-1b        OLMo-2-0425-1B                                the model's own modules (generic path)

Batch 32, prompts of 64 tokens, 128 new tokens (``min_new_tokens`` = ``max_new_tokens``: every engine generates the
same count); static as ``generation.engine=auto`` runs it (CUDA graphs on CUDA, uncompiled), its first call (capture)
timed apart; continuous with every request in a slot (its CUDA graphs captured per call, so its first call is timed
with the others). bench/gpu_check.py's rows (g) and bench/gpu_suite.py's row 5 are these.

    python bench/families.py [--families qwen3-0.6b,gemma3-1b] [--quick]
"""

from __future__ import annotations

import gc

import torch
import transformers
from _common import parse_args

from rlhfkit.rollout import ContinuousEngine, HFEngine, SamplingParams, StaticEngine
from rlhfkit.rollout.decoder import coverage

EOS, PAD = 1, 0
SHAPES = {  # name -> (config class prefix, config.json values, the static engine's path)
    "qwen3-0.6b": ("Qwen3", dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                                 num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
                                 tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6), "decoder"),
    "qwen2.5-0.5b": ("Qwen2", dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                   num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                                   tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6), "decoder"),
    "llama-3.2-1b": ("Llama", dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                   num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
                                   tie_word_embeddings=True, rms_norm_eps=1e-5, rope_scaling=dict(
                                       rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=8192), rope_theta=500000.0), "decoder"),
    "gemma3-1b": ("Gemma3Text", dict(hidden_size=1152, num_hidden_layers=26, num_attention_heads=4,
                                     num_key_value_heads=1, head_dim=256, intermediate_size=6912, vocab_size=262144,
                                     query_pre_attn_scalar=256, sliding_window=512, rms_norm_eps=1e-6), "decoder"),
    "gemma2-2b/8": ("Gemma2", dict(hidden_size=2304, num_hidden_layers=8, num_attention_heads=8,
                                   num_key_value_heads=4, head_dim=256, intermediate_size=9216, vocab_size=256000,
                                   query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                                   final_logit_softcapping=30.0), "decoder"),
    "mistral-sw": ("Mistral", dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                                   num_key_value_heads=3, head_dim=64, intermediate_size=1536, vocab_size=49152,
                                   sliding_window=128), "decoder"),
    "phi3.5-mini/8": ("Phi3", dict(hidden_size=3072, num_hidden_layers=8, num_attention_heads=32,
                                   num_key_value_heads=32, intermediate_size=8192, vocab_size=32064,
                                   sliding_window=262144), "decoder"),
    "olmo2-1b": ("Olmo2", dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
                               num_key_value_heads=16, intermediate_size=8192, vocab_size=100352,
                               rope_theta=500000.0), "modules"),
}
QUICK = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
             vocab_size=512)
QUICK_HEAD_DIM = {"Qwen3": 16, "Gemma3Text": 16, "Gemma2": 16}


def build(name: str, device: torch.device, quick: bool):
    """A model of the family with random weights (bf16 on CUDA), in eval mode."""
    prefix, shape, _ = SHAPES[name]
    kw = dict(shape)
    if quick:
        kw.update(QUICK)
        if prefix in QUICK_HEAD_DIM:
            kw.update(head_dim=QUICK_HEAD_DIM[prefix])
        if "query_pre_attn_scalar" in kw:
            kw["query_pre_attn_scalar"] = kw["head_dim"]
        if kw.get("sliding_window"):
            kw["sliding_window"] = 8
    if prefix == "Gemma3Text":  # Gemma 3's five local layers per global one
        every = min(6, kw["num_hidden_layers"])
        kw["layer_types"] = ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                             for i in range(kw["num_hidden_layers"])]
    cfg = getattr(transformers, f"{prefix}Config")(**kw, max_position_embeddings=4096, pad_token_id=PAD,
                                                   eos_token_id=EOS, bos_token_id=None)
    if prefix == "Gemma2":
        cfg._attn_implementation = "eager"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def measure(name: str, device: torch.device, quick: bool) -> dict:
    """The static engine's path, tokens/s of hf and static, static's first call, and the greedy checks (the model
    and the engines' caches freed after)."""
    out = _measure(name, device, quick)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _measure(name: str, device: torch.device, quick: bool) -> dict:
    import engines as bench_engines

    model = build(name, device, quick)
    B, P, R = (4, 16, 16) if quick else (32, 64, 128)
    V = model.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, V, (B, P), generator=g).tolist()
    ends = dict(eos_token_ids=[EOS], pad_token_id=PAD)
    hf, static = HFEngine(**ends), StaticEngine(**ends, compile=False, cuda_graphs=True)
    cont = ContinuousEngine(**ends)
    forced = SamplingParams(max_new_tokens=R, min_new_tokens=R, temperature=1.0)
    out = {"path": static.path_of(model)[0], "expected": SHAPES[name][2], "tokens": B * R,
           "paged": coverage(model) is None}
    _, out["hf_s"] = bench_engines.first_and_median(lambda: hf.generate(model, prompts, forced, seed=0), device, 1)
    out["first_s"], out["static_s"] = bench_engines.first_and_median(
        lambda: static.generate(model, prompts, forced, seed=0), device, 2)
    _, out["continuous_s"] = bench_engines.first_and_median(
        lambda: cont.generate(model, prompts, forced, seed=0), device, 2)
    greedy = SamplingParams(max_new_tokens=R, greedy=True)
    ref, ours = hf.generate(model, prompts, greedy), static.generate(model, prompts, greedy)
    paged = cont.generate(model, prompts, greedy)
    out["gap_hf"], out["gap_static"] = bench_engines.greedy_gap(model, ref), bench_engines.greedy_gap(model, ours)
    out["gap_continuous"] = bench_engines.greedy_gap(model, paged)
    out["same_rows"] = sum(bool(torch.equal(a, b)) for a, b in zip(ref.response_ids, ours.response_ids))
    out["rows"] = B
    out["fp32"] = next(model.parameters()).dtype == torch.float32
    return out


def verdict(r: dict) -> tuple[str, str]:
    """(PASS / FAIL, one line) for a :func:`measure` result: the expected path, greedy tokens hf's for static and
    continuous (fp32: each token the argmax within 1e-4; bf16: within twice hf's own gap or 0.05)."""
    tol = 1e-4 if r["fp32"] else max(2 * r["gap_hf"], 0.05)
    gap_c = r.get("gap_continuous", 0.0)
    ok = r["path"] == r["expected"] and r["gap_static"] <= tol and gap_c <= tol
    hf_tps, st_tps = r["tokens"] / r["hf_s"], r["tokens"] / r["static_s"]
    cont = ""
    if "continuous_s" in r:
        c_tps = r["tokens"] / r["continuous_s"]
        cont = (f"; continuous{'' if r.get('paged') else ' (static: not in the paged decoder)'} {c_tps:,.0f} tok/s = "
                f"{c_tps / hf_tps:.2f}x, gap {gap_c:.4f}")
    return ("PASS" if ok else "FAIL"), (
        f"{r['path']}: {st_tps:,.0f} vs hf {hf_tps:,.0f} tok/s = {st_tps / hf_tps:.2f}x (first call "
        f"{r['first_s']:.1f} s); greedy rows = hf {r['same_rows']}/{r['rows']}, gap {r['gap_static']:.4f} "
        f"(hf {r['gap_hf']:.4f}, tol {tol:.4f}){cont}")


def main() -> None:
    args = parse_args(__doc__, lambda p: p.add_argument("--families", default=",".join(SHAPES)))
    print(f"device: {torch.cuda.get_device_name(args.device) if args.device.type == 'cuda' else 'CPU'} | torch "
          f"{torch.__version__} | transformers {transformers.__version__} | {'tiny' if args.quick else 'real'} shapes",
          flush=True)
    rows = []
    for name in args.families.split(","):
        status, text = verdict(measure(name, args.device, args.quick))
        print(f"{name}: {status} {text}", flush=True)
        rows.append((name, status, text))
    print(f"\n{'family':16} {'status':6} result")
    for row in rows:
        print(f"{row[0]:16} {row[1]:6} {row[2]}")


if __name__ == "__main__":
    main()
