"""The online loop: PPO with actor / critic / reference / reward, and the critic-free GRPO, RLOO and REINFORCE++ —
one loop, the advantage estimator chosen by name (``algo.advantage``).

The second of two training loops (the supervised one: ``loop.py``); both share ``run.set_up_trained`` (wrap,
optimizer, schedule, prepare, resume, metrics), ``optim.clip_and_step``, ``checkpoint.py`` and ``session.py``; this
one makes its own data each step, in an :class:`~rlhfkit.train.experience.Experience`.

Each step (see DESIGN.md, "Data flow of an online step"):
  1. take a batch of prompts (each repeated ``num_generations`` times, completion-major)
  2. rollout with the policy's engine: every response stops at its own EOS; the mask ends at the first EOS; the
     engine reports the log-prob each token was sampled with
  3. score: reward model (ids reused, or text re-tokenised when its tokenizer differs) and / or reward functions;
     missing-EOS and DAPO overlong penalties, running normalisation, clipping. With DAPO dynamic sampling, steps
     1-3 repeat on fresh prompts until the batch holds only groups whose rewards differ (or the draws are capped)
  4. forward passes without grad, in batches of <= ``memory.forward_tokens`` tokens: policy (old log-probs; not when
     the update is on-policy: :attr:`OnlineTrainer.on_policy_update`), reference (with a KL), critic (PPO)
  5. per-token KL to the reference -> shaped rewards -> advantages / returns by the chosen estimator; mismatch
     metrics and the off-policy correction (``algo.off_policy``) from the sampling and the old log-probs; the loss
     mask composed once from the keep-factors the steps set (``experience.py``)
  6. PPO epochs over mini-batches: the `algo.policy_loss` (x off-policy weights) + KL in loss - entropy; value loss
  7. metrics (TRL names; the time of each phase, ``time/<phase>``, and the throughput), sample table, health
     checks, KL-controller update, checkpoint

Departures from the papers: KL on the sampled tokens by the chosen estimator (k1 in the reward, k3 in the loss as in
GRPO); the critic has its own optimizer (``vf_coef`` only scales its loss); with LoRA the reference is the policy
with its adapter disabled.
"""
from __future__ import annotations

import contextlib
import math
import time

import torch

from .. import algos
from ..config import OnlineConfig, replace
from ..config.geometry import launched_world_size, step_block, step_geometry
from ..data import PromptCollator
from ..data.chat import stop_token_ids
from ..errors import ConfigError, say
from ..models.loading import (
    describe,
    is_peft,
    load_causal_lm,
    load_scalar_model,
    load_tokenizer_for,
    save_model,
)
from ..models.tokenizer import check_same_tokenizer
from ..rewards import RewardModelScorer
from ..rewards.functions import rewards_from_config
from ..rewards.lint import clip_of, probe_rewards
from ..rollout import SamplingParams, build_engine, decode_responses
from ..track import NO_PHASES, Phases, PhaseTimer, Progress
from .checkpoint import rng_state, set_rng_state
from .common import length_policy, load_records, mean_stats, plan_batches, reduce_metrics, tokenize
from .distributed import get_strategy
from .experience import Experience, distill_metrics, merge_groups
from .forward import disable_dropout, on_device, response_logits, response_values
from .optim import clip_and_step
from .run import Run, run_recipe, set_up_trained
from .step_metrics import rollout_metrics
from .stop import Abandoned

# ─────────────────────────────────────────────────── trainer ──────────────────────────────────────────────────


