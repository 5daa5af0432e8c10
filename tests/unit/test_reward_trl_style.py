"""TRL's reward-function convention (rlhfkit/rewards/trl_style.py): functions written as TRL's GRPO documentation
writes them (tests/unit/trl_reward_fns.py) score as TRL would score them, in this process and in worker processes;
conversational completions as messages; completion_ids, trainer_state, None, async; callables no worker can import
run in this process under the time limit."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards import CombinedRewards, RewardFunctionSpec
from rlhfkit.rewards.loading import IN_PROCESS, load_reward_function, spec_of
from rlhfkit.rewards.trl_style import is_trl_style

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import trl_reward_fns as docs  # noqa: E402

PROMPTS = ["What is the result of (1 + 2) * 4?", "What is the result of (3 + 1) * 2?"]
GOOD = "<think>The sum of 1 and 2 is 3, which we multiply by 4 to get 12.</think><answer>(1 + 2) * 4 = 12</answer>"
BAD = "The sum of 3 and 1 is 4, which we multiply by 2 to get 8. So (3 + 1) * 2 = 8."


def _score(fn, prompts, completions, rows, workers=0, conversational=False, **kw):
    with CombinedRewards([fn], workers=workers, timeout_s=30, conversational=conversational) as combo:
        return combo(prompts, completions, rows, **kw)


def test_signatures_tell_the_conventions_apart():
    assert all(is_trl_style(f) for f in (docs.reward_func, docs.reward_func_chars, docs.format_reward_func,
                                         docs.reward_func_reference, docs.curriculum))

    def ours(prompts, completions, **fields):  # both conventions call it the same way on text
        return [0.0] * len(completions)

    def positional(p, c):
        return [0.0] * len(c)

    assert not is_trl_style(ours) and not is_trl_style(positional) and not is_trl_style(docs.math_reward_func)
    assert is_trl_style(lambda **kwargs: [])


@pytest.mark.parametrize("workers", [0, 1])
def test_docs_example_2_conversational_format(workers):
    # completion[0]["content"]: each completion is a list of one assistant message (the docs' hand values: [1.0, 0.0])
    out = _score("trl_reward_fns:format_reward_func", PROMPTS, [GOOD, BAD], [{}, {}], workers, conversational=True)
    assert out.total.tolist() == [1.0, 0.0]


def test_docs_example_1_1_and_3_standard_format():
    out = _score(docs.reward_func_chars, ["The sky is", "The sun is"], [" blue.", " in the sky."], [{}, {}])
    assert out.total.tolist() == [6.0, 12.0]  # the docs' values
    prompts = ["Problem: Solve the equation $2x + 3 = 7$. Solution:", "Problem: Solve the equation $3x - 5 = 10$."]
    out = _score(docs.reward_func_reference, prompts, [r" The solution is \boxed{2}.", r" The solution is \boxed{6}."],
                 [{"ground_truth": "2"}, {"ground_truth": "5"}])
    assert out.total.tolist() == [1.0, 0.0]  # the docs' values


def test_docs_example_1_completion_ids_from_the_rollout():
    class Rollout:  # the two fields CombinedRewards reads: ids right-padded, lengths
        response_ids = torch.tensor([[6303, 13, 0, 0], [304, 279, 12884, 13]])
        lengths = torch.tensor([2, 4])

    out = _score(docs.reward_func, ["The sky is", "The sun is"], [" blue.", " in the sky."], [{}, {}],
                 rollout=Rollout())
    assert out.total.tolist() == [2.0, 4.0]  # the docs' values
    # without ids (a probe, rlhfkit eval) such a function has no opinion instead of a TypeError
    out = _score(docs.reward_func, ["a", "b"], ["x", "y"], [{}, {}], allow_all_dropped=True)
    assert out.valid.tolist() == [False, False] and out.metrics["rewards/reward_func/errors"] == 0


def test_docs_example_4_none_for_other_tasks_and_example_5_async():
    rows = [{"task": "math"}, {"task": "code"}, {"task": "math"}]
    with CombinedRewards([docs.math_reward_func, docs.async_reward_func]) as combo:
        out = combo(["What is 2+2?", "Write a sum function.", "What is 3*4?"], ["4", "def f(a, b): ...", ""], rows)
    assert out.per_function["math_reward_func"].tolist()[0] == 1.0
    assert torch.isnan(out.per_function["math_reward_func"][1])  # None: this function does not judge code
    assert out.per_function["async_reward_func"].tolist() == [1.0, 1.0, 0.0]
    assert out.total.tolist() == [2.0, 1.0, -1.0]


def test_trainer_state_and_messages_reach_the_function():
    seen = {}

    def both(prompts, completions, trainer_state, **kwargs):
        seen.update(prompts=prompts, completions=completions, state=trainer_state)
        return [1.0] * len(completions)

    messages = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]]
    with CombinedRewards([RewardFunctionSpec(both, convention="trl")], conversational=True) as combo:
        combo(["hi"], ["hello"], [{}], messages=messages, step=3, max_steps=12)
    assert seen["prompts"] == messages
    assert seen["completions"] == [[{"role": "assistant", "content": "hello"}]]
    assert (seen["state"].global_step, seen["state"].max_steps) == (3, 12)
    out = _score("trl_reward_fns:curriculum", ["p"] * 2, ["a", "b"], [{}, {}], workers=1, step=3, max_steps=12)
    assert out.total.tolist() == [0.25, 0.25]


def test_convention_trl_refused_for_a_function_trl_cannot_call():
    def positional(p, c):
        return [0.0] * len(c)

    with pytest.raises(RewardError, match="cannot be called with TRL's keywords"):
        CombinedRewards([RewardFunctionSpec(positional, convention="trl")])
    with pytest.raises(RewardError, match="convention 'xyz'"):
        CombinedRewards([RewardFunctionSpec("exact_match", convention="xyz")])


def test_importable_callables_go_to_the_workers_by_name_others_stay_here(capsys):
    assert spec_of(docs.format_reward_func) == "trl_reward_fns:format_reward_func"
    local = lambda completions, **kwargs: [float(len(c)) for c in completions]  # noqa: E731 - the point
    spec = spec_of(local)
    assert spec.startswith("python:") and spec_of(local) == spec and load_reward_function(spec) is local
    out = _score(spec, ["p", "q"], ["ab", "abc"], [{}, {}], workers=1)
    assert out.total.tolist() == [2.0, 3.0]
    assert "runs in this process, each call under reward.timeout_s=30 s" in capsys.readouterr().out
    IN_PROCESS.pop(spec)
    with pytest.raises(RewardError, match="given to a trainer in another process"):
        load_reward_function(spec)


def test_an_in_process_function_is_held_to_the_time_limit():
    def slow(prompts, completions, **fields):
        time.sleep(5)
        return [1.0] * len(completions)

    t0 = time.perf_counter()
    with CombinedRewards([spec_of(slow)], workers=1, timeout_s=0.3) as combo:
        out = combo(["p"], ["c"], [{}], allow_all_dropped=True)
    assert time.perf_counter() - t0 < 3
    assert out.metrics["rewards/slow/timeouts"] == 1.0 and out.valid.tolist() == [False]


@pytest.mark.parametrize("workers", [0, 2])
def test_log_metric_and_log_extra_reach_the_run(workers):
    # TRL's Example 6: the metric is the mean of what the calls logged, under its own name; the columns go beside
    # each completion (samples.jsonl); in a worker process too (the logs cross the wire as data)
    out = _score("trl_reward_fns:reward_with_logs", ["q1", "q2", "q3", "q4"], ["so 4", "so 5", "it is 7", "x 9"],
                 [{"ground_truth": g} for g in ("4", "6", "7", "1")], workers=workers)
    assert out.total.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert out.metrics["accuracy"] == pytest.approx(0.5)
    assert out.extra == {"golden_answer": ["4", "6", "7", "1"], "extracted_answer": ["4", "5", "7", "9"]}
    assert out.metrics["rewards/reward_with_logs/std"] == pytest.approx(torch.tensor([1.0, 0, 1, 0]).std().item())


def test_trainer_state_counts_optimizer_updates_as_trl():
    # TRL's trainer_state.global_step is the optimizer updates done before the rollout: 0 at the first
    seen = []

    def watch(completions, trainer_state, **kwargs):
        seen.append((trainer_state.global_step, trainer_state.max_steps, trainer_state.epoch))
        return [1.0] * len(completions)

    with CombinedRewards([RewardFunctionSpec(watch, convention="trl")]) as combo:
        combo(["p"], ["c"], [{}], step=1, max_steps=4, trainer_state=(0, 8, 0.0))  # rollout 0 of 4, 2 updates each
        combo(["p"], ["c"], [{}], step=2, max_steps=4, trainer_state=(2, 8, 0.25))
    assert seen == [(0, 8, 0.0), (2, 8, 0.25)]


def test_a_batch_is_called_whole_or_in_whole_groups():
    # 3 prompts x 2 completions, completion-major (p0 p1 p2 p0 p1 p2), reward.workers=2: a function run in this
    # process and one of TRL's convention get the whole batch in one call (as TRL calls them); rlhfkit's own in the
    # workers gets whole groups per call, never half a group
    prompts, completions, rows = ["a", "b", "c"] * 2, ["x", "yy", "z", "ww", "v", "uuu"], [{}] * 6
    out = _score(lambda completions, **kw: [float(len(completions))] * len(completions), prompts, completions, rows,
                 workers=2)
    assert out.total.tolist() == [6.0] * 6  # a lambda: in this process, one call
    assert _score("trl_reward_fns:batch_sizes", prompts, completions, rows, workers=2).total.tolist() == [6.0] * 6
    with CombinedRewards(["trl_reward_fns:group_rank"], workers=2, timeout_s=30) as combo:
        out = combo(prompts, completions, rows, group=2)
    assert out.total.tolist() == [2.0] * 6  # every call saw both completions of each of its prompts


def test_trls_builtin_rewards_under_their_names():
    from rlhfkit.rewards import accuracy_reward, get_soft_overlong_punishment, think_format_reward

    got = accuracy_reward([[{"content": r"My answer is \boxed{\frac{1}{3}}"}], [{"content": r"\boxed{\frac{1}{2}}"}],
                           "the answer is 42", "no answer here"], [r"\frac{1}{3}", r"\frac{1}{3}", "42", ""])
    assert got == [1.0, 0.0, 1.0, None]  # TRL's docstring's values; an unparseable solution is skipped (None)
    logged = {}
    accuracy_reward(["#### 7"], ["7"], log_extra=lambda col, values: logged.update({col: values}))
    assert logged == {"solution": ["7"], "gold_parsed": ["7"], "answer_parsed": ["7"]}
    assert think_format_reward(["<think>\nhm\n</think>\nok", "<think>hm", "x<think></think>"]) == [1.0, 0.0, 0.0]
    punish = get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=4)
    assert punish([[0] * 6, [0] * 8, [0] * 10, [0] * 11]) == [0.0, -0.5, -1.0, -1.0]  # (10 - 4 - n) / 4, -1 beyond
