"""Shared fixtures: the built-in task's data, and an SFT policy + reward model trained once per test session on
the tiny model (about 30 s together on 2 CPU cores), reused by every recipe's end-to-end test."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY = "tiny:hidden=64,layers=2,intermediate=128"


def import_script(folder: str, name: str):
    """A script of the repository's ``folder`` (``bench``, ``tools``) imported as a module (bench's scripts import
    each other by bare name)."""
    import importlib
    import sys

    where = str(Path(__file__).resolve().parents[1] / folder)
    sys.path.insert(0, where)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(where)


def import_bench(name: str):
    """A script of ``bench/`` imported as a module."""
    return import_script("bench", name)


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def sleeper_with_child(script: Path, pids: Path) -> Path:
    """A stand-in worker at ``script``: it starts a child of its own, writes ``"<its pid> <child's pid>"`` to
    ``pids`` and sleeps (for the tests that a stopped bench takes its worker's whole tree with it)."""
    script.write_text("import os, subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                      f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
                      "time.sleep(120)\n")
    return script


# What a hostile program does first in the sandbox tests: the guard's audit hook keeps its on-switch in a closure list,
# and the garbage collector hands any program that list; then only the boundary holds.
DISARM = '''
import gc, os
for _f in gc.get_objects():
    if getattr(_f, "__name__", "") == "hook" and getattr(_f, "__closure__", None):
        for _c in _f.__closure__:
            try:
                if isinstance(_c.cell_contents, list):
                    _c.cell_contents.clear()
            except ValueError:
                pass
import ctypes  # refused by the hook while it is armed: importing it proves the hook is off
print("disarmed")
'''


def machine_lacks(level: str) -> str:
    """Why this machine cannot be expected to give the sandbox's ``level`` (checked with the system's own tools, not
    rlhfkit's sandbox), "" when it can: then a failure to set the level up is a failure of rlhfkit, never a skip."""
    from rlhfkit.rewards.sandbox import seccomp_filter

    if level == "namespaces":
        if shutil.which("bwrap") is None:
            return "bubblewrap is not installed"
        minimal = ["bwrap", "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc", "--dev",
                   "/dev", "true"]  # bubblewrap alone (an AppArmor profile may allow it where `unshare -U` is not)
        if subprocess.run(minimal, capture_output=True).returncode != 0 and \
                subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode != 0:
            return "user namespaces are not allowed here (`unshare -U true` and a minimal bwrap both fail)"
    if level == "unshare":
        if shutil.which("unshare") is None:
            return "util-linux's unshare is not installed"
        if subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode != 0:
            return "user namespaces are not allowed here (`unshare -U true` fails)"
    if level == "namespaces" and seccomp_filter()[0] is None:
        return f"no seccomp filter here: {seccomp_filter()[1]}"
    return ""


def verdict_level() -> str:
    """The isolation for tests of a verifier's verdicts (not of the sandbox): the boundary (``auto``) where this machine
    can give it, else ``process``, so that those tests run, and pass, on a machine without bubblewrap."""
    return "process" if machine_lacks("namespaces") else "auto"


def sandbox_at(level: str, limits=None, python: str | None = None):
    """A probed sandbox at ``level``; the test is skipped (with the reason) only where :func:`machine_lacks` says the
    machine cannot give it, and fails where it can and rlhfkit did not set it up."""
    from rlhfkit.rewards.sandbox import Sandbox

    why = machine_lacks(level)
    if why:
        pytest.skip(f"isolation {level} cannot be had on this machine: {why}")
    box = Sandbox(limits, isolation=level, python=python)
    box.probe()  # SandboxError: rlhfkit failed where the machine allows the level
    return box


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (torchrun's / torch.distributed's rendezvous); tests import it from here."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rollout_of(trainer, step: int = 0, seed: int = 0):
    """Step 2 of an ``OnlineTrainer`` by hand: its producer's rollout of ``step``'s prompts, the learner's policy."""
    producer = trainer.producer
    return producer.rollout(trainer.learner.policy, producer.prompt_batch(step, producer.share), seed=seed)


def score_of(trainer, exp, shape: bool = True) -> None:
    """Step 3 by hand: the producer's raw scores, then (``shape``) the learner's shaped scores, onto ``exp``."""
    trainer.producer.score(exp)
    if shape:
        exp.scores = trainer.learner.shape_scores(exp.raw_scores, exp.rollout.ended, exp.rollout.lengths, exp.valid)


def produced(trainer, step: int = 0):
    """Steps 1-3 by hand: the producer's experience of ``step`` (dynamic sampling included), its scores shaped."""
    exp = trainer.producer.produce(trainer.learner.policy, step)
    exp.scores = trainer.learner.shape_scores(exp.raw_scores, exp.rollout.ended, exp.rollout.lengths, exp.valid)
    return exp


def sft_overrides(data: Path, out: Path) -> list[str]:
    return [f"data.train={data / 'sft.jsonl'}", f"output_dir={out}", f"model.name={TINY}", "optim.lr=5e-3",
            "train.batch_size=32", "train.epochs=7", "track.report=false", "data.max_length=64"]


def rm_overrides(data: Path, sft: Path, out: Path) -> list[str]:
    return [f"data.train={data / 'preference.jsonl'}", f"data.eval={data / 'eval_preference.jsonl'}",
            f"output_dir={out}", f"model.name={sft}", "optim.lr=1e-3", "train.batch_size=32", "train.epochs=2",
            "track.report=false", "data.max_length=64"]


@pytest.fixture(autouse=True)
def _config_notes_fresh():
    """The ``[config] learning_rate -> optim.lr`` notes are printed once per process: each test starts as a fresh
    process would, so that a test reading them does not depend on which tests ran before it."""
    from rlhfkit.config import aliases

    aliases._ALIASES_LOGGED.clear()
    yield


@pytest.fixture(scope="session")
def task_data(tmp_path_factory) -> Path:
    from rlhfkit.tasks import make_task_data

    out = tmp_path_factory.mktemp("quickstart-data")
    make_task_data("quickstart", out, n=2000, n_eval=200)
    return out


@pytest.fixture(scope="session")
def eval_prompts(task_data) -> list[dict]:
    return [json.loads(line) for line in (task_data / "eval_prompts.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def sft_run(task_data, tmp_path_factory) -> tuple[Path, dict]:
    """(model directory, final metrics) of SFT on the built-in task."""
    from rlhfkit.config import build_config
    from rlhfkit.train.supervised.sft import run_sft

    out = tmp_path_factory.mktemp("sft")
    metrics = run_sft(build_config("sft", {}, sft_overrides(task_data, out)))
    return out, metrics


@pytest.fixture(scope="session")
def sft_dir(sft_run) -> Path:
    return sft_run[0]


@pytest.fixture(scope="session")
def rm_run(task_data, sft_dir, tmp_path_factory) -> tuple[Path, dict]:
    from rlhfkit.config import build_config
    from rlhfkit.train.supervised.reward import run_rm

    out = tmp_path_factory.mktemp("rm")
    metrics = run_rm(build_config("rm", {}, rm_overrides(task_data, sft_dir, out)))
    return out, metrics


@pytest.fixture(scope="session")
def rm_dir(rm_run) -> Path:
    return rm_run[0]


@pytest.fixture(scope="session")
def gold_of(eval_prompts):
    """gold_of(model_dir_or_spec) -> sampled exact-answer accuracy on the held-out prompts."""
    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import load_causal_lm
    from rlhfkit.tasks import get_task
    from rlhfkit.tasks.gold import gold_metric

    def fn(name) -> float:
        model, tok = load_causal_lm(ModelConfig(name=str(name)), trainable=False)
        return gold_metric(model, tok, get_task("quickstart"), eval_prompts, seed=1)["gold"]

    return fn


TWO_QUESTIONS = '''
class TwoQuestions:
    """A user-written environment without tools: asks a follow-up question after the first answer; rewards answers
    that are short (a stand-in for any check a user writes)."""

    def __init__(self, limit=6):
        self.limit, self.turns = limit, 0

    def reset(self, row):
        return row["prompt"]

    def step(self, messages, completion):
        self.turns += 1
        reward = 1.0 if len(completion) <= self.limit else 0.0
        if self.turns == 1:
            return [{"role": "user", "content": "and again?"}], reward, False
        return [], reward, True

    def metrics(self):
        return {"turns_seen": float(self.turns)}
'''


@pytest.fixture
def two_questions_env(tmp_path) -> str:
    """``file.py:Class`` of a user-written two-turn environment (written to the test's directory)."""
    path = tmp_path / "two_questions.py"
    path.write_text(TWO_QUESTIONS)
    return f"{path}:TwoQuestions"


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory):
    """A second tokenizer unlike the tiny character one: byte-level BPE with merges (words, spaces fused; non-ASCII
    characters split into bytes), trained offline on the built-in task's text, ChatML end of turn ``<|im_end|>``,
    rlhfkit's default chat template (cross-tokenizer alignment and distillation tests)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rlhfkit.models.tokenizer import prepare_tokenizer
    from rlhfkit.tasks import make_task_data

    data = tmp_path_factory.mktemp("bpe-data")
    make_task_data("quickstart", data, n=200, n_eval=10)
    lines = [line for f in sorted(data.glob("*.jsonl")) for line in f.read_text().splitlines()]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines + ["Hello world, how are you?", "a  b\n\nc", "12+34=46. ok"], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|im_end|>", "<|im_start|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return prepare_tokenizer(PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                                     additional_special_tokens=["<|im_start|>"]))


def run_until_first_checkpoint(run, cfg) -> None:
    """``run(cfg)`` stopped right after its first checkpoint is written (as a kill after a save would): the tests that
    resume it compare it with an uninterrupted run."""
    from rlhfkit.train.lifecycle import checkpoint as checkpoint_mod

    class Stop(Exception):
        pass

    real_save = checkpoint_mod.Checkpointer.save

    def save_then_stop(self, step, **kw):
        real_save(self, step, **kw)
        raise Stop

    checkpoint_mod.Checkpointer.save = save_then_stop
    try:
        with pytest.raises(Stop):
            run(cfg)
    finally:
        checkpoint_mod.Checkpointer.save = real_save
