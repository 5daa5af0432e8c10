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
    suite_rows = ["long_qwen3", "long_llama", "seeds_ppo", "qwen3_8b_lora", "families", "fused_head", "vlm_3b"]
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
    vlm = report["rows"]["vlm_3b"]["parts"]["case_5"]["result"]  # GRPO on pictures ran its two steps
    assert [p[0] for p in vlm["phases"]] == ["rollout (generation)", "scoring and forward passes", "train step"]
    assert vlm["s_per_step"] > 0 and all(pred > 0 for _, pred, _ in vlm["phases"])
    assert "## 7. GRPO Qwen2.5-VL-3B" in table and "56 x 56 picture (4 image tokens)" in table


@pytest.mark.cluster
def test_the_vlm_rows_full_size_files_give_what_plan_counts(tmp_path, monkeypatch):
    """The GPU row's Qwen2.5-VL-3B directory at its real sizes (the dry run runs it tiny): the processor rlhfkit loads
    from it makes 256 image tokens of a 448 x 448 picture, ``plan`` counts 256 per image and the whole model, and the
    word tokenizer's special tokens sit at the config's ids in the full vocabulary."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import big_models

    from rlhfkit.data import LengthPolicy, normalize_record, tokenize_dataset
    from rlhfkit.models.loading import load_tokenizer_for
    from rlhfkit.plan import plan

    cfg, _ = big_models.case_config(big_models.case_specs(False)[5], False, tmp_path)
    assert cfg.model.lora.enabled and not cfg.model.train_vision
    config = json.loads((Path(cfg.model.name) / "config.json").read_text())
    tok = load_tokenizer_for(cfg.model)
    assert len(tok) == config["vocab_size"] == 151_936
    assert tok.convert_tokens_to_ids("<|image_pad|>") == config["image_token_id"]
    assert (tok.eos_token_id, tok.convert_tokens_to_ids("<|vision_start|>")) == (config["eos_token_id"],
                                                                                  config["vision_start_token_id"])
    first = json.loads(Path(cfg.data.train).read_text().splitlines()[0])
    first["image"] = str(Path(cfg.data.train).parent / first["image"])
    (ex,), _ = tokenize_dataset([normalize_record(first, "prompt", where="r:0")], "prompt", tok,
                                LengthPolicy(cfg.data.max_length))
    assert ex["media"].tokens == 256 and len(ex["prompt_ids"]) == cfg.data.max_length - 1  # 64 words + 256 + 7
    text = plan(cfg, world=1, device="cuda", checks=False).render()
    assert "3.755B parameters" in text and "vision tower 668.7M parameters (frozen), 256 image tokens per image" in text
