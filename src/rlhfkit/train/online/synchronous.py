"""The online loop: PPO with actor / critic / reference / reward, and the critic-free GRPO, RLOO and REINFORCE++ —
one loop, the advantage estimator chosen by name (``algo.advantage``).

The second of two training loops (the supervised one: ``loop.py``); both share ``run.set_up_trained`` (wrap,
optimizer, schedule, prepare, resume, metrics), ``optim.clip_and_step``, ``checkpoint.py`` and ``session.py``. A step
is a **producer** (``producer.py``: steps 1-3, prompts -> an :class:`~.experience.Experience` with raw scores) and a
**learner** (``learner.py``: steps 4-6, the experience -> an update). Here they run one after the other in each
process (``algo.async.max_staleness=0``, the default); ``asynchronous.py`` runs them at once on separate processes.

Each step (see docs/architecture.md, "Data flow of an online step"):
  1. take a batch of prompts (each repeated ``num_generations`` times, completion-major)
  2. rollout with the policy's engine: every response stops at its own EOS; the mask ends at the first EOS; the
     engine reports the log-prob each token was sampled with
  3. score: reward model (ids reused, or text re-tokenised when its tokenizer differs) and / or reward functions;
     missing-EOS and DAPO overlong penalties, running normalisation, clipping. With DAPO dynamic sampling, steps
     1-3 repeat on fresh prompts until the batch holds only groups whose rewards differ (or the draws are capped)
  4. forward passes without grad, in batches of <= ``memory.forward_tokens`` tokens: policy (old log-probs; not when
     the update is on-policy: ``Learner.on_policy_update``), reference (with a KL), critic (PPO)
  5. per-token KL to the reference -> shaped rewards -> advantages / returns by the chosen estimator; mismatch
     metrics and the off-policy correction (``algo.off_policy``) from the sampling and the old log-probs; the loss
     mask composed once from the keep-factors the steps set (``experience.py``)
  6. PPO epochs over mini-batches: the `algo.policy_loss` (x off-policy weights) + KL in loss - entropy; value loss
  7. metrics (TRL names; the time of each phase, ``time/<phase>``, and the throughput), sample table, health
     checks, KL-controller update, checkpoint
"""
from __future__ import annotations

import time

from ...config import OnlineConfig
from ...config.geometry import launched_world_size
from ...config.startup import startup_block
from ...errors import ConfigError, say
from ...models.tokenizer import tokenizer_difference
from ..lifecycle.checkpoint import rng_state, set_rng_state
from ..lifecycle.run import Run, run_recipe
from ..lifecycle.stop import Abandoned
from ..shared.batches import load_records
from .online_run import OnlineRun


class OnlineTrainer(OnlineRun):
    """A producer and a learner in this process, one after the other (the synchronous mode)."""

    # ── the loop ─────────────────────────────────────────────────────────────────────────────────────────────
    def train(self) -> dict:
        run, acc, learner = self.run, self.acc, self.learner
        ups = learner.updates_per_step
        state = learner.set_up(self.total_steps * ups)
        self.producer.offloaded = tuple(learner.trained.optimizers.values())  # memory.offload_optimizer (memory.py)
        step = 0 if state is None else state["step_rollout"]
        last: dict = {}
        run.tokenizer = learner.tok
        run.tell("on_train_begin", step * ups, {"max_steps": self.total_steps * ups})
        with self.begin(step):
            saved = step  # the rollout step the newest checkpoint holds

            def stop_if_asked(rng: dict | None = None, last: bool = False) -> None:  # every process at one point
                if run.stop.should_stop(acc, last):  # (train/lifecycle/stop.py)
                    if rng is not None:  # the step was abandoned: the RNG as it found it
                        set_rng_state(rng)
                    run.stop.stop(acc, step * ups, None if saved == step else lambda: self.save(step))

            if self.total_steps == 0:  # train.max_steps=0: the model as it is, evaluated (the API's evaluate())
                with learner.timer.phase("eval"):
                    last = self.evaluate()
                run.log(last, 0)
            run.stop.arm(True)
            while step < self.total_steps:
                t_step = time.perf_counter()
                # 1-3. prompts -> responses -> raw scores, on this process alone (but a sharded policy's gather): a
                #      failure or a stop signal (the rollout abandoned) stops every process at the check (stop.py)
                rng = rng_state()
                try:
                    exp = self.producer.produce(learner.policy, step)
                except Abandoned:
                    pass
                except Exception as err:  # noqa: BLE001 - re-raised by stop() on this process, after the save
                    run.stop.fail(err)
                stop_if_asked(rng)
                exp.scores = learner.shape_scores(exp.raw_scores, exp.rollout.ended, exp.rollout.lengths, exp.valid)
                metrics = learner.learn(exp, step)  # 4-6. forwards, advantages, PPO epochs
                step += 1
                last = self.end_step(exp, step, metrics, time.perf_counter() - t_step)  # 7.
                due = self.every and step % self.every == 0
                if (due or run.asked("save")) and step != self.total_steps:  # a callback's should_save too
                    saved = step if self.save(step) is not False else saved
                stop_if_asked(last=step == self.total_steps)  # a stop asked during the update: before the rollout
            run.stop.arm(False)
        self.finish(step)
        run.tell("on_train_end", step * ups, learner.policy)
        return last

def run_online(cfg: OnlineConfig) -> dict:
    """PPO / GRPO / RLOO / REINFORCE++ / distillation from ``cfg``; returns the last step's metrics. With
    ``algo.async.max_staleness`` > 0 the producers and the learners run on separate processes (asynchronous.py)."""
    if cfg.algo.async_.max_staleness > 0:
        from .asynchronous import run_async

        return run_async(cfg, _before_run)
    return run_recipe(cfg, _train_online, prepare=_before_run)


def _before_run(cfg: OnlineConfig) -> tuple[list, list]:
    """Before the run directory is looked at or weights load: the prompts, then the teacher's tokenizer (read: a
    teacher of another tokenizer is distilled across tokenizers, but not in multi-turn episodes; exit 2)."""
    records = load_records(cfg, "prompt")
    say(startup_block(cfg, launched_world_size(), len(records[0])))  # the defaults, the step, what differs from TRL
    if cfg.teacher.model:
        differs = tokenizer_difference(cfg.model.name, cfg.teacher.model, student_gguf=cfg.model.gguf_file)
        if differs and cfg.env.name:
            raise ConfigError(f"the teacher's tokenizer differs from the student's ({differs}); cross-tokenizer "
                              "distillation aligns one response, not episodes with environment turns (not built)",
                              where="teacher.model", fix="use a teacher with the student's tokenizer, or no env.name")
    return records


def _train_online(cfg: OnlineConfig, run: Run, records: tuple[list, list]) -> dict:
    trainer = OnlineTrainer(cfg, run, records)
    try:  # an early end (track.stop_on_critical, a failure, a signal) closes the files and writes the report in
        metrics = trainer.train()  # Session.close
    finally:
        trainer.close()
    run.print(f"[{cfg.recipe}] done: policy saved to {run.run_dir}")
    return metrics
