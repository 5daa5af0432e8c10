"""Every GPU check of rlhfkit in one run, ending with a short table (one row per check, PASS / FAIL and the number).

On CUDA: a SmolLM2-135M-shaped Llama with random weights in bf16, batch 16, prompt 128 + response 128 tokens:
  (a) SFT step (rlhfkit ``sft_forward`` = forward + chunked ``token_logprobs`` + loss, backward, AdamW): tokens/s
  (b) one PPO update: ``ppo_policy_loss`` on ``response_logits`` + ``value_loss`` on a critic's values, both
      backwards and both AdamW steps: ms and tokens/s
  (c) each rollout engine's tokens/s at batch 8 and 64, 256 new tokens (min_new_tokens = 256 so the count is fixed):
      hf (``generate`` eager), hf + transformers' static cache + ``torch.compile``, rlhfkit's static engine compiled
      with and without CUDA graphs and uncompiled with CUDA graphs (what ``generation.engine=auto`` picks on CUDA),
      with each one's first call (compile / capture) apart
  (d) the ratios of bench/logprobs.py, bench/response_logits.py and bench/rollout.py at their GPU sizes
  (e) correctness: chunked log-probs / entropy / gradient equal the naive float32 ones within bf16 tolerance,
      ``response_logits`` equals the full forward's slice, and ``accelerate.Accelerator(mixed_precision="bf16")``
      autocasts the model to bf16 logits while rlhfkit's log-probs stay float32 and a step trains the fp32 weights.
  (h) rollout correctness: the static engine's greedy tokens against hf's, checked teacher-forced (each token's logit
      against the largest under a full forward, allowing bf16 near-ties), CUDA graph replay against the plain step,
      sampled log-probs against the trainer's recomputed ones (next to hf's own error), seeded reproducibility
  (g) each family's static decode against hf (bench/families.py: Qwen3-0.6B, Qwen2.5-0.5B, Llama-3.2-1B, Gemma-3-1B,
      Gemma 2 and Phi-3.5 layers, Mistral with a window, OLMo-2-1B on the generic path; random weights, bf16, batch
      32 x 128 new tokens): the path taken, tok/s and the ratio, the first call (capture), greedy checked as in (h)
  (i) the continuous engine (issue 31): (h)'s three checks for it, and on long-tailed lengths (the model rigged by
      ``_common.rig_lengths``, mean 64, at most 512 new tokens, 128 requests) its decode steps and tokens/s against
      the static engine at equal slots (32)
  (j) the fused LM head (issue 32): log-probs, entropy and gradients through ``train.shared.forward.response_stats``
  equal
      the plain logits path in bf16 on the device; ``liger-kernel``'s fused linear cross-entropy against rlhfkit's
      PyTorch path when it is installed; ``bench/logprobs.py --head``'s bytes at Qwen's vocabulary (max allocated)
  (m) the big-model section (bench/big_models.py), only when asked (``--only m``): PPO with a Llama-2-7B-shaped
      policy (LoRA; then every weight through FSDP2 CPU offload) and Pythia-1.4B-shaped reward model and critic,
      GRPO with a Qwen3-8B-shaped policy (LoRA; QLoRA when bitsandbytes is there), random weights from the published
      configs, each phase's measured peak against ``rlhfkit plan``'s prediction, and s/step
On CPU the same checks run with ``--quick`` sizes (a tiny Llama), so a machine without a GPU can smoke it (every
path but the CUDA graphs, which need CUDA; their rows say so). ``--only c,h`` runs only the rows whose letter is
given (five calls of at most 10 minutes on a GPU: ``--only a,b,d,e,f``, ``--only c,h,j``, ``--only g``, ``--only i``
and ``--only m``).
Each check is wrapped: a failure is a FAIL row with its error, never a crash. Budget: well under 5 min on an H100.
A WARN row is no failure: it points at a cost worth knowing (see bench/README.md).

    python bench/gpu_check.py [--only c,h]   # CUDA (--only g: the families, about 3 minutes on an H100)
    python bench/gpu_check.py --only m       # CUDA: the big-model section alone (< 8 minutes on an H100)
    .venv/bin/python bench/gpu_check.py --quick   # CPU smoke (--only m: the big-model section at a tiny scale)
"""

from __future__ import annotations

