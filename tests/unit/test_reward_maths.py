"""The maths verifier against a hand-written table of (completion, reference, expected) triples — equal and not equal,
with the tricky forms — plus extraction order, the format reward, options and the time limit of the symbolic check."""

from __future__ import annotations

import time

import pytest

from rlhfkit.errors import RewardError
from rlhfkit.rewards.maths import answers_equal, extract_answer, math_answer, math_format, reference_answer

# (completion, reference, expected score). Each line is one hand-checked case; the comment says why.
TABLE = [
    # integers and their surface forms
    ("The answer is 42.", "42", 1.0),
    ("#### 42", "42", 1.0),
    ("\\boxed{42}", "42", 1.0),
    ("so we get 41 + 1 = 42", "42", 1.0),  # last number
    ("#### 1,234", "1234", 1.0),  # thousands separator
    ("\\boxed{1,234,567}", "1234567", 1.0),
    ("#### +7", "7", 1.0),
    ("#### -7", "7", 0.0),  # the sign matters
    ("#### 007", "7", 1.0),
    ("#### 43", "42", 0.0),
    ("\\boxed{4 2}", "42", 0.0),  # not the number 42
    ("#### 42", "Paris is 42 km away. #### 42", 1.0),  # GSM8K solution as reference
    # decimals and scientific notation
    ("\\boxed{12.50}", "12.5", 1.0),
    ("#### 0.5", ".5", 1.0),
    ("#### 1e3", "1000", 1.0),
    ("#### 2.5E-1", "0.25", 1.0),
    ("#### 3.14", "3.14159", 0.0),  # outside rel_tol
    ("#### 0.3333333", "1/3", 1.0),  # within 1e-6
    ("#### 0.333", "1/3", 0.0),  # not within 1e-6
    ("#### 10.0", "10", 1.0),
    # fractions
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),
    ("\\boxed{\\tfrac{6}{8}}", "0.75", 1.0),
    ("#### 2/4", "1/2", 1.0),
    ("\\boxed{\\frac12}", "0.5", 1.0),  # \frac12 shorthand
    ("\\boxed{-\\frac{1}{3}}", "-1/3", 1.0),
    ("\\boxed{\\frac{1}{3}}", "-1/3", 0.0),
    ("\\boxed{\\frac{2}{3}}", "3/2", 0.0),
    ("#### 7/1", "7", 1.0),
    # percentages (a reference writes them either way)
    ("The answer is 50%.", "50", 1.0),
    ("The answer is 50%.", "0.5", 1.0),
    ("\\boxed{50\\%}", "\\frac{1}{2}", 1.0),
    ("#### 25%", "50%", 0.0),
    ("#### 0.25", "25%", 1.0),
    ("#### 5%", "50", 0.0),
    # delimiters, text, units, degrees, equations
    ("The answer is $\\frac{5}{2}$.", "2.5", 1.0),
    ("The answer is \\(7\\)", "7", 1.0),
    ("\\boxed{\\text{18}}", "18", 1.0),
    ("\\boxed{18 \\text{ dollars}}", "18", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{x = 3}", "3", 1.0),
    ("#### $18", "18", 1.0),
    ("The answer is: 12 apples", "12", 1.0),
    # symbolic equality (math-verify / SymPy)
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("\\boxed{\\sqrt{8}}", "3", 0.0),
    ("\\boxed{x+1}", "1+x", 1.0),
    ("\\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
    ("\\boxed{x^2+1}", "x^2+2x+1", 0.0),
    ("\\boxed{\\frac{\\pi}{2}}", "\\pi/2", 1.0),
    ("\\boxed{\\pi}", "3.14", 0.0),
    ("\\boxed{2^{10}}", "1024", 1.0),
    ("\\boxed{3 \\cdot 4}", "12", 1.0),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{1}{\\sqrt{2}}", 1.0),
    ("\\boxed{(1, 2)}", "(1,2)", 1.0),
    ("\\boxed{(2, 1)}", "(1,2)", 0.0),
    ("\\boxed{\\{1, 2\\}}", "\\{2, 1\\}", 1.0),
    ("\\boxed{[0, 1]}", "[0,1]", 1.0),
    # extraction: which answer counts
    ("\\boxed{3} wait, actually \\boxed{5}", "5", 1.0),  # the last box
    ("\\boxed{3} wait, actually \\boxed{5}", "3", 0.0),
    ("The answer is 7. Check: 7 * 2 = 14", "7", 1.0),  # "answer is" before "last number"
    ("#### 12\nThe answer is 13", "13", 1.0),  # the answer stated last wins, whatever its form
    ("#### 12\nThe answer is 13", "12", 0.0),
    ("\\boxed{\\frac{1}{\\sqrt{4}}}", "1/2", 1.0),  # nested braces
    ("no number here", "3", 0.0),
    ("", "3", 0.0),
    ("   \n\t", "3", 0.0),
    ("\\boxed{}", "3", 0.0),
    ("\\boxed{3", "3", 1.0),  # unclosed box: falls through to the last number
    ("I think 2 or 3", "3", 1.0),  # last number (the lint shows why a format is better)
    ("The answer is three", "3", 0.0),  # words are not accepted
    ("#### 3", None, None),  # no reference: no opinion
    # more not-equal cases that a loose comparison gets wrong
    ("#### 1,234", "1.234", 0.0),  # a thousands separator is not a decimal point
    ("#### 12.5", "125", 0.0),
    ("\\boxed{\\frac{1}{2}}", "2", 0.0),
    ("\\boxed{x-1}", "1-x", 0.0),
    ("\\boxed{\\sqrt{2}}", "2", 0.0),
    ("\\boxed{2x}", "x^2", 0.0),
    ("#### 100", "1e3", 0.0),
    ("The answer is 8. Then the answer is 9.", "8", 0.0),  # the last statement counts
    ("#### 3/0", "3", 0.0),  # division by zero is no number
]


@pytest.mark.parametrize("completion, reference, expected", TABLE)
def test_table(completion, reference, expected):
    assert math_answer([""], [completion], answer=[reference]) == [expected]


def test_table_is_large_and_balanced():
    assert len(TABLE) >= 60
    assert sum(e == 1.0 for _, _, e in TABLE) >= 25 and sum(e == 0.0 for _, _, e in TABLE) >= 20


def test_extraction_order_is_configurable():
    text = "The answer is 7. #### 8 \\boxed{9} and finally 10"
    assert extract_answer(text) == "9"
    assert extract_answer(text, ("hashes",)) == "8 \\boxed{9} and finally 10"
    assert extract_answer(text, ("answer_is",)) == "7"
    assert extract_answer(text, ("last_number",)) == "10"
    assert math_answer([""], [text], answer=["10"], extract=["last_number"]) == [1.0]
    assert math_answer([""], [text], answer=["10"], extract=["boxed"]) == [0.0]
    assert math_answer([""], ["only 10 here"], answer=["10"], extract=["boxed", "hashes"]) == [0.0]
    assert reference_answer("work... #### 1,000") == "1,000"
    with pytest.raises(RewardError, match="extract"):
        math_answer([""], ["1"], answer=["1"], extract=["boxd"])
    with pytest.raises(RewardError, match="needs the dataset field 'answer'"):
        math_answer([""], ["1"], gold=["1"])
    assert math_answer([""], ["\\boxed{1}"], gold=["1"], field="gold") == [1.0]


def test_format_reward_is_separate():
    completions = ["so \\boxed{7}", "\\boxed{7} \\boxed{8}", "\\boxed{}", "7", "#### 7", "\\boxed{wrong}"]
    assert math_format([""] * 6, completions) == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert math_format([""] * 6, completions, form="hashes") == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    with pytest.raises(RewardError, match="form"):
        math_format([""], ["7"], form="last_number")


def test_symbolic_check_is_bounded_in_time():
    # a huge power tower: SymPy would evaluate it for a very long time
    hard = "\\boxed{" + "9^{" * 6 + "9" + "}" * 6 + "}"
    t0 = time.perf_counter()
    got = math_answer([""], [hard], answer=["x+1"], timeout_s=0.5)
    assert time.perf_counter() - t0 < 10
    assert got in ([None], [0.0])
    assert answers_equal("x", "x", timeout_s=0.5) is True
    # a check that hangs (SymPy on a 10-billion-digit power, in C code no signal stops) is cut at the limit and
    # scores None (no opinion)
    t0 = time.perf_counter()
    assert math_answer([""], ["\\boxed{10^{10^{10}}}"], answer=["x+1"], timeout_s=0.3) == [None]
    assert time.perf_counter() - t0 < 5
