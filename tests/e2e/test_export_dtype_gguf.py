"""``rlhfkit export`` in the model's own dtype (a run trained in float32 from a bfloat16 model writes bfloat16;
``--dtype float32`` on request) and to GGUF (written with the ``gguf`` package, reloaded with rlhfkit's own GGUF
loader with equal logits and token ids), on a tiny Llama with a byte-level BPE tokenizer (trained here: the built-in
tiny tokenizer is character-level, which GGUF export refuses in one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlhfkit.cli import main
from rlhfkit.errors import ModelError

pytest.importorskip("gguf", reason="GGUF export needs the gguf package (pip install 'rlhfkit[gguf]')")

TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _bpe_llama(out: Path, dtype=torch.bfloat16) -> Path:
    """A 2-layer Llama (grouped-query attention, untied head, 3 embedding rows past the vocabulary) with a byte-level
    BPE tokenizer (single digits, as SmolLM2's), saved in ``dtype`` as a published model is."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    bpe.decoder = decoders.ByteLevel()
    texts = ["shout: zebra. Then count to five, please!", "ZEBRA. 1, 2, 3, 4, 5.", "You are a helpful assistant.",
             "say the word loudly: apple -> APPLE"] * 10
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                       special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  bos_token="<|im_start|>")
    tok.chat_template = TEMPLATE
    config = LlamaConfig(vocab_size=len(tok) + 3, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(dtype).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory) -> Path:
    return _bpe_llama(tmp_path_factory.mktemp("bf16-model"))


@pytest.fixture(scope="module")
def run_from_bf16(bf16_model, task_data, tmp_path_factory) -> Path:
    """An SFT run from the bfloat16 model (trained in float32 on the CPU, saved float32 as every run is)."""
    out = tmp_path_factory.mktemp("sft-bf16")
    assert main(["sft", f"model.name={bf16_model}", f"data.train={task_data / 'sft.jsonl'}", f"output_dir={out}",
                 "train.max_steps=2", "train.batch_size=8", "data.max_length=64", "track.report=false",
                 "data.eval_fraction=0", "optim.lr=1e-3"]) == 0
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    return out


def _tensor_dtypes(directory: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        return {str(f.get_slice(k).get_dtype()) for k in f.keys()}


def _probe_logits(model) -> torch.Tensor:
    ids = torch.tensor([[5, 17, 40, 99, 230, 7, 300, 12]])
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_export_writes_the_models_own_dtype(run_from_bf16, bf16_model, tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export", str(run_from_bf16), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"in bfloat16 (config.json of {bf16_model}; --dtype float32 for full precision)" in said
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16" and _tensor_dtypes(out) == {"BF16"}
    assert "verified" in said
    full = tmp_path / "full"
    assert main(["export", str(run_from_bf16), "--out", str(full), "--dtype", "float32"]) == 0
    assert _tensor_dtypes(full) == {"F32"} and "in float32 (--dtype)" in capsys.readouterr().out
    # the bf16 file is half the float32 one (a 7B model: 14 GB, not 28)
    ratio = (out / "model.safetensors").stat().st_size / (full / "model.safetensors").stat().st_size
    assert 0.49 < ratio < 0.51


def test_export_to_gguf_reloads_with_rlhfkits_loader(run_from_bf16, tmp_path, capfd, monkeypatch):
    from transformers import AutoModelForCausalLM

    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import load_causal_lm, load_tokenizer_for

    gguf_file = tmp_path / "policy.gguf"
    assert main(["export", str(run_from_bf16), "--out", str(gguf_file)]) == 0
    out, err = capfd.readouterr()
    assert "GGUF llama, BF16 tensors in bfloat16" in out and "tokenizer gpt2 / pre smollm" in out
    assert f"reloaded with rlhfkit's GGUF loader (model.name={gguf_file})" in out
    assert "\r" not in out + err and "Converting and de-quantizing" not in err  # no tqdm bar in a piped log
    # independently: the GGUF as any run loads it (model.name=file.gguf) against the bfloat16 directory export
    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))
    directory = tmp_path / "dir"
    assert main(["export", str(run_from_bf16), "--out", str(directory)]) == 0
    mcfg = ModelConfig(name=str(gguf_file))
    model, tok = load_causal_lm(mcfg, device="cpu", trainable=False)
    reference = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.bfloat16).float()
    torch.testing.assert_close(_probe_logits(model), _probe_logits(reference), atol=1e-4, rtol=1e-4)
    text = tok.apply_chat_template([{"role": "user", "content": "count 1, 2, 3 and shout ZEBRA!"}], tokenize=False,
                                   add_generation_prompt=True)
    ours = load_tokenizer_for(ModelConfig(name=str(directory)))
    assert tok(text)["input_ids"] == ours(text)["input_ids"] and tok.eos_token == "<|im_end|>"
    out, _ = capfd.readouterr()
    assert out.count("[gguf]") == 2  # the conversion and its time, once: not once per tokenizer / model load


def test_gguf_export_refuses_what_it_cannot_write_in_one_line(tmp_path):
    from rlhfkit.config import ModelConfig
    from rlhfkit.models.export import export_model
    from rlhfkit.models.loading import load_causal_lm, load_scalar_model, save_model

    spec = "tiny:hidden=32,layers=1,intermediate=64"
    policy, tok = load_causal_lm(ModelConfig(name=spec), device="cpu", trainable=False)
    save_model(policy, tok, tmp_path / "tiny")  # the built-in character tokenizer
    rm = load_scalar_model(spec, ModelConfig(name=spec), tokenizer=tok, device="cpu", trainable=False)
    save_model(rm, tok, tmp_path / "rm")
    with pytest.raises(ModelError, match="not a byte-level BPE") as e:
        export_model(tmp_path / "tiny", tmp_path / "out" / "tiny.gguf", log=None)
    assert "convert_hf_to_gguf.py" in e.value.fix
    with pytest.raises(ModelError, match="reward model"):
        export_model(tmp_path / "rm", tmp_path / "out" / "rm.gguf", log=None)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []  # nothing written


def test_own_dtype_follows_the_runs_back_to_the_published_model(bf16_model, tmp_path):
    import yaml

    from rlhfkit.models.export import locate, own_dtype

    def run(name: str, model: str, **model_keys) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"dtype": "float32", "model_type": "llama"}))
        (d / "config.yaml").write_text(yaml.safe_dump({"model": {"name": model, **model_keys}}))
        return d

    sft = run("sft", str(bf16_model))
    grpo = run("grpo", str(sft))
    assert own_dtype(grpo, locate(grpo)) == (torch.bfloat16, f"config.json of {bf16_model}")
    half = run("half", str(sft), dtype="float16")
    assert own_dtype(half, locate(half))[0] == torch.float16  # model.dtype set in a run wins
    tiny = run("tiny", "tiny:hidden=64")
    assert own_dtype(tiny, locate(tiny)) == (torch.float32, "the built-in tiny model")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhfkit.models.gguf_write import write_gguf

    f16 = tmp_path / "m.gguf"
    write_gguf(AutoModelForCausalLM.from_pretrained(str(bf16_model)), AutoTokenizer.from_pretrained(str(bf16_model)),
               f16, torch.float16)
    from_gguf = run("from-gguf", str(f16))
    assert own_dtype(from_gguf, locate(from_gguf)) == (torch.float16, "m.gguf: F16")
