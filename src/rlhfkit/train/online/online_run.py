"""What both modes of the online loop share (:class:`OnlineRun`): this process's producer and learner, built in
the order that answers a mistake before any weights load, and the end of a step (step 7 of ``online.py``: the
step's metrics over every process, the KL controller, evaluation on held-out prompts, the log line, the progress,
the health rules and the samples table), the checkpoints and the end of the run. The loops themselves are
:meth:`~rlhfkit.train.online.synchronous.OnlineTrainer.train` (synchronous: producer then learner in each process) and
``asynchronous.AsyncTrainer.train`` (producers and learners on separate processes)."""

from __future__ import annotations

import math
import time

from ...config import OnlineConfig
from ...config.geometry import step_geometry
from ...data.formats import message_text
from ...models.loading import save_model
from ...track import PhaseTimer, Progress
from ...track.progress import earlier_pace
from ..lifecycle.optim import lr_used
from ..lifecycle.run import Run
from ..shared.batches import kl_per_token, load_records, reduce_metrics
from .experience import Experience
from .learner import Learner
from .producer import Producer
from .step_metrics import rollout_metrics

SHOW = ("objective/scores", "objective/kl_per_token", "objective/kl", "val/ratio", "response/length_mean",
        "time/step", "time/rollout", "time/update", "throughput/tokens_per_s")


