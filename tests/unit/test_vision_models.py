"""Vision-language models in the engines and the trainer's forwards, per family (tiny Qwen2.5-VL, Gemma 3, LLaVA and
Qwen3-VL built from config with their processors, offline; weights drawn large so that greedy tokens depend on the
image; Qwen3-VL's with DeepStack and interleaved M-RoPE: the engine tests fail when its DeepStack features or its
3-D positions are dropped):
greedy tokens of the static and continuous engines equal transformers' ``generate``'s; sampled log-probs equal the
trainer's recomputed ones; the trainer's forward with each image's features computed once equals the model's own
forward from the pixels; the vision tower runs once per distinct image set; LoRA adapts the language model only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from test_rollout_static import assert_same_rollout

from rlhfkit.config import ModelConfig
from rlhfkit.config.schema import LoraConfig
from rlhfkit.data import LengthPolicy, normalize_record, tokenize_dataset
from rlhfkit.models.loading import load_causal_lm
from rlhfkit.rollout import SamplingParams, finalize_responses, make_engine
from rlhfkit.train.online.experience import position_ids_of
from rlhfkit.train.shared.forward import completion_stats, response_stats

ARCHS = ("qwen2_5_vl", "gemma3_vl", "llava", "qwen3_vl", "idefics3", "smolvlm")


def picture(seed: int, size=(32, 32)) -> Image.Image:
    rng = np.random.RandomState(seed)
    pixels = np.zeros((*size[::-1], 3), dtype=np.uint8)
    x, y = rng.randint(0, size[0] // 2), rng.randint(0, size[1] // 2)
    pixels[y:y + size[1] // 2, x:x + size[0] // 2] = rng.randint(0, 255, 3)
    return Image.fromarray(pixels)


def family(arch: str, seed: int = 0, image: int = 32):
    """(model, tokenizer) of a tiny VLM in eval mode, every weight matrix drawn with std 0.3 (the language model's
    and the tower's: tokens then depend on the picture), its LM head untied and drawn too, the EOS row raised so that
    rows end at different steps (tied, Gemma 3's greedy tokens repeat one token whatever the picture)."""
    name = f"tiny:arch={arch},hidden=64,layers=2,kv_heads=2,image={image}"
    model, tok = load_causal_lm(ModelConfig(name=name), trainable=False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        head = torch.randn(model.lm_head.weight.shape, generator=g) * 0.3
        head[tok.eos_token_id] += 0.5
    model.lm_head.weight = torch.nn.Parameter(head)
    return model.eval(), tok


def examples(tok) -> list[dict]:
    """Prompts with images of several sizes, two with the same text and other images, one without an image."""
    rows = [{"prompt": "What is it?", "image": picture(0)}, {"prompt": "What is it?", "image": picture(1)},
            {"prompt": "Say more" + "!" * 5, "image": picture(2, (48, 40))},
            {"prompt": [{"role": "user", "content": [{"type": "text", "text": "Two:"}, {"type": "image"},
                                                     {"type": "image"}]}], "images": [picture(3), picture(4)]},
            {"prompt": "No picture here"}]
    records = [normalize_record(r, "prompt", where=f"r:{i}") for i, r in enumerate(rows)]
    out, _ = tokenize_dataset(records, "prompt", tok, LengthPolicy(256))
    return out


SEEDS = {"idefics3": 4, "smolvlm": 4}  # (seed 0: both pictures' rows end at once, which proves nothing)


@pytest.fixture(scope="module", params=ARCHS)
def vlm(request):
    model, tok = family(request.param, SEEDS.get(request.param, 0))
    return request.param, model, tok, examples(tok)


def engine(name: str, tok, model, **kw):
    kwargs = {"compile": False, "sync_every": 2} if name == "static" else \
        {"block_size": 4, "prefill_chunk": 8, "sync_every": 2} if name == "continuous" else {}
    return make_engine(name, tok, model, engine_kwargs=kwargs, **kw)


def _inputs(ex: list[dict], k: int = 2):
    return [e["prompt_ids"] for e in ex] * k, [e.get("media") for e in ex] * k


@pytest.mark.parametrize("name", ["static", "continuous"])
def test_greedy_tokens_equal_generates(name, vlm):
    arch, model, tok, ex = vlm
    ids, media = _inputs(ex)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    ref = engine("hf", tok, model).generate(model, ids, params, media=media)
    assert len(set(ref.lengths.tolist())) > 1  # rows end at different steps
    assert not torch.equal(ref.response_ids[0], ref.response_ids[1])  # the same text, another picture: other tokens
    assert_same_rollout(ref, engine(name, tok, model).generate(model, ids, params, media=media), lp_atol=1e-4)


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_m_rope_of_images_wider_or_taller_than_square_decodes_as_generate(arch):
    """Grids of 6 x 12, 12 x 6, 4 x 16 and 16 x 4 patches: an image's rows and columns take other positions, and the
    text after it goes on from their larger side (Qwen3-VL: ``max(h, w)``), which the decode's rotary shift follows."""
    model, tok = family(arch, image=64)
    rows = [{"prompt": "Wide?", "image": picture(0, (64, 32))}, {"prompt": "Tall?", "image": picture(1, (32, 64))},
            {"prompt": "Both", "images": [picture(2, (64, 16)), picture(3, (16, 64))]}, {"prompt": "none"}]
    ex, _ = tokenize_dataset([normalize_record(r, "prompt", where=f"r:{i}") for i, r in enumerate(rows)], "prompt",
                             tok, LengthPolicy(256))
    grids = [e["media"].extras["image_grid_thw"][:, 1:].tolist() for e in ex[:3]]
    assert grids == [[[6, 12]], [[12, 6]], [[4, 16], [16, 4]]]
    ids, media = _inputs(ex)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    ref = engine("hf", tok, model).generate(model, ids, params, media=media)
    for name in ("static", "continuous"):
        assert_same_rollout(ref, engine(name, tok, model).generate(model, ids, params, media=media), lp_atol=1e-4)


@pytest.mark.parametrize("name", ["hf", "static", "continuous"])
def test_sampled_logprobs_equal_the_trainers(name, vlm):
    arch, model, tok, ex = vlm
    ids, media = _inputs(ex, 3)
    r = engine(name, tok, model).generate(model, ids, SamplingParams(max_new_tokens=10, temperature=0.8), seed=7,
                                          media=media)
    batch = {"input_ids": r.sequences, "attention_mask": r.attention_mask, "response_ids": r.response_ids,
             "position_ids": position_ids_of(r.attention_mask), "media": media}
    mask = r.response_mask.bool()
    assert mask.sum() > 30
    with torch.no_grad():
        for share in (True, False):  # a prompt run once for its group (its images with it), or every row whole
            st = response_stats(model, batch, 0.8, share_prompts=share)
            torch.testing.assert_close(st.logprobs[mask], r.logprobs[mask], atol=1e-4, rtol=0)


def test_the_trainers_forward_equals_the_model_from_its_pixels(vlm):
    from rlhfkit.models.vision import generate_inputs

    arch, model, tok, ex = vlm
    ids, media = _inputs(ex, 1)
    width = max(map(len, ids))
    x = torch.tensor([[tok.pad_token_id] * (width - len(i)) + i for i in ids])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(i) for i in ids])[:, None]).long()
    with torch.no_grad():
        got = completion_stats(model, x, mask, media=media).logprobs
        extra = generate_inputs(model, x, media)  # the pixels; the model's own positions (M-RoPE: from the ids)
        if arch in ("qwen2_5_vl", "qwen3_vl"):
            extra = {"mm_token_type_ids": extra.pop("mm_token_type_ids"), **extra}
        logits = model(input_ids=x, attention_mask=mask, **extra).logits
    want = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, x[:, 1:, None])[..., 0]
    real = mask[:, 1:].bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "idefics3"])
