"""reasoning-gym as data (``reasoning_gym:NAME?...`` in data/sources.py) and its verifier (rewards/reasoning_gym.py):
rows generated offline and seeded, their answers scored by the task's own checker, hand-written cases."""

from __future__ import annotations

import pytest

from rlhfkit.data import load_dataset_records, load_rows
from rlhfkit.errors import DataError
from rlhfkit.rewards import CombinedRewards
from rlhfkit.rewards.reasoning_gym import extract_answer, reasoning_gym_score

pytest.importorskip("reasoning_gym", reason="reasoning-gym is in the dev extra (pip install -e '.[dev]')")


def test_rows_are_seeded_and_carry_what_the_verifier_reads():
    rows = load_rows("reasoning_gym:basic_arithmetic?size=5&seed=3")
    again = load_rows("reasoning_gym:basic_arithmetic?size=5&seed=3")
    other = load_rows("reasoning_gym:basic_arithmetic?size=5&seed=4")
    assert [r for _, r in rows] == [r for _, r in again] and [r for _, r in rows] != [r for _, r in other]
    where, row = rows[2]
    assert where == "reasoning_gym:basic_arithmetic[2]"
    assert row["prompt"][0]["role"] == "system" and "<answer>" in row["prompt"][0]["content"]
    assert row["prompt"][1] == {"role": "user", "content": row["question"]}
    assert row["metadata"]["source_dataset"] == "basic_arithmetic"
    plain = load_rows("reasoning_gym:basic_arithmetic?size=2&system=none")[0][1]
    assert plain["prompt"] == plain["question"]  # the bare question as text: standard (not conversational) data
    recs = load_dataset_records("reasoning_gym:basic_arithmetic?size=4", "prompt", split="train[:2]")
    assert len(recs) == 2 and recs[0].conversational


def test_task_settings_pass_through_and_mistakes_are_one_line():
    rows = load_rows("reasoning_gym:basic_arithmetic?size=3&min_terms=2&max_terms=2")
    assert all(r["metadata"]["num_terms"] == 2 for _, r in rows)
    with pytest.raises(DataError, match="no task 'basic_arithmetc'.*did you mean 'basic_arithmetic'"):
        load_rows("reasoning_gym:basic_arithmetc?size=3")
    with pytest.raises(DataError, match="no system prompt 'chatty'"):
        load_rows("reasoning_gym:basic_arithmetic?size=3&system=chatty")
    with pytest.raises(DataError, match="refused its settings"):
        load_rows("reasoning_gym:basic_arithmetic?size=3&no_such_setting=1")


def test_extract_answer():
    assert extract_answer("think... <answer> 42 </answer>") == "42"
    assert extract_answer("<answer>1</answer> then <answer>2</answer>") == "2"  # the last one
    assert extract_answer("no tags 42") is None and extract_answer("<answer>open") is None


def test_verifier_scores_with_the_tasks_own_checker():
    _, row = load_rows("reasoning_gym:basic_arithmetic?size=1&seed=7")[0]
    right, wrong = f"<answer>{row['answer']}</answer>", "<answer>123456789</answer>"
    out = reasoning_gym_score([row["question"]] * 4, [right, wrong, row["answer"], "x"], answer=[row["answer"]] * 4,
                              metadata=[row["metadata"]] * 4, question=[row["question"]] * 4)
    assert out == [1.0, 0.0, 0.0, 0.0]  # right; wrong; no tags (the format asked for): 0; nothing: 0
    # a row that did not come from reasoning-gym: no opinion
    assert reasoning_gym_score(["q"], ["<answer>1</answer>"], answer=["1"], metadata=[None]) == [None]
    # partial credit is the task's own: gsm_symbolic gives 0.01 for a wrong number
    _, g = load_rows("reasoning_gym:gsm_symbolic?size=1&seed=1")[0]
    assert reasoning_gym_score([g["question"]], ["<answer>-1</answer>"], answer=[g["answer"]],
                               metadata=[g["metadata"]])[0] == pytest.approx(0.01)


def test_verifier_by_its_builtin_name_in_a_worker():
    _, row = load_rows("reasoning_gym:basic_arithmetic?size=1&seed=2")[0]
    fields = {k: row[k] for k in ("answer", "metadata", "question")}
    with CombinedRewards(["reasoning_gym"], workers=1, timeout_s=60) as combo:
        out = combo([row["question"]] * 2, [f"<answer>{row['answer']}</answer>", "<answer>x</answer>"], [fields] * 2)
    assert out.total.tolist() == [1.0, 0.0]


def test_a_size_that_would_take_hours_is_refused_at_once_and_a_long_one_is_said(monkeypatch, capsys):
    import time

    from rlhfkit.data import sources
    from rlhfkit.errors import DataError

    t0 = time.perf_counter()
    with pytest.raises(DataError, match=r"size=100000000 would take about .* to generate here") as info:
        load_rows("reasoning_gym:basic_arithmetic?size=100000000")
    assert time.perf_counter() - t0 < 30 and "lower size=" in info.value.fix and "\n" not in str(info.value)
    monkeypatch.setattr(sources, "RG_SAY_S", 0.0)  # any generation counts as long: it is said, then done
    assert len(load_rows("reasoning_gym:basic_arithmetic?size=300")) == 300
    assert "generating 300 items, about" in capsys.readouterr().out
