"""The first error is the real one (issue 21 §7), each class tried with several members, in this process through
``rlhfkit.cli.main``: exit 2, one line on stderr naming the right thing, nothing written:

* a pickled weights file (``.bin``, ``.pt``, ``.pth``, ``.ckpt``, ``.pkl``) or any other non-GGUF file given as a
  model is refused before anything opens it, under every key that names a model and in ``eval``;
* a tokenizer that cannot be read is one whole line (no tokenizer files, damaged JSON, a torn ``tokenizer.json``,
  ``tokenizer_config.json`` naming files that are not there);
* a chat template that fails (sandbox, undefined name, raising, syntax) names the template, not a data line;
* a wrong key or value in a YAML config file names ``file:line``; the same mistake as an override keeps its message;
* under torchrun (``RANK`` > 0) the start and closing lines, and the config notes, are printed by rank 0 only.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY, free_port

ROWS = [{"prompt": f"shout: {w}", "completion": w.upper()} for w in ["cat", "dog", "owl", "bee"] * 8]
PREFS = [{"prompt": f"shout: {w}", "chosen": w.upper(), "rejected": w} for w in ["cat", "dog", "owl", "bee"] * 8]


def _cli(argv: list[str], env: dict | None = None, unpickle: bool = False) -> tuple[int, str, str]:
    """(exit code, stderr, stdout) of ``rlhfkit.cli.main``; ``torch.load`` fails the test if anything unpickles
    (unless ``unpickle``)."""
    from rlhfkit.cli import main

    err, out = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for key in ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "HF_HUB_DISABLE_PROGRESS_BARS",
                    "TRANSFORMERS_VERBOSITY", "TRANSFORMERS_NO_ADVISORY_WARNINGS", "RANK"):  # main() sets some
            mp.setenv(key, os.environ[key]) if key in os.environ else mp.delenv(key, raising=False)
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        if not unpickle:
            mp.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called on a refused file"))
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(list(argv))
    return rc, err.getvalue(), out.getvalue()


def _one_line(rc: int, stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), (rc, stderr)
    return lines[0]


def _error(argv: list[str], **kw) -> str:
    """The one error line of ``rlhfkit argv`` (exit 2, nothing else on stderr)."""
    return _one_line(*_cli(argv, **kw)[:2])


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PREFS))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in ROWS))
    return tmp_path


# ── (d) pickled weights ───────────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.pth", "last.ckpt", "state.pkl"])
def test_a_pickled_file_as_model_is_refused_before_anything_opens_it(name, root):
    torch.save({"w": torch.zeros(2)}, root / name)
    line = _error(["sft", f"model.name={root / name}", "data.train=sft.jsonl", "output_dir=run"])
    assert "model.name" in line and name in line and "pickled" in line and "refuses" in line
    assert "safetensors" in line and "weights_only=True" in line  # why, and how to convert
    assert not (root / "run").exists()


@pytest.mark.parametrize("argv, key, not_written", [
    (["dpo", "data.train=pairs.jsonl", f"model.name={TINY}", "ref_model=pytorch_model.bin", "output_dir=run"],
     "ref_model", "run"),
    (["grpo", "data.train=prompts.jsonl", f"model.name={TINY}", "reward.model=pytorch_model.bin", "output_dir=run"],
     "reward.model", "run"),
    (["grpo", "data.train=prompts.jsonl", f"model.name={TINY}", "teacher.model=pytorch_model.bin",
      "reward.functions=[{fn: exact_match}]", "output_dir=run"], "teacher.model", "run"),
    (["eval", "pytorch_model.bin", "--data", "prompts.jsonl"], "model.name", None),
    (["generate", "pytorch_model.bin", "--prompt", "hi"], "model.name", None),
    (["export", "pytorch_model.bin", "--out", "exported"], "pytorch_model.bin", "exported"),
    (["plan", "grpo", "model.name=pytorch_model.bin"], "model.name", None),
])
def test_every_key_that_names_a_model_refuses_a_pickle(argv, key, not_written, root):
    torch.save({"w": torch.zeros(2)}, root / "pytorch_model.bin")
    line = _error(argv)
    assert key in line and "pickled" in line
    assert not_written is None or not (root / not_written).exists()  # what the command would have written


def test_a_safetensors_file_given_as_a_model_names_its_directory(root):
    (root / "m").mkdir()
    (root / "m" / "model.safetensors").write_bytes(b"\0" * 16)
    line = _error(["sft", "model.name=m/model.safetensors", "data.train=sft.jsonl", "output_dir=run"])
    assert "is a file" in line and "model.name=m" in line


class Planted:
    """A pickled object that runs code when unpickled (what torch.load(weights_only=False) would do)."""

    def __reduce__(self):
        return (print, ("PLANTED CODE RAN",))


def test_a_model_directory_whose_pickled_bin_holds_code_is_one_line(model_dir, root, capsys):
    bad = root / "bad"
    shutil.copytree(model_dir, bad)
    (bad / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": torch.zeros(2), "x": Planted()}, bad / "pytorch_model.bin")
    rc, err, out = _cli(["sft", f"model.name={bad}", "data.train=sft.jsonl", "output_dir=run"], unpickle=True)
    line = _one_line(rc, err)
    assert "more than tensors (print)" in line and "weights_only=True" in line and "safetensors" in line
    assert "PLANTED CODE RAN" not in out + err + capsys.readouterr().out
    assert not (root / "run").exists()


# ── (b) tokenizer files ───────────────────────────────────────────────────────────────────────────────────────

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A saved tiny model directory (config, weights, tokenizer files)."""
    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import load_causal_lm, save_model

    out = tmp_path_factory.mktemp("model") / "m"
    model, tok = load_causal_lm(ModelConfig(name=TINY), trainable=False)
    save_model(model, tok, out)
    return out


