"""A real model end to end: SmolLM2-135M-Instruct from its GGUF file (Llama, 49k vocabulary, ChatML template).

Skipped, with the reason, when the GGUF file is not on this machine (``examples/smollm2.py`` says where it looks;
``docs/real-models.md`` how to get it); ``make test`` never needs it. Deselect it with ``-m "not gguf"``.
With the file: about a minute to convert it the first time (cached under ``$RLHFKIT_CACHE`` or ``~/.cache/rlhfkit``),
then a minute or two on 2 CPU cores.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path

import pytest
import torch

_HELPER = Path(__file__).resolve().parents[2] / "examples" / "smollm2.py"


def _load_helper():
    spec = importlib.util.spec_from_file_location("rlhfkit_example_smollm2", _HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_smollm2 = _load_helper()
GGUF = _smollm2.find_smollm2_gguf()

pytestmark = [
    pytest.mark.gguf,
    pytest.mark.skipif(GGUF is None, reason=_smollm2.search_report()),
]

IM_END = "<|im_end|>"


@pytest.fixture(scope="module")
def converted() -> Path:
    """The cached safetensors directory of the GGUF file (converted here when this machine has none yet)."""
    from rlhfkit.models.loading import _gguf_cache_dir, resolve_source

    if not (_gguf_cache_dir(Path(GGUF)) / "config.json").is_file() and importlib.util.find_spec("gguf") is None:
        pytest.skip("converting the GGUF file needs the `gguf` package: pip install 'rlhfkit[gguf]'")
    source, _ = resolve_source(GGUF)
    return Path(source)


@pytest.fixture(scope="module")
def tokenizer(converted):
    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import load_tokenizer_for

    return load_tokenizer_for(ModelConfig(name=GGUF))


@pytest.fixture(scope="module")
def lora_sft(converted, tmp_path_factory) -> tuple[Path, dict]:
    """(run directory, final metrics) of 3 LoRA SFT updates of batch 2 on the built-in task's chat records."""
    from rlhfkit.config import build_config
    from rlhfkit.tasks import get_task, write_jsonl
    from rlhfkit.train.supervised.sft import run_sft

    out = tmp_path_factory.mktemp("smollm2-lora-sft")
    write_jsonl(out / "sft.jsonl", get_task("quickstart").sft_records(16, seed=0))
    cfg = build_config("sft", {}, [
        f"model.name={GGUF}", "model.lora.enabled=true", "model.lora.r=8", "train.max_steps=3",
        "train.batch_size=2", "data.max_length=48", "optim.lr=1e-3", f"data.train={out / 'sft.jsonl'}",
        "data.eval_fraction=0", f"output_dir={out}", "track.report=false", "track.progress=false",
    ])
    return out, run_sft(cfg)


def test_gguf_conversion_is_cached(converted):
    from rlhfkit.models.loading import resolve_source

    t = time.perf_counter()
    again, _ = resolve_source(GGUF)
    assert Path(again) == converted
    assert time.perf_counter() - t < 1.0  # the second resolve is a lookup, not a conversion
    assert (converted / "model.safetensors").is_file()
    config = json.loads((converted / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152
    assert "quantization_config" not in config  # dense weights: loads like any safetensors model


def test_tokenizer_from_gguf_has_template_eos_and_pad(tokenizer):
    from rlhfkit.models.tokenizer import eos_token_ids

    assert tokenizer.eos_token == IM_END
    assert tokenizer.pad_token is not None
    assert "<|im_start|>" in tokenizer.chat_template
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert eos_token_ids(tokenizer) == [tokenizer.convert_tokens_to_ids(IM_END)]
    assert tokenizer("hi")["input_ids"] == tokenizer("hi", add_special_tokens=False)["input_ids"]  # adds no BOS


def test_sft_masks_only_the_reply_and_its_eos(tokenizer):
    from rlhfkit.data.chat import render_conversation

    ids, mask = render_conversation(tokenizer, [{"role": "user", "content": "shout: zebra"},
                                                {"role": "assistant", "content": "ZEBRA"}])
    trained = [i for i, m in zip(ids, mask) if m]
    assert tokenizer.decode(trained) == "ZEBRA" + IM_END


def test_llama_lora_targets(converted):
    from rlhfkit.config import LoraConfig, ModelConfig
    from rlhfkit.models.loading import LORA_TARGETS, load_causal_lm

    mcfg = ModelConfig(name=GGUF, lora=LoraConfig(enabled=True, r=4))
    model, _ = load_causal_lm(mcfg)
    adapted = {n.split(".")[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == set(LORA_TARGETS["llama"])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)


def test_lora_sft_output_loads_with_plain_transformers(lora_sft, converted):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, metrics = lora_sft
    assert math.isfinite(metrics["train/loss"])
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert not (out / "adapter_config.json").exists()  # the root is the merged model, not an adapter

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not any("lora_" in n for n, _ in model.named_parameters())
    assert tok.eos_token == IM_END and "<|im_start|>" in tok.chat_template
    im_end = tok.convert_tokens_to_ids(IM_END)
    gen_eos = model.generation_config.eos_token_id
    assert im_end in (gen_eos if isinstance(gen_eos, list) else [gen_eos])

    # the adapter was merged: q_proj moved away from the base weights
    key = "model.layers.0.self_attn.q_proj.weight"
    merged = load_file(str(out / "model.safetensors"))[key]
    base = load_file(str(converted / "model.safetensors"))[key]
    assert merged.shape == base.shape and not torch.equal(merged, base)

    enc = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=im_end,
                             pad_token_id=tok.pad_token_id)
    reply = tok.decode(gen[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert reply.strip()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_reward_head_from_gguf_gives_finite_score(converted, tokenizer, lora):
    from rlhfkit.config import LoraConfig, ModelConfig
    from rlhfkit.models.heads import sequence_scores
    from rlhfkit.models.loading import load_scalar_model

    mcfg = ModelConfig(name=GGUF, lora=LoraConfig(enabled=lora, r=4))
    model = load_scalar_model(GGUF, mcfg, tokenizer=tokenizer, trainable=lora)
    assert model.config.num_labels == 1
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": "shout: zebra"},
                                            {"role": "assistant", "content": answer}], tokenize=False).rstrip("\n")
             for answer in ("ZEBRA", "zebra, I think")]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        scores = sequence_scores(model, enc["input_ids"], enc["attention_mask"])
    assert scores.shape == (2,)
    assert torch.isfinite(scores).all()


def test_export_to_gguf_round_trips_the_real_model(converted, tmp_path):
    """SmolLM2 written as a BF16 GGUF file and read back by rlhfkit's GGUF loader: the weights written reproduced
    (logits on the export's probe conversation), the same token ids from its 49k-token byte-level BPE, the chat
    template kept (measured: max |logit difference| 0, 271 MB)."""
    from rlhfkit.models.export import export_model

    said: list[str] = []
    out = export_model(converted, tmp_path / "smollm2.gguf", dtype="bfloat16", log=said.append)
    assert out.stat().st_size < 300e6  # BF16: 2 bytes a parameter (the float32 conversion is twice that)
    assert any(line.startswith("[export] verified: smollm2.gguf reloaded with rlhfkit's GGUF loader")
               for line in said), said
