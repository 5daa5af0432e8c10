"""The loop runs unchanged on two processes (DDP over gloo on CPU, launched by torchrun): both ranks train, the
parameters stay identical on every rank, rank 0 alone writes the model and the metrics, and resuming from a
checkpoint written by two processes gives the run that never stopped.

``accelerate launch --num_processes 2 --cpu`` starts one process with accelerate 1.15, hence torchrun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port
from safetensors.torch import load_file

from rlhfkit.track.metrics import read_run_metrics as read_metrics  # rlhfkit's names (the run writes TRL's)

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("ddp_sft_script.py")
UPDATES = 6
# per update: 2 ranks x 2 accumulated micro-batches of 4 = 16 examples; checkpoint at update 3
SETTINGS = ["data.limit=300", "train.batch_size=4", "train.grad_accum=2", f"train.max_steps={UPDATES}",
            "train.save_every=3", "train.eval_every=3"]


@pytest.fixture(scope="module")
def ddp_run(task_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "run"
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(SCRIPT), str(out), str(task_data / "sft.jsonl"), *SETTINGS, "--resume-from-first-checkpoint"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # gloo on CPU, even beside a GPU
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return out


def ranks(out: Path) -> list[dict]:
    return [json.loads((out / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]


def test_both_ranks_ran_in_a_world_of_two(ddp_run):
    records = ranks(ddp_run)
    assert [(r["rank"], r["world_size"]) for r in records] == [(0, 2), (1, 2)]
    assert records[0]["pid"] != records[1]["pid"]


def test_parameters_are_identical_across_ranks(ddp_run):
    r0, r1 = ranks(ddp_run)
    assert r0["straight"] == r1["straight"]  # sha256 of every parameter: gradients were all-reduced
    assert r0["resumed"] == r1["resumed"]
    # and what rank 0 saved is what the ranks hold
    saved = load_file(ddp_run / "model.safetensors")
    assert abs(sum(float(t.double().abs().sum()) for t in saved.values()) - r0["straight"]["abs_sum"]) < 1e-6 * \
        r0["straight"]["abs_sum"]


def test_rank_zero_alone_writes_the_model_and_the_metrics(ddp_run):
    assert sorted(p.name for p in ddp_run.glob("saved-by-rank-*")) == ["saved-by-rank-0"]
    assert (ddp_run / "model.safetensors").is_file() and (ddp_run / "config.yaml").is_file()
    lines = read_metrics(ddp_run)
    assert [x["step"] for x in lines] == list(range(UPDATES + 1))  # one writer: one line per step
    assert [x["step"] for x in lines if "train/loss" in x] == list(range(1, UPDATES + 1))
    assert [x["step"] for x in lines if "eval/loss" in x] == [0, 3, 6]
    assert lines[-1]["eval/loss"] < lines[0]["eval/loss"]  # it learned something


def test_resume_under_ddp_matches_the_straight_run(ddp_run):
    r0, _ = ranks(ddp_run)
    assert r0["resumed_from"] == "checkpoint-3"
    ckpt = ddp_run / "checkpoint-3"
    assert sorted(p.name for p in ckpt.iterdir()) == ["manifest.json", "rng_state_0.pt", "rng_state_1.pt",
                                                      "state.json", "trainer_state.pt"]
    assert json.loads((ckpt / "state.json").read_text())["micro"] == 6  # 3 updates x 2 micro-batches per rank
    assert r0["resumed"] == r0["straight"]  # bit for bit
    straight = {x["step"]: x["train/loss"] for x in read_metrics(ddp_run) if "train/loss" in x}
    resumed = {x["step"]: x["train/loss"] for x in read_metrics(ddp_run / "resumed") if "train/loss" in x}
    assert resumed == pytest.approx({k: v for k, v in straight.items() if k > 3}, abs=1e-6)