class OnlineRun:
    """A producer and a learner, and what both modes of the online loop do around their steps; the loop itself
    (``train()``) is the mode's: :class:`~rlhfkit.train.online.synchronous.OnlineTrainer` (synchronous),
    ``asynchronous.AsyncTrainer``."""

    def __init__(self, cfg: OnlineConfig, run: Run, records: tuple[list, list] | None = None):
        self.cfg, self.run, self.acc = cfg, run, run.accelerator
        self.producer = self.learner = None
        timer = PhaseTimer(run.device)  # one for both: evaluation's rollouts count in time/eval
        try:
            records = records if records is not None else load_records(cfg, "prompt")
            self.producer = self.make_producer(records, timer)
            self.started()
            self.learner = Learner(cfg, run, timer)
            if self.producer is not None:
                self.producer.load(self.learner.tok, self.learner.policy, run)
        except BaseException:
            self.close()
            raise
        self.samples_per_step = cfg.algo.rollout_batch_size * cfg.algo.num_generations  # per process
        self.learner.plan(self.samples_per_step)
        # the run's length in rollout steps (train.max_steps updates, algo.total_episodes samples or train.epochs)
        self.total_steps = step_geometry(cfg, run.world_size, len(records[0])).steps

    def make_producer(self, records: tuple[list, list], timer: PhaseTimer) -> Producer | None:
        """This process's producer (its reward functions started and probed, before any weights load). A sharded
        policy's gather opens each dynamic-sampling draw, whose number differs between processes: a stop signal
        may then abandon a rollout only with one process."""
        run = self.run
        abandon = run.world_size == 1 or not self.cfg.algo.dynamic_sampling.enabled
        return Producer(self.cfg, records, device=run.device, share=self.acc.process_index, shares=run.world_size,
                        say=run.print, stop=run.stop, abandon=abandon, timer=timer)

    def started(self) -> None:
        """Called once the producer is built, before any weights load (the asynchronous mode reports it)."""

    def close(self) -> None:
        """Stop the reward and environment workers (the end of a run, or a failure on the way)."""
        if self.producer is not None:
            self.producer.close()

    # ── the parts of the loop both modes share ───────────────────────────────────────────────────────────────
    def begin(self, step: int) -> Progress:
        """After the learner's set-up: the samples table, the health monitor, the checkpoint period and the progress
        display (returned, to be entered), which the producer and the learner report their phases to."""
        cfg, run = self.cfg, self.run
        ups = self.learner.updates_per_step
        self.samples = run.session.open_samples()
        self.health = run.session.open_health(batch_size=self.samples_per_step, repeat_every=10 * ups,
                                              max_response_len=self.learner.max_response_len,
                                              vocab_size=len(self.learner.tok))
        self.every = max(1, math.ceil(cfg.train.save_every / ups)) if cfg.train.save_every > 0 else 0
        self.t_start = time.time()
        earlier = earlier_pace(run.run_dir, ups) if step > 0 and run.is_main else None  # a resume: its ETA at once
        progress = Progress(self.total_steps, desc=cfg.recipe, unit="rollout", show=SHOW,
                            is_main=run.is_main and cfg.track.progress, initial=step, earlier=earlier)
        self.learner.phases = progress
        if self.producer is not None:
            self.producer.phases = progress
        self.progress = progress
        return progress

    def save(self, step: int, local: dict | None = None):
        """A checkpoint of rollout step ``step`` (update step x updates_per_step); ``local``: this process's own
        part (the asynchronous mode's queue). False when the session wrote none (no update applied yet)."""
        return self.learner.trained.save(step * self.learner.updates_per_step,
                                  state={"step_rollout": step, **self.learner.state_dict()}, local=local)

    def end_step(self, exp: Experience, step: int, metrics: dict, seconds: float, extra: dict | None = None) -> dict:
        """Step 7 after update ``step``: the step's metrics over every process (and ``extra``), the KL controller,
        evaluation when due, the log line, the progress, health (main process) and the samples table."""
        cfg, run, acc, learner = self.cfg, self.run, self.acc, self.learner
        update = step * learner.updates_per_step
        metrics.update(self.step_metrics(exp, step))
        metrics.update(self.step_times(exp, seconds))
        metrics.update(extra or {})
        metrics = kl_per_token(reduce_metrics(acc, metrics))  # one value per key on every process (KL controller too)
        learner.tokens_seen += metrics.pop("tokens/step", 0.0)  # prompt + response tokens so far (TRL's num_tokens)
        run.session.steps_seen += 1  # a run whose every step dropped every sample ends as a fault (Session)
        every = self.samples_per_step * run.world_size
        run.session.steps_without_reward += metrics.get("rewards/dropped", 0.0) >= every
        metrics["tokens/seen"] = learner.tokens_seen
        if "objective/kl" in metrics:  # none without a reference (no KL term): nothing for the controller
            learner.kl_ctl.update(metrics["objective/kl"], self.samples_per_step * run.world_size)
        if step == self.total_steps or run.asked("evaluate") or (cfg.train.eval_every > 0
                                                                  and step % cfg.train.eval_every == 0):
            with learner.timer.phase("eval"):
                metrics.update(self.evaluate())
            metrics.update(reduce_metrics(acc, learner.timer.take()))
        run.log(metrics, update)
        self.progress.update(1, {k: v for k, v in metrics.items() if k in SHOW})
        if run.is_main:  # steps of metrics.jsonl; a critical stop reaches every rank at the check below
            run.stop.local(acc, self.health.report, metrics, update, texts=exp.texts)
        if cfg.track.sample_every > 0 and (step % cfg.track.sample_every == 0 or step == 1):
            self.samples.log(update, [message_text(r["prompt"][-1]["content"]) for r in exp.rows], exp.texts,
                             exp.raw_scores.tolist(), extra=exp.reward_extra)  # TRL's log_extra columns
        return metrics

    def finish(self, step: int) -> None:
        """The final policy (gathered by the strategy: one HF directory), the finished marker, the report."""
        learner = self.learner
        self.run.session.finish(learner.policy, lambda m, d: save_model(m, learner.tok, d),
                                step * learner.updates_per_step)

    def step_times(self, exp: Experience, seconds: float) -> dict:
        """This process's ``time/<phase>``, ``time/step`` (steps 1-7 without evaluation), ``throughput/tokens_per_s``
        (the model's own tokens) and ``throughput/episodes_per_s`` (the engine's compile time: step_metrics)."""
        out = self.learner.timer.take()
        out["time/step"] = seconds
        out["throughput/tokens_per_s"] = float(exp.action.sum()) / max(seconds, 1e-9)
        out["throughput/episodes_per_s"] = len(exp.rollout) / max(seconds, 1e-9)
        return out

    def step_metrics(self, exp: Experience, step: int) -> dict:
        """The step's reward metrics, its rollout metrics over every process's samples (one gather), LR, episodes."""
        learner, per_step = self.learner, self.samples_per_step * self.run.world_size
        return {
            **exp.reward_metrics,
            **rollout_metrics(self.acc, exp, kl_coef=learner.kl_ctl.value, kl_in_reward=learner.kl_in_reward,
                              group_size=learner.k, group_based=learner.estimator.group_based,
                              clip=self.cfg.reward.clip),
            **self.engine_stats(),  # time/rollout_compile when it compiled
            "lr": lr_used(learner.sched), "episode": step * per_step,
            "epoch": step / max(self.producer.per_epoch, 1) if self.producer is not None else 0.0,
            "eps": step * per_step / max(time.time() - self.t_start, 1e-6)}

    def engine_stats(self) -> dict:
        return {k: v for k, v in self.producer.engine.take_stats().items() if v}

    # ── evaluation on held-out prompts ───────────────────────────────────────────────────────────────────────
    def evaluate(self) -> dict:
        """Held-out prompts sharded over the processes (the same number of rollout phases on each), the sums gathered
        once; with a teacher every process evaluates them all (its forwards are collectives under fsdp2)."""
        producer, learner = self.producer, self.learner
        if producer is None or not producer.eval_prompts:
            return {}
        n, world = len(producer.eval_prompts), 1 if learner.teacher is not None else self.run.world_size
        per = math.ceil(n / world)
        first = self.acc.process_index * per if world > 1 else 0
        total = producer.evaluate_share(learner.policy, first, per, forwards=learner.eval_metrics)
        if world > 1:
            from accelerate.utils import gather_object

            every = gather_object([total])
            total = {key: sum(t.get(key, 0.0) for t in every) for key in every[0]}
        scores, scored = total.pop("scores"), total.pop("scored")
        out = {f"eval/{key}": value / n for key, value in total.items()}
        if scored:
            out["eval/scores"] = scores / scored
        return out
