"""The teacher's tokenizer is compared with the student's from files (no weights): equal ids pass, any difference
in vocabulary, special ids or stop ids is one ModelError naming both."""

from __future__ import annotations

import json

import pytest

from rlhfkit.errors import ModelError
from rlhfkit.models.tokenizer import check_same_tokenizer, load_tokenizer


def _model_dir(path, tok, generation_config=None, **config):
    tok.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  **config}))
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


def test_a_teacher_config_smaller_than_its_tokenizer_is_one_line_before_weights(tmp_path):
    tok = load_tokenizer("tiny")
    n = max(tok.get_vocab().values()) + 1
    teacher = _model_dir(tmp_path / "small", tok, vocab_size=n - 8)
    with pytest.raises(ModelError) as e:
        check_same_tokenizer("tiny", teacher)
    text = e.value.one_line()
    assert e.value.where == "teacher.model" and "\n" not in text
    assert f"the teacher {teacher} has vocab_size={n - 8} in its config.json" in text and f"{n} token ids" in text
    # a padded embedding table (more rows than tokens), or one in a multimodal model's text_config, is fine
    check_same_tokenizer("tiny", _model_dir(tmp_path / "padded", tok, vocab_size=n + 64))
    check_same_tokenizer("tiny", _model_dir(tmp_path / "vlm", tok, text_config={"vocab_size": n}))
    with pytest.raises(ModelError, match="text_config|vocab_size=10 in"):
        check_same_tokenizer("tiny", _model_dir(tmp_path / "vlm_small", tok, text_config={"vocab_size": 10}))
    # the student is held to the same
    with pytest.raises(ModelError, match=f"the student .* vocab_size={n - 1}") as e:
        check_same_tokenizer(_model_dir(tmp_path / "student", tok, vocab_size=n - 1), "tiny")
    assert e.value.where == "model.name"