def _broken(model_dir: Path, root: Path, damage) -> Path:
    out = root / "broken"
    shutil.copytree(model_dir, out)
    damage(out)
    return out


def _point_at_missing(d: Path) -> None:
    (d / "tokenizer.json").unlink()
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "tokenizer_file": "tok-v2.json"}))


@pytest.mark.parametrize("damage, needles", [
    (lambda d: [p.unlink() for p in d.glob("tokenizer*")], ["holds no tokenizer", "tokenizer.json", "copy"]),
    (lambda d: (d / "tokenizer.json").write_text('{"model": '), ["tokenizer.json is damaged", "line 1"]),
    (lambda d: (d / "tokenizer.json").write_bytes(b"\xff\xfe\x00garbage"), ["tokenizer.json is damaged"]),
    (lambda d: (d / "tokenizer.json").write_text("{}"), ["tokenizer.json is damaged", "no 'model' section"]),
    (lambda d: (d / "tokenizer_config.json").write_text("{'single': quotes}"), ["tokenizer_config.json is damaged"]),
    (_point_at_missing, ["holds no tokenizer", "tokenizer_file=tok-v2.json", "not there"]),
])
def test_an_unreadable_tokenizer_is_one_whole_line(damage, needles, model_dir, root):
    broken = _broken(model_dir, root, damage)
    line = _error(["sft", f"model.name={broken}", "data.train=sft.jsonl", "output_dir=run"])
    assert "model.name" in line and str(broken) in line and line.rstrip().endswith(")"), line
    for needle in needles:
        assert needle in line, (needle, line)


def test_transformers_errors_are_kept_whole(monkeypatch):
    from transformers import AutoTokenizer

    from rlhfkit.errors import ModelError
    from rlhfkit.models.tokenizer import load_tokenizer

    def fail(*a, **k):
        raise ValueError("Couldn't instantiate the backend tokenizer from one of: \n(1) a `tokenizers` file, \n"
                         "(2) a slow tokenizer. \nYou need to have sentencepiece installed.")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", fail)
    with pytest.raises(ModelError) as info:
        load_tokenizer("org/name", where="teacher.model")
    text = str(info.value)
    assert "\n" not in text and "(2) a slow tokenizer" in text and "sentencepiece installed" in text
    assert text.startswith("teacher.model: ")


# ── (c) chat templates ────────────────────────────────────────────────────────────────────────────────────────

TEMPLATES = {
    "sandbox": ("{% for m in messages %}{{ m.__class__.__mro__ }}{{ m['content'] }}{% endfor %}",
                "sandbox refused an unsafe operation"),
    "undefined": ("{% for m in messages %}{{ nothing.here }}{{ m['content'] }}{% endfor %}", "undefined variable"),
    "raising": ("{{ raise_exception('no conversation is good enough') }}", "no conversation is good enough"),
    "syntax": ("{% for m in messages %}\n{{ m['content'] }\n{% endfor %}", "syntax error at template line 2"),
}


