"""Runs you can trust, end to end through the command line (``cli.main`` in this process, so each case costs a tiny
SFT run, not a torch import): a planted checkpoint never runs code, a changed run is refused by name, a finished run
is not trained again, damaged checkpoints fall back, a full disk and a diverging run end in one line, and a failed
run leaves an earlier run's files byte-identical."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rlhfkit.train.supervised.sft as sft_mod
from rlhfkit.cli import main
from rlhfkit.config import build_config
from rlhfkit.errors import DataError
from rlhfkit.track.metrics import read_run_metrics as read_metrics  # rlhfkit's names (the run writes TRL's)
from rlhfkit.train.lifecycle.checkpoint import list_checkpoints, run_fingerprint, validate_checkpoint

TINY = "tiny:hidden=32,layers=1,intermediate=64"
GOOD = [{"prompt": f"shout: {w}", "completion": w.upper()} for w in ["cat", "dog", "owl", "bee"] * 8]
pytestmark = pytest.mark.slow

PAIRS = [{"prompt": f"shout: {w}", "chosen": w.upper(), "rejected": w} for w in ["cat", "dog", "owl", "bee"] * 8]


def sft_args(root: Path, out: str, *extra: str) -> list[str]:
    return ["sft", f"data.train={root / 'good.jsonl'}", f"model.name={TINY}", f"output_dir={root / out}",
            "train.batch_size=4", "train.max_steps=6", "train.save_every=2", "data.eval_fraction=0",
            "data.max_length=32", "track.report=false", "optim.lr=1e-3", *extra]


def checksums(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Inputs, and a finished SFT run (checkpoints 2 and 4 kept, final model at 6) every test copies."""
    root = tmp_path_factory.mktemp("trust")
    (root / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GOOD))
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    assert main(sft_args(root, "base")) == 0
    assert sorted(p.name for p in (root / "base").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert (root / "base" / "finished.json").is_file()
    return root


def copy_run(root: Path, name: str, crashed: bool = False) -> Path:
    """A copy of the finished run; ``crashed``: as if it died after checkpoint-4 (no final model, not finished)."""
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(root / "base", out)
    if crashed:
        for name in ("finished.json", "model.safetensors"):
            (out / name).unlink()
    return out


def last_error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    return err[0]


def test_a_planted_pickle_checkpoint_never_runs(root, capsys):
    out = root / "planted"
    marker = root / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    ckpt = out / "checkpoint-4"
    ckpt.mkdir(parents=True)
    torch.save({"models": Payload()}, ckpt / "trainer_state.pt")
    torch.save({"python": Payload()}, ckpt / "rng_state_0.pt")
    (ckpt / "state.json").write_text('{"step": 4, "micro": 4}')
    # a manifest that matches, and the fingerprint of the command below: everything but the content is right
    files = {p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in ckpt.iterdir()}
    cfg = build_config("sft", {}, sft_args(root, "planted")[1:])
    (ckpt / "manifest.json").write_text(json.dumps({"files": files, "fingerprint": run_fingerprint(cfg)}))
    before = checksums(out)
    assert main(sft_args(root, "planted")) == 2
    assert "cannot be loaded safely" in last_error(capsys)
    assert not marker.exists()
    assert checksums(out) == before  # the failed run changed nothing

    # without a manifest it is read as an earlier rlhfkit's checkpoint: its files do not load as tensors only, so it
    # is damaged: moved aside (never deleted, never unpickled), and the run starts over
    (ckpt / "manifest.json").unlink()
    assert main(sft_args(root, "planted")) == 0
    assert "checkpoint-4 is damaged (no manifest.json, and its files do not load" in capsys.readouterr().out
    assert not marker.exists() and (out / "finished.json").is_file()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-4.damaged"]


def test_rerunning_a_finished_run_trains_nothing(root, capsys):
    out = copy_run(root, "finished")
    before = checksums(out)
    assert main(sft_args(root, "finished")) == 0
    assert "already finished" in capsys.readouterr().out
    assert checksums(out) == before


def test_a_changed_setting_is_refused_by_name_and_forced_on_request(root, capsys):
    out = copy_run(root, "changed", crashed=True)
    before = checksums(out)
    assert main(sft_args(root, "changed", "optim.lr=5e-3")) == 2
    err = last_error(capsys)
    assert "optim.lr: 0.001 -> 0.005" in err and "train.resume=never" in err and "train.resume=force" in err
    assert checksums(out) == before  # config.yaml still says what ran

    # the finished run is refused the same way
    assert main(sft_args(root, "finished2", "optim.lr=5e-3")) == 0  # a new directory is fine
    copy = copy_run(root, "changed_finished")
    assert main(sft_args(root, "changed_finished", "train.batch_size=8")) == 2
    assert "train.batch_size: 4 -> 8" in last_error(capsys)
    assert (copy / "finished.json").is_file()

    # force: weights / optimizer / position from checkpoint-4, the new LR from there on, and config.yaml says so
    assert main(sft_args(root, "changed", "optim.lr=5e-3", "train.resume=force")) == 0
    assert "resumed from" in capsys.readouterr().out
    lines = {x["step"]: x for x in read_metrics(out)}
    assert sorted(lines) == [1, 2, 3, 4, 5, 6]
    # the LR each update used (TRL's learning_rate: before the scheduler steps): linear decay of the new peak from
    # update 5, and the kept lines of the first run
    assert lines[5]["lr"] == pytest.approx(5e-3 * (1 - 4 / 6))
    assert lines[4]["lr"] == pytest.approx(1e-3 * (1 - 3 / 6))
    assert "lr: 0.005" in (out / "config.yaml").read_text()


def test_a_preference_run_refuses_an_sft_directory(root, capsys):
    out = copy_run(root, "dpo_in_sft", crashed=True)
    before = checksums(out)
    argv = ["dpo", f"data.train={root / 'pairs.jsonl'}", f"model.name={TINY}", f"output_dir={out}",
            "train.batch_size=4", "train.max_steps=2", "track.report=false"]
    assert main(argv) == 2
    assert "recipe: sft -> dpo" in last_error(capsys)
    assert checksums(out) == before


def test_a_damaged_newest_checkpoint_falls_back_with_a_warning(root, capsys):
    out = copy_run(root, "damaged", crashed=True)
    state = out / "checkpoint-4" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    assert main(sft_args(root, "damaged")) == 0
    text = capsys.readouterr().out
    assert "checkpoint-4 is damaged" in text and "resumed from" in text and "checkpoint-2" in text
    assert [x["step"] for x in read_metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert all(validate_checkpoint(p) is None for _, p in list_checkpoints(out))  # the damaged one rewritten
    assert (out / "checkpoint-4").is_dir()
    assert (out / "checkpoint-4.damaged" / "trainer_state.pt").stat().st_size == 100  # moved aside, never deleted


def test_a_checkpoint_of_an_earlier_rlhfkit_without_manifest_resumes(root, capsys):
    out = copy_run(root, "legacy", crashed=True)
    for name in ("checkpoint-2", "checkpoint-4"):
        (out / name / "manifest.json").unlink()
    assert main(sft_args(root, "legacy")) == 0
    text = capsys.readouterr().out
    assert "checkpoint-4 has no manifest" in text and "resumed from" in text and "checkpoint-4 at update 4" in text
    assert [x["step"] for x in read_metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert (out / "finished.json").is_file()


@pytest.mark.parametrize("name", [".rlhfkit.lock", "metrics.jsonl.new", "checkpoint-4", "model.safetensors"])
def test_a_link_planted_in_the_run_directory_is_one_line_and_never_followed(root, capsys, name):
    out = copy_run(root, "planted", crashed=True)
    victim = root / "notes.txt"
    victim.write_text("my notes")
    target = out / name
    if target.is_dir():
        shutil.rmtree(target)
    elif target.exists():
        target.unlink()
    os.symlink(victim, target)
    before = checksums(out)
    assert main(sft_args(root, "planted")) == 2
    assert f"{name} is a symbolic link to {victim}" in last_error(capsys)
    assert victim.read_text() == "my notes" and checksums(out) == before


def test_a_full_disk_at_the_final_save_ends_in_one_line(root, capsys, monkeypatch):
    out = copy_run(root, "full", crashed=True)

    def full_disk(model, tok, out_dir):
        (Path(out_dir) / ".saving").mkdir()
        (Path(out_dir) / ".saving" / "model.safetensors").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sft_mod, "save_model", full_disk)
    assert main(sft_args(root, "full")) == 2
    assert "No space left on device" in last_error(capsys)
    assert not (out / ".saving").exists() and not (out / "finished.json").exists()
    assert all(validate_checkpoint(p) is None for p in out.glob("checkpoint-*"))


def test_a_run_failing_before_its_first_line_changes_nothing(root, capsys, monkeypatch):
    out = copy_run(root, "kept")
    (out / "samples.jsonl").write_text('{"step": 1}\n')
    before = checksums(out)

    def broken(model, batch):
        raise DataError("a record the first step cannot use", where="data.train", fix="fix it")

    monkeypatch.setattr(sft_mod, "sft_forward", broken)
    assert main(sft_args(root, "kept", "train.resume=never", "train.max_steps=3")) == 2
    assert "a record the first step cannot use" in last_error(capsys)
    assert checksums(out) == before

    # a command rejected on its data leaves no directory behind
    (root / "bad.jsonl").write_text('{"prompt": "x"}\n')
    argv = sft_args(root, "never_made")
    argv[1] = f"data.train={root / 'bad.jsonl'}"
    assert main(argv) == 2
    assert not (root / "never_made").exists()


def test_non_finite_updates_are_skipped_and_nan_is_never_saved(root, capsys, monkeypatch):
    # a loss that turns NaN from update 3 on: updates skipped, then the run stops in one line; checkpoint-2 stays
    real, calls = sft_mod.sft_forward, []

    def nan_from_3(model, batch):
        calls.append(1)
        loss, stats = real(model, batch)
        return (loss * float("nan") if len(calls) >= 3 else loss), stats

    monkeypatch.setattr(sft_mod, "sft_forward", nan_from_3)
    assert main(sft_args(root, "nan", "train.max_nonfinite_skips=3")) == 2
    captured = capsys.readouterr()
    assert "3 consecutive" in [x for x in captured.err.splitlines() if x.startswith("error:")][0]
    assert "update 3" in captured.out and "optim.lr" in captured.out
    out = root / "nan"
    assert not (out / "model.safetensors").exists() and not (out / "finished.json").exists()
    # updates 3 and 4 skipped and logged; update 5, the third in a row, stops the run before its line
    assert [(x["step"], x["train/skipped_updates"]) for x in read_metrics(out)][-3:] == [(2, 0), (3, 1), (4, 2)]
    assert validate_checkpoint(out / "checkpoint-2") is None
    monkeypatch.setattr(sft_mod, "sft_forward", real)

    # an absurd learning rate: whatever happens, every tensor saved (checkpoints and model) is finite
    code = main(sft_args(root, "huge_lr", "optim.lr=1e30", "optim.max_grad_norm=null"))
    assert code in (0, 2)
    saved = root / "huge_lr"
    paths = [p for p in [saved / "model.safetensors", *saved.glob("checkpoint-*/trainer_state.pt")] if p.exists()]
    assert paths or code == 2  # a finished run saved something to check
    for path in paths:
        tensors = load_file(path) if path.suffix == ".safetensors" else torch.load(path, weights_only=True)["models"]
        flat = tensors.items() if path.suffix == ".safetensors" else tensors["model"].items()
        for name, t in flat:
            assert torch.isfinite(t).all(), (path, name)


def test_a_truncated_model_file_is_one_line_naming_it(root, capsys):
    model_dir = root / "truncated_model"
    shutil.copytree(root / "base", model_dir, ignore=shutil.ignore_patterns("checkpoint-*"))
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    argv = sft_args(root, "from_truncated")
    argv[2] = f"model.name={model_dir}"
    assert main(argv) == 2
    err = last_error(capsys)
    assert str(weights) in err and "truncated" in err
    assert not (root / "from_truncated").exists()


def test_an_online_run_failing_in_its_first_step_keeps_the_earlier_run(root, capsys):
    fns = Path(__file__).parents[1] / "unit" / "reward_fns_for_tests.py"
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in GOOD))

    def grpo(fn: str, *extra: str) -> list[str]:
        return ["grpo", f"data.train={root / 'prompts.jsonl'}", f"model.name={TINY}", f"output_dir={root / 'online'}",
                f"reward.functions=[{{fn: '{fns}:{fn}'}}]", "algo.rollout_batch_size=2", "algo.num_generations=2",
                "algo.mini_batch_size=4", "train.batch_size=4", "algo.total_episodes=8", "train.save_every=2",
                "generation.max_new_tokens=4", "data.eval_fraction=0", "track.report=false", "track.sample_every=1",
                "algo.entropy_coef=0.01",  # the random tiny model may tie in every group: keep each update non-zero
                "algo.ppo_epochs=2",  # 2 updates a step: checkpoint-2 after the first
                *extra]

    assert main(grpo("contains_yes")) == 0
    out = root / "online"
    assert (out / "samples.jsonl").stat().st_size > 0 and (out / "checkpoint-2").is_dir()
    before = checksums(out)
    # a reward function returning one score too few is only found on the first rollout: exit 2, nothing changed
    assert main(grpo("one_short", "train.resume=never")) == 2
    err = last_error(capsys)
    assert "one_short" in err and "3" in err and "4" in err  # the function, and what it returned against what it got
    assert checksums(out) == before
    assert main(grpo("contains_yes")) == 0  # the first run is intact, and finished
    assert "already finished" in capsys.readouterr().out
    assert checksums(out) == before


