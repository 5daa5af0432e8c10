"""The producer of the online step: prompts -> an :class:`~.experience.Experience` with raw scores (steps 1-3 of
``online.py``).

It holds what makes data: the prompts and their order, the rollout engine (or the environment's episodes), the
reward functions in their worker processes, the reward model. It never updates a model: it generates from the
policy it is handed (the learner's own in the synchronous mode; a copy kept current by weight broadcasts in the
asynchronous one, ``asynchronous.py``). What it makes for a step depends only on the step and those weights: the
prompt batch is a function of the step (:func:`~rlhfkit.train.shared.batches.plan_batches`), the sampling seed too
(:meth:`Producer.seed_of`). That is what lets the asynchronous mode checkpoint its queue and resume without repeating
or skipping a prompt.

Scores leave it *penalised* (missing EOS, DAPO's overlong penalty: :func:`penalised_scores`, no state) but not
normalised: the running normalisation has state and a gather over the learners, so it is the learner's
(``Learner.shape_scores``). Evaluation's rollouts and scores are made here too (:meth:`Producer.evaluate_share`).
"""

from __future__ import annotations

import torch

from ... import algos
from ...config.geometry import step_geometry
from ...data import PromptCollator
from ...data.chat import plain_view, stop_token_ids
from ...data.formats import message_text
from ...data.sources import is_conversational
from ...errors import ConfigError, EnvError
from ...models.loading import load_scalar_model, load_tokenizer_for
from ...rewards import RewardModelScorer
from ...rewards.functions import rewards_from_config
from ...rewards.lint import clip_of, probe_rewards
from ...rollout import SamplingParams, build_engine, decode_responses
from ...track import NO_PHASES, Phases, PhaseTimer
from ..lifecycle.distributed import get_strategy
from ..lifecycle.memory import rollout_phase
from ..shared.batches import length_policy, model_named, plan_batches, tokenize
from ..shared.forward import on_device
from .experience import Experience, merge_groups


def penalised_scores(cfg, raw: torch.Tensor, ended: torch.Tensor, lengths: torch.Tensor | None = None,
                     valid: torch.Tensor | None = None) -> torch.Tensor:
    """Raw scores with the missing-EOS penalty and DAPO's soft overlong penalty (no running state).

    With ``reward.missing_eos_scope=varied`` the penalty applies only in groups (``algo.num_generations`` answers of
    a prompt, completion-major) whose raw scores differ among their ``valid`` members: in a group of equal scores
    (all wrong, say) the penalty would be the group's only signal, and the group's std scaling gives it the full
    advantage a right answer gets elsewhere (docs/learning.md)."""
    rc, ov = cfg.reward, cfg.algo.overlong
    scores = raw.clone()
    if rc.missing_eos_penalty:
        unended = (~ended).float()
        if rc.missing_eos_scope == "varied":
            unended = unended * (~algos.group_all_tied(raw, cfg.algo.num_generations, valid=valid)).float()
        scores = scores - rc.missing_eos_penalty * unended
    if ov.cache_len and lengths is not None:
        scores = scores + algos.overlong_penalty(lengths, cfg.generation.max_new_tokens, ov.cache_len,
                                                 ov.penalty).to(scores.device)
    return scores


def too_few_prompts(n: int, batch: int, world: int) -> ConfigError:
    return ConfigError(f"{n} prompts do not fill one rollout batch of {batch} x {world} processes",
                       where="algo.rollout_batch_size", fix="lower algo.rollout_batch_size or give more prompts")


