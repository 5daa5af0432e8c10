"""The training loop's pieces: LR schedule (hand values), batch planning, optimizer groups, checkpoints, and the
supervised loop itself on a two-layer torch model (no transformers, so every test here takes well under a second)."""

from __future__ import annotations

import copy
import json
import math
import random

import numpy as np
import pytest
import torch

from rlhfkit.config import OptimConfig, build_config
from rlhfkit.errors import ConfigError
from rlhfkit.track.metrics import read_run_metrics as read_metrics  # rlhfkit's names (the run writes TRL's)
from rlhfkit.train.lifecycle.checkpoint import Checkpointer, list_checkpoints
from rlhfkit.train.lifecycle.optim import build_optimizer, build_scheduler, lr_lambda
from rlhfkit.train.lifecycle.run import start_run
from rlhfkit.train.shared.batches import plan_batches
from rlhfkit.train.supervised.loop import SupervisedJob, total_updates, train_supervised

# ───────────────────────────────────────────── learning-rate schedule ───────────────────────────────────────────


@pytest.mark.parametrize("schedule", ["linear", "cosine", "constant"])
def test_warmup_is_linear_from_one_step(schedule):
    # warm-up 2 of 10 updates: the first update runs at 1/2 of the peak, the second at the peak
    fn = lr_lambda(schedule, warmup=2, total=10)
    assert fn(0) == pytest.approx(0.5)
    assert fn(1) == pytest.approx(1.0)
    assert fn(2) == pytest.approx(1.0)  # decay starts from the peak


def test_linear_decay_hand_values():
    fn = lr_lambda("linear", warmup=2, total=10)
    # after warm-up: 1 - (step - 2) / (10 - 2)
    assert fn(3) == pytest.approx(1 - 1 / 8)
    assert fn(6) == pytest.approx(1 - 4 / 8)  # 0.5
    assert fn(9) == pytest.approx(1 - 7 / 8)  # the last update still learns
    assert fn(10) == 0.0
    assert fn(15) == 0.0  # clamped past the end, never negative


def test_cosine_decay_hand_values():
    fn = lr_lambda("cosine", warmup=2, total=10)
    # after warm-up: 0.5 * (1 + cos(pi * (step - 2) / 8))
    assert fn(4) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.25)))  # 0.8536
    assert fn(6) == pytest.approx(0.5)  # 0.5 * (1 + cos(pi / 2))
    assert fn(10) == pytest.approx(0.0)
    assert fn(15) == pytest.approx(0.0)


def test_constant_and_no_warmup():
    const = lr_lambda("constant", warmup=0, total=10)
    assert [const(s) for s in (0, 5, 10, 20)] == [1.0, 1.0, 1.0, 1.0]
    lin = lr_lambda("linear", warmup=0, total=10)
    assert lin(0) == 1.0 and lin(5) == pytest.approx(0.5)


def test_build_scheduler_warmup_steps_win_over_ratio():
    def warm(**kw):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = build_scheduler(opt, OptimConfig(lr=1.0, **kw), total_updates=10)
        lrs = [opt.param_groups[0]["lr"]]
        for _ in range(3):
            opt.step()
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        return lrs

    assert warm(warmup_ratio=0.2) == pytest.approx([0.5, 1.0, 1.0, 1 - 1 / 8])  # 0.2 * 10 = 2 warm-up updates
    assert warm(warmup_ratio=0.2, warmup_steps=4) == pytest.approx([0.25, 0.5, 0.75, 1.0])


# ──────────────────────────────────────────────── batch planning ───────────────────────────────────────────────


def test_plan_batches_is_seeded_and_deterministic():
    a = plan_batches(50, 4, world=1, seed=3, epoch=0, rank=0)
    assert a == plan_batches(50, 4, world=1, seed=3, epoch=0, rank=0)
    assert a != plan_batches(50, 4, world=1, seed=4, epoch=0, rank=0)  # another seed, another order
    assert a != plan_batches(50, 4, world=1, seed=3, epoch=1, rank=0)  # a new order every epoch
    assert a[0] != [0, 1, 2, 3]  # shuffled


def test_plan_batches_ranks_are_disjoint_and_cover_each_global_batch():
    n, micro, world = 50, 4, 3  # global batch 12: 4 full batches (48 items), a tail of 2 dropped
    plans = [plan_batches(n, micro, world, seed=0, epoch=0, rank=r) for r in range(world)]
    assert all(len(p) == 4 and all(len(b) == micro for b in p) for p in plans)
    single = plan_batches(n, micro * world, 1, seed=0, epoch=0, rank=0)  # one process, the same global batches
    for b in range(4):
        parts = [plans[r][b] for r in range(world)]
        union = [i for part in parts for i in part]
        assert len(set(union)) == micro * world  # disjoint across ranks
        assert union == single[b]  # together they are exactly the global batch
    seen = [i for b in single for i in b]
    assert len(seen) == 48 and len(set(seen)) == 48  # the tail (2 items) is dropped, nothing repeats


