"""The asynchronous mode (``algo.async.max_staleness=K``) under torchrun: producers and learners on separate
processes. It learns; every batch is made from weights at most K updates old; SIGTERM stops every process with one
line and a checkpoint holding the learners' queues, and the same command resumes it with no prompt repeated or
skipped (K = 1 and 2); a producer's failure stops the run as a rank's does; more learners (FSDP2 among them) or
more producers than learners run the same schedule.

Every run is a torchrun of ``cli_script.py`` (the ``rlhfkit`` command), one intra-op thread per process."""

from __future__ import annotations

import json
import signal
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import free_port
from test_online import REWARD_FN, online_overrides
from test_preemption import grpo_args, launch, signal_after

from rlhfkit.track.metrics import read_run_metrics as read_metrics  # rlhfkit's names (the run writes TRL's)
from rlhfkit.train.lifecycle.checkpoint import list_checkpoints

pytestmark = [pytest.mark.slow, pytest.mark.cluster]  # make test-cluster (CI runs it after make test)

SCRIPT = Path(__file__).with_name("cli_script.py")


def torchrun(args: list[str], nproc: int = 2, wait: bool = True, env: dict | None = None):
    cmd = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", str(nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(SCRIPT), *args]
    return launch(cmd, "torchrun", env, wait)


def async_args(data: Path, out: Path, k: int, *extra: str) -> list[str]:
    # 6 steps of 4 prompts x 4 samples, 2 updates each; every step's prompts in samples.jsonl
    return [*grpo_args(data, out), f"algo.async.max_staleness={k}", "track.sample_every=1", "train.save_every=4",
            "track.progress=false", *extra]


def steps_of(out: Path) -> list[dict]:
    return [x for x in read_metrics(out) if "objective/scores" in x]


