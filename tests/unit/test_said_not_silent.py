"""What used to pass in silence is said in one line before any weights load: a chat model without a chat template
(rlhfkit's ChatML used instead), a held-out split too small to measure; and ``--field`` is one spelling for eval and
training."""

import json

import pytest

from rlhfkit.cli import UsageError, _field_map, split_overrides
from rlhfkit.config import build_config
from rlhfkit.track.progress import held_out


def test_field_flag_is_one_spelling_for_eval_and_training():
    assert split_overrides(["--field", "prompt=question", "--field=data.fields.answer=solution"])[1] == [
        "data.fields.prompt=question", "data.fields.answer=solution"]
    assert _field_map(["prompt=question", "data.fields.answer=solution", "fields.tests=cases"]) == {
        "prompt": "question", "answer": "solution", "tests": "cases"}
    cfg = build_config("grpo", {}, ["model.name=tiny", *split_overrides(["--field", "prompt=question"])[1]])
    assert cfg.data.fields == {"prompt": "question"}
    for bad in ("prompt", "data.prompt=q", "=q", "prompt="):
        with pytest.raises(UsageError, match="--field NAME=COLUMN"):
            _field_map([bad])


def test_a_chat_model_without_a_template_is_named_once(tmp_path, capsys, monkeypatch):
    from rlhfkit.models import tokenizer as tokmod
    from rlhfkit.models.tokenizer import ASSET_DIR, load_tokenizer

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(tokmod, "_FALLBACK_SAID", set())
    model = tmp_path / "chat-model"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_text((ASSET_DIR / name).read_text())  # a tokenizer with <|im_end|> and no template
    load_tokenizer(str(model))
    load_tokenizer(str(model))
    out = capsys.readouterr().out.splitlines()
    assert out == [f"[model] {model} has no chat template: rlhfkit's ChatML template is used (<|im_start|>role ... "
                   "<|im_end|>); a chat model trained with another template answers worse with it: set "
                   "model.chat_template to its own (a Jinja file or text)"]
    load_tokenizer("tiny")  # the built-in tiny model's template is rlhfkit's own: nothing to say
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ messages }}"}))
    monkeypatch.setattr(tokmod, "_FALLBACK_SAID", set())
    load_tokenizer(str(model))
    assert capsys.readouterr().out == ""


def test_a_held_out_split_too_small_to_measure(tmp_path, capsys, monkeypatch):
    from rlhfkit.train.shared.batches import load_records

    monkeypatch.delenv("RANK", raising=False)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"p{i}", "chosen": "a", "rejected": "b"}) + "\n"
                             for i in range(30)))
    cfg = build_config("rm", {}, ["model.name=tiny", f"data.train={pairs}"])  # 5% of 30: one pair held out
    train, evals = load_records(cfg, "preference")
    assert len(evals) == 1
    assert "[data] the held-out split has 1 record: its metrics move in steps of 1/1" in capsys.readouterr().out
    assert held_out(1.0, 1, "pair") == ("1.000 on 1 pair (too few to measure, under 20: hold out more with "
                                        "data.eval_fraction or data.eval)")
    assert held_out(0.9125, 200, "pair") == "0.912 on 200 pairs"
    cfg = build_config("rm", {}, ["model.name=tiny", f"data.train={pairs}", "data.eval_fraction=0.9"])
    load_records(cfg, "preference")
    assert capsys.readouterr().out == ""  # 27 held out: nothing to say