def test_total_updates():
    cfg = build_config("sft", {}, ["train.batch_size=16", "train.epochs=2", "train.grad_accum=2"])
    assert total_updates(cfg, 1900, world=2) == (59, 59)  # 1900 // 32 = 59 micro-batches per epoch; 2 * 59 // 2
    cfg = build_config("sft", {}, ["train.batch_size=16", "train.max_steps=7"])
    assert total_updates(cfg, 1900, world=1) == (7, 118)
    with pytest.raises(ConfigError, match="train.batch_size"):
        total_updates(cfg, 20, world=2)


# ─────────────────────────────────────────────────── optimizer ──────────────────────────────────────────────────


class Tiny(torch.nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(5, 4)
        self.lin = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 1)
        self.frozen = torch.nn.Linear(4, 4)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.head(self.norm(torch.tanh(self.lin(x)))).squeeze(-1)


def test_build_optimizer_no_decay_on_1d_params():
    model = Tiny()
    opt = build_optimizer(model.parameters(), OptimConfig(lr=1e-3, weight_decay=0.1))
    decay, no_decay = opt.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert sorted(names[id(p)] for p in decay["params"]) == ["emb.weight", "head.weight", "lin.weight"]
    assert sorted(names[id(p)] for p in no_decay["params"]) == ["head.bias", "lin.bias", "norm.bias", "norm.weight"]
    assert all(g["lr"] == 1e-3 for g in opt.param_groups)  # frozen.* is in neither group


def test_build_optimizer_needs_trainable_params():
    model = Tiny()
    model.requires_grad_(False)
    with pytest.raises(ConfigError, match="no trainable parameters"):
        build_optimizer(model.parameters(), OptimConfig())


# ───────────────────────────────────────────────── checkpoints ─────────────────────────────────────────────────


@pytest.fixture()
def run(tmp_path):
    return start_run(build_config("sft", {}, [f"output_dir={tmp_path / 'run'}"]))


def _train(model, opt, sched, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(8, 4)  # draws from the global RNG, so the RNG state matters for the result
        loss = (model(x) - x.sum(-1)).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def _fresh(seed: int):
    model = Tiny(seed)
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1, warmup_steps=2)
    opt = build_optimizer(model.parameters(), cfg)
    return model, opt, build_scheduler(opt, cfg, total_updates=20)


def _parts(model, opt, sched):
    return {"models": {"m": model}, "optimizers": {"m": opt}, "schedulers": {"m": sched}}


def test_checkpoint_round_trip_restores_weights_optimizer_schedule_and_rng(run):
    model, opt, sched = _fresh(seed=0)
    _train(model, opt, sched, 3)
    ckpt = Checkpointer(run, keep=2)
    path = ckpt.save(3, **_parts(model, opt, sched), state={"micro": 6, "extra": {"kl_coef": 0.5}})
    assert path == run.run_dir / "checkpoint-3" and not (run.run_dir / "checkpoint-3.tmp").exists()
    after_save = (torch.rand(4), random.random(), np.random.rand())
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = copy.deepcopy(opt.state_dict()["state"])
    _train(model, opt, sched, 2)  # the straight run goes on from the checkpoint
    straight = {k: v.clone() for k, v in model.state_dict().items()}

    # a new process: other initial weights, fresh optimizer / schedule, another RNG position
    model2, opt2, sched2 = _fresh(seed=1)
    torch.manual_seed(123)
    state = ckpt.load(ckpt.find("auto"), **_parts(model2, opt2, sched2))
    assert state == {"step": 3, "micro": 6, "extra": {"kl_coef": 0.5}}
    after_load = (torch.rand(4), random.random(), np.random.rand())
    assert torch.equal(after_load[0], after_save[0]) and after_load[1:] == after_save[1:]
    for k, v in model2.state_dict().items():
        if not k.startswith("frozen."):  # only trainable tensors are checkpointed
            assert torch.equal(v, saved[k]), k
    assert sched2.last_epoch == 3 and sched2.get_last_lr() == pytest.approx([1e-2 * (1 - 1 / 18)] * 2)
    loaded_opt = opt2.state_dict()["state"]
    assert loaded_opt.keys() == saved_opt.keys() and len(saved_opt) == 6  # emb gets no gradient, frozen.* none
    for i, moments in saved_opt.items():
        assert all(torch.equal(loaded_opt[i][m], moments[m]) for m in ("step", "exp_avg", "exp_avg_sq"))

    _train(model2, opt2, sched2, 2)  # the same draws and updates as the straight run after its checkpoint
    for k, v in model2.state_dict().items():
        if not k.startswith("frozen."):
            assert torch.equal(v, straight[k]), k  # resumed == straight, bit for bit


