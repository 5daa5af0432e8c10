"""Two nodes on one machine: two torchrun launchers (``--nnodes 2 --nproc_per_node 1``, one per node rank) meet at a
rendezvous on 127.0.0.1 and train SFT and GRPO under FSDP2 as one world of two processes; the loss curve (GRPO: the
step metrics) and the final weights are those of the one-node two-process run. Killing one node's launcher ends the
other node's run within seconds (its worker's collective fails when the peer's connection closes), and the same two
commands resume to the final weights of the run that never stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port
from test_preemption import ENV, SCRIPT, assert_same_weights, grpo_args, sft_args, torchrun
from test_resume import losses

from rlhfkit.track.metrics import read_run_metrics as read_metrics  # rlhfkit's names (the run writes TRL's)

pytestmark = [pytest.mark.slow, pytest.mark.cluster]  # make test-cluster (CI runs it after make test)

FSDP = ["distributed.strategy=fsdp2", "train.batch_size=4"]  # 2 ranks x 4 per update


def two_nodes(args: list[str], env: dict | None = None) -> list[subprocess.Popen]:
    """One launcher per node rank, both on this machine, one worker each."""
    port = free_port()
    torchrun_bin = str(Path(sys.executable).with_name("torchrun"))
    return [subprocess.Popen([torchrun_bin, "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node),
                              "--master_addr", "127.0.0.1", "--master_port", str(port), str(SCRIPT), *args],
                             env={**ENV, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
            for node in (0, 1)]


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=400)
        out.append((p.returncode, stdout + stderr))
    return out


def test_two_nodes_match_one_node_with_two_processes(task_data, tmp_path):
    one = tmp_path / "one-node"
    torchrun([*sft_args(task_data, one), *FSDP])
    two = tmp_path / "two-nodes"
    results = finish(two_nodes([*sft_args(task_data, two), *FSDP]))
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    assert len(losses(two)) == 10
    assert losses(two) == pytest.approx(losses(one), abs=1e-6)  # the same world of two, the same arithmetic
    assert_same_weights(two, one)


def test_grpo_on_two_nodes_matches_one_node_with_two_processes(task_data, tmp_path):
    one, two = tmp_path / "one-node", tmp_path / "two-nodes"
    torchrun([*grpo_args(task_data, one), "distributed.strategy=fsdp2"])
    results = finish(two_nodes([*grpo_args(task_data, two), "distributed.strategy=fsdp2"]))
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    keys = ("objective/scores", "loss/policy_avg", "objective/kl", "response/length_mean")
    curve = lambda out: [x[k] for x in read_metrics(out) if "objective/scores" in x for k in keys]  # noqa: E731
    assert len(curve(two)) == 3 * len(keys) and curve(two) == pytest.approx(curve(one), abs=1e-6)
    assert_same_weights(two, one)


def test_killing_one_nodes_launcher_ends_the_other_and_the_rerun_resumes(task_data, tmp_path):
    straight = tmp_path / "straight"
    torchrun([*sft_args(task_data, straight), *FSDP])
    out = tmp_path / "killed"
    args = [*sft_args(task_data, out), *FSDP]
    procs = two_nodes(args, env={"RLHFKIT_TEST_SLOW_AFTER": "4", "RLHFKIT_TEST_PAUSE": "0.5"})
    deadline = time.time() + 300
    while not (out / "checkpoint-4" / "state.json").is_file() or max(losses(out), default=0) < 5:
        assert all(p.poll() is None for p in procs), finish(procs)
        assert time.time() < deadline
        time.sleep(0.1)
    os.killpg(procs[1].pid, signal.SIGKILL)  # node 1's launcher; its worker dies with it (PR_SET_PDEATHSIG)
    killed = time.time()
    code, text = finish(procs[:1])[0]
    ended_in = time.time() - killed
    assert code != 0 and ended_in < 45, (ended_in, text[-3000:])
    assert "error: rank 0: another process of the run ended" in text  # one line from the surviving rank
    assert not (out / "model.safetensors").exists()
    assert "failed: " in (out / "report.html").read_text()  # rank 0 wrote the report, the cause at its top
    results = finish(two_nodes(args))  # the same two commands again: resumed from checkpoint-4
    assert [c for c, _ in results] == [0, 0], results[0][1][-3000:]
    assert "resumed from" in results[0][1]
    assert_same_weights(out, straight)
    assert losses(out) == losses(straight)
