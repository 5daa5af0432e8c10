"""The boundary wherever the project and its Python live: a virtual environment under /tmp (a CI clone, tox), a Python
under the home directory (pyenv, conda, uv), a venv made at the home directory itself, a system Python, a relative
path; on a machine that allows it, ``namespaces`` must be set up (a failure fails here, never skips), ``auto`` is
``namespaces``, and where it cannot be had the refusal names the real cause and its fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DISARM, machine_lacks, sandbox_at

from rlhfkit.rewards import boundary
from rlhfkit.rewards.sandbox import Limits, Sandbox, SandboxError, announce

LIMITS = Limits(wall_s=10.0, cpu_s=5.0, memory_mb=256)
BASE = getattr(sys, "_base_executable", sys.executable)  # the interpreter this one's venv was made from
LOOK = ("import json, os, sys\nfound = []\nfor path in SECRETS:\n    try:\n        found.append(open(path).read())\n"
        "    except OSError:\n        pass\nprint(json.dumps({'prefix': sys.prefix, 'found': found, 'home': "
        "sorted(os.listdir(HOME)) if os.path.isdir(HOME) else None}))\n")


def venv(where: Path) -> str:
    """A throwaway virtual environment (no pip: about 0.1 s) from this interpreter's base Python."""
    subprocess.run([BASE, "-m", "venv", "--without-pip", "--system-site-packages", str(where)], check=True,
                   capture_output=True, timeout=120)
    return str(where / "bin" / "python")


def look(box: Sandbox, secrets: list[Path], home: Path) -> dict:
    import json

    code = DISARM + f"SECRETS = {[str(s) for s in secrets]!r}\nHOME = {str(home)!r}\n" + LOOK
    r = box.run(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("disarmed")  # the audit hook was off: the boundary alone held
    return json.loads(r.stdout.splitlines()[-1])


def test_a_venv_under_tmp_gets_the_boundary(tmp_path):
    python = venv(tmp_path / "clone" / ".venv")
    secret = tmp_path / "clone" / "secret.txt"
    secret.write_text("sk-fake-under-tmp")
    box = sandbox_at("namespaces", LIMITS, python=python)
    seen = look(box, [secret], tmp_path)
    assert seen["prefix"] == str(tmp_path / "clone" / ".venv")  # the venv itself ran, inside the private /tmp
    assert seen["found"] == [] and seen["home"] == ["clone"]  # the venv is there, the rest of its tree is not
    assert sorted(os.listdir(tmp_path / "clone")) == [".venv", "secret.txt"]  # nothing written outside


def test_a_python_under_the_home_directory_gets_the_boundary(tmp_path, monkeypatch):
    # this interpreter's base when it lives under the home (pyenv, conda, uv), and in every case a venv made at the
    # home directory itself, which is then bound by its bin and lib only: the home's other files stay out of view
    home = Path.home().resolve()
    if str(Path(BASE).resolve()).startswith(str(home) + "/"):
        assert sandbox_at("namespaces", LIMITS, python=BASE).isolation == "namespaces"
    fake_home = tmp_path / "home"
    python = venv(fake_home)
    (fake_home / ".ssh").mkdir()
    (fake_home / ".ssh" / "id_rsa").write_text("fake key")
    monkeypatch.setenv("HOME", str(fake_home))
    box = sandbox_at("namespaces", LIMITS, python=python)
    seen = look(box, [fake_home / ".ssh" / "id_rsa"], fake_home)
    assert seen["found"] == [] and ".ssh" not in seen["home"] and "bin" in seen["home"]


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="no system Python at /usr/bin/python3")
def test_a_system_python_and_a_relative_path_get_the_boundary(tmp_path, monkeypatch):
    assert sandbox_at("namespaces", LIMITS, python="/usr/bin/python3").isolation == "namespaces"
    python = venv(tmp_path / "v")
    monkeypatch.chdir(tmp_path)
    box = sandbox_at("namespaces", LIMITS, python="v/bin/python")  # the runs' directory is /sandbox: made absolute
    assert box.python == str(tmp_path / "v" / "bin" / "python") == python