def test_checkpoint_holds_only_trainable_tensors_and_rank_rng(run):
    model, opt, sched = _fresh(seed=0)
    path = Checkpointer(run).save(1, **_parts(model, opt, sched), state={})
    payload = torch.load(path / "trainer_state.pt", weights_only=False)
    assert not any(k.startswith("frozen.") for k in payload["models"]["m"])
    assert "lin.weight" in payload["models"]["m"]
    assert (path / "rng_state_0.pt").is_file()
    assert json.loads((path / "state.json").read_text()) == {"step": 1}


def test_checkpoints_are_pruned_to_the_newest(run):
    model, opt, sched = _fresh(seed=0)
    ckpt = Checkpointer(run, keep=2)
    for step in range(1, 6):
        ckpt.save(step, **_parts(model, opt, sched), state={})
    assert sorted(s for s, _ in list_checkpoints(run.run_dir)) == [4, 5]
    assert sorted(p.name for p in run.run_dir.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-5"]


def test_find_ignores_half_written_checkpoints(run):
    model, opt, sched = _fresh(seed=0)
    ckpt = Checkpointer(run, keep=3)
    ckpt.save(2, **_parts(model, opt, sched), state={})
    # a crash while writing checkpoint-9 leaves checkpoint-9.tmp (even with its trainer_state.pt written)
    tmp = run.run_dir / "checkpoint-9.tmp"
    tmp.mkdir()
    torch.save({}, tmp / "trainer_state.pt")
    (run.run_dir / "checkpoint-7").mkdir()  # and a directory without trainer_state.pt is not a checkpoint
    assert ckpt.find("auto") == run.run_dir / "checkpoint-2"
    ckpt.save(3, **_parts(model, opt, sched), state={})
    assert ckpt.find("auto") == run.run_dir / "checkpoint-3"


def test_find_never_path_and_bad_path(run, tmp_path):
    model, opt, sched = _fresh(seed=0)
    ckpt = Checkpointer(run)
    assert ckpt.find("auto") is None  # nothing saved yet
    path = ckpt.save(4, **_parts(model, opt, sched), state={})
    assert ckpt.find("never") is None
    assert ckpt.find(str(path)) == path
    with pytest.raises(ConfigError, match="no checkpoint at") as err:
        ckpt.find(str(tmp_path / "nope"))
    assert err.value.where == "train.resume"


# ───────────────────────────────────────────── the supervised loop ─────────────────────────────────────────────


def _job(n: int = 64) -> SupervisedJob:
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(n, 4, generator=g)
    items = [{"x": x, "y": x.sum() + 0.1 * i / n} for i, x in enumerate(xs)]

    def collate(batch):
        return {"x": torch.stack([b["x"] for b in batch]), "y": torch.stack([b["y"] for b in batch])}

    def loss_fn(model, batch):
        err = model(batch["x"]) - batch["y"]
        return err.pow(2).mean(), {"mae": err.abs().mean().detach()}

    return SupervisedJob(name="toy", model=Tiny(seed=0), tokenizer=None, train_items=items, collate=collate,
                         loss_fn=loss_fn, show=("loss", "mae"))


def _run_toy(tmp_path, name: str, *overrides: str):
    cfg = build_config("sft", {}, [f"output_dir={tmp_path / name}", "optim.lr=1e-2", "optim.warmup_steps=2",
                                   "train.max_steps=6",
                                   "train.mixed_precision='no'", *overrides])  # fp32 on a GPU too: exact sums
    run = start_run(cfg)
    job = _job()
    last = train_supervised(run, job)
    return job, last, read_metrics(run.run_dir)


def test_scheduler_steps_once_per_update_and_accumulation_matches_a_big_batch(tmp_path):
    job, last, lines = _run_toy(tmp_path, "acc", "train.batch_size=4", "train.grad_accum=2")
    fn = lr_lambda("linear", warmup=2, total=6)
    logged = {x["step"]: x["lr"] for x in lines if "lr" in x}
    # update k ran at peak * fn(k - 1): the LR logged is the one the update used (TRL's learning_rate)
    assert logged == pytest.approx({k: 1e-2 * fn(k - 1) for k in range(1, 7)})
    assert [x["step"] for x in lines if "train/loss" in x] == [1, 2, 3, 4, 5, 6]
    assert set(lines[-1]) >= {"train/loss", "train/mae", "train/grad_norm", "lr", "epoch"}
    assert last["epoch"] == pytest.approx(12 / 16)  # 6 updates x 2 micro-batches of 4, 16 per epoch

    # the same 8 examples per update in one micro-batch of 8: the same gradients, the same weights
    big, _, _ = _run_toy(tmp_path, "big", "train.batch_size=8", "train.grad_accum=1")
    for (name, a), b in zip(job.model.state_dict().items(), big.model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_toy_resume_matches_straight_run(tmp_path, monkeypatch):
    straight, _, straight_lines = _run_toy(tmp_path, "straight", "train.batch_size=8", "train.save_every=2")

    import rlhfkit.train.supervised.loop as loop

    real, calls = loop.clip_and_step, []

    def crash_on_update_5(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt  # dies inside update 5: checkpoint-4 is the newest
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "clip_and_step", crash_on_update_5)
    with pytest.raises(KeyboardInterrupt):
        _run_toy(tmp_path, "resumed", "train.batch_size=8", "train.save_every=2")
    monkeypatch.setattr(loop, "clip_and_step", real)
    resumed, _, lines = _run_toy(tmp_path, "resumed", "train.batch_size=8", "train.save_every=2")

    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    steps = [x["step"] for x in lines if "train/loss" in x]
    assert steps == [1, 2, 3, 4, 5, 6]  # no step twice
    assert [x["train/loss"] for x in lines if "train/loss" in x] == \
        [x["train/loss"] for x in straight_lines if "train/loss" in x]


def test_starting_over_clears_old_checkpoints_and_metrics(tmp_path):
    _run_toy(tmp_path, "over", "train.batch_size=8", "train.save_every=2")
    assert sorted(s for s, _ in list_checkpoints(tmp_path / "over")) == [2, 4]
    _, _, lines = _run_toy(tmp_path, "over", "train.batch_size=8", "train.max_steps=3", "train.resume=never")
    assert [x["step"] for x in lines] == [1, 2, 3]  # the first attempt's lines are gone
    assert not list((tmp_path / "over").glob("checkpoint-*"))  # and so are its checkpoints
    assert "max_steps: 3" in (tmp_path / "over" / "config.yaml").read_text()  # the config of this attempt


def test_crash_before_the_first_checkpoint_logs_each_step_once(tmp_path, monkeypatch):
    import rlhfkit.train.supervised.loop as loop

    real, calls = loop.clip_and_step, []

    def crash_on_update_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # steps 1 and 2 are logged, no checkpoint yet (save_every=4)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "clip_and_step", crash_on_update_3)
    with pytest.raises(KeyboardInterrupt):
        _run_toy(tmp_path, "early", "train.batch_size=8", "train.save_every=4")
    monkeypatch.setattr(loop, "clip_and_step", real)
    _, _, lines = _run_toy(tmp_path, "early", "train.batch_size=8", "train.save_every=4")  # auto: nothing to resume
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5, 6]  # steps 1 and 2 of the first attempt are not kept twice


def test_runs_of_another_precision_in_the_same_process(tmp_path):
    # a pipeline runs its stages in one process, and accelerate keeps one state per process
    first = start_run(build_config("sft", {}, [f"output_dir={tmp_path}", "train.mixed_precision=bf16"]))
    assert first.accelerator.mixed_precision == "bf16"
    second = start_run(build_config("sft", {}, [f"output_dir={tmp_path}", "train.mixed_precision='no'"]))
    assert second.accelerator.mixed_precision == "no"


@pytest.mark.parametrize("schedule, hf_name", [("linear", "linear"), ("cosine", "cosine"),
                                                ("constant", "constant_with_warmup")])
def test_schedule_is_transformers_curve_one_update_ahead_in_warmup(schedule, hf_name):
    from transformers import get_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    hf = get_scheduler(hf_name, opt, num_warmup_steps=3, num_training_steps=12).lr_lambdas[0]
    fn = lr_lambda(schedule, warmup=3, total=12)
    assert [fn(s) for s in range(3)] == pytest.approx([hf(s + 1) for s in range(3)])  # 1/3, 2/3, 1 (not 0)
    assert [fn(s) for s in range(3, 13)] == pytest.approx([hf(s) for s in range(3, 13)])
