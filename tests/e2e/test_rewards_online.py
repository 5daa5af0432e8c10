"""Rewards in the online loop, end to end on the tiny model: GRPO with the maths verifier raises held-out accuracy
on the built-in arithmetic task; a reward function that hangs on some calls is cut at reward.timeout_s, counted and
the run finishes; the reward lint runs before any weights load (a reward that pays for empty answers stops the run,
and `rlhfkit reward-lint` exits 2 on it); a sandbox that cannot be set up stops the run at the probe."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlhfkit.config import build_config
from rlhfkit.errors import RewardError
from rlhfkit.tasks import write_jsonl
from rlhfkit.tasks.arithmetic import ArithmeticTask
from rlhfkit.train.online.synchronous import run_online

TINY = "tiny:hidden=64,layers=2,intermediate=128"
HANGS = '''
import fcntl
import time


def one_call_in_four_hangs(prompts, completions, counter, **fields):
    """Counts its calls in the file `counter` (across workers); every fourth call, from the second, hangs."""
    with open(counter, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        n = len(fh.read())
        fh.write("x")
    if n % 4 == 1:
        time.sleep(3600)
    return [float(len(c) % 3) for c in completions]


def pays_for_silence(prompts, completions, **fields):
    return [1.0 if not c.strip() else 0.0 for c in completions]
'''


def metrics_of(run_dir) -> list[dict]:
    """The run's metrics.jsonl under rlhfkit's names (it writes TRL's for grpo / rloo / online-dpo)."""
    from rlhfkit.track.metrics import read_run_metrics

    return read_run_metrics(run_dir)


def rows_of(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


TASK = ArithmeticTask(high=4, ops=("add",), words=False)  # "What is 3 plus 4?": fixed positions, a tiny model's size


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The arithmetic task's files: mixed-quality demonstrations, training and held-out prompts."""
    d = tmp_path_factory.mktemp("arith")
    write_jsonl(d / "sft.jsonl", TASK.sft_records(640, seed=0))
    write_jsonl(d / "prompts.jsonl", TASK.prompt_records(1000, seed=1))
    write_jsonl(d / "eval_prompts.jsonl", TASK.prompt_records(96, seed=10_001))
    return d


@pytest.fixture(scope="module")
def sft(data):
    """A tiny model SFT'd on the demonstrations (35 % right): it learns the form and a rough guess."""
    from rlhfkit.train.supervised.sft import run_sft

    out = data / "sft"
    run_sft(build_config("sft", {}, [
        f"data.train={data / 'sft.jsonl'}", f"output_dir={out}", f"model.name={TINY}", "optim.lr=5e-3",
        "train.batch_size=32", "train.epochs=8", "data.max_length=128", "track.report=false"]))
    return out


def held_out_accuracy(model_dir, rows) -> float:
    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import load_causal_lm
    from rlhfkit.tasks.gold import gold_metric

    model, tok = load_causal_lm(ModelConfig(name=str(model_dir)), trainable=False)
    return gold_metric(model, tok, TASK, rows, seed=3, max_new_tokens=12)["gold"]


def grpo(data, model, out, *extra):
    return build_config("grpo", {}, [
        f"data.train={data / 'prompts.jsonl'}", f"data.eval={data / 'eval_prompts.jsonl'}", f"output_dir={out}",
        f"model.name={model}", "generation.max_new_tokens=12", "data.max_length=128", "track.report=false",
        "track.sample_every=0", "train.resume=never", "train.eval_every=0", *extra])


@pytest.mark.slow
@pytest.mark.cluster  # one of the longest checks (~10 s): make test-cluster, which CI runs
def test_grpo_with_the_maths_verifier_raises_held_out_accuracy(data, sft, tmp_path):
    out = tmp_path / "grpo"
    last = run_online(grpo(data, sft, out, "reward.functions=[{fn: math_answer}]", "reward.workers=2",
                           "algo.rollout_batch_size=8", "algo.num_generations=8", "algo.mini_batch_size=64",
                           "train.batch_size=64", "algo.total_episodes=1536", "optim.lr=1e-3"))
    held = rows_of(data / "eval_prompts.jsonl") * 4  # 384 sampled answers: the accuracy's noise is about 0.02
    before, after = held_out_accuracy(sft, held), held_out_accuracy(out, held)
    curve = [r["rewards/math_answer/mean"] for r in metrics_of(out) if "rewards/math_answer/mean" in r]
    print(f"[arithmetic] held-out accuracy {before:.3f} (sft) -> {after:.3f}; training reward "
          f"{sum(curve[:4]) / 4:.3f} -> {sum(curve[-4:]) / 4:.3f}; run's eval {last['eval/scores']:.3f}")
    # measured on this machine (SFT with 35 % right demonstrations, then 24 GRPO steps): 0.19 -> 0.29, and 0.25 ->
    # 0.35 with 50 % right demonstrations; the tiny model learns the addition table slowly, so the bar is +0.05
    assert after > before + 0.05, (before, after)
    assert last["rewards/math_answer/timeouts"] == 0 and last["rewards/math_answer/errors"] == 0
    assert last["rewards/math_answer/time_s"] > 0


def test_hanging_reward_is_cut_counted_and_the_run_finishes(data, tmp_path):
    (tmp_path / "hangs.py").write_text(HANGS)
    out = tmp_path / "hang"
    run_online(grpo(data, "tiny:hidden=32,layers=1", out,
                    f"reward.functions=[{{fn: '{tmp_path / 'hangs.py'}:one_call_in_four_hangs', name: h, "
                    f"kwargs: {{counter: '{tmp_path / 'calls'}'}}}}]",
                    "reward.workers=4", "reward.timeout_s=1", "reward.lint=false", "algo.rollout_batch_size=4",
                    "algo.num_generations=4", "algo.mini_batch_size=16", "train.batch_size=16",
                    "algo.total_episodes=64", "generation.max_new_tokens=6"))
    rows = [r for r in metrics_of(out) if "rewards/h/timeouts" in r]
    assert len(rows) == 4 and (out / "finished.json").exists()
    # one chunk of four hung at every step (the probe was call 0): reward.timeout_s bounds the function's whole call
    # on the batch (issue 45), so the hanging chunk is cut at 1 s with its four samples, counted and dropped; the
    # other chunks are scored, and the step costs the limit once, never once per retry
    assert [r["rewards/h/timeouts"] for r in rows] == [4.0] * 4
    assert [r["rewards/dropped"] for r in rows] == [4.0] * 4
    assert all(1.0 <= r["rewards/h/time_s"] < 5 for r in rows)


def test_lint_warns_about_a_reward_that_pays_for_silence_before_any_weights_load(data, tmp_path):
    # the lint warns (issue 40: warnings only, as a TRL user's reward may mean it); what is certainly a bug (a wrong
    # number of values) is refused by the probe, tests/unit/test_reward_lint.py
    (tmp_path / "hangs.py").write_text(HANGS)
    spec = f"reward.functions=[{{fn: '{tmp_path / 'hangs.py'}:pays_for_silence'}}]"
    res = subprocess.run([sys.executable, "-m", "rlhfkit", "reward-lint", f"data.train={data / 'prompts.jsonl'}",
                          spec], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "pays_for_silence" in res.stdout and "an empty completion gets the highest reward" in res.stdout
    assert "warning" in res.stdout and "reward.lint=false" in res.stdout
    ok = subprocess.run([sys.executable, "-m", "rlhfkit", "reward-lint", f"data.train={data / 'prompts.jsonl'}",
                         "reward.functions=[{fn: math_answer}]"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    # a correct verifier is not a false alarm: echoing the reference is the right answer (issue 33 item 5)
    assert "warning" not in ok.stdout and "no adversarial completion scores high" in ok.stdout


def test_a_sandbox_that_cannot_be_set_up_stops_at_the_probe(data, tmp_path, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)  # no bubblewrap on this "machine"
    out = tmp_path / "code"
    with pytest.raises(RewardError, match="cannot be set up with isolation namespaces.*bubblewrap.*not installed"):
        run_online(grpo(data, "tiny:hidden=32,layers=1", out, "reward.workers=0",
                        "reward.functions=[{fn: code_tests, kwargs: {isolation: namespaces, field: answer}}]"))
    assert not out.exists()