def prompts_by_step(out: Path) -> dict[int, list[str]]:
    """The prompts each step learned from (samples.jsonl: every sample of every step), sorted."""
    seen: dict[int, list[str]] = defaultdict(list)
    for line in (out / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        seen[row["step"]].append(row["prompt"])
    assert seen, f"no samples in {out / 'samples.jsonl'}"  # two empty files would compare equal
    return {step: sorted(p) for step, p in seen.items()}


def assert_stale_at_most(out: Path, k: int) -> None:
    rows = steps_of(out)
    assert rows and all(0 <= r["async/staleness_max"] <= k for r in rows), [r["async/staleness_max"] for r in rows]


@pytest.mark.parametrize("k", [1, 2])
def test_sigterm_stops_with_the_queue_and_the_same_command_resumes_without_repeating_a_prompt(task_data, tmp_path,
                                                                                             k):
    straight = tmp_path / "straight"
    torchrun(async_args(task_data, straight, k))
    rows = steps_of(straight)
    assert [r["step"] for r in rows] == [2, 4, 6, 8, 10, 12]
    # steady state: exactly K updates old; the first K steps from the starting weights
    assert [r["async/staleness_max"] for r in rows] == [float(min(s, k)) for s in range(6)]
    out = tmp_path / "stopped"
    proc = torchrun(async_args(task_data, out, k), wait=False, env={"RLHFKIT_TEST_SLOW_AFTER": "4",
                                                                       "RLHFKIT_TEST_PAUSE": "0.5"})
    _, stdout, stderr = signal_after(proc, out, 6, signal.SIGTERM)
    lines = [x for x in (stdout + stderr).splitlines() if x.startswith("stopped by SIGTERM")]
    assert len(lines) == 1, stdout[-2000:] + stderr[-3000:]
    step = int(lines[0].split(" at step ")[1].split(";")[0])
    assert 6 <= step < 12 and max(s for s, _ in list_checkpoints(out)) == step
    local = out / f"checkpoint-{step}" / "local_0.pt"
    assert local.is_file()  # the learner's queue of received steps
    resumed = torchrun(async_args(task_data, out, k))
    assert f"resumed from {out / f'checkpoint-{step}'}" in resumed.stdout
    assert [r["step"] for r in steps_of(out)] == [2, 4, 6, 8, 10, 12]  # every step once
    assert prompts_by_step(out) == prompts_by_step(straight)  # no prompt repeated or skipped
    assert_stale_at_most(out, k)
    assert (out / "finished.json").is_file() and (out / "model.safetensors").is_file()


@pytest.mark.parametrize("learners, extra", [(2, ["algo.async.producers=1", "distributed.strategy=fsdp2",
                                                   "train.batch_size=4"]),
                                             (1, ["algo.async.producers=2"])])
def test_more_learners_or_more_producers_run_the_same_schedule(task_data, tmp_path, learners, extra):
    out = tmp_path / "run"
    torchrun(async_args(task_data, out, 1, *extra), nproc=3)
    rows = steps_of(out)
    steps = 6 // learners  # 96 episodes, 16 per learner per step
    assert [r["step"] for r in rows] == [2 * (i + 1) for i in range(steps)]
    assert [r["async/staleness_max"] for r in rows] == [0.0] + [1.0] * (steps - 1)
    assert all(len(p) == 16 for p in prompts_by_step(out).values())  # learner 0's share, whole (pieces merged)
    assert (out / "finished.json").is_file()


def test_a_producers_failure_stops_the_learner_with_a_checkpoint_and_one_line(task_data, tmp_path):
    """The producer's reward raises from its third call of 16 completions (step 2): it says so in one line (exit 2),
    the learner stops at the check after update 4 with the checkpoint and says which rank failed."""
    out = tmp_path / "failed"
    fn = Path(__file__).with_name("rank_reward.py")
    proc = torchrun(async_args(task_data, out, 1, f"reward.functions=[{{fn: '{fn}:reward'}}]", "reward.workers=0"),
                    wait=False)
    stdout, stderr = proc.communicate(timeout=400)
    text = stdout + stderr
    assert proc.returncode != 0
    own = [x for x in text.splitlines() if x.startswith("error: rank 1: ")]
    assert len(own) == 1 and "rank 1's reward fails on purpose" in own[0], text[-4000:]
    learner = [x for x in text.splitlines() if x.startswith("stopped at step")]
    assert len(learner) == 1 and learner[0].startswith("stopped at step 4 because rank 1 failed ("), text[-4000:]
    assert max(s for s, _ in list_checkpoints(out)) == 4
    assert "exitcode: 2" in text


def test_a_producer_that_hangs_ends_the_learner_at_the_collective_timeout(task_data, tmp_path):
    out = tmp_path / "hang"
    fn = Path(__file__).with_name("rank_reward.py")
    proc = torchrun(async_args(task_data, out, 1, f"reward.functions=[{{fn: '{fn}:hangs_on_rank1'}}]",
                               "reward.workers=0", "distributed.timeout_s=8"), wait=False)
    stdout, stderr = proc.communicate(timeout=400)
    assert proc.returncode != 0
    lines = [x for x in stderr.splitlines() if x.startswith("error: rank 0: ")]
    assert len(lines) == 1 and "distributed.timeout_s=8.0 s" in lines[0], stderr[-3000:]
    assert [x["step"] for x in steps_of(out)] == [2, 4]  # the steps learned before the producer hung


def test_grpo_learns_with_batches_one_update_old(task_data, sft_dir, gold_of, tmp_path):
    """GRPO on the SFT policy raises the gold metric by the bar of the synchronous test with the same settings
    (test_online.py: test_critic_free_with_reward_function_raises_gold), with every batch one update old."""
    out = tmp_path / "k1"
    torchrun(["grpo", *online_overrides(task_data, sft_dir, out, REWARD_FN, "algo.rollout_batch_size=8",
                                        "algo.num_generations=4", "algo.mini_batch_size=32",
                                        "algo.total_episodes=1024", "algo.async.max_staleness=1",
                                        "track.progress=false")])
    assert_stale_at_most(out, 1)
    sft, new = gold_of(sft_dir), gold_of(out)
    assert new > sft + 0.15, (sft, new)
