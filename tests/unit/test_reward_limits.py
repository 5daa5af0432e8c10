"""Verifiers that no answer can stall or crash: every built-in verifier on pathological answers and references (a
power tower, a megabyte of unclosed boxes, a megabyte answer, 5,000-digit and 1e999999999 numbers, patterns that
backtrack) answers within its own limits, and in a run one bad sample costs that sample, counted, never the batch."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rlhfkit.errors import RewardError
from rlhfkit.rewards import CombinedRewards
from rlhfkit.rewards.lint import lint_rewards
from rlhfkit.rewards.maths import math_answer, math_format
from rlhfkit.rewards.rules import format_match, regex_match

FNS = Path(__file__).resolve().parent / "reward_fns_for_tests.py"
MB = 1_000_000

PATHOLOGICAL = {
    "tower": "\\boxed{10**10**10}",
    "tower_latex": "\\boxed{10^{10^{10}}}",
    "factorial": "\\boxed{100000000!}",
    "unclosed_boxes": "\\boxed{" * (MB // 7),
    "megabyte_answer": "\\boxed{" + "1" * MB + "}",
    "answer_is_repeated": "the answer is " * (MB // 14),
    "dollars": "#### " + "$" * MB,
    "spaces_then_unit": "#### 7" + " " * MB + "km",
    "huge_exponent": "#### 1e999999999",
    "digits": "1 " * (MB // 2),
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_maths_verifier_answers_any_completion_within_its_limit(name):
    t0 = time.perf_counter()
    got = math_answer([""], [PATHOLOGICAL[name]], answer=["7"], timeout_s=1.0)
    form = math_format([""], [PATHOLOGICAL[name]])
    assert time.perf_counter() - t0 < 15  # the symbolic limit (1 s), a fork, linear scans of a megabyte
    assert got in ([0.0], [None]) and form in ([0.0], [1.0])


def test_maths_references_of_any_size():
    big = "1" * 5000  # over Python's 4,300-digit limit on int(str)
    assert math_answer([""] * 3, [f"\\boxed{{{big}}}", f"#### {big[:-1]}2", "#### 7"], answer=[big] * 3) == \
        [1.0, 0.0, 0.0]  # whole numbers are equal only exactly, whatever their length
    assert math_answer([""] * 2, ["#### 1e999999999", "#### 10e999999998"], answer=["1e999999999"] * 2) == [1.0, 1.0]
    assert math_answer([""], ["#### 1000001"], answer=["1000000"]) == [0.0]  # not within rel_tol: whole numbers
    t0 = time.perf_counter()
    assert math_answer([""], ["7"], answer=["\\boxed{" * (MB // 7)]) == [0.0]
    assert time.perf_counter() - t0 < 10


def test_rule_patterns_are_bounded_per_sample():
    t0 = time.perf_counter()
    assert format_match([""] * 2, ["<think>" + "</think><answer>" * 60_000, "<think>a</think><answer>b</answer>"],
                        timeout_s=0.5) == [None, 1.0]
    assert regex_match([""], ["a" * 30 + "!"], pattern=r"(a|aa)+b", answer=["x"], timeout_s=0.5) in ([None], [0.0])
    assert time.perf_counter() - t0 < 15
    # the answer stated last counts: the first of two answers is not paid
    assert regex_match([""] * 2, ["#### 4\n#### 5", "#### 5\n#### 4"], answer=["5", "5"]) == [1.0, 0.0]


def test_one_pathological_sample_of_a_grpo_batch_costs_that_sample():
    completions = ["The answer is \\boxed{7}.", "#### 8", PATHOLOGICAL["tower_latex"], "#### 7",
                   PATHOLOGICAL["unclosed_boxes"], "7", PATHOLOGICAL["megabyte_answer"], "\\boxed{7}"]
    spec = {"fn": "math_answer", "kwargs": {"timeout_s": 1.0}}
    with CombinedRewards([spec], workers=2, timeout_s=60) as combo:
        out = combo(["q"] * 8, completions, [{"answer": "7"}] * 8, step=1)
    assert out.total.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert out.valid.tolist() == [True, True, False, True, True, True, True, True]  # the tower: no verdict in time
    assert out.metrics["rewards/dropped"] == 1.0 and out.metrics["rewards/math_answer/timeouts"] == 0.0


def test_a_user_function_hanging_on_one_sample_costs_its_chunk_within_the_limit():
    # the limit bounds the function's whole call on the batch: the hanging chunk's samples are dropped at 1 s, the
    # other chunk is scored, and nothing is retried past the limit
    with CombinedRewards(["reward_fns_for_tests:slow_on_hang"], workers=2, timeout_s=1.0) as combo:
        t0 = time.perf_counter()
        out = combo(["p"] * 8, ["a", "b", "hang", "c", "d", "e", "f", "g"], [{}] * 8, step=4)
        took = time.perf_counter() - t0
    assert out.valid.tolist() == [False, False, False, False, True, True, True, True] and took < 1.0 + 10
    assert out.metrics["rewards/slow_on_hang/timeouts"] == 4.0


def test_a_wrong_count_for_some_batches_drops_those_calls_not_the_run(capsys):
    long = "x" * 200
    with CombinedRewards([f"{FNS}:short_for_long", "exact_match"], workers=2, timeout_s=30) as combo:
        out = combo(["p"] * 4, ["a", "b", "c", long], [{"answer": "a"}] * 4, step=5)
        # chunks [a, b] and [c, long]: the second returned one value too few -> its two samples lose that function
        assert out.per_function["short_for_long"][:2].tolist() == [1.0, 1.0]
        assert out.metrics["rewards/short_for_long/errors"] == 2.0 and out.valid.all()  # exact_match scored them
        assert "short_for_long failed on 2 of 4 samples at step 5 (function" in capsys.readouterr().out
        with pytest.raises(RewardError, match="returned 1 values for 2 completions at step 6"):
            combo(["p"] * 4, [long] * 4, [{"answer": "a"}] * 4, step=6)  # every call wrong: a bug, one line


def test_lint_on_pathological_references_answers_in_bounded_time():
    rows = [{"answer": "1" * 5000}, {"answer": "\\boxed{" * (MB // 7)}, {"answer": "#### " + "9" * 5000}]
    t0 = time.perf_counter()
    with CombinedRewards(["math_answer", "exact_match", "regex_match"], workers=2, timeout_s=60) as combo:
        report = lint_rewards(combo, ["q1", "q2", "q3"], rows)
    assert time.perf_counter() - t0 < 120 and report.scored
