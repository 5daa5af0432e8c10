"""End-to-end and behavioural tests of the online loop (PPO, GRPO, RLOO, REINFORCE++) on the tiny model.

The SFT policy shouts (answers in capitals) about 40 % of the time; the reward model or the exact-match reward
function prefers shouting, so a working online loop raises the gold metric (sampled exact-answer accuracy).
"""

from __future__ import annotations

import pytest
import torch
from conftest import rollout_of, run_until_first_checkpoint, score_of

from rlhfkit.config import build_config
from rlhfkit.train.lifecycle.run import start_run
from rlhfkit.train.online.experience import Experience
from rlhfkit.train.online.learner import Learner
from rlhfkit.train.online.synchronous import OnlineTrainer, run_online

REWARD_FN = "reward.functions=[{fn: 'rlhfkit.tasks.quickstart:reward'}]"


def online_overrides(task_data, sft_dir, out, *extra) -> list[str]:
    return [f"data.train={task_data / 'prompts.jsonl'}", f"data.eval={task_data / 'eval_prompts.jsonl'}",
            f"output_dir={out}", f"model.name={sft_dir}", "optim.lr=1e-4", "critic.lr=1e-3", "train.batch_size=32",
            "generation.max_new_tokens=12", "track.report=false", "data.max_length=64", "track.sample_every=0",
            "train.resume=never", *extra]


def metrics_of(run_dir) -> list[dict]:
    """The run's metrics.jsonl under rlhfkit's names (it writes TRL's for grpo / rloo / online-dpo)."""
    from rlhfkit.track.metrics import read_run_metrics

    return read_run_metrics(run_dir)


@pytest.mark.slow
@pytest.mark.cluster  # one of the longest checks (~10 s): make test-cluster, which CI runs
def test_ppo_with_reward_model_raises_gold_with_bounded_kl(task_data, sft_dir, rm_dir, gold_of, tmp_path):
    out = tmp_path / "ppo"
    cfg = build_config("ppo", {}, online_overrides(
        task_data, sft_dir, out, f"reward.model={rm_dir}", "algo.rollout_batch_size=32", "algo.mini_batch_size=32",
        "algo.total_episodes=1536"))
    run_online(cfg)
    rows = [r for r in metrics_of(out) if "objective/kl" in r]
    sft, ppo = gold_of(sft_dir), gold_of(out)
    # measured: sft 0.36 -> ppo 0.7-0.8 with 2048 episodes; 1536 here
    assert ppo > sft + 0.15, (sft, ppo)
    assert max(r["objective/kl"] for r in rows) < 5.0  # per-sequence KL to the SFT policy stays bounded
    assert rows[-1]["objective/scores"] > rows[0]["objective/scores"]
    lengths = [r["response/length_mean"] for r in rows]
    assert all(r["response/length_std"] > 0 for r in rows[:3])  # lengths vary within a batch: EOS respected
    assert max(lengths) < 12  # never forced to max_new_tokens
    for key in ("objective/entropy", "objective/non_score_reward", "objective/rlhf_reward", "policy/approxkl_avg",
                "policy/clipfrac_avg", "loss/policy_avg", "loss/value_avg", "val/clipfrac_avg", "val/ratio",
                "val/ratio_var", "val/num_eos_tokens", "lr", "episode", "eps", "policy/entropy_avg"):
        assert key in rows[-1], key


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["grpo", "rloo"])
def test_critic_free_with_reward_function_raises_gold(recipe, task_data, sft_dir, gold_of, tmp_path):
    out = tmp_path / recipe
    cfg = build_config(recipe, {}, online_overrides(
        task_data, sft_dir, out, REWARD_FN, "algo.rollout_batch_size=8", "algo.num_generations=4",
        "algo.mini_batch_size=32", "algo.total_episodes=1024"))
    run_online(cfg)
    sft, new = gold_of(sft_dir), gold_of(out)
    assert new > sft + 0.15, (recipe, sft, new)


@pytest.mark.slow
def test_reinforce_pp_raises_reward(task_data, sft_dir, tmp_path):
    out = tmp_path / "reinforce"
    cfg = build_config("reinforce", {}, online_overrides(
        task_data, sft_dir, out, REWARD_FN, "algo.rollout_batch_size=32", "algo.mini_batch_size=32",
        "algo.total_episodes=1024"))
    last = run_online(cfg)
    first = next(r for r in metrics_of(out) if "objective/scores" in r)
    assert last["eval/scores"] > first["objective/scores"] + 0.1


