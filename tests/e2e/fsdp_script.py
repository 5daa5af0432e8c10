"""Recipes under ``distributed.strategy`` on the tiny model, launched by tests/e2e/test_fsdp.py (``torchrun
--nproc_per_node 2``: FSDP2 over gloo on CPU) — several runs in one launch, to pay the start-up once:

    python tests/e2e/fsdp_script.py JOBS_JSON

``JOBS_JSON``: a list of ``{"name", "recipe", "overrides": [...]}``. Every process writes
``<output_dir>/ranks/rank-<r>.json`` per job: world size, rank, the fraction of the trained model's parameter
elements it holds after sharding, and (online recipes) the parameter all-gathers counted inside each block that
gathered the full weights once (a rollout, a no-grad forward pass: none inside) against all the all-gathers of the
run (the counter works).
``RLHFKIT_TEST_SLOW_AFTER=N`` sleeps 0.5 s after every optimizer update past update N (a test kills the run then).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from launched import slow_updates  # offline settings too


def main(jobs: list[dict]) -> None:
    import torch.distributed as dist
    from accelerate import PartialState

    from rlhfkit.config import RECIPES, build_config
    from rlhfkit.train.lifecycle import distributed as D

    record: dict = {}
    gathers = {"all": 0, "inside_rollouts": []}
    # FSDP2 gathers parameters with dist.all_gather_single (torch 2.13) or all_gather_into_tensor (older)
    def counted(real):
        def counting(*args, **kwargs):
            gathers["all"] += 1
            return real(*args, **kwargs)

        return counting

    for name in ("all_gather_single", "all_gather_into_tensor"):
        if hasattr(dist, name):
            setattr(dist, name, counted(getattr(dist, name)))

    real_wrap, real_gathered = D.FSDP2Strategy.wrap, D.FSDP2Strategy.gathered

    def wrap(self, model, cfg, device):
        model = real_wrap(self, model, cfg, device)
        record.setdefault("local_fraction", D.local_param_fraction(model))  # the policy (first wrapped)
        record.setdefault("local_fractions", []).append(D.local_param_fraction(model))  # + the critic
        return model

    @contextlib.contextmanager
    def gathered(self, model):
        with real_gathered(self, model):
            before = gathers["all"]
            yield model
            gathers["inside_rollouts"].append(gathers["all"] - before)

    D.FSDP2Strategy.wrap, D.FSDP2Strategy.gathered = wrap, gathered

    slow_updates(0.5)

    for job in jobs:
        record.clear()
        gathers["all"], gathers["inside_rollouts"] = 0, []
        cfg = build_config(job["recipe"], {}, job["overrides"])
        RECIPES[job["recipe"]].run(cfg)
        state = PartialState()
        out = Path(cfg.output_dir) / "ranks"
        out.mkdir(exist_ok=True)
        record.update({"world_size": state.num_processes, "rank": state.process_index,
                       "all_gathers": gathers["all"], "all_gathers_inside_rollouts": gathers["inside_rollouts"]})
        (out / f"rank-{state.process_index}.json").write_text(json.dumps(record))
        state.wait_for_everyone()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
