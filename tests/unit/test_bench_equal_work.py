"""bench/vs_trl.py's equal-work rule (issue 41, part 0) and the GPU suite's harness, without running a benchmark:
two rows are compared only when their tokens per completion are within 10 % (no ratio at all otherwise, the refusal
naming both figures); the headline is generated tokens per second, the time per step beside it; the rigged long-answer
rows run at learning rate 0, and an update at learning rate 0 does its compute yet leaves every weight (so the
length rig) as it was; a tiny shape keeps its family with its special ids inside the small vocabulary; the suite's
table says which rows were not measured and the command for them, in the format docs/performance.md holds;
real_shapes.py's tables."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from conftest import import_bench, rollout_of, running, score_of, sleeper_with_child


@pytest.fixture(scope="module")
def report():
    return import_bench("_report")


def _summary(report, lengths, steps=(0.0, 3.0, 5.0, 7.0), maxes=None, completions=8):
    result = {"step_ends": list(steps), "response_len": lengths, "response_max": maxes or [2 * x for x in lengths]}
    return report.summarize(result, warmup=1, completions=completions)


def test_summary_leaves_the_warm_up_out_and_counts_generated_tokens(report):
    s = _summary(report, [100.0, 60.0, 64.0], maxes=[400.0, 250.0, 300.0])
    assert s["step_s"] == 2.0  # steps 2 and 3 (2 s each); the first step (3 s, with compilation) left out
    assert s["tok_mean"] == 62.0 and s["tok_max"] == 300.0  # the warm-up's 100-token answers left out too
    assert s["tok_s"] == pytest.approx(62.0 * 8 / 2.0)
    assert s["completions"] == 16


def test_rows_are_compared_only_at_equal_work(report):
    ours, peer = _summary(report, [0, 64.0, 64.0]), _summary(report, [0, 58.0, 58.0], steps=(0.0, 3.0, 6.0, 9.0))
    refused = report.compare(ours, peer)  # 64 vs 58 tokens: +10.3 %
    assert not refused["equal"] and refused["per_token"] is None and refused["per_step"] is None
    assert "64.0 vs 58.0 (+10.3%)" in refused["work"]
    close = _summary(report, [0, 60.0, 60.0], steps=(0.0, 3.0, 6.0, 9.0))  # 64 vs 60: +6.7 %
    c = report.compare(ours, close)
    assert c["equal"] and c["per_step"] == pytest.approx(3.0 / 2.0)
    assert c["per_token"] == pytest.approx((64 * 8 / 2.0) / (60 * 8 / 3.0))  # the headline corrects what is left
    sft = report.compare({"step_s": 1.0, "tok_mean": None}, {"step_s": 2.0, "tok_mean": None})
    assert sft["equal"] and sft["per_step"] == 2.0 and sft["per_token"] is None  # same data rows: equal by design


def test_an_unequal_comparison_prints_no_ratio_anywhere(report):
    results = {("grpo", "rlhfkit[auto]"): [_summary(report, [0, 90.0, 90.0])],
               ("grpo", "trl"): [_summary(report, [0, 60.0, 60.0])]}
    comps = report.comparisons(results, ["grpo"], ["rlhfkit[auto]"], ["trl"])
    lines = report.ratio_lines(comps, "cpu") + report.comparison_table(comps, "cpu")
    assert lines[0].startswith("UNEQUAL") and "90.0 vs 60.0" in lines[0]
    assert not any("RATIO" in line or "x |" in line or "x**" in line for line in lines)
    assert "refused (unequal work)" in lines[-1]
    table = report.rows_table(results, ["grpo"], "cpu")
    assert "| 90.0 / 180 |" in table[2] or "| 90.0 / 180 |" in table[3]  # tokens per completion: mean / max


def test_rounds_pool_by_completions_and_keep_the_longest(report):
    a, b = _summary(report, [0, 50.0, 50.0], completions=8), _summary(report, [0, 80.0], completions=8,
                                                                     steps=(0.0, 1.0, 2.0))
    p = report.pooled([a, b])
    assert p["tok_mean"] == pytest.approx((50 * 16 + 80 * 8) / 24) and p["tok_max"] == 160.0


def test_long_answer_rows_run_at_learning_rate_zero():
    vs_trl = import_bench("vs_trl")
    assert vs_trl.settings("cpu", 512, "shape", mean_len=128)["lr"] == 0.0  # the rig must survive every step
    assert vs_trl.settings("cpu", None, throughput=True)["lr"] == 0.0
    assert vs_trl.settings("cpu", None)["lr"] == 1e-6  # a learning run otherwise
    assert vs_trl.settings("cuda", 1024, "shape", 16, 8, 256, micro=16)["micro"] == 16
    with pytest.raises(SystemExit, match="does not divide"):
        vs_trl.settings("cpu", None, prompts=2, k=3, micro=4)


def test_a_tiny_shape_keeps_its_family_with_its_special_ids_in_the_small_vocabulary():
    shapes = import_bench("_shapes")
    root = shapes.Path(__file__).resolve().parents[2] / "bench" / "shapes"
    for name in ("qwen3-0.6b", "llama-3.2-1b"):
        cfg = json.loads((root / name / "config.json").read_text())
        gen = json.loads((root / name / "generation_config.json").read_text())
        small, small_gen = shapes.tiny_config(cfg, gen)
        assert small["model_type"] == cfg["model_type"] and small["vocab_size"] == 1024
        assert small.get("rope_scaling") == cfg.get("rope_scaling") and small["rope_theta"] == cfg["rope_theta"]
        ids = [small["bos_token_id"], small["eos_token_id"], *([small_gen["eos_token_id"]] if isinstance(
            small_gen["eos_token_id"], int) else small_gen["eos_token_id"])]
        assert all(0 < i < 1024 for i in ids)
        assert small_gen["bos_token_id"] == small["bos_token_id"]  # one id, one new number, in both files
    qwen, gen = shapes.tiny_config(json.loads((root / "qwen3-0.6b" / "config.json").read_text()),
                                   json.loads((root / "qwen3-0.6b" / "generation_config.json").read_text()))
    assert qwen["head_dim"] == 16 and gen["eos_token_id"] == [qwen["eos_token_id"], qwen["bos_token_id"]]


@pytest.mark.parametrize("name", ["qwen3-0.6b", "llama-3.2-1b"])
def test_chain_rig_answers_at_the_length_the_prompt_sets_whatever_the_sampling(tmp_path, name):
    """The long-answer rows' equal work by construction: a prompt whose data chose level n - 1 gets answers of
    exactly n tokens (EOS included) in every sample, the words differing (so a reward still differs within a
    group); the head is untied on disk (a tied head cannot chain); the data write one prompt per length."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shapes, common, vs_trl = import_bench("_shapes"), import_bench("_common"), import_bench("vs_trl")
    root = shapes.Path(__file__).resolve().parents[2] / "bench" / "shapes"
    model_dir = shapes.random_model(root / name, tmp_path, 8, tiny=True, chain=24)
    levels = json.loads((model_dir / "levels.json").read_text())
    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    assert not model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    s = vs_trl.settings("cpu", 24, "shape", prompts=5, k=4, mean_len=8)
    lengths = common.chain_lengths(5, 8, 24)
    assert lengths == sorted(lengths) and lengths[-1] > 2 * sum(lengths) / 5  # a long tail
    data = vs_trl.write_data(tmp_path, s, levels)
    rows = [json.loads(line) for line in data["prompts"].read_text().splitlines()]
    assert len(rows) == 5  # every step of every framework takes them all
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    torch.manual_seed(0)
    for row, n in zip(rows, lengths):
        ids = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
        out = model.generate(ids.repeat(6, 1), do_sample=True, temperature=1.0, top_k=0, max_new_tokens=24,
                             pad_token_id=tok.pad_token_id)[:, ids.shape[1]:]
        got = [next((j + 1 for j, t in enumerate(r.tolist()) if t in eos), len(r)) for r in out]
        assert got == [n] * 6
        if n > 2:
            assert len({tuple(r[: n - 1].tolist()) for r in out}) > 1  # the words differ, the lengths do not


