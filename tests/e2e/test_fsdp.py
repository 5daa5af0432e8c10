"""FSDP2 (``distributed.strategy=fsdp2``) on two CPU processes (gloo, launched by torchrun) with the tiny model:

- SFT and DPO loss curves match the single-process run at equal global batch (2 x 4 vs 1 x 8);
- GRPO under FSDP2 matches GRPO under DDP with the same seeds, and its rollouts run on weights gathered once per
  rollout phase (no parameter all-gather inside it, while the run does gather), with ``generation.engine=auto`` (the
  default) and ``static`` (the same rollouts: auto is static on CPU); PPO shards policy and critic;
- each process holds half of the parameters; the final directory loads with plain transformers;
- SIGKILL after a sharded checkpoint, then the same command again, gives the final weights of the run that never
  stopped.

Several runs share one torchrun launch (tests/e2e/fsdp_script.py) to pay the start-up once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import free_port
from safetensors.torch import load_file

from rlhfkit.config import RECIPES, build_config
from rlhfkit.track.metrics import read_run_metrics as read_metrics  # rlhfkit's names (the run writes TRL's)

pytestmark = [pytest.mark.slow, pytest.mark.cluster]  # two processes with FSDP2: make test-cluster (CI)

SCRIPT = Path(__file__).with_name("fsdp_script.py")
TINY = "tiny:hidden=64,layers=2,intermediate=128"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # gloo on CPU, even beside a GPU


def sft_args(data: Path, out: Path, batch: int, *extra) -> list[str]:
    return [f"data.train={data / 'sft.jsonl'}", f"output_dir={out}", f"model.name={TINY}", "optim.lr=5e-3",
            f"train.batch_size={batch}", "train.max_steps=6", "train.save_every=3", "train.eval_every=3",
            "data.limit=300", "track.report=false", "data.max_length=64", "train.resume=auto", *extra]


def dpo_args(data: Path, out: Path, batch: int, *extra) -> list[str]:
    return [f"data.train={data / 'preference.jsonl'}", f"output_dir={out}", f"model.name={TINY}", "optim.lr=1e-3",
            f"train.batch_size={batch}", "train.max_steps=5", "data.limit=200", "track.report=false",
            "data.max_length=64", "train.resume=never", *extra]


def grpo_args(data: Path, out: Path, *extra) -> list[str]:
    return [f"data.train={data / 'prompts.jsonl'}", f"output_dir={out}", f"model.name={TINY}", "optim.lr=1e-3",
            "train.batch_size=8", "generation.max_new_tokens=8", "track.report=false", "data.max_length=64",
            "track.sample_every=0", "reward.functions=[{fn: 'rlhfkit.tasks.quickstart:reward'}]",
            "algo.rollout_batch_size=4", "algo.num_generations=4", "algo.mini_batch_size=16",
            "algo.total_episodes=96", "data.limit=200", "train.resume=never",
            "algo.ppo_epochs=2", *extra]  # 2 passes: each step then runs the old-policy pass these tests count


def launch(jobs: list[dict], tmp: Path, env=None, wait=True):
    spec = tmp / f"jobs-{len(list(tmp.glob('jobs-*')))}.json"
    spec.write_text(json.dumps(jobs))
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(SCRIPT), str(spec)]
    if not wait:
        return subprocess.Popen(cmd, env={**ENV, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    proc = subprocess.run(cmd, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def runs(task_data, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fsdp")
    fsdp = ["distributed.strategy=fsdp2"]
    launch([
        {"name": "sft", "recipe": "sft", "overrides": sft_args(task_data, root / "sft", 4, *fsdp)},
        {"name": "dpo", "recipe": "dpo", "overrides": dpo_args(task_data, root / "dpo", 4, *fsdp)},
        {"name": "grpo", "recipe": "grpo", "overrides": grpo_args(task_data, root / "grpo", *fsdp)},
        {"name": "grpo-ddp", "recipe": "grpo", "overrides": grpo_args(task_data, root / "grpo-ddp")},
        {"name": "grpo-static", "recipe": "grpo", "overrides": grpo_args(
            task_data, root / "grpo-static", *fsdp, "generation.engine=static",
            "generation.engine_kwargs={compile: false}")},
        {"name": "dapo", "recipe": "grpo", "overrides": grpo_args(
            task_data, root / "dapo", *fsdp, "algo.dynamic_sampling.enabled=true", "algo.dynamic_sampling.max_draws=3",
            f"reward.functions=[{{fn: '{Path(__file__).with_name('rank_reward.py')}:ties_on_rank0'}}]",
            "reward.workers=0", "algo.total_episodes=64", "distributed.timeout_s=120")},
        {"name": "ppo", "recipe": "ppo", "overrides": grpo_args(
            task_data, root / "ppo", *fsdp, "algo.advantage=gae", "algo.num_generations=1", "algo.rollout_batch_size=8",
            "algo.mini_batch_size=8", "critic.init=policy", "algo.total_episodes=32",
            "memory.forward_tokens=24")},  # a few rows per no-grad forward: each process runs its own number of them
    ], root)
    # the single-process runs at the same global batch (1 x 8 = 2 x 4)
    RECIPES["sft"].run(build_config("sft", {}, sft_args(task_data, root / "sft-1", 8, "train.save_every=0")))
    RECIPES["dpo"].run(build_config("dpo", {}, dpo_args(task_data, root / "dpo-1", 8)))
    return root


def alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def ranks(out: Path) -> list[dict]:
    return [json.loads((out / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]


def curve(out: Path, key: str) -> list[float]:
    return [x[key] for x in read_metrics(out) if key in x]


@pytest.mark.parametrize("recipe", ["sft", "dpo"])
def test_loss_curve_matches_the_single_process_run(runs, recipe):
    sharded, single = curve(runs / recipe, "train/loss"), curve(runs / f"{recipe}-1", "train/loss")
    assert len(sharded) == len(single) >= 5
    # the same examples per update; the per-rank token means are averaged instead of one mean over both ranks'
    # tokens, hence a tolerance rather than equality
    assert sharded == pytest.approx(single, rel=0.02), (sharded, single)
    assert sharded[-1] < sharded[0]


def test_grpo_under_fsdp2_matches_ddp_with_the_same_seeds(runs):
    fsdp, ddp = read_metrics(runs / "grpo"), read_metrics(runs / "grpo-ddp")
    keys = ("objective/scores", "loss/policy_avg", "objective/kl", "response/length_mean")
    first = [{k: x[k] for k in keys} for x in fsdp if "objective/scores" in x]
    other = [{k: x[k] for k in keys} for x in ddp if "objective/scores" in x]
    assert len(first) == len(other) == 3
    # step 1 samples from identical weights with identical seeds: the same rollouts
    assert first[0] == pytest.approx(other[0], rel=1e-4, abs=1e-6)
    for a, b in zip(first, other):
        assert a["objective/scores"] == pytest.approx(b["objective/scores"], abs=0.15)


def test_dynamic_sampling_draws_a_different_number_of_times_per_process_under_one_gather(runs):
    # rank 0's groups all tie (it draws 3 times a step), rank 1's mostly differ: a gather per draw would pair
    # different draws across the processes (a hang until distributed.timeout_s); one gather around the draws does not
    draws = [x["rollout/dynamic_draws"] for x in read_metrics(runs / "dapo") if "rollout/dynamic_draws" in x]
    assert draws == [2.0, 2.0]  # the mean over the processes of rank 0's 3 draws a step and rank 1's 1
    for r in ranks(runs / "dapo"):
        assert r["all_gathers_inside_rollouts"] and all(n == 0 for n in r["all_gathers_inside_rollouts"])


def test_ppo_shards_policy_and_critic(runs):
    for r in ranks(runs / "ppo"):
        assert r["local_fractions"] == pytest.approx([0.5, 0.5], abs=0.02)  # policy, then critic (scalar head)
        # 2 steps x (rollout, old-policy pass, value pass: each gathered once) + the final evaluation, none of them
        # gathering again inside (each process runs its own number of forwards there: memory.forward_tokens=24)
        assert r["all_gathers_inside_rollouts"] == [0] * 7
    rows = [x for x in read_metrics(runs / "ppo") if "loss/value_avg" in x]
    assert len(rows) == 2 and all(torch.isfinite(torch.tensor(x["loss/value_avg"])) for x in rows)


def test_parameters_are_sharded_and_rollouts_gather_once(runs):
    for name in ("sft", "dpo", "grpo"):
        r0, r1 = ranks(runs / name)
        assert (r0["world_size"], r1["world_size"]) == (2, 2)
        assert r0["local_fraction"] == pytest.approx(0.5, abs=0.02) and r1["local_fraction"] == pytest.approx(0.5,
                                                                                                            abs=0.02)
    for r in ranks(runs / "grpo") + ranks(runs / "grpo-static"):
        assert r["all_gathers"] > 0  # the counter sees FSDP's gathers ...
        # 3 steps x (rollout, old-policy pass) + the final evaluation: each gathered once, none again inside
        assert r["all_gathers_inside_rollouts"] == [0] * 7


def test_static_engine_under_fsdp2_gives_autos_rollouts(runs):
    keys = ("objective/scores", "response/length_mean", "rollout/logprob_diff_max")
    auto, static = ([{k: x[k] for k in keys} for x in read_metrics(runs / name) if "objective/scores" in x]
                    for name in ("grpo", "grpo-static"))
    assert len(auto) == len(static) == 3
    assert auto[0] == static[0]  # auto is the uncompiled static engine on CPU: the same first rollout
    assert all(x["rollout/logprob_diff_max"] < 1e-4 for x in auto + static)  # on the gathered weights


@pytest.mark.parametrize("name", ["sft", "grpo"])
def test_final_directory_loads_with_plain_transformers(runs, name):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(runs / name)
    tok = AutoTokenizer.from_pretrained(runs / name)
    assert sum(p.numel() for p in model.parameters()) == sum(t.numel() for k, t in
                                                             load_file(runs / name / "model.safetensors").items())
    ids = tok("hello", return_tensors="pt").input_ids
    assert torch.isfinite(model(ids).logits).all()


def test_sharded_checkpoint_holds_shards_of_every_process(runs):
    ckpt = runs / "sft" / "checkpoint-3"
    assert sorted(p.name for p in ckpt.iterdir()) == ["manifest.json", "rng_state_0.pt", "rng_state_1.pt", "sharded",
                                                      "state.json", "trainer_state.pt"]
    assert sorted(p.name for p in (ckpt / "sharded").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    files = json.loads((ckpt / "manifest.json").read_text())["files"]  # every shard checked on resume
    assert {"sharded/.metadata", "sharded/__0_0.distcp", "sharded/__1_0.distcp"} <= set(files)


def test_sigkill_then_resume_gives_the_same_final_weights(runs, task_data):
    out = runs / "killed"
    job = [{"name": "sft", "recipe": "sft", "overrides": sft_args(task_data, out, 4, "distributed.strategy=fsdp2")}]
    proc = launch(job, runs, env={"RLHFKIT_TEST_SLOW_AFTER": "3"}, wait=False)
    deadline = time.time() + 300
    while not (out / "checkpoint-3" / "state.json").is_file():
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() < deadline
        time.sleep(0.2)
    workers = [int(x) for x in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    assert len(workers) >= 2
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher only: torchrun starts each worker in a session of its own
    proc.wait()
    deadline = time.time() + 30
    while any(alive(w) for w in workers):
        assert time.time() < deadline, "workers outlived their killed launcher"
        time.sleep(0.2)
    assert not (out / "model.safetensors").exists()  # killed before the end
    launch(job, runs)  # the same command again: resume=auto finds checkpoint-3
    resumed, straight = load_file(out / "model.safetensors"), load_file(runs / "sft" / "model.safetensors")
    assert resumed.keys() == straight.keys()
    for k in straight:
        torch.testing.assert_close(resumed[k], straight[k], rtol=0, atol=1e-6)
    assert curve(out, "train/loss")[-3:] == pytest.approx(curve(runs / "sft", "train/loss")[-3:], abs=1e-6)
