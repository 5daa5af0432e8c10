"""The reward lint: adversarial completions built from the run's prompts; a reward that pays the most for an empty
answer, for repetition or for a second answer is a warning naming the off switch (reward.lint) -- a brevity reward
may mean it -- never a stop; a reward with side effects is spared the lint's calls (lint: false) or told them apart
(a `synthetic` parameter)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import verdict_level

from rlhfkit.errors import RewardError
from rlhfkit.rewards import CombinedRewards
from rlhfkit.rewards.lint import adversarial_completions, lint_rewards

FNS = Path(__file__).resolve().parent / "reward_fns_for_tests.py"
PROMPTS = ["Tom has 3 apples and buys 4 more. How many apples does he have?", "What is 6 times 7?"]
ROWS = [{"answer": "7"}, {"answer": "#### 42"}]


def test_adversarial_completions():
    kinds = dict(adversarial_completions("What is 2+2?", "4"))
    assert kinds["empty"] == "" and not kinds["whitespace"].strip() and kinds["prompt_echo"] == "What is 2+2?"
    assert kinds["reference_only"] == "4" and len(kinds["repetition"]) >= 3000
    assert "truncated" not in kinds  # one character has no middle to cut
    two = [c for k, c in adversarial_completions("q", "42") if k == "two_answers"]
    assert two[0].index("\\boxed{42}") < two[0].index("\\boxed{43}") and "#### 42" in two[1] and "#### 43" in two[1]
    assert dict(adversarial_completions("q", "42"))["truncated"].endswith("\\boxed{4")  # the box never closes
    assert dict(adversarial_completions("q", "1234"))["truncated"].endswith("\\boxed{12")
    no_ref = dict(adversarial_completions("hi", None))
    assert "reference_only" not in no_ref and "two_answers" not in no_ref
    # a 5,000-digit reference: a different answer without any integer conversion, a bounded repetition
    big = dict(adversarial_completions("q", "1" * 5000))
    assert big["two_answers"].endswith("1" * 4999 + "2.") and len(big["answer_repeated"]) < 30_000


def test_empty_answer_paid_the_most_is_said_first_and_never_stops():
    combo = CombinedRewards([f"{FNS}:pays_for_short"])  # a brevity reward: an empty answer paid the most, by design
    report = lint_rewards(combo, PROMPTS, ROWS)
    assert "empty completion gets the highest reward" in report.warnings[0]
    assert "unless that is the reward's intent" in report.warnings[0]
    text = "\n".join(report.lines())
    assert "pays_for_short" in text and "error:" not in text and "reward.lint=false turns the lint off" in text
    assert text.count("empty completion") == 1  # said once, not again as "pays for empty completions"


def test_math_verifier_is_clean_and_length_reward_is_flagged():
    report = lint_rewards(CombinedRewards(["math_answer"]), PROMPTS, ROWS)
    means = report.means["math_answer"]
    assert report.warnings == []
    # the maths verifier pays only where the final answer is the reference: not for echoes, forms, a second answer
    # or a truncated box
    assert means["empty"] == means["prompt_echo"] == means["format_only"] == means["truncated"] == 0.0
    assert means["reference_only"] == 1.0 and means["two_answers"] == 0.0
    assert report.high == [] and report.warnings == []  # the right answer alone is what a verifier pays for
    assert report.lines()[-1] == "no adversarial completion scores high"
    report = lint_rewards(CombinedRewards([f"{FNS}:pays_for_long", "math_answer"]), PROMPTS, ROWS)
    assert ("total", "repetition", 1.0) in report.high and report.warnings == []
    assert not [h for h in report.high if h[0] != "total"]  # the total is judged (what the policy is trained on)
    # a format reward beside a verifier pays for an empty skeleton, the total does not: no warning
    report = lint_rewards(CombinedRewards(["math_answer", {"fn": "format", "weight": 0.1}]), PROMPTS, ROWS)
    assert report.means["format"]["format_only"] > 0 and report.high == []


def test_first_match_verifier_pays_for_a_second_answer():
    # a reward reading the first `#### n` pays for "#### 7 ... #### 8": the lint shows it
    report = lint_rewards(CombinedRewards([f"{FNS}:first_hashes"]), PROMPTS, [{"answer": "7"}, {"answer": "42"}])
    assert report.means["first_hashes"]["two_answers"] == pytest.approx(1 / 3)  # one of its three forms
    assert ("first_hashes", "two_answers", pytest.approx(1 / 3)) in report.high


def test_probe_prints_warnings_never_stops_on_them_and_stops_a_certain_bug_with_its_workers():
    from rlhfkit.rewards.lint import probe_rewards

    said: list[str] = []
    combo = CombinedRewards([f"{FNS}:pays_for_long", "math_answer"], workers=1, timeout_s=60)
    report = probe_rewards(combo, PROMPTS, ROWS, say=said.append)
    assert any("total pays for repetition" in line for line in said) and report.high
    assert all(line.startswith("[reward lint] ") for line in said)
    combo.close()
    combo = CombinedRewards([f"{FNS}:pays_for_short"], workers=1, timeout_s=60)
    probe_rewards(combo, PROMPTS, ROWS, say=said.append)  # a brevity reward: warned about, not stopped
    combo.close()
    combo = CombinedRewards([f"{FNS}:wrong_length"], workers=1, timeout_s=60)  # certainly a bug: the probe stops it
    with pytest.raises(RewardError, match="returned"):
        probe_rewards(combo, PROMPTS, ROWS, say=said.append)
    assert all(w.proc is None for w in combo.pool.workers)  # stopped on the way out
    assert probe_rewards(CombinedRewards(["math_answer"]), PROMPTS, ROWS, lint=False) is None


def test_a_reward_with_side_effects_is_spared_or_told_the_synthetic_calls(tmp_path):
    # a counter (a paid judge's bill): lint=false spares it every call before the run; one naming `synthetic` is told
    counter = tmp_path / "calls.txt"
    fns = tmp_path / "judge.py"
    fns.write_text(
        "def paid_judge(prompts, completions, **fields):\n"
        f"    with open({str(counter)!r}, 'a') as f:\n"
        "        f.write(f'{len(completions)}\\n')\n"
        "    return [1.0] * len(completions)\n\n"
        "def careful(prompts, completions, synthetic=False, **fields):\n"
        f"    if not synthetic:\n"
        f"        with open({str(counter)!r}, 'a') as f:\n"
        "            f.write('real\\n')\n"
        "    return [0.0 if synthetic else 1.0] * len(completions)\n")
    from rlhfkit.rewards import RewardFunctionSpec
    from rlhfkit.rewards.lint import probe_rewards

    said: list[str] = []
    with CombinedRewards([RewardFunctionSpec(f"{fns}:paid_judge", lint=False), f"{fns}:careful"]) as combo:
        report = probe_rewards(combo, PROMPTS, ROWS, say=said.append)
        assert not counter.exists()  # neither the probe nor the lint called the judge; careful knew they were synthetic
        assert "paid_judge is not called on the lint's completions" in " ".join(report.notes)
        out = combo(PROMPTS, ["a", "b"], ROWS)  # a rollout: both called, neither told synthetic
    assert out.total.tolist() == [2.0, 2.0] and counter.read_text().split() == ["2", "real"]


def test_reward_lint_command(tmp_path, capsys):
    import json

    from rlhfkit.cli import main

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, **r}) + "\n" for p, r in zip(PROMPTS, ROWS)))
    warned = main(["reward-lint", f"data.train={data}", f"reward.functions=[{{fn: '{FNS}:pays_for_short'}}]",
                   "reward.workers=1"])
    out, err = capsys.readouterr()
    assert warned == 0 and "pays_for_short" in out and "warning: an empty completion gets the highest" in out
    assert main(["reward-lint", f"data.train={data}", "reward.functions=[{fn: math_answer}]", "--prompts", "2"]) == 0
    out, _ = capsys.readouterr()
    assert "no adversarial completion scores high" in out and "warning" not in out and "empty" in out
    assert main(["reward-lint", f"data.train={data}", "--recipe", "dpo"]) == 2
    assert "needs an online recipe" in capsys.readouterr().err
    assert main(["reward-lint", f"data.train={data}"]) == 2  # no functions: one line
    assert "no reward" in capsys.readouterr().err


def test_one_kind_scored_far_below_the_rest_does_not_make_the_others_high():
    # a target-length reward gives the 4,000-character repetition about -98: measured from there, the empty answer
    # (0) looked "high" too; measured from the lower quartile only the kinds near the target length are
    report = lint_rewards(CombinedRewards([f"{FNS}:pays_for_target_length"]), PROMPTS, ROWS)
    means, high = report.means["pays_for_target_length"], {k for _, k, _ in report.high}
    assert means["repetition"] < -90 and means["empty"] == 0.0
    assert "prompt_echo" in high and "format_only" in high
    assert not high & {"empty", "whitespace", "repetition", "answer_repeated", "reference_only"}
    assert not any("empty completion" in w for w in report.warnings)


def test_scores_beyond_the_clip_are_a_warning_before_the_run():
    from types import SimpleNamespace

    from rlhfkit.rewards.lint import clip_of

    combo = CombinedRewards([f"{FNS}:far_below_clip"])
    report = lint_rewards(combo, PROMPTS, ROWS, clip=10.0)  # every lint completion scores in [-30, -20]
    assert len(report.warnings) == 1 and "reward.clip=10" in report.warnings[0]
    assert any(line.startswith("warning: ") and "the clip ties such scores" in line for line in report.lines())
    assert lint_rewards(combo, PROMPTS, ROWS, clip=30.0).warnings == []  # a clip wide enough
    assert lint_rewards(combo, PROMPTS, ROWS).warnings == []  # reward.clip=null
    # a length reward (-98 for the 4,000-character repetition) reaches the clip on a few kinds only: no warning
    assert lint_rewards(CombinedRewards([f"{FNS}:pays_for_target_length"]), PROMPTS, ROWS, clip=10.0).warnings == []
    # reward.normalize rescales the scores before the clip: the raw scale does not meet it
    assert clip_of(SimpleNamespace(normalize=True, clip=10.0)) is None
    assert clip_of(SimpleNamespace(normalize=False, clip=10.0)) == 10.0


class _CorrectJudge:
    """A chat judge that grades like a careful grader: 10 when the completion's final answer is the reference."""

    @staticmethod
    def handler():
        import json
        from http.server import BaseHTTPRequestHandler

        from rlhfkit.rewards.maths import answers_equal, extract_answer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                content = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["messages"][0]["content"]
                ref, _, completion = content.partition("\n")
                got = extract_answer(completion)  # the verifier from a server thread, with its time limit: its
                # helper forks the check (a fork of this process from here died in the full suite: rewards/symcheck.py)
                grade = 10 if got is not None and answers_equal(got, ref) else 0
                body = json.dumps({"choices": [{"message": {"content": f"GRADE: {grade}"}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


def _built_in_verifiers(judge_url: str) -> dict[str, list]:
    return {
        "exact_match": ["exact_match"],
        "regex_match": ["regex_match"],
        "math_answer": ["math_answer"],
        "math_format": ["math_format"],
        "math_answer + math_format": ["math_answer", {"fn": "math_format", "weight": 0.1}],
        "code_tests": [{"fn": "code_tests", "kwargs": {"isolation": verdict_level()}}],
        "remote_judge": [{"fn": "remote_judge", "kwargs": {"url": judge_url, "template": "{answer}\n{completion}",
                                                           "retries": 0}}],
    }


def test_every_built_in_verifier_given_the_right_answer_is_silent():
    import json
    import threading
    from http.server import ThreadingHTTPServer

    from rlhfkit.tasks.arithmetic import TASK

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _CorrectJudge.handler())
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    records = TASK.prompt_records(3, seed=3)  # the built-in task's prompts and answers
    prompts = [r["prompt"] for r in records] + ["What is 6 times 7?"]
    rows = [{"answer": r["answer"], "tests": json.dumps(["assert add(1, 2) == 3"])} for r in records]
    rows.append({"answer": "The total is 6 * 7 = 42.\n#### 42", "tests": "assert add(2, 2) == 4"})  # GSM8K-style
    try:
        for name, specs in _built_in_verifiers(f"http://127.0.0.1:{httpd.server_address[1]}/v1").items():
            with CombinedRewards(specs) as combo:  # in this process: the verdicts, not the workers, are tested here
                report = lint_rewards(combo, prompts, rows, max_prompts=len(prompts))
            lines = report.lines()
            assert report.scored and report.high == [] and report.warnings == [], (name, lines)
            assert report.notes == [] and lines[-1] == "no adversarial completion scores high", (name, lines)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_nothing_scored_is_said_never_an_all_clear():
    for spec, why in ((f"{FNS}:returns_nan", "every value it returned was None, NaN or inf"),
                      (f"{FNS}:returns_none", "every value it returned was None, NaN or inf")):
        report = lint_rewards(CombinedRewards([spec]), PROMPTS, ROWS)
        text = "\n".join(report.lines())
        assert not report.scored and why in text and "nothing was scored" in text
        assert "no adversarial completion scores high" not in text
    with CombinedRewards([f"{FNS}:always_hangs"], workers=2, timeout_s=0.5) as combo:  # every call times out
        report = lint_rewards(combo, PROMPTS, ROWS, max_prompts=1)
    text = "\n".join(report.lines())
    assert not report.scored and re.search(r"always_hangs scored none of the (\d+) lint completions \(\1 timed out, 0 "
                                           r"failed\)", text)
    assert "nothing was scored" in text and "no adversarial completion scores high" not in text
