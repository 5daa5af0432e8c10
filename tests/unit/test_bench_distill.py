"""bench/distill.py's pure helpers: its data, its two command lines (every key a real config key) and its table."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest
from conftest import import_bench


@pytest.fixture(scope="module")
def bench():
    return import_bench("distill")


def quick(bench) -> dict:
    return bench.settings(Namespace(quick=True, teacher_steps=None, teacher_lr=1e-4, distill_steps=None, lr=1e-4,
                                    eval_n=None))


def test_data_teacher_demonstrations_all_shout_and_eval_is_held_out(bench, tmp_path):
    s = quick(bench)
    data = bench.write_data(tmp_path, s)
    demos = [json.loads(line) for line in data["teacher_sft"].read_text().splitlines()]
    assert len(demos) == s["teacher_steps"] * s["teacher_batch"]
    for d in demos:  # "shout: zebra" -> "ZEBRA", every one of them
        assert d["messages"][1]["content"] == d["messages"][0]["content"].split(": ")[1].upper()
    train = [json.loads(line) for line in data["prompts"].read_text().splitlines()]
    held = [json.loads(line) for line in data["eval"].read_text().splitlines()]
    assert len(held) == s["eval_n"] and train[0]["prompt"][0]["role"] == "user"
    assert [r["prompt"] for r in held] != [r["prompt"] for r in train[: len(held)]]  # another seed


def test_commands_are_valid_configs(bench, tmp_path):
    from rlhfkit.config import build_config

    s = quick(bench)
    data = bench.write_data(tmp_path, s)
    sft = build_config("sft", {}, bench.teacher_command(Path("m"), data, s, tmp_path / "t")[1:])
    assert sft.train.max_steps == s["teacher_steps"] and sft.optim.lr == s["teacher_lr"]
    cfg = build_config("distill", {}, bench.distill_command(Path("m"), tmp_path / "t", data, s, tmp_path / "d")[1:])
    assert cfg.teacher.model == str(tmp_path / "t") and cfg.algo.advantage == "distill"
    assert cfg.algo.total_episodes == s["distill_steps"] * s["prompts"] and not cfg.reward.functions


def test_table_marks_the_teacher_row_without_distillation_metrics(bench):
    rows = [("before", {"gold": 0.0, "reverse_kl": 1.25, "agreement": 0.5, "example": "Zebra!"}),
            ("teacher", {"gold": 0.9, "example": "ZEBRA"})]
    lines = bench.table(rows, {"eval_n": 4})
    assert lines[2] == '| before | 0.000 | 1.250 | 0.500 | "Zebra!" |'
    assert lines[3] == '| teacher | 0.900 | - | - | "ZEBRA" |'
    assert bench.held_out_distill({"eval/distill/reverse_kl": 0.1, "eval/distill/argmax_agreement": 0.9}) == {
        "reverse_kl": 0.1, "agreement": 0.9}
