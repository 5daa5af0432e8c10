"""Bad input through the real command line: each mistake exits with code 2 and ONE line on stderr that names the
file:line or the key, and a failing run loses nothing a previous run wrote.

All cases run as subprocesses started together (each pays the torch / transformers import once), then each test
checks its own result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TINY = "tiny:hidden=64,layers=2,intermediate=128"
GOOD = [{"prompt": f"shout: {w}", "completion": w.upper()} for w in ["cat", "dog", "owl", "bee"] * 8]

# case -> (argv, strings the one stderr line must contain)
CASES: dict[str, tuple[list[str], list[str]]] = {
    "malformed_jsonl": (["sft", "data.train=bad.jsonl", f"model.name={TINY}", "output_dir=runs/a"],
                        ["bad.jsonl:3", "invalid JSON"]),
    "missing_field": (["sft", "data.train=missing.jsonl", f"model.name={TINY}", "output_dir=runs/b"],
                      ["missing.jsonl:2", "missing field 'completion'"]),
    "empty_file": (["sft", "data.train=empty.jsonl", f"model.name={TINY}", "output_dir=runs/c"],
                   ["empty.jsonl", "no records"]),
    "unknown_key": (["sft", "optim.lrr=1"], ["optim.lrr", "did you mean 'optim.lr'"]),
    "unknown_key_in_file": (["sft", "typo.yaml"], ["typo.yaml", "train.batchsize", "did you mean 'train.batch_size'"]),
    "wrong_type": (["sft", "train.batch_size=many"], ["train.batch_size", "must be an integer"]),
    "missing_config_file": (["sft", "nope.yaml"], ["nope.yaml", "not found"]),
    "prompt_too_long": (["sft", "data.train=long.jsonl", f"model.name={TINY}", "data.max_length=48",
                         "data.overflow=error", "output_dir=runs/d"], ["long.jsonl:2", "tokens"]),
    "unknown_reward_module": (["eval", TINY, "--data", "prompts.jsonl", "--functions", "nope.mod:fn"],
                              ["nope.mod", "--functions"]),
    "eval_missing_model": (["eval", "./no/such/model", "--data", "prompts.jsonl"], ["./no/such/model", "not found"]),
    "eval_missing_data": (["eval", TINY, "--data", "nothere.jsonl"], ["nothere.jsonl", "no such file"]),
    "sft_missing_model": (["sft", "data.train=good.jsonl", "model.name=./no/such/model", "output_dir=runs/e"],
                          ["model.name", "./no/such/model"]),
    "generate_missing_model": (["generate", "./no/such/model", "--prompt", "hi"], ["./no/such/model"]),
    "export_missing_model": (["export", "./no/such/run", "--out", "exported"], ["./no/such/run"]),
    "eval_usage": (["eval", TINY], ["--data"]),
    # a previous run's directory: the failing runs below must not destroy what it holds
    "keeps_previous_bad_data": (["sft", "data.train=bad.jsonl", f"model.name={TINY}", "output_dir=prev1"],
                                ["bad.jsonl:3"]),
    "keeps_previous_bad_model": (["sft", "data.train=good.jsonl", "model.name=./no/such/model", "output_dir=prev2"],
                                 ["./no/such/model"]),
}
PREVIOUS = {"metrics.jsonl": '{"step": 1, "train/loss": 1.0}\n', "model.safetensors": "weights",
            "config.json": '{"architectures": ["LlamaForCausalLM"]}', "config.yaml": "# the previous run's config\n",
            "samples.jsonl": "{}\n", "checkpoint-10/trainer_state.pt": "state"}


def _write_inputs(root: Path) -> None:
    def jsonl(name, rows, raw=()):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows) + "".join(line + "\n" for line in raw))

    jsonl("good.jsonl", GOOD)
    jsonl("bad.jsonl", GOOD[:2], ['{"prompt": "shout: cat", "completion": "CAT"'] + [json.dumps(r) for r in GOOD[2:]])
    jsonl("missing.jsonl", [GOOD[0], {"prompt": "shout: dog"}] + GOOD[1:])
    (root / "empty.jsonl").write_text("")
    jsonl("long.jsonl", [GOOD[0], {"prompt": "shout: " + "x" * 200, "completion": "X"}] + GOOD[1:])
    jsonl("prompts.jsonl", [{"prompt": "shout: cat", "answer": "CAT"}])
    (root / "typo.yaml").write_text("train:  # loop\n  batchsize: 8  # typo\n")
    for run in ("prev1", "prev2"):
        for name, text in PREVIOUS.items():
            (root / run / name).parent.mkdir(parents=True, exist_ok=True)
            (root / run / name).write_text(text)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[int, str, str, Path]]:
    root = tmp_path_factory.mktemp("bad-input")
    _write_inputs(root)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "default"}
    procs = {}
    for case, (argv, _) in CASES.items():
        procs[case] = subprocess.Popen([sys.executable, "-m", "rlhfkit", *argv], cwd=root, env=env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = {}
    for case, p in procs.items():
        stdout, stderr = p.communicate(timeout=600)
        out[case] = (p.returncode, stdout, stderr, root)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line(case, results):
    rc, stdout, stderr, _ = results[case]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert rc == 2, f"exit {rc}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert len(lines) == 1, "expected one line on stderr, got:\n" + stderr
    assert lines[0].startswith("error: ")
    for needle in CASES[case][1]:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert "Traceback" not in stdout + stderr


def test_config_errors_fail_before_any_run_directory(results):
    root = results["unknown_key"][3]
    assert not (root / "runs" / "sft").exists()  # the default output_dir was never created


@pytest.mark.parametrize("case", ["keeps_previous_bad_data", "keeps_previous_bad_model"])
def test_failed_run_keeps_previous_metrics_model_and_checkpoints(case, results):
    root = results[case][3]
    run = root / ("prev1" if case.endswith("data") else "prev2")
    for name, text in PREVIOUS.items():
        if name == "config.yaml":
            continue  # checked by the next test
        assert (run / name).read_text() == text, name
    assert not (run / ".saving").exists()

@pytest.mark.parametrize("case", ["keeps_previous_bad_data", "keeps_previous_bad_model"])
def test_failed_run_keeps_previous_config_yaml(case, results):
    root = results[case][3]
    run = root / ("prev1" if case.endswith("data") else "prev2")
    assert (run / "config.yaml").read_text() == PREVIOUS["config.yaml"]


def test_eval_writes_nothing_on_bad_input(results):
    root = results["unknown_reward_module"][3]
    assert not (root / "eval.json").exists()


def test_export_writes_nothing_on_bad_input(results):
    assert not (results["export_missing_model"][3] / "exported").exists()
