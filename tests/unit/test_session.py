"""The run lifecycle (train/lifecycle/session.py, train/lifecycle/checkpoint.py) piece by piece: fingerprints, the
directory lock, files
staged until the first line, checkpoint manifests and fallback, loads that never unpickle code, and the NaN guard of
clip_and_step.
The whole recipes under these faults are in tests/e2e/test_trust.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import import_script

from rlhfkit.config import build_config
from rlhfkit.errors import NonFiniteError, RunError
from rlhfkit.track import MetricsSink, read_metrics
from rlhfkit.track.jsonl import JsonlWriter
from rlhfkit.train.lifecycle.checkpoint import (
    NOT_FINGERPRINTED,
    Checkpointer,
    fingerprint_diff,
    guard_of,
    list_checkpoints,
    run_fingerprint,
    run_length,
    validate_checkpoint,
)
from rlhfkit.train.lifecycle.optim import build_optimizer, build_scheduler, clip_and_step
from rlhfkit.train.lifecycle.run import start_run


class Tiny(torch.nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.lin(x).squeeze(-1)


def _cfg(tmp_path, *extra, recipe="sft"):
    return build_config(recipe, {}, [f"output_dir={tmp_path / 'run'}", *extra])


def _parts(seed=0):
    from rlhfkit.config import OptimConfig

    model = Tiny(seed)
    opt = build_optimizer(model.parameters(), OptimConfig(lr=1e-2))
    sched = build_scheduler(opt, OptimConfig(lr=1e-2), 10)
    return {"models": {"m": model}, "optimizers": {"m": opt}, "schedulers": {"m": sched}}


# ───────────────────────────────────────────────── fingerprint ─────────────────────────────────────────────────


def test_fingerprint_holds_what_defines_a_run_and_not_where_or_how_long(tmp_path):
    base = run_fingerprint(_cfg(tmp_path))
    assert {"recipe", "model.name", "data.train", "optim.lr", "optim.schedule", "train.batch_size",
            "train.grad_accum", "train.seed"} <= set(base)
    assert not any(k.startswith(("track.", "output_dir")) for k in base)
    assert "train.max_steps" not in base and "train.save_every" not in base
    # harmless: another directory, logging, checkpoint cadence, a longer run
    same = run_fingerprint(build_config("sft", {}, [f"output_dir={tmp_path / 'other'}", "train.log_every=5",
                                                     "train.save_every=3", "train.max_steps=99",
                                                     "track.report=false"]))
    assert fingerprint_diff(base, same) == []
    changed = run_fingerprint(_cfg(tmp_path, "optim.lr=1e-3", "train.batch_size=4"))
    assert fingerprint_diff(base, changed) == ["optim.lr: 2e-05 -> 0.001", "train.batch_size: 8 -> 4"]
    # another recipe: the recipe is named first
    dpo = run_fingerprint(_cfg(tmp_path, recipe="dpo"))
    assert fingerprint_diff(base, dpo)[0] == "recipe: sft -> dpo"
    assert run_length(_cfg(tmp_path, "train.max_steps=7")) == {"train.epochs": 1.0, "train.max_steps": 7}
    assert all(k in ("output_dir", "defaults") or "." in k for k in NOT_FINGERPRINTED)
    # defaults=trl is where the values came from, not a value: a checkpoint written before the key still matches
    grpo = run_fingerprint(_cfg(tmp_path, recipe="grpo"))
    assert "defaults" not in grpo and "algo.ppo_epochs" in grpo


def _written_before_loss_sections(fp: dict, clip_low, clip_high) -> dict:
    """The fingerprint the version before per-loss config sections wrote for the same run: one algo.clip_low /
    algo.clip_high, no algo.ppo.* / algo.gspo.* (checked key by key against commit c6a84f1's run_fingerprint)."""
    old = {k: v for k, v in fp.items() if not k.startswith(("algo.ppo.", "algo.gspo."))}
    return {**old, "algo.clip_low": clip_low, "algo.clip_high": clip_high}


@pytest.mark.parametrize("loss, clip", [("ppo", (0.2, None)), ("gspo", (3e-4, 4e-4)), ("gspo_token", (3e-4, 4e-4))])
def test_a_checkpoint_from_before_the_loss_sections_still_matches(tmp_path, loss, clip):
    new = run_fingerprint(_cfg(tmp_path, f"algo.policy_loss={loss}", recipe="grpo"))
    section, unused = ("ppo", "gspo") if loss == "ppo" else ("gspo", "ppo")
    assert {f"algo.{section}.clip_low", f"algo.{section}.clip_high"} <= set(new)
    assert not any(k.startswith(f"algo.{unused}.") for k in new)  # the unused loss's section is not in it
    old = _written_before_loss_sections(new, *clip)
    assert fingerprint_diff(old, new) == []
    # the renamed key is still compared: a changed clip range is a difference, named with today's key
    wider = run_fingerprint(_cfg(tmp_path, f"algo.policy_loss={loss}", f"algo.{section}.clip_low=0.1", recipe="grpo"))
    assert fingerprint_diff(old, wider) == [f"algo.{section}.clip_low: {clip[0]} -> 0.1"]
    # another loss than the checkpoint's: named, with its section's settings
    diff = fingerprint_diff(old, run_fingerprint(_cfg(tmp_path, f"algo.policy_loss={unused}", recipe="grpo")))
    assert f"algo.policy_loss: {loss} -> {unused}" in diff


def test_settings_of_an_unused_policy_loss_never_block_a_resume(tmp_path):
    base = run_fingerprint(_cfg(tmp_path, recipe="grpo"))
    assert fingerprint_diff(base, run_fingerprint(_cfg(tmp_path, "algo.gspo.clip_low=0.01", recipe="grpo"))) == []
    assert fingerprint_diff(base, run_fingerprint(_cfg(tmp_path, "algo.ppo.clip_low=0.1", recipe="grpo"))) == [
        "algo.ppo.clip_low: 0.2 -> 0.1"]


# ───────────────────────────────────────────────────── lock ────────────────────────────────────────────────────


def test_a_second_run_into_a_locked_directory_names_the_first_pid(tmp_path):
    cfg = _cfg(tmp_path)
    (tmp_path / "run").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(tmp_path / 'run' / '.rlhfkit.lock')!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{{os.getpid()}} host\\n".encode())
        print("locked", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunError, match=f"pid {holder.pid}") as err:
            start_run(cfg)
        assert "another run" in str(err.value) and "output_dir" in err.value.fix
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # the holder died (SIGKILL): its lock is gone with it, the stale file is taken over
    with start_run(cfg) as run:
        assert (run.run_dir / ".rlhfkit.lock").read_text().split()[0] == str(os.getpid())
    assert not (tmp_path / "run" / ".rlhfkit.lock").exists()  # released and removed at the end


def test_a_failed_run_removes_the_directory_it_created(tmp_path):
    with pytest.raises(ValueError), start_run(_cfg(tmp_path)):
        raise ValueError("bad data")
    assert not (tmp_path / "run").exists()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("x")
    with pytest.raises(ValueError), start_run(_cfg(tmp_path)):
        raise ValueError("bad data")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["keep.txt"]


# ─────────────────────────────────────────────── staged files ──────────────────────────────────────────────────


def test_staged_jsonl_leaves_the_earlier_file_until_commit(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n')
    before = path.read_bytes()
    w = JsonlWriter(path, keep_until=-1, staged=True)
    w.write({"step": 1, "a": 9})
    assert path.read_bytes() == before  # not yet committed
    w.discard()
    assert path.read_bytes() == before and not (tmp_path / "metrics.jsonl.new").exists()

    w = JsonlWriter(path, keep_until=1, staged=True)  # resumed at step 1: line 2 dropped, line 1 kept
    w.write({"step": 2, "a": 5})
    w.commit()
    w.write({"step": 3, "a": 6})  # later lines follow the renamed file
    w.close()
    assert [(r["step"], r["a"]) for r in read_metrics(tmp_path)] == [(1, 1), (2, 5), (3, 6)]


def test_sink_commits_the_run_with_its_first_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "old": 1}\n')
    calls = []
    sink = MetricsSink(tmp_path, resume_step=-1, staged=True, on_first_line=lambda: calls.append(1) or sink.commit())
    assert read_metrics(tmp_path) == [{"step": 1, "old": 1}]
    sink.log({"new": 1.0}, step=1)
    sink.log({"new": 2.0}, step=2)
    sink.close()
    assert calls == [1] and [r["new"] for r in read_metrics(tmp_path)] == [1.0, 2.0]


# ─────────────────────────────────────────────────── checkpoints ───────────────────────────────────────────────


def test_checkpoint_has_a_manifest_and_loads_without_pickle(tmp_path):
    run = start_run(_cfg(tmp_path))
    path = Checkpointer(run).save(3, **_parts(), state={"micro": 6})
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"trainer_state.pt", "state.json", "rng_state_0.pt"}
    assert manifest["fingerprint"] == run_fingerprint(run.cfg)
    assert validate_checkpoint(path) is None
    for name in ("trainer_state.pt", "rng_state_0.pt"):
        torch.load(path / name, weights_only=True)  # tensors / lists / numbers only


