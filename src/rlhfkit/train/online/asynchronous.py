"""Rollouts and updates side by side: producers and learners on separate processes (``algo.async.max_staleness=K``,
K >= 1), under ``torchrun`` (one node or several).

**Layout.** Of the ``torchrun`` world's N ranks the first N - P learn and the last P (``algo.async.producers``)
produce. The learners are an ordinary run among themselves (their own default process group, made here before
accelerate starts, so DDP / FSDP2, the metrics' gathers, the stop checks and the checkpoints work as in the
synchronous mode with N - P processes); each producer is a process of its own (no accelerator, no run directory).
A step's prompts are the N - P learners' shares, exactly as in a synchronous run with N - P processes; each share is
made by one producer, or cut into pieces made by several when there are more producers than learners.

**Between them** (``Bridge``, standalone process groups on the launcher's store, next to the learners' group):
pieces of experience go from producers to learners by point-to-point messages (gloo, on the CPU: a few MB of
token ids and scores), each tagged with its step and the *version* of the weights that made it (the number of
updates the learners had made); weights go from learner 0 to every producer by broadcast (NCCL on GPUs, gloo on
CPU) after each update: the trainable tensors only, so a LoRA run sends its adapter. Every message follows one fixed
schedule, so nothing waits on timing and nothing deadlocks:

- a producer holding version v makes every step j with j - K <= v, sends it, then waits for version v + 1;
- a learner updates on step s, receives the pieces of step s + K, checks whether to stop (one all-reduce among
  the learners: a signal, a failure, a producer's), then broadcasts version s + 1 (or "stop") to the producers.

So step j is always made from version max(j - K, start): staleness is at most K, exactly K in the steady state, and
the same in every run (a resumed run makes what the uninterrupted one made). While a learner updates on step s the
producers make step s + K: both sides work at once. With a KL the reference's log-probs are taken by the less busy
side (``algo.async.reference``: after each rollout by the producers, or by the learners; ``train/online/reference.py``),
and the old log-probs come from the update itself when there is one update per rollout (``Learner.plan``). The
samples are corrected as any off-policy samples are (``algo.off_policy.correction=auto`` is ``tis`` here);
``async/staleness_mean`` / ``_max`` say how stale each batch was and the ``rollout/`` mismatch metrics how far the
producers' log-probs were from the learner's.

**Stops and resume.** A producer that fails or is signalled abandons its rollout and sends, for each piece it still
owes before the next broadcast, a status instead (``failed`` with its error's one line, or ``signal``); the learners
note it and stop at their check, write the checkpoint of the step reached (with each learner's queue of received
steps, ``local_<rank>.pt``) and broadcast "stop"; the producer then exits with its own error. A learner that fails
raises the store's abort flag, so the producers abandon what they make, receives what they still owe, broadcasts
"stop" and re-raises. The queue saved holds the steps every learner received whole; a resumed run starts its
producers after them, so no prompt is repeated or skipped. A producer that hangs is caught by the collective timeout
(``distributed.timeout_s``). Before any weights load, every rank reports how its set-up went (the reward functions
probed and linted) through the store, so a mistake stops every process with one line.
"""

from __future__ import annotations

import os
import time
from collections import deque
from types import SimpleNamespace

import torch
import torch.distributed as dist

from ...errors import RunError, Stopped
from ..lifecycle.distributed import die_with_launcher
from ..lifecycle.run import Run, check_lora, run_recipe
from ..lifecycle.stop import Abandoned, StopControl, error_code, exit_code, one_line
from .bridge import (
    DONE,
    DTYPES,
    GO,
    STOP,
    Bridge,
    Layout,
    experience_of,
    experience_state,
    layout_of,
    names_crc,
    trainable,
)
from .experience import merge_groups
from .learner import load_policy
from .online_run import OnlineRun
from .producer import Producer
from .reference import ProducerReference, on_producer

# ─────────────────────────────────────────────────── entry ──────────────────────────────────────────────────


