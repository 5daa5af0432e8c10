"""The Python API end to end on the tiny model: the docs' Python example (docs/python.md) as written, a TRL user's GRPO
script ported by changing its imports, a callback that stops a run with a checkpoint (and train() again resumes it),
a loaded model and tokenizer, TRL-convention reward functions on conversational data from Python and from YAML,
reasoning-gym as data and verifier."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
UNIT = ROOT / "tests" / "unit"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))  # datasets / models written by the API land here
    from rlhfkit.config import aliases

    monkeypatch.setattr(aliases, "_ALIASES_LOGGED", set())  # notes are once per process: these tests' own set


def metrics_of(run_dir) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_docs_python_example_runs_as_written(tmp_path, monkeypatch, capsys):
    text = (ROOT / "docs" / "python.md").read_text()
    block = re.search(r"<!-- python-example:begin -->\n```python\n(.*?)```\n<!-- python-example:end -->", text, re.S)
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "__main__"}
    exec(compile(block.group(1), "docs/python.md", "exec"), scope)  # noqa: S102 - the docs' own code
    summary = scope["summary"]
    out = capsys.readouterr().out
    assert summary.run_dir == Path("runs/python-grpo") and summary.stopped is None
    assert (tmp_path / "runs/python-grpo/finished.json").is_file()
    assert "reward" in summary.last_metrics and "[grpo] finished" in summary.line  # TRL's metric names
    assert summary.global_step >= 2 and set(summary.metrics) >= {"train_runtime", "train_loss"}  # TrainOutput's
    assert len(re.findall(r"^step \d+: reward", out, re.M)) == 2  # the callback heard both rollout steps
    assert "runs in this process" in out  # reward_len is the script's own: called here, under the time limit
    cfg = (tmp_path / "runs/python-grpo/config.yaml").read_text()
    data = re.search(r"^  train: (\S+)", cfg, re.M).group(1)
    assert Path(data).is_file() and Path(data).parent == tmp_path / "cache" / "datasets"


@pytest.mark.slow
def test_trl_users_grpo_script_runs_with_changed_imports(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(HERE / "trl_port_script.py"), str(out), TINY], env=env,
                          capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "[grpo] finished" in proc.stdout
    rows = [r for r in metrics_of(out) if "rewards/reward_len/mean" in r]
    assert rows and all(r["rewards/reward_len/mean"] <= 0 for r in rows)  # -|20 - len|: the script's function ran
    assert (out / "adapter" / "adapter_config.json").is_file()  # the LoraConfig was applied
    assert "lora_alpha" not in proc.stderr  # no transformers / peft warnings leaked


@pytest.mark.slow
def test_callback_stops_with_a_checkpoint_and_train_again_resumes(tmp_path, monkeypatch, capsys):
    from rlhfkit import Callback, SFTConfig, SFTTrainer
    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import load_causal_lm

    monkeypatch.chdir(tmp_path)
    model, tok = load_causal_lm(ModelConfig(name=TINY), trainable=False)
    rows = [{"prompt": f"echo {w}", "completion": w} for w in ("red", "blue", "green", "gold") * 8]

    class StopAtTwo(Callback):
        def __init__(self):
            self.saved, self.steps = [], []

        def on_step(self, step, metrics):
            self.steps.append(step)
            return step == 2

        def on_save(self, step, path):
            self.saved.append((step, Path(path).name))

    cb = StopAtTwo()
    args = SFTConfig(output_dir="runs/sft", learning_rate=1e-3, per_device_train_batch_size=4, logging_steps=1,
                     num_train_epochs=1, **{"data.eval_fraction": 0, "train.save_every": 0})
    trainer = SFTTrainer(model=model, processing_class=tok, args=args, train_dataset=rows, callbacks=[cb])
    assert Path(trainer.config.model.name).parent == tmp_path / "cache" / "models"
    first = trainer.train()
    assert first.stopped == "stopped by a callback (StopAtTwo.on_step) at step 2; checkpoint-2 saved; train() again " \
                            "resumes it"
    assert first.line.startswith("[sft] stopped in ")
    assert cb.saved == [(2, "checkpoint-2")] and (tmp_path / "runs/sft/checkpoint-2").is_dir()
    assert not (tmp_path / "runs/sft/finished.json").exists()
    cb.steps.clear()
    second = SFTTrainer(model=model, processing_class=tok, args=args, train_dataset=rows,  # a new trainer: as in TRL
                        callbacks=[]).train(resume_from_checkpoint=True)
    assert second.stopped is None and (tmp_path / "runs/sft/finished.json").is_file()
    assert "resumed from" in capsys.readouterr().out
    steps = [r["step"] for r in metrics_of(tmp_path / "runs/sft") if "loss" in r]  # TRL's name
    assert steps == list(range(1, 9))  # 32 rows / 4 per update: 8 updates, the first 2 before the stop, once each


def _conversational_rows(n: int) -> list[dict]:
    return [{"prompt": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": f"Name {i}."}],
             "ground_truth": str(i)} for i in range(n)]


ONLINE = {"learning_rate": 1e-3, "num_generations": 4, "max_completion_length": 8,
          "algo.rollout_batch_size": 8, "algo.mini_batch_size": 32, "algo.total_episodes": 64, "data.eval_fraction": 0,
          "track.report": False, "train.resume": "never"}


@pytest.mark.slow
def test_trl_reward_functions_on_conversational_data_from_python(tmp_path):
    # TRL's docs' example 2 (completion[0]["content"]) and example 1 (completion ids), and a check that the prompts
    # arrive as the data's messages; by module (they run in the reward workers)
    from datasets import Dataset

    from rlhfkit import GRPOTrainer

    sys.path.insert(0, str(UNIT))
    import trl_reward_fns

    def saw_messages(prompts, completions, **kwargs):  # the script's own: called in this process
        ok = [p[0]["role"] == "system" and c[0]["role"] == "assistant" for p, c in zip(prompts, completions)]
        return [1.0 if o else -1.0 for o in ok]

    out = tmp_path / "grpo"
    summary = GRPOTrainer(model=TINY, args={**ONLINE, "output_dir": str(out)},
                          reward_funcs=[trl_reward_fns.format_reward_func, trl_reward_fns.reward_func, saw_messages],
                          train_dataset=Dataset.from_list(_conversational_rows(16))).train()
    rows = [r for r in metrics_of(out) if "rewards/saw_messages/mean" in r]
    assert len(rows) == 2 and all(r["rewards/saw_messages/mean"] == 1.0 for r in rows)
    assert all(r["rewards/format_reward_func/mean"] == 0.0 for r in rows)  # the tiny model writes no <think>
    assert all(r["rewards/reward_func/mean"] >= 1.0 for r in rows)  # token counts of the completions
    assert summary.last_metrics["rewards/reward_func/mean"] == rows[-1]["rewards/reward_func/mean"]


@pytest.mark.slow
def test_trl_reward_function_on_conversational_data_from_yaml(tmp_path):
    from rlhfkit.config import load_config
    from rlhfkit.train.online.synchronous import run_online

    (tmp_path / "rewards.py").write_text(
        "def is_message(completions, **kwargs):\n"
        "    return [1.0 if c[0]['role'] == 'assistant' and isinstance(c[0]['content'], str) else -1.0\n"
        "            for c in completions]\n")
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _conversational_rows(16)))
    (tmp_path / "grpo.yaml").write_text(
        f"model: {{name: '{TINY}'}}\ndata: {{train: {data}, eval_fraction: 0}}\noutput_dir: {tmp_path / 'run'}\n"
        f"reward:\n  functions: [{{fn: {tmp_path / 'rewards.py'}:is_message}}]\n"
        "algo: {rollout_batch_size: 8, num_generations: 4, mini_batch_size: 32, total_episodes: 64}\n"
        "generation: {max_new_tokens: 8}\ntrack: {report: false}\n")
    run_online(load_config("grpo", tmp_path / "grpo.yaml"))
    rows = [r for r in metrics_of(tmp_path / "run") if "rewards/is_message/mean" in r]
    assert len(rows) == 2 and all(r["rewards/is_message/mean"] == 1.0 for r in rows)


@pytest.mark.slow
def test_reasoning_gym_task_trains_end_to_end(tmp_path):
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is in the dev extra")
    from rlhfkit import GRPOTrainer

    out = tmp_path / "rg"
    summary = GRPOTrainer(model=TINY, reward_funcs="reasoning_gym", args={**ONLINE, "output_dir": str(out)},
                          train_dataset="reasoning_gym:basic_arithmetic?size=16&seed=0",
                          eval_dataset="reasoning_gym:basic_arithmetic?size=8&seed=1").train()
    rows = [r for r in metrics_of(out) if "rewards/reasoning_gym/mean" in r]
    # the tiny model writes no <answer> tags: the task's checker is reached and scores 0 (no sample dropped)
    assert len(rows) == 2 and all(r["rewards/reasoning_gym/mean"] == 0.0 and r["rewards/dropped"] == 0 for r in rows)
    assert "eval_reward" in summary.last_metrics  # TRL's eval_ name


def test_a_keyboard_interrupt_from_a_callback_stops_with_a_checkpoint_and_ctrl_c_says_its_line(tmp_path, monkeypatch,
                                                                                                capsys):
    # the class: a KeyboardInterrupt raised while the run is in the user's code (a callback) or anywhere else (Ctrl-C)
    # is never a bare traceback: from a callback it is the stop it asks for (checkpoint, one line, train() returns);
    # elsewhere one line naming the last checkpoint, then KeyboardInterrupt as Python raises it
    from rlhfkit import Callback, SFTConfig, SFTTrainer
    from rlhfkit.train.lifecycle.run import Run

    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"echo {w}", "completion": w} for w in ("red", "blue", "green", "gold") * 4]

    class Interrupting(Callback):
        def on_step(self, step, metrics):
            if step == 2:
                raise KeyboardInterrupt

    args = SFTConfig(output_dir="runs/sft", learning_rate=1e-3, per_device_train_batch_size=4, logging_steps=1,
                     num_train_epochs=1, **{"data.eval_fraction": 0, "train.save_every": 0,
                                            "track.report": False})
    first = SFTTrainer(model=TINY, args=args, train_dataset=rows, callbacks=[Interrupting()]).train()
    assert first.stopped == ("stopped by a KeyboardInterrupt raised in a callback (Interrupting.on_step) at step 2; "
                             "checkpoint-2 saved; train() again resumes it")
    assert (tmp_path / "runs/sft/checkpoint-2").is_dir() and not (tmp_path / "runs/sft/finished.json").exists()

    log = Run.log

    def ctrl_c_at_three(self, metrics, step):  # Ctrl-C in the trainer's own code, after checkpoint-2
        log(self, metrics, step)
        if step == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(Run, "log", ctrl_c_at_three)
    capsys.readouterr()
    with pytest.raises(KeyboardInterrupt):
        SFTTrainer(model=TINY, args=args, train_dataset=rows).train()
    out = capsys.readouterr().out
    assert "[sft] interrupted (Ctrl-C); last checkpoint: " in out and "checkpoint-2 (train() again resumes from it)" \
        in out
    monkeypatch.setattr(Run, "log", log)  # sys.exit(0) in a callback: a script never ends mid-run without a word
    with pytest.raises(SystemExit):
        SFTTrainer(model=TINY, args=args, train_dataset=rows, callbacks=[lambda step, m: sys.exit(0)]).train()
    assert "[sft] ended by sys.exit(0) inside the run (a callback); last checkpoint: " in capsys.readouterr().out
