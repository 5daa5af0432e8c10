"""``rlhfkit plan CONFIG [overrides] [--gpu-memory 80GiB] [--world-size N]``: will this run fit, before anything loads.

Two parts, both without loading weights:

1. **Memory**: the models of the recipe (policy, reference, reward model, critic) read from ``config.json`` /
   GGUF header / ``tiny:`` spec, the strategy (``distributed.strategy``; DeepSpeed as ``zero2`` / ``zero3`` from
   its config), the world size, dtypes, LoRA / QLoRA, offload, micro-batch and lengths, through
   :func:`rlhfkit.models.memory.estimate`: per-device bytes of each phase with the formula of every figure, the
   peak, whether it fits ``--gpu-memory``, and when it does not, which single changes (or which combination)
   would make it fit, each with the override to write.
2. **Pre-flight checks** that fail in seconds rather than after loading: batch divisibility against the data, chat
   template prefix stability (a prompt rendered alone is a token prefix of prompt + answer), EOS distinct from pad,
   the reward model's tokenizer against the policy's, and the longest sample against ``data.max_length`` and the
   model's context. Checks that need a tokenizer or data are skipped (and say so) when those are absent.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .config import RECIPES, replace
from .errors import ModelError, UserError
from .models.memory import (
    Architecture,
    ModelRole,
    Phase,
    Setup,
    estimate,
    fmt_bytes,
    read_architecture,
    role_params,
    weight_bytes_of,
)


@dataclass
class Check:
    status: str  # ok | warn | fail | skip
    name: str
    message: str


@dataclass
class Plan:
    recipe: str
    arch: Architecture
    setup: Setup
    roles: list[ModelRole]
    phases: list[Phase]
    gpu_memory: float | None
    suggestions: list[tuple[str, float]] = field(default_factory=list)  # (overrides, peak): alone, then combined
    checks: list[Check] = field(default_factory=list)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    @property
    def fits(self) -> bool | None:
        return None if self.gpu_memory is None else self.peak.total <= self.gpu_memory

    def render(self) -> str:
        a, s = self.arch, self.setup
        lines = [f"rlhfkit plan: {self.recipe} on {a.source}",
                 f"  model: {a.model_type or 'decoder'}, {role_params(self.roles[0]) / 1e9:.3f}B parameters "
                 f"({a.layers} layers, hidden {a.hidden}, intermediate {a.intermediate}, heads {a.heads}/"
                 f"{a.kv_heads} kv, vocab {a.vocab}, {'tied' if a.tied else 'untied'} embeddings, context "
                 f"{a.context})",
                 f"  strategy {s.strategy} x {s.world} device(s), {s.device}"
                 + (", bf16 autocast" if s.device == "cuda" and s.autocast else "")
                 + f", micro-batch {s.micro_batch} x {s.seq_len} tokens"
                 + (", gradient checkpointing" if s.gradient_checkpointing else "")
                 + (", CPU offload" if s.offload else "")
                 + (f", rollout {s.rollout_batch} sequences x ({s.prompt_len} + {s.new_tokens}) tokens"
                    if s.rollout_batch else ""),
                 "  models: " + ", ".join(f"{r.name} ({r.trainable}, {r.weight_bytes:g} B/param"
                                          + (", off the device" if r.offloaded else "") + ")" for r in self.roles),
                 ""]
        for ph in self.phases:
            lines.append(f"phase: {ph.name}{' (peak)' if ph is self.peak else ''}")
            width = max(len(k) for k in ph.items)
            for k, v in ph.items.items():
                lines.append(f"  {k:<{width}}  {fmt_bytes(v):>11}   {ph.how.get(k, '')}")
            lines.append(f"  {'total':<{width}}  {fmt_bytes(ph.total):>11}")
            lines.append("")
        peak = self.peak
        verdict = f"peak per device: {fmt_bytes(peak.total)} ({peak.name})"
        if self.gpu_memory is not None:
            pct = 100 * peak.total / self.gpu_memory
            verdict += (f": fits in {fmt_bytes(self.gpu_memory)} ({pct:.0f}% used)" if self.fits else
                        f": does NOT fit in {fmt_bytes(self.gpu_memory)} ({pct:.0f}%)")
        lines.append(verdict)
        if self.gpu_memory is not None and not self.fits:
            lines.append("what a change gives (peak per device; the last line combines changes until one fits):")
            lines.extend(f"  {'fits' if p <= self.gpu_memory else 'no':<4}  {fmt_bytes(p):>11}  {o}"
                         for o, p in self.suggestions)
            if not any(p <= self.gpu_memory for _, p in self.suggestions):
                lines.append("  nothing considered here fits: more devices (--world-size) or a smaller model")
        lines.append("estimates: activations counted per tensor autograd keeps (models/memory.py); validated "
                     "within 25% of measured CPU peaks, CUDA terms not measured here")
        if self.checks:
            lines.append("")
            lines.append("pre-flight checks:")
            lines.extend(f"  {c.status:<4}  {c.name}: {c.message}" for c in self.checks)
        return "\n".join(lines)


# ───────────────────────────────────────────────── memory ─────────────────────────────────────────────────────


def _strategy(cfg) -> str:
    dist = cfg.distributed
    if dist.strategy != "deepspeed":
        return dist.strategy
    name = dist.deepspeed_config
    if name in ("zero2", "zero3"):
        return name
    try:
        stage = json.loads(Path(name).read_text()).get("zero_optimization", {}).get("stage", 2)
    except (OSError, json.JSONDecodeError):
        stage = 2
    return "zero3" if int(stage) == 3 else "zero2"


def _arch_or_policy(name: str | None, policy: Architecture, notes: list[Check], what: str) -> Architecture:
    if not name:
        return policy
    try:
        return read_architecture(name)
    except ModelError:
        notes.append(Check("warn", what, f"{name} has no config.json yet: sized as the policy"))
        return policy


def roles_of(cfg, device: str, notes: list[Check]) -> list[ModelRole]:
    """The models a run holds and how: what the recipe's loader does, as arithmetic."""
    from . import algos

    family = RECIPES[cfg.recipe].family
    policy = read_architecture(cfg.model.name, cfg.model.gguf_file)
    lora = cfg.model.lora.enabled
    trainable = "lora" if lora else "full"
    wb = weight_bytes_of(cfg.model.dtype, trainable=trainable, device=device, qlora=cfg.model.lora.qlora)
    frozen_wb = weight_bytes_of(cfg.model.dtype, trainable="frozen", device=device)
    if family == "reward":
        return [ModelRole("reward model", policy, trainable, wb, head="scalar")]
    roles = [ModelRole("policy", policy, trainable, wb)]
    if family == "preference":
        spec = algos.PREFERENCE_LOSSES[cfg.algo.loss]
        if spec.needs_reference and not (lora and cfg.ref_model in (None, cfg.model.name)):
            ref = _arch_or_policy(cfg.ref_model, policy, notes, "reference model")
            pre = cfg.algo.reference == "precompute"
            roles.append(ModelRole("reference", ref, "frozen", frozen_wb, sharded=False, offloaded=pre,
                                   note="log-probs precomputed before training, then freed" if pre else ""))
    elif family == "online":
        use_kl = cfg.algo.kl.coef > 0 or cfg.algo.kl.adaptive
        if use_kl and not (lora and cfg.ref_model is None):
            ref = _arch_or_policy(cfg.ref_model, policy, notes, "reference model")
            roles.append(ModelRole("reference", ref, "frozen", frozen_wb, sharded=False,
                                   offloaded=cfg.memory.offload_reference))
        if cfg.reward.model:
            rm = _arch_or_policy(cfg.reward.model, policy, notes, "reward model")
            roles.append(ModelRole("reward", rm, "frozen", frozen_wb, head="scalar", sharded=False,
                                   offloaded=cfg.memory.offload_reward))
        if algos.ADVANTAGE_ESTIMATORS[cfg.algo.advantage].needs_critic:
            source = cfg.critic.model or (cfg.reward.model if cfg.critic.init == "reward" else None)
            critic = _arch_or_policy(source, policy, notes, "critic")
            roles.append(ModelRole("critic", critic, trainable, wb, head="scalar"))
    return roles