def test_an_update_at_learning_rate_zero_computes_and_leaves_every_weight(tmp_path):
    """The throughput rows' premise, with rlhfkit's own optimizer (fused AdamW): the update runs its forward,
    backward and optimizer step (AdamW's moments move), and not one weight changes."""
    from rlhfkit.config import build_config
    from rlhfkit.tasks import make_task_data
    from rlhfkit.train.lifecycle.run import start_run
    from rlhfkit.train.online.synchronous import OnlineTrainer

    make_task_data("quickstart", tmp_path / "data", n=16, n_eval=4)
    cfg = build_config("grpo", {}, [
        f"data.train={tmp_path / 'data' / 'prompts.jsonl'}", "data.eval=null", "data.eval_fraction=0",
        f"output_dir={tmp_path / 'run'}", "model.name=tiny:hidden=64,layers=2,intermediate=128", "optim.lr=0",
        "generation.max_new_tokens=8", "track.report=false", "data.max_length=64", "train.resume=never",
        "reward.functions=[{fn: 'bench/vs_trl.py:reward'}]", "algo.rollout_batch_size=4", "algo.num_generations=2",
        "algo.mini_batch_size=8", "train.batch_size=4", "algo.total_episodes=8", "algo.ppo_epochs=1"])
    online = OnlineTrainer(cfg, start_run(cfg))
    try:
        learner = online.learner
        learner.set_up(total_updates=1)  # rlhfkit's optimizer (build_optimizer: fused AdamW) and schedule
        before = {n: p.detach().clone() for n, p in learner.policy.named_parameters()}
        exp = rollout_of(online, seed=1)
        score_of(online, exp)
        learner.forward_passes(exp)
        learner.advantages(exp)
        assert exp.advantages.abs().sum() > 0  # a real signal to follow
        learner.ppo_update(exp, step=0)
        moments = [s["exp_avg"] for s in learner.opt.state.values() if "exp_avg" in s]
        assert moments and any(m.abs().sum() > 0 for m in moments)  # the step was taken, gradients and all
        assert all(torch.equal(p, before[n]) for n, p in learner.policy.named_parameters())
    finally:
        online.close()