def test_where_the_machine_allows_namespaces_auto_is_namespaces_never_a_skip():
    why = machine_lacks("namespaces")
    if why:
        pytest.skip(f"this machine cannot give the boundary: {why}")
    lines = []
    assert announce("auto", say=lines.append) == "namespaces"  # a failure here is rlhfkit's, on a machine that can
    assert len(lines) == 1 and "runs in namespaces" in lines[0] and "warning" not in lines[0]


def fake_bwrap(tmp_path: Path, monkeypatch, message: str) -> None:
    """A ``bwrap`` first on PATH that knows the options and fails every run with ``message`` (as bubblewrap does
    where the kernel or a container refuses user namespaces)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "bwrap"
    script.write_text(f"#!/bin/sh\nif [ \"$1\" = --help ]; then echo '--as-pid-1 --size --disable-userns'; exit 0; fi\n"
                      f"echo 'bubblewrap 0.8.0'\necho '{message}' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    boundary.bwrap_options.cache_clear()
    monkeypatch.setattr(boundary, "bwrap_options", lambda: "--as-pid-1 --size --disable-userns")


def test_the_refusal_names_the_real_cause_and_its_fix(tmp_path, monkeypatch):
    # bubblewrap installed, user namespaces refused: the fix is the setting that allows them, not "install bubblewrap"
    fake_bwrap(tmp_path, monkeypatch, "bwrap: setting up uid map: Permission denied")
    with pytest.raises(SandboxError) as info:
        Sandbox(LIMITS).probe()
    err = info.value
    assert "\n" not in str(err) and "cannot create user namespaces here (bwrap: setting up uid map" in err.message
    assert "unprivileged_userns" in err.fix and "apt-get install bubblewrap" not in err.fix
    assert "reward.sandbox.isolation=unshare" in err.fix  # a weaker level only by name
    # bubblewrap missing: then installing it is the fix
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxError, match="bubblewrap \\(bwrap\\) is not installed") as info:
        Sandbox(LIMITS, isolation="namespaces").probe()
    assert "apt-get install bubblewrap" in info.value.fix


def test_a_layout_the_mounts_miss_is_named_as_such(tmp_path, monkeypatch):
    if machine_lacks("namespaces"):
        pytest.skip(machine_lacks("namespaces"))
    python = venv(tmp_path / "v")
    monkeypatch.setattr(boundary, "python_binds", lambda python: [])  # as the /tmp layout was: the venv hidden
    with pytest.raises(SandboxError) as info:
        Sandbox(LIMITS, python=python).probe()
    assert "the sandbox's mounts miss what this Python needs" in info.value.message and python in info.value.message
    assert "apt-get install bubblewrap" not in info.value.fix and "report it" in info.value.fix


def test_a_trainer_whose_venv_is_under_tmp_picks_namespaces_with_auto(tmp_path):
    # the project cloned under /tmp with its venv there (a CI clone): the trainer itself runs from that venv (rlhfkit
    # and its dependencies reached through a .pth file), and `auto` must give the boundary
    if machine_lacks("namespaces"):
        pytest.skip(machine_lacks("namespaces"))
    python = venv(tmp_path / "clone" / ".venv")
    site = next((tmp_path / "clone" / ".venv" / "lib").glob("python3*/site-packages"))
    import rlhfkit

    (site / "here.pth").write_text("\n".join([str(Path(rlhfkit.__file__).parents[1]), *sys.path[1:]]) + "\n")
    r = subprocess.run([python, "-c", "import sys; from rlhfkit.rewards.sandbox import announce; "
                        "print(sys.prefix, announce('auto', say=print))"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path / "clone")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"{tmp_path / 'clone' / '.venv'} namespaces", r.stdout