def run_async(cfg, prepare) -> dict:
    """This process's part of an asynchronous run (see the module doc)."""
    cfg.check_inputs()
    check_lora(cfg)
    layout = layout_of(cfg)
    records = prepare(cfg)
    if layout.is_learner:  # the learners' own world, before accelerate starts
        os.environ["WORLD_SIZE"] = str(layout.learners)
    bridge = Bridge(layout, cfg.distributed.timeout_s)
    if layout.is_learner and layout.learners > 1:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, store=dist.PrefixStore("rlhfkit/learners", bridge.store), rank=layout.rank,
                                world_size=layout.learners, timeout=bridge.timeout)
    elif layout.is_learner:
        os.environ.pop("LOCAL_RANK", None)  # one learner: no process group, accelerate's single-process path
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", layout.rank % max(1, torch.cuda.device_count()))))
    try:
        if layout.is_learner:
            return _learner(cfg, records, layout, bridge)
        return Producing(cfg, records, layout, bridge).run()
    finally:
        bridge.close()


# ────────────────────────────────────────────────── producer ─────────────────────────────────────────────────


class Producing:
    """A producer process: makes its pieces of each step from the version of the weights the schedule allows."""

    def __init__(self, cfg, records, layout: Layout, bridge: Bridge):
        self.cfg, self.layout, self.bridge = cfg, layout, bridge
        self.k, self.K = cfg.algo.num_generations, cfg.algo.async_.max_staleness
        self.stop = StopControl()
        self.error: BaseException | None = None
        # the first producer tells the reward lint when no learner does (a learner evaluating held-out prompts
        # probes the same functions); the others are quiet
        first = layout.rank == layout.learners
        self.say = print if first and not records[1] else (lambda *a: None)
        self.records = records

    def abandon_point(self) -> None:  # the producer's stop hook inside a rollout (Producer.stop)
        if self.stop.signal is not None or self.bridge.aborted():
            raise Abandoned(self.stop.signal or "abort")

    def run(self) -> dict:
        cfg, layout, bridge = self.cfg, self.layout, self.bridge
        die_with_launcher()  # a killed torchrun takes its producers with it, as its learners
        self.stop.install()
        producer = None
        try:
            try:
                producer = Producer(cfg, self.records, device=bridge.device, shares=layout.learners,
                                    pieces=layout.pieces, say=self.say, stop=self, abandon=True)
                error = None
            except Exception as err:  # noqa: BLE001 - told to every rank by report(), then raised here
                error = err
            if bridge.report(error) == "done":  # the run had finished already
                return {}
            policy, tok = load_policy(cfg, bridge.device)
            policy.eval()
            producer.load(tok, policy, SimpleNamespace(print=lambda *a: None, sink=None))
            reference = ProducerReference(cfg, policy, tok, bridge.device) if on_producer(cfg) else None
            names, params = trainable(policy)
            version, code, _, queued = bridge.header()
            if code != GO:
                return self.end(code, version)
            dtypes = self.check_start(names, params)
            bridge.tensors(params, dtypes, send=False)
            self.stop.arm(True)
            step = version + queued  # the first step not in the learners' queues
            while True:
                while step < producer.max_steps and step - self.K <= version:  # the learners' total_steps
                    self.make(producer, policy, step, version, reference)
                    step += 1
                version, code, _, _ = bridge.header()
                if code != GO:
                    return self.end(code, version)
                bridge.tensors(params, dtypes, send=False)
        finally:
            self.stop.uninstall(keep_ignoring=True)
            if producer is not None:
                producer.close()

    def check_start(self, names: list[str], params: list[torch.Tensor]) -> list[torch.dtype]:
        """The learners' trainable tensors are this policy's (same names, same count), and their dtypes."""
        crc, n = self.bridge.header()[:2]
        codes = torch.zeros(len(params), dtype=torch.int64, device=self.bridge.device)
        self.bridge.weights.broadcast([codes], dist.BroadcastOptions()).wait()
        if crc != names_crc(names) or n != len(params):
            raise RunError(f"the producer's policy has other trainable tensors than the learners' ({len(params)} vs "
                           f"{n})", where="model", fix="load the same model and LoRA settings on every process")
        return [DTYPES[c] for c in codes.tolist()]

    def make(self, producer: Producer, policy, step: int, version: int,
             reference: ProducerReference | None = None) -> None:
        """This producer's pieces of ``step``, each sent to its learner (a status instead once it stopped), with
        their reference log-probs when ``reference`` (``algo.async.reference``)."""
        for share, piece in self.layout.made_by(self.layout.rank):
            message = {"step": step, "version": version, "status": "ok"}
            if self.error is None and self.stop.signal is None and not self.bridge.aborted():
                try:
                    with torch.no_grad():
                        exp = producer.produce(policy, step, share=share, piece=piece)
                        if reference is not None:
                            with producer.timer.phase("reference"):
                                reference.annotate(exp)
                    message.update(exp=experience_state(exp), times=producer.take_times())
                except Abandoned:
                    pass
                except Exception as err:  # noqa: BLE001 - told to the learners, raised at the end
                    self.error = err
                    self.bridge.abort()
            if "exp" not in message:  # failed, signalled, or another process raised the abort flag
                status = "failed" if self.error is not None else "signal" if self.stop.signal else "abort"
                message.update(status=status, line=one_line(self.error) if self.error is not None else
                               self.stop.signal or "", code=error_code(self.error) if self.error is not None else 0)
            self.bridge.send(message, share)

    def end(self, code: int, version: int) -> dict:
        if self.error is not None:
            raise self.error
        if code == DONE:
            return {}
        name = self.stop.signal
        raise Stopped(f"producer stopped with the learners at step {version}", exit_code(name) if name else 1)


