"""Safe file operations (rlhfkit/files.py) and every write path of a run through them: a link planted under a name
rlhfkit writes is never followed (its target is byte-identical after), stops the run with one line naming it; a full
disk, raised as each library raises it, is one line with the space needed and leaves no partial output.
The whole recipes under these faults are in tests/e2e/test_trust.py."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from rlhfkit import files
from rlhfkit.config import build_config, save_config
from rlhfkit.errors import RunError
from rlhfkit.files import PlantedLinkError
from rlhfkit.track import MetricsSink
from rlhfkit.track.jsonl import JsonlWriter, truncate_after_step
from rlhfkit.train.lifecycle.checkpoint import Checkpointer, validate_checkpoint
from rlhfkit.train.lifecycle.run import start_run

SECRET = b"my notes: never overwrite\n"


def _cfg(run_dir, *extra):
    return build_config("sft", {}, [f"output_dir={run_dir}", *extra])


def _parts():
    from rlhfkit.config import OptimConfig
    from rlhfkit.train.lifecycle.optim import build_optimizer, build_scheduler

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = build_optimizer(model.parameters(), OptimConfig(lr=1e-2))
    return {"models": {"m": model}, "optimizers": {"m": opt}, "schedulers": {"m": build_scheduler(opt, OptimConfig(
        lr=1e-2), 10)}}


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file outside the run directory that a planted link points at."""
    path = tmp_path / "outside" / "notes.txt"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def _plant(run_dir: Path, name: str, target: Path) -> Path:
    link = run_dir / name
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)
    return link


# ───────────────────────────────────────────────── primitives ─────────────────────────────────────────────────


@pytest.mark.parametrize("op", ["open_new", "open_append", "open_lock", "write_atomic", "save_torch", "replace",
                                "remove", "fresh_dir", "make_dirs"])
@pytest.mark.parametrize("dangling", [False, True])
def test_no_primitive_follows_a_link(tmp_path, victim, op, dangling):
    target = tmp_path / "outside" / "nothing-here" if dangling else victim
    link = _plant(tmp_path / "run", "file", target)
    src = tmp_path / "run" / "src"
    src.write_text("new")
    call = {
        "open_new": lambda: files.open_new(link), "open_append": lambda: files.open_append(link),
        "open_lock": lambda: files.open_lock(link), "write_atomic": lambda: files.write_atomic(link, "new"),
        "save_torch": lambda: files.save_torch({"x": torch.ones(2)}, link), "replace": lambda: files.replace(src, link),
        "remove": lambda: files.remove(link), "fresh_dir": lambda: files.fresh_dir(link),
        "make_dirs": lambda: files.make_dirs(link),
    }[op]
    with pytest.raises(PlantedLinkError, match=r"file is a symbolic link to .*never writes through a link") as info:
        call()
    assert info.value.where == str(link)
    assert os.path.islink(link) and not target.exists() if dangling else victim.read_bytes() == SECRET
    assert not (tmp_path / "run" / "file.tmp").exists()


def test_a_link_to_a_directory_is_never_emptied(tmp_path):
    keep = tmp_path / "precious"
    keep.mkdir()
    (keep / "a.txt").write_text("a")
    link = _plant(tmp_path / "run", "checkpoint-3", keep)
    for call in (lambda: files.remove(link), lambda: files.fresh_dir(link), lambda: files.replace(tmp_path, link)):
        with pytest.raises(PlantedLinkError):
            call()
    assert (keep / "a.txt").read_text() == "a"
    files.remove_quietly(link)  # clean-up after a failure skips it, silently
    assert (keep / "a.txt").read_text() == "a"


def test_a_fifo_in_a_files_place_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    for call in (lambda: files.open_append(fifo), lambda: files.open_new(fifo), lambda: files.check_run_dir(tmp_path)):
        with pytest.raises(PlantedLinkError, match="not a regular file"):
            call()