def test_the_suite_table_names_what_was_not_measured_and_the_next_command():
    suite = import_bench("gpu_suite")
    assert len({r.key for r in suite.ROWS}) == len(suite.ROWS) == 7
    report = {"meta": {"dry": False, "device_name": "NVIDIA H200", "date": "2026-12-01 10:00", "commit": "abc1234",
                       "torch": "t", "transformers": "tf", "trl": "1.16.0"},
              "rows": {"long_qwen3": {"status": "ok", "seconds": 300, "cpu_seconds": 310, "parts": {}},
                       "long_llama": {"status": "stopped at the budget after 200 s (its finished parts kept)",
                                      "seconds": 200, "parts": {}},
                       "seeds_ppo": {"status": "not reached (needs ~300 s, 20 s left)"},
                       "qwen3_8b_lora": {"status": suite.PENDING}}}  # the call stopped from outside before it
    text = "\n".join(suite.table(report))
    assert "| 1 | GRPO long answers vs TRL, Qwen3-0.6B shape | ok | 2026-12-01 10:00 | NVIDIA H200 | abc1234 | " \
           "300 (310) |" in text  # date, device and commit on every row: the line docs/performance.md takes
    assert "| 3 | PPO Llama-2-7B + Pythia-1.4B: plan vs peak (LoRA; full, FSDP2 CPU offload) | not reached" in text
    assert "| 6 | fused LM head at V = 151,936: bytes and speed | not asked in this call |" in text
    assert "| 4 | GRPO Qwen3-8B LoRA (QLoRA when carried): plan vs peak | pending (not run when" in text
    assert "`python3 bench/gpu_suite.py --out $OUT --rows 2,3,4`" in text  # 5-7 were not asked for here


