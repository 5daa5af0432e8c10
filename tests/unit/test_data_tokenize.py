"""Tokenisation with label masks and the length policy (truncate-left / drop / error, always counted)."""

import pytest

from rlhfkit.data import (
    IGNORE_INDEX,
    LengthPolicy,
    Record,
    normalize_record,
    tokenize_dataset,
    tokenize_preference,
    tokenize_prompt_record,
    tokenize_sft,
    tokenize_unpaired,
)
from rlhfkit.errors import DataError
from rlhfkit.models.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def labelled(tok, ex):
    return tok.decode([t for t in ex["labels"] if t != IGNORE_INDEX])


def sft(prompt, completion, where="d.jsonl:1"):
    return normalize_record({"prompt": prompt, "completion": completion}, "sft", where=where)


def test_sft_single_turn_labels(tok):
    ex = tokenize_sft(sft("question1", "answer1"), tok, 256)
    assert labelled(tok, ex) == "answer1<|im_end|>"
    assert len(ex["labels"]) == len(ex["input_ids"])
    assert all(lab in (IGNORE_INDEX, t) for lab, t in zip(ex["labels"], ex["input_ids"]))


def test_sft_multi_turn_labels(tok):
    rec = normalize_record({"messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "question1"}, {"role": "assistant", "content": "answer1"},
        {"role": "user", "content": "question2"}, {"role": "assistant", "content": "answer2"},
    ]}, "sft")
    ex = tokenize_sft(rec, tok, 256)
    assert labelled(tok, ex) == "answer1<|im_end|>answer2<|im_end|>"


def test_sft_completion_only_false_trains_everything(tok):
    ex = tokenize_sft(sft("question1", "answer1"), tok, 256, completion_only=False)
    assert ex["labels"] == ex["input_ids"]


def test_sft_text_record_trains_all_and_appends_eos(tok):
    ex = tokenize_sft(normalize_record({"text": "hello"}, "sft"), tok, 256)
    assert tok.decode(ex["input_ids"]) == "hello<|im_end|>"
    assert ex["labels"] == ex["input_ids"]


def test_sft_truncates_completion_from_right(tok):
    ex = tokenize_sft(sft("q", "a" * 100), tok, 40)
    assert len(ex["input_ids"]) == 40 and labelled(tok, ex).startswith("aaaa")


def test_prompt_truncated_from_left(tok):
    policy = LengthPolicy(max_length=64, max_prompt_length=20)
    rec = normalize_record({"prompt": "x" * 50 + "THE QUESTION", "chosen": "yes", "rejected": "no"}, "preference")
    ex = tokenize_preference(rec, tok, policy)
    assert len(ex["prompt_ids"]) == 20
    # the end, where the question is
    assert tok.decode(ex["prompt_ids"]) == "UESTION<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(ex["chosen_ids"]) == "yes<|im_end|>" and tok.decode(ex["rejected_ids"]) == "no<|im_end|>"


def test_preference_completions_fit_max_length(tok):
    rec = normalize_record({"prompt": "q", "chosen": "c" * 100, "rejected": "r"}, "preference")
    ex = tokenize_preference(rec, tok, LengthPolicy(max_length=50, max_prompt_length=30))
    assert len(ex["prompt_ids"]) + len(ex["chosen_ids"]) == 50
    assert tok.decode(ex["rejected_ids"]) == "r<|im_end|>"