@pytest.mark.parametrize("kind", list(TEMPLATES))
def test_a_broken_chat_template_file_is_named_not_the_first_data_line(kind, root):
    text, needle = TEMPLATES[kind]
    (root / "tpl.jinja").write_text(text)
    line = _error(["sft", f"model.name={TINY}", f"model.chat_template={root / 'tpl.jinja'}",
                   "data.train=sft.jsonl", "output_dir=run"])
    assert "tpl.jinja" in line and needle in line and "sft.jsonl" not in line, line


def test_a_broken_template_inside_the_model_directory_is_named(model_dir, root):
    broken = _broken(model_dir, root, lambda d: (d / "chat_template.jinja").write_text(TEMPLATES["sandbox"][0]))
    line = _error(["sft", f"model.name={broken}", "data.train=sft.jsonl", "output_dir=run"])
    assert "chat_template.jinja" in line and "sandbox" in line and "sft.jsonl" not in line, line


def test_a_sandbox_error_on_one_record_names_the_template_and_the_record(root):
    # renders the probe conversation; fails (sandbox) only on the third record, whose answer is OWL
    (root / "tpl.jinja").write_text("{% for m in messages %}{% if m['content'] == 'OWL' %}{{ m.__class__.__mro__ }}"
                                    "{% endif %}"
                                    "{{ m['content'] }}<|im_end|>{% endfor %}")
    line = _error(["sft", f"model.name={TINY}", f"model.chat_template={root / 'tpl.jinja'}",
                   "data.train=sft.jsonl", "output_dir=run"])
    assert line.startswith(f"error: {root / 'tpl.jinja'}: the chat template failed (the Jinja sandbox"), line
    assert "sft.jsonl:3" in line, line


def test_inline_template_text_is_named_by_its_key(root):
    line = _error(["sft", f"model.name={TINY}", "model.chat_template={{ nothing.here }}",
                   "data.train=sft.jsonl", "output_dir=run"])
    assert line.startswith("error: model.chat_template: ") and "undefined variable" in line


# ── (e) file:line of config errors ────────────────────────────────────────────────────────────────────────────

CONFIG = """# an SFT config
model:
  name: {tiny}
data:
  train: sft.jsonl
optim:
  lr: 1.0e-4
{extra}"""


@pytest.mark.parametrize("extra, line_no, needles", [
    ("  lrr: 2\n", 8, ["unknown key 'optim.lrr'", "did you mean 'optim.lr'"]),
    ("train:\n  batch_size: 0\n", 9, ["'train.batch_size' must be >= 1, got 0"]),
    ("train:\n  epochs: many\n", 9, ["'train.epochs' must be a number"]),
    ("train:\n  mixed_precision: fp4\n", 9, ["'train.mixed_precision' must be one of"]),
    ("push_to_hub: true\n", 8, ["'push_to_hub' (TRL) has no rlhfkit equivalent"]),
    ("learning_rate: 1.0e-3\n", 8, ["'learning_rate' and 'optim.lr' are both set"]),  # TRL's name and ours
])
def test_a_wrong_key_or_value_in_a_file_names_file_and_line(extra, line_no, needles, root):
    (root / "c.yaml").write_text(CONFIG.format(tiny=TINY, extra=extra))
    line = _error(["sft", "c.yaml", "output_dir=run"])
    assert f"error: c.yaml:{line_no}: " in line, line
    for needle in needles:
        assert needle in line, line


def test_a_value_under_trls_name_names_the_line_it_was_written_on(root):
    (root / "t.yaml").write_text(f"model:\n  name: {TINY}\ndata:\n  train: sft.jsonl\nlearning_rate: -1\n")
    line = _error(["sft", "t.yaml", "output_dir=run"])
    assert "error: t.yaml:5: 'optim.lr' must be >= 0" in line, line


def test_a_list_item_and_an_input_checked_before_the_run_name_their_line(root):
    (root / "g.yaml").write_text(f"model:\n  name: {TINY}\ndata:\n  train: prompts.jsonl\nreward:\n  functions:\n"
                                 "    - fn: exact_match\n      weight: heavy\n")
    assert "g.yaml:8: 'reward.functions[0].weight' must be a number" in _error(["grpo", "g.yaml"])
    (root / "m.yaml").write_text("model:\n  name: ./no/such/model\ndata:\n  train: sft.jsonl\n")
    line = _error(["sft", "m.yaml", "output_dir=run"])
    assert "m.yaml:2: model.name: model not found: ./no/such/model" in line, line


