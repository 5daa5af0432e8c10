"""The teacher's tokenizer is compared with the student's from files (no weights): equal ids pass, any difference
in vocabulary, special ids or stop ids is one ModelError naming both."""

from __future__ import annotations

import json

import pytest

from rlhfkit.errors import ModelError
from rlhfkit.models.tokenizer import check_same_tokenizer, load_tokenizer


def _model_dir(path, tok, generation_config=None):
    tok.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    if generation_config is not None:
        (path / "generation_config.json").write_text(json.dumps(generation_config))
    return str(path)


def test_same_tokenizer_passes(tmp_path):
    check_same_tokenizer("tiny", "tiny:hidden=32")
    check_same_tokenizer("tiny", _model_dir(tmp_path / "t", load_tokenizer("tiny")))


def test_other_vocabulary_is_refused(tmp_path):
    tok = load_tokenizer("tiny")
    tok.add_tokens(["<|tool|>"])
    teacher = _model_dir(tmp_path / "t", tok)
    with pytest.raises(ModelError) as e:
        check_same_tokenizer("tiny", teacher)
    assert e.value.where == "teacher.model"
    n = len(load_tokenizer("tiny").get_vocab())
    assert f"student tiny ({n} tokens)" in str(e.value) and f"({n + 1} tokens)" in str(e.value)
    assert "'<|tool|>'" in str(e.value) and "not built" in str(e.value)


def test_other_stop_ids_are_refused(tmp_path):
    tok = load_tokenizer("tiny")
    other = next(i for i in range(len(tok)) if i not in (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id))
    teacher = _model_dir(tmp_path / "t", tok, generation_config={"eos_token_id": [tok.eos_token_id, other]})
    with pytest.raises(ModelError, match="end a reply differ"):
        check_same_tokenizer("tiny", teacher)