def test_the_docs_hold_the_suite_summary_in_its_format_and_one_call_fits_nine_minutes():
    """docs/performance.md's GPU-suite table is the one the suite prints (header and row titles, in order), so a
    call's ``table.md`` pastes into it; the `run` call gpu_wheels.py prints stays within 9 minutes, the suite's
    budget inside it with room for the wheels' install and Python's start."""
    suite, wheels = import_bench("gpu_suite"), import_bench("gpu_wheels")
    doc = (suite.ROOT / "docs" / "performance.md").read_text()
    at = doc.index(suite.SUMMARY_HEADER[0])
    rows = doc[at:].split("\n\n")[0].splitlines()[2:]
    assert [r.split(" | ")[:2] for r in rows] == [[f"| {i}", row.title] for i, row in enumerate(suite.ROWS, 1)]
    call = wheels.run_call(wheels.ROOT / ".whl")
    assert call["timeout_s"] <= 540 and suite.BUDGET_S + 30 <= call["timeout_s"] and len(call["command"]) < 2000
    assert "--budget" not in call["command"] and call["carry"] == [".whl"]


def test_a_part_being_written_when_a_row_stopped_is_left_out(tmp_path):
    suite = import_bench("gpu_suite")
    (tmp_path / "a.json").write_text('{"x": 1}')
    (tmp_path / "b.json").write_text('{"x": ')  # cut short
    assert suite.read_parts(tmp_path) == {"a": {"x": 1}}


def _speed_run(report, fw, lengths):
    runs = [_summary(report, [0, *lengths])]
    return {"recipe": "grpo", "framework": fw, "runs": runs, "pooled": report.pooled(runs)}


def test_real_shapes_tables_refuse_unequal_work_and_set_the_peak_against_plan(report):
    shapes = import_bench("real_shapes")
    meta = {"where": "cpu, qwen3-0.6b", "date": "d", "settings": {"prompts": 4, "k": 8, "micro": 4}}
    data = {"meta": meta, "rows": [_speed_run(report, "rlhfkit[auto]", [90.0, 90.0]),
                                   _speed_run(report, "rlhfkit[static:compile=false]", [62.0, 62.0]),
                                   _speed_run(report, "trl", [60.0, 60.0])]}
    text = "\n".join(shapes.speed_lines({"qwen3-0.6b": data, "llama-3.2-1b": None}))
    assert "| grpo | rlhfkit[auto] | TRL (generate) | **NO**: tokens / completion 90.0 vs 60.0" in text
    assert "refused (unequal work)" in text
    assert "| rlhfkit[static:compile=false] | TRL (generate) | yes: tokens / completion 62.0 vs 60.0" in text
    assert "llama-3.2-1b: no result" in text
    rows = [{"shape": "qwen3-0.6b", "lora": None, "prompts": 2, "k": 2, "prompt_len": 64, "new": 192, "micro": 2,
             "rss_mib": 1080.0, "plan": {"peak_mib": 1000.0, "peak_phase": "train step"}},
            {"shape": "qwen3-1.7b", "lora": 16, "error": "exit 1: killed"}]
    lines = shapes.memory_lines(rows)
    assert lines[2].endswith("| 0.98 GiB (train step) | 1.05 GiB | 1.08 |") and "every weight" in lines[2]
    assert "LoRA r=16" in lines[3] and "exit 1: killed" in lines[3]