def test_overflow_stats_truncate_drop_error(tok):
    records = [
        normalize_record({"prompt": "short?", "answer": "1"}, "prompt", where="p.jsonl:1"),
        normalize_record({"prompt": "long " * 20 + "question?", "answer": "2"}, "prompt", where="p.jsonl:2"),
    ]
    examples, stats = tokenize_dataset(records, "prompt", tok, LengthPolicy(64, 40, "truncate"))
    assert stats == {"kept": 2, "truncated": 1, "dropped": 0}
    assert len(examples[1]["prompt_ids"]) == 40 and examples[1]["answer"] == "2"
    assert examples[0]["prompt"] == [{"role": "user", "content": "short?"}]

    examples, stats = tokenize_dataset(records, "prompt", tok, LengthPolicy(64, 40, "drop"))
    assert stats == {"kept": 1, "truncated": 0, "dropped": 1} and examples[0]["answer"] == "1"

    with pytest.raises(DataError) as e:
        tokenize_dataset(records, "prompt", tok, LengthPolicy(64, 40, "error"))
    assert "p.jsonl:2" in str(e.value) and "data.max_prompt_length" in str(e.value)
    assert "data.overflow=drop" in str(e.value)


def test_all_dropped_is_an_error(tok):
    records = [sft("q" * 50, "a", where=f"d.jsonl:{i}") for i in range(3)]
    with pytest.raises(DataError, match="all 3 records were dropped"):
        tokenize_dataset(records, "sft", tok, LengthPolicy(32, 16, "drop"))


def test_sft_prompt_overflow_truncate_keeps_completion(tok):
    records = [sft("q" * 50 + "?", "answer")]
    examples, stats = tokenize_dataset(records, "sft", tok, LengthPolicy(64, 16, "truncate"))
    assert stats["truncated"] == 1 and labelled(tok, examples[0]) == "answer<|im_end|>"
    assert len(examples[0]["input_ids"]) <= 64


def test_unpaired(tok):
    rec = normalize_record({"prompt": "q", "completion": "a", "label": "false"}, "unpaired")
    ex = tokenize_unpaired(rec, tok, 64)
    assert ex["label"] is False and tok.decode(ex["completion_ids"]) == "a<|im_end|>"
    examples, stats = tokenize_dataset([rec, rec], "unpaired", tok, LengthPolicy(64))
    assert stats == {"kept": 2, "truncated": 0, "dropped": 0}


def test_prompt_record_ends_with_generation_prompt(tok):
    rec = normalize_record({"prompt": "What?", "answer": "x"}, "prompt")
    ex = tokenize_prompt_record(rec, tok, 64)
    assert tok.decode(ex["prompt_ids"]) == "<|im_start|>user\nWhat?<|im_end|>\n<|im_start|>assistant\n"
    assert ex["answer"] == "x"


def test_where_defaults_for_plain_dicts(tok):
    rec = dict(sft("q" * 50, "a"))
    assert not isinstance(rec, Record)
    with pytest.raises(DataError, match="record 0"):
        tokenize_dataset([rec], "sft", tok, LengthPolicy(32, 16, "error"))


def test_bad_policy():
    with pytest.raises(DataError, match="data.overflow"):
        LengthPolicy(64, 32, "explode")
    with pytest.raises(DataError, match="data.max_prompt_length"):
        LengthPolicy(64, 128)


def test_most_records_cut_by_max_length_is_a_warning_naming_the_knob(tok):
    from types import SimpleNamespace

    from rlhfkit.train.shared.batches import tokenize

    said: list[str] = []
    run = SimpleNamespace(print=said.append, sink=None)
    cfg = SimpleNamespace(data=SimpleNamespace(max_length=32, max_prompt_length=None, overflow="truncate"))
    pairs = [normalize_record({"prompt": "please shout this word for me: " * 20 + w, "chosen": w.upper(),
                               "rejected": w}, "preference", where=f"d.jsonl:{i}") for i, w in enumerate("abcd")]
    assert len(tokenize(run, pairs, "preference", tok, cfg, "train")) == 4
    assert any(line.startswith("[data] warning: 4 of the 4 train records do not fit data.max_length=32")
               for line in said), said
    said.clear()
    short = [normalize_record({"prompt": "shout: a", "chosen": "A", "rejected": "a"}, "preference", where="d:1")] * 4
    cfg.data.max_length = 128
    tokenize(run, short, "preference", tok, cfg, "train")
    assert said and not any("warning" in line for line in said), said