# ─────────────────────────────────────────────────── learner ─────────────────────────────────────────────────


class AsyncTrainer(OnlineRun):
    """A learner process: the synchronous trainer's learner and step end, fed by the producers (see the module doc).
    Its own producer only evaluates (held-out prompts)."""

    def __init__(self, cfg, run: Run, records, layout: Layout, bridge: Bridge):
        self.layout, self.bridge, self.K = layout, bridge, cfg.algo.async_.max_staleness
        self.queue: deque = deque()  # (step, version, Experience, the producers' times): steps received whole
        self.received = 0  # the next step whose pieces are received
        self.broken = False  # a step came incomplete (a producer stopped): no later step enters the queue
        self.version = 0  # the last version broadcast to the producers
        self.wait_s = self.sync_s = 0.0
        super().__init__(cfg, run, records)

    def make_producer(self, records, timer):
        if not records[1]:  # no held-out prompts: nothing to evaluate
            return None
        return Producer(self.cfg, records, device=self.run.device, share=self.acc.process_index,
                        shares=self.run.world_size, say=self.run.print, stop=None, timer=timer)

    def started(self) -> None:
        self.bridge.report(None)

    def engine_stats(self) -> dict:
        return {}  # the training rollouts' compile time comes with their pieces (their queue entry)

    # ── the loop ─────────────────────────────────────────────────────────────────────────────────────────────
    def train(self) -> dict:
        run, acc, learner, K = self.run, self.acc, self.learner, self.K
        ups = learner.updates_per_step
        state = learner.set_up(self.total_steps * ups)
        step = 0 if state is None else state["step_rollout"]
        self.restore(state, step)
        last: dict = {}
        self.broadcast(step, GO, queued=len(self.queue), start=True)
        with self.begin(step):
            saved = step
            run.stop.arm(True)
            try:
                self.receive(step)  # the first step's pieces (a resumed run: already in its queue)
                t_step = time.perf_counter()
                while step < self.total_steps:
                    # 1-3 were made by the producers: the oldest step received, if no stop is pending
                    go = run.stop.check(acc) == 0  # every learner, every cycle (an all-reduce)
                    if go and self.queue and self.queue[0][0] == step:
                        _, version, exp, times = self.queue.popleft()
                        exp.scores = learner.shape_scores(exp.raw_scores, exp.rollout.ended, exp.rollout.lengths,
                                                          exp.valid)
                        metrics = learner.learn(exp, step)  # 4-6. forwards, advantages, PPO epochs
                        step += 1
                        extra = {**times, "async/staleness_mean": float(step - 1 - version),
                                 "async/staleness_max": float(step - 1 - version), "async/wait_s": self.wait_s,
                                 "async/weights_s": self.sync_s}
                        self.wait_s = self.sync_s = 0.0
                        now = time.perf_counter()
                        last = self.end_step(exp, step, metrics, now - t_step, extra)  # 7.
                        t_step = now
                    # what the producers make from the version they hold, then the check and the next version
                    self.receive(min(self.version + K, self.total_steps - 1))
                    if run.stop.should_stop(acc, last=step == self.total_steps):
                        queued = self.common_queue()
                        self.broadcast(step, STOP, exit_code=self.stop_code())
                        run.stop.stop(acc, step * ups, None if saved == step else
                                      lambda s=step, q=queued: self.save(s, self.local(q)))
                    self.broadcast(step, DONE if step == self.total_steps else GO)
                    if self.every and step % self.every == 0 and step != self.total_steps:
                        saved = step if self.save(step, self.local(len(self.queue))) is not False else saved
            except BaseException as err:
                self.abort(err)
                raise
            run.stop.arm(False)
        self.finish(step)
        return last

    # ── the producers' side of the schedule ──────────────────────────────────────────────────────────────────
    def receive(self, upto: int) -> None:
        """Every piece of every step up to ``upto`` (in order, from the producers that make them); a step received
        whole joins the queue, unless an earlier one came incomplete. A status (a producer failed or was signalled)
        is noted on the run's stop control: the learners stop at the next check."""
        layout, share = self.layout, self.acc.process_index
        while self.received <= upto:
            step, parts, versions, times = self.received, [], [], {}
            for piece in range(layout.pieces):
                rank = layout.producer_rank(share, piece)
                t0 = time.perf_counter()
                message = self.bridge.recv(rank)
                self.wait_s += time.perf_counter() - t0
                if message["status"] != "ok":  # "abort": the process that raised the flag says why itself
                    if message["status"] == "failed":
                        self.run.stop.note_failure(rank, message["line"], message["code"])
                    elif message["status"] == "signal":
                        self.run.stop.note_signal(message["line"])
                    continue
                parts.append(experience_of(message["exp"], self.run.device))
                versions.append(message["version"])
                for key, value in message["times"].items():  # the slowest producer's, as for processes
                    times[key] = max(times.get(key, 0.0), value)
            if len(parts) == layout.pieces and not self.broken:
                exp = parts[0] if len(parts) == 1 else merge_groups(
                    parts, [(i, g) for i, part in enumerate(parts) for g in range(len(part.rollout) // self.learner.k)],
                    self.learner.k, self.learner.tok.pad_token_id, self.run.device)
                self.queue.append((step, min(versions), exp, times))
            else:
                self.broken = True
            self.received += 1

    def broadcast(self, step: int, code: int, *, queued: int = 0, start: bool = False, exit_code: int = 0) -> None:
        """Learner 0 tells the producers version ``step`` and whether to go on (GO: then the weights follow; every
        learner enters the strategy's gather, a collective when sharded)."""
        bridge, policy = self.bridge, self.learner.policy
        t0 = time.perf_counter()
        if self.acc.is_main_process:
            bridge.header([step, code, exit_code, queued])
        self.version, bridge.phase = step, "running" if code == GO else "ended"
        if code != GO:
            return
        with self.learner.strategy.gathered(policy):
            names, params = trainable(self.acc.unwrap_model(policy))
            if self.acc.is_main_process:
                dtypes = [p.dtype for p in params]
                if start:
                    bridge.header([names_crc(names), len(params), 0, 0])
                    codes = torch.tensor([DTYPES.index(d) for d in dtypes], dtype=torch.int64, device=bridge.device)
                    bridge.weights.broadcast([codes], dist.BroadcastOptions()).wait()
                bridge.tensors(params, dtypes, send=True)
        self.sync_s += time.perf_counter() - t0

    def abort(self, err: BaseException) -> None:
        """A learner failed (or was stopped at once) inside the schedule: the producers abandon what they make,
        everything they still owe is received, and they are told to stop (best effort: the bridge may be down)."""
        if getattr(self.bridge, "phase", "ended") != "running":
            return
        try:
            self.bridge.abort()
            self.receive(min(self.version + self.K, self.total_steps - 1))
            code = err.exit_code if isinstance(err, Stopped) else error_code(err)
            self.broadcast(self.version, STOP, exit_code=code)
        except Exception:  # noqa: BLE001 - the learner's own error is what the user needs; the bridge's is noise
            self.bridge.phase = "ended"

    def stop_code(self) -> int:
        """The exit code the producers stop with: this learner's failure's, a producer's, or the signal's."""
        stop = self.run.stop
        if stop.error is not None:
            return error_code(stop.error)
        if stop.remote is not None:
            return stop.remote[2]
        return exit_code(stop.signal) if stop.signal else 1

    # ── the queue in checkpoints ─────────────────────────────────────────────────────────────────────────────
    def common_queue(self) -> int:
        """The steps every learner holds whole (a stop may cut the learners' queues at different steps)."""
        n = torch.tensor([len(self.queue)], device=self.run.device)
        return int(self.acc.reduce(n, "min").item()) if self.acc.num_processes > 1 else int(n.item())

    def local(self, queued: int) -> dict:
        """This learner's part of a checkpoint: the layout and the first ``queued`` steps of its queue."""
        return {"learners": self.layout.learners, "producers": self.layout.producers,
                "queue": [{"step": s, "version": v, "exp": experience_state(e), "times": t}
                          for s, v, e, t in list(self.queue)[:queued]]}

    def restore(self, state: dict | None, step: int) -> None:
        """The queue of the checkpoint resumed (its steps are not made again), on the same layout only."""
        local = (state or {}).get("local")
        self.received = step
        if local is None:
            return
        if (local["learners"], local["producers"]) != (self.layout.learners, self.layout.producers):
            raise RunError(f"the checkpoint was written by {local['learners']} learners and {local['producers']} "
                           f"producers; this run has {self.layout.learners} and {self.layout.producers}",
                           where="algo.async.producers", fix="resume with the same number of processes and "
                                                             "producers, or set train.resume=never")
        for item in local["queue"]:
            self.queue.append((item["step"], item["version"], experience_of(item["exp"], self.run.device),
                               item["times"]))
        self.received = step + len(self.queue)


def _learner(cfg, records, layout: Layout, bridge: Bridge) -> dict:
    """A learner process: the run (lock, session, resume) as in the synchronous mode, with the producers told of
    every way it ends before its loop (a failed set-up, a run already finished, a failure while loading)."""

    def train(cfg, run: Run, records) -> dict:
        trainer = AsyncTrainer(cfg, run, records, layout, bridge)
        try:
            metrics = trainer.train()
        finally:
            trainer.close()
        run.print(f"[{cfg.recipe}] done: policy saved to {run.run_dir}")
        return metrics

    try:
        out = run_recipe(cfg, train, prepare=lambda c: records)
    except BaseException as err:
        if bridge.phase == "setup":
            bridge.report(err)  # raises it, after telling every rank
        if bridge.phase == "started" and layout.rank == 0:
            code = err.exit_code if isinstance(err, Stopped) else error_code(err)
            bridge.header([0, STOP, code, 0])
        raise
    if bridge.phase == "setup":  # the run had finished already: nothing to make
        bridge.report(None, done=True)
    return out
