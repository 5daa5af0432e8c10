"""``rlhfkit plan [RECIPE] CONFIG [overrides] [--gpu-memory 80GiB] [--world-size N]``: will this run fit, before
anything loads.

Two parts, both without loading weights:

1. **Memory**: the models of the recipe (policy, reference, reward model, critic) read from ``config.json`` /
   GGUF header / ``tiny:`` spec, the strategy (``distributed.strategy``; DeepSpeed as ``zero2`` / ``zero3`` from
   its config), the world size, dtypes, LoRA / QLoRA, offload, micro-batch and lengths, through
   :func:`rlhfkit.models.memory.estimate`: per-device bytes of each phase with the formula of every figure, the
   peak, whether it fits ``--gpu-memory``, and when it does not, what each change gives alone and the cheapest
   change that fits (:func:`cheapest_fit`: a best-first search over :func:`levers_of` by cost, combining levers
   where one alone does not fit), printed as the one command line that applies it.
2. **Pre-flight checks** that fail in seconds rather than after loading: batch divisibility against the data, chat
   template prefix stability (a prompt rendered alone is a token prefix of prompt + answer), EOS distinct from pad,
   the reward model's tokenizer against the policy's, and the longest sample against ``data.max_length`` and the
   model's context. Checks that need a tokenizer or data are skipped (and say so) when those are absent.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import RECIPES, replace
from .errors import ModelError, UserError
from .models.memory import (
    Architecture,
    ModelRole,
    Phase,
    Setup,
    cache_summary,
    estimate,
    fmt_bytes,
    host_bytes,
    model_states,
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
    suggestions: list[tuple[str, float]] = field(default_factory=list)  # (overrides, peak): each lever alone
    checks: list[Check] = field(default_factory=list)
    fit: Fit | None = None  # the cheapest change that fits (when the run does not)
    command: str = ""  # the command line that was planned (``rlhfkit RECIPE [config] [overrides]``)
    fit_roles_setup: Any = None  # () -> (roles, setup) of the fit, for its host memory

    def fix_command(self) -> str | None:
        """The one command line that runs with :attr:`fit` applied (``accelerate launch`` for more devices)."""
        if self.fit is None:
            return None
        import shlex

        changed = {k for k, _ in self.fit.overrides}
        words = [w for w in shlex.split(self.command or f"rlhfkit {self.recipe}") if w.split("=", 1)[0] not in changed]
        line = f"{shlex.join(words)} {self.fit.text()}"  # the user's own value of a key the fix sets is left out
        if self.fit.world > 1:
            line = f"accelerate launch --num_processes {self.fit.world} -m rlhfkit.cli " + line.removeprefix("rlhfkit ")
        return line

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
                 f"{a.context})" + (f"; vision tower {a.tower.params / 1e6:.1f}M parameters "
                                    f"({'trained' if s.train_vision else 'frozen'}), {a.tower.tokens} image tokens "
                                    f"per image ({a.tower.note})" if a.tower else ""),
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
        host = host_bytes(self.roles, self.setup)
        if host:
            lines.append(f"host memory for what is off the device: {fmt_bytes(sum(v for v, _ in host.values()))} per "
                         "process (" + "; ".join(f"{name}: {fmt_bytes(v)} of {how}" for name, (v, how) in host.items())
                         + ")")
        peak = self.peak
        verdict = f"peak per device: {fmt_bytes(peak.total)} ({peak.name})"
        if self.gpu_memory is not None:
            pct = 100 * peak.total / self.gpu_memory
            verdict += (f": fits in {fmt_bytes(self.gpu_memory)} ({pct:.0f}% used)" if self.fits else
                        f": does NOT fit in {fmt_bytes(self.gpu_memory)} ({pct:.0f}%)")
        lines.append(verdict)
        if s.cache_tokens:
            lines.append(cache_summary(a, s))
        if self.gpu_memory is not None and not self.fits:
            lines.append("what each change gives alone (peak per device):")
            lines.extend(f"  {'fits' if p <= self.gpu_memory else 'no':<4}  {fmt_bytes(p):>11}  {o}"
                         for o, p in self.suggestions)
            if self.fit is None:
                lines.append("nothing fits, even combining gradient checkpointing, smaller micro-batches, offload, "
                             "QLoRA, shorter sequences and 8x the devices: a smaller model or larger devices")
            else:
                lines.append(f"cheapest change that fits: {self.fit.text()}"
                             + (f" on {self.fit.world} devices" if self.fit.world != self.setup.world else "")
                             + f" -> {fmt_bytes(self.fit.peak)} per device")
                lines.append(f"  {self.fix_command()}")
                fixed_host = host_bytes(*self.fit_roles_setup()) if self.fit_roles_setup else {}
                if fixed_host:
                    lines.append(f"  (it keeps {fmt_bytes(sum(v for v, _ in fixed_host.values()))} in host memory per "
                                 "process: the machine needs that much RAM beside the run's own)")
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
        from .train.online.reference import needs_reference, on_producer

        if needs_reference(cfg) and not (lora and cfg.ref_model is None) and not on_producer(cfg, device == "cuda"):
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
        requests = cfg.algo.rollout_batch_size * cfg.algo.num_generations
        kw = {"rollout_batch": cfg.generation.batch_size or requests, "prompt_len": prompt, "new_tokens": new,
              "seq_len": prompt + new, "offload_optimizer": cfg.memory.offload_optimizer,
              "release_engine_cache": cfg.memory.release_engine_cache, "entropy_grad": cfg.algo.entropy_coef > 0,
              **continuous_cache(cfg, requests, prompt + new, device)}
    else:
        kw = {"seq_len": d.max_length}
    lora = cfg.model.lora
    if family == "online":  # a VLM's images: each prompt's encoded once
        kw["images"] = cfg.algo.rollout_batch_size
    return Setup(strategy=_strategy(cfg), world=world, device=device, autocast=autocast,
                 train_vision=cfg.model.train_vision, train_embeddings=cfg.model.train_embeddings,
                 gradient_checkpointing=cfg.model.gradient_checkpointing, offload=cfg.distributed.cpu_offload,
                 lora_r=lora.r, lora_targets=tuple(lora.target_modules) if lora.target_modules else None,
                 micro_batch=cfg.train.batch_size, **kw)


PAGED_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "gemma3_text", "phi3"})


def engine_of(cfg, requests: int, device: str) -> str:
    """The engine the run's rollouts use: ``generation.engine``, or for ``auto`` the one
    :func:`~rlhfkit.rollout.auto.auto_choice` takes (the paged decoder's coverage read from the model type)."""
    from .rollout.auto import auto_choice

    if cfg.generation.engine != "auto":
        return cfg.generation.engine
    try:
        model_type = read_architecture(cfg.model.name, cfg.model.gguf_file).model_type
    except ModelError:
        model_type = ""
    return auto_choice(device, requests, cfg.generation.max_new_tokens, cfg.generation.batch_size,
                       covered=model_type in PAGED_TYPES and not cfg.model.lora.qlora)[0]


def continuous_cache(cfg, requests: int, length: int, device: str = "cuda") -> dict:
    """The continuous engine's terms of :class:`Setup` (none for another engine; ``auto`` as it chooses on
    ``device``): its slots (``generation.batch_size``, else every request up to 256) and its cache budget
    (``generation.cache_tokens``, else what every slot needs at full length: the engine's own default, which it caps
    on CUDA at a fraction of the free memory)."""
    from .rollout.continuous import MAX_DEFAULT_SLOTS

    if engine_of(cfg, requests, device) != "continuous":
        return {}
    slots = min(requests, cfg.generation.batch_size or MAX_DEFAULT_SLOTS)
    return {"rollout_batch": slots, "requests": requests, "cache_tokens": cfg.generation.cache_tokens or slots * length}


def _estimate(cfg, world: int, device: str, notes: list[Check]) -> tuple[list[ModelRole], Setup, list[Phase]]:
    roles = roles_of(cfg, device, notes)
    setup = setup_of(cfg, world, device)
    phases = estimate(roles, setup, RECIPES[cfg.recipe].family)
    return roles, setup, phases + ([final_save(roles, setup, phases[-1])] if device == "cpu" else [])


def final_save(roles: list[ModelRole], setup: Setup, last: Phase) -> Phase:
    """The end of a run on a CPU, where host memory is the device's: every model's weights and states but its
    gradients (:func:`~rlhfkit.models.memory.model_states`, as between phases), a kept engine cache and, under
    LoRA, the merged weights of the adapted layers (``models.loading.merged_state_dict``: host memory, so on a GPU
    no device phase; safetensors writes from the tensors' memory, no copy of a shard). Measured on the Qwen3-1.7B
    shape (LoRA, bench/real_shapes.py): this phase, not the train step, was the run's peak."""
    ph = Phase("final save")
    for role in roles:
        for key, (value, how) in model_states(role, setup).items():
            if not key.endswith("gradients"):
                ph.add(key, value, how)
    kept = "rollout engine's KV cache (kept)"
    if kept in last.items:
        ph.add(kept, last.items[kept], last.how[kept])
    policy = roles[0]
    if policy.trainable == "lora":
        merged = policy.arch.layers * policy.arch.layer_params()
        ph.add("policy merged weights (adapted layers)", merged * policy.weight_bytes,
               f"{merged / 1e9:.2f}B x {policy.weight_bytes:g} B (LoRA merged into a copy, host memory)")
    return ph


def _peak(cfg, world: int, device: str) -> float:
    return max(p.total for p in _estimate(cfg, world, device, [])[2])


@dataclass(frozen=True)
class Lever:
    """One way to lower the peak: its settings from the mildest to the strongest, each as (cost, overrides, world
    size). Costs add up across levers; they rank what a change takes from the run: a little speed (gradient
    checkpointing 1, a smaller generation or training micro-batch 0.5 per halving, the continuous engine's cache
    0.25 + 0.5 per halving of the tokens), a host transfer per step
    (offloading a frozen model 2, CPU offload 3), what is trained (LoRA 4, QLoRA 5), more hardware (7 per doubling
    of the devices, sharded), the task itself (6 per halving of the sequence length)."""

    name: str
    steps: tuple[tuple[float, tuple[tuple[str, Any], ...], int], ...]


def _halvings(start: int, n: int) -> list[int]:
    out, b = [], start
    while b > 1 and len(out) < n:
        b = max(1, b // 2)
        out.append(b)
    return out


def levers_of(cfg, world: int, device: str) -> list[Lever]:
    """The levers that apply to ``cfg`` (those already pulled are left out), cheapest first."""
    family = RECIPES[cfg.recipe].family
    online = family == "online"
    levers: list[Lever] = []

    def lever(name: str, *steps: tuple[float, dict, int | None]) -> None:
        if steps:
            levers.append(Lever(name, tuple((c, tuple(o.items()), w or world) for c, o, w in steps)))

    if not cfg.model.gradient_checkpointing:
        lever("gradient checkpointing", (1, {"model.gradient_checkpointing": True}, None))
    if online:
        full = cfg.generation.batch_size or cfg.algo.rollout_batch_size * cfg.algo.num_generations
        lever("generation micro-batch", *[(0.5 * (i + 1), {"generation.batch_size": b}, None)
                                          for i, b in enumerate(_halvings(full, 6))])
        length = (cfg.data.max_prompt_length or cfg.data.max_length) + cfg.generation.max_new_tokens
        budget = cfg.generation.cache_tokens or full * length
        if cfg.generation.engine == "continuous" or not cfg.generation.engine_kwargs:  # (another engine's settings
            lever("continuous batching, token-budget cache", *[  # would not carry over)
                # answers shorter than the limit share the budget; + 0.25 over a micro-batch halving: an engine
                # whose GPU speed is still to be measured (bench/vs_trl.py) is not preferred at equal effect
                (0.5 * (i + 1) + 0.25, {"generation.engine": "continuous", "generation.cache_tokens": t}, None)
                for i, t in enumerate(_halvings(budget, 4)) if t >= length])
    steps = []
    for i, b in enumerate(_halvings(cfg.train.batch_size, 3)):
        o: dict = {"train.batch_size": b}
        if not online:  # the same batch per update: more accumulation
            o["train.grad_accum"] = cfg.train.grad_accum * (cfg.train.batch_size // b)
        steps.append((0.5 * (i + 1), o, None))
    lever("training micro-batch", *steps)
    if online and not cfg.memory.offload_reference:
        lever("offload the reference", (2, {"memory.offload_reference": True}, None))
    if online and cfg.reward.model and not cfg.memory.offload_reward:
        lever("offload the reward model", (2, {"memory.offload_reward": True}, None))
    if online and not cfg.memory.release_engine_cache:
        lever("release the engine's cache after each rollout", (0.5, {"memory.release_engine_cache": True}, None))
    if online and not cfg.memory.offload_optimizer and cfg.distributed.strategy != "deepspeed":
        lever("optimizer state in host memory while generating", (2, {"memory.offload_optimizer": True}, None))
    if device == "cuda" and not cfg.distributed.cpu_offload:
        if cfg.distributed.strategy != "ddp":
            lever("CPU offload", (3, {"distributed.cpu_offload": True}, None))
        elif not cfg.model.lora.enabled:  # all weights still trained: FSDP2 keeps them in host memory, one GPU too
            lever("CPU offload", (3, {"distributed.strategy": "fsdp2", "distributed.cpu_offload": True}, None))
    lora = []
    if not cfg.model.lora.enabled:
        lora.append((4, {"model.lora.enabled": True}, None))
    if device == "cuda" and not cfg.model.lora.qlora:
        lora.append((5, {"model.lora.enabled": True, "model.lora.qlora": True}, None))
    lever("LoRA / QLoRA", *lora)
    d = cfg.data
    if online:
        lever("response length", *[(6 * (i + 1), {"generation.max_new_tokens": n}, None)
                                   for i, n in enumerate(_halvings(cfg.generation.max_new_tokens, 2)) if n >= 16])
    else:
        lever("sequence length", *[(6 * (i + 1), {"data.max_length": n, **({"data.max_prompt_length": min(
            d.max_prompt_length, n // 2)} if d.max_prompt_length else {})}, None)
            for i, n in enumerate(_halvings(d.max_length, 2)) if n >= 64])
    if not cfg.model.lora.enabled:
        sharded = {"distributed.strategy": "fsdp2"}
        if device == "cuda" and not online and cfg.train.grad_accum == 1:
            sharded = {"distributed.strategy": "deepspeed", "distributed.deepspeed_config": "zero3"}
        lever("shard over more devices", *[(7 * (i + 1), sharded, world * 2 ** (i + 1)) for i in range(3)])
    return levers


def apply_overrides(cfg, overrides: tuple[tuple[str, Any], ...]):
    """``cfg`` with dotted overrides applied (no validation: the planner's own settings)."""
    tree: dict = {}
    for key, value in overrides:
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return replace(cfg, **tree)


@dataclass
class Fit:
    """The cheapest change that fits: its overrides, the world size it needs, the peak it gives, its cost."""

    overrides: tuple[tuple[str, Any], ...]
    world: int
    peak: float
    cost: float

    def text(self) -> str:
        return " ".join(f"{k}={_override_value(v)}" for k, v in self.overrides)


def _override_value(value) -> str:
    return "true" if value is True else "false" if value is False else "null" if value is None else str(value)


def cheapest_fit(cfg, world: int, device: str, budget: float) -> Fit | None:
    """The cheapest combination of lever settings (:func:`levers_of`) whose peak fits ``budget``: a best-first search
    over the levers' settings by total cost, so one lever alone is taken when it fits and levers are combined when
    none does. None when even every lever at its strongest does not fit."""
    import heapq

    levers = levers_of(cfg, world, device)

    cache: dict[tuple[int, ...], tuple[float, tuple, int]] = {}

    def cost_of(state: tuple[int, ...]) -> float:
        return sum(lever.steps[k - 1][0] for lever, k in zip(levers, state) if k)

    def peak_of(state: tuple[int, ...]) -> tuple[float, tuple, int]:
        if state not in cache:
            overrides: dict[str, Any] = {}
            w = world
            for lever, k in zip(levers, state):
                if k:
                    _, o, w_k = lever.steps[k - 1]
                    overrides.update(dict(o))
                    w = max(w, w_k)
            strategy = overrides.get("distributed.strategy")
            refused = (strategy == "fsdp2" and overrides.get("model.lora.enabled")  # not built (config check)
                       or strategy == "deepspeed" and overrides.get("train.grad_accum", cfg.train.grad_accum) != 1)
            peak = math.inf
            if not refused:
                try:
                    peak = _peak(apply_overrides(cfg, tuple(overrides.items())), w, device)
                except UserError:
                    pass
            cache[state] = (peak, tuple(overrides.items()), w)
        return cache[state]

    strongest = tuple(len(lv.steps) for lv in levers)
    variants = [strongest] + [strongest[:i] + (0,) + strongest[i + 1:] for i in range(len(levers))]
    if min(peak_of(s)[0] for s in variants) > budget:
        return None  # nothing fits, whatever is combined (each lever only lowers the peak)
    start = tuple(0 for _ in levers)
    queue, seen = [(0.0, start)], {start}
    while queue:
        cost, state = heapq.heappop(queue)
        peak, overrides, w = peak_of(state)
        if peak <= budget:
            return Fit(overrides, w, peak, cost)
        for i, lever in enumerate(levers):
            if state[i] < len(lever.steps):
                nxt = state[:i] + (state[i] + 1,) + state[i + 1:]
                if nxt not in seen:
                    seen.add(nxt)
                    heapq.heappush(queue, (cost_of(nxt), nxt))
    return None


def suggest(cfg, world: int, device: str, budget: float) -> list[tuple[str, float]]:
    """What the first setting of each lever on these devices gives alone (overrides, peak), for ``plan``'s table
    (more devices come in through :func:`cheapest_fit`)."""
    out = []
    for lever in levers_of(cfg, world, device):
        _, overrides, w = lever.steps[0]
        if w == world:
            out.append((" ".join(f"{k}={_override_value(v)}" for k, v in overrides),
                        _peak(apply_overrides(cfg, overrides), w, device)))
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


def online_mode(cfg, world: int) -> Check:
    """Which mode the online run asks for on ``world`` devices: synchronous (every device generates and updates in
    turn; the default, and the only mode on one device) or producers and learners side by side (``algo.async``)."""
    from .errors import ConfigError
    from .train.online.bridge import layout_of

    k = cfg.algo.async_.max_staleness
    if k == 0:
        more = "; algo.async.max_staleness=1 would run producers and learners side by side" if world > 1 else ""
        return Check("ok", "online mode", f"synchronous: each of {world} device(s) generates, scores and updates in "
                                          f"turn{more}")
    try:
        lay = layout_of(cfg, {"WORLD_SIZE": str(world)})
    except ConfigError as err:
        return Check("fail", "online mode", err.one_line())
    return Check("ok", "online mode", f"asynchronous: {lay.learners} learner(s) and {lay.producers} producer(s), "
                                      f"batches at most {k} update(s) old (the memory above is a learner's as in the "
                                      "synchronous layout, without the reference where the producers take it: "
                                      "algo.async.reference, auto on CPU; a producer holds the policy, the engine "
                                      "and the reward model)")


def preflight(cfg, arch: Architecture, world: int) -> list[Check]:
    """Checks that need only the config, the tokenizer and the data (each one skipped, with why, when absent)."""
    from .data.chat import render_conversation, render_prompt_ids

    family = RECIPES[cfg.recipe].family
    kind = {"supervised": "sft", "reward": "preference", "online": "prompt"}.get(family, "preference")
    if family == "preference" and cfg.algo.loss == "kto":
        kind = "unpaired"
    checks: list[Check] = [online_mode(cfg, world)] if family == "online" else []
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
    except UserError as err:  # memory does not depend on the data: the run itself stops on it, the plan warns
        checks.append(Check("warn", "data", f"{err.one_line()}; the data checks are skipped (the run would stop "
                                            "here)"))
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
         checks: bool = True, command: str = "") -> Plan:
    """The plan of ``cfg`` (see the module docstring); nothing is loaded but config.json / tokenizer / data."""
    from .models.lora import lora_by_default

    cfg = lora_by_default(cfg)  # as the run would: LoRA for a vision-language policy unless set
    world = world or int(os.environ.get("WORLD_SIZE", "1"))
    notes: list[Check] = []
    roles, setup, phases = _estimate(cfg, world, device, notes)
    p = Plan(recipe=cfg.recipe, arch=roles[0].arch, setup=setup, roles=roles, phases=phases, gpu_memory=gpu_memory,
             command=command)
    if gpu_memory is not None and not p.fits:
        p.suggestions = suggest(cfg, world, device, gpu_memory)
        p.fit = cheapest_fit(cfg, world, device, gpu_memory)
        if p.fit is not None:
            fit = p.fit
            p.fit_roles_setup = lambda: _estimate(apply_overrides(cfg, fit.overrides), fit.world, device, [])[:2]
    p.checks = notes + (preflight(cfg, p.arch, world) if checks else [])
    return p
