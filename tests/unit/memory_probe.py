"""Measure the peak memory of training steps of Llamas built from sizes, on CPU in fp32, as the growth of the
process's resident set (for tests/unit/test_memory.py):

    python tests/unit/memory_probe.py '[{"arch": {"vocab": 4000, "hidden": 256, ...}, "batch": 4, "seq": 128,
                                         "checkpointing": false}, ...]'

For each configuration: the resident set's high-water mark is reset (``5`` written to ``/proc/self/clear_refs``),
a model and its AdamW optimizer are built and trained for two steps (forward, log-probs through the fused LM
head as SFT computes them, backward, optimizer step), and the peak above the resident set before the model was
built is recorded. The test sets
MALLOC_MMAP_THRESHOLD_ so glibc maps every large block on its own and freed tensors leave the resident set.
Prints one JSON list of peaks in bytes.
"""

from __future__ import annotations

import gc
import json
import sys


def status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def measure(arch: dict, batch: int, seq: int, checkpointing: bool) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlhfkit.train.shared.batches import completion_logprobs

    cfg = LlamaConfig(vocab_size=arch["vocab"], hidden_size=arch["hidden"], num_hidden_layers=arch["layers"],
                      num_attention_heads=arch["heads"], num_key_value_heads=arch["kv_heads"],
                      intermediate_size=arch["intermediate"], max_position_embeddings=seq,
                      tie_word_embeddings=arch["tied"], attn_implementation="sdpa")
    ids = torch.randint(0, arch["vocab"], (batch, seq))
    gc.collect()
    reset_peak()
    base = status("VmRSS")
    model = LlamaForCausalLM(cfg)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(2):
        loss = -completion_logprobs(model, ids, torch.ones_like(ids)).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    peak = status("VmHWM") - base
    del model, opt, loss
    gc.collect()
    return peak


def main(configs: list[dict]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(1)
    # warm up kernels and their one-off buffers on a small model before any baseline is taken
    measure({"vocab": 64, "hidden": 32, "layers": 1, "heads": 2, "kv_heads": 2, "intermediate": 64, "tied": True},
            1, 8, False)
    del LlamaConfig, LlamaForCausalLM
    print(json.dumps([measure(c["arch"], c["batch"], c["seq"], c["checkpointing"]) for c in configs]))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
