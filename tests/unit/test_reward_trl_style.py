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