class Producer:
    """Steps 1-3 of an online step for one share of the prompts (``share`` of ``shares``: a process's own share in
    the synchronous mode, a learner's in the asynchronous one, where a share may be made in ``pieces`` parts by as
    many producers). ``stop.abandon_point()`` is called between micro-batches of a training rollout when
    ``abandon`` (a stop asked: the rollout is dropped). Built in two parts: the constructor starts the reward
    functions and probes them on a few prompts (before any weights load: a mistake there costs nothing), then
    :meth:`load` the reward model, the environments, the engine and the tokenised prompts."""

    def __init__(self, cfg, records: tuple[list, list], *, device, share: int = 0, shares: int = 1, pieces: int = 1,
                 say=print, stop=None, abandon: bool = True, timer: PhaseTimer | None = None):
        self.cfg, self.device, self.share, self.shares, self.pieces = cfg, device, share, shares, pieces
        self.say, self.stop, self.abandon = say, stop, abandon
        self.timer = timer or PhaseTimer(device)
        self.phases: Phases = NO_PHASES  # where the producer reports its phase (the progress display)
        self.k = cfg.algo.num_generations
        # the run's length, as TRL-style reward functions read it (trainer_state: optimizer updates, as TRL counts)
        geometry = step_geometry(cfg, shares, len(records[0]))
        self.max_steps, self.updates_per_step = geometry.steps, geometry.updates_per_step
        self.strategy = get_strategy(cfg)
        self.sampling = SamplingParams.from_config(cfg.generation)
        self.records = records
        self.functions = self.envs = self.env_cls = self.scorer = None
        self.offloaded: tuple = ()  # optimizers whose state leaves the device during a rollout (the synchronous
        # learner's, with memory.offload_optimizer: train/lifecycle/memory.py)
        if len(records[0]) < cfg.algo.rollout_batch_size * shares:
            raise too_few_prompts(len(records[0]), cfg.algo.rollout_batch_size, shares)
        # 0. reward functions (in their workers), checked on a few prompts and linted before the run directory is
        #    touched: wrong length / type, a constructor or sandbox that fails, an empty answer paid the most
        self.functions = rewards_from_config(cfg.reward, records[0])
        if self.functions is not None:
            try:
                head = records[0][:4]
                probe_rewards(self.functions, [message_text(r["prompt"][-1]["content"]) for r in head],
                              [{k: v for k, v in r.items() if k != "prompt"} for r in head], lint=cfg.reward.lint,
                              say=say, clip=clip_of(cfg.reward))
            except BaseException:
                self.close()
                raise

    def memory_phase(self):
        """The context of a rollout (train/lifecycle/memory.py): the optimizers' states in host memory before it
        (``memory.offload_optimizer``), the engine's caches freed after it (``memory.release_engine_cache``)."""
        return rollout_phase(self.cfg.memory, self.engine, *self.offloaded)

    def load(self, tok, policy, run) -> None:
        """The reward model, the environments, the engine (built once; it reads the policy's weights in place at
        each call: no copy, no weight sync) and the tokenised prompts. ``policy`` gives the EOS ids (its generation
        config); ``run``: where the prompt counts are told (``print``, ``sink``)."""
        cfg = self.cfg
        self.tok = tok
        if cfg.reward.model:
            rm_cfg = model_named(cfg.model, cfg.reward.model)
            rm_tok = load_tokenizer_for(rm_cfg)
            rm = load_scalar_model(cfg.reward.model, rm_cfg, tokenizer=rm_tok, device=self.device, trainable=False)
            rm.to("cpu" if cfg.memory.offload_reward else self.device)
            if cfg.data.plain_text == "raw" and not is_conversational(self.records[0]):
                rm_tok = plain_view(rm_tok)  # prompt + completion as text, as the prompts were tokenised
            self.scorer = RewardModelScorer(rm, rm_tok, tok, batch_size=cfg.reward.batch_size)
            if not self.scorer.same_tokenizer:
                self.say(f"[{cfg.recipe}] reward model tokenizer differs from the policy's: responses are "
                         "re-tokenised as text for scoring")
        if cfg.env.name:
            from ...envs import load_environment
            from ...envs.host import EnvCalls

            self.env_cls = load_environment(cfg.env.name)
            self.envs = EnvCalls(cfg.env.name, self.env_cls, cfg.env.kwargs, workers=cfg.env.workers,
                                 timeout_s=cfg.env.timeout_s)
        self.eos_ids = stop_token_ids(tok, getattr(policy, "generation_config", None))
        self.engine = build_engine(cfg.generation, tok, eos_token_ids=self.eos_ids)
        train_recs, eval_recs = self.records
        self.prompts = tokenize(run, train_recs, "prompt", tok, cfg, "prompts")
        self.eval_prompts = tokenize(run, eval_recs, "prompt", tok, cfg, "eval prompts")
        self.collate = PromptCollator(tok.pad_token_id)
        self.per_epoch = len(self.prompts) // (cfg.algo.rollout_batch_size * self.shares)
        if self.per_epoch == 0:
            raise too_few_prompts(len(self.prompts), cfg.algo.rollout_batch_size, self.shares)

    def take_times(self) -> dict:
        """``time/<phase>`` since the last call (rollout, reward; the engine's compile time when it compiled)."""
        return {**self.timer.take(), **{k: v for k, v in self.engine.take_stats().items() if v}}

    def close(self) -> None:
        """Stop the reward and environment workers (the end of a run, or a failure on the way)."""
        if self.functions is not None:
            self.functions.close()
        if self.envs is not None:
            self.envs.close()

    # ── 1. prompts ───────────────────────────────────────────────────────────────────────────────────────────
    def prompt_batch(self, step: int, share: int, piece: int = 0) -> dict:
        """The prompts of rollout batch ``step`` of ``share`` (its ``piece``): a function of the step, so the same in
        a resumed run."""
        epoch, pos = divmod(step, self.per_epoch)
        plan = plan_batches(len(self.prompts), self.cfg.algo.rollout_batch_size, self.shares, self.cfg.train.seed,
                            epoch, share)
        n = len(plan[pos]) // self.pieces
        return self.collate([self.prompts[i] for i in plan[pos][piece * n: (piece + 1) * n]])

    def seed_of(self, step: int, share: int, piece: int = 0) -> int:
        """The sampling seed of the rollout of ``share`` (its ``piece``) at ``step``."""
        return self.cfg.train.seed * 100_003 + step * self.shares + share + 3_000_017 * piece

    # ── 2. rollout ───────────────────────────────────────────────────────────────────────────────────────────
    def rollout(self, policy, prompts: dict, seed: int, k: int | None = None, phase: str = "rollout",
                step: int | None = None) -> Experience:
        """``k`` responses per prompt (completion-major: the prompt batch repeated k times), as a new Experience;
        with an environment, ``k`` multi-turn episodes per prompt."""
        if self.env_cls is not None:
            return self.play_episodes(policy, prompts, seed, k, step)
        k = self.k if k is None else k
        ids = [row[m.bool()].tolist() for row, m in zip(prompts["input_ids"], prompts["attention_mask"])]
        self.phases.phase(phase, total=len(ids) * k, unit="sequences")
        abandon = phase == "rollout" and self.stop is not None and self.abandon

        def rows_done(n: int) -> None:  # a stop asked (SIGTERM, ...) abandons a training rollout between micro-batches
            self.phases.advance(n)
            if abandon:
                self.stop.abandon_point()

        def tokens(t: int, max_new: int, ended: int | None) -> None:  # inside a micro-batch: the live line moves
            self.phases.detail((f"{ended} ended, " if ended else "") + f"token {t}/{max_new}")

        media = prompts.get("media")  # the prompts' images (a vision-language model)
        with self.timer.phase("rollout"), self.strategy.gathered(policy), self.memory_phase():  # gathered once
            rollout = self.engine.generate(policy, ids * k, self.sampling, seed=seed, on_rows=rows_done,
                                           media=None if media is None else media * k, on_progress=tokens)
        rows = [{k_: v[i] for k_, v in prompts.items() if isinstance(v, list)} for i in range(len(ids))] * k
        return Experience.of(rollout.to(self.device), rows)

    def play_episodes(self, policy, prompts: dict, seed: int, k: int | None = None,
                      step: int | None = None) -> Experience:
        """Multi-turn: ``k`` episodes per prompt with the environment (``env``), as a new Experience whose mask
        holds only the model's own tokens."""
        from ...envs.episodes import episode_metrics, run_episodes, turn_reward_tensor

        k = self.k if k is None else k
        n = len(prompts["input_ids"])
        rows = [{k_: v[i] for k_, v in prompts.items() if isinstance(v, list)} for i in range(n)] * k
        ec = self.cfg.env
        self.phases.phase("episodes", total=n * k)
        with self.timer.phase("rollout"), self.strategy.gathered(policy), self.memory_phase():  # gathered once
            rollout, episodes = run_episodes(
                self.engine, policy, self.tok, self.envs, rows, params=self.sampling, seed=seed,
                max_turns=ec.max_turns, max_total_tokens=ec.max_total_tokens, step=step,
                prompt_limit=length_policy(self.cfg).prompt_limit("prompt"), overflow=self.cfg.data.overflow)
        exp = Experience.of(rollout.to(self.device), rows)
        exp.env_returns = torch.tensor([e.reward for e in episodes], device=self.device)  # NaN: dropped
        exp.turn_rewards = turn_reward_tensor(episodes, rollout.response_ids.shape[1]).to(self.device)
        metrics = episode_metrics(episodes, self.envs.take_counts())  # this step's timeouts / errors
        exp.env_metrics = {f"env/{key}": value for key, value in metrics.items()}
        bad = int(metrics["nonfinite_rewards"])
        if bad and bad < len(episodes):  # some, not all (that stops the run, in score): said once
            self.envs.say_once("nonfinite", f"[env] warning: {self.envs.name}: step() returned a non-finite reward "
                                            f"(NaN / inf) in {bad} of {len(episodes)} episodes at rollout step {step}: "
                                            "those episodes are dropped, counted in env/nonfinite_rewards (said once)")
        return exp

    def produce(self, policy, step: int, share: int | None = None, piece: int = 0) -> Experience:
        """Steps 1-3 for ``share`` (default: this process's) at ``step``: prompts -> responses -> raw scores; with
        DAPO's dynamic sampling, batches drawn (<= ``max_draws``, one gather of a sharded policy) until the batch
        holds only groups whose penalised scores differ. No collective but that gather: the normaliser's comes
        after, in the learner."""
        share = self.share if share is None else share
        ds, seed = self.cfg.algo.dynamic_sampling, self.seed_of(step, share, piece)
        if not ds.enabled:
            exp = self.rollout(policy, self.prompt_batch(step, share, piece), seed, step=step + 1)
            self.score(exp, step=step + 1, allow_all_dropped=False, at=step)
            return exp

        def draw(j: int):
            prompts = self.prompt_batch(step * ds.max_draws + j, share, piece)
            e = self.rollout(policy, prompts, seed + 1_000_003 * j, step=step + 1)
            self.score(e, step=step + 1, at=step)
            return e, penalised_scores(self.cfg, e.raw_scores, e.rollout.ended, e.rollout.lengths, e.valid), e.valid

        with self.strategy.gathered(policy):  # each process draws its own number of times
            pick = algos.dynamic_sample(draw, self.cfg.algo.rollout_batch_size // self.pieces, self.k, ds.max_draws)
        exp = merge_groups(pick.results, pick.groups, self.k, self.tok.pad_token_id, self.device)
        exp.reward_metrics.update({"rollout/dynamic_draws": float(pick.draws), "rollout/degenerate_groups":
                                   float(pick.degenerate), "rollout/degenerate_groups_filled": float(pick.filled)})
        return exp

    # ── 3. score ─────────────────────────────────────────────────────────────────────────────────────────────
    @torch.no_grad()
    def score(self, exp: Experience, step: int | None = None, allow_all_dropped: bool = True,
              at: int | None = None) -> None:
        """Decoded texts, raw scores (reward model + functions) and their metrics onto ``exp``. Samples without a
        finite reward (NaN / inf / None) are dropped (score 0, ``exp.valid`` False, ``rewards/dropped``; all
        dropped: an error unless ``allow_all_dropped``). ``at``: the rollout step (0-based) a training batch is made
        for, which TRL-style functions read as ``trainer_state`` (optimizer updates done before it, the run's)."""
        with self.timer.phase("reward"):
            rollout, rows = exp.rollout, exp.rows
            self.phases.phase("reward", total=len(rows), unit="responses")
            texts = decode_responses(self.tok, rollout)  # one host copy of the ids (the mask is a prefix of lengths)
            messages = [row["prompt"] for row in rows]
            total = torch.zeros(len(texts), device=self.device)
            valid = torch.ones(len(texts), dtype=torch.bool, device=self.device)
            metrics: dict = {}
            if exp.env_returns is not None:  # a dropped episode's return is NaN
                valid &= torch.isfinite(exp.env_returns)
                total += torch.where(valid, exp.env_returns, 0.0)
                metrics.update(exp.env_metrics)
                if not valid.any() and not allow_all_dropped:
                    raise all_episodes_dropped(exp.env_metrics, len(valid), step)
            if self.scorer is not None:
                with on_device(self.scorer.model, self.device, self.cfg.memory.offload_reward):
                    rm = self.scorer.score(messages, texts, rollout.sequences, rollout.attention_mask).to(self.device)
                valid &= torch.isfinite(rm)
                total += torch.where(valid, rm, 0.0)
                metrics["rewards/model/mean"] = rm[valid].mean().item() if valid.any() else 0.0
            if self.functions is not None:
                ups = getattr(self, "updates_per_step", 1)
                state = None if at is None else (at * ups, None if self.max_steps is None else self.max_steps * ups,
                                                 at / max(getattr(self, "per_epoch", 0) or 1, 1))
                fn = self.functions.of_rows(rows, texts, rollout, step=step, max_steps=self.max_steps,
                                            allow_all_dropped=allow_all_dropped, trainer_state=state,
                                            group=self.k if at is not None else 1)  # training: k per prompt
                exp.reward_extra = fn.extra  # TRL's log_extra columns, for samples.jsonl
                total += fn.total.to(self.device)
                valid &= fn.valid.to(self.device)
                metrics.update(fn.metrics)
            ov = self.cfg.algo.overlong
            if ov.cache_len:
                metrics["rewards/overlong_penalty/mean"] = algos.overlong_penalty(
                    rollout.lengths, self.cfg.generation.max_new_tokens, ov.cache_len, ov.penalty).mean().item()
            total = torch.where(valid, total, 0.0)
            metrics["rewards/dropped"] = float((~valid).sum())
            exp.valid = valid  # keep-factor: dropped samples take no part in the step
            exp.texts, exp.raw_scores, exp.reward_metrics = texts, total, metrics

    # ── evaluation: held-out prompts ─────────────────────────────────────────────────────────────────────────
    @torch.no_grad()
    def evaluate_share(self, policy, first: int, per: int, forwards=None) -> dict:
        """Sums over held-out prompts ``[first, first + per)`` answered once each (``scores``, ``scored``: samples
        with a finite reward, and per-sample sums of the environment's / distillation's metrics);
        ``forwards(exp) -> dict``: the learner's extra metrics of a batch (distillation). A short share still takes
        its sharded policy's gathers, as the other processes do."""
        mine = self.eval_prompts[first: first + per]
        total = {"scores": 0.0, "scored": 0.0}
        for s in range(0, per, 64):
            if s >= len(mine):
                with self.strategy.gathered(policy):
                    continue
            exp = self.rollout(policy, self.collate(mine[s: s + 64]), seed=10_007 + first + s, k=1, phase="eval")
            self.score(exp)
            extra = {**exp.env_metrics, **(forwards(exp) if forwards is not None else {})}
            total["scores"] += exp.raw_scores[exp.valid].sum().item()  # samples with a finite reward
            total["scored"] += exp.valid.sum().item()
            for key, value in extra.items():  # multi-turn: the environment's metrics; distillation's; per episode
                total[key] = total.get(key, 0.0) + value * len(exp.rollout)
        return total



def all_episodes_dropped(m: dict, n: int, step: int | None) -> EnvError:
    """Every episode of a batch dropped: one line naming why (a non-finite reward from ``step()``, timed-out or failed
    calls, over-long observations), with the fix for the main cause; nothing to learn from, so the run stops."""
    causes = {"a non-finite reward (NaN / inf) from step()": m.get("env/nonfinite_rewards", 0),
              "a timed-out or failed call (a killed worker loses its other episodes)":
                  m.get("env/timeouts", 0) + m.get("env/errors", 0),
              "an over-long observation (data.overflow=drop)": m.get("env/overlong", 0)}
    fixes = ["return a finite float reward from step() (NaN / inf drop the episode)",
             "raise env.timeout_s, or fix what fails in the environment (env.workers=0 shows its traceback)",
             "raise env.max_total_tokens, shorten the observations, or set data.overflow=truncate"]
    said = [f"{int(k)} for {what}" for what, k in causes.items() if k]
    main = max(range(len(fixes)), key=lambda i: list(causes.values())[i])
    at = "" if step is None else f" at rollout step {step}"
    return EnvError(f"every one of the {n} episodes{at} was dropped ({', '.join(said) or 'no reason recorded'}): "
                    "nothing to learn from", where="env", fix=fixes[main])
