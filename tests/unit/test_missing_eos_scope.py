"""reward.missing_eos_scope: the missing-EOS penalty everywhere (all) or only in groups whose scores differ (varied).

Values computed by hand on completion-major batches ([k, P] flattened: answer j of prompt p at j * P + p)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlhfkit.algos.advantages import grpo_advantages
from rlhfkit.config import build_config
from rlhfkit.config.startup import startup_lines
from rlhfkit.errors import ConfigError
from rlhfkit.train.online.producer import penalised_scores


def _cfg(scope: str, k: int, penalty: float | None = 1.0):
    return SimpleNamespace(reward=SimpleNamespace(missing_eos_penalty=penalty, missing_eos_scope=scope),
                           algo=SimpleNamespace(num_generations=k, overlong=SimpleNamespace(cache_len=0)),
                           generation=SimpleNamespace(max_new_tokens=16))


# k = 2 answers of P = 3 prompts: prompt 0 both wrong, prompt 1 one right, prompt 2 both wrong
RAW = torch.tensor([0.0, 1.0, 0.0,
                    0.0, 0.0, 0.0])
ENDED = torch.tensor([True, False, False,
                      False, False, True])


def test_all_penalises_every_unended_answer():
    got = penalised_scores(_cfg("all", 2), RAW, ENDED)
    assert got.tolist() == [0.0, 0.0, -1.0, -1.0, -1.0, 0.0]


def test_varied_penalises_only_in_groups_whose_scores_differ():
    got = penalised_scores(_cfg("varied", 2), RAW, ENDED)
    # prompt 1 (scores 1, 0) differs: its two unended answers lose 1; prompts 0 and 2 tie at 0: untouched
    assert got.tolist() == [0.0, 0.0, 0.0, 0.0, -1.0, 0.0]
    assert RAW.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # the input is not changed


def test_varied_reads_only_valid_members_and_scales_with_the_penalty():
    # prompt 1's right answer is dropped (a reward that failed): among valid members its group ties -> no penalty
    valid = torch.tensor([True, False, True, True, True, True])
    got = penalised_scores(_cfg("varied", 2, penalty=0.5), RAW, ENDED, valid=valid)
    assert got.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    got = penalised_scores(_cfg("varied", 2, penalty=0.5), RAW, ENDED)
    assert got.tolist() == [0.0, 0.5, 0.0, 0.0, -0.5, 0.0]


def test_no_penalty_leaves_scores_in_either_scope():
    for scope in ("all", "varied"):
        assert penalised_scores(_cfg(scope, 2, penalty=None), RAW, ENDED).tolist() == RAW.tolist()


def test_the_amplification_varied_removes():
    # one prompt, 4 wrong answers of which one ended: with the penalty everywhere the std scaling gives that group
    # exactly the advantages of a group with one right answer among four ended ones; varied gives it none
    raw, ended = torch.zeros(4), torch.tensor([True, False, False, False])
    every = grpo_advantages(penalised_scores(_cfg("all", 4), raw, ended), 4)
    one_right = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
    torch.testing.assert_close(every, one_right)
    assert every[0].item() == pytest.approx(1.5, rel=1e-5)  # (1 - 1/4) / sample std 0.5
    varied = grpo_advantages(penalised_scores(_cfg("varied", 4), raw, ended), 4)
    assert varied.tolist() == [0.0, 0.0, 0.0, 0.0]
    # a group with a right answer keeps the penalty's shaping: ended-wrong above unended-wrong
    raw, ended = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([True, True, False, False])
    adv = grpo_advantages(penalised_scores(_cfg("varied", 4), raw, ended), 4)
    assert adv[0] > adv[1] > adv[2] == adv[3]


def test_grpo_defaults_to_varied_and_says_so_where_trl_differs():
    # grpo's default since 2026-11-30 (docs/learning.md); rloo keeps all; TRL's defaults have no penalty
    grpo = build_config("grpo", {}, ["model.name=tiny"])
    assert grpo.reward.missing_eos_scope == "varied" and grpo.reward.missing_eos_penalty == 1.0
    assert build_config("rloo", {}, ["model.name=tiny"]).reward.missing_eos_scope == "all"
    assert "reward.missing_eos_scope=varied [missing_eos_penalty, when set, on every unended answer]" in \
        " ".join(startup_lines(grpo))
    quiet = build_config("grpo", {}, ["model.name=tiny", "reward.missing_eos_penalty=null"])
    assert "missing_eos_scope" not in " ".join(startup_lines(quiet))  # no penalty: where it applies does not matter
    trl = build_config("grpo", {}, ["model.name=tiny", "defaults=trl"])
    assert trl.reward.missing_eos_penalty is None and trl.reward.missing_eos_scope == "all"


def test_the_config_takes_varied_for_group_estimators_and_refuses_it_without_groups():
    cfg = build_config("rloo", {}, ["model.name=tiny", "reward.missing_eos_scope=varied"])
    assert cfg.reward.missing_eos_scope == "varied"
    with pytest.raises(ConfigError) as info:
        build_config("ppo", {}, ["model.name=tiny", "reward.missing_eos_scope=varied"])
    assert "reward.missing_eos_scope" in info.value.one_line() and "gae has no groups" in info.value.one_line()
    with pytest.raises(ConfigError) as info:
        build_config("grpo", {}, ["model.name=tiny", "reward.missing_eos_scope=some"])
    assert "reward.missing_eos_scope" in info.value.one_line() and "varied" in info.value.one_line()
