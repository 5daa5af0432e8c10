"""Loading rows from files / directories, with locations for error messages, and split slicing."""

import csv
import json

import pytest

from rlhfkit.data import apply_split, load_dataset_records, load_rows, parse_split
from rlhfkit.errors import DataError

ROWS = [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(5)]


def write_jsonl(path, rows, extra_lines=()):
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_rows_and_locations(tmp_path):
    p = tmp_path / "file.jsonl"
    p.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n", encoding="utf-8")
    rows = load_rows(str(p))
    assert [r for _, r in rows] == ROWS[:2]
    assert rows[0][0].endswith("file.jsonl:1") and rows[1][0].endswith("file.jsonl:3")  # blank line counted


def test_malformed_jsonl_line(tmp_path):
    p = write_jsonl(tmp_path / "file.jsonl", ROWS[:2], ['{"prompt": "x" "completion": "y"}'])
    with pytest.raises(DataError) as e:
        load_rows(str(p))
    msg = str(e.value)
    assert "file.jsonl:3" in msg and "invalid JSON" in msg and "fix:" in msg


def test_jsonl_non_object_line(tmp_path):
    p = write_jsonl(tmp_path / "file.jsonl", ROWS[:1], ['["a", "b"]'])
    with pytest.raises(DataError, match=r"file.jsonl:2.*expected a JSON object"):
        load_rows(str(p))


def test_missing_field_names_line(tmp_path):
    p = write_jsonl(tmp_path / "file.jsonl", [ROWS[0], ROWS[1], {"prompt": "only"}])
    with pytest.raises(DataError) as e:
        load_dataset_records(str(p), "sft")
    assert "file.jsonl:3" in str(e.value) and "'completion'" in str(e.value)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataError, match="no records in"):
        load_rows(str(p))


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_rows(str(tmp_path / "nope.jsonl"))


def test_json_list_and_data_key(tmp_path):
    p = tmp_path / "file.json"
    p.write_text(json.dumps(ROWS), encoding="utf-8")
    rows = load_rows(str(p))
    assert len(rows) == 5 and rows[3][0].endswith("file.json[3]")
    q = tmp_path / "wrapped.json"
    q.write_text(json.dumps({"version": 1, "data": ROWS[:2]}), encoding="utf-8")
    assert [r for _, r in load_rows(str(q))] == ROWS[:2]
    w = tmp_path / "other.json"
    w.write_text(json.dumps({"examples": ROWS[:3]}), encoding="utf-8")
    assert len(load_rows(str(w))) == 3


def test_csv(tmp_path):
    p = tmp_path / "file.csv"
    with open(p, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["question", "answer"])
        writer.writeheader()
        for r in ROWS:
            writer.writerow({"question": r["prompt"], "answer": r["completion"]})
    rows = load_rows(str(p))
    assert rows[0][1] == {"question": "q0", "answer": "a0"}
    assert rows[2][0].endswith("file.csv:row 4")  # header is row 1
    recs = load_dataset_records(str(p), "sft", {"prompt": "question", "completion": "answer"})
    assert recs[1]["messages"][1] == {"role": "assistant", "content": "a1"}


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed")
    import pyarrow.parquet as pq

    p = tmp_path / "file.parquet"
    msgs = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}] for i in range(3)]
    pq.write_table(pa.Table.from_pylist([{"messages": m} for m in msgs]), p)
    recs = load_dataset_records(str(p), "sft")
    assert [r["messages"] for r in recs] == msgs
    assert recs[2].where.endswith("file.parquet[2]")


def test_directory_picks_split_file(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", ROWS[:1])
    assert len(load_rows(str(tmp_path), split="train")) == 5
    assert len(load_rows(str(tmp_path), split="test")) == 1
    assert len(load_rows(str(tmp_path))) == 6


def test_split_slicing_on_local_files(tmp_path):
    p = write_jsonl(tmp_path / "file.jsonl", ROWS)
    assert [r["prompt"] for _, r in load_rows(str(p), split="train[:2]")] == ["q0", "q1"]
    assert [r["prompt"] for _, r in load_rows(str(p), split="train[3:]")] == ["q3", "q4"]
    assert [r["prompt"] for _, r in load_rows(str(p), split="train[1:3]")] == ["q1", "q2"]
    assert [r["prompt"] for _, r in load_rows(str(p), split="train[:40%]")] == ["q0", "q1"]
    assert len(load_dataset_records(str(p), "sft", split="train[:4]", limit=3)) == 3
    with pytest.raises(DataError, match="no records"):
        load_rows(str(p), split="train[10:]")


def test_parse_split():
    assert parse_split("train[:500]") == ("train", None, "500", True)
    assert parse_split("test") == ("test", None, None, False)
    assert apply_split(list(range(10)), "train[-3:]") == [7, 8, 9]
    assert apply_split(list(range(10)), "train[10%:30%]") == [1, 2]
    assert apply_split(list(range(10)), "train[4]") == [4]
    with pytest.raises(DataError, match="data.split"):
        parse_split("train[a:b]")


def test_auto_kind_from_first_row(tmp_path):
    p = write_jsonl(tmp_path / "pref.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}])
    assert load_dataset_records(str(p), "auto")[0]["chosen"] == [{"role": "assistant", "content": "a"}]


def test_unknown_dataset_name_offline(monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(DataError) as e:
        load_rows("surely_not_a_cached_dataset_xyz", split="train[:5]")
    msg = str(e.value)
    assert "cannot load dataset 'surely_not_a_cached_dataset_xyz' from the local cache (rlhfkit runs offline)" in msg
    assert "HF_HUB_OFFLINE=0" in msg and "local" in msg  # the same hint the model error gives


def test_save_to_disk_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    rows = load_rows(str(tmp_path / "saved"), split="train[:2]")
    assert [r for _, r in rows] == ROWS[:2]


def test_tied_preference_pairs_dropped_with_a_count(tmp_path, capsys):
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b"}, {"prompt": "q", "chosen": "s", "rejected": "s"},
            {"prompt": "q", "chosen": [{"role": "assistant", "content": "t"}], "rejected": "t"}]
    p = write_jsonl(tmp_path / "pairs.jsonl", rows)
    recs = load_dataset_records(str(p), "preference")
    assert [r.where for r in recs] == [f"{p}:1"]
    out = capsys.readouterr().out
    assert f"dropped 2 of 3 preference pairs whose chosen equals rejected ({p}:2, {p}:3)" in out
    q = write_jsonl(tmp_path / "tied.jsonl", rows[1:])
    with pytest.raises(DataError, match="all 2 preference pairs have chosen equal to rejected"):
        load_dataset_records(str(q), "auto")