def test_real_shapes_memory_runs_only_the_cases_asked_for(tmp_path, monkeypatch):
    shapes, built = import_bench("real_shapes"), []
    monkeypatch.setattr(import_bench("_shapes"), "random_model", lambda path, work, tiny: built.append(path.name))
    monkeypatch.setattr(shapes._stop, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "out of memory"))
    args = shapes.argparse.Namespace(mem_cases="qwen3-1.7b", quick=True, work=str(tmp_path), mem_prompts=2,
                                     mem_k=2, mem_new=8, prompt_len=8, mem_micro=2, threads=None)
    out: dict = {}
    shapes.memory(args, out)
    assert built == ["qwen3-1.7b"] and [r["shape"] for r in out["memory"]] == ["qwen3-1.7b"]
    assert out["memory"][0]["error"] == "exit 1: out of memory"  # a failed case is a row that says why


def test_the_suite_stops_a_row_at_its_budget_and_names_the_rows_left(tmp_path, capsys):
    """The harness itself, end to end in seconds: the first row asked for always starts and is stopped (its process
    group killed) at the budget's end; the next does not start in what is left; both are named for the next call,
    in the three output files and in the table printed last."""
    suite = import_bench("gpu_suite")
    out = tmp_path / "out"
    rc = suite.main(["--dry-run", "--rows", "5,6", "--budget", "1", "--out", str(out), "--work", str(tmp_path / "w")])
    assert rc == 0 and sorted(p.name for p in out.iterdir()) == ["results.json", "suite.log", "table.md"]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert rows["families"]["status"].startswith("stopped at the budget after 1 s")
    assert rows["fused_head"]["status"].startswith("not reached (needs ~10 s")
    table = (out / "table.md").read_text()
    assert "`python3 bench/gpu_suite.py --out $OUT --rows 5,6`" in table and "| 1 | GRPO long answers" in table
    assert capsys.readouterr().out.rstrip().endswith(table.rstrip())  # the table, printed last


def test_a_stopped_suite_stops_its_running_row_and_says_so(tmp_path):
    """A `timeout` or `kill` (SIGTERM) of the suite ended only the suite: the running row, in its own process group
    (so the budget can stop it whole), went on holding the device after the call had returned. Now the row's group
    goes with the suite, the row is marked stopped (named for the next call) and the suite exits 143. The row here
    is a stand-in that writes its pid and its child's, then sleeps; the signal goes to this test's own child."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench"
    pids, out = tmp_path / "pids", tmp_path / "out"
    sleeper = sleeper_with_child(tmp_path / "row.py", pids)
    program = ("import sys\n"
               f"sys.path.insert(0, {str(bench)!r})\n"
               "from pathlib import Path\n"
               "import gpu_suite as s\n"
               f"s.HERE = Path({str(sleeper)!r})\n"
               "s.ROWS = [s.Row('sleepy', 'a row that sleeps', run=None, lines=lambda parts: [], seconds=1)]\n"
               f"raise SystemExit(s.main(['--dry-run', '--rows', 'sleepy', '--out', {str(out)!r}, '--work', "
               f"{str(tmp_path / 'w')!r}]))\n")
    suite = subprocess.Popen([sys.executable, "-c", program], cwd=bench.parent, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline and suite.poll() is None:
        time.sleep(0.05)
    row_pids = [int(x) for x in pids.read_text().split()]
    suite.send_signal(signal.SIGTERM)
    output = suite.communicate(timeout=60)[0]

    time.sleep(0.5)
    leftover = [pid for pid in row_pids if running(pid)]
    for pid in leftover:  # harmless if the check fails: only this test's own stand-ins
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"the row's processes {leftover} outlived the suite"
    assert suite.returncode == 143, output
    status = json.loads((out / "results.json").read_text())["rows"]["sleepy"]["status"]
    assert status.startswith("stopped by a signal (exit 143) after"), status
    assert "`python3 bench/gpu_suite.py --out $OUT --rows 1`" in (out / "table.md").read_text()
