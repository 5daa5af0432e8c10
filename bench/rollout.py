"""Rollouts whose responses end early: rlhfkit's ``hf`` engine (every row stops at its EOS, the batch stops
when all rows have) vs the same generation forced to the maximum length (``min_new_tokens = max_new_tokens``, the
DeepSpeed-Chat pitfall: EOS is masked until the limit, so every batch costs ``max_new_tokens`` decode steps).

A random-weight model never says EOS on its own, so forward hooks make it: a pre-hook on the model counts decode
steps, and a hook on the LM head adds a large bias to the EOS logit of row b once it has generated n_b - 1 tokens,
with n_b drawn uniformly in [N/2, 3N/2] (N = ``--mean-len``, default max_new_tokens / 4). Greedy decoding, so
both runs must agree on every token before each row's EOS (checked and reported). On a GPU, greedy decoding of a
random bf16 model is not bitwise reproducible run to run (near-tied logits; the forced run disagrees with its own
reruns in a row now and then), so the peer's own reproducibility is reported beside the agreement.

Fair: the same engine, model, prompts and greedy decoding on both sides; only ``min_new_tokens`` differs, which is
exactly the choice a trainer makes. Reported: decode steps, tokens generated (rows x steps) and useful tokens,
wall-time ratio peer/rlhfkit.
Sizes: ``--quick`` tiny Llama, 4 prompts, max_new_tokens 32 (CPU); default SmolLM2-135M shape in bf16, 32 prompts of
32-64 tokens, max_new_tokens 256.

    .venv/bin/python bench/rollout.py --quick
    python bench/rollout.py [--batch 32 --max-new 256 --mean-len 64]
"""

from __future__ import annotations

import torch
from _common import llama, paired_times, parse_args, ratio_line

from rlhfkit.rollout import HFEngine, SamplingParams


class EosAfter:
    """Hooks that make EOS the greedy choice of row b at its ``stop_at[b]``-th generated token."""

    def __init__(self, model, stop_at: torch.Tensor, eos_id: int, bias: float = 1e4):
        self.stop_at, self.eos_id, self.bias, self.step = stop_at, eos_id, bias, 0
        self.handles = [model.register_forward_pre_hook(self._count, with_kwargs=True),
                        model.get_output_embeddings().register_forward_hook(self._push_eos)]

    def _count(self, _module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.step = 0 if ids.shape[1] > 1 else self.step + 1  # prefill predicts token 0; each decode step one more

    def _push_eos(self, _module, _inp, out):
        hit = (self.step >= self.stop_at - 1).to(out.dtype)  # [B]: generated token index >= n_b - 1
        out = out.clone()
        out[:, -1, self.eos_id] += self.bias * hit
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def measure(device: torch.device, quick: bool, repeats: int | None = None, B: int | None = None,
            max_new: int | None = None, mean_len: int | None = None, model=None) -> dict:
    B, max_new = B or (4 if quick else 32), max_new or (32 if quick else 256)
    mean_len = mean_len or max_new // 4
    repeats = repeats or (2 if quick else 3)
    model = model if model is not None else llama(device, quick)
    cfg = model.config
    eos, pad = int(cfg.eos_token_id), int(cfg.pad_token_id)
    g = torch.Generator().manual_seed(0)
    lo, hi = (8, 16) if quick else (32, 64)
    prompts = [torch.randint(3, cfg.vocab_size, (int(torch.randint(lo, hi + 1, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(B)]
    stop_at = torch.randint(max(1, mean_len // 2), mean_len * 3 // 2 + 1, (B,), generator=g).to(device)
    hooks = EosAfter(model, stop_at, eos)
    engine = HFEngine(eos_token_ids=[eos], pad_token_id=pad)
    params = SamplingParams(max_new_tokens=max_new, greedy=True)
    try:
        def ours():
            return engine.generate(model, prompts, params)

        peer_runs: list[torch.Tensor] = []

        def peer():
            r = engine.generate(model, prompts, params.replace(min_new_tokens=max_new))
            peer_runs.append(r.response_ids)
            return r

        r_o, r_p = ours(), peer()  # also the warm-up of the timings below
        t_peer, t_ours = paired_times(peer, ours, device, repeats, warmup=0)
    finally:
        hooks.remove()
    lengths = r_o.lengths.tolist()
    same = sum(bool(torch.equal(r_o.response_ids[b, : n - 1], r_p.response_ids[b, : n - 1]))
               for b, n in enumerate(lengths))
    peer_repro = sum(all(torch.equal(r[b, : n - 1], r_p.response_ids[b, : n - 1]) for r in peer_runs)
                     for b, n in enumerate(lengths))
    steps_o, steps_p = r_o.response_ids.shape[1], r_p.response_ids.shape[1]
    info = {"steps_ours": steps_o, "steps_peer": steps_p, "tokens_ours": B * steps_o, "tokens_peer": B * steps_p,
            "useful": int(sum(lengths)), "all_ended": bool(r_o.ended.all()), "same_prefix_rows": same, "rows": B,
            "peer_repro_rows": peer_repro,
            "time_ratio": t_peer / t_ours, "t_ours": t_ours, "t_peer": t_peer}
    extra = (f"B={B} max_new={max_new}; decode steps {steps_p} vs {steps_o}, tokens generated {B * steps_p} vs "
             f"{B * steps_o} (useful {info['useful']}); greedy prefixes identical in {same}/{B} rows (peer vs its own "
             f"reruns: {peer_repro}/{B}); "
             f"all ended with EOS: {info['all_ended']}")
    info["line"] = ratio_line("hf engine (stop at EOS) vs forced max length", t_peer, t_ours, extra=extra)
    return info


def main() -> None:
    def extra(p):
        p.add_argument("--batch", type=int)
        p.add_argument("--max-new", type=int)
        p.add_argument("--mean-len", type=int)

    args = parse_args(__doc__, extra)
    print(f"device {args.device}, torch {torch.__version__}")
    print(measure(args.device, args.quick, args.repeats, args.batch, args.max_new, args.mean_len)["line"])


if __name__ == "__main__":
    main()