def test_a_directory_in_a_files_place_is_never_removed(tmp_path):
    for name in ("config.yaml", "metrics.jsonl.new"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mine.txt").write_text("mine")
    with pytest.raises(RunError, match="config.yaml is a directory where rlhfkit writes a file"):
        files.write_atomic(tmp_path / "config.yaml", "a: 1\n")
    with pytest.raises(RunError, match="metrics.jsonl.new is a directory"):
        files.open_new(tmp_path / "metrics.jsonl.new")
    assert all((tmp_path / n / "mine.txt").read_text() == "mine" for n in ("config.yaml", "metrics.jsonl.new"))


def test_a_hard_link_is_never_appended_to_nor_truncated(tmp_path, victim):
    for name in (".rlhfkit.lock", "metrics.jsonl"):
        os.link(victim, tmp_path / name)
    with pytest.raises(PlantedLinkError, match="lock is a hard link"):
        files.open_lock(tmp_path / ".rlhfkit.lock")
    with pytest.raises(PlantedLinkError, match="metrics.jsonl is a hard link"):
        files.open_append(tmp_path / "metrics.jsonl")
    files.write_atomic(tmp_path / "metrics.jsonl", "new\n")  # replaced by a rename: the other name keeps its content
    assert victim.read_bytes() == SECRET and (tmp_path / "metrics.jsonl").read_text() == "new\n"


def test_links_under_names_rlhfkit_does_not_write_are_left_alone(tmp_path, victim):
    _plant(tmp_path, "my_data.jsonl", victim)  # the user's own link beside the run files
    files.check_run_dir(tmp_path)
    for name in ["metrics.jsonl", "checkpoint-7", "model.safetensors", "tokenizer.json", "adapter", ".rlhfkit.lock",
                 "config.yaml.tmp", "metrics.jsonl.new", "reference_logps-ab.pt", "checkpoint-2.damaged"]:
        assert files.is_own_name(name), name
    (tmp_path / "checkpoint-2").mkdir()
    _plant(tmp_path, "checkpoint-2/sharded/model.pt", victim)  # inside a directory rlhfkit writes whole
    with pytest.raises(PlantedLinkError, match="model.pt is a symbolic link"):
        files.check_run_dir(tmp_path)


def test_write_atomic_replaces_whole_or_not_at_all(tmp_path, monkeypatch):
    path = files.write_atomic(tmp_path / "config.yaml", "a: 1\n")
    real = os.replace

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(RunError, match=r"writing config.yaml failed: No space left on device; it needs about 5 "
                                       r"bytes, .* free \(fix: free at least 5 bytes"):
        files.write_atomic(path, "a: 2\n")
    monkeypatch.setattr(os, "replace", real)
    assert path.read_text() == "a: 1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device"),
    RuntimeError("[enforce fail at inline_container.cc:858] . PytorchStreamWriter failed writing file data/0: file "
                 "write failed"),
    SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on '
                    'device" })'),
])
def test_each_librarys_full_disk_error_is_one_line_with_the_space_needed(tmp_path, error):
    with pytest.raises(RunError) as info:
        with files.writing(tmp_path / "model.safetensors", need=3 << 20, cleanup=[tmp_path / ".saving"]):
            (tmp_path / ".saving").mkdir()
            (tmp_path / ".saving" / "part").write_bytes(b"x")
            raise error
    line = info.value.one_line()
    assert "\n" not in line and "model.safetensors" in line
    assert "failed: No space left on device; it needs about 3.0 MiB" in line and "free at least 3.0 MiB" in line
    assert not (tmp_path / ".saving").exists()


def test_nbytes_counts_tensors_in_nested_containers():
    obj = {"a": torch.zeros(10, dtype=torch.float32), "b": [torch.zeros(4, dtype=torch.float16), {"c": b"xyz"}]}
    assert files.nbytes(obj) == 40 + 8 + 3


# ─────────────────────────────────────────────── a run's write paths ─────────────────────────────────────────────

#: every name a run writes in its directory (files and directories), planted as a link before the run starts
RUN_NAMES = [".rlhfkit.lock", "metrics.jsonl", "metrics.jsonl.new", "samples.jsonl.new", "warnings.jsonl.new",
             "config.yaml", "config.yaml.tmp", "finished.json", "finished.json.tmp", "report.html", "checkpoint-2",
             "checkpoint-2.tmp", ".saving", "model.safetensors", "config.json", "tokenizer.json", "adapter",
             "reference_logps-0123456789abcdef.pt", "wandb_id.txt", "tb"]


@pytest.mark.parametrize("name", RUN_NAMES)
def test_a_link_planted_under_a_run_file_stops_the_run_before_any_write(tmp_path, victim, name):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n') if name != "metrics.jsonl" else None
    before = {p.name: (os.lstat(p).st_mtime_ns, p.is_symlink()) for p in run_dir.iterdir()}
    _plant(run_dir, name, victim)
    with pytest.raises(PlantedLinkError, match=f"{name.replace('.', '[.]')} is a symbolic link to {victim}"):
        start_run(_cfg(run_dir))
    assert victim.read_bytes() == SECRET
    after = {p.name: (os.lstat(p).st_mtime_ns, p.is_symlink()) for p in run_dir.iterdir() if p.name != name}
    assert after == before  # nothing written, not even the lock


def test_the_run_directory_itself_may_be_a_link(tmp_path):
    real = tmp_path / "disk" / "run"
    real.mkdir(parents=True)
    os.symlink(real, tmp_path / "run")
    run = start_run(_cfg(tmp_path / "run"))
    Checkpointer(run).save(1, **_parts(), state={})
    run.session.close(failed=False)
    assert validate_checkpoint(real / "checkpoint-1") is None


@pytest.mark.parametrize("name", ["metrics.jsonl.new", "metrics.jsonl", "config.yaml", "checkpoint-1",
                                  "checkpoint-1.tmp", "finished.json"])
