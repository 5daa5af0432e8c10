"""The wheels ``bench/gpu_suite.py`` needs on the GPU machine, made here, and the exact ``run`` call that uses them.

The GPU machine has no network; its image holds torch 2.11, transformers 5.17, accelerate, peft, pandas, pyarrow,
xxhash, fsspec, psutil, pillow (row 7's pictures; ``/work/.library/device/KINDS.md``'s package list) but not TRL nor
what TRL needs beside them. So they travel as wheels in ``.whl/`` at the repository's root (ignored by git:
``.gitignore`` lists it; never committed), within the device tool's 64 MiB for the whole working tree:

- ``trl==1.16.0`` (the peer: pure Python), ``datasets==5.2.0`` (TRL's and rlhfkit's), and datasets' two needs the
  image lacks, ``dill==0.4.1`` and ``multiprocess==0.70.19`` (its CPython 3.12 wheel); about 2.5 MB;
- with ``--qlora``: ``bitsandbytes==0.50.2`` (43 MB) for the suite's QLoRA case (row 4); without it that case is a
  SKIP row that says why.

``pip download --no-deps`` for CPython 3.12 on manylinux x86-64 (the image's Python), then a check that the folder is
git-ignored and fits, then the command to give the ``run`` tool, printed. The commit being measured is written to
``.whl/COMMIT`` (the GPU machine's copy of the tree may have no ``.git``; "+uncommitted changes" when tracked files
differ from it): run this right before the call, so the stamp is the tree that travels.

    python3 bench/gpu_wheels.py [--qlora] [--dest .whl]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ["trl==1.16.0", "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19"]
QLORA = ["bitsandbytes==0.50.2"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "any"]
LIMIT_MIB = 56  # of the tool's 64 MiB: the tracked tree (~4 MiB) and room to spare
CALL_S = 540  # one `run` call: the install, the start and the suite's own budget (gpu_suite.BUDGET_S, 500 s)


def download(names: list[str], dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "-d", str(dest), "-q"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    subprocess.run(cmd + names, check=True)


def run_call(dest: Path) -> dict:
    """The ``run`` tool's arguments: the command (well under its 2,000 characters) and what to carry."""
    rel = dest.relative_to(ROOT)
    command = (f"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "
               f"/tmp/site {rel}/*.whl && export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 || exit; "
               f"nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; "
               "python3 bench/gpu_suite.py --out $OUT")
    return {"command": command, "carry": [str(rel)], "timeout_s": CALL_S}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dest", default=str(ROOT / ".whl"))
    p.add_argument("--qlora", action="store_true", help="also bitsandbytes (43 MB) for the QLoRA case")
    args = p.parse_args()
    dest = Path(args.dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    ignored = subprocess.run(["git", "check-ignore", "-q", str(dest / "x.whl")], cwd=ROOT).returncode == 0
    if not ignored:
        print(f"gpu_wheels: {dest} is not ignored by git; add it to .gitignore first (wheels are never committed)")
        return 2
    for old in dest.glob("*.whl"):  # one version of each: two would stop the install there
        old.unlink()
    download(WHEELS + (QLORA if args.qlora else []), dest)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()  # the tree measured is the working tree: say when it differs
    (dest / "COMMIT").write_text(commit.stdout.strip() + ("+uncommitted changes" if dirty else "") + "\n")
    wheels = sorted(dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels) / 2**20
    for w in wheels:
        print(f"  {w.name}  {w.stat().st_size / 2**20:.1f} MiB")
    print(f"gpu_wheels: {len(wheels)} wheels, {size:.1f} MiB in {dest}")
    if size > LIMIT_MIB:
        print(f"gpu_wheels: more than {LIMIT_MIB} MiB: the working tree would not travel (64 MiB in all)")
        return 2
    call = run_call(dest)
    print("\nThe device tool's `run` call (the machine's first call; the table is printed last, results.json / "
          "table.md / suite.log come back from $OUT):")
    print(f"  command:   {call['command']}")
    print(f"  carry:     {call['carry']}")
    print(f"  timeout_s: {call['timeout_s']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
