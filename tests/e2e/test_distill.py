"""On-policy distillation end to end on the tiny model: a teacher that shouts (SFT on the shouting demonstrations
only, from the session's SFT model) and the weaker SFT student (shouts ~40 %); distillation with no reward at all
raises the student's gold metric and lowers its reverse KL to the teacher on held-out prompts."""

from __future__ import annotations

import json

import pytest

from rlhfkit.config import build_config
from rlhfkit.train.lifecycle.run import start_run
from rlhfkit.train.online.synchronous import OnlineTrainer, run_online
from rlhfkit.train.supervised.sft import run_sft


@pytest.fixture(scope="module")
def teacher_dir(task_data, sft_dir, tmp_path_factory):
    """The session's SFT model trained further on the demonstrations that shout (the exact answers)."""
    out = tmp_path_factory.mktemp("teacher")
    rows = [json.loads(line) for line in (task_data / "sft.jsonl").read_text().splitlines()]
    good = [r for r in rows if r["messages"][-1]["content"].isupper()]
    (out / "data").mkdir()
    (out / "data" / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good))
    run_sft(build_config("sft", {}, [f"data.train={out / 'data' / 'good.jsonl'}", f"output_dir={out / 'model'}",
                                     f"model.name={sft_dir}", "optim.lr=2e-3", "train.batch_size=32",
                                     "train.epochs=2", "track.report=false", "data.max_length=64"]))
    return out / "model"


def distill_overrides(task_data, student, teacher, out, *extra) -> list[str]:
    return [f"data.train={task_data / 'prompts.jsonl'}", f"data.eval={task_data / 'eval_prompts.jsonl'}",
            f"output_dir={out}", f"model.name={student}", f"teacher.model={teacher}", "optim.lr=3e-4",
            "train.batch_size=32", "generation.max_new_tokens=12", "track.report=false", "data.max_length=64",
            "track.sample_every=0", "train.resume=never", "algo.rollout_batch_size=32", "algo.mini_batch_size=32",
            *extra]


@pytest.mark.slow
def test_distill_raises_gold_and_lowers_reverse_kl(task_data, sft_dir, teacher_dir, gold_of, tmp_path):
    cfg = build_config("distill", {}, distill_overrides(task_data, sft_dir, teacher_dir, tmp_path / "d",
                                                        "algo.total_episodes=640"))
    with start_run(build_config("distill", {}, distill_overrides(task_data, sft_dir, teacher_dir,
                                                                 tmp_path / "before"))) as run:
        trainer = OnlineTrainer(run.cfg, run)
        before = trainer.evaluate()  # the student on the held-out prompts, before any update
        trainer.close()
    last = run_online(cfg)
    student, teacher, after = gold_of(sft_dir), gold_of(teacher_dir), gold_of(tmp_path / "d")
    assert teacher > student + 0.3, (student, teacher)  # the teacher is the stronger model
    assert after > student + 0.2, (student, after, teacher)
    assert last["eval/distill/reverse_kl"] < 0.5 * before["eval/distill/reverse_kl"], (before, last)
    assert last["eval/distill/argmax_agreement"] > before["eval/distill/argmax_agreement"]
    for key in ("distill/reverse_kl", "distill/teacher_logprob_mean", "distill/student_logprob_mean",
                "distill/argmax_agreement", "objective/entropy", "loss/policy_avg"):
        assert key in last, key
    print(f"gold student {student:.2f} -> distilled {after:.2f} (teacher {teacher:.2f}); held-out reverse KL "
          f"{before['eval/distill/reverse_kl']:.3f} -> {last['eval/distill/reverse_kl']:.3f}")


@pytest.fixture(scope="module")
def bpe_teacher_dir(task_data, bpe_tokenizer, tmp_path_factory):
    """A teacher with another tokenizer than the student's (byte-level BPE, tests/conftest.py): a tiny Llama of that
    vocabulary trained from scratch on the demonstrations that shout."""
    from transformers import LlamaForCausalLM

    from rlhfkit.models.tiny import tiny_llama_config

    out = tmp_path_factory.mktemp("bpe_teacher")
    init = out / "init"
    bpe_tokenizer.save_pretrained(init)
    LlamaForCausalLM(tiny_llama_config("tiny:hidden=64,layers=2,intermediate=128", bpe_tokenizer)).save_pretrained(init)
    rows = [json.loads(line) for line in (task_data / "sft.jsonl").read_text().splitlines()]
    good = [r for r in rows if r["messages"][-1]["content"].isupper()]
    (out / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good))
    run_sft(build_config("sft", {}, [f"data.train={out / 'good.jsonl'}", f"output_dir={out / 'model'}",
                                     f"model.name={init}", "optim.lr=5e-3", "train.batch_size=32", "train.epochs=7",
                                     "track.report=false", "data.max_length=64"]))
    return out / "model"


@pytest.mark.slow
def test_distill_across_tokenizers_raises_gold(task_data, sft_dir, bpe_teacher_dir, gold_of, tmp_path):
    """Issue 34: the tiny character-tokenizer student learns from the BPE teacher, the teacher reading the student's
    text in its own tokens (aligned by character spans), with no reward at all."""
    last = run_online(build_config("distill", {}, distill_overrides(task_data, sft_dir, bpe_teacher_dir,
                                                                     tmp_path / "x", "algo.total_episodes=640")))
    student, teacher, after = gold_of(sft_dir), gold_of(bpe_teacher_dir), gold_of(tmp_path / "x")
    print(f"gold student {student:.2f} -> distilled across tokenizers {after:.2f} (teacher {teacher:.2f}); aligned "
          f"{last['distill/aligned_frac']:.3f} of student tokens")
    assert teacher > student + 0.3, (student, teacher)
    assert after > student + 0.2, (student, after, teacher)
    assert last["distill/aligned_frac"] > 0.9 and "distill/argmax_agreement" not in last
