"""What the online step saves must not change what it computes: the old log-probs taken from the on-policy update
itself (one update per rollout), and the no-grad forwards batched by a token budget instead of a row count."""

from __future__ import annotations

import pytest
import torch
from conftest import rollout_of, score_of

from rlhfkit.config import build_config
from rlhfkit.tasks import make_task_data
from rlhfkit.train.lifecycle.run import start_run
from rlhfkit.train.online.experience import token_budget_batches
from rlhfkit.train.online.synchronous import OnlineTrainer

TINY = "tiny:hidden=64,layers=2,intermediate=128"


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    out = tmp_path_factory.mktemp("speed-data")
    make_task_data("quickstart", out, n=64, n_eval=8)
    return out / "prompts.jsonl"


@pytest.fixture
def make_trainer(prompts):
    made = []
    yield lambda out, *extra: made.append(_trainer(prompts, out, *extra)) or made[-1]
    for trainer in made:  # the reward workers
        trainer.close()


def _trainer(prompts, out, *extra) -> OnlineTrainer:
    cfg = build_config("grpo", {}, [
        f"data.train={prompts}", "data.eval=null", "data.eval_fraction=0", f"output_dir={out}", f"model.name={TINY}",
        "generation.max_new_tokens=12", "track.report=false", "data.max_length=64", "train.resume=never",
        "reward.functions=[{fn: 'bench/vs_trl.py:reward'}]", "algo.rollout_batch_size=4", "algo.num_generations=2",
        "algo.mini_batch_size=8", "train.batch_size=8", "algo.total_episodes=8", "optim.lr=1e-3", *extra])
    trainer = OnlineTrainer(cfg, start_run(cfg))
    learner = trainer.learner
    learner.opt = torch.optim.SGD(learner.policy.parameters(), lr=0.0)  # ppo_update steps it; lr 0: weights stay
    learner.sched = torch.optim.lr_scheduler.LambdaLR(learner.opt, lambda _: 1.0)
    return trainer


def test_token_budget_batches_by_hand():
    # rows (prompt, response): 0 (3, 2), 1 (1, 4), 2 (2, 1), 3 (3, 1); longest first: 0, 1 (5 tokens), 3 (4), 2 (3)
    # budget 10: [0] (+1 would be 2 x (3 + 4) = 14); [1] (+3: 2 x 7 = 14); [3, 2] (2 x (3 + 1) = 8)
    assert token_budget_batches([3, 1, 2, 3], [2, 4, 1, 1], 10) == [[0], [1], [2, 3]]
    assert token_budget_batches([3, 1, 2, 3], [2, 4, 1, 1], 3) == [[0], [1], [3], [2]]  # too long: alone
    assert token_budget_batches([3, 1, 2, 3], [2, 4, 1, 1], 100) == [[0, 1, 2, 3]]
    assert token_budget_batches([], [], 10) == []


def test_token_batches_give_the_row_batched_results(make_trainer, tmp_path):
    online = make_trainer(tmp_path / "run", "algo.ppo_epochs=2")
    exp, trainer = rollout_of(online, seed=3), online.learner
    r = exp.rollout
    assert len(set(r.lengths.tolist())) > 1 and len(set(r.prompt_mask.sum(-1).tolist())) > 1  # ragged both sides
    whole = trainer.logprobs_of(trainer.policy, exp.forward_rows(slice(0, len(r))))  # the row-batched pass
    width = r.prompt_length + r.response_ids.shape[1]
    for budget in (1, 2 * width, 10_000):  # one row per batch, a few, all
        batches = exp.token_batches(budget)
        assert sorted(i for idx, _ in batches for i in idx.tolist()) == list(range(len(r)))
        assert all(b["input_ids"].numel() <= max(budget, b["input_ids"].shape[1]) for _, b in batches)
        got = exp.per_token(batches, [trainer.logprobs_of(trainer.policy, b) for _, b in batches])
        m = r.response_mask.bool()
        torch.testing.assert_close(got[m], whole[m], atol=1e-5, rtol=0)  # float32: summation order only


