"""Finite divergence is named on real runs (issue 21 §5): SFT, RM and DPO at lr=1 on the tiny model write the
supervised health warnings (loss far above its start, per-token loss above ln |V|, gradient blow-up) to
warnings.jsonl and print them; GRPO at lr=1 from the SFT model fires the KL rule; the normal runs of the shared
fixtures (SFT, RM) stay free of these warnings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY

from rlhfkit.config import build_config
from rlhfkit.track import read_warnings

SUPERVISED_RULES = {"loss_rising", "loss_at_uniform", "grad_norm_blowup"}


def _lr1(data, out) -> list[str]:
    return [f"data.train={data}", f"output_dir={out}", f"model.name={TINY}", "optim.lr=1", "train.batch_size=8",
            "train.max_steps=6", "train.log_every=1", "track.report=false", "track.progress=false", "data.limit=64",
            "data.max_length=48"]


@pytest.mark.parametrize("recipe, data, expected", [
    # measured (batch 8, 6 steps, 64 records): SFT loss 4.63 -> 44, 35, 50, 50, 44 per token (ln |V| = 4.6), gradient
    # norm 3.3 -> 38; RM 0.69 -> 2.6, 3.0, 2.0, 0.65, 0.68, gradient norm 0.49 -> 573; DPO 0.69 -> 2.5, 1.2, 2.3, 1.8,
    # 0.66, gradient norm 0.69 -> 16. Each names all three rules it can (RM and DPO have no ln |V|)
    ("sft", "sft.jsonl", {"loss_rising", "loss_at_uniform", "grad_norm_blowup"}),
    ("rm", "preference.jsonl", {"loss_rising", "grad_norm_blowup"}),
    ("dpo", "preference.jsonl", {"loss_rising", "grad_norm_blowup"}),
])
def test_supervised_recipes_at_lr1_name_the_divergence(recipe, data, expected, task_data, tmp_path, capsys):
    from rlhfkit.train.supervised.preference import run_preference
    from rlhfkit.train.supervised.reward import run_rm
    from rlhfkit.train.supervised.sft import run_sft

    run = {"sft": run_sft, "rm": run_rm, "dpo": run_preference}[recipe]
    out = tmp_path / recipe
    run(build_config(recipe, {}, _lr1(task_data / data, out)))
    names = {r["name"] for r in read_warnings(out)}
    assert expected <= names, (names, [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()])
    printed = capsys.readouterr().out
    assert "critical: step " in printed and "lower optim.lr" in printed


def test_normal_sft_and_rm_runs_raise_no_divergence_warning(sft_dir, rm_dir):
    for out in (sft_dir, rm_dir):
        assert not SUPERVISED_RULES & {r["name"] for r in read_warnings(out)}, out


@pytest.mark.slow
def test_grpo_at_lr1_fires_a_kl_rule(task_data, sft_dir, tmp_path):
    from rlhfkit.train.online.synchronous import run_online

    out = tmp_path / "grpo"
    run_online(build_config("grpo", {}, [
        f"data.train={task_data / 'prompts.jsonl'}", f"output_dir={out}", f"model.name={sft_dir}", "optim.lr=1",
        "reward.functions=[{fn: 'rlhfkit.tasks.quickstart:reward'}]", "algo.rollout_batch_size=4",
        "algo.num_generations=4", "algo.mini_batch_size=16", "algo.total_episodes=64", "generation.max_new_tokens=12",
        "track.report=false", "track.progress=false", "data.max_length=64", "track.sample_every=0",
        "algo.entropy_coef=0.01"]))
    # measured on the tiny model: the policy turns deterministic (entropy 0) repeating one token, KL 0 -> 39 nats
    names = {r["name"] for r in read_warnings(out)}
    assert {"kl_blowup", "kl_high", "kl_per_token"} & names, names


def test_dapo_where_every_group_ties_at_every_draw_warns(tmp_path, monkeypatch):
    """A reward that pays every answer alike: every group ties in every draw of dynamic sampling, and each step says
    it has no learning signal (the entropy bonus keeps a gradient, so the run itself finishes)."""
    from rlhfkit.cli import main

    rows = [{"prompt": f"shout: {w}"} for w in ["cat", "dog", "owl", "bee"] * 4]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "flat.py").write_text("def flat(prompts, completions, **fields):\n"
                                      "    return [0.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    from rlhfkit.models.tokenizer import load_tokenizer
    from rlhfkit.train.lifecycle.session import Session

    opened, real = {}, Session.open_health
    monkeypatch.setattr(Session, "open_health", lambda self, **kw: opened.update(kw) or real(self, **kw))
    out = tmp_path / "run"
    code = main(["grpo", str(Path(__file__).parents[2] / "configs/dapo.yaml"), f"model.name={TINY}",
                 "data.train=prompts.jsonl", "data.eval=null", f"output_dir={out}",
                 "reward.functions=[{fn: flat.py:flat}]", "algo.rollout_batch_size=4", "algo.num_generations=4",
                 "algo.mini_batch_size=16", "train.batch_size=16", "algo.total_episodes=32",
                 "algo.dynamic_sampling.max_draws=2", "algo.entropy_coef=0.01", "generation.max_new_tokens=6",
                 "algo.overlong.cache_len=0", "reward.missing_eos_penalty=null",  # no length term: every score 0
                 "data.max_length=48", "track.report=false", "track.progress=false"])
    assert code == 0
    records = [r for r in read_warnings(out) if r["name"] == "dynamic_sampling_starved"]
    assert records and "no learning signal" in records[0]["message"] and "2 batches" in records[0]["message"]
    assert opened["vocab_size"] == len(load_tokenizer(TINY)) == 100  # the online monitor knows ln |V|