@pytest.mark.parametrize("recipe, train, section, line_10, said", [
    ("sft", "sft.jsonl", "optim", "lrr: 5.0e-3", "error: p.yaml:10: unknown key 'optim.lrr'"),  # a key
    ("grpo", "prompts.jsonl", "algo", "num_generations: 1",  # a cross-field mistake
     "error: p.yaml:10: stages[0].config.algo.num_generations:")])
def test_a_stage_mistake_in_a_pipeline_file_names_its_line(root, recipe, train, section, line_10, said):
    (root / "p.yaml").write_text(f"recipe: pipeline\noutput_dir: pipe\nbase_model: {TINY}\nstages:\n"
                                 f"  - name: {recipe}\n    recipe: {recipe}\n    config:\n"
                                 f"      data: {{train: {train}}}\n      {section}:\n        {line_10}\n")
    line = _error(["pipeline", "p.yaml"])
    assert said in line, line
    assert not (root / "pipe").exists()


def test_the_same_mistake_as_an_override_keeps_its_message(root):
    (root / "c.yaml").write_text(CONFIG.format(tiny=TINY, extra="train:\n  batch_size: 0\n"))
    line = _error(["sft", "c.yaml", "train.batch_size=-1", "output_dir=run"])
    assert "error: c.yaml + overrides: 'train.batch_size' must be >= 1, got -1" in line, line
    (root / "c.yaml").write_text(CONFIG.format(tiny=TINY, extra=""))
    line = _error(["sft", "c.yaml", "optim.lrr=1", "output_dir=run"])
    assert ".yaml:" not in line and "unknown key 'optim.lrr'" in line, line
    (root / "g.yaml").write_text(f"model:\n  name: {TINY}\nreward:\n  functions:\n"
                                 "    - fn: rlhfkit.tasks.quickstart:reward\n      weight: 1.0\n")
    line = _error(["grpo", "g.yaml", "reward.functions[0].weight=heavy"])
    assert ".yaml:" not in line and "reward.functions[0]" in line, line  # the override's mistake, not the file's


# ── (a) rank 0 speaks for the run ─────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("rank, printed", [("0", True), ("1", False)])
def test_start_line_and_config_notes_only_on_rank_0(rank, printed, root, monkeypatch):
    # a run that stops at its data (after the start line): the start line and TRL's renaming note are once-per-run
    import rlhfkit.config.aliases as aliases

    monkeypatch.setattr(aliases, "_ALIASES_LOGGED", set())  # notes are once per process: this test's own set
    rc, err, out = _cli(["sft", f"model.name={TINY}", "data.train=nothere.jsonl", "output_dir=run",
                         "learning_rate=1e-4"], env={"RANK": rank})
    assert rc == 2 and "nothere.jsonl" in err
    assert ("[rlhfkit] sft: run directory" in out) is printed
    assert ("[config] TRL names: learning_rate -> optim.lr" in err) is printed


def test_say_prints_on_rank_0_only(capsys, monkeypatch):
    from rlhfkit.errors import is_main_rank, say

    monkeypatch.setenv("RANK", "3")
    say("hidden")
    assert not is_main_rank() and capsys.readouterr().out == ""
    monkeypatch.delenv("RANK")
    say("shown")
    assert is_main_rank() and capsys.readouterr().out == "shown\n"


@pytest.mark.slow
@pytest.mark.cluster  # two processes under torchrun: make test-cluster (CI)
def test_under_torchrun_the_start_and_closing_lines_are_printed_once(root):
    """Two processes (DDP over gloo on CPU): one start line, one closing line, one TRL renaming note."""
    import subprocess
    import sys


    port = free_port()
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
           "-m", "rlhfkit", "sft", f"model.name={TINY}", "data.train=sft.jsonl", "output_dir=run", "train.max_steps=2",
           "train.batch_size=4", "learning_rate=1e-3", "track.report=false", "track.progress=false",
           "data.eval_fraction=0.25"]  # 8 held-out records: each rank evaluates some
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert text.count("[rlhfkit] sft: run directory") == 1, text
    assert text.count("[sft] finished in") == 1, text
    assert text.count("[config] TRL names: learning_rate -> optim.lr") == 1, text
