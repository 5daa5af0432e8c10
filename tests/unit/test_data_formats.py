"""Record normalisation: every accepted input shape maps to the one canonical shape of its kind."""

import pickle

import pytest

from rlhfkit.data import Record, detect_kind, normalize_record, unpair_preferences
from rlhfkit.errors import DataError

U = {"role": "user", "content": "What is 2+2?"}
A = {"role": "assistant", "content": "4"}
S = {"role": "system", "content": "Be brief."}


# --- sft -------------------------------------------------------------------------------------------------------


def test_sft_prompt_completion_strings():
    out = normalize_record({"prompt": "What is 2+2?", "completion": "4"}, "sft")
    assert out == {"messages": [U, A]}


def test_sft_prompt_completion_messages():
    out = normalize_record({"prompt": [S, U], "completion": [A]}, "sft")
    assert out == {"messages": [S, U, A]}


def test_sft_messages_and_text():
    assert normalize_record({"messages": [S, U, A]}, "sft") == {"messages": [S, U, A]}
    assert normalize_record({"text": "once upon a time"}, "sft") == {"text": "once upon a time"}


def test_sharegpt_conversations():
    row = {"conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "4"}]}
    assert normalize_record(row, "sft") == {"messages": [U, A]}


def test_tool_turns_in_conversations():
    """A tool's result is a turn of its own (multi-turn tool-use demonstrations); ShareGPT's observation too."""
    call = {"role": "assistant", "content": '<tool_call>{"name": "calculator"}</tool_call>'}
    tool = {"role": "tool", "content": "4"}
    assert normalize_record({"messages": [U, call, tool, A]}, "sft") == {"messages": [U, call, tool, A]}
    row = {"conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": call["content"]},
                             {"from": "observation", "value": "4"}, {"from": "gpt", "value": "4"}]}
    assert normalize_record(row, "sft") == {"messages": [U, call, tool, A]}


def test_extra_message_keys_are_dropped_and_text_parts_joined():
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is "},
                                                     {"type": "text", "text": "2+2?"}], "name": "x"}, A]}
    assert normalize_record(row, "sft") == {"messages": [U, A]}


def test_field_mapping():
    row = {"question": "What is 2+2?", "answer": "4", "id": 7}
    out = normalize_record(row, "sft", {"prompt": "question", "completion": "answer"})
    assert out == {"messages": [U, A]}


def test_missing_field_names_field_and_line_and_fix():
    with pytest.raises(DataError) as e:
        normalize_record({"prompt": "hi"}, "sft", where="data.jsonl:7")
    msg = str(e.value)
    assert "data.jsonl:7" in msg and "'completion'" in msg and "data.fields.prompt=question" in msg


def test_mapped_column_missing():
    with pytest.raises(DataError, match=r"data.jsonl:3.*'question'.*data.fields.prompt"):
        normalize_record({"prompt": "x", "completion": "y"}, "sft", {"prompt": "question"}, "data.jsonl:3")


@pytest.mark.parametrize(
    "row, needle",
    [
        ({"messages": [{"role": "robot", "content": "x"}, A]}, "role 'robot'"),
        ({"messages": [{"role": "user", "content": 3}, A]}, "must be a string"),
        ({"messages": [{"role": "user", "content": ""}, A]}, "is empty"),
        ({"messages": [U]}, "no assistant turn"),
        ({"messages": []}, "empty list"),
        ({"prompt": "", "completion": "4"}, "'prompt' is empty"),
        ({"prompt": "q", "completion": [U]}, "'completion[0]' has role 'user'"),
        ({"text": 5}, "'text' must be a non-empty string"),
    ],
)
def test_bad_messages(row, needle):
    with pytest.raises(DataError) as e:
        normalize_record(row, "sft", where="f.jsonl:2")
    assert needle in str(e.value) and "f.jsonl:2" in str(e.value)


def test_non_object_row():
    with pytest.raises(DataError, match="expected a JSON object"):
        normalize_record(["a"], "sft", where="f.jsonl:1")


# --- preference ------------------------------------------------------------------------------------------------


def test_preference_explicit_prompt():
    out = normalize_record({"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"}, "preference")
    assert out == {"prompt": [U], "chosen": [A], "rejected": [{"role": "assistant", "content": "5"}]}


def test_preference_implicit_prompt_common_prefix():
    bad = {"role": "assistant", "content": "5"}
    row = {"chosen": [S, U, A], "rejected": [S, U, bad]}
    out = normalize_record(row, "preference")
    assert out == {"prompt": [S, U], "chosen": [A], "rejected": [bad]}


def test_preference_implicit_prompt_multi_turn():
    u2 = {"role": "user", "content": "and 3+3?"}
    row = {"chosen": [U, A, u2, {"role": "assistant", "content": "6"}],
           "rejected": [U, A, u2, {"role": "assistant", "content": "7"}]}
    out = normalize_record(row, "preference")
    assert out["prompt"] == [U, A, u2]
    assert out["chosen"] == [{"role": "assistant", "content": "6"}]


def test_preference_prompt_plus_full_conversations():
    row = {"prompt": [U], "chosen": [U, A], "rejected": [U, {"role": "assistant", "content": "5"}]}
    assert normalize_record(row, "preference")["chosen"] == [A]


