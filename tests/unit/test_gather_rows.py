"""Across 2 gloo processes: gather_rows with different row counts (0 included), what RM and preference evaluation
gather when eval batches do not split evenly over processes (gather_for_metrics crashes there); and
reduce_metrics, which makes an online step's scalar metrics one value per key on every process."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from conftest import free_port


def _worker(rank: int, port: int, counts: list[int], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(len(counts)))
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from rlhfkit.train.shared.batches import gather_rows

    AcceleratorState._reset_state()
    acc = Accelerator(cpu=True)
    n = counts[rank]
    rows = torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 100 * rank
    got = gather_rows(acc, rows)
    if rank == 0:
        torch.save(got, out)
    acc.wait_for_everyone()
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("counts", [[3, 1], [0, 2], [2, 0]])
def test_gather_rows_takes_uneven_and_empty_shares(tmp_path, counts):
    out = str(tmp_path / "rows.pt")
    mp.spawn(_worker, args=(free_port(), counts, out), nprocs=2, join=True)
    expected = torch.cat([torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 100 * r
                          for r, n in enumerate(counts)])
    assert torch.equal(torch.load(out), expected)


METRICS = [  # rank 0, rank 1: a mean, a count, a max, a min, a key only rank 1 has, a value already the same,
    # a phase time (the slowest process's) and a throughput (the processes' sum)
    {"objective/kl": 1.0, "rewards/dropped": 2.0, "rollout/logprob_diff_max": 0.5, "x_min": -1.0, "same": 7.0,
     "time/rollout": 2.0, "throughput/tokens_per_s": 10.0, "text": "kept as is"},
    {"objective/kl": 4.0, "rewards/dropped": 3.0, "rollout/logprob_diff_max": 0.25, "x_min": -3.0, "same": 7.0,
     "time/rollout": 3.5, "throughput/tokens_per_s": 6.0, "env/only_here": 9.0, "text": "other"},
]


def _reduce_worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from rlhfkit.train.shared.batches import reduce_metrics

    AcceleratorState._reset_state()
    acc = Accelerator(cpu=True)
    got = reduce_metrics(acc, METRICS[rank])
    torch.save(got, f"{out}.{rank}")
    acc.wait_for_everyone()
    torch.distributed.destroy_process_group()


def test_reduce_metrics_gives_every_process_the_global_values(tmp_path):
    out = str(tmp_path / "metrics")
    mp.spawn(_reduce_worker, args=(free_port(), out), nprocs=2, join=True)
    r0, r1 = torch.load(f"{out}.0"), torch.load(f"{out}.1")
    want = {"objective/kl": 2.5, "rewards/dropped": 5.0, "rollout/logprob_diff_max": 0.5, "x_min": -3.0, "same": 7.0,
            "env/only_here": 9.0, "time/rollout": 3.5, "throughput/tokens_per_s": 16.0}
    for got, text in ((r0, "kept as is"), (r1, "other")):
        assert {k: v for k, v in got.items() if k != "text"} == want
        assert got["text"] == text  # not a number: left to the process


def test_reduce_metrics_on_one_process_is_the_identity():
    from types import SimpleNamespace

    from rlhfkit.train.shared.batches import reduce_metrics

    metrics = dict(METRICS[0])
    assert reduce_metrics(SimpleNamespace(num_processes=1), metrics) is metrics
