"""The teacher's tokenizer is compared with the student's from files (no weights): equal ids give None, any
difference in vocabulary, special ids or stop ids one line naming both (the run then distils across tokenizers, or
refuses a multi-turn environment, exit 2, before any weights load); an unreadable tokenizer is a ModelError."""

from __future__ import annotations

import json

import pytest

from rlhfkit.errors import ConfigError, ModelError
from rlhfkit.models.tokenizer import load_tokenizer, same_ids, tokenizer_difference


def _model_dir(path, tok, generation_config=None, **config):
    tok.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  **config}))
    if generation_config is not None:
        (path / "generation_config.json").write_text(json.dumps(generation_config))
    return str(path)


def test_same_tokenizer_is_no_difference(tmp_path):
    assert tokenizer_difference("tiny", "tiny:hidden=32") is None
    assert tokenizer_difference("tiny", _model_dir(tmp_path / "t", load_tokenizer("tiny"))) is None
    tok = load_tokenizer("tiny")
    assert same_ids(tok, [tok.eos_token_id], load_tokenizer("tiny"), [tok.eos_token_id])


def test_other_vocabulary_is_named(tmp_path):
    tok = load_tokenizer("tiny")
    tok.add_tokens(["<|tool|>"])
    teacher = _model_dir(tmp_path / "t", tok)
    diff = tokenizer_difference("tiny", teacher)
    n = len(load_tokenizer("tiny").get_vocab())
    assert f"student tiny ({n} tokens)" in diff and f"({n + 1} tokens)" in diff and "'<|tool|>'" in diff
    assert not same_ids(load_tokenizer("tiny"), [2], tok, [2])


def test_other_stop_ids_are_named(tmp_path):
    tok = load_tokenizer("tiny")
    other = next(i for i in range(len(tok)) if i not in (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id))
    teacher = _model_dir(tmp_path / "t", tok, generation_config={"eos_token_id": [tok.eos_token_id, other]})
    assert "end a reply differ" in tokenizer_difference("tiny", teacher)


def test_an_unreadable_teacher_tokenizer_is_one_line(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelError) as e:
        tokenizer_difference("tiny", str(tmp_path / "t"))
    assert e.value.where == "teacher.model" and "not valid JSON" in str(e.value)


def test_a_teacher_of_another_tokenizer_in_a_multi_turn_environment_is_refused_before_weights_load(tmp_path):
    from rlhfkit.config import build_config
    from rlhfkit.train.online.synchronous import _before_run

    tok = load_tokenizer("tiny")
    tok.add_tokens(["<|tool|>"])
    teacher = _model_dir(tmp_path / "t", tok)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": [{"role": "user", "content": "2+2?"}], "expression": "2+2"}) + "\n")
    over = ["model.name=tiny", f"teacher.model={teacher}", f"data.train={prompts}", "data.eval=null",
            f"output_dir={tmp_path / 'run'}"]
    with pytest.raises(ConfigError, match="not built") as e:
        _before_run(build_config("distill", {}, [*over, "env.name=calculator"]))
    assert e.value.where == "teacher.model" and not (tmp_path / "run").exists()
    _before_run(build_config("distill", {}, over))  # single-turn: distilled across tokenizers


def test_a_teacher_config_smaller_than_its_tokenizer_is_one_line_before_weights(tmp_path):
    tok = load_tokenizer("tiny")
    n = max(tok.get_vocab().values()) + 1
    teacher = _model_dir(tmp_path / "small", tok, vocab_size=n - 8)
    with pytest.raises(ModelError) as e:
        tokenizer_difference("tiny", teacher)
    text = e.value.one_line()
    assert e.value.where == "teacher.model" and "\n" not in text
    assert f"the teacher {teacher} has vocab_size={n - 8} in its config.json" in text and f"{n} token ids" in text
    # a padded embedding table (more rows than tokens), or one in a multimodal model's text_config, is fine
    assert tokenizer_difference("tiny", _model_dir(tmp_path / "padded", tok, vocab_size=n + 64)) is None
    assert tokenizer_difference("tiny", _model_dir(tmp_path / "vlm", tok, text_config={"vocab_size": n})) is None
    with pytest.raises(ModelError, match="text_config|vocab_size=10 in"):
        tokenizer_difference("tiny", _model_dir(tmp_path / "vlm_small", tok, text_config={"vocab_size": 10}))
    # the student is held to the same
    with pytest.raises(ModelError, match=f"the student .* vocab_size={n - 1}") as e:
        tokenizer_difference(_model_dir(tmp_path / "student", tok, vocab_size=n - 1), "tiny")
    assert e.value.where == "model.name"


@pytest.mark.parametrize("damage", ["empty vocabulary", "no EOS"])
def test_a_teacher_tokenizer_that_loads_but_cannot_serve_is_one_line_naming_the_teacher(tmp_path, damage):
    # it loads, so no JSON check sees it: an empty vocabulary surfaced as a tokenizers exception when the student's
    # text was re-tokenised, a missing EOS was blamed on model.name
    tok = load_tokenizer("tiny")
    teacher = _model_dir(tmp_path / "t", tok)
    tj = json.loads((tmp_path / "t" / "tokenizer.json").read_text())
    if damage == "empty vocabulary":
        tj["model"]["vocab"], tj["model"]["merges"] = {}, []
    (tmp_path / "t" / "tokenizer.json").write_text(json.dumps(tj))
    if damage == "no EOS":
        cfg = json.loads((tmp_path / "t" / "tokenizer_config.json").read_text())
        cfg["eos_token"] = None
        (tmp_path / "t" / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError) as e:
        tokenizer_difference("tiny", teacher)
    assert e.value.where == "teacher.model" and "\n" not in str(e.value) and teacher in e.value.message
    assert ("no EOS token" if damage == "no EOS" else "cannot encode text") in e.value.message
