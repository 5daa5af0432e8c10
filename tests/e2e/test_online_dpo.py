"""Online DPO (issue 34): ``rlhfkit online-dpo`` is the online step's producer (two sampled answers a prompt, scored
by the reward) and the offline recipes' preference losses on each fresh pair, with no loop of its own. Its update is
the DPO loss of the pairs (checked against the loss written out, gradients included), ties give no pair, and it
raises the built-in task's gold metric as the other online recipes do."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import produced  # tests/ is on sys.path (pytest prepend mode, no __init__)
from test_online_variants import metrics_of, overrides

from rlhfkit import algos
from rlhfkit.config import build_config
from rlhfkit.train.lifecycle.run import start_run
from rlhfkit.train.online.synchronous import OnlineTrainer, run_online

TINY = "tiny:hidden=32,layers=1,heads=2,kv_heads=2,intermediate=64"


def _trainer(task_data, tmp_path, *extra):
    cfg = build_config("online-dpo", {}, overrides(
        task_data, TINY, tmp_path / "t", "algo.rollout_batch_size=4", "algo.mini_batch_size=8", "train.batch_size=4",
        "algo.total_episodes=8", "optim.lr=0.0", *extra))
    trainer = OnlineTrainer(cfg, start_run(cfg))
    trainer.learner.set_up(trainer.total_steps * trainer.learner.updates_per_step)
    return trainer


def _captured_update(monkeypatch, trainer, exp):
    """Run the learner's step on ``exp``, capturing the policy's gradient at its optimizer step (then applied with
    lr 0: the weights do not move)."""
    import rlhfkit.train.online.preference as op

    grads, real = [], op.clip_and_step

    def capture(acc, model, *args, **kw):
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        return real(acc, model, *args, **kw)

    monkeypatch.setattr(op, "clip_and_step", capture)
    metrics = trainer.learner.learn(exp, 0)
    return metrics, grads


@pytest.mark.parametrize("loss", ["dpo", "ipo", "simpo"])
def test_the_update_is_the_pair_loss_of_the_fresh_pairs(loss, task_data, tmp_path, monkeypatch):
    trainer = _trainer(task_data, tmp_path, f"algo.preference.loss={loss}", "algo.preference.beta=0.5")
    learner = trainer.learner
    try:
        exp = produced(trainer, 0)
        # 4 prompts x 2 answers, completion-major (prompt j: rows j and 4 + j); prompt 2 ties: 3 pairs
        exp.scores = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 2.0, 0.5, 1.0])
        metrics, grads = _captured_update(monkeypatch, trainer, exp)
        assert len(grads) == 1  # one update: the mini-batch holds every pair, in two micro-batches of 2
        # the same loss written out: every row forwarded at once, the offline recipes' loss on the 3 kept pairs
        policy = learner.policy
        policy.zero_grad()
        chosen, rejected = torch.tensor([0, 5, 7]), torch.tensor([4, 1, 3])
        rows = torch.cat([chosen, rejected])
        batch = exp.forward_rows(rows)
        from rlhfkit.train.shared.forward import response_logits

        lp = algos.token_logprobs(response_logits(policy, batch, trainer.cfg.generation.temperature),
                                  batch["response_ids"]).float()
        spec = algos.PREFERENCE_LOSSES[loss]
        ref = exp.ref_logprobs[rows] if spec.needs_reference else None
        assert (ref is not None) == spec.needs_reference and (exp.ref_logprobs is None) != spec.needs_reference
        want, _ = spec.from_logps(algos.pair_logps(lp, exp.sample_mask[rows], torch.arange(3), torch.arange(3) + 3,
                                                   ref), trainer.cfg.algo.preference)
        want.backward()
        assert metrics["loss/policy_avg"] == pytest.approx(want.item(), rel=1e-4, abs=1e-6)
        for name, p in policy.named_parameters():
            torch.testing.assert_close(grads[0][name], p.grad, rtol=1e-4, atol=1e-6)
        assert metrics["rollout/preference_pairs_frac"] == pytest.approx(0.75)
        assert metrics["objective/scores_margin"] == pytest.approx((1.0 + 2.0 + 1.0) / 3)
        for key in ("logps/chosen", "logps/rejected", "rewards/chosen", "rewards/margins", "rewards/accuracies"):
            assert key in metrics, key
        assert ("objective/kl" in metrics) == spec.needs_reference  # simpo loads no reference: no KL to log
    finally:
        trainer.close()


def test_all_ties_apply_no_update(task_data, tmp_path, monkeypatch):
    trainer = _trainer(task_data, tmp_path, "optim.lr=1e-2")
    try:
        exp = produced(trainer, 0)
        exp.scores = torch.ones(8)
        before = [p.detach().clone() for p in trainer.learner.policy.parameters()]
        metrics, grads = _captured_update(monkeypatch, trainer, exp)
        assert all(torch.count_nonzero(g) == 0 for g in grads[0].values())  # a zero loss, still one backward
        assert all(torch.equal(a, p) for a, p in zip(before, trainer.learner.policy.parameters()))
        assert metrics["rollout/preference_pairs_frac"] == 0.0 and metrics["loss/policy_avg"] == 0.0
    finally:
        trainer.close()


def test_the_command_exists_with_its_help():
    out = subprocess.run([sys.executable, "-m", "rlhfkit", "online-dpo", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "online DPO" in out.stdout, out.stderr


@pytest.mark.slow
def test_online_dpo_raises_gold(task_data, sft_dir, gold_of, tmp_path):
    out = tmp_path / "odpo"
    cfg = build_config("online-dpo", {}, overrides(
        task_data, sft_dir, out, "algo.rollout_batch_size=16", "algo.mini_batch_size=32", "train.batch_size=16",
        "algo.total_episodes=1024", "generation.temperature=1.0"))
    run_online(cfg)
    rows = metrics_of(out)
    sft, new = gold_of(sft_dir), gold_of(out)
    pairs = [r["rollout/preference_pairs_frac"] for r in rows if "rollout/preference_pairs_frac" in r]
    print(f"[online-dpo] gold {sft:.3f} (sft) -> {new:.3f}; pairs {sum(pairs) / len(pairs):.2f} of prompts")
    assert new > sft + 0.15, ("online-dpo", sft, new)
    assert json.loads((out / "finished.json").read_text()) is not None


def test_updates_per_step_are_what_the_plan_counts(task_data, tmp_path, monkeypatch):
    # 4 prompts x 4 answers = 16 responses, mini-batches of 2 responses: 8 by the PPO count, but only 4 pairs -> 4
    trainer = _trainer(task_data, tmp_path, "algo.num_generations=4", "algo.mini_batch_size=2", "train.batch_size=2",
                       "algo.total_episodes=16")
    try:
        assert trainer.learner.updates_per_step == 4
        exp = produced(trainer, 0)
        exp.scores = torch.arange(16, dtype=torch.float32)  # no ties: 4 pairs
        _, grads = _captured_update(monkeypatch, trainer, exp)
        assert len(grads) == 4
    finally:
        trainer.close()
