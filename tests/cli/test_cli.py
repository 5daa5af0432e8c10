"""The command line: help and version, override forms, dispatch of every command, exit codes, Ctrl-C, and SFT on
a user's own chat data through the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from rlhfkit import __version__
from rlhfkit.cli import OTHER_COMMANDS, UsageError, main, split_overrides
from rlhfkit.config import RECIPES

TINY = "tiny:hidden=64,layers=2,intermediate=128"


def run_cli(*args, cwd=None, timeout=300, stdin=None):
    return subprocess.run([sys.executable, "-m", "rlhfkit", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, input=stdin)


# ───────────────────────────────────────────── help / version ─────────────────────────────────────────────


def test_help_lists_every_command_with_a_description():
    res = run_cli("--help")
    assert res.returncode == 0, res.stderr
    for name, recipe in RECIPES.items():
        assert name in res.stdout and recipe.description.split()[0] in res.stdout
    for name in OTHER_COMMANDS:
        assert f"\n    {name}" in res.stdout


def test_help_does_not_import_torch():
    code = "import sys; from rlhfkit.cli import main\ntry:\n main(['--help'])\nexcept SystemExit: pass\n" \
           "print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip().endswith("False")


def test_version():
    res = run_cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"rlhfkit {__version__}"


@pytest.mark.parametrize("command", ["sft", "grpo", "eval", "generate", "export", "data", "config", "quickstart"])
def test_command_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert f"rlhfkit {command}" in capsys.readouterr().out


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    assert "COMMAND" in capsys.readouterr().out


def test_usage_errors_are_one_line(capsys):
    assert main(["eval"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "--data" in err
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and err.count("\n") == 1


# ───────────────────────────────────────────── override forms ─────────────────────────────────────────────


@pytest.mark.parametrize("tokens, expected", [
    (["optim.lr=1e-5"], (None, ["optim.lr=1e-5"])),
    (["c.yaml", "a.b=1", "--x.y", "2", "--z=3"], ("c.yaml", ["a.b=1", "x.y=2", "z=3"])),
    (["--output_dir", "runs/x"], (None, ["output_dir=runs/x"])),
    (["--output-dir", "runs/x"], (None, ["output_dir=runs/x"])),
    (["--output-dir=runs/x"], (None, ["output_dir=runs/x"])),
    (["--model.lora.enabled", "--train.max_steps", "-1"], (None, ["model.lora.enabled=true", "train.max_steps=-1"])),
    (["--data.max-length", "64"], (None, ["data.max_length=64"])),
    (["data.train=a=b.jsonl"], (None, ["data.train=a=b.jsonl"])),
])
def test_split_overrides(tokens, expected):
    assert split_overrides(tokens) == expected


@pytest.mark.parametrize("tokens, message", [
    (["a.yaml", "b.yaml"], "two config files"),
    (["optim.lr"], "expected a config file (.yaml) or key=value"),
    (["-x"], "unknown option"),
])
def test_split_overrides_errors(tokens, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        split_overrides(tokens)


@pytest.fixture
def captured(monkeypatch):
    """Replace every recipe entry point with a recorder (the online / preference / pipeline modules are injected,
    so these tests never import them)."""
    calls: list[tuple[str, object]] = []

    def recorder(label):
        def fn(arg):
            calls.append((label, arg))
            return {}
        return fn

    import rlhfkit.train.supervised.reward
    import rlhfkit.train.supervised.sft

    monkeypatch.setattr(rlhfkit.train.supervised.sft, "run_sft", recorder("run_sft"))
    monkeypatch.setattr(rlhfkit.train.supervised.reward, "run_rm", recorder("run_rm"))
    for name, attrs in {"rlhfkit.train.online.synchronous": ["run_online"], "rlhfkit.train.supervised.preference":
    ["run_preference"],
                        "rlhfkit.pipeline": ["run_pipeline", "run_quickstart"]}.items():
        fake = types.ModuleType(name)
        for attr in attrs:
            setattr(fake, attr, recorder(attr))
        monkeypatch.setitem(sys.modules, name, fake)
    return calls


@pytest.mark.parametrize("form", [
    lambda d: ["--output_dir", d], lambda d: ["--output-dir", d], lambda d: [f"--output_dir={d}"],
    lambda d: [f"output_dir={d}"],
])
def test_output_dir_forms_are_honoured(form, captured, tmp_path, capsys):
    out = str(tmp_path / "my-run")
    assert main(["sft", *form(out), "optim.lr=1e-5"]) == 0
    (label, cfg), = captured
    assert label == "run_sft" and cfg.output_dir == out and cfg.optim.lr == pytest.approx(1e-5)
    stdout = capsys.readouterr().out
    assert stdout.count(str(Path(out).resolve())) == 2  # printed at the start and at the end


def test_config_file_plus_overrides(captured, tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("optim:\n  lr: 1.0e-4\ntrain:\n  epochs: 3\n")
    assert main(["sft", str(p), "--train.epochs", "5", "output_dir=" + str(tmp_path / "r")]) == 0
    cfg = captured[0][1]
    assert cfg.optim.lr == pytest.approx(1e-4) and cfg.train.epochs == 5.0


@pytest.mark.parametrize("command", list(RECIPES))
def test_every_training_command_dispatches_its_recipe(command, captured, tmp_path):
    assert main([command, f"output_dir={tmp_path / command}"]) == 0
    (label, cfg), = captured
    assert label == RECIPES[command].runner.split(":")[1]
    assert cfg.recipe == command and cfg.output_dir == str(tmp_path / command)
    if command == "grpo":
        assert cfg.algo.advantage == "grpo"
    if command in ("dpo", "ipo", "kto", "simpo", "orpo"):
        assert cfg.algo.loss == command


def test_quickstart_dispatch(captured, tmp_path, capsys):
    assert main(["quickstart", "--out", str(tmp_path / "qs")]) == 0
    assert captured == [("run_quickstart", str(tmp_path / "qs"))]
    assert str((tmp_path / "qs").resolve()) in capsys.readouterr().out


def test_config_errors_come_before_the_recipe(captured, capsys):
    assert main(["sft", "optim.lrr=1"]) == 2
    assert captured == []
    err = capsys.readouterr().err
    assert err == "error: defaults + overrides: unknown key 'optim.lrr' (fix: did you mean 'optim.lr'?)\n"


def test_programming_errors_keep_their_traceback(monkeypatch, tmp_path):
    import rlhfkit.train.supervised.sft

    def boom(cfg):
        raise RuntimeError("a bug")

    monkeypatch.setattr(rlhfkit.train.supervised.sft, "run_sft", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["sft", f"output_dir={tmp_path}"])


def test_ctrl_c_exits_130_and_names_the_last_checkpoint(monkeypatch, tmp_path, capsys):
    import rlhfkit.train.supervised.sft

    def interrupted(cfg):
        for step in (2, 4):
            ckpt = Path(cfg.output_dir) / f"checkpoint-{step}"
            ckpt.mkdir(parents=True)
            (ckpt / "trainer_state.pt").write_bytes(b"x")
        (Path(cfg.output_dir) / "checkpoint-6.tmp").mkdir()  # an unfinished one is never offered
        raise KeyboardInterrupt

    monkeypatch.setattr(rlhfkit.train.supervised.sft, "run_sft", interrupted)
    assert main(["sft", f"output_dir={tmp_path / 'run'}"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "checkpoint-4" in err and "checkpoint-6" not in err


def test_ctrl_c_without_checkpoint(monkeypatch, tmp_path, capsys):
    import rlhfkit.train.supervised.sft

    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(rlhfkit.train.supervised.sft, "run_sft", interrupted)
    assert main(["sft", f"output_dir={tmp_path / 'run'}"]) == 130
    assert "no checkpoint written yet" in capsys.readouterr().err


# ───────────────────────────────────────────── config show / data make ─────────────────────────────────────────


@pytest.mark.parametrize("recipe", ["sft", "rm", "grpo", "dpo", "pipeline"])
def test_config_show_prints_the_commented_defaults(recipe, capsys):
    from rlhfkit.config import build_config

    assert main(["config", "show", recipe]) == 0
    text = capsys.readouterr().out
    assert build_config(recipe, yaml.safe_load(text), []) == build_config(recipe, {}, [])
    lines = text.splitlines()  # every key commented, on its line or (a long comment, wrapped) on the lines above
    assert all("#" in line or "#" in prev for prev, line in zip(["#", *lines], lines))
    assert max(map(len, lines)) <= 120


def test_config_show_grpo_lists_every_policy_loss_with_its_section(capsys):
    # each registered loss has its section under algo, whose comment names the losses that read it
    from rlhfkit.algos import POLICY_LOSSES

    assert main(["config", "show", "grpo"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, spec in POLICY_LOSSES.items():
        at = next(i for i, line in enumerate(lines) if line.startswith(f"  {spec.section}:"))
        start = at  # a long comment is wrapped onto comment lines above its key
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        section = " ".join(line.strip() for line in lines[start:at + 1])
        assert f"policy_loss={name}" in section or f"/ {name}" in section, (name, section)


def test_config_show_with_overrides(capsys):
    assert main(["config", "show", "sft", "optim.lr=3e-4"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["optim"]["lr"] == pytest.approx(3e-4)


def test_data_make_writes_and_describes_the_files(tmp_path, capsys):
    out = tmp_path / "data"
    assert main(["data", "make", "quickstart", "--out", str(out), "--n", "50", "--n-eval", "10"]) == 0
    text = capsys.readouterr().out
    for name in ("sft.jsonl", "preference.jsonl", "prompts.jsonl", "unpaired.jsonl", "eval_prompts.jsonl",
                 "eval_preference.jsonl"):
        lines = (out / name).read_text().splitlines()
        assert len(lines) == (10 if name.startswith("eval_") else 50)
        assert str(out / name) in text and lines[0] in text  # one example line of each format
    assert "rlhfkit sft" in text and "rlhfkit kto" in text


def test_data_make_calculator_writes_tool_use_demonstrations(tmp_path, capsys):
    out = tmp_path / "calc"
    assert main(["data", "make", "calculator", "--out", str(out), "--n", "30", "--n-eval", "5"]) == 0
    text = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["eval_prompts.jsonl", "prompts.jsonl", "sft.jsonl"]
    assert "tool-use demonstrations" in text and "env.name=calculator" in text
    assert any('"role": "tool"' in line for line in (out / "sft.jsonl").read_text().splitlines())


def test_data_make_unknown_task(tmp_path, capsys):
    assert main(["data", "make", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown task 'nope'" in capsys.readouterr().err


# ───────────────────────────────────────────── SFT on a user's own chat data ──────────────────────────────────


def test_sft_on_own_messages_with_field_mapping(tmp_path, capsys):
    rows = []
    for i in range(48):
        w = ["cat", "dog", "owl", "bee"][i % 4]
        rows.append({"id": i, "conversation": [
            {"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": w},
            {"role": "user", "content": "again, louder"}, {"role": "assistant", "content": w.upper()},
        ]})
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    rc = main(["sft", f"data.train={data}", "data.fields.messages=conversation", f"model.name={TINY}",
               "train.max_steps=5", "train.batch_size=8", "track.report=false", "data.max_length=96",
               "--output-dir", str(out)])
    assert rc == 0, capsys.readouterr().err
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["data"]["fields"] == {"messages": "conversation"} and saved["output_dir"] == str(out)
    assert len((out / "metrics.jsonl").read_text().splitlines()) >= 5

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhfkit.models.tokenizer import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    conv = rows[0]["conversation"]
    ours = load_tokenizer(TINY)
    assert tok.apply_chat_template(conv, tokenize=False) == ours.apply_chat_template(conv, tokenize=False)
    assert tok.apply_chat_template(conv[:3], tokenize=False, add_generation_prompt=True).endswith(
        "<|im_start|>assistant\n")
    enc = tok(tok.apply_chat_template(conv, tokenize=False), return_tensors="pt", add_special_tokens=False)
    assert model(**enc).logits.shape[-1] == len(tok)



def test_misspelt_command_gets_a_did_you_mean(capsys):
    assert main(["sfft"]) == 2
    err = capsys.readouterr().err
    assert "did you mean `rlhfkit sft`" in err and err.count("\n") == 1


def test_recipe_help_lists_the_common_keys(capsys):
    with pytest.raises(SystemExit):
        main(["grpo", "--help"])
    out = capsys.readouterr().out
    for key in ("model.name", "data.train", "optim.lr", "algo.num_generations", "reward.functions"):
        assert key in out
    assert "learning_rate" in out  # TRL-style names are accepted


@pytest.mark.parametrize("recipe", ["sft", "grpo", "rloo", "simpo", "kto", "ppo"])
def test_recipe_help_shows_the_recipes_own_defaults(recipe, capsys):
    """`RECIPE --help` lists the common keys with the defaults a run of that recipe gets (the recipe table's
    defaults over the config class's), e.g. grpo's runs/grpo and 4 generations, not ppo's."""
    from rlhfkit.config import build_config

    with pytest.raises(SystemExit):
        main([recipe, "--help"])
    text = capsys.readouterr().out
    cfg = build_config(recipe, {}, [])
    shown = re.findall(r"^  (\S+) .*\(default: (.*)\)$", text.split("common keys:")[1], flags=re.M)
    assert shown
    for key, default in shown:
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        assert default == repr(value), (key, default, value)