@pytest.mark.slow
def test_w_reinforce_raises_gold(task_data, sft_dir, gold_of, tmp_path):
    """W-REINFORCE (no baseline, right answers weighted 0.1) on the grpo recipe: the gold metric rises, and the
    estimator's own section reaches it (a lambda of 0.1 gives right answers a tenth of a wrong answer's push)."""
    out = tmp_path / "w_reinforce"
    cfg = build_config("grpo", {}, online_overrides(
        task_data, sft_dir, out, REWARD_FN, "algo.advantage=w_reinforce", "reward.missing_eos_scope=all",
        "algo.rollout_batch_size=8", "algo.num_generations=4", "algo.mini_batch_size=32", "algo.total_episodes=1024"))
    run_online(cfg)
    sft, new = gold_of(sft_dir), gold_of(out)
    assert new > sft + 0.1, (sft, new)


def _trainer(task_data, sft_dir, tmp_path, recipe="grpo", *extra):
    cfg = build_config(recipe, {}, online_overrides(
        task_data, sft_dir, tmp_path / "t", REWARD_FN, "algo.rollout_batch_size=4", "algo.num_generations=2",
        "algo.mini_batch_size=8", "train.batch_size=4", "algo.total_episodes=8", *extra))
    return OnlineTrainer(cfg, start_run(cfg))


@pytest.mark.parametrize("epochs, forwards", [(1, 0), (2, 2)])
def test_grpo_with_beta_zero_makes_no_reference_forward(epochs, forwards, task_data, sft_dir, tmp_path, monkeypatch):
    trainer = _trainer(task_data, sft_dir, tmp_path, "grpo", "algo.kl.coef=0", f"algo.ppo_epochs={epochs}",
                       "memory.forward_tokens=64")
    learner = trainer.learner
    assert learner.ref is None and not learner.use_kl
    assert learner.on_policy_update == (epochs == 1)  # one update per rollout: the update's own log-probs
    seen = []
    real = Learner.logprobs_of
    monkeypatch.setattr(Learner, "logprobs_of", lambda self, model, batch, *a, **kw: seen.append(model) or
                        real(self, model, batch, *a, **kw))
    exp = rollout_of(trainer)
    score_of(trainer, exp)
    widths = exp.rollout.prompt_mask.sum(-1) + exp.rollout.response_mask.sum(-1)
    assert int(widths.min()) * 8 > 64  # so 64 tokens cannot hold the 8 rows in one batch
    learner.forward_passes(exp)
    assert exp.ref_logprobs is None
    # policy only: none when on-policy; else 8 responses in token batches of <= 64 tokens, at least 2
    assert all(m is learner.policy for m in seen) and (len(seen) >= 2 if forwards else not seen)


def test_tokens_after_eos_change_nothing(task_data, sft_dir, tmp_path):
    """Garbage after the first EOS must not move any loss, KL, advantage, value or metric."""
    online = _trainer(task_data, sft_dir, tmp_path, "ppo", "algo.kl.coef=0.1", "critic.init=policy",
                      "algo.rollout_batch_size=8", "algo.num_generations=1", "train.batch_size=8")
    first, trainer = rollout_of(online), online.learner
    rollout, rows = first.rollout, first.rows
    assert not bool(rollout.response_mask.all()), "need at least one response that ended before the last column"
    score_of(online, first, shape=False)
    raw = first.raw_scores

    def run(r):
        torch.manual_seed(0)
        trainer.moments.mean, trainer.moments.var, trainer.moments.count = 0.0, 1.0, 0
        exp = Experience.of(r, rows)
        exp.raw_scores, exp.scores = raw, trainer.shape_scores(raw, r.ended)
        trainer.forward_passes(exp)
        trainer.advantages(exp)
        trainer.policy.zero_grad()
        stats = trainer.policy_micro_step(exp.rows_of(torch.arange(len(r))), 1.0)
        grads = torch.cat([p.grad.flatten() for p in trainer.policy.parameters() if p.grad is not None])
        return exp, stats, grads

    exp_a, stats_a, grads_a = run(rollout)
    garbage = rollout[torch.arange(len(rollout))]
    after = garbage.response_mask == 0
    garbage.response_ids = torch.where(after, torch.randint(5, 90, garbage.response_ids.shape), garbage.response_ids)
    exp_b, stats_b, grads_b = run(garbage)
    m = exp_a.mask.bool()
    for name in ("old_logprobs", "ref_logprobs", "values", "kl", "advantages", "returns"):
        a, b = getattr(exp_a, name), getattr(exp_b, name)
        torch.testing.assert_close(a[m], b[m], msg=name)
        assert torch.all(exp_b.advantages[~m] == 0)
    for key in stats_a:
        torch.testing.assert_close(stats_a[key], stats_b[key], msg=key)
    torch.testing.assert_close(grads_a, grads_b)