import time

import _common
import engines as bench_engines
import families as bench_families
import logprobs as bench_logprobs
import response_logits as bench_response
import rollout as bench_rollout
import torch
import transformers
from _common import check, llama, median_time, parse_args, print_table, sync

from rlhfkit import algos
from rlhfkit.rollout import ContinuousEngine, HFEngine, SamplingParams, StaticEngine
from rlhfkit.train.online.experience import position_ids_of
from rlhfkit.train.shared.forward import response_logits, response_stats, response_values
from rlhfkit.train.supervised.sft import sft_forward


def main() -> None:
    args = parse_args(__doc__, lambda p: p.add_argument(
        "--only", default="", help="letters of the checks to run, e.g. c,h (default: all but m); m = the big-model "
                                   "section (issue 32: PPO Llama-2-7B + Pythia-1.4B with LoRA and with FSDP2 CPU "
                                   "offload, GRPO Qwen3-8B with LoRA / QLoRA; plan's predicted GiB against the "
                                   "measured peak of each phase, s/step; bench/big_models.py)"))
    _common.ONLY[:] = [x.strip() for x in args.only.split(",") if x.strip()]
    dev, quick = args.device, args.quick
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"device: {name} | torch {torch.__version__} | transformers {transformers.__version__} | "
          f"{'quick (tiny model)' if quick else 'SmolLM2-135M shape, bf16'}", flush=True)
    B, P, R = (2, 16, 16) if quick else (16, 128, 128)
    reps = args.repeats or (1 if quick else 5)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = llama(dev, quick)
    V = model.config.vocab_size
    ids = torch.randint(3, V, (B, P + R), generator=g).to(dev)
    mask = torch.ones_like(ids)
    seen: dict = {}

    @check("(a) SFT step tokens/s")
    def _():
        labels = ids.clone()
        labels[:, :P] = -100
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def step():
            loss, _ = sft_forward(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        model.train()
        t = median_time(step, dev, reps, warmup=1 if quick else 2)
        return "OK", f"{B * (P + R) / t:,.0f} tok/s ({t * 1e3:.1f} ms, B={B} T={P + R})"

    @check("(b) PPO update (policy + critic)")
    def _():
        critic = llama(dev, quick, seq_cls=True)
        batch = {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids_of(mask),
                 "response_ids": ids[:, P:], "mask": torch.ones(B, R, device=dev)}
        with torch.no_grad():
            batch["old_logprobs"] = response_stats(model, batch, 1.0).logprobs  # what training runs: no logits
            batch["values"] = response_values(critic, batch)
        batch["advantages"] = torch.randn(B, R, generator=g).to(dev)
        batch["returns"] = batch["values"] + torch.randn(B, R, generator=g).to(dev)
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-5) for m in (model, critic)]

        def update():
            lp = response_stats(model, batch, 1.0).logprobs
            pl, _ = algos.ppo_policy_loss(lp, batch["old_logprobs"], batch["advantages"], batch["mask"])
            vl, _ = algos.value_loss(response_values(critic, batch), batch["values"], batch["returns"], batch["mask"])
            (pl + 0.5 * vl).backward()
            for o in opts:
                o.step()
                o.zero_grad(set_to_none=True)

        t = median_time(update, dev, reps, warmup=1 if quick else 2)
        return "OK", f"{t * 1e3:.1f} ms/update ({B * (P + R) / t:,.0f} tok/s, B={B} P={P} R={R})"

    # (c) rollout engines: tokens/s, each engine's first call (compile / capture) apart; random weights never say
    # EOS, and min_new_tokens = max_new_tokens makes sure, so every engine generates B x R_gen tokens
    R_gen, gen_batches = (16, (2, 4)) if quick else (256, (8, 64))
    ends = dict(eos_token_ids=[model.config.eos_token_id], pad_token_id=model.config.pad_token_id)
    engines = {
        "hf: generate eager": HFEngine(**ends),
        "hf: static cache + compile": HFEngine(**ends, cache_implementation="static", compile=True),
        "static: compiled + CUDA graphs": StaticEngine(**ends, compile=True, cuda_graphs=True),
        "static: compiled": StaticEngine(**ends, compile=True, cuda_graphs=False),
        "static: CUDA graphs (= auto)": StaticEngine(**ends, compile=False, cuda_graphs=True),
        "continuous: CUDA graphs": ContinuousEngine(**ends),
    }
    forced = SamplingParams(max_new_tokens=R_gen, min_new_tokens=R_gen, temperature=1.0)

    def engine_row(label: str, eng, Bg: int) -> None:
        @check(f"(c) {label} B={Bg}")
        def _():
            prompts = torch.randint(3, V, (Bg, 32), generator=g).tolist()
            reps_gen = 1 if quick or label.startswith("hf: generate") else 3
            first, t = bench_engines.first_and_median(lambda: eng.generate(model, prompts, forced, seed=0), dev,
                                                      reps_gen)
            note = " [no CUDA here: ran without graphs]" if "graphs" in label and dev.type != "cuda" else ""
            return "OK", (f"{Bg * R_gen / t:,.0f} tok/s ({t:.2f} s/call; first call {first:.1f} s, of which "
                          f"compile / capture ~{max(0.0, first - t):.1f} s){note}")

    # (h) rollout correctness on this device and dtype (bf16 on CUDA: other kernels may flip near-tied logits)
    Bc, Rc = (4, 12) if quick else (64, 64)
    cprompts = torch.randint(3, V, (Bc, 32), generator=g).tolist()
    greedy = SamplingParams(max_new_tokens=Rc, greedy=True)
    fp32 = next(model.parameters()).dtype == torch.float32

    def same_rows(a, b) -> int:
        return sum(bool(torch.equal(x, y)) for x, y in zip(a.response_ids, b.response_ids))

    def greedy_vs_hf(engine, name: str):
        """``engine``'s greedy tokens against hf's, checked teacher-forced (bf16 near-ties allowed)."""
        ref = engines["hf: generate eager"].generate(model, cprompts, greedy)
        ours = engine.generate(model, cprompts, greedy)
        gap_hf, gap_ours = bench_engines.greedy_gap(model, ref), bench_engines.greedy_gap(model, ours)
        tol = 1e-4 if fp32 else max(2 * gap_hf, 0.05)
        return ("PASS" if gap_ours <= tol else "FAIL"), (
            f"rows identical {same_rows(ref, ours)}/{Bc}; largest (max logit - chosen logit): {name} {gap_ours:.4f}, "
            f"hf {gap_hf:.4f} (tol {tol:.4f})")

    @check("(h1) static greedy == hf (teacher-forced)")
    def _():
        return greedy_vs_hf(engines["static: compiled + CUDA graphs"], "static")

    @check("(h2) CUDA graph replay == plain step")
    def _():
        a = engines["static: compiled + CUDA graphs"].generate(model, cprompts, greedy)
        b = engines["static: compiled"].generate(model, cprompts, greedy)
        c = engines["static: CUDA graphs (= auto)"].generate(model, cprompts, greedy)
        d = StaticEngine(**ends, compile=False, cuda_graphs=False).generate(model, cprompts, greedy)
        n_ab, n_cd = same_rows(a, b), same_rows(c, d)
        ok = n_ab >= 0.9 * Bc and n_cd >= 0.9 * Bc
        return ("PASS" if ok else "FAIL"), (f"greedy rows identical: compiled graphs vs compiled {n_ab}/{Bc}, "
                                            f"eager graphs vs eager {n_cd}/{Bc}" + ("" if dev.type == "cuda" else
                                                                                    " [no CUDA: no graphs]"))

    @check("(h3) sampled logprobs == recomputed")
    def _():
        sampled = SamplingParams(max_new_tokens=Rc, temperature=1.0)
        errs, runs = {}, {}
        for label in ("hf: generate eager", "static: compiled + CUDA graphs", "static: CUDA graphs (= auto)"):
            runs[label] = engines[label].generate(model, cprompts, sampled, seed=1)
            errs[label] = bench_engines.logprob_error(model, runs[label])
        again = engines["static: compiled + CUDA graphs"].generate(model, cprompts, sampled, seed=1)
        repro = bool(torch.equal(again.response_ids, runs["static: compiled + CUDA graphs"].response_ids))
        hf_mean, hf_max = errs["hf: generate eager"]
        ok = repro and all(m <= max(2 * hf_mean, 1e-4 if fp32 else 5e-3) and x <= max(2 * hf_max, 1e-4 if fp32
                                                                                       else 0.05)
                           for m, x in errs.values())
        text = "; ".join(f"{label.split(' (')[0]}: mean {m:.1e} max {x:.1e}" for label, (m, x) in errs.items())
        return ("PASS" if ok else "FAIL"), f"|logprob - recomputed| {text}; same seed reproduces: {repro}"

    cont = engines["continuous: CUDA graphs"]

    @check("(i1) continuous greedy == hf (teacher-forced)")
    def _():
        return greedy_vs_hf(cont, "continuous")

    @check("(i2) continuous: CUDA graphs == eager")
    def _():
        sampled = SamplingParams(max_new_tokens=Rc, temperature=1.0)
        eager = ContinuousEngine(**ends, cuda_graphs=False)
        n_g = same_rows(cont.generate(model, cprompts, greedy), eager.generate(model, cprompts, greedy))
        n_s = same_rows(cont.generate(model, cprompts, sampled, seed=2), eager.generate(model, cprompts, sampled,
                                                                                         seed=2))
        ok = n_g >= 0.9 * Bc and n_s >= 0.9 * Bc
        return ("PASS" if ok else "FAIL"), (f"rows identical, greedy {n_g}/{Bc}, sampled {n_s}/{Bc}"
                                            + ("" if dev.type == "cuda" else " [no CUDA: no graphs]"))

    @check("(i3) continuous sampled logprobs == recomputed")
    def _():
        sampled = SamplingParams(max_new_tokens=Rc, temperature=1.0)
        r = cont.generate(model, cprompts, sampled, seed=1)
        mean, worst = bench_engines.logprob_error(model, r)
        hf_mean, hf_max = bench_engines.logprob_error(model, engines["hf: generate eager"].generate(
            model, cprompts, sampled, seed=1))
        repro = bool(torch.equal(cont.generate(model, cprompts, sampled, seed=1).response_ids, r.response_ids))
        ok = repro and mean <= max(2 * hf_mean, 1e-4 if fp32 else 5e-3) and worst <= max(2 * hf_max, 1e-4 if fp32
                                                                                           else 0.05)
        return ("PASS" if ok else "FAIL"), (f"|logprob - recomputed| mean {mean:.1e} max {worst:.1e} (hf: mean "
                                            f"{hf_mean:.1e} max {hf_max:.1e}); same seed reproduces: {repro}")

    @check("(i4) long-tailed: continuous vs static, equal slots")
    def _():
        import copy

        rigged = copy.deepcopy(model)
        n_req, slots, mean_len, R_lt = (32, 8, 8, 64) if quick else (128, 32, 64, 512)
        _common.rig_lengths(rigged, mean_len, ends["eos_token_ids"][0], keep=(ends["pad_token_id"],))
        lt_prompts = torch.randint(3, V, (n_req // 4, 32), generator=g).tolist() * 4
        params = SamplingParams(max_new_tokens=R_lt)
        st = bench_engines.CountedStatic(**ends, compile=False, cuda_graphs=True, batch_size=slots)
        co = ContinuousEngine(**ends, batch_size=slots)
        rows = {}
        for name, eng in (("static", st), ("continuous", co)):
            first, t = bench_engines.first_and_median(lambda eng=eng: eng.generate(rigged, lt_prompts, params,
                                                                                    seed=0), dev, 1 if quick else 2)
            if name == "static":
                eng.counts = dict.fromkeys(eng.counts, 0)  # count one call (the continuous engine's are per call)
            out = eng.generate(rigged, lt_prompts, params, seed=0)
            steps = eng.counts["decode_steps"]
            rows[name] = (steps, int(out.lengths.sum()) / t, float(out.lengths.float().mean()), int(out.lengths.max()))
        (s_steps, s_tok, s_mean, s_max), (c_steps, c_tok, c_mean, c_max) = rows["static"], rows["continuous"]
        return ("PASS" if c_steps <= 0.6 * s_steps else "WARN"), (
            f"decode steps continuous/static {c_steps / s_steps:.2f} ({c_steps} vs {s_steps}); tok/s "
            f"{c_tok:,.0f} vs {s_tok:,.0f} ({c_tok / s_tok:.2f}x); lengths mean/max {c_mean:.0f}/{c_max} vs "
            f"{s_mean:.0f}/{s_max} ({n_req} requests, {slots} slots, at most {R_lt} new tokens)")

    # (c) after (h): correctness first, so a run cut short by its time limit has it
    for label, eng in engines.items():
        for Bg in gen_batches:
            engine_row(label, eng, Bg)

    @check("(d1) ratio token_logprobs vs naive")
    def _():
        r = bench_logprobs.measure(dev, quick, reps if quick else None)
        mem = "" if r["mem_ratio"] is None else f", peak mem {r['mem_ratio']:.2f}x"
        return "OK", f"time {r['time_ratio']:.2f}x{mem} (peer/rlhfkit)"

    @check("(d2) ratio response_logits vs full slice")
    def _():
        r = bench_response.measure(dev, quick, reps if quick else None, model=model)
        parts = []
        for mode in ("no_grad", "train"):
            mem = "" if r[mode]["mem_ratio"] is None else f" mem {r[mode]['mem_ratio']:.2f}x"
            parts.append(f"{mode}: time {r[mode]['time_ratio']:.2f}x{mem}")
        return "OK", "; ".join(parts)

    @check("(d3) ratio rollout stop-at-EOS vs forced")
    def _():
        r = bench_rollout.measure(dev, quick, reps if quick else None, model=model)
        # bf16 greedy decoding is not bitwise reproducible on GPU (near ties): allow 10% of rows to differ
        ok = r["all_ended"] and r["same_prefix_rows"] >= 0.9 * r["rows"]
        return ("OK" if ok else "FAIL"), (f"time {r['time_ratio']:.2f}x; tokens {r['tokens_peer']} vs "
                                          f"{r['tokens_ours']}; same prefixes {r['same_prefix_rows']}/{r['rows']} "
                                          f"(peer vs itself {r['peer_repro_rows']}/{r['rows']})")

    @check("(e1) chunked logprobs/entropy == naive")
    def _():
        x = (torch.randn(B, P + R, V, generator=g) * 3).to(dev, torch.bfloat16).requires_grad_(True)
        y = torch.randint(0, V, (B, P + R), generator=g).to(dev)
        lp = algos.token_logprobs(x, y, chunk_size=7)  # a small chunk so several blocks and a ragged one are used
        ref = torch.log_softmax(x.float(), -1).gather(-1, y[..., None]).squeeze(-1)
        (g1,), (g2,) = torch.autograd.grad(lp.sum(), x), torch.autograd.grad(ref.sum(), x)
        ent = algos.entropy_from_logits(x.detach(), chunk_size=7)
        p = torch.softmax(x.detach().float(), -1)
        ent_ref = -(p * torch.log_softmax(x.detach().float(), -1)).sum(-1)
        errs = [(lp - ref).abs().max().item(), (g1.float() - g2.float()).abs().max().item(),
                (ent - ent_ref).abs().max().item()]
        ok = errs[0] < 1e-4 and errs[1] < 1e-2 and errs[2] < 1e-3
        return ("PASS" if ok else "FAIL"), "max |diff| logp {:.1e}, grad {:.1e}, entropy {:.1e}".format(*errs)

    @check("(e2) response_logits == full-forward slice")
    def _():
        batch = bench_response.make_batch(model, B, P, R, dev)
        with torch.no_grad():
            err = (bench_response.ours_logprobs(model, batch) - bench_response.peer_logprobs(model, batch)).abs().max()
        tol = 5e-2 if next(model.parameters()).dtype == torch.bfloat16 else 1e-4
        return ("PASS" if err.item() < tol else "FAIL"), f"max |diff| logp {err.item():.1e} (tol {tol:g})"

    @check("(e3) Accelerator(mixed_precision=bf16)")
    def _():
        from accelerate import Accelerator

        from rlhfkit.train.lifecycle.run import keep_logits_dtype

        acc = Accelerator(mixed_precision="bf16", cpu=dev.type == "cpu")
        m32 = llama(dev, True, dtype=torch.float32)  # small fp32 model: this checks dtypes, not speed
        opt = torch.optim.AdamW(m32.parameters(), lr=1e-3)
        m32, opt = acc.prepare(m32, opt)
        keep_logits_dtype(acc, m32)  # as run.set_up_trained does for every trained causal LM
        head: dict = {}
        hook = m32.get_output_embeddings().register_forward_hook(lambda _m, _i, o: head.update(dtype=o.dtype))
        x = torch.randint(3, m32.config.vocab_size, (2, 32), generator=g).to(acc.device)
        before = next(m32.parameters()).detach().clone()
        with acc.autocast():
            logits = m32(input_ids=x, use_cache=False).logits
            lp = algos.token_logprobs(logits[:, :-1], x[:, 1:])
        acc.backward(-lp.mean())
        opt.step()
        sync(dev)
        hook.remove()
        p = next(m32.parameters())
        ok = (head["dtype"] == torch.bfloat16 and lp.dtype == torch.float32 and p.dtype == torch.float32
              and torch.isfinite(lp).all().item() and not torch.equal(before, p.detach()))
        seen["logits"] = logits.dtype
        return ("PASS" if ok else "FAIL"), (f"LM head ran in {head['dtype']}, logprobs {lp.dtype}, "
                                            f"weights {p.dtype} and stepped")

    @check("(e4) prepared model returns bf16 logits")
    def _():  # accelerate returns float32 logits (convert_outputs_to_fp32); keep_logits_dtype undoes it
        bf16 = seen["logits"] == torch.bfloat16
        return ("PASS" if bf16 else "WARN"), f"returned logits {seen['logits']}" + (
            "" if bf16 else " (accelerate's convert_outputs_to_fp32: an extra float32 [B, T, V] copy)")

    @check("(f) recipes end to end (tiny, CLI)")
    def _():  # every recipe's CUDA path: fp32 master weights + bf16 autocast, frozen models in bf16, EOS masks
        import sys
        import tempfile
        import time
        from pathlib import Path

        import _stop

        tmp = Path(tempfile.mkdtemp())
        d, r = tmp / "data", tmp / "runs"
        common = ["track.report=false", "data.max_length=64"]
        steps = [
            ["data", "make", "quickstart", "--out", str(d), "--n", "512"],
            ["sft", "configs/sft.yaml", f"data.train={d}/sft.jsonl", f"output_dir={r}/sft", "train.epochs=2", *common],
            ["rm", "configs/rm.yaml", f"data.train={d}/preference.jsonl", f"data.eval={d}/eval_preference.jsonl",
             f"model.name={r}/sft", f"output_dir={r}/rm", "train.epochs=1", *common],
            ["ppo", "configs/ppo.yaml", f"data.train={d}/prompts.jsonl", f"data.eval={d}/eval_prompts.jsonl",
             f"model.name={r}/sft", f"reward.model={r}/rm", f"output_dir={r}/ppo", "algo.total_episodes=128", *common],
            ["grpo", "configs/grpo.yaml", f"data.train={d}/prompts.jsonl", f"data.eval={d}/eval_prompts.jsonl",
             f"model.name={r}/sft", f"output_dir={r}/grpo", "algo.total_episodes=128", "model.lora.enabled=true",
             *common],
            ["dpo", "configs/dpo.yaml", f"data.train={d}/preference.jsonl", f"data.eval={d}/eval_preference.jsonl",
             f"model.name={r}/sft", f"output_dir={r}/dpo", "train.max_steps=8", *common],
        ]
        done = []
        for argv in steps:
            t0 = time.perf_counter()
            out = _stop.run([sys.executable, "-m", "rlhfkit", *argv], capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stdout[-3000:], out.stderr[-3000:])
                last = (out.stderr or out.stdout).strip().splitlines()[-1][:120]
                return "FAIL", f"{argv[0]} exit {out.returncode}: {last}"
            done.append(f"{argv[0]} {time.perf_counter() - t0:.0f}s")
        return "PASS", ", ".join(done)

    @check("(j1) fused head == logits path")
    def _():
        batch = bench_response.make_batch(model, B, P, R, dev)
        keep = torch.ones(B, R, device=dev)
        params = [p for p in model.parameters() if p.requires_grad][-3:]
        st = response_stats(model, batch, 0.7, entropy=True, entropy_grad=True, argmax=True)
        ga = torch.autograd.grad((st.logprobs + st.entropy).mul(keep).sum(), params)
        logits = response_logits(model, batch, 0.7)
        logp = torch.log_softmax(logits.float(), -1)
        lp = logp.gather(-1, batch["response_ids"][..., None]).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1)
        gb = torch.autograd.grad((lp + ent).mul(keep).sum(), params)
        errs = [(st.logprobs - lp).abs().max().item(), (st.entropy - ent).abs().max().item(),
                max((a.float() - b.float()).abs().max().item() / max(b.float().abs().max().item(), 1e-6)
                    for a, b in zip(ga, gb)), (st.argmax != logits.argmax(-1)).float().mean().item()]
        bf16 = next(model.parameters()).dtype == torch.bfloat16
        ok = errs[0] < (5e-2 if bf16 else 1e-4) and errs[1] < (5e-2 if bf16 else 1e-4) and errs[2] < 5e-2
        return ("PASS" if ok else "FAIL"), ("max |diff| logp {:.1e}, entropy {:.1e}, grad (relative) {:.1e}, "
                                            "argmax differs {:.1%}".format(*errs))

    @check("(j2) liger fused CE == rlhfkit chunked")
    def _():
        import importlib.util

        if importlib.util.find_spec("liger_kernel") is None or dev.type != "cuda":
            return "SKIP", "liger-kernel not installed here (optional; bench/README.md) or no CUDA"
        from rlhfkit.train.shared import forward as fwd

        x = torch.randn(B * R, model.config.hidden_size, generator=g).to(dev, torch.bfloat16).requires_grad_(True)
        w = (torch.randn(V, model.config.hidden_size, generator=g) * 0.02).to(dev, torch.bfloat16).requires_grad_(True)
        y = torch.randint(0, V, (B * R,), generator=g).to(dev)
        y[::7] = fwd.IGNORE
        ours = algos.linear_token_stats(x, w, y, temperature=0.7, argmax=True, ignore_index=fwd.IGNORE)
        theirs = fwd.liger_stats(x, w, None, y, 0.7, True)
        g1 = torch.autograd.grad(ours.logprobs.sum(), (x, w))
        g2 = torch.autograd.grad(theirs.logprobs.sum(), (x, w))
        errs = [(ours.logprobs - theirs.logprobs).abs().max().item(),
                max((a.float() - b.float()).abs().max().item() for a, b in zip(g1, g2)),
                (ours.argmax != theirs.argmax).float().mean().item()]
        ok = errs[0] < 5e-2 and errs[1] < 5e-2 and errs[2] < 0.01
        return ("PASS" if ok else "FAIL"), "max |diff| logp {:.1e}, grad {:.1e}, argmax differs {:.1%}".format(*errs)

    @check("(j3) fused head bytes (Qwen vocab)")
    def _():
        tiny = {"B": 2, "T": 64, "H": 64, "V": bench_logprobs.QWEN_VOCAB, "dtype": torch.float32}
        r = bench_logprobs.head_rows(dev, quick, sizes=tiny if quick else None)
        rows = {row["name"]: row for row in r["rows"] if "absent" not in row}
        fused = rows["fused"]
        parts = [f"{k} {v['peak'] / 2**20:,.0f} MiB" for k, v in rows.items() if v["peak"] is not None]
        worst = max(v["err"] for v in rows.values())
        return ("OK" if worst < 5e-2 else "FAIL"), (f"peak above inputs: {'; '.join(parts)} (fused kept for "
                                                    f"backward {fused['saved'] / 2**20:,.0f} MiB); max |diff| "
                                                    f"{worst:.1e}")

    for family in bench_families.SHAPES:  # (g) last: each builds its own model (bench/families.py)
        @check(f"(g) {family}")
        def _(family=family):
            return bench_families.verdict(bench_families.measure(family, dev, quick))

    if "m" in _common.ONLY:  # only when asked: minutes of big models
        import big_models

        t0 = time.perf_counter()
        results = big_models.run(dev, quick, [1, 2, 3, 4])
        for line in big_models.table(results):
            print(line)
        ok = big_models.within(results)
        _common.ROWS.append(("(m) big models: plan within 10 %", "n/a" if ok is None else ("PASS" if ok else "FAIL"),
                             f"{len(results)} cases in {time.perf_counter() - t0:.0f} s (table above)"))

    print_table(name)

if __name__ == "__main__":
    main()
