"""Across 2 gloo processes: gather_rows with different row counts (0 included), what RM and preference evaluation
gather when eval batches do not split evenly over processes (gather_for_metrics crashes there); and
reduce_metrics, which makes an online step's scalar metrics one value per key on every process."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from conftest import free_port

COUNTS = [[3, 1], [0, 2], [2, 0]]
METRICS = [  # rank 0, rank 1: a mean, a count, a max, a min, a key only rank 1 has, a value already the same,
    # a phase time (the slowest process's) and a throughput (the processes' sum)
    {"objective/kl": 1.0, "rewards/dropped": 2.0, "rollout/logprob_diff_max": 0.5, "x_min": -1.0, "same": 7.0,
     "time/rollout": 2.0, "throughput/tokens_per_s": 10.0, "text": "kept as is"},
    {"objective/kl": 4.0, "rewards/dropped": 3.0, "rollout/logprob_diff_max": 0.25, "x_min": -3.0, "same": 7.0,
     "time/rollout": 3.5, "throughput/tokens_per_s": 6.0, "env/only_here": 9.0, "text": "other"},
]


def _worker(rank: int, port: int, out: str) -> None:
    """Every case in one process group (a group's start costs seconds): each of COUNTS through gather_rows, then
    reduce_metrics on METRICS."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from rlhfkit.train.shared.batches import gather_rows, reduce_metrics

    AcceleratorState._reset_state()
    acc = Accelerator(cpu=True)
    gathered = []
    for counts in COUNTS:
        n = counts[rank]
        rows = torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 100 * rank
        gathered.append(gather_rows(acc, rows))
    torch.save({"gathered": gathered, "metrics": reduce_metrics(acc, METRICS[rank])}, f"{out}.{rank}")
    acc.wait_for_everyone()
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("gather") / "result")
    mp.spawn(_worker, args=(free_port(), out), nprocs=2, join=True)
    return torch.load(f"{out}.0"), torch.load(f"{out}.1")


@pytest.mark.parametrize("case", range(len(COUNTS)), ids=[str(c) for c in COUNTS])
def test_gather_rows_takes_uneven_and_empty_shares(two_processes, case):
    counts = COUNTS[case]
    expected = torch.cat([torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 100 * r
                          for r, n in enumerate(counts)])
    for rank in (0, 1):  # every process gets every row, in rank order
        assert torch.equal(two_processes[rank]["gathered"][case], expected)


def test_reduce_metrics_gives_every_process_the_global_values(two_processes):
    want = {"objective/kl": 2.5, "rewards/dropped": 5.0, "rollout/logprob_diff_max": 0.5, "x_min": -3.0, "same": 7.0,
            "env/only_here": 9.0, "time/rollout": 3.5, "throughput/tokens_per_s": 16.0}
    for result, text in ((two_processes[0], "kept as is"), (two_processes[1], "other")):
        got = result["metrics"]
        assert {k: v for k, v in got.items() if k != "text"} == want
        assert got["text"] == text  # not a number: left to the process


def test_reduce_metrics_on_one_process_is_the_identity():
    from types import SimpleNamespace

    from rlhfkit.train.shared.batches import reduce_metrics

    metrics = dict(METRICS[0])
    assert reduce_metrics(SimpleNamespace(num_processes=1), metrics) is metrics