@pytest.mark.parametrize("damage", ["truncate_state", "empty_state", "torn_json", "missing_rng", "torn_manifest",
                                    "no_manifest_truncated"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, damage, capsys):
    run = start_run(_cfg(tmp_path))
    ckpt = Checkpointer(run, keep=3)
    ckpt.save(2, **_parts(), state={})
    newest = ckpt.save(4, **_parts(), state={})
    target = {"truncate_state": "trainer_state.pt", "empty_state": "trainer_state.pt", "torn_json": "state.json",
              "missing_rng": "rng_state_0.pt", "torn_manifest": "manifest.json",
              "no_manifest_truncated": "trainer_state.pt"}[damage]
    data = (newest / target).read_bytes()
    if damage == "no_manifest_truncated":  # an earlier rlhfkit's checkpoint, torn
        (newest / "manifest.json").unlink()
    if damage == "missing_rng":
        (newest / target).unlink()
    elif damage == "empty_state":
        (newest / target).write_bytes(b"")
    else:
        (newest / target).write_bytes(data[: len(data) // 2])
    assert validate_checkpoint(newest) is not None
    assert ckpt.find("auto") == run.run_dir / "checkpoint-2"
    assert "checkpoint-4 is damaged" in capsys.readouterr().out
    with pytest.raises(RunError, match="damaged"):
        ckpt.find(str(newest))  # named explicitly: one line, no fallback


def test_a_pickled_payload_is_never_executed(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    run = start_run(_cfg(tmp_path))
    ckpt = Checkpointer(run)
    path = ckpt.save(1, **_parts(), state={})
    torch.save({"models": Payload()}, path / "trainer_state.pt")
    with pytest.raises(RunError, match="cannot be loaded safely"):
        ckpt.load(path, **_parts())
    assert not (tmp_path / "pwned").exists()


def test_full_disk_while_checkpointing_removes_the_partial_directory(tmp_path, monkeypatch):
    run = start_run(_cfg(tmp_path))
    ckpt = Checkpointer(run)
    ckpt.save(1, **_parts(), state={})
    real = torch.save

    def full(obj, f, *a, **kw):
        if str(f).endswith("trainer_state.pt"):
            with open(f, "wb") as fh:
                fh.write(b"partial")
            raise OSError(28, "No space left on device")
        return real(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(RunError, match="No space left on device"):
        ckpt.save(2, **_parts(), state={})
    assert sorted(p.name for p in run.run_dir.glob("checkpoint-*")) == ["checkpoint-1"]
    assert validate_checkpoint(run.run_dir / "checkpoint-1") is None


def test_nan_weights_are_never_saved(tmp_path):
    run = start_run(_cfg(tmp_path))
    parts = _parts()
    with torch.no_grad():
        parts["models"]["m"].lin.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="not finite"):
        Checkpointer(run).save(1, **parts, state={})
    assert not list(run.run_dir.glob("checkpoint-*"))


# ───────────────────────────────────────────────────── NaN guard ───────────────────────────────────────────────


def test_clip_and_step_skips_non_finite_updates_and_stops_after_too_many(tmp_path, capsys):
    run = start_run(_cfg(tmp_path))
    parts = _parts()
    model, opt, sched = parts["models"]["m"], parts["optimizers"]["m"], parts["schedulers"]["m"]
    guard_of(opt).max_consecutive = 3
    x = torch.randn(8, 4)

    def update(bad: bool):
        loss = model(x).pow(2).mean() * (float("nan") if bad else 1.0)
        loss.backward()
        return clip_and_step(run.accelerator, model, opt, sched, 1.0, loss=loss.detach())

    update(False)
    good = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(2):
        update(True)
    assert all(torch.equal(v, good[k]) for k, v in model.state_dict().items())  # skipped: weights unchanged
    assert all(p.grad is None for p in model.parameters())  # gradients zeroed
    assert guard_of(opt).skipped == 2 and sched.last_epoch == 3  # the schedule still counts updates
    assert "update 3" in capsys.readouterr().out
    update(False)  # a good update resets the run of skips
    assert guard_of(opt).consecutive == 0
    for _ in range(2):
        update(True)
    with pytest.raises(NonFiniteError, match="3 consecutive") as err:
        update(True)
    assert "optim.lr" in err.value.fix and "optim.max_grad_norm" in err.value.fix


def test_full_disk_at_the_first_line_leaves_the_earlier_files(tmp_path, monkeypatch):
    import rlhfkit.train.lifecycle.session as session_mod

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "old": 1}\n')
    (run_dir / "config.yaml").write_text("# old\n")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}

    def full(cfg, run_dir):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(session_mod, "save_config", full)
    with pytest.raises(RunError, match="No space left"), start_run(_cfg(tmp_path)) as run:
        run.session.open_sink()
        run.log({"loss": 1.0}, step=1)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # no .new, no lock, nothing changed


def test_a_filesystem_without_flock_warns_and_runs(tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with start_run(_cfg(tmp_path)):
        pass
    assert "cannot lock" in capsys.readouterr().out


def test_full_disk_while_logging_samples_or_warnings_is_one_line(tmp_path, monkeypatch):
    # every run file goes through JsonlWriter: a full disk mid-run is a RunError naming the file, not a traceback
    from rlhfkit.track import SampleLogger
    from rlhfkit.track import jsonl as J

    samples = SampleLogger(tmp_path, max_rows=0)
    samples.log(1, ["p"], ["r"], [1.0])

    class Full:
        closed = False

        def write(self, text):
            raise OSError(28, "No space left on device")

        def flush(self):
            pass

    monkeypatch.setattr(samples._writer, "_file", Full())
    with pytest.raises(RunError, match=r"writing samples\.jsonl failed: No space left on device"):
        samples.log(2, ["p"], ["r"], [1.0])
    assert J.read_jsonl(tmp_path / "samples.jsonl")[0]["step"] == 1


# ─────────────────────────────── nothing is deleted for being unreadable (issue 21) ─────────────────────────────


def _legacy(path):
    """As the version before the manifest wrote it: the same files, no manifest.json."""
    (path / "manifest.json").unlink()
    return path


def test_a_checkpoint_without_a_manifest_is_resumed_not_deleted(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    cfg = _cfg(tmp_path, f"data.train={data}")
    run = start_run(cfg)
    parts = _parts(seed=3)
    _legacy(Checkpointer(run).save(4, **parts, state={"micro": 8}))
    run.session.commit()  # the earlier run wrote config.yaml: the settings it was made with
    run.session.close(failed=False)

    run = start_run(cfg)
    assert run.session.begin() is None
    fresh = _parts(seed=9)
    state = run.session.resume(**fresh)
    assert state["micro"] == 8 and run.session.resumed_from.name == "checkpoint-4"
    assert torch.equal(fresh["models"]["m"].lin.weight, parts["models"]["m"].lin.weight)
    assert "warning: checkpoint-4 has no manifest (written by an earlier rlhfkit" in capsys.readouterr().out
    run.session.commit()
    run.session.close(failed=False)
    assert (tmp_path / "run" / "checkpoint-4" / "trainer_state.pt").is_file()  # kept as it was

    # its settings come from the run's config.yaml: another learning rate is refused by name
    with pytest.raises(RunError, match=r"checkpoint-4 was made with other settings \(optim.lr: 2e-05 -> 0.001"):
        start_run(_cfg(tmp_path, f"data.train={data}", "optim.lr=1e-3")).session.begin()


def test_a_damaged_checkpoint_is_moved_aside_when_the_run_commits(tmp_path, capsys):
    run = start_run(_cfg(tmp_path))
    ckpt = Checkpointer(run, keep=3)
    ckpt.save(2, **_parts(), state={})
    state = ckpt.save(4, **_parts(), state={}) / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:50])
    torn = state.read_bytes()
    run.session.close(failed=False)

    run = start_run(_cfg(tmp_path))
    run.session.begin()
    run.session.resume(**_parts())
    assert run.session.resumed_from.name == "checkpoint-2"
    assert "checkpoint-4 is damaged" in capsys.readouterr().out
    assert state.read_bytes() == torn  # nothing changes before the run commits
    run.session.commit()
    aside = tmp_path / "run" / "checkpoint-4.damaged" / "trainer_state.pt"
    assert aside.read_bytes() == torn and not (tmp_path / "run" / "checkpoint-4").exists()
    assert "moved aside to checkpoint-4.damaged; nothing was deleted" in capsys.readouterr().out
    run.session.ckpt.save(4, **_parts(), state={})  # the step is written again beside it
    assert validate_checkpoint(tmp_path / "run" / "checkpoint-4") is None and aside.read_bytes() == torn


def test_pruning_and_starting_over_delete_only_valid_checkpoints_rlhfkit_wrote(tmp_path):
    run = start_run(_cfg(tmp_path))
    run_dir = run.run_dir
    for name in ("checkpoint-notes", "checkpoint-3.bak", "checkpoint-5.damaged"):  # not checkpoints rlhfkit keeps
        (run_dir / name).mkdir()
        (run_dir / name / "x.txt").write_text("mine")
    ckpt = Checkpointer(run, keep=1)
    ckpt.save(1, **_parts(), state={})
    (run_dir / "checkpoint-1" / "rng_state_0.pt").write_bytes(b"torn")  # unreadable: never pruned
    ckpt.save(2, **_parts(), state={})
    ckpt.save(3, **_parts(), state={})
    assert sorted(s for s, _ in list_checkpoints(run_dir)) == [1, 3]
    run.session.close(failed=False)

    run = start_run(_cfg(tmp_path, "train.resume=never"))  # starting over: the valid ones go, not the others
    run.session.begin()
    run.session.resume(**_parts())
    run.session.commit()
    names = sorted(p.name for p in run_dir.iterdir() if p.name.startswith("checkpoint"))
    assert names == ["checkpoint-1.damaged", "checkpoint-3.bak", "checkpoint-5.damaged", "checkpoint-notes"]
    assert all((run_dir / n / "x.txt").read_text() == "mine" for n in names if n != "checkpoint-1.damaged")


def test_data_files_are_fingerprinted_by_resolved_path_and_content(tmp_path, monkeypatch):
    from rlhfkit.train.lifecycle import fingerprint

    data = tmp_path / "sub" / "d.jsonl"
    data.parent.mkdir()
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    base = run_fingerprint(_cfg(tmp_path, f"data.train={data}"))
    assert base["data.train"]["path"] == str(data.resolve()) and base["data.train"]["size"] == data.stat().st_size
    monkeypatch.chdir(tmp_path / "sub")  # the same file named by a relative path (and through a link) resumes
    assert fingerprint_diff(base, run_fingerprint(_cfg(tmp_path, "data.train=d.jsonl"))) == []
    os.symlink(data, tmp_path / "alias.jsonl")
    assert fingerprint_diff(base, run_fingerprint(_cfg(tmp_path, "data.train=../alias.jsonl"))) == []
    # a fingerprint written before content was recorded held the path string: the same file still matches
    assert fingerprint_diff({**base, "data.train": str(data)}, run_fingerprint(_cfg(tmp_path, "data.train=d.jsonl"))) \
        == []
    # the same name, other content (even the same size): refused, naming the file
    data.write_text('{"prompt": "a", "completion": "c"}\n')
    diff = fingerprint_diff(base, run_fingerprint(_cfg(tmp_path, "data.train=d.jsonl")))
    assert diff == [f"data.train: the content of {data.resolve()} changed (35 -> 35 bytes, another checksum)"]
    # over the full-hash limit: size plus the first and last MiB (a change in the middle is not seen, by design)
    monkeypatch.setattr(fingerprint, "FULL_HASH_LIMIT", 3 << 20)
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"a" * (4 << 20))
    first = fingerprint.data_identity(str(big))
    with open(big, "r+b") as f:
        f.seek((4 << 20) - 10)
        f.write(b"b")
    assert fingerprint.data_identity(str(big))["sha256"] != first["sha256"]
    # a directory of files: every file's name, size and content; a datasets name stays a name
    assert fingerprint.data_identity(str(tmp_path / "sub"))["size"] == data.stat().st_size
    assert fingerprint.data_identity("org/some-dataset") == "org/some-dataset"


def test_a_reward_function_setting_added_later_keeps_old_fingerprints():
    # reward.functions[].convention came after checkpoints were written: at its default (auto) the fingerprint is the
    # one an earlier version wrote, so those runs still resume; another value is a change of the run
    from rlhfkit.config import build_config
    from rlhfkit.train.lifecycle.checkpoint import run_fingerprint

    fns = "reward.functions=[{fn: exact_match}]"
    old = run_fingerprint(build_config("grpo", {}, [fns]))["reward.functions"]
    assert old == [{"fn": "exact_match", "weight": 1.0, "name": None, "kwargs": {}}]
    trl = run_fingerprint(build_config("grpo", {}, ["reward.functions=[{fn: exact_match, convention: trl}]"]))
    assert trl["reward.functions"][0]["convention"] == "trl"


#: default changes made on purpose since a kept fingerprint: (file, recipe) -> the diff lines a resume then shows
#: (the run's first lines name them; setting the earlier value resumes the run)
_DELIBERATE = {("2026-11-28_fd5f10b", "grpo"): ["algo.ppo_epochs: 2 -> 1", "reward.missing_eos_scope: all -> varied"]}


@pytest.mark.parametrize("kept", sorted(p.stem for p in (Path(__file__).parent / "fingerprints").glob("*.json")))
def test_checkpoints_of_earlier_versions_still_resume(kept):
    """Every recipe's default fingerprint as an earlier version wrote it (tests/unit/fingerprints/, written by
    tools/fingerprint_snapshot.py from that commit's code) matches today's: a config key added since is read at the
    value that gives the earlier behaviour (ADDED_KEYS / ADDED_KEYS_ALL), never '(unset)', which would refuse every
    such checkpoint with no setting to give. Only the defaults changed on purpose differ, by value."""
    old = json.loads((Path(__file__).parent / "fingerprints" / f"{kept}.json").read_text())
    now = import_script("tools", "fingerprint_snapshot").snapshot()  # today's, made as the kept ones were
    for name, fingerprint in old.items():  # "recipe" or "recipe key=value" (a list key's items, ITEM_DEFAULTS)
        assert fingerprint_diff(fingerprint, now[name]) == _DELIBERATE.get((kept, name.split()[0]), []), (kept, name)