class OnlineTrainer:
    """Holds the models and the state of an online run; ``train()`` is the loop, numbered as in the module doc."""

    def __init__(self, cfg: OnlineConfig, run: Run, records: tuple[list, list] | None = None):
        self.cfg, self.run, self.acc = cfg, run, run.accelerator
        algo = cfg.algo
        self.estimator = algos.ADVANTAGE_ESTIMATORS[algo.advantage]  # validated when the config was built
        self.policy_loss = algos.POLICY_LOSSES[algo.policy_loss]
        # the constant normaliser of seq_mean_token_sum_norm: the longest response (multi-turn: the whole episode)
        self.max_response_len = cfg.env.max_total_tokens if cfg.env.name else cfg.generation.max_new_tokens
        self.k = algo.num_generations
        self.use_kl = algo.kl.coef > 0 or algo.kl.adaptive
        placement = algo.kl.placement
        self.kl_in_reward = self.estimator.kl_in_reward_default if placement == "auto" else placement == "reward"
        self.device = run.device
        self.strategy = get_strategy(cfg)
        self.sampling = SamplingParams.from_config(cfg.generation)
        self.timer = PhaseTimer(self.device)  # time/<phase> of each step (one CUDA sync at each phase's end)
        kl = algo.kl
        self.kl_ctl = (algos.AdaptiveKLController(kl.coef, kl.target, kl.horizon) if kl.adaptive
                       else algos.FixedKLController(kl.coef))
        self.moments = algos.RunningMoments()
        self.phases: Phases = NO_PHASES  # where the loop reports its phase (the progress display, in train())
        # reward functions and prompt records first: a mistake in them is answered before any weights load
        self.functions = self.envs = None
        try:
            self.records = records if records is not None else load_records(cfg, "prompt")
            if len(self.records[0]) < cfg.algo.rollout_batch_size * run.world_size:
                raise _too_few_prompts(len(self.records[0]), cfg.algo.rollout_batch_size, run.world_size)
            # reward functions (in their workers), checked on a few prompts and linted before the run directory is
            # touched: wrong length / type, a constructor or sandbox that fails, an empty answer paid the most
            self.functions = rewards_from_config(cfg.reward)
            if self.functions is not None:
                head = self.records[0][:4]
                probe_rewards(self.functions, [r["prompt"][-1]["content"] for r in head],
                              [{k: v for k, v in r.items() if k != "prompt"} for r in head], lint=cfg.reward.lint,
                              say=run.print, clip=clip_of(cfg.reward))
            self._load_models()
            self._load_data()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the reward and environment workers (the end of a run, or a failure on the way)."""
        if self.functions is not None:
            self.functions.close()
        if self.envs is not None:
            self.envs.close()

    # ── set-up ───────────────────────────────────────────────────────────────────────────────────────────────
    def _load_models(self) -> None:
        cfg, run = self.cfg, self.run
        self.policy, self.tok = load_causal_lm(cfg.model, device=self.device, seed=cfg.train.seed)
        disable_dropout(self.policy)
        run.print(f"[{cfg.recipe}] policy {cfg.model.name}: {describe(self.policy)}")
        self.ref = None
        if self.use_kl and not (is_peft(self.policy) and cfg.ref_model is None):
            ref_cfg = _with_name(cfg.model, cfg.ref_model or cfg.model.name)
            self.ref, _ = load_causal_lm(ref_cfg, tokenizer=self.tok, device=self.device, seed=cfg.train.seed,
                                         trainable=False)
            self.ref.to("cpu" if cfg.memory.offload_reference else self.device)
        self.teacher = None
        if cfg.teacher.model:  # its tokenizer was compared with the student's before the run began (_before_run)
            self.teacher, _ = load_causal_lm(_with_name(cfg.model, cfg.teacher.model), tokenizer=self.tok,
                                             device=self.device, seed=cfg.train.seed, trainable=False)
            self.teacher.to("cpu" if cfg.memory.offload_teacher else self.device)
            run.print(f"[{cfg.recipe}] teacher {cfg.teacher.model}: {describe(self.teacher)}")
        self.scorer = None
        if cfg.reward.model:
            rm_cfg = _with_name(cfg.model, cfg.reward.model)
            rm_tok = load_tokenizer_for(rm_cfg)
            rm = load_scalar_model(cfg.reward.model, rm_cfg, tokenizer=rm_tok, device=self.device, trainable=False)
            rm.to("cpu" if cfg.memory.offload_reward else self.device)
            self.scorer = RewardModelScorer(rm, rm_tok, self.tok, batch_size=cfg.reward.batch_size)
            if not self.scorer.same_tokenizer:
                run.print(f"[{cfg.recipe}] reward model tokenizer differs from the policy's: responses are "
                          "re-tokenised as text for scoring")
        self.critic = None
        if self.estimator.needs_critic:
            source = cfg.critic.model or (cfg.reward.model if cfg.critic.init == "reward" else cfg.model.name)
            self.critic = load_scalar_model(source, _with_name(cfg.model, source), tokenizer=self.tok,
                                            device=self.device, seed=cfg.train.seed + 1)
            disable_dropout(self.critic)
            run.print(f"[{cfg.recipe}] critic from {source}: {describe(self.critic)}")
        self.env_cls = None
        if cfg.env.name:
            from ..envs import load_environment
            from ..envs.host import EnvCalls

            self.env_cls = load_environment(cfg.env.name)
            self.envs = EnvCalls(cfg.env.name, self.env_cls, cfg.env.kwargs, workers=cfg.env.workers,
                                 timeout_s=cfg.env.timeout_s)
        self.eos_ids = stop_token_ids(self.tok, getattr(self.policy, "generation_config", None))
        # built once for the run; it reads the policy's weights in place at each call (no copy, no weight sync)
        self.engine = build_engine(cfg.generation, self.tok, eos_token_ids=self.eos_ids)

    def _load_data(self) -> None:
        cfg = self.cfg
        train_recs, eval_recs = self.records
        self.prompts = tokenize(self.run, train_recs, "prompt", self.tok, cfg, "prompts")
        self.eval_prompts = tokenize(self.run, eval_recs, "prompt", self.tok, cfg, "eval prompts")
        self.collate = PromptCollator(self.tok.pad_token_id)
        world = self.run.world_size
        self.per_epoch = len(self.prompts) // (cfg.algo.rollout_batch_size * world)
        if self.per_epoch == 0:
            raise _too_few_prompts(len(self.prompts), cfg.algo.rollout_batch_size, world)
        geometry = step_geometry(cfg, world, len(self.prompts))  # its divisibility was checked at build
        self.total_steps, self.updates_per_step = geometry.steps, geometry.updates_per_step
        # one update per rollout: the old policy IS the updated one, its log-probs the update's own (as TRL); step 4
        # skips that forward (ratio exactly 1, same gradient) unless step 5 needs them (KL in reward, correction,
        # a teacher's reward)
        self.on_policy_update = self.updates_per_step == 1 and not (self.use_kl and self.kl_in_reward) and \
            cfg.algo.off_policy.correction == "none" and self.teacher is None

    def _prompt_batch(self, step: int) -> dict:
        epoch, pos = divmod(step, self.per_epoch)
        plan = plan_batches(len(self.prompts), self.cfg.algo.rollout_batch_size, self.run.world_size,
                            self.cfg.train.seed, epoch, self.acc.process_index)
        return self.collate([self.prompts[i] for i in plan[pos]])

    # ── 2. rollout ───────────────────────────────────────────────────────────────────────────────────────────
    def rollout(self, prompts: dict, seed: int, k: int | None = None, phase: str = "rollout",
                step: int | None = None) -> Experience:
        """``k`` responses per prompt (completion-major: the prompt batch repeated k times), as a new Experience;
        with an environment, ``k`` multi-turn episodes per prompt."""
        if self.env_cls is not None:
            return self.play_episodes(prompts, seed, k, step)
        k = self.k if k is None else k
        ids = [row[m.bool()].tolist() for row, m in zip(prompts["input_ids"], prompts["attention_mask"])]
        self.phases.phase(phase, total=len(ids) * k, unit="sequences")
        abandon = phase == "rollout" and (self.run.world_size == 1 or not self.cfg.algo.dynamic_sampling.enabled)

        def rows_done(n: int) -> None:  # a stop asked (SIGTERM, ...) abandons a training rollout between micro-batches
            self.phases.advance(n)
            if abandon:
                self.run.stop.abandon_point()

        with self.timer.phase("rollout"), self.strategy.gathered(self.policy):  # sharded: gathered once
            rollout = self.engine.generate(self.policy, ids * k, self.sampling, seed=seed, on_rows=rows_done)
        rows = [{k_: v[i] for k_, v in prompts.items() if isinstance(v, list)} for i in range(len(ids))] * k
        return Experience.of(rollout.to(self.device), rows)

    def play_episodes(self, prompts: dict, seed: int, k: int | None = None, step: int | None = None) -> Experience:
        """Multi-turn: ``k`` episodes per prompt with the environment (``env``), as a new Experience whose mask
        holds only the model's own tokens."""
        from ..envs.episodes import episode_metrics, run_episodes, turn_reward_tensor

        k = self.k if k is None else k
        n = len(prompts["input_ids"])
        rows = [{k_: v[i] for k_, v in prompts.items() if isinstance(v, list)} for i in range(n)] * k
        ec = self.cfg.env
        self.phases.phase("episodes", total=n * k)
        with self.timer.phase("rollout"), self.strategy.gathered(self.policy):  # sharded: gathered once
            rollout, episodes = run_episodes(
                self.engine, self.policy, self.tok, self.envs, rows, params=self.sampling, seed=seed,
                max_turns=ec.max_turns, max_total_tokens=ec.max_total_tokens, step=step,
                prompt_limit=length_policy(self.cfg).prompt_limit("prompt"), overflow=self.cfg.data.overflow)
        exp = Experience.of(rollout.to(self.device), rows)
        exp.env_returns = torch.tensor([e.reward for e in episodes], device=self.device)  # NaN: dropped
        exp.turn_rewards = turn_reward_tensor(episodes, rollout.response_ids.shape[1]).to(self.device)
        metrics = episode_metrics(episodes, self.envs.take_counts())  # this step's timeouts / errors
        exp.env_metrics = {f"env/{key}": value for key, value in metrics.items()}
        return exp

    def sample_and_score(self, step: int, seed: int, shape: bool = True) -> Experience:
        """Steps 1-3: prompts -> responses -> scores; with DAPO's dynamic sampling, batches drawn (<= ``max_draws``,
        one gather of a sharded policy) until the batch holds only groups whose penalised scores differ.
        ``shape=False``: raw scores (no collective but that gather: the normaliser's comes after)."""
        ds = self.cfg.algo.dynamic_sampling
        if not ds.enabled:
            exp = self.rollout(self._prompt_batch(step), seed, step=step + 1)
            self.score(exp, shape=shape, step=step + 1, allow_all_dropped=False)
            return exp

        def draw(j: int):
            e = self.rollout(self._prompt_batch(step * ds.max_draws + j), seed + 1_000_003 * j, step=step + 1)
            self.score(e, shape=False, step=step + 1)
            return e, self.penalised(e.raw_scores, e.rollout.ended, e.rollout.lengths), e.valid

        with self.strategy.gathered(self.policy):  # each process draws its own number of times
            pick = algos.dynamic_sample(draw, self.cfg.algo.rollout_batch_size, self.k, ds.max_draws)
        exp = merge_groups(pick.results, pick.groups, self.k, self.tok.pad_token_id, self.device)
        exp.reward_metrics.update({"rollout/dynamic_draws": float(pick.draws), "rollout/degenerate_groups":
                                   float(pick.degenerate), "rollout/degenerate_groups_filled": float(pick.filled)})
        if shape:
            exp.scores = self.shape_scores(exp.raw_scores, exp.rollout.ended, exp.rollout.lengths, exp.valid)
        return exp

    # ── 3. score ─────────────────────────────────────────────────────────────────────────────────────────────
    @torch.no_grad()
    def score(self, exp: Experience, shape: bool = True, step: int | None = None,
              allow_all_dropped: bool | None = None) -> None:
        """Decoded texts, raw scores (reward model + functions) and their metrics onto ``exp``; with ``shape`` also
        the learning scores (penalties, running normalisation, clipping: evaluation passes ``shape=False``). Samples
        without a finite reward (NaN / inf / None) are dropped (score 0, ``exp.valid`` False, ``rewards/dropped``;
        all dropped: an error unless ``allow_all_dropped``, by default ``not shape``)."""
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
            if self.scorer is not None:
                with on_device(self.scorer.model, self.device, self.cfg.memory.offload_reward):
                    rm = self.scorer.score(messages, texts, rollout.sequences, rollout.attention_mask).to(self.device)
                valid &= torch.isfinite(rm)
                total += torch.where(valid, rm, 0.0)
                metrics["rewards/model/mean"] = rm[valid].mean().item() if valid.any() else 0.0
            if self.functions is not None:
                prompt_text = [m[-1]["content"] for m in messages]
                fields = [{k: v for k, v in row.items() if k not in ("prompt",)} for row in rows]
                fn = self.functions(prompt_text, texts, fields, step=step,
                                    allow_all_dropped=not shape if allow_all_dropped is None else allow_all_dropped)
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
            if shape:
                exp.scores = self.shape_scores(total, rollout.ended, rollout.lengths, valid)

    def penalised(self, raw: torch.Tensor, ended: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Raw scores with the missing-EOS penalty and DAPO's soft overlong penalty (no running state)."""
        rc, ov = self.cfg.reward, self.cfg.algo.overlong
        scores = raw.clone()
        if rc.missing_eos_penalty:
            scores = scores - rc.missing_eos_penalty * (~ended).float()
        if ov.cache_len and lengths is not None:
            scores = scores + algos.overlong_penalty(lengths, self.cfg.generation.max_new_tokens, ov.cache_len,
                                                     ov.penalty).to(scores.device)
        return scores

    def shape_scores(self, raw: torch.Tensor, ended: torch.Tensor, lengths: torch.Tensor | None = None,
                     valid: torch.Tensor | None = None) -> torch.Tensor:
        """Missing-EOS and overlong penalties, then running normalisation (over valid samples), then clipping (each
        as configured); dropped samples (``valid`` False) stay at 0."""
        rc = self.cfg.reward
        scores = self.penalised(raw, ended, lengths)
        valid = torch.ones_like(ended, dtype=torch.bool) if valid is None else valid
        if rc.normalize:
            kept = self.acc.gather(valid)
            if kept.any():
                self.moments.update(self.acc.gather(scores)[kept].float().cpu())
            scores = self.moments.normalize(scores)
        if rc.clip is not None:
            scores = scores.clamp(-rc.clip, rc.clip)
        return torch.where(valid, scores, 0.0)

    # ── 4. forward passes without grad ──────────────────────────────────────────────────────────────────────
    @torch.no_grad()
    def logprobs_of(self, model, batch: dict, argmax: bool = False):
        """Log-probs [B, R] of the response tokens under ``model`` (the policy, the reference or the teacher: one
        function for all); with ``argmax``, also the model's greedy token at each position [B, R], from the same
        logits (no extra forward)."""
        with self.acc.autocast():
            logits = response_logits(model, batch, self.cfg.generation.temperature)
        logprobs = algos.token_logprobs(logits, batch["response_ids"]).float()
        return (logprobs, logits.argmax(-1)) if argmax else logprobs

    @torch.no_grad()
    def forward_passes(self, exp: Experience, evaluation: bool = False) -> None:
        """Old log-probs (not when :attr:`on_policy_update`), reference log-probs (with a KL), critic values (PPO),
        the teacher's log-probs and greedy agreement onto ``exp``: each model a timed phase over the same batches of
        <= ``memory.forward_tokens`` tokens (an offloaded model moves once), gathered once when sharded (the number
        of batches differs between processes). ``evaluation``: the policy and the teacher only."""
        distill, mem = self.teacher is not None, self.cfg.memory
        if not (evaluation or distill or not self.on_policy_update or self.use_kl or self.critic is not None):
            return  # on-policy, no KL, no critic: nothing to compute before the update
        if not evaluation:
            self.phases.phase("log-probs")
        batches = exp.token_batches(mem.forward_tokens)

        def each(phase: str, model, *contexts, argmax: bool = False):
            with self.timer.phase(phase), contextlib.ExitStack() as stack:
                for context in contexts:
                    stack.enter_context(context)
                parts = [self.logprobs_of(model, batch, argmax=argmax) for _, batch in batches]
            if not argmax:
                return exp.per_token(batches, parts)
            return exp.per_token(batches, [p[0] for p in parts]), exp.per_token(batches, [p[1] for p in parts])

        gather = self.strategy.gathered  # the trained models (policy, critic) may be sharded; ref / teacher are not
        if distill:  # (log-probs, greedy tokens) from the logits of the passes made anyway: no extra forward
            exp.old_logprobs, student_argmax = each("old_logprobs", self.policy, gather(self.policy), argmax=True)
            exp.teacher_logprobs, teacher_argmax = each(
                "teacher", self.teacher, on_device(self.teacher, self.device, mem.offload_teacher), argmax=True)
            exp.greedy_agree = student_argmax == teacher_argmax
        elif evaluation or not self.on_policy_update:
            exp.old_logprobs = each("old_logprobs", self.policy, gather(self.policy))
        if evaluation:
            return
        if self.use_kl:  # LoRA without a reference model: the policy with its adapter disabled
            exp.ref_logprobs = (each("reference", self.policy, gather(self.policy),
                                     self.acc.unwrap_model(self.policy).disable_adapter()) if self.ref is None else
                                each("reference", self.ref, on_device(self.ref, self.device, mem.offload_reference)))
        if self.critic is not None:
            with self.timer.phase("values"), gather(self.critic), self.acc.autocast():
                exp.values = exp.per_token(batches, [response_values(self.critic, b) for _, b in batches])

    # ── 5. KL, shaped rewards, advantages; the loss mask ─────────────────────────────────────────────────────
    def advantages(self, exp: Experience) -> dict:
        """Per-token KL -> shaped per-token rewards -> the registered estimator (called once) -> optional whitening,
        all over the samples of the step; then the keep-factors decided here (tied groups, overlong filtering, the
        off-policy correction) and the loss mask composed from every factor, once (experience.py)."""
        algo, mask = self.cfg.algo, exp.sample_mask
        coef = self.kl_ctl.value
        if exp.old_logprobs is not None:
            metrics = self.kl_metrics(exp)
        else:  # on-policy update: no KL in the reward; measured after the update (after_on_policy_update)
            metrics, exp.kl = {}, torch.zeros_like(mask)
        token_rewards, _ = algos.shaped_token_rewards(exp.scores, exp.kl, mask, coef, self.kl_in_reward)
        if exp.teacher_logprobs is not None:  # distillation: the teacher's per-token reward (teacher.coef)
            tc = self.cfg.teacher
            token_rewards = token_rewards + algos.teacher_token_rewards(exp.teacher_logprobs, exp.old_logprobs, mask,
                                                                        tc.coef, tc.log_ratio_clip)
            metrics.update(distill_metrics(exp, tc.log_ratio_clip))
        if exp.turn_rewards is not None:  # multi-turn: each turn's reward credited to its turn (sums unchanged)
            scale = 1.0 / math.sqrt(max(self.moments.var, 1e-8)) if self.cfg.reward.normalize else 1.0
            token_rewards = token_rewards + scale * algos.turn_reward_shift(exp.turn_rewards, mask)
        adv, exp.returns = self.estimator.fn(token_rewards, mask, values=exp.values, group_size=self.k,
                                             gamma=algo.gamma, lam=algo.lam)
        if algo.whiten_advantages:
            adv = algos.masked_whiten(adv, mask)
        if algo.filter_tied_groups and self.estimator.group_based:  # groups without signal leave every loss
            exp.untied = ~algos.group_all_tied(exp.scores, self.k, valid=mask.bool().any(-1))
        if algo.overlong.filter:  # DAPO overlong filtering: truncated responses leave every loss
            exp.finished = exp.rollout.ended
        metrics["objective/kl_coef"] = coef
        weights, off_metrics = self.off_policy(exp) if exp.old_logprobs is not None else (None, {})
        exp.compose_loss_mask(adv, weights)
        if weights is not None:
            off_metrics["rollout/is_weight_mean"] = float(algos.masked_mean(exp.is_weights, exp.mask))
        metrics.update(off_metrics)
        return metrics

    def kl_metrics(self, exp: Experience) -> dict:
        """``exp.kl`` (old policy to reference, per token over the sample mask; 0 without one) and its metrics."""
        algo, mask = self.cfg.algo, exp.sample_mask
        exp.kl = torch.zeros_like(mask)
        if exp.ref_logprobs is not None:
            exp.kl = algos.kl_penalty(exp.old_logprobs, exp.ref_logprobs, algo.kl.estimator, mask=mask,
                                      log_ratio_clip=algo.kl.log_ratio_clip)
        kl = exp.kl.sum(-1).mean().item()  # exp.kl is 0 outside the mask; the non-score reward is -coef x KL in it
        return {"objective/kl": kl, "objective/non_score_reward": -self.kl_ctl.value * kl if self.kl_in_reward else 0.0}

    def after_on_policy_update(self, exp: Experience) -> dict:
        """On-policy: step 5's KL and rollout / trainer mismatch metrics, from the update's own log-probs."""
        return {**self.kl_metrics(exp), **self.off_policy(exp)[1]}

    def off_policy(self, exp: Experience) -> tuple[torch.Tensor | None, dict]:
        """Mismatch metrics between the engine's sampling log-probs and the trainer's old log-probs over the tokens
        still in the loss, and the registered correction: returns its per-token weights for the policy loss (None:
        no correction) and sets ``exp.in_band``, what it keeps (MIS: without the tokens / rows outside the band, so
        they leave every loss and their advantages are zeroed)."""
        op = self.cfg.algo.off_policy
        sampled = exp.rollout.logprobs
        if sampled is None:
            if op.correction != "none":
                raise ConfigError(f"rollout engine {self.cfg.generation.engine!r} reports no sampling log-probs",
                                  where="algo.off_policy.correction", fix="set algo.off_policy.correction=none")
            return None, {}
        kept = exp.keep_mask("valid", "untied", "finished")  # every keep-factor decided before this one
        if self.acc.num_processes > 1:  # the tail (p99, max) of every process's tokens, not a mean of tails
            every = lambda t: self.acc.gather(self.acc.pad_across_processes(t.contiguous(), dim=1))  # noqa: E731
            st = algos.mismatch_stats(every(exp.old_logprobs), every(sampled), every(kept), op.low, op.high)
        else:
            st = algos.mismatch_stats(exp.old_logprobs, sampled, kept, op.low, op.high)
        weights, exp.in_band = algos.OFF_POLICY_CORRECTIONS[op.correction](
            exp.old_logprobs, sampled, kept, cap=op.cap, low=op.low, high=op.high, level=op.level)
        return weights, {f"rollout/{k}": float(v) for k, v in st.items()}

    # ── 6. PPO epochs over mini-batches ─────────────────────────────────────────────────────────────────────
    def policy_micro_step(self, batch: dict, scale: float) -> dict:
        algo = self.cfg.algo
        with self.acc.autocast():
            logits = response_logits(self.policy, batch, self.cfg.generation.temperature)
            logprobs = algos.token_logprobs(logits, batch["response_ids"]).float()
            on_policy = "old_logprobs" not in batch  # the update's own log-probs are the old ones
            old = logprobs.detach() if on_policy else batch["old_logprobs"]
            loss, st = self.policy_loss(logprobs, old, batch["advantages"], batch["mask"],
                                        getattr(algo, self.policy_loss.section),  # the loss's own settings
                                        aggregation=algo.loss_aggregation, max_len=self.max_response_len,
                                        weights=batch.get("is_weights"))
            ent_logits = logits.detach() if algo.entropy_coef == 0 else logits
            entropy = algos.masked_mean(algos.entropy_from_logits(ent_logits), batch["mask"])
            total = loss - algo.entropy_coef * entropy
            if not self.kl_in_reward and "ref_logprobs" in batch:
                kl_l, _ = algos.kl_loss(logprobs, batch["ref_logprobs"], batch["mask"], estimator=algo.kl.estimator,
                                        aggregation=algo.loss_aggregation, max_len=self.max_response_len,
                                        log_ratio_clip=algo.kl.log_ratio_clip)
                total = total + self.kl_ctl.value * kl_l
        self.acc.backward(total * scale)
        return {"loss/policy_avg": loss.detach(), "policy/entropy_avg": entropy.detach(),
                "policy/clipfrac_avg": st["clipfrac"], "policy/approxkl_avg": st["approxkl"],
                "val/ratio": st["ratio_mean"], "val/ratio_var": st["ratio_var"],
                **({"logprobs": old} if on_policy else {})}

    def critic_micro_step(self, batch: dict, scale: float) -> dict:
        with self.acc.autocast():
            values = response_values(self.critic, batch)
            loss, st = algos.value_loss(values, batch["values"], batch["returns"], batch["mask"],
                                        clip_range=self.cfg.algo.value_clip)
        self.acc.backward(self.cfg.algo.vf_coef * loss * scale)
        return {"loss/value_avg": loss.detach(), "val/clipfrac_avg": st["clipfrac"]}

    def ppo_update(self, exp: Experience, step: int) -> dict:
        """Step 6; with :attr:`on_policy_update`, ``exp.old_logprobs`` is set from the update's own log-probs."""
        algo, mb = self.cfg.algo, self.cfg.train.batch_size
        n = len(exp.rollout)
        stats: list[dict] = []
        own = torch.zeros_like(exp.action) if exp.old_logprobs is None else None
        g = torch.Generator().manual_seed(self.cfg.train.seed * 7919 + step)
        self.policy.train()
        self.phases.phase("update", total=algo.ppo_epochs * math.ceil(n / algo.mini_batch_size))
        for _ in range(algo.ppo_epochs):
            order = torch.randperm(n, generator=g).to(self.device)
            for m0 in range(0, n, algo.mini_batch_size):
                mini = order[m0: m0 + algo.mini_batch_size]
                micro_n = math.ceil(len(mini) / mb)
                for i, s in enumerate(range(0, len(mini), mb)):
                    batch = exp.rows_of(mini[s: s + mb])
                    last = i == micro_n - 1
                    st = {}
                    with (contextlib.nullcontext() if last else self.acc.no_sync(self.policy)):
                        st.update(self.policy_micro_step(batch, 1.0 / micro_n))
                    if own is not None:
                        own[mini[s: s + mb]] = st.pop("logprobs")
                    if self.critic is not None:
                        with (contextlib.nullcontext() if last else self.acc.no_sync(self.critic)):
                            st.update(self.critic_micro_step(batch, 1.0 / micro_n))
                    stats.append(st)
                clip_and_step(self.acc, self.policy, self.opt, self.sched, self.cfg.optim.max_grad_norm)
                if self.critic is not None:
                    clip_and_step(self.acc, self.critic, self.critic_opt, self.critic_sched,
                                  self.cfg.optim.max_grad_norm)
                self.phases.advance()
        if own is not None:
            exp.old_logprobs = own
        return mean_stats(self.acc, stats)

    # ── evaluation on held-out prompts ───────────────────────────────────────────────────────────────────────
    @torch.no_grad()
    def evaluate(self, step: int) -> dict:
        """Held-out prompts sharded over the processes (the same number of rollout phases on each), the sums gathered
        once; with a teacher every process evaluates them all (its forwards are collectives under fsdp2)."""
        if not self.eval_prompts:
            return {}
        n, world = len(self.eval_prompts), 1 if self.teacher is not None else self.run.world_size
        per = math.ceil(n / world)
        first = self.acc.process_index * per if world > 1 else 0
        mine = self.eval_prompts[first: first + per]
        total = {"scores": 0.0, "scored": 0.0}  # sums over this process's share
        for s in range(0, per, 64):
            if s >= len(mine):  # a short share: the sharded policy's gather, as the other processes do
                with self.strategy.gathered(self.policy):
                    continue
            exp = self.rollout(self.collate(mine[s: s + 64]), seed=10_007 + first + s, k=1, phase="eval")
            self.score(exp, shape=False)
            if self.teacher is not None:  # held-out distillation metrics (distill/*)
                self.forward_passes(exp, evaluation=True)
            total["scores"] += exp.raw_scores[exp.valid].sum().item()  # samples with a finite reward
            total["scored"] += exp.valid.sum().item()
            extra = {**exp.env_metrics, **distill_metrics(exp, self.cfg.teacher.log_ratio_clip)}
            for key, value in extra.items():  # multi-turn: the environment's metrics; distillation's; per episode
                total[key] = total.get(key, 0.0) + value * len(exp.rollout)
        if world > 1:
            from accelerate.utils import gather_object

            every = gather_object([total])
            total = {key: sum(t.get(key, 0.0) for t in every) for key in every[0]}
        scores, scored = total.pop("scores"), total.pop("scored")
        out = {f"eval/{key}": value / n for key, value in total.items()}
        if scored:
            out["eval/scores"] = scores / scored
        return out

    # ── the loop ─────────────────────────────────────────────────────────────────────────────────────────────
    def train(self) -> dict:
        cfg, run, acc = self.cfg, self.run, self.acc
        # wrap, optimizer, schedule, prepare, resume the newest valid checkpoint of the same run (or start over),
        # open the metrics sink: the set-up both loops share (run.py); policy and critic are prepared together
        models = {"policy": self.policy, **({} if self.critic is None else {"critic": self.critic})}
        trained = set_up_trained(run, models, self.total_steps * self.updates_per_step, lrs={"critic": cfg.critic.lr})
        self.policy, self.opt, self.sched = trained.parts("policy")
        if self.critic is not None:
            self.critic, self.critic_opt, self.critic_sched = trained.parts("critic")
        session, step = run.session, 0
        if trained.state is not None:
            step = trained.state["step_rollout"]
            self.kl_ctl.load_state_dict(trained.state["kl_ctl"])
            self.moments.load_state_dict(trained.state["moments"])
        samples = session.open_samples()
        health = session.open_health(batch_size=cfg.algo.rollout_batch_size * self.k,
                                     repeat_every=10 * self.updates_per_step,
                                     max_response_len=self.max_response_len, vocab_size=len(self.tok))
        episodes_per_step = cfg.algo.rollout_batch_size * self.k * run.world_size
        every = max(1, math.ceil(cfg.train.save_every / self.updates_per_step)) if cfg.train.save_every > 0 else 0
        show = ("objective/scores", "objective/kl", "val/ratio", "response/length_mean", "time/step",
                "time/rollout", "time/update", "throughput/tokens_per_s")
        last: dict = {}
        t_start = time.time()
        with Progress(self.total_steps, desc=cfg.recipe, unit="rollout", show=show,
                      is_main=run.is_main and cfg.track.progress, initial=step) as progress:
            self.phases = progress
            saved = step  # the rollout step the newest checkpoint holds

            def save(at: int) -> None:  # a checkpoint of rollout step ``at`` (update at * updates_per_step)
                trained.save(at * self.updates_per_step, state={"step_rollout": at, "kl_ctl": self.kl_ctl.state_dict(),
                                                                "moments": self.moments.state_dict()})

            def stop_if_asked(rng: dict | None = None, last: bool = False) -> None:  # every process at one point
                if run.stop.should_stop(acc, last):  # (train/stop.py)
                    if rng is not None:  # the step was abandoned: the RNG as it found it
                        set_rng_state(rng)
                    run.stop.stop(acc, step * self.updates_per_step, None if saved == step else lambda: save(step))

            run.stop.arm(True)
            while step < self.total_steps:
                seed = cfg.train.seed * 100_003 + step * run.world_size + acc.process_index
                t_step = time.perf_counter()
                # 1-3. prompts -> responses -> raw scores, on this process alone (but a sharded policy's gather): a
                #      failure or a stop signal (the rollout abandoned) stops every process at the check (stop.py)
                rng = rng_state()
                try:
                    exp = self.sample_and_score(step, seed, shape=False)
                except Abandoned:
                    pass
                except Exception as err:  # noqa: BLE001 - re-raised by stop() on this process, after the save
                    run.stop.fail(err)
                stop_if_asked(rng)
                exp.scores = self.shape_scores(exp.raw_scores, exp.rollout.ended, exp.rollout.lengths, exp.valid)
                # 4. old / reference log-probs, values
                self.forward_passes(exp)
                # 5. KL, shaped rewards, advantages
                metrics = self.advantages(exp)
                # 6. PPO epochs
                with self.timer.phase("update"):
                    metrics.update(self.ppo_update(exp, step))
                if self.on_policy_update:
                    metrics.update(self.after_on_policy_update(exp))
                step += 1
                # 7. metrics, samples, health, KL controller, checkpoint
                update = step * self.updates_per_step
                metrics.update(self.step_metrics(exp, step, episodes_per_step, t_start))
                metrics.update(self.step_times(exp, time.perf_counter() - t_step))
                metrics = reduce_metrics(acc, metrics)  # one value per key on every process (KL controller too)
                self.kl_ctl.update(metrics["objective/kl"], episodes_per_step)
                if step == self.total_steps or (cfg.train.eval_every > 0 and step % cfg.train.eval_every == 0):
                    with self.timer.phase("eval"):
                        metrics.update(self.evaluate(step))
                    metrics.update(reduce_metrics(acc, self.timer.take()))
                run.log(metrics, update)
                last = metrics
                progress.update(1, {k: v for k, v in metrics.items() if k in show})
                if run.is_main:  # steps of metrics.jsonl; a critical stop reaches every rank at the check below
                    run.stop.local(acc, health.report, metrics, update, texts=exp.texts)
                if cfg.track.sample_every > 0 and (step % cfg.track.sample_every == 0 or step == 1):
                    samples.log(update, [r["prompt"][-1]["content"] for r in exp.rows], exp.texts,
                                exp.raw_scores.tolist())
                if every and step % every == 0 and step != self.total_steps:
                    save(step)
                    saved = step
                stop_if_asked(last=step == self.total_steps)  # a stop asked during the update: before the rollout
            run.stop.arm(False)
        # final policy (gathered by the strategy: one HF directory), finished marker, report
        session.finish(self.policy, lambda m, d: save_model(m, self.tok, d), step * self.updates_per_step)
        return last

    def step_times(self, exp: Experience, seconds: float) -> dict:
        """This process's ``time/<phase>``, ``time/step`` (steps 1-7 without evaluation), ``throughput/tokens_per_s``
        (the model's own tokens) and ``throughput/episodes_per_s`` (the engine's compile time: step_metrics)."""
        out = self.timer.take()
        out["time/step"] = seconds
        out["throughput/tokens_per_s"] = float(exp.action.sum()) / max(seconds, 1e-9)
        out["throughput/episodes_per_s"] = len(exp.rollout) / max(seconds, 1e-9)
        return out

    def step_metrics(self, exp: Experience, step: int, per_step: int, t0: float) -> dict:
        """The step's reward metrics, its rollout metrics over every process's samples (one gather), LR, episodes."""
        return {
            **exp.reward_metrics,
            **rollout_metrics(self.acc, exp, kl_coef=self.kl_ctl.value, kl_in_reward=self.kl_in_reward,
                              group_size=self.k, group_based=self.estimator.group_based, clip=self.cfg.reward.clip),
            **{k: v for k, v in self.engine.take_stats().items() if v},  # time/rollout_compile when it compiled
            "lr": self.sched.get_last_lr()[0], "episode": step * per_step,
            "eps": step * per_step / max(time.time() - t0, 1e-6)}


def _too_few_prompts(n: int, batch: int, world: int) -> ConfigError:
    return ConfigError(f"{n} prompts do not fill one rollout batch of {batch} x {world} processes",
                       where="algo.rollout_batch_size", fix="lower algo.rollout_batch_size or give more prompts")


def _with_name(mcfg, name: str):
    return replace(mcfg, name=name, gguf_file=None if name != mcfg.name else mcfg.gguf_file)


def run_online(cfg: OnlineConfig) -> dict:
    """PPO / GRPO / RLOO / REINFORCE++ / distillation from ``cfg``; returns the last step's metrics."""
    return run_recipe(cfg, _train_online, prepare=_before_run)


def _before_run(cfg: OnlineConfig) -> tuple[list, list]:
    """Before the run directory is looked at or weights load: the prompts, then the teacher's tokenizer (exit 2)."""
    records = load_records(cfg, "prompt")
    say(step_block(cfg, launched_world_size(), len(records[0])))  # the step, and what differs from TRL's defaults
    if cfg.teacher.model:
        check_same_tokenizer(cfg.model.name, cfg.teacher.model, student_gguf=cfg.model.gguf_file)
    return records


def _train_online(cfg: OnlineConfig, run: Run, records: tuple[list, list]) -> dict:
    trainer = OnlineTrainer(cfg, run, records)
    try:  # an early end (track.stop_on_critical, a failure, a signal) closes the files and writes the report in
        metrics = trainer.train()  # Session.close
    finally:
        trainer.close()
    run.print(f"[{cfg.recipe}] done: policy saved to {run.run_dir}")
    return metrics
