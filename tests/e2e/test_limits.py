"""A run that learned nothing, end to end through the command line: every episode dropped for a NaN turn reward
(no finite reward at all: a fault) ends in one line and exit 2, with no final model and no finished marker; every
group tied (a weak model on a hard task, as TRL runs it) finishes, saves its model and says in one line that no
update changed the policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfkit.cli import main
from rlhfkit.track.metrics import read_run_metrics as read_metrics  # rlhfkit's names (the run writes TRL's)

TINY = "tiny:hidden=32,layers=1,intermediate=64"
FNS = Path(__file__).parents[1] / "unit" / "reward_fns_for_tests.py"
pytestmark = pytest.mark.slow

NAN_ENV = '''
class NanReward:
    def reset(self, row):
        return row["prompt"]

    def step(self, messages, completion):
        return [], float("nan"), True
'''


def grpo(root: Path, out: str, *extra: str) -> list[str]:
    return ["grpo", f"data.train={root / 'prompts.jsonl'}", f"model.name={TINY}", f"output_dir={root / out}",
            "algo.rollout_batch_size=2", "algo.num_generations=2", "algo.mini_batch_size=4", "train.batch_size=4",
            "algo.total_episodes=8", "generation.max_new_tokens=4", "data.eval_fraction=0", "track.report=false",
            *extra]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("limits")
    words = ["cat", "dog", "owl", "bee"] * 4
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"shout: {w}"}) + "\n" for w in words))
    (root / "nan_env.py").write_text(NAN_ENV)
    return root


def error_line(capsys) -> str:
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_run_without_any_finite_reward_is_not_a_success(root, capsys):
    extra = (f"env.name={root / 'nan_env.py'}:NanReward", "env.workers=1", "env.timeout_s=60", "env.max_turns=1")
    assert main(grpo(root, "all_dropped", *extra)) == 2
    line = error_line(capsys)
    # a batch whose every episode was dropped stops at once, naming why and the fix (issue 45), not after the run
    assert "every one of the 4 episodes at rollout step 1 was dropped" in line and "non-finite reward" in line
    assert "fix:" in line
    out = root / "all_dropped"
    assert not (out / "model.safetensors").exists() and not (out / "finished.json").exists()


def test_a_run_whose_every_group_ties_finishes_and_says_no_update_changed_the_policy(root, capsys):
    extra = (f"reward.functions=[{{fn: '{FNS}:contains_yes'}}]", "algo.filter_tied_groups=true", "reward.workers=0",
             "reward.missing_eos_penalty=null", "algo.ppo_epochs=2")  # 2 passes: 2 updates a step
    assert main(grpo(root, "all_tied", *extra)) == 0
    said = capsys.readouterr()
    assert "no update changed the policy: all 4 updates of this run had no learning signal" in said.out
    assert "error:" not in said.err
    out = root / "all_tied"
    assert (out / "model.safetensors").exists() and (out / "finished.json").exists()
    assert [m["train/empty_updates"] for m in read_metrics(out)] == [2, 4]
