"""A TRL user's runs, on the tiny model, without TRL (TRL 1.16's arithmetic stated by hand; bench/trl_port.py compares
with TRL itself): on the command line, TRL's names and defaults=trl print the step's geometry and what still differs
from TRL before any weights load, and the run has TRL's geometry and length; through the Python API, a script ported
by its imports gets TRL's step, schedule and metric names per update, its TrainerCallbacks hear every call TRL makes
in TRL's order and can stop the run at a step with a checkpoint; evaluate() and save_model() as TRL's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfkit.cli import main

FN = f"{Path(__file__).parents[1] / 'unit' / 'reward_fns_for_tests.py'}:pays_for_target_length"
REWARD = f"reward_funcs=[{FN}]"  # lengths differ between a random model's samples: no group ties
TINY = "tiny:hidden=64,layers=2,intermediate=128"  # the policy's weights do not matter here: the step's shape does


def _steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_trl_names_and_defaults_run_trls_step(task_data, tmp_path, capsys):
    out = tmp_path / "grpo-trl"
    argv = ["grpo", "defaults=trl", f"model_name_or_path={TINY}", f"data.train={task_data / 'prompts.jsonl'}",
            f"output_dir={out}", REWARD, "per_device_train_batch_size=8", "num_generations=4", "max_steps=3",
            "max_completion_length=12", "learning_rate=1e-4", "data.max_length=64", "track.report=false",
            "track.sample_every=0"]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "[grpo] step: 2 prompts x 4 generations = 8 samples (1 process) -> 1 update of 8 samples" in said
    assert "[grpo] run: 3 steps = 3 updates, from train.max_steps=3 updates" in said
    flat = said.replace("\n    ", " ")
    assert "[grpo] defaults: TRL 1.16's GRPOConfig (defaults=trl)" in flat  # whose defaults, in one line
    assert "num_generations=8" not in flat and "learning_rate=1e-6" not in flat  # never the user's own values
    assert "unlike TRL 1.16 here:" in flat and "rlhfkit's practice, not switched on:" in flat
    assert said.index("[grpo] step:") < said.index("[grpo] policy")  # before any weights load
    assert _steps(out) == [1, 2, 3]


def test_max_steps_counts_updates_in_rlhfkits_geometry(task_data, tmp_path, capsys):
    out = tmp_path / "grpo"
    argv = ["grpo", f"model.name={TINY}", f"data.train={task_data / 'prompts.jsonl'}", f"output_dir={out}",
            f"reward.functions=[{{fn: '{FN}'}}]", "algo.rollout_batch_size=2", "algo.ppo_epochs=2",
            "algo.mini_batch_size=4", "train.batch_size=4", "max_steps=3", "generation.max_new_tokens=8",
            "data.max_length=64", "track.report=false", "track.sample_every=0", "data.eval_fraction=0"]
    assert main(argv) == 0  # 2 prompts x 4 = 8 samples: 2 updates of 4, 2 epochs -> 4 updates a step
    assert "[grpo] run: 1 step = 4 updates, from train.max_steps=3 updates" in capsys.readouterr().out
    assert _steps(out) == [4]


# ── a TRL script, ported by its imports: TRL's step, its schedule, its callbacks (no TRL needed: TRL 1.16's arithmetic
#    stated by hand; bench/trl_port.py compares with TRL itself) ─────────────────────────────────────────────────────

def _recording():
    """A transformers TrainerCallback recording every call TRL would make, in order, with the step and the learning
    rate the update used; and an rlhfkit callback recording what each update was fed."""
    from transformers import TrainerCallback

    calls, fed = [], []

    class Watch(TrainerCallback):
        def on_init_end(self, args, state, control, **kw):
            calls.append(("init_end", state.global_step))

        def on_train_begin(self, args, state, control, **kw):
            calls.append(("train_begin", state.global_step, state.max_steps))

        def on_epoch_begin(self, args, state, control, **kw):
            calls.append(("epoch_begin", state.global_step))

        def on_step_begin(self, args, state, control, optimizer=None, **kw):
            calls.append(("step_begin", state.global_step, optimizer.param_groups[0]["lr"]))

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
            assert model is not None and processing_class is not None
            calls.append(("step_end", state.global_step))

        def on_log(self, args, state, control, logs=None, **kw):
            calls.append(("log", state.global_step, tuple(sorted(logs))))

        def on_evaluate(self, args, state, control, metrics=None, **kw):
            calls.append(("evaluate", state.global_step, tuple(sorted(metrics))))

        def on_save(self, args, state, control, **kw):
            calls.append(("save", state.global_step))

        def on_epoch_end(self, args, state, control, **kw):
            calls.append(("epoch_end", state.global_step))

        def on_train_end(self, args, state, control, **kw):
            calls.append(("train_end", state.global_step))

    class Fed:
        def on_update(self, step, payload):
            fed.append((payload["rows"], payload["prompts"]))

        def on_step(self, step, metrics):
            return None

    return Watch(), Fed(), calls, fed


def test_a_trl_grpo_script_runs_trls_step_and_schedule(tmp_path, monkeypatch):
    # TRL 1.16: per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=1 -> one prompt x 4
    # completions per optimizer step; max_steps=3 updates; learning_rate 1e-6 linear to 0 over the 3 updates
    from rlhfkit import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))
    watch, fed, calls, counts = _recording()
    args = GRPOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, max_steps=3, logging_steps=1, report_to="none", use_cpu=True)
    rows = [{"prompt": f"Say {i} things."} for i in range(6)]  # fewer prompts than rlhfkit's own 16 per step
    trainer = GRPOTrainer(model=TINY, reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
                          args=args, train_dataset=rows, callbacks=[watch, fed])
    out = trainer.train()
    assert counts == [(4, 1)] * 3  # 4 samples of 1 prompt per update, as TRL
    lrs = [c[2] for c in calls if c[0] == "step_begin"]
    assert lrs == pytest.approx([1e-6, 1e-6 * 2 / 3, 1e-6 / 3])  # the rate each update used (TRL's linear)
    assert (out.global_step, trainer.state.global_step, trainer.state.max_steps) == (3, 3, 3)
    logged = [c for c in calls if c[0] == "log"]
    assert len(logged) == 3 and {"reward", "reward_std", "entropy", "completions/mean_length",
                                 "clip_ratio/region_mean", "learning_rate", "loss"} <= set(logged[0][2])
    assert not {"kl", "objective/kl"} & set(logged[0][2])  # TRL's beta 0: no reference, no KL measured or logged
    assert [c[0] for c in calls[:5]] == ["init_end", "train_begin", "epoch_begin", "step_begin", "step_end"]
    assert calls[-1][0] == "train_end"
    names = set(json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0]))
    assert {"reward", "frac_reward_zero_std", "rewards/<lambda>/mean", "rewards/<lambda>/std"} <= names
    assert "objective/scores" not in names  # TRL's names, not rlhfkit's, in the file


def test_a_trl_grpo_scripts_kl_is_per_token_as_trls(tmp_path, monkeypatch):
    # TRL 1.16 logs kl as the mean over every completion token (sum / count); rlhfkit's objective/kl (the sum over an
    # answer, averaged over answers) keeps its own name beside it. Once the policy has moved (lr 1e-3), the two differ
    # by the mean length of the answers.
    from rlhfkit import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))
    args = GRPOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, max_steps=3, logging_steps=1, report_to="none", use_cpu=True,
                      beta=0.1, learning_rate=1e-3)
    rows = [{"prompt": f"Say {i} things."} for i in range(6)]
    GRPOTrainer(model=TINY, reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions], args=args,
                train_dataset=rows).train()
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    moved = [m for m in logged if m.get("kl", 0) > 0]
    assert moved, logged
    for m in moved:
        assert m["kl"] * m["completions/mean_length"] == pytest.approx(m["objective/kl"], rel=1e-4)


def test_a_trl_sft_script_keeps_the_short_last_batch_and_trls_schedule(tmp_path, monkeypatch):
    # TRL 1.16's SFTConfig: 8 rows a batch, 3 epochs, the short last batch trained on (dataloader_drop_last=False):
    # 10 rows -> 2 updates an epoch (8 + 2 rows), 6 updates; learning_rate 2e-5 linear over the 6
    from rlhfkit import SFTConfig, SFTTrainer

    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))
    watch, fed, calls, counts = _recording()
    rows = [{"messages": [{"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": w}]}
            for w in ("red", "blue", "green", "gold", "pink", "grey", "navy", "teal", "rose", "jade")]
    trainer = SFTTrainer(model=TINY, train_dataset=rows, args=SFTConfig(output_dir=str(tmp_path / "sft"),
                                                                         use_cpu=True), callbacks=[watch, fed])
    out = trainer.train()
    assert counts == [(8, 8), (2, 2)] * 3 and out.global_step == 6
    lrs = [c[2] for c in calls if c[0] == "step_begin"]
    assert lrs == pytest.approx([2e-5 * (1 - i / 6) for i in range(6)])
    epochs = [c for c in calls if c[0] in ("epoch_begin", "epoch_end")]
    assert [c[0] for c in epochs] == ["epoch_begin", "epoch_end", "epoch_begin", "epoch_end", "epoch_begin",
                                      "epoch_end", "epoch_begin", "epoch_end"]  # 3 epochs (the last begin: its end)
    assert [c[1] for c in calls if c[0] == "log"] == [6]  # logging_steps=10: the last update only (as rlhfkit logs)
    assert trainer.config.data.completion_only_loss is None  # TRL's rule: a conversation trains every token


def test_callbacks_hear_every_call_trl_makes_and_stop_at_a_step_with_a_checkpoint(tmp_path, monkeypatch):
    from transformers import TrainerCallback

    from rlhfkit import SFTConfig, SFTTrainer
    from rlhfkit.errors import ConfigError

    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))
    watch, fed, calls, counts = _recording()

    class StopAt2(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                control.should_training_stop = True

        def on_log(self, args, state, control, **kw):
            control.should_save = state.global_step == 1  # a checkpoint asked for at update 1 too

    rows = [{"prompt": f"echo {w}", "completion": w} for w in ("red", "blue", "green", "gold") * 4]
    args = SFTConfig(output_dir=str(tmp_path / "run"), use_cpu=True, per_device_train_batch_size=4, max_steps=4,
                     logging_steps=1, eval_strategy="steps", eval_steps=2)
    trainer = SFTTrainer(model=TINY, train_dataset=rows[:12], eval_dataset=rows[12:], args=args,
                         callbacks=[watch, StopAt2(), fed])
    out = trainer.train()
    assert out.stopped and "StopAt2.on_step_end set control.should_training_stop" in out.stopped
    assert (tmp_path / "run" / "checkpoint-2").is_dir() and (tmp_path / "run" / "checkpoint-1").is_dir()
    order = [c[0] for c in calls]
    # transformers' order within an update: step_end, log (training), log (evaluation), evaluate, save
    at2 = [c[0] for c in calls if len(c) > 1 and c[1] == 2 and c[0] not in ("step_begin", "epoch_end", "train_end")]
    assert at2 == ["step_end", "log", "log", "evaluate", "save"], calls
    assert order[-1] == "train_end" and out.global_step == 2
    assert any(c[0] == "evaluate" and "eval_loss" in c[2] for c in calls)
    out = trainer.train()  # again: resumes from checkpoint-2 to the end
    assert out.stopped is None and trainer.state.global_step == 4
    assert (tmp_path / "run" / "finished.json").is_file()
    assert trainer.save_model() == tmp_path / "run"  # the finished run's directory already holds the model
    trainer.save_model(tmp_path / "copy")
    assert (tmp_path / "copy" / "config.json").is_file() and trainer.model is not None

    class Substeps(TrainerCallback):
        def on_substep_end(self, args, state, control, **kw):
            pass

    with pytest.raises(ConfigError, match="overrides on_substep_end.*use on_step_end"):
        SFTTrainer(model=TINY, train_dataset=rows, args=args, callbacks=[Substeps()])


def test_a_keyboard_interrupt_in_a_callback_stops_as_ctrl_c_with_a_checkpoint(tmp_path, monkeypatch, capsys):
    from rlhfkit import SFTConfig, SFTTrainer

    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))

    def interrupt(step, metrics):
        if step == 2:
            raise KeyboardInterrupt

    rows = [{"prompt": f"echo {w}", "completion": w} for w in ("red", "blue", "green", "gold") * 4]
    args = SFTConfig(output_dir=str(tmp_path / "run"), use_cpu=True, per_device_train_batch_size=4, max_steps=4,
                     logging_steps=1)
    out = SFTTrainer(model=TINY, train_dataset=rows, args=args, callbacks=[interrupt]).train()
    assert out.stopped and "KeyboardInterrupt raised in a callback" in out.stopped
    assert "checkpoint-2 saved" in out.stopped
    assert (tmp_path / "run" / "checkpoint-2").is_dir()
    said = capsys.readouterr().out
    assert "Traceback" not in said and said.count("KeyboardInterrupt raised in a callback") == 1


def test_evaluate_runs_the_recipes_own_evaluation_of_the_model_as_it_is(tmp_path, monkeypatch):
    from rlhfkit import SFTConfig, SFTTrainer

    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))
    rows = [{"prompt": f"echo {w}", "completion": w} for w in ("red", "blue", "green", "gold") * 4]
    trainer = SFTTrainer(model=TINY, train_dataset=rows[:12], eval_dataset=rows[12:],
                         args=SFTConfig(output_dir=str(tmp_path / "run"), use_cpu=True, max_steps=2,
                                        learning_rate=1e-2))
    before = trainer.evaluate()
    assert set(before) >= {"eval_loss"} and not (tmp_path / "run").exists()  # the run's directory untouched
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_loss"] < before["eval_loss"]  # the trained model, evaluated
    assert trainer.state.log_history[-1]["eval_loss"] == after["eval_loss"]
