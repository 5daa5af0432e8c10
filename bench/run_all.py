"""Run the three ratio benchmarks (bench/logprobs.py, bench/response_logits.py, bench/rollout.py) one after the
other, each in its own process (so peak-memory numbers do not leak between them), and print their RATIO lines.

``--quick`` sizes on CPU (tiny models, a smoke run of a minute or so); their full sizes on CUDA. Every line is a
ratio peer/rlhfkit measured in the same run (> 1: rlhfkit is faster / smaller); see bench/README.md for the peers.

    .venv/bin/python bench/run_all.py            # CPU: --quick
    python bench/run_all.py                      # CUDA: full sizes
    python bench/run_all.py --quick              # CUDA, tiny sizes
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import _stop
import torch

HERE = Path(__file__).resolve().parent
SCRIPTS = ("logprobs.py", "response_logits.py", "rollout.py")


def main() -> int:
    quick = "--quick" in sys.argv[1:] or not torch.cuda.is_available()
    extra = ["--quick"] if quick else []
    print(f"device {'cuda: ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}, "
          f"torch {torch.__version__}, {'quick' if quick else 'full'} sizes", flush=True)
    failed = 0
    for script in SCRIPTS:
        t0 = time.perf_counter()
        proc = _stop.run([sys.executable, str(HERE / script), *extra], capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RATIO")]
        if proc.returncode != 0 or not lines:
            failed += 1
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            print(f"FAIL {script} (exit {proc.returncode}):\n{tail}")
            continue
        for ln in lines:
            print(ln)
        print(f"  ({script}: {time.perf_counter() - t0:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
