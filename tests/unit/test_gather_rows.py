"""gather_rows across 2 gloo processes with different row counts (0 included): what RM and preference evaluation
gather when eval batches do not split evenly over processes (gather_for_metrics crashes there)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, counts: list[int], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(len(counts)))
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from rlhfkit.train.common import gather_rows

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
    mp.spawn(_worker, args=(_free_port(), counts, out), nprocs=2, join=True)
    expected = torch.cat([torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 100 * r
                          for r, n in enumerate(counts)])
    assert torch.equal(torch.load(out), expected)