def test_a_second_run_into_a_busy_directory_names_the_first(root, capsys):
    import subprocess
    import sys
    import time

    out = root / "busy"
    script = Path(__file__).with_name("ddp_sft_script.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLHFKIT_TEST_SLOW_AFTER": "1"}  # 0.3 s per update after the first
    proc = subprocess.Popen([sys.executable, str(script), str(out), str(root / "good.jsonl"), "train.batch_size=4",
                             "train.max_steps=200", "data.eval_fraction=0"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not read_metrics(out):  # training, holding the lock
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert main(sft_args(root, "busy")) == 2
        err = last_error(capsys)
        assert f"pid {proc.pid}" in err and "another run" in err
    finally:
        proc.kill()
        proc.wait()
    assert main(sft_args(root, "busy", "train.resume=never", "train.max_steps=2")) == 0  # its lock died with it


@pytest.mark.parametrize("recipe, extra", [
    ("sft", ()), ("rm", ()), ("dpo", ()),
    ("grpo", ("reward.functions=[{fn: exact_match}]", "algo.rollout_batch_size=2", "algo.num_generations=2",
              "algo.mini_batch_size=4", "train.batch_size=4"))])
def test_a_wrong_data_path_over_a_finished_run_is_reported_as_the_data_error(root, capsys, recipe, extra):
    # the first error is the real one: the missing file, not "settings changed" / "already finished"
    out = copy_run(root, f"wrong_data_{recipe}")
    before = checksums(out)
    missing = root / "no_such_data.jsonl"
    argv = [recipe, f"data.train={missing}", f"model.name={TINY}", f"output_dir={out}", *extra]
    assert main(argv) == 2
    err = last_error(capsys)
    assert str(missing) in err and "no such file" in err and "setting" not in err
    assert checksums(out) == before


def test_invalid_utf8_is_named_by_line_and_other_encodings_by_name(root, capsys):
    bad = root / "latin1.jsonl"
    bad.write_bytes(b'{"prompt": "a", "completion": "b"}\n{"prompt": "caf\xe9", "completion": "b"}\n')
    wide = root / "utf16.jsonl"
    wide.write_bytes('{"prompt": "a", "completion": "b"}\n'.encode("utf-16"))
    for path, words in ((bad, (f"{bad}:2", "0xe9", "column 16")), (wide, (str(wide), "UTF-16 text"))):
        argv = sft_args(root, "enc")
        argv[1] = f"data.train={path}"
        assert main(argv) == 2
        err = last_error(capsys)
        assert all(w in err for w in words), err


FAILURES = '''
import math
import os
import signal
import time


class NanEnv:
    """An environment whose every reward is NaN: every episode is dropped, no update is ever applied."""

    def reset(self, row):
        return [{"role": "user", "content": str(row["prompt"][-1]["content"])}]

    def step(self, messages, completion):
        return [], math.nan, True


class HangEnv(NanEnv):
    """An environment whose step never returns: every episode times out."""

    def step(self, messages, completion):
        time.sleep(3600)


def sigterm_at_first_call(prompts, completions, **fields):
    """Asks the run to stop (SIGTERM to this process: the trainer's, with reward.workers=0) before any update."""
    os.kill(os.getpid(), signal.SIGTERM)
    return [1.0] * len(completions)


def none_at_all(prompts, completions, **fields):
    return [None] * len(completions)
'''


@pytest.mark.parametrize("kind", ["nan_env", "hanging_env", "no_reward", "sigterm", "nan_loss"])
def test_a_failed_start_never_costs_a_finished_run(root, capsys, monkeypatch, kind):
    # train.resume=never asks to replace the earlier run, not to lose it for a run that never trained: every early
    # failure leaves it byte for byte (checkpoints, model, finished.json, config, metrics, samples, warnings, report)
    (root / "failures.py").write_text(FAILURES)
    fns = Path(__file__).parents[1] / "unit" / "reward_fns_for_tests.py"
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in GOOD))
    online = root / "finished_online"

    def grpo(*extra: str) -> list[str]:
        return ["grpo", f"data.train={root / 'prompts.jsonl'}", f"model.name={TINY}", f"output_dir={online}",
                f"reward.functions=[{{fn: '{fns}:contains_yes'}}]", "algo.rollout_batch_size=2",
                "algo.num_generations=2", "algo.mini_batch_size=4", "train.batch_size=4", "algo.total_episodes=8",
                "train.save_every=1", "generation.max_new_tokens=4", "data.eval_fraction=0", "track.sample_every=1",
                "algo.entropy_coef=0.01", *extra]

    if not (online / "finished.json").exists():
        assert main(grpo()) == 0
    if kind == "nan_loss":  # the supervised loop: a loss that is NaN from the first update on
        out = copy_run(root, "nan_from_start")
        real = sft_mod.sft_forward

        def nan_loss(model, batch):
            loss, stats = real(model, batch)
            return loss * float("nan"), stats

        monkeypatch.setattr(sft_mod, "sft_forward", nan_loss)
        argv = sft_args(root, "nan_from_start", "train.resume=never", "train.max_nonfinite_skips=3",
                        "train.save_every=1")
        expect = (2, "3 consecutive")
    else:
        out = online
        failing = {"nan_env": (f"env.name={root / 'failures.py'}:NanEnv",),
                   "hanging_env": (f"env.name={root / 'failures.py'}:HangEnv", "env.timeout_s=1"),
                   "no_reward": (f"reward.functions=[{{fn: '{root / 'failures.py'}:none_at_all'}}]",),
                   "sigterm": (f"reward.functions=[{{fn: '{root / 'failures.py'}:sigterm_at_first_call'}}]",
                               "reward.workers=0", "reward.lint=false")}[kind]
        argv = grpo("train.resume=never", "algo.total_episodes=4", *failing)  # one rollout step
        expect = {"nan_env": (2, "4 for a non-finite reward (NaN / inf) from step()"),
                  "hanging_env": (2, "for a timed-out or failed call"),
                  "no_reward": (2, "got a finite reward"), "sigterm": (143, "rerun with train.resume=auto")}[kind]
    before = checksums(out)
    assert main(argv) == expect[0]
    captured = capsys.readouterr()
    assert expect[1] in captured.err + captured.out
    assert checksums(out) == before


