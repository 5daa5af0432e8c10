"""A LoRA run's merged model, saved without a copy of the whole model (``loading.merged_state_dict``): the same files,
bit for bit, as peft's ``merge_and_unload`` on a deep copy (the way it was saved before), for a tied text model, an
untied one, a vision-language model (transformers converts its keys on save) and a reward model (its score head a
``modules_to_save``); the trained model itself left as it was."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.config import ModelConfig
from rlhfkit.config.schema import LoraConfig
from rlhfkit.models.loading import load_causal_lm, load_scalar_model, save_model


def _weights(folder) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _trained(model) -> None:
    """Adapters that change the weights (peft starts B at 0: a zero update would prove nothing)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


@pytest.mark.parametrize("spec", ["tiny", "tiny:arch=qwen3,hidden=64,layers=2", "tiny:arch=qwen2_5_vl,hidden=32",
                                  "reward"])
def test_merged_save_equals_merge_and_unload_bit_for_bit(spec, tmp_path):
    lora = LoraConfig(enabled=True, r=4)
    if spec == "reward":
        mcfg = ModelConfig(name="tiny", lora=lora)
        _, tok = load_causal_lm(ModelConfig(name="tiny"), trainable=False)
        model = load_scalar_model("tiny", mcfg, tokenizer=tok)
    else:
        model, tok = load_causal_lm(ModelConfig(name=spec, lora=lora))
    _trained(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    save_model(model, tok, tmp_path / "new")

    copy.deepcopy(model).merge_and_unload().save_pretrained(tmp_path / "old")  # the former way
    copy.deepcopy(model).unload().save_pretrained(tmp_path / "base")  # the adapters left out
    new, old, base = _weights(tmp_path / "new"), _weights(tmp_path / "old"), _weights(tmp_path / "base")
    assert sorted(new) == sorted(old) == sorted(base)
    assert all(torch.equal(new[k], old[k]) for k in old), [k for k in old if not torch.equal(new[k], old[k])][:3]
    assert any(not torch.equal(new[k], base[k]) for k in base)  # the adapters are in the merged weights
    assert json.loads((tmp_path / "new" / "config.json").read_text()) == \
        json.loads((tmp_path / "old" / "config.json").read_text())
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # the trained model untouched


def test_a_save_removes_the_other_layout_a_former_save_left(tmp_path):
    """Shards (and their index) from a former save beside a new single file would be read instead of it, or the
    other way round: the new save leaves only its own weight files; the run's other files stay."""
    model, tok = load_causal_lm(ModelConfig(name="tiny"))
    out = tmp_path / "run"
    out.mkdir()
    for name in ("model-00001-of-00002.safetensors", "model.safetensors.index.json", "metrics.jsonl"):
        (out / name).write_text("former")
    save_model(model, tok, out)
    assert sorted(p.name for p in out.glob("model*")) == ["model.safetensors"]
    assert (out / "metrics.jsonl").read_text() == "former"
    saved, state = _weights(out), model.state_dict()
    assert saved and all(torch.equal(v, state[k]) for k, v in saved.items())  # the new weights, every one of them
