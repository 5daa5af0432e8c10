"""The learner of the online step: an :class:`~.experience.Experience` with raw scores -> one update of the policy
(and the critic): steps 4-6 of ``online.py``.

It owns what trains and what judges the policy's tokens: the policy, the reference, the teacher, the critic, their
optimizers and schedules, the KL controller and the running reward normalisation (their state is checkpointed with
the run). It never generates: the producer (``producer.py``) makes its experiences, in the same process one step at
a time (``online.py``) or on other processes at once (``asynchronous.py``).

Departures from the papers: KL on the sampled tokens by the chosen estimator (k1 in the reward, k3 in the loss as in
GRPO); the critic has its own optimizer (``vf_coef`` only scales its loss); with LoRA the reference is the policy
with its adapter disabled.
"""

from __future__ import annotations

import contextlib
import math

import torch

from ... import algos
from ...config import replace
from ...data.chat import stop_token_ids
from ...errors import ConfigError
from ...models.loading import describe, load_causal_lm, load_scalar_model
from ...models.tokenizer import same_ids
from ...track import NO_PHASES, Phases, PhaseTimer
from ..lifecycle.distributed import get_strategy
from ..lifecycle.optim import clip_and_step
from ..lifecycle.run import Run, set_up_trained
from ..shared.batches import gather_rows, mean_stats, model_named
from ..shared.forward import disable_dropout, on_device, response_stats, response_values
from .experience import Experience, distill_metrics
from .preference import preference_update
from .producer import penalised_scores
from .reference import load_reference, needs_reference, on_producer, reference_of
from .teacher import CrossTokenizerTeacher


def load_policy(cfg, device):
    """The policy and its tokenizer, dropout off (the same on every process that holds a copy)."""
    policy, tok = load_causal_lm(cfg.model, device=device, seed=cfg.train.seed)
    disable_dropout(policy)
    return policy, tok


#: the policy loss's stats about the importance ratio, averaged over the tokens in the loss (Learner.ratio_stats)
RATIO_KEYS = ("val/ratio", "val/ratio_var", "policy/clipfrac_avg", "policy/approxkl_avg")


