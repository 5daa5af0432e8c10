"""SFT on the tiny model, launched by the end-to-end tests: under ``torchrun --nproc_per_node 2`` (DDP over gloo on
CPU) by test_ddp.py, and as one plain process that gets SIGKILLed by test_resume.py.

    python tests/e2e/ddp_sft_script.py OUT_DIR SFT_JSONL [key=value ...] [--resume-from-first-checkpoint]

Every process writes ``OUT_DIR/ranks/rank-<r>.json``: world size, rank and a checksum of its final parameters (the
test compares them across ranks). ``--resume-from-first-checkpoint``: after the run, run again into
``OUT_DIR/resumed`` starting from the oldest checkpoint of the first run, and record that run's checksum too.
``RLHFKIT_TEST_SLOW_AFTER=N`` (environment) sleeps 0.3 s after every optimizer update past update N, so a test has
time to kill the process between a checkpoint and the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from launched import slow_updates  # offline settings too

TINY = "tiny:hidden=64,layers=2,intermediate=128"


def checksum(model) -> dict:
    digest = hashlib.sha256()
    total = 0.0
    for name, p in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        total += float(p.detach().double().abs().sum())
    return {"sha256": digest.hexdigest(), "abs_sum": total}


def main(argv: list[str]) -> None:
    import torch
    from accelerate import PartialState

    import rlhfkit.train.supervised.sft as sft
    from rlhfkit.config import build_config
    from rlhfkit.train.lifecycle.checkpoint import list_checkpoints

    also_resume = "--resume-from-first-checkpoint" in argv
    out, data, *overrides = [a for a in argv if a != "--resume-from-first-checkpoint"]
    out = Path(out)

    # capture the trained model of each run, and who wrote the model directory
    jobs, real_train, real_save = [], sft.train_supervised, sft.save_model

    def train_supervised(run, job):
        jobs.append(job)
        return real_train(run, job)

    def save_model(model, tok, out_dir):
        (Path(out_dir) / f"saved-by-rank-{PartialState().process_index}").write_text("")
        return real_save(model, tok, out_dir)

    sft.train_supervised, sft.save_model = train_supervised, save_model

    slow_updates(0.3)

    base = [f"data.train={data}", f"model.name={TINY}", "optim.lr=5e-3", "track.report=false",
            "data.max_length=64", *overrides]
    sft.run_sft(build_config("sft", {}, [f"output_dir={out}", *base]))

    state = PartialState()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    assert state.num_processes == world, (state.num_processes, world)  # really one process per rank
    assert state.use_distributed == (world > 1)
    record = {"world_size": state.num_processes, "rank": state.process_index, "pid": os.getpid(),
              "torch_threads": torch.get_num_threads(), "straight": checksum(jobs[0].model)}

    if also_resume:
        first = min(list_checkpoints(out))[1]
        sft.run_sft(build_config("sft", {}, [f"output_dir={out / 'resumed'}", f"train.resume={first}", *base]))
        record["resumed"] = checksum(jobs[1].model)
        record["resumed_from"] = first.name

    ranks = out / "ranks"
    ranks.mkdir(exist_ok=True)
    (ranks / f"rank-{state.process_index}.json").write_text(json.dumps(record))
    state.wait_for_everyone()
    if state.use_distributed:
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