def test_a_link_planted_while_the_run_is_going_is_never_followed(tmp_path, victim, name):
    """The pre-flight check passed; the link appears later, under the name of the next write."""
    run = start_run(_cfg(tmp_path / "run"))
    _plant(run.run_dir, name, victim)
    with pytest.raises(PlantedLinkError):
        sink = run.session.open_sink()
        sink.log({"loss": 1.0}, step=1)  # commits: config.yaml, metrics.jsonl swapped in
        Checkpointer(run).save(1, **_parts(), state={})
        files.write_atomic(run.run_dir / "finished.json", "{}")
    assert victim.read_bytes() == SECRET


def test_the_lock_is_released_only_if_it_is_still_ours(tmp_path, victim):
    run = start_run(_cfg(tmp_path / "run"))
    lock = run.run_dir / ".rlhfkit.lock"
    os.unlink(lock)
    os.symlink(victim, lock)  # swapped for a link meanwhile: release leaves it
    run.session.close(failed=False)
    assert lock.is_symlink() and victim.read_bytes() == SECRET


# ─────────────────────────────────────────────── a run's full disk ──────────────────────────────────────────────


def _full_disk(kind: str):
    return {"os": OSError(errno.ENOSPC, "No space left on device"),
            "torch": RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
            "safetensors": SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })"),
            }[kind]


@pytest.mark.parametrize("kind", ["os", "torch"])
def test_full_disk_in_a_checkpoint_keeps_the_earlier_one_and_removes_the_tmp(tmp_path, monkeypatch, kind):
    run = start_run(_cfg(tmp_path / "run"))
    ckpt = Checkpointer(run)
    ckpt.save(1, **_parts(), state={})
    real = torch.save

    def full(obj, f, *a, **kw):
        real(obj, f, *a, **kw)  # the file is there, torn
        raise _full_disk(kind)

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(RunError, match=r"writing checkpoint-2 failed: No space left on device; it needs about") as e:
        ckpt.save(2, **_parts(), state={})
    assert "\n" not in e.value.one_line()
    assert sorted(p.name for p in run.run_dir.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint-1"]
    assert validate_checkpoint(run.run_dir / "checkpoint-1") is None


@pytest.mark.parametrize("kind", ["os", "torch", "safetensors"])
def test_full_disk_in_the_final_model_leaves_no_saving_dir_and_the_earlier_model(tmp_path, monkeypatch, kind):
    from transformers import AutoModelForCausalLM

    from rlhfkit.models.loading import load_tokenizer, save_model
    from rlhfkit.models.tiny import tiny_llama_config

    tok = load_tokenizer("tiny")
    model = AutoModelForCausalLM.from_config(tiny_llama_config("tiny:hidden=16,layers=1,intermediate=32", tok))
    out = save_model(model, tok, tmp_path / "run")
    before = (out / "model.safetensors").read_bytes()
    real = model.save_pretrained

    def full(path, *a, **kw):
        real(path, *a, **kw)
        raise _full_disk(kind)

    monkeypatch.setattr(model, "save_pretrained", full)
    with pytest.raises(RunError, match=r"writing the model to .* failed: No space left on device; it needs about"):
        save_model(model, tok, out)
    assert not (out / ".saving").exists() and (out / "model.safetensors").read_bytes() == before


@pytest.mark.parametrize("kind", ["os", "torch"])
def test_full_disk_in_the_reference_cache_and_the_staged_logs_is_one_line(tmp_path, monkeypatch, kind):
    # the reference cache (torch.save to an open file)
    real = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **kw: (real(obj, f), (_ for _ in ()).throw(
        _full_disk(kind))))
    with pytest.raises(RunError, match=r"writing the reference cache failed: No space left on device; it needs about "
                                       r"400 bytes"):
        files.save_torch({"train": torch.zeros(100)}, tmp_path / "reference_logps-x.pt", what="the reference cache")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(torch, "save", real)

    # the staged copy of metrics.jsonl (a resumed run copies the lines it keeps)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 1.0}) + "\n" for i in range(5)))
    monkeypatch.setattr(files, "open_new", lambda *a, **k: (_ for _ in ()).throw(_full_disk("os")))
    with pytest.raises(RunError, match=r"writing metrics.jsonl.new failed: No space left on device; it needs about"):
        JsonlWriter(tmp_path / "metrics.jsonl", keep_until=3, staged=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_a_resumed_log_is_cut_back_without_following_a_link(tmp_path, victim):
    _plant(tmp_path, "metrics.jsonl", victim)
    with pytest.raises(PlantedLinkError):
        truncate_after_step(tmp_path / "metrics.jsonl", 3)
    with pytest.raises(PlantedLinkError):
        MetricsSink(tmp_path, resume_step=3)
    with pytest.raises(PlantedLinkError):
        save_config(_cfg(tmp_path), tmp_path / "sub") if _plant(tmp_path, "sub/config.yaml", victim) else None
    assert victim.read_bytes() == SECRET
