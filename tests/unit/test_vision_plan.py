"""``rlhfkit plan`` on vision-language models (models/tower.py): the vision tower's parameters (checked by hand for
Qwen2.5-VL-3B's shape, and against the built model for each tiny family), the image tokens of the processor's
largest image (against what the processor makes of one), frozen vs trained towers in the states, and the memory of
encoding images in the rollout and the train step (by hand), Qwen3-VL's DeepStack features kept beside the last
layer's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rlhfkit.config import ModelConfig, build_config
from rlhfkit.models.memory import read_architecture
from rlhfkit.plan import plan

QWEN25_VL_3B = str(Path(__file__).resolve().parents[2] / "configs" / "models" / "qwen2.5-vl-3b")


def _linear(i: int, o: int, bias: bool = True) -> int:
    return i * o + (o if bias else 0)


def test_qwen25_vl_3b_tower_and_text_model_counted_by_hand():
    arch = read_architecture(QWEN25_VL_3B)
    # Qwen2.5-VL's tower: a 3-D patch convolution (no bias), 32 blocks (two RMSNorms, qkv + proj, a gated MLP,
    # all with biases), the 2 x 2 merger (an RMSNorm, a two-layer MLP to the text width)
    block = 2 * 1280 + _linear(1280, 3 * 1280) + _linear(1280, 1280) + 2 * _linear(1280, 3420) + _linear(3420, 1280)
    merger = 1280 + _linear(4 * 1280, 4 * 1280) + _linear(4 * 1280, 2048)
    tower = 3 * 2 * 14 * 14 * 1280 + 32 * block + merger
    assert arch.tower.params == tower == 668_684_288
    assert arch.params() - tower == 3_085_938_688  # Qwen2.5-3B's text model (tied embeddings)
    assert arch.tower.tokens == 12_845_056 // 28 ** 2 and arch.tower.patches == 12_845_056 // 14 ** 2
    assert (arch.tower.layers, arch.tower.hidden, arch.tower.intermediate) == (32, 1280, 3420)


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "gemma3_vl", "llava", "qwen3_vl", "idefics3"])
def test_tiny_towers_equal_the_built_models_and_their_processors_largest_image(arch):
    from rlhfkit.data import LengthPolicy, normalize_record, tokenize_dataset
    from rlhfkit.models.loading import load_causal_lm
    from rlhfkit.models.vision import vision_modules

    name = f"tiny:arch={arch},hidden=64,layers=2,kv_heads=2"
    model, tok = load_causal_lm(ModelConfig(name=name), trainable=False)
    sizes = read_architecture(name)
    tower = sizes.tower
    assert tower.params == sum(p.numel() for m in vision_modules(model) for p in m.parameters())
    built = sum(p.numel() for p in model.parameters())
    if arch == "qwen3_vl":  # (the text estimate leaves Qwen3's q / k norms out, as for Qwen3: 2 x head_dim a layer)
        built -= 2 * 2 * (64 // 4)
    if arch != "gemma3_vl":  # (Gemma 3's text layers' extra norms are not counted by the text estimate)
        assert sizes.params() == built  # the text model's q / k / v biases too
    big = Image.fromarray(np.random.RandomState(0).randint(0, 255, (96, 96, 3), dtype=np.uint8))
    (ex,), _ = tokenize_dataset([normalize_record({"prompt": "Which?", "image": big}, "prompt", where="r:0")],
                                "prompt", tok, LengthPolicy(256))
    assert ex["media"].tokens == tower.tokens  # an image larger than the processor's largest: that many tokens


def _plan(name: str, *overrides: str, recipe: str = "grpo"):
    return plan(build_config(recipe, {}, [f"model.name={name}", *overrides]), world=1, checks=False)


def test_plan_counts_the_tower_frozen_by_default_and_trained_when_asked():
    name = "tiny:arch=qwen2_5_vl,hidden=64,layers=2,kv_heads=2"
    arch = read_architecture(name)
    frozen, trained = _plan(name, "model.lora.enabled=false"), _plan(name, "model.train_vision=true")
    default = {p.name: p for p in _plan(name).phases}["train step"]  # LoRA on the language model, as the run does
    assert default.items["policy weights"] == arch.params() * 2  # every weight frozen under the adapters (bf16)
    assert 0 < default.items["policy gradients"] == default.items["policy LoRA adapters"]
    step = {p.name: p for p in frozen.phases}["train step"]
    assert step.items["policy weights"] == arch.params() * 4  # the tower's weights are held
    assert step.items["policy gradients"] == (arch.params() - arch.tower.params) * 4  # not its gradients
    t_step = {p.name: p for p in trained.phases}["train step"]
    assert t_step.items["policy gradients"] == arch.params() * 4
    assert "vision tower forward (no grad, frozen)" in step.items and "vision tower forward" in t_step.items
    text = frozen.render()
    assert f"vision tower {arch.tower.params / 1e6:.1f}M parameters (frozen), {arch.tower.tokens} image tokens" in text


def test_plan_encodes_the_rollouts_images_cut_to_the_sequence_and_a_micro_batchs_in_the_step():
    p = _plan(QWEN25_VL_3B, "data.max_length=2048", "generation.max_new_tokens=64", "algo.rollout_batch_size=16",
              "train.batch_size=8")
    phases = {ph.name: ph for ph in p.phases}
    seq = 2048 + 64
    patches = seq * 4  # 2 x 2 patches per image token, the largest image cut to the sequence
    per_layer = patches * (6 * 1280 + 2 * 3420) * 2  # bf16
    rollout = phases["rollout (generation)"]
    assert rollout.items["vision tower forward (no grad, frozen)"] == 16 * 2 * per_layer
    assert rollout.items["image features (kept per image set)"] == 16 * seq * 2048 * 2
    step = phases["train step"]
    assert step.items["vision tower forward (no grad, frozen)"] == 8 * 2 * per_layer
    trained = {ph.name: ph for ph in _plan(QWEN25_VL_3B, "data.max_length=2048", "generation.max_new_tokens=64",
                                           "train.batch_size=8", "model.train_vision=true").phases}
    assert trained["train step"].items["vision tower forward"] == 8 * 32 * per_layer  # every layer kept


def test_a_text_model_has_no_tower():
    assert read_architecture("tiny").tower is None
    assert "vision tower" not in _plan("tiny").render()


def test_plan_keeps_qwen3_vls_deepstack_features_beside_the_last_layers():
    name = "tiny:arch=qwen3_vl,hidden=64,layers=2,kv_heads=2"
    tower = read_architecture(name).tower
    assert tower.stacks == 3  # the last layer's features and DeepStack's two layers' (deepstack_visual_indexes)
    rollout = {p.name: p for p in _plan(name, "algo.rollout_batch_size=4").phases}["rollout (generation)"]
    assert rollout.items["image features (kept per image set)"] == 4 * tower.tokens * 3 * 64 * 2  # bf16


def test_smolvlm_image_tokens_of_its_largest_image_by_hand():
    from transformers import Idefics3Config

    from rlhfkit.models.tower import _tiles

    # SmolVLM-256M's shape: 512 px tiles of 16 px patches, pixel shuffle by 4 -> (512 / 16)^2 / 16 = 64 tokens a tile;
    # its processor's largest image, 2048 px a side, is 4 x 4 tiles + the whole image
    cfg = Idefics3Config(vision_config={"image_size": 512, "patch_size": 16}, scale_factor=4)
    settings = {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}, "do_image_splitting": True}
    assert _tiles(cfg, settings)[:2] == (17 * 64, 17 * 32 * 32)
    assert _tiles(cfg, {**settings, "do_image_splitting": False})[:2] == (64, 32 * 32)
    assert _tiles(cfg, {**settings, "size": {"longest_edge": 1536}})[0] == 10 * 64  # 3 x 3 + 1
