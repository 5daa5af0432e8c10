"""The static engine against hf on the real SmolLM2-135M-Instruct (float32, 8 chat prompts, 48 new tokens): greedy
tokens identical, sampled log-probs equal to the trainer's recomputed ones. ``-m gguf`` (skipped, with the reason,
when the GGUF file is not on this machine; see tests/e2e/test_smollm2.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_HELPER = Path(__file__).resolve().parents[2] / "examples" / "smollm2.py"
_spec = importlib.util.spec_from_file_location("rlhfkit_example_smollm2", _HELPER)
_smollm2 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_smollm2)
GGUF = _smollm2.find_smollm2_gguf()

pytestmark = [pytest.mark.gguf, pytest.mark.skipif(GGUF is None, reason=_smollm2.search_report())]


@pytest.fixture(scope="module")
def smollm2():
    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import _gguf_cache_dir, load_causal_lm

    if not (_gguf_cache_dir(Path(GGUF)) / "config.json").is_file() and importlib.util.find_spec("gguf") is None:
        pytest.skip("converting the GGUF file needs the `gguf` package: pip install 'rlhfkit[gguf]'")
    model, tok = load_causal_lm(ModelConfig(name=str(GGUF), dtype="float32"), device=torch.device("cpu"), seed=0)
    return model.eval(), tok


def test_static_engine_matches_hf_on_smollm2(smollm2):
    from rlhfkit.algos import token_logprobs
    from rlhfkit.data.chat import encode_chat_prompts, stop_token_ids
    from rlhfkit.rollout import HFEngine, SamplingParams, StaticEngine
    from rlhfkit.train.online.experience import position_ids_of
    from rlhfkit.train.shared.forward import response_logits

    model, tok = smollm2
    ends = dict(eos_token_ids=stop_token_ids(tok, model.generation_config), pad_token_id=tok.pad_token_id)
    questions = ["What is 2 + 3?", "Name a colour.", "Say hello in French.", "What is the capital of Italy?",
                 "Count to five.", "Is water wet?", "Write one word.", "What is 7 times 6? Answer briefly."]
    prompts = encode_chat_prompts(tok, [[{"role": "user", "content": q}] for q in questions])
    greedy = SamplingParams(max_new_tokens=48, greedy=True)
    ref = HFEngine(tok, **ends).generate(model, prompts, greedy)
    ours = StaticEngine(tok, **ends, compile=False).generate(model, prompts, greedy)
    assert ref.ended.any() and len(set(ref.lengths.tolist())) > 1  # real answers, ending at different lengths
    for name in ("response_ids", "response_mask", "ended", "lengths"):
        assert torch.equal(getattr(ref, name), getattr(ours, name)), name
    r = StaticEngine(tok, **ends, compile=False).generate(model, prompts, SamplingParams(max_new_tokens=48), seed=0)
    batch = {"input_ids": r.sequences, "attention_mask": r.attention_mask,
             "position_ids": position_ids_of(r.attention_mask), "response_ids": r.response_ids}
    with torch.no_grad():
        lp = token_logprobs(response_logits(model, batch, 1.0), r.response_ids)
    mask = r.response_mask.bool()
    torch.testing.assert_close(r.logprobs[mask], lp[mask], atol=1e-4, rtol=0)