def setup_of(cfg, world: int, device: str) -> Setup:
    family = RECIPES[cfg.recipe].family
    mp = cfg.train.mixed_precision
    autocast = device == "cuda" and mp in ("auto", "bf16", "fp16")
    d = cfg.data
    kw: dict = {}
    if family == "online":
        prompt = d.max_prompt_length or d.max_length
        new = cfg.generation.max_new_tokens
        kw = {"rollout_batch": cfg.generation.batch_size or cfg.algo.rollout_batch_size * cfg.algo.num_generations,
              "prompt_len": prompt, "new_tokens": new, "seq_len": prompt + new}
    else:
        kw = {"seq_len": d.max_length}
    lora = cfg.model.lora
    return Setup(strategy=_strategy(cfg), world=world, device=device, autocast=autocast,
                 gradient_checkpointing=cfg.model.gradient_checkpointing, offload=cfg.distributed.cpu_offload,
                 lora_r=lora.r, lora_targets=tuple(lora.target_modules) if lora.target_modules else None,
                 micro_batch=cfg.train.batch_size, **kw)


def _estimate(cfg, world: int, device: str, notes: list[Check]) -> tuple[list[ModelRole], Setup, list[Phase]]:
    roles = roles_of(cfg, device, notes)
    setup = setup_of(cfg, world, device)
    return roles, setup, estimate(roles, setup, RECIPES[cfg.recipe].family)