def test_the_vision_tower_runs_once_per_distinct_image_set(monkeypatch, arch):
    from rlhfkit.models.vision import base_of

    model, tok = family(arch, seed=3)
    ex = examples(tok)
    base = base_of(model)
    calls: list[int] = []
    original = base.get_image_features

    def counted(pixel_values, image_grid_thw=None, **kwargs):
        if image_grid_thw is not None:  # Qwen2.5-VL, Qwen3-VL
            calls.append(int(image_grid_thw.shape[0]))  # images in this call
            return original(pixel_values, image_grid_thw, **kwargs)
        # [sequences, tiles, ...], padded with all-zero tiles; an image is 2 x 2 tiles + the whole (at 32 px)
        calls.append(int(pixel_values.flatten(2).abs().sum(-1).gt(0).sum()) // 5)
        return original(pixel_values, **kwargs)

    monkeypatch.setattr(base, "get_image_features", counted)
    ids, media = _inputs(ex, 4)  # 5 prompts, 5 image sets (6 images), 4 samples each
    r = engine("static", tok, model).generate(model, ids, SamplingParams(max_new_tokens=6), seed=1, media=media)
    batch = {"input_ids": r.sequences, "attention_mask": r.attention_mask, "response_ids": r.response_ids,
             "position_ids": position_ids_of(r.attention_mask), "media": media}
    with torch.no_grad():
        for _ in range(3):  # the old, reference and update forwards of a step
            response_stats(model, batch, 1.0)
    assert calls == [5]  # one call, for the 5 images of the 4 prompts with images; every later use from the cache


def test_lora_adapts_the_language_model_only_and_the_tower_is_frozen():
    from rlhfkit.models.vision import family_of, vision_modules

    for arch in ARCHS:
        mcfg = ModelConfig(name=f"tiny:arch={arch},hidden=32,layers=1", lora=LoraConfig(enabled=True, r=2))
        model, _ = load_causal_lm(mcfg)
        adapted = [n for n, _ in model.named_modules() if n.endswith("lora_A")]
        text = f".{family_of(model).text}."  # the language model (Idefics3 / SmolVLM: ``text_model``)
        assert adapted and all(text in n for n in adapted), (arch, adapted[:3])
        assert not any(p.requires_grad for m in vision_modules(model) for p in m.parameters())
        if arch == "qwen3_vl":  # its DeepStack mergers are the tower's too: frozen, not adapted
            deep = [p for n, p in model.named_parameters() if "deepstack_merger" in n]
            assert deep and not any(p.requires_grad for p in deep)
    model, _ = load_causal_lm(ModelConfig(name="tiny:arch=qwen2_5_vl,hidden=32,layers=1", train_vision=True))
    assert all(p.requires_grad for m in vision_modules(model) for p in m.parameters())


def test_a_sampled_image_token_ends_the_response_before_it():
    ids = torch.tensor([[5, 6, 101, 7, 2], [5, 2, 101, 7, 7], [101, 5, 5, 5, 5]])
    out, mask, ended, lengths = finalize_responses(ids, eos_token_ids=[2], pad_token_id=0, cut_ids=[101])
    assert lengths.tolist() == [2, 2, 0] and ended.tolist() == [False, True, False]
    assert out.tolist() == [[5, 6, 0, 0, 0], [5, 2, 0, 0, 0], [0, 0, 0, 0, 0]]


def test_qwen3_vl_is_a_covered_family_and_its_moe_variant_is_refused_in_one_line(tmp_path):
    import json

    from rlhfkit.errors import ModelError
    from rlhfkit.models.vision import vlm_type

    for kind in ("qwen3_vl", "qwen3_vl_moe"):
        (tmp_path / kind).mkdir()
        (tmp_path / kind / "config.json").write_text(json.dumps({"model_type": kind, "vision_config": {},
                                                                 "text_config": {}}))
    assert vlm_type(str(tmp_path / "qwen3_vl")) == "qwen3_vl"
    with pytest.raises(ModelError, match=r"of type 'qwen3_vl_moe', which rlhfkit's VLM path does not cover \(it "
                                         r"covers .*Qwen3-VL"):
        vlm_type(str(tmp_path / "qwen3_vl_moe"))


def test_smolvlm2s_own_processor_expands_images_as_the_tiny_ones_and_needs_num2words(tmp_path, monkeypatch):
    """A SmolVLM2 directory names ``SmolVLMProcessor``: without ``num2words`` its loading is one line naming it; with
    it (stubbed here: only videos use it), built without its video processor (no torchvision) and with the directory's
    ``image_seq_len``, it expands a picture into the same ids as ``tiny:arch=smolvlm``'s ``Idefics3Processor``."""
    import json

    import transformers.models.smolvlm.processing_smolvlm as smolvlm

    from rlhfkit.errors import ModelError
    from rlhfkit.models.vision import load_processor

    tiny = load_processor("tiny:arch=smolvlm")
    tiny.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "processor_config.json").read_text())
    (tmp_path / "processor_config.json").write_text(json.dumps({**cfg, "processor_class": "SmolVLMProcessor"}))
    monkeypatch.setattr(smolvlm, "num2words", None)
    with pytest.raises(ModelError, match="num2words"):
        load_processor(str(tmp_path))
    monkeypatch.setattr(smolvlm, "num2words", str)
    own = load_processor(str(tmp_path))
    assert type(own).__name__ == "SmolVLMProcessor" and own.image_seq_len == tiny.image_seq_len == 4
    text = "<|im_start|>user\n<image>What?<|im_end|>\n"
    a, b = (p(text=[text], images=[[picture(5, (64, 32))]], return_tensors="pt") for p in (own, tiny))
    assert a["input_ids"].tolist() == b["input_ids"].tolist() and torch.equal(a["pixel_values"], b["pixel_values"])