class Learner:
    """The trained models of an online run and steps 4-6 (see the module doc); :meth:`learn` is one step."""

    def __init__(self, cfg, run: Run, timer: PhaseTimer | None = None):
        self.cfg, self.run, self.acc = cfg, run, run.accelerator
        algo = cfg.algo
        self.estimator = algos.ADVANTAGE_ESTIMATORS[algo.advantage]  # validated when the config was built
        self.policy_loss = algos.POLICY_LOSSES[algo.policy_loss]
        # the constant normaliser of seq_mean_token_sum_norm: the longest response (multi-turn: the whole episode)
        self.max_response_len = cfg.env.max_total_tokens if cfg.env.name else cfg.generation.max_new_tokens
        self.k = algo.num_generations
        self.use_kl = algo.kl.coef > 0 or algo.kl.adaptive
        self.preference = algo.objective == "preference"  # online DPO: a pair loss instead of the policy loss
        self.needs_ref = needs_reference(cfg)
        self.tokens_seen = 0.0  # prompt + response tokens of every rollout so far (TRL's num_tokens)
        self.ref_from_producer = on_producer(cfg)  # asynchronous: the producers send the reference log-probs
        placement = algo.kl.placement
        self.kl_in_reward = self.estimator.kl_in_reward_default if placement == "auto" else placement == "reward"
        self.device = run.device
        self.strategy = get_strategy(cfg)
        self.timer = timer or PhaseTimer(self.device)  # time/<phase> of each step (one CUDA sync at each phase's end)
        kl = algo.kl
        self.kl_ctl = (algos.AdaptiveKLController(kl.coef, kl.target, kl.horizon) if kl.adaptive
                       else algos.FixedKLController(kl.coef))
        self.moments = algos.RunningMoments()
        self.phases: Phases = NO_PHASES  # where the learner reports its phase (the progress display)
        self._load_models()

    def _load_models(self) -> None:
        cfg, run = self.cfg, self.run
        self.policy, self.tok = load_policy(cfg, self.device)
        run.print(f"[{cfg.recipe}] policy {cfg.model.name}: {describe(self.policy)}")
        self.ref = None  # None with a reference: the LoRA policy with its adapter disabled (train/online/reference.py)
        if self.needs_ref and not self.ref_from_producer:
            self.ref = load_reference(cfg, self.policy, self.tok, self.device)
        self.teacher = self.cross = None
        if cfg.teacher.model:  # loaded with its own tokenizer (and chat template); another one than the student's
            #                    is aligned to the student's tokens by character spans (train/online/teacher.py)
            t_cfg = replace(model_named(cfg.model, cfg.teacher.model), chat_template=None)
            self.teacher, t_tok = load_causal_lm(t_cfg, device=self.device, seed=cfg.train.seed, trainable=False)
            self.teacher.to("cpu" if cfg.memory.offload_teacher else self.device)
            run.print(f"[{cfg.recipe}] teacher {cfg.teacher.model}: {describe(self.teacher)}")
            s_stop = stop_token_ids(self.tok, getattr(self.policy, "generation_config", None))
            if not same_ids(self.tok, s_stop, t_tok, stop_token_ids(t_tok, getattr(self.teacher, "generation_config",
                                                                                  None))):
                self.cross = CrossTokenizerTeacher(self.tok, t_tok, s_stop)
                run.print(f"[{cfg.recipe}] the teacher's tokenizer differs from the student's: its log-probs are "
                          "aligned to the student's tokens by character spans (cross-tokenizer distillation)")
        self.critic = None
        if self.estimator.needs_critic:
            source = cfg.critic.model or (cfg.reward.model if cfg.critic.init == "reward" else cfg.model.name)
            self.critic = load_scalar_model(source, model_named(cfg.model, source), tokenizer=self.tok,
                                            device=self.device, seed=cfg.train.seed + 1)
            disable_dropout(self.critic)
            run.print(f"[{cfg.recipe}] critic from {source}: {describe(self.critic)}")

    def plan(self, per_step_samples: int) -> None:
        """Updates per step (``ppo_epochs`` x mini-batches of a ``per_step_samples`` batch) and whether the update is
        on-policy: one update per rollout, the old policy IS the updated one, its log-probs the update's own (as
        TRL); step 4 skips that forward (ratio exactly 1, same gradient) unless step 5 needs them before the update
        (KL in reward, a teacher's reward). An off-policy correction needs them too, but only row by row: each
        micro-batch takes its weights (and MIS its mask) from the update's own detached log-probs, the same numbers
        the separate forward would give (the weights are not changed by then), so stale samples (the asynchronous
        mode) cost no extra forward either."""
        algo = self.cfg.algo
        per_epoch = per_step_samples // algo.mini_batch_size
        if self.preference:  # online DPO updates on the prompts' pairs: at most one update per pair
            per_epoch = max(1, min(per_epoch, per_step_samples // self.k))
        self.updates_per_step = algo.ppo_epochs * per_epoch
        self.on_policy_update = self.updates_per_step == 1 and not (self.use_kl and self.kl_in_reward) and \
            self.teacher is None and not self.preference

    def set_up(self, total_updates: int) -> dict | None:
        """Wrap, optimizer, schedule, prepare, resume the newest valid checkpoint of the same run (or start over),
        open the metrics sink (``run.set_up_trained``; policy and critic prepared together). Returns the resumed
        loop state (None: a new run), the KL controller and the normaliser already restored."""
        models = {"policy": self.policy, **({} if self.critic is None else {"critic": self.critic})}
        self.trained = set_up_trained(self.run, models, total_updates, lrs={"critic": self.cfg.critic.lr})
        self.policy, self.opt, self.sched = self.trained.parts("policy")
        if self.critic is not None:
            self.critic, self.critic_opt, self.critic_sched = self.trained.parts("critic")
        state = self.trained.state
        if state is not None:
            self.kl_ctl.load_state_dict(state["kl_ctl"])
            self.moments.load_state_dict(state["moments"])
            self.tokens_seen = float(state.get("tokens_seen", 0.0))
        return state

    def state_dict(self) -> dict:
        """The learner's loop state for a checkpoint (JSON-able)."""
        return {"kl_ctl": self.kl_ctl.state_dict(), "moments": self.moments.state_dict(),
                "tokens_seen": self.tokens_seen}

    def learn(self, exp: Experience, step: int) -> dict:
        """Steps 4-6 on ``exp`` (scores shaped): the forwards, the advantages and the loss mask, the PPO epochs."""
        self.forward_passes(exp)  # 4. old / reference log-probs, values
        if self.preference:  # 5-6. online DPO: pairs by score, the pair loss (online_preference.py)
            with self.timer.phase("update"):
                return preference_update(self, exp, step)
        metrics = self.advantages(exp)  # 5. KL, shaped rewards, advantages
        with self.timer.phase("update"):  # 6. PPO epochs
            metrics.update(self.ppo_update(exp, step))
        if self.on_policy_update:
            metrics.update(self.after_on_policy_update(exp))
        return metrics

    # ── 3b. the learning scores ──────────────────────────────────────────────────────────────────────────────
    def shape_scores(self, raw: torch.Tensor, ended: torch.Tensor, lengths: torch.Tensor | None = None,
                     valid: torch.Tensor | None = None) -> torch.Tensor:
        """Missing-EOS and overlong penalties, then running normalisation (over valid samples of every learner: one
        gather), then clipping (each as configured); dropped samples (``valid`` False) stay at 0."""
        rc = self.cfg.reward
        valid = torch.ones_like(ended, dtype=torch.bool) if valid is None else valid
        scores = penalised_scores(self.cfg, raw, ended, lengths, valid)
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
        with self.acc.autocast():  # through the LM head in chunks: no [B, R, V] logits (train/shared/forward.py)
            st = response_stats(model, batch, self.cfg.generation.temperature, argmax=argmax)
        return (st.logprobs, st.argmax) if argmax else st.logprobs

    @torch.no_grad()
    def forward_passes(self, exp: Experience, evaluation: bool = False) -> None:
        """Old log-probs (not when ``on_policy_update``), reference log-probs (with a KL), critic values (PPO),
        the teacher's log-probs and greedy agreement onto ``exp``: each model a timed phase over the same batches of
        <= ``memory.forward_tokens`` tokens (an offloaded model moves once), gathered once when sharded (the number
        of batches differs between processes). ``evaluation``: the policy and the teacher only."""
        distill, mem = self.teacher is not None, self.cfg.memory
        take_ref = self.needs_ref and exp.ref_logprobs is None  # (the asynchronous producers may have sent them)
        if not (evaluation or distill or not self.on_policy_update or take_ref or self.critic is not None):
            return  # on-policy, no reference log-probs to take, no critic: nothing to compute before the update
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
        if distill and self.cross is not None:  # another tokenizer: the teacher reads the text (online/teacher.py)
            exp.old_logprobs = each("old_logprobs", self.policy, gather(self.policy))
            with self.timer.phase("teacher"), on_device(self.teacher, self.device, mem.offload_teacher):
                exp.teacher_logprobs, exp.teacher_aligned = self.cross.logprobs(
                    self.teacher, [row["prompt"] for row in exp.rows], exp.rollout.response_ids,
                    exp.rollout.response_mask, exp.old_logprobs, temperature=self.cfg.generation.temperature,
                    budget=mem.forward_tokens, autocast=self.acc.autocast)
        elif distill:  # (log-probs, greedy tokens) from the logits of the passes made anyway: no extra forward
            exp.old_logprobs, student_argmax = each("old_logprobs", self.policy, gather(self.policy), argmax=True)
            exp.teacher_logprobs, teacher_argmax = each(
                "teacher", self.teacher, on_device(self.teacher, self.device, mem.offload_teacher), argmax=True)
            exp.greedy_agree = student_argmax == teacher_argmax
        elif evaluation or not self.on_policy_update:
            exp.old_logprobs = each("old_logprobs", self.policy, gather(self.policy))
        if evaluation:
            return
        if take_ref:
            if self.ref_from_producer and self.ref is None:  # a queue resumed from a run where the learner took them
                self.ref = load_reference(self.cfg, self.policy, self.tok, self.device)
            model, context = reference_of(self.ref, self.policy, self.device, mem.offload_reference,
                                          self.acc.unwrap_model)
            exp.ref_logprobs = each("reference", model, *([gather(self.policy)] if self.ref is None else []), context)
        if self.critic is not None:
            with self.timer.phase("values"), gather(self.critic), self.acc.autocast():
                exp.values = exp.per_token(batches, [response_values(self.critic, b) for _, b in batches])

    def eval_metrics(self, exp: Experience) -> dict:
        """A held-out batch's distillation metrics (``distill/*``; {} without a teacher)."""
        if self.teacher is None:
            return {}
        self.forward_passes(exp, evaluation=True)
        return distill_metrics(exp, self.cfg.teacher.log_ratio_clip)

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
            self.sampled_logprobs(exp)  # a correction without sampling log-probs: one line before the update
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
                                             gamma=algo.gamma, lam=algo.lam, **self.estimator.settings(algo))
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
        """``exp.kl`` (old policy to reference, per token over the sample mask; 0 without one) and its metrics.
        Without a reference (no KL term: ``algo.kl.coef=0``) no KL is measured and none is logged, as TRL logs no
        ``kl`` at beta 0: a KL of 0 in the metrics would say the policy had not moved."""
        algo, mask = self.cfg.algo, exp.sample_mask
        exp.kl = torch.zeros_like(mask)
        if exp.ref_logprobs is None:
            return {"objective/non_score_reward": 0.0}
        exp.kl = algos.kl_penalty(exp.old_logprobs, exp.ref_logprobs, algo.kl.estimator, mask=mask,
                                  log_ratio_clip=algo.kl.log_ratio_clip)
        # exp.kl is 0 outside the mask; the non-score reward is -coef x KL in it. With the mask's tokens per answer
        # (end_step makes the KL per token over every process of them: kl_per_token), in one device sync
        kl, tokens = torch.stack([exp.kl.sum(-1).mean().float(), mask.sum(-1).float().mean()]).tolist()
        return {"objective/kl": kl, "objective/kl_tokens": tokens,
                "objective/non_score_reward": -self.kl_ctl.value * kl if self.kl_in_reward else 0.0}

    def after_on_policy_update(self, exp: Experience) -> dict:
        """On-policy: step 5's KL and rollout / trainer mismatch metrics, from the update's own log-probs; with a
        correction, the loss mask and weights the micro-batches used, composed for the whole step."""
        weights, metrics = self.off_policy(exp)
        if weights is not None:
            exp.compose_loss_mask(exp.advantages, weights)  # the advantages are masked already; in_band only removes
            metrics["rollout/is_weight_mean"] = float(algos.masked_mean(exp.is_weights, exp.mask))
        return {**self.kl_metrics(exp), **metrics}

    def sampled_logprobs(self, exp: Experience) -> torch.Tensor | None:
        """The engine's sampling log-probs; a correction without them is a configuration error."""
        if exp.rollout.logprobs is None and self.cfg.algo.correction != "none":
            raise ConfigError(f"rollout engine {self.cfg.generation.engine!r} reports no sampling log-probs",
                              where="algo.off_policy.correction", fix="set algo.off_policy.correction=none")
        return exp.rollout.logprobs

    def off_policy(self, exp: Experience) -> tuple[torch.Tensor | None, dict]:
        """Mismatch metrics between the engine's sampling log-probs and the trainer's old log-probs over the tokens
        still in the loss, and the registered correction: returns its per-token weights for the policy loss (None:
        no correction) and sets ``exp.in_band``, what it keeps (MIS: without the tokens / rows outside the band, so
        they leave every loss and their advantages are zeroed)."""
        op, correction = self.cfg.algo.off_policy, self.cfg.algo.correction
        sampled = self.sampled_logprobs(exp)
        if sampled is None:
            return None, {}
        kept = exp.keep_mask("valid", "untied", "finished")  # every keep-factor decided before this one
        if self.acc.num_processes > 1:  # the tail (p99, max) of every process's tokens, not a mean of tails
            every = lambda t: self.acc.gather(self.acc.pad_across_processes(t.contiguous(), dim=1))  # noqa: E731
            st = algos.mismatch_stats(every(exp.old_logprobs), every(sampled), every(kept), op.low, op.high)
        else:
            st = algos.mismatch_stats(exp.old_logprobs, sampled, kept, op.low, op.high)
        weights, exp.in_band = algos.OFF_POLICY_CORRECTIONS[correction](exp.old_logprobs, sampled, kept, op)
        return weights, {f"rollout/{k}": float(v) for k, v in st.items()}

    # ── 6. PPO epochs over mini-batches ─────────────────────────────────────────────────────────────────────
    def policy_micro_step(self, batch: dict, scale: float) -> dict:
        algo = self.cfg.algo
        with self.acc.autocast():
            per_token = response_stats(self.policy, batch, self.cfg.generation.temperature, entropy=True,
                                       entropy_grad=algo.entropy_coef != 0)  # no [B, R, V] logits (shared/forward.py)
            logprobs = per_token.logprobs
            on_policy = "old_logprobs" not in batch  # the update's own log-probs are the old ones
            old = logprobs.detach() if on_policy else batch["old_logprobs"]
            if "rollout_logprobs" in batch:  # on-policy with a correction: its weights and mask from them, row by row
                self.fold_correction(batch, old)
            weights, learning, keep = batch.get("is_weights"), None, {}  # learning: the selected tokens, if any
            if algo.top_entropy_quantile < 1:  # the policy loss on the high-entropy tokens only (TRL's placement)
                learning = self.high_entropy_tokens(per_token.entropy, batch["mask"])
                if self.policy_loss.sequence_weights:  # a factor on the per-token loss, as the correction's
                    weights = learning.float() if weights is None else weights * learning
                else:  # its weights are ratios folded into its sequence ratio: the selection goes apart
                    keep = {"token_keep": learning}
            loss, st = self.policy_loss(logprobs, old, batch["advantages"], batch["mask"],
                                        getattr(algo, self.policy_loss.section),  # the loss's own settings
                                        aggregation=algo.loss_aggregation, max_len=self.max_response_len,
                                        weights=weights, **keep)
            entropy = algos.masked_mean(per_token.entropy, batch["mask"])
            bonus = entropy if learning is None else algos.masked_mean(per_token.entropy, learning)
            total = loss - algo.entropy_coef * bonus  # the bonus on the tokens that learn, as TRL's
            if not self.kl_in_reward and "ref_logprobs" in batch:
                kl_l, _ = algos.kl_loss(logprobs, batch["ref_logprobs"], batch["mask"], estimator=algo.kl.estimator,
                                        aggregation=algo.loss_aggregation, max_len=self.max_response_len,
                                        log_ratio_clip=algo.kl.log_ratio_clip)
                total = total + self.kl_ctl.value * kl_l
        self.acc.backward(total * scale)
        return {"loss/policy_avg": loss.detach(), "policy/entropy_avg": entropy.detach(),
                "policy/clipfrac_avg": st["clipfrac"], "policy/approxkl_avg": st["approxkl"],
                "val/ratio": st["ratio_mean"], "val/ratio_var": st["ratio_var"],
                **{f"policy/{k}": st[k] for k in ("clip_low_frac", "clip_high_frac") if k in st},
                **({"policy/high_entropy_frac": algos.masked_mean(learning.float(), batch["mask"])}
                   if learning is not None else {}),
                **({"logprobs": old} if on_policy else {})}

    def high_entropy_tokens(self, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``algos.high_entropy_mask`` with ``algo.top_entropy_quantile``; the threshold is taken over every
        process's tokens of this micro-batch, one threshold for all (TRL gathers them as well)."""
        entropy = entropy.detach()
        pool = None
        if self.acc.num_processes > 1:
            pool = gather_rows(self.acc, entropy[mask.bool()].float().unsqueeze(-1)).squeeze(-1)
        return algos.high_entropy_mask(entropy, mask, self.cfg.algo.top_entropy_quantile, pool=pool)

    def fold_correction(self, batch: dict, old: torch.Tensor) -> None:
        """The off-policy correction of an on-policy micro-batch (see :meth:`plan`), into ``batch``: its weights
        and the mask it keeps (the critic's step after it reads the same), as ``advantages`` composes them for a
        step with a separate old forward (``Experience.compose_loss_mask``)."""
        algo = self.cfg.algo
        weights, keep = algos.OFF_POLICY_CORRECTIONS[algo.correction](old, batch.pop("rollout_logprobs"),
                                                                      batch["mask"], algo.off_policy)
        batch["mask"] = keep
        batch["advantages"] = batch["advantages"] * keep
        if weights is not None:
            batch["is_weights"] = weights * keep

    def critic_micro_step(self, batch: dict, scale: float) -> dict:
        with self.acc.autocast():
            values = response_values(self.critic, batch)
            loss, st = algos.value_loss(values, batch["values"], batch["returns"], batch["mask"],
                                        clip_range=self.cfg.algo.value_clip)
        self.acc.backward(self.cfg.algo.vf_coef * loss * scale)
        return {"loss/value_avg": loss.detach(), "val/clipfrac_avg": st["clipfrac"]}

    def ppo_update(self, exp: Experience, step: int) -> dict:
        """Step 6; with ``on_policy_update``, ``exp.old_logprobs`` is set from the update's own log-probs."""
        algo, mb = self.cfg.algo, self.cfg.train.batch_size
        n = len(exp.rollout)
        stats: list[dict] = []
        ratio = torch.zeros(1 + len(RATIO_KEYS), dtype=torch.float64, device=self.device)  # tokens, weighted sums
        norms: list[float] = []  # the policy's gradient norm of each update (TRL's grad_norm: their mean)
        own = torch.zeros_like(exp.action) if exp.old_logprobs is None else None
        fold = own is not None and self.cfg.algo.correction != "none"  # the correction in each micro-batch
        g = torch.Generator().manual_seed(self.cfg.train.seed * 7919 + step)
        self.policy.train()
        self.phases.phase("update", total=algo.ppo_epochs * math.ceil(n / algo.mini_batch_size))
        update = step * self.updates_per_step  # the run's optimizer updates before this step's (callbacks)
        for _ in range(algo.ppo_epochs):
            order = torch.randperm(n, generator=g).to(self.device)
            for m0 in range(0, n, algo.mini_batch_size):
                self.run.tell("on_step_begin", update)
                mini = order[m0: m0 + algo.mini_batch_size]
                micro_n = math.ceil(len(mini) / mb)
                for i, s in enumerate(range(0, len(mini), mb)):
                    batch = exp.rows_of(mini[s: s + mb])
                    if fold:
                        batch["rollout_logprobs"] = exp.rollout.logprobs[mini[s: s + mb]]
                    last = i == micro_n - 1
                    st = {}
                    with (contextlib.nullcontext() if last else self.acc.no_sync(self.policy)):
                        st.update(self.policy_micro_step(batch, 1.0 / micro_n))
                    if own is not None:
                        own[mini[s: s + mb]] = st.pop("logprobs")
                    tokens = batch["mask"].sum().double()
                    ratio += torch.stack([tokens, *(torch.as_tensor(st.pop(k), dtype=torch.float64, device=self.device)
                                                    * tokens for k in RATIO_KEYS)])
                    if self.critic is not None:
                        with (contextlib.nullcontext() if last else self.acc.no_sync(self.critic)):
                            st.update(self.critic_micro_step(batch, 1.0 / micro_n))
                    stats.append(st)
                norm = clip_and_step(self.acc, self.policy, self.opt, self.sched, self.cfg.optim.max_grad_norm)
                if norm is not None:
                    norms.append(float(norm))
                update += 1
                if self.run.callbacks:  # what TRL's callbacks and TrainOutput read (one host copy, only then)
                    losses = [x["loss/policy_avg"] for x in stats[-micro_n:]]
                    self.run.tell("on_update", update, {"tokens": self.tokens_seen, "rows": len(mini),
                                                        "prompts": len({id(exp.rows[i]) for i in mini.tolist()}),
                                                        "loss": float(torch.stack(losses).mean())})
                if self.critic is not None:
                    clip_and_step(self.acc, self.critic, self.critic_opt, self.critic_sched,
                                  self.cfg.optim.max_grad_norm)
                self.phases.advance()
        if own is not None:
            exp.old_logprobs = own
        out = mean_stats(self.acc, stats)
        if norms:
            out["policy/grad_norm"] = sum(norms) / len(norms)  # the same on every process (after the all-reduce)
        return {**out, **self.ratio_stats(ratio), **self.clip_extremes(stats)}

    def ratio_stats(self, sums: torch.Tensor) -> dict:
        """The importance ratio's stats of the step (:data:`RATIO_KEYS`), token means over every process's tokens in
        the loss; none at all when no token was (every sample dropped): no update moved the policy, so there is no
        ratio to report (a 0 would read as a policy that moved too far)."""
        sums = self.acc.reduce(sums, "sum") if self.acc.num_processes > 1 else sums
        tokens, *weighted = sums.tolist()
        return {k: v / tokens for k, v in zip(RATIO_KEYS, weighted)} if tokens > 0 else {}

    def clip_extremes(self, stats: list[dict]) -> dict:
        """TRL's ``clip_ratio/low_min`` and ``high_max``: the lowest / highest of the processes' own clipped
        fractions (each process's mean over its micro-batches); one gather with several processes."""
        if not stats or "policy/clip_low_frac" not in stats[0]:
            return {}
        local = torch.stack([torch.stack([torch.as_tensor(s[k], dtype=torch.float32, device=self.device).mean()
                                          for s in stats]).mean()
                             for k in ("policy/clip_low_frac", "policy/clip_high_frac")])
        every = self.acc.gather(local.unsqueeze(0)) if self.acc.num_processes > 1 else local.unsqueeze(0)
        return {"policy/clip_low_frac_min": float(every[:, 0].min()),
                "policy/clip_high_frac_max": float(every[:, 1].max())}

