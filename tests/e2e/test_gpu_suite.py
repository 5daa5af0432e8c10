"""bench/gpu_suite.py --dry-run (issue 41): every row of the GPU suite runs its code path on CPU at tiny sizes, each
row's part files are written, the outputs are three files (the device machine sends back at most eight) and the
table is printed last. Marked ``cluster`` (several processes; 2.5 minutes of CPU, 7.4 of wall time on 2 loaded
cores): CI runs it in ``make test-cluster``, so the suite cannot rot between GPU calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.cluster
def test_dry_run_runs_every_row_and_writes_three_files(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_suite.py"), "--dry-run", "--out", str(out),
                           "--work", str(tmp_path / "work")], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "suite.log", "table.md"]
    report = json.loads((out / "results.json").read_text())
    suite_rows = ["long_qwen3", "long_llama", "seeds_ppo", "qwen3_8b_lora", "families", "fused_head"]
    assert list(report["rows"]) == suite_rows and all(r["status"] == "ok" for r in report["rows"].values())
    parts = report["rows"]["long_qwen3"]["parts"]
    runs = parts["vs_trl_qwen3-0.6b"]["rows"]
    assert {r["framework"] for r in runs} >= {"rlhfkit[static:compile=false]", "rlhfkit[continuous]"}
    assert all(r["pooled"]["tok_mean"] and r["pooled"]["rss_mib"] for r in runs)  # tokens per completion, memory
    assert len([k for k in report["rows"]["families"]["parts"] if k.startswith("family_")]) == 8
    assert all(p["status"] == "PASS" for k, p in report["rows"]["families"]["parts"].items())
    table = (out / "table.md").read_text()
    assert table in proc.stdout and "## 6. fused LM head" in table  # the table, printed last
    assert "| # | row | status | date | device | commit |" in table  # docs/performance.md's format
    assert "dry" in report["rows"]["long_llama"]["parts"]  # row 1's code path at another shape: said, not rerun
