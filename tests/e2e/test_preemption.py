"""Preemption: SIGTERM / SIGUSR1 in the middle of a run stops it after the update under way with one line, a
checkpoint at the step of the stop, the report and a documented exit code; the same command again resumes it and
ends with the weights of the run that never stopped, bit for bit (``train/lifecycle/stop.py``).

Every run here is a process of its own (``cli_script.py``: the ``rlhfkit`` command with updates slowed down past a
step, so the signal lands mid-run), one intra-op thread each, so the straight and the resumed runs do the same
arithmetic.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY, free_port
from safetensors.torch import load_file

from rlhfkit.track.metrics import read_run_metrics as read_metrics  # rlhfkit's names (the run writes TRL's)
from rlhfkit.train.lifecycle.checkpoint import list_checkpoints

pytestmark = [pytest.mark.slow, pytest.mark.cluster]  # make test-cluster (CI runs it after make test)

SCRIPT = Path(__file__).with_name("cli_script.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def sft_args(data: Path, out: Path) -> list[str]:
    return ["sft", f"data.train={data / 'sft.jsonl'}", f"output_dir={out}", f"model.name={TINY}", "optim.lr=5e-3",
            "train.batch_size=8", "train.max_steps=10", "train.save_every=4", "data.limit=300", "data.max_length=64"]


def grpo_args(data: Path, out: Path) -> list[str]:
    # 2 updates per rollout step (2 mini-batches of 8), 6 steps (12 updates): checkpoints hold whole steps (update 2k)
    return ["grpo", f"data.train={data / 'prompts.jsonl'}", f"output_dir={out}", f"model.name={TINY}",
            "optim.lr=1e-3", "train.batch_size=8", "generation.max_new_tokens=8", "data.max_length=64",
            "track.sample_every=0", "reward.functions=[{fn: 'rlhfkit.tasks.quickstart:reward'}]",
            "algo.rollout_batch_size=4", "algo.num_generations=4", "algo.mini_batch_size=8",
            "algo.ppo_epochs=1", "algo.total_episodes=96", "data.limit=200", "train.save_every=10"]


def launch(cmd: list[str], what: str, env: dict | None, wait: bool):
    """``cmd`` with the offline environment: a running Popen (``wait`` False), or the finished run, asserted exit 0."""
    if not wait:
        return subprocess.Popen(cmd, env={**ENV, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    proc = subprocess.run(cmd, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def run(args: list[str], env: dict | None = None, wait: bool = True):
    return launch([sys.executable, str(SCRIPT), *args], "rlhfkit", env, wait)


def signal_after(proc, out: Path, step: int, sig: int) -> tuple[int, str, str]:
    """Send ``sig`` once metrics.jsonl holds a line past ``step``; (exit code, stdout, stderr)."""
    deadline = time.time() + 300
    while not any(x["step"] >= step for x in read_metrics(out)):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.1)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=300)
    return proc.returncode, stdout, stderr


def stopped_at(stderr: str, name: str) -> int:
    line = stderr.strip().splitlines()[-1]
    head, _, tail = line.partition(" at step ")
    assert head == f"stopped by {name}", line
    step = int(tail.split(";")[0])
    assert line == f"stopped by {name} at step {step}; checkpoint-{step} saved; rerun the same command to resume"
    return step


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "resumed weights differ from the straight run's"


def ppo_args(data: Path, out: Path) -> list[str]:
    # a critic (from the policy) and GAE; 8 samples, 1 update per step, 12 steps
    return ["ppo", *grpo_args(data, out)[1:], "algo.advantage=gae", "algo.num_generations=1",
            "algo.rollout_batch_size=8", "critic.init=policy"]


ARGS = {"sft": sft_args, "grpo": grpo_args, "ppo": ppo_args}


@pytest.fixture(scope="module")
def straight(task_data, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("straight")
    for recipe, args in ARGS.items():
        run(args(task_data, root / recipe))
    return {recipe: root / recipe for recipe in ARGS}


# (recipe, signal, sent after this update, the periodic checkpoint before it, the last update)
@pytest.mark.parametrize("recipe,sig,at,period,end", [("sft", signal.SIGTERM, 5, 4, 10),
                                                      ("grpo", signal.SIGUSR1, 4, 10, 12),
                                                      ("ppo", signal.SIGTERM, 4, 10, 12)])
def test_signal_stops_with_a_checkpoint_and_resumes_bit_exact(straight, task_data, tmp_path, recipe, sig, at, period,
                                                             end):
    out = tmp_path / recipe
    args = ARGS[recipe](task_data, out)
    proc = run(args, env={"RLHFKIT_TEST_SLOW_AFTER": "4", "RLHFKIT_TEST_PAUSE": "0.5"}, wait=False)
    code, _, stderr = signal_after(proc, out, at, sig)
    name = signal.Signals(sig).name
    assert code == 128 + sig, stderr[-3000:]  # 143 for SIGTERM, 138 for SIGUSR1 (README: exit codes)
    step = stopped_at(stderr, name)
    assert at <= step < end and step != period  # the update (online: the step, or none: the rollout abandoned)
    assert max(s for s, _ in list_checkpoints(out)) == step
    assert read_metrics(out)[-1]["step"] == step  # every update done is logged, none after the stop
    assert not (out / "finished.json").exists() and not (out / "model.safetensors").exists()
    report = (out / "report.html").read_text()
    assert f"stopped by {name} at step {step}" in report
    # the same command again: resumed from the stop's checkpoint, the straight run's result bit for bit
    resumed = run(args)
    assert f"resumed from {out / f'checkpoint-{step}'}" in resumed.stdout
    assert_same_weights(out, straight[recipe])
    curve = {x["step"]: x.get("train/loss", x.get("loss/policy_avg")) for x in read_metrics(out)}
    whole = {x["step"]: x.get("train/loss", x.get("loss/policy_avg")) for x in read_metrics(straight[recipe])}
    assert curve == whole


def torchrun(args: list[str], wait: bool = True, env: dict | None = None):

    cmd = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(SCRIPT), *args]
    return launch(cmd, "torchrun", env, wait)


def test_sigterm_to_torchrun_stops_both_ranks_with_one_line_and_resumes_bit_exact(task_data, tmp_path):
    """The launcher gets the SIGTERM (Kubernetes, a scheduler): torchrun forwards it to its workers and gives them
    30 s; both stop after the same update, write the sharded checkpoint together, and rank 0 says so once."""
    fsdp = ["distributed.strategy=fsdp2", "train.batch_size=4"]  # 2 x 4 per update
    run_args = lambda out: [*sft_args(task_data, out), *fsdp]  # noqa: E731
    torchrun(run_args(tmp_path / "straight"))
    out = tmp_path / "stopped"
    proc = torchrun(run_args(out), wait=False, env={"RLHFKIT_TEST_SLOW_AFTER": "4", "RLHFKIT_TEST_PAUSE": "0.5"})
    _, stdout, stderr = signal_after(proc, out, 5, signal.SIGTERM)
    # torchrun itself then exits 1 with its own SignalException traceback (README: exit codes)
    lines = [x for x in (stdout + stderr).splitlines() if x.startswith("stopped by")]
    assert len(lines) == 1, stdout[-2000:] + stderr[-3000:]
    step = stopped_at(lines[0], "SIGTERM")
    assert 5 <= step < 10 and step % 4 != 0
    assert max(s for s, _ in list_checkpoints(out)) == step
    assert sorted(p.name for p in (out / f"checkpoint-{step}" / "sharded").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]  # both ranks' shards
    assert f"stopped by SIGTERM at step {step}" in (out / "report.html").read_text()
    torchrun(run_args(out))  # the same command again
    assert_same_weights(out, tmp_path / "straight")


def test_a_rank_that_hangs_ends_the_others_at_the_collective_timeout(task_data, tmp_path):
    """Rank 1 hangs after update 2 (a long sleep): rank 0 waits at the next collective for distributed.timeout_s,
    then ends with one line naming that key, closes its files and writes the report; checkpoints stay valid."""
    out = tmp_path / "hang"
    proc = torchrun([*sft_args(task_data, out), "distributed.timeout_s=8"], wait=False,
                    env={"RLHFKIT_TEST_SLOW_AFTER": "2", "RLHFKIT_TEST_PAUSE": "300", "RLHFKIT_TEST_PAUSE_RANK": "1"})
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode != 0
    lines = [x for x in stderr.splitlines() if x.startswith("error: rank 0: ")]
    assert len(lines) == 1 and "distributed.timeout_s=8.0 s" in lines[0], stderr[-3000:]
    assert "failed: RuntimeError" in (out / "report.html").read_text()
    assert [x["step"] for x in read_metrics(out) if "train/loss" in x] == [1, 2]


def test_a_reward_failing_on_rank_1_stops_both_ranks_with_a_checkpoint_and_a_report(task_data, tmp_path):
    """Rank 1's reward function raises in rollout step 3 (of 3: 2 x 16 samples a step): rank 1 says so in one line
    (exit 2); it first tells rank 0 at the step's check, both write checkpoint-4 (the 2 steps done), rank 0 writes the
    report with the failure at its top and one line of its own."""
    out = tmp_path / "rank1"
    fn = Path(__file__).with_name("rank_reward.py")
    args = [*grpo_args(task_data, out), f"reward.functions=[{{fn: '{fn}:reward'}}]", "reward.workers=0",
            "distributed.strategy=fsdp2"]
    proc = torchrun(args, wait=False)
    stdout, stderr = proc.communicate(timeout=400)
    assert proc.returncode != 0
    text = stdout + stderr
    rank1 = [x for x in text.splitlines() if x.startswith("error: rank 1: ")]
    assert len(rank1) == 1 and "rank 1's reward fails on purpose" in rank1[0], text[-4000:]
    rank0 = [x for x in text.splitlines() if x.startswith("stopped at step")]
    assert len(rank0) == 1, text[-4000:]
    assert rank0[0].startswith("stopped at step 4 because rank 1 failed (reward.functions: ")
    assert rank0[0].endswith("); checkpoint-4 saved; rerun the same command to resume")
    assert "exitcode: 2" in text  # both ranks exit with the failing rank's code (a user error)
    from rlhfkit.train.lifecycle.checkpoint import validate_checkpoint

    assert max(s for s, _ in list_checkpoints(out)) == 4 and validate_checkpoint(out / "checkpoint-4") is None
    assert "stopped at step 4 because rank 1 failed" in (out / "report.html").read_text()
    assert [x["step"] for x in read_metrics(out) if "objective/scores" in x] == [2, 4]