@pytest.mark.slow
def test_ppo_resume_gives_the_same_parameters(task_data, sft_dir, rm_dir, tmp_path):
    """2N updates straight == N updates, stop, resume, N more (same parameters within tolerance on CPU)."""
    def cfg_for(out, *extra):
        return build_config("ppo", {}, online_overrides(
            task_data, sft_dir, out, f"reward.model={rm_dir}", "algo.rollout_batch_size=8", "algo.mini_batch_size=8",
            "train.batch_size=8", "algo.total_episodes=32", "train.save_every=4", "algo.kl.adaptive=true", *extra))

    straight = tmp_path / "straight"
    run_online(cfg_for(straight))
    # a run that stops after the checkpoint at update 4 (step 2 of 4): same config, but only 2 steps of episodes
    resumed = tmp_path / "resumed"
    half = cfg_for(resumed)
    run_until_first_checkpoint(run_online, half)
    assert (resumed / "checkpoint-4").is_dir()
    run_online(cfg_for(resumed, "train.resume=auto"))
    from safetensors.torch import load_file

    a = load_file(straight / "model.safetensors")
    b = load_file(resumed / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4, msg=k)
    steps = [r["step"] for r in metrics_of(resumed)]
    assert len(steps) == len(set(steps))


@pytest.mark.parametrize("coef", [0.04, 0.0])
def test_grpo_progress_line_shows_trl_s_per_token_kl_as_kl_and_the_answer_s_sum_as_seq_kl(
        coef, task_data, sft_dir, tmp_path, capsys):
    """The progress line (off a terminal: one plain line a step here) shows under ``kl`` what ``metrics.jsonl``
    writes as ``kl`` (TRL's per-token figure) and the KL summed over an answer as ``seq_kl``; it showed that sum as
    ``kl``. Without a KL term (coef 0: no reference) no KL is measured, and none is written or shown (as TRL at
    beta 0); it was written as 0, a policy that had not moved."""
    from rlhfkit.track.console import format_number
    from rlhfkit.track.metrics import read_metrics

    out = tmp_path / "grpo"
    run_online(build_config("grpo", {}, online_overrides(
        task_data, sft_dir, out, REWARD_FN, "data.eval=null", "algo.rollout_batch_size=4", "algo.num_generations=4",
        "algo.mini_batch_size=16", "train.batch_size=16", "algo.total_episodes=48", "optim.lr=1e-3",
        f"algo.kl.coef={coef}", "track.progress=true")))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[grpo] 3/3")]
    rows = read_metrics(out)  # as written: TRL's names
    last = rows[-1]
    assert lines and len(rows) == 3
    if coef == 0:
        assert not any({"kl", "objective/kl", "objective/kl_per_token"} & set(r) for r in rows), last
        assert " kl=" not in lines[-1] and "seq_kl=" not in lines[-1], lines[-1]
        return
    assert last["objective/kl"] > last["kl"] > 0  # answers longer than one token: the sum is larger
    assert f" kl={format_number(last['kl'])}" in lines[-1], lines[-1]
    assert f" seq_kl={format_number(last['objective/kl'])}" in lines[-1], lines[-1]


def test_grpo_with_frozen_embeddings_saves_them_as_loaded_and_trains_the_rest(task_data, sft_dir, tmp_path):
    # model.train_embeddings=false through a whole run (rollout, the fused LM head's backward, AdamW, the save)
    from safetensors.torch import load_file

    out = tmp_path / "frozen"
    run_online(build_config("grpo", {}, online_overrides(
        task_data, sft_dir, out, REWARD_FN, "algo.rollout_batch_size=4", "algo.num_generations=2",
        "algo.mini_batch_size=8", "train.batch_size=4", "algo.total_episodes=16", "optim.lr=1e-3",
        "model.train_embeddings=false")))
    before, after = load_file(sft_dir / "model.safetensors"), load_file(out / "model.safetensors")
    emb = next(k for k in before if "embed_tokens" in k)
    assert torch.equal(before[emb], after[emb])
    moved = [k for k in before if k != emb and not torch.equal(before[k], after[k])]
    assert len(moved) >= len(before) // 2, moved