def _peak(cfg, world: int, device: str) -> float:
    return max(p.total for p in _estimate(cfg, world, device, [])[2])


def suggest(cfg, world: int, device: str, budget: float) -> list[tuple[str, float]]:
    """Changes (as overrides) that bring the peak under ``budget``: each alone, then cumulatively in order."""
    candidates: list[tuple[str, dict]] = []
    if not cfg.model.gradient_checkpointing:
        candidates.append(("model.gradient_checkpointing=true", {"model": {"gradient_checkpointing": True}}))
    if cfg.train.batch_size > 1:
        b = max(1, cfg.train.batch_size // 2)
        if RECIPES[cfg.recipe].family == "online":  # an update already accumulates mini_batch_size / batch_size
            candidates.append((f"train.batch_size={b}", {"train": {"batch_size": b}}))
        else:
            ga = cfg.train.grad_accum * (cfg.train.batch_size // b)
            candidates.append((f"train.batch_size={b} train.grad_accum={ga}",
                               {"train": {"batch_size": b, "grad_accum": ga}}))
    if world > 1 and cfg.distributed.strategy == "ddp" and not cfg.model.lora.enabled:
        candidates.append(("distributed.strategy=fsdp2", {"distributed": {"strategy": "fsdp2"}}))
    if (world > 1 and not cfg.model.lora.enabled and device == "cuda" and cfg.train.grad_accum == 1
            and RECIPES[cfg.recipe].family != "online"):
        candidates.append(("distributed.strategy=deepspeed distributed.deepspeed_config=zero3",
                           {"distributed": {"strategy": "deepspeed", "deepspeed_config": "zero3"}}))
    if device == "cuda" and cfg.distributed.strategy != "ddp" and not cfg.distributed.cpu_offload:
        candidates.append(("distributed.cpu_offload=true", {"distributed": {"cpu_offload": True}}))
    if hasattr(cfg, "memory"):
        if not cfg.memory.offload_reference:
            candidates.append(("memory.offload_reference=true", {"memory": {"offload_reference": True}}))
        if cfg.reward.model and not cfg.memory.offload_reward:
            candidates.append(("memory.offload_reward=true", {"memory": {"offload_reward": True}}))
    if not cfg.model.lora.enabled:
        candidates.append(("model.lora.enabled=true", {"model": {"lora": {"enabled": True}},
                                                       "distributed": {"strategy": "ddp"}}))
    if device == "cuda" and not cfg.model.lora.qlora:
        candidates.append(("model.lora.enabled=true model.lora.qlora=true",
                           {"model": {"lora": {"enabled": True, "qlora": True}}, "distributed": {"strategy": "ddp"}}))
    out: list[tuple[str, float]] = []
    for text, change in candidates:  # each change alone
        out.append((text, _peak(replace(cfg, **change), world, device)))
    acc, texts = cfg, []
    for text, change in candidates:  # cumulatively, cheapest first, until it fits
        if "qlora" in text:
            continue
        acc, peak = replace(acc, **change), None
        texts.append(text)
        peak = _peak(acc, world, device)
        if peak <= budget:
            if len(texts) > 1:
                out.append((" ".join(texts), peak))
            break
    return out


# ───────────────────────────────────────────────── pre-flight checks ──────────────────────────────────────────


def _tokenizer(mcfg):
    from .models.loading import load_tokenizer_for

    try:
        return load_tokenizer_for(mcfg), None
    except UserError:
        return None, f"none loadable from {mcfg.name}"


def _records(cfg, kind: str, limit: int = 2000):
    from .data import load_dataset_records

    d = cfg.data
    fmt = kind if d.format == "auto" else d.format
    return load_dataset_records(d.train, fmt, fields=d.fields or None, split=d.split,
                                limit=min(limit, d.limit or limit))


def _conversations(kind: str, rec: dict) -> tuple[list[dict], list[dict]]:
    """(prompt messages, answer messages) of a normalised record (a placeholder answer for prompt records)."""
    if kind == "sft" and "messages" in rec:
        msgs = rec["messages"]
        last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=len(msgs))
        return msgs[:last], msgs[last:last + 1]
    if kind == "preference":
        return rec["prompt"], rec["chosen"]
    if kind == "unpaired":
        return rec["prompt"], rec["completion"]
    if kind == "prompt":
        return rec["prompt"], [{"role": "assistant", "content": "ok"}]
    return [], []


def preflight(cfg, arch: Architecture, world: int) -> list[Check]:
    """Checks that need only the config, the tokenizer and the data (each one skipped, with why, when absent)."""
    from .data.chat import render_conversation, render_prompt_ids

    family = RECIPES[cfg.recipe].family
    kind = {"supervised": "sft", "reward": "preference", "online": "prompt"}.get(family, "preference")
    if family == "preference" and cfg.algo.loss == "kto":
        kind = "unpaired"
    checks: list[Check] = []
    tok, why = _tokenizer(cfg.model)
    if tok is None:
        checks.append(Check("skip", "tokenizer checks", f"no tokenizer: {why}"))
    else:
        if tok.pad_token_id == tok.eos_token_id:
            checks.append(Check("warn", "EOS vs pad", f"pad is EOS ({tok.eos_token!r}, id {tok.eos_token_id}): "
                                "masks never read pad ids, but a tool that masks pad would hide the EOS to learn"))
        else:
            checks.append(Check("ok", "EOS vs pad", f"EOS {tok.eos_token!r} ({tok.eos_token_id}) differs from pad "
                                f"{tok.pad_token!r} ({tok.pad_token_id})"))
        if getattr(cfg, "reward", None) is not None and cfg.reward.model:
            from .rewards.model import same_tokenizer

            rm_tok, why_rm = _tokenizer(replace(cfg.model, name=cfg.reward.model, gguf_file=None, chat_template=None))
            if rm_tok is None:
                checks.append(Check("skip", "reward-model tokenizer", f"not readable yet ({why_rm})"))
            elif same_tokenizer(tok, rm_tok):
                checks.append(Check("ok", "reward-model tokenizer", "same as the policy's: responses scored on ids"))
            else:
                checks.append(Check("warn", "reward-model tokenizer", "differs from the policy's: responses are "
                                    "decoded and re-tokenised for scoring (slower; fine when intended)"))
    if not cfg.data.train:
        checks.append(Check("skip", "data checks", "no data.train given"))
        return checks
    try:
        records = _records(cfg, kind)
    except UserError as err:
        checks.append(Check("fail", "data", err.one_line()))
        return checks
    n = len(records)
    if family == "online":
        per = cfg.algo.rollout_batch_size * world
        status = "ok" if n >= per else "fail"
        checks.append(Check(status, "batch divisibility",
                            f"{n}{'+' if n == cfg.data.limit else ''} prompts, rollout batch "
                            f"{cfg.algo.rollout_batch_size} x {world} device(s) = {per} prompts per step; rollout "
                            f"{cfg.algo.rollout_batch_size * cfg.algo.num_generations} responses -> mini-batches "
                            f"of {cfg.algo.mini_batch_size} -> micro-batches of {cfg.train.batch_size}"))
    else:
        per = cfg.train.batch_size * world
        gb = per * cfg.train.grad_accum
        status = "ok" if n >= gb else "fail"
        checks.append(Check(status, "batch divisibility",
                            f"global batch = {cfg.train.batch_size} x {cfg.train.grad_accum} accumulation x {world} "
                            f"device(s) = {gb}; {n} records read -> {n // gb} updates per epoch"
                            + ("" if status == "ok" else " (fix: lower train.batch_size / grad_accum or add data)")))
    if tok is None:
        return checks
    bad, longest, where = 0, 0, ""
    for i, rec in enumerate(records):
        prompt, answer = _conversations(kind, rec)
        try:
            if kind == "sft" and "text" in rec:
                length = len(tok(rec["text"], add_special_tokens=False)["input_ids"])
            else:
                p_ids = render_prompt_ids(tok, prompt) if prompt else []
                full, _ = render_conversation(tok, prompt + answer) if answer else (p_ids, None)
                if i < 50 and full[: len(p_ids)] != p_ids:
                    bad += 1
                length = len(p_ids) if kind == "prompt" else len(full)
        except UserError as err:
            checks.append(Check("fail", "chat template", err.one_line()))
            return checks
        if length > longest:
            longest, where = length, getattr(rec, "where", f"record {i}")
    checks.append(Check("ok" if bad == 0 else "fail", "template prefix stability",
                        "a prompt rendered alone is a token prefix of prompt + answer" if bad == 0 else
                        f"{bad} of the first {min(50, n)} prompts render differently alone than inside the "
                        "conversation: the model would be trained and sampled on different prefixes "
                        "(fix: a chat template whose prompt rendering is a prefix, model.chat_template)"))
    limit = (cfg.data.max_prompt_length or cfg.data.max_length) if kind == "prompt" else cfg.data.max_length
    key = "data.max_prompt_length" if kind == "prompt" and cfg.data.max_prompt_length else "data.max_length"
    status = "ok" if longest <= limit else "warn"
    checks.append(Check(status, "longest sample", f"{longest} tokens ({where}) vs {key}={limit}"
                        + ("" if status == "ok" else f" (over-long ones: data.overflow={cfg.data.overflow})")))
    new = cfg.generation.max_new_tokens if family == "online" else 0
    longest_seq = min(longest, limit) + new
    checks.append(Check("ok" if longest_seq <= arch.context else "fail", "context",
                        f"longest sequence {min(longest, limit)}" + (f" + {new} new tokens" if new else "")
                        + f" = {longest_seq} tokens vs the model's context {arch.context}"
                        + ("" if longest_seq <= arch.context else f" (fix: lower {key}"
                           + (" or generation.max_new_tokens)" if new else ")"))))
    return checks


def plan(cfg, *, world: int | None = None, gpu_memory: float | None = None, device: str = "cuda",
         checks: bool = True) -> Plan:
    """The plan of ``cfg`` (see the module docstring); nothing is loaded but config.json / tokenizer / data."""
    world = world or int(os.environ.get("WORLD_SIZE", "1"))
    notes: list[Check] = []
    roles, setup, phases = _estimate(cfg, world, device, notes)
    p = Plan(recipe=cfg.recipe, arch=roles[0].arch, setup=setup, roles=roles, phases=phases, gpu_memory=gpu_memory)
    if gpu_memory is not None and not p.fits:
        p.suggestions = suggest(cfg, world, device, gpu_memory)
    p.checks = notes + (preflight(cfg, p.arch, world) if checks else [])
    return p