def test_preference_missing_rejected():
    with pytest.raises(DataError, match=r"p.jsonl:4.*'rejected'"):
        normalize_record({"prompt": "q", "chosen": "a"}, "preference", where="p.jsonl:4")


def test_preference_string_without_prompt():
    with pytest.raises(DataError, match="'prompt'"):
        normalize_record({"chosen": "a", "rejected": "b"}, "preference")


def test_preference_mapping():
    row = {"q": "What is 2+2?", "good": "4", "bad": "5"}
    out = normalize_record(row, "preference", {"prompt": "q", "chosen": "good", "rejected": "bad"})
    assert out["prompt"] == [U] and out["chosen"] == [A]


# --- prompt ----------------------------------------------------------------------------------------------------


def test_prompt_keeps_extra_fields():
    out = normalize_record({"question": "What is 2+2?", "answer": "4", "id": 1}, "prompt", {"prompt": "question"})
    assert out == {"prompt": [U], "answer": "4", "id": 1}


def test_prompt_messages_drop_final_assistant():
    out = normalize_record({"messages": [S, U, A], "answer": "4"}, "prompt")
    assert out == {"prompt": [S, U], "answer": "4"}


def test_prompt_must_end_with_user():
    with pytest.raises(DataError, match="must end with a user turn"):
        normalize_record({"prompt": [S]}, "prompt")


# --- unpaired --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("label, expected", [(True, True), (0, False), (1, True), ("true", True),
                                             ("False", False), ("1", True)])
def test_unpaired_labels(label, expected):
    out = normalize_record({"prompt": "What is 2+2?", "completion": "4", "label": label}, "unpaired")
    assert out == {"prompt": [U], "completion": [A], "label": expected}


def test_unpaired_bad_label():
    with pytest.raises(DataError, match=r"k.jsonl:9.*'label' must be true/false"):
        normalize_record({"prompt": "q", "completion": "a", "label": "maybe"}, "unpaired", where="k.jsonl:9")


def test_unpaired_full_conversation():
    out = normalize_record({"completion": [U, A], "label": False}, "unpaired")
    assert out == {"prompt": [U], "completion": [A], "label": False}


def test_unpair_preferences():
    pref = normalize_record({"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"}, "preference", where="x:1")
    out = unpair_preferences([pref])
    assert [r["label"] for r in out] == [True, False] and out[0]["completion"] == [A] and out[1].where == "x:1"


# --- auto / Record ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row, kind",
    [
        ({"prompt": "q", "completion": "a"}, "sft"),
        ({"messages": [U, A]}, "sft"),
        ({"text": "t"}, "sft"),
        ({"prompt": "q", "chosen": "a", "rejected": "b"}, "preference"),
        ({"prompt": "q", "answer": "4"}, "prompt"),
        ({"messages": [U]}, "prompt"),
        ({"prompt": "q", "completion": "a", "label": True}, "unpaired"),
    ],
)
def test_detect_kind(row, kind):
    assert detect_kind(row) == kind
    assert normalize_record(row, "auto") == normalize_record(row, kind)


def test_detect_kind_unknown():
    with pytest.raises(DataError, match="cannot tell the record kind"):
        detect_kind({"foo": 1})


def test_record_carries_where_and_pickles():
    r = normalize_record({"text": "x"}, "sft", where="a.jsonl:3")
    assert isinstance(r, Record) and r.where == "a.jsonl:3"
    r2 = pickle.loads(pickle.dumps(r))
    assert r2 == r and r2.where == "a.jsonl:3"


# ───────────────────────────── issue 13: SFT conversations end with the assistant; tied pairs ─────────────────────
@pytest.mark.parametrize("last", [{"role": "user", "content": "and now?"}, {"role": "system", "content": "be nice"}])
def test_sft_messages_must_end_with_the_assistant(last):
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, last]}
    with pytest.raises(DataError) as info:
        normalize_record(row, "sft", where="train.jsonl:7")
    text = str(info.value)
    assert text.startswith("train.jsonl:7: ") and f"ends with a {last['role']!r} turn" in text and "fix:" in text
    # ending with the assistant stays fine
    assert normalize_record({"messages": row["messages"][:2]}, "sft")["messages"][-1]["role"] == "assistant"


def test_drop_tied_pairs_keeps_the_others_and_errors_when_all_tie():
    from rlhfkit.data import drop_tied_pairs

    pair = lambda c, r, n: normalize_record({"prompt": "q", "chosen": c, "rejected": r}, "preference",  # noqa: E731
                                            where=f"p.jsonl:{n}")
    recs = [pair("a", "b", 1), pair("same", "same", 2), pair("x", "y", 3)]
    kept, dropped = drop_tied_pairs(recs)
    assert kept == [recs[0], recs[2]] and dropped == [recs[1]]
    assert drop_tied_pairs(recs[:1]) == (recs[:1], [])
    with pytest.raises(DataError) as info:
        drop_tied_pairs([recs[1], pair("z", "z", 4)], "p.jsonl")
    assert "p.jsonl: all 2 preference pairs have chosen equal to rejected (first at p.jsonl:2)" in str(info.value)
    # other kinds pass through
    prompts = [normalize_record({"prompt": "q"}, "prompt")]
    assert drop_tied_pairs(prompts) == (prompts, [])