def test_on_policy_update_equals_the_update_with_a_separate_old_forward(make_trainer, tmp_path):
    online = make_trainer(tmp_path / "run", "algo.ppo_epochs=1", "algo.kl.coef=0.04")
    trainer = online.learner
    assert trainer.on_policy_update and not trainer.kl_in_reward
    first = rollout_of(online, seed=5)
    score_of(online, first)

    def update(separate: bool):
        exp = rollout_of(online, seed=5)
        exp.texts, exp.raw_scores, exp.scores, exp.valid = first.texts, first.raw_scores, first.scores, first.valid
        trainer.forward_passes(exp)
        assert exp.old_logprobs is None  # the on-policy step takes no old forward
        if separate:  # what the loop did before: a forward of the same weights
            batches = exp.token_batches(10_000)
            exp.old_logprobs = exp.per_token(batches, [trainer.logprobs_of(trainer.policy, b) for _, b in batches])
        trainer.advantages(exp)
        trainer.policy.zero_grad()
        st = trainer.policy_micro_step(exp.rows_of(torch.arange(len(exp.rollout))), 1.0)
        grads = torch.cat([p.grad.flatten() for p in trainer.policy.parameters() if p.grad is not None])
        return exp, st, grads

    exp_a, st_a, grads_a = update(separate=True)
    exp_b, st_b, grads_b = update(separate=False)
    assert float(st_b["val/ratio"]) == 1.0 and float(st_b["val/ratio_var"]) == 0.0  # exactly: exp(x - x)
    assert float(st_b["policy/clipfrac_avg"]) == 0.0
    torch.testing.assert_close(st_b["loss/policy_avg"], st_a["loss/policy_avg"], atol=1e-6, rtol=0)
    torch.testing.assert_close(grads_b, grads_a, atol=1e-6, rtol=1e-5)
    m = exp_a.mask.bool()
    torch.testing.assert_close(st_b["logprobs"][m], exp_a.old_logprobs[m], atol=1e-5, rtol=0)
    # the loop's update sets the step's old log-probs from its own, and the KL metric is taken from them
    exp_c, _, _ = update(separate=False)
    trainer.ppo_update(exp_c, step=0)
    torch.testing.assert_close(exp_c.old_logprobs[m], exp_a.old_logprobs[m], atol=1e-5, rtol=0)
    kl = trainer.after_on_policy_update(exp_c)["objective/kl"]
    assert kl == pytest.approx(trainer.kl_metrics(exp_a)["objective/kl"], abs=1e-5)


@pytest.mark.parametrize("correction", ["tis", "mis", "icepop"])
def test_a_correction_folded_into_the_on_policy_update_equals_the_separate_old_forward(make_trainer, tmp_path,
                                                                                         correction):
    """Stale samples (the asynchronous mode) take their correction from the update's own log-probs: the same
    gradient, loss mask and weights as with a separate old forward, MIS's dropped tokens included."""
    online = make_trainer(tmp_path / "run", "algo.ppo_epochs=1", f"algo.off_policy.correction={correction}",
                          "algo.off_policy.low=0.95", "algo.off_policy.high=1.05", "algo.off_policy.cap=1.02",
                          "algo.off_policy.icepop.low=0.95", "algo.off_policy.icepop.high=1.05")
    trainer = online.learner
    assert trainer.on_policy_update and trainer.cfg.algo.correction == correction
    first = rollout_of(online, seed=5)
    score_of(online, first)
    noise = 0.1 * torch.randn(first.rollout.response_ids.shape, generator=torch.Generator().manual_seed(0))

    def update(separate: bool):
        exp = rollout_of(online, seed=5)
        exp.texts, exp.raw_scores, exp.scores, exp.valid = first.texts, first.raw_scores, first.scores, first.valid
        trainer.forward_passes(exp)
        assert exp.old_logprobs is None  # no old forward even with a correction
        batches = exp.token_batches(10_000)
        old = exp.per_token(batches, [trainer.logprobs_of(trainer.policy, b) for _, b in batches])
        exp.rollout.logprobs = old + noise  # the sampler's log-probs off the trainer's by ~10%
        if separate:
            exp.old_logprobs = old
        trainer.advantages(exp)
        return exp

    exp_a = update(separate=True)
    m = exp_a.keep_mask("valid").bool()
    if correction == "mis":  # the band drops some tokens and keeps others
        assert 0 < int((exp_a.loss_mask.bool() != m).sum()) < int(m.sum())
    rows = torch.arange(len(exp_a.rollout))
    trainer.policy.zero_grad()
    st_a = trainer.policy_micro_step(exp_a.rows_of(rows), 1.0)
    grads_a = torch.cat([p.grad.flatten() for p in trainer.policy.parameters() if p.grad is not None])

    exp_b = update(separate=False)
    assert exp_b.is_weights is None  # decided in the micro-batches
    batch = {**exp_b.rows_of(rows), "rollout_logprobs": exp_b.rollout.logprobs[rows]}
    trainer.policy.zero_grad()
    st_b = trainer.policy_micro_step(batch, 1.0)
    grads_b = torch.cat([p.grad.flatten() for p in trainer.policy.parameters() if p.grad is not None])
    torch.testing.assert_close(batch["mask"], exp_a.loss_mask)
    torch.testing.assert_close(st_b["loss/policy_avg"], st_a["loss/policy_avg"], atol=1e-6, rtol=0)
    torch.testing.assert_close(grads_b, grads_a, atol=1e-6, rtol=1e-5)

    # the loop's update, then the step's mask, weights and metrics as the separate forward's
    exp_c = update(separate=False)
    trainer.ppo_update(exp_c, step=0)
    metrics = trainer.after_on_policy_update(exp_c)
    torch.testing.assert_close(exp_c.loss_mask, exp_a.loss_mask)
    torch.testing.assert_close(exp_c.is_weights, exp_a.is_weights, atol=1e-5, rtol=0)
    assert metrics["rollout/is_weight_mean"] == pytest.approx(
        float(trainer.advantages(update(separate=True))["rollout/is_weight_mean"]), abs=1e-5)
    assert metrics["rollout/is_ratio_outside_frac"] > 0