def test_rewards_that_never_return_cost_their_limit_and_the_run_stops_with_one_line(tmp_path):
    # a reward of every shape that hangs (a file's function in a worker, a function of the user's script in the
    # trainer's process that swallows what a timer raises, an async def that never finishes), reward.timeout_s=1:
    # the probe waits for each once, the lint not again, the first step once more, then one line
    import asyncio
    import time

    from rlhfkit import GRPOTrainer
    from rlhfkit.errors import RewardError

    def in_the_script(prompts, completions, **kwargs):  # a closure, as a script's function: no worker imports it
        while True:
            try:
                time.sleep(3600)
            except Exception:  # noqa: BLE001 - what a careless reward does
                pass

    async def never_finishes(prompts, completions, **kwargs):
        await asyncio.sleep(3600)

    fns = Path(__file__).parents[1] / "unit" / "reward_fns_for_tests.py"
    trainer = GRPOTrainer(
        model=TINY, train_dataset=[{"prompt": f"say {i}"} for i in range(8)],
        reward_funcs=[in_the_script, never_finishes, f"{fns}:hang_busy"],
        args={"output_dir": str(tmp_path / "run"), "reward.timeout_s": 1, "algo.rollout_batch_size": 4,
              "algo.num_generations": 2, "algo.mini_batch_size": 8, "train.batch_size": 8, "algo.total_episodes": 16,
              "generation.max_new_tokens": 4, "track.report": False})
    t0 = time.perf_counter()
    with pytest.raises(RewardError, match="no completion of the batch at step 1 got a finite reward") as info:
        trainer.train()
    assert "timed out" in str(info.value) and "\n" not in str(info.value)
    assert time.perf_counter() - t0 < 60  # 3 functions x (probe + first step) x 1 s, plus the start: not minutes
