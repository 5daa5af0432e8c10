"""``generation.engine=auto`` between ``static`` and ``continuous`` (issue 41): the rule (``auto_choice``) on each
side of each of its thresholds, and ``AutoEngine`` running exactly the engine the rule names (the same tokens as that
engine alone, the same seed), saying which in one line; a model the paged decoder does not cover stays on the static
engine whatever the rule would take; ``plan`` sizes the cache of the engine auto takes."""

from __future__ import annotations

import pytest
from test_rollout_families import family_model
from test_rollout_static import COMMON, assert_same_rollout, ragged_prompts, random_model

from rlhfkit.rollout import AutoEngine, ContinuousEngine, SamplingParams, StaticEngine, check_engine
from rlhfkit.rollout.auto import LONG_ANSWERS, TABLE, auto_choice


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_rule_on_each_side_of_its_thresholds(device):
    long = LONG_ANSWERS[device]
    static = TABLE[device][0]
    assert auto_choice(device, 64, long - 1)[0] == static  # every request at once, answers short of "long"
    assert auto_choice(device, 64, long)[0] == "continuous"  # long answers: the paged cache
    assert auto_choice(device, 64, 48, batch_size=64)[0] == static  # rows at once = requests: no refill to gain
    assert auto_choice(device, 64, 48, batch_size=16)[0] == "continuous"  # more requests than rows: slots refill
    assert auto_choice(device, 64, 4096, batch_size=16, covered=False)[0] == static  # not in the paged decoder
    name, why = auto_choice(device, 64, 48, batch_size=16)
    assert "64 answers through 16 rows at once" in why
    assert auto_choice("mps", 64, 4096)[0] == "hf"  # a device type nothing was measured on


def test_auto_runs_the_continuous_engine_when_the_requests_outnumber_the_rows(capsys):
    model = random_model(eos_bias=2.0, seed=6)
    prompts = ragged_prompts(6, seed=4)
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    auto = AutoEngine(**COMMON, batch_size=2)
    got = auto.generate(model, prompts, params, seed=11)
    assert_same_rollout(ContinuousEngine(**COMMON, batch_size=2).generate(model, prompts, params, seed=11), got)
    assert auto.continuous.counts["peak_running"] == 2  # two slots, refilled: six requests in one call
    out = [line for line in capsys.readouterr().out.splitlines() if "auto:" in line]
    assert out == ["[rollout] auto: continuous engine on cpu, rlhfkit's paged decoder for LlamaForCausalLM "
                   "(6 answers through 2 rows at once: slots refill as answers end)"]


def test_auto_runs_the_static_engine_for_short_answers_all_at_once(capsys):
    model = random_model(eos_bias=2.0, seed=6)
    prompts = ragged_prompts(6, seed=4)
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    got = AutoEngine(**COMMON).generate(model, prompts, params, seed=11)
    assert_same_rollout(StaticEngine(**COMMON, compile=False).generate(model, prompts, params, seed=11), got)
    assert "auto: static engine on cpu, rlhfkit's decoder" in capsys.readouterr().out


def test_long_answers_go_to_the_continuous_engine():
    model = random_model(eos_bias=4.0, seed=2)  # answers end early: a 512-token limit costs little here
    prompts = ragged_prompts(3, seed=1)
    params = SamplingParams(max_new_tokens=LONG_ANSWERS["cpu"], greedy=True)
    auto = AutoEngine(**COMMON)
    assert_same_rollout(ContinuousEngine(**COMMON).generate(model, prompts, params), auto.generate(model, prompts,
                                                                                                    params))
    assert auto.continuous.counts["decode_steps"] > 0  # the continuous engine did the decoding


def test_a_model_outside_the_paged_decoder_stays_on_the_static_engine(capsys):
    model = family_model("gpt2")  # the static engine's generic path; not in the paged decoder
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    params = SamplingParams(max_new_tokens=6, greedy=True)
    auto = AutoEngine(**COMMON, batch_size=1)
    assert_same_rollout(StaticEngine(**COMMON, compile=False, batch_size=1).generate(model, prompts, params),
                        auto.generate(model, prompts, params))
    out = capsys.readouterr().out
    assert "auto: static engine on cpu, the model's own modules" in out and "continuous" not in out


def test_auto_takes_the_cache_budget_for_its_continuous_engine():
    check_engine("auto", {}, cache_tokens=4096)  # accepted: used when auto takes the continuous engine
    assert AutoEngine(**COMMON, cache_tokens=4096).continuous.cache_tokens == 4096
