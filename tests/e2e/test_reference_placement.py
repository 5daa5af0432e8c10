"""Where the reference's log-probs are taken (``algo.async.reference``, train/online/reference.py): a producer's are the
learner's, travel with the experience, survive a merge of pieces and a checkpointed queue, and a learner that
expects them but gets none (a queue saved under the other placement) takes them itself."""

from __future__ import annotations

import pytest
import torch
from conftest import rollout_of, score_of

from rlhfkit.config import build_config
from rlhfkit.tasks import make_task_data
from rlhfkit.train.lifecycle.run import start_run
from rlhfkit.train.online.bridge import experience_of, experience_state
from rlhfkit.train.online.experience import merge_groups
from rlhfkit.train.online.reference import ProducerReference, on_producer
from rlhfkit.train.online.synchronous import OnlineTrainer

TINY = "tiny:hidden=64,layers=2,intermediate=128"


def _cfg(prompts, out, *extra):
    return build_config("grpo", {}, [
        f"data.train={prompts}", "data.eval=null", "data.eval_fraction=0", f"output_dir={out}", f"model.name={TINY}",
        "generation.max_new_tokens=10", "track.report=false", "data.max_length=64", "train.resume=never",
        "reward.functions=[{fn: 'bench/vs_trl.py:reward'}]", "algo.rollout_batch_size=4", "algo.num_generations=2",
        "algo.mini_batch_size=8", "train.batch_size=8", "algo.total_episodes=8", "algo.kl.coef=0.04", *extra])


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref-data")
    make_task_data("quickstart", out, n=32, n_eval=4)
    return out / "prompts.jsonl"


def test_auto_puts_the_reference_on_the_producers_on_cpu_and_on_the_learners_on_cuda():
    cfg = lambda *x: build_config("grpo", {}, ["algo.async.max_staleness=1", *x])  # noqa: E731
    assert on_producer(cfg("algo.kl.coef=0.04"), cuda=False) and not on_producer(cfg("algo.kl.coef=0.04"), cuda=True)
    assert on_producer(cfg("algo.kl.coef=0.04", "algo.async.reference=producer"), cuda=True)
    assert not on_producer(cfg("algo.kl.coef=0.04", "algo.async.reference=learner"), cuda=False)
    assert not on_producer(cfg("algo.kl.coef=0"), cuda=False)  # no KL: no reference anywhere
    sync = build_config("grpo", {}, ["algo.kl.coef=0.04", "algo.async.reference=producer"])
    assert not on_producer(sync, cuda=False)  # the synchronous learner takes them: it is the producer's process


def test_a_producers_reference_log_probs_are_the_learners(prompts, tmp_path):
    cfg = _cfg(prompts, tmp_path / "run")
    online = OnlineTrainer(cfg, start_run(cfg))
    try:
        learner = online.learner
        assert learner.ref is not None  # synchronous: the learner holds the reference
        exp = rollout_of(online, seed=3)
        score_of(online, exp)
        learner.forward_passes(exp)
        theirs = exp.ref_logprobs

        again = rollout_of(online, seed=3)
        score_of(online, again)
        ProducerReference(cfg, learner.policy, learner.tok, learner.device).annotate(again)
        m = exp.sample_mask.bool()
        assert m.any() and torch.equal(again.ref_logprobs[m], theirs[m])  # same model, batches and precision

        # the wire format and a merge of pieces carry them with their rows
        back = experience_of(experience_state(again), "cpu")
        assert torch.equal(back.ref_logprobs, again.ref_logprobs)
        merged = merge_groups([again, back], [(1, 1), (0, 0)], 2, learner.tok.pad_token_id, "cpu")
        P = len(again.rollout) // 2
        for j in range(2):  # completion j of group (1, 1) is row j * 2 of the merge; of (0, 0), row j * 2 + 1
            width = again.ref_logprobs.shape[1]
            assert torch.equal(merged.ref_logprobs[2 * j, :width], back.ref_logprobs[j * P + 1])
            assert torch.equal(merged.ref_logprobs[2 * j + 1, :width], again.ref_logprobs[j * P])
        state = experience_state(again)
        del state["ref_logprobs"]  # a queue checkpointed before they travelled
        assert experience_of(state, "cpu").ref_logprobs is None
    finally:
        online.close()


def test_a_learner_expecting_them_takes_them_itself_when_none_came(prompts, tmp_path, monkeypatch):
    cfg = _cfg(prompts, tmp_path / "run")
    online = OnlineTrainer(cfg, start_run(cfg))
    try:
        learner = online.learner
        exp = rollout_of(online, seed=4)
        score_of(online, exp)
        learner.forward_passes(exp)
        theirs = exp.ref_logprobs
        learner.ref, learner.ref_from_producer = None, True  # what an asynchronous learner with auto holds on CPU
        sent = rollout_of(online, seed=4)
        score_of(online, sent)
        sent.ref_logprobs = torch.full_like(theirs, -1.0)  # the producer's: used as they came
        learner.forward_passes(sent)
        assert learner.ref is None and torch.equal(sent.ref_logprobs, torch.full_like(theirs, -1.0))
        missing = rollout_of(online, seed=4)
        score_of(online, missing)
        learner.forward_passes(missing)  # none came: the learner loads the reference once and takes them
        assert learner.ref is not None
        m = exp.sample_mask.bool()
        assert torch.equal(missing.ref_logprobs[m], theirs[m])
    finally:
        online.close()
