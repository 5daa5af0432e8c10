"""The batch geometry of an online step, as arithmetic on the config (no torch, no weights): how many prompts and
samples one rollout step makes, how they split into updates and micro-batches, how many updates a step and the run
make (:func:`step_geometry`); TRL's derivation of the same numbers from its own names (:func:`trl_batch`); the
nearest values that divide when they do not (:func:`nearest_divisors`); and the step's lines of the block every
online run starts with (:func:`step_lines`; the block itself, with what it says about TRL's defaults, is
:mod:`.startup`).

rlhfkit and TRL count an online step differently, and the same names give another algorithm unless this is said:

* rlhfkit: ``algo.rollout_batch_size`` prompts **per process** x ``algo.num_generations`` samples; updates of
  ``algo.mini_batch_size`` samples per process, each accumulated from micro-batches of ``train.batch_size``; all of
  it ``algo.ppo_epochs`` times.
* TRL 1.16 (``GRPOConfig.__post_init__``): a generation batch of ``generation_batch_size`` samples over **every**
  process (default ``per_device_train_batch_size x processes x steps_per_generation``, ``steps_per_generation``
  defaulting to ``gradient_accumulation_steps``); an update of ``per_device_train_batch_size x
  gradient_accumulation_steps`` samples per process; ``num_iterations`` passes. So the exact mapping, per process:
  ``train.batch_size = B``, ``algo.mini_batch_size = B x G``, ``algo.rollout_batch_size = N / (K x processes)`` (or
  ``B x S / K``), ``algo.ppo_epochs = I``; and TRL's ``max_steps`` (optimizer updates) is ``train.max_steps``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import textwrap
from dataclasses import dataclass

from ..errors import ConfigError


def launched_world_size() -> int:
    """Processes of the run as the launcher says (``WORLD_SIZE`` under torchrun / accelerate launch), else 1."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


@dataclass(frozen=True)
class Geometry:
    """One online step, per process: ``prompts`` x ``k`` samples, split into ``mini_batches`` updates of ``mini``
    samples (each ``micro_per_update`` micro-batches of ``micro``), ``epochs`` times; ``steps`` rollout steps in the
    run (None: counted from the prompts, not yet read), ``length`` says which setting set it."""

    world: int
    prompts: int
    k: int
    mini: int
    micro: int
    epochs: int
    steps: int | None
    length: str

    @property
    def samples(self) -> int:
        return self.prompts * self.k

    @property
    def mini_batches(self) -> int:
        return self.samples // self.mini

    @property
    def micro_per_update(self) -> int:
        return self.mini // self.micro

    @property
    def updates_per_step(self) -> int:
        return self.epochs * self.mini_batches

    @property
    def updates(self) -> int | None:
        return None if self.steps is None else self.steps * self.updates_per_step


def step_geometry(cfg, world: int = 1, n_prompts: int | None = None) -> Geometry:
    """The geometry of ``cfg``'s online step on ``world`` processes (its divisibility is checked when the config is
    built: :func:`check_split`). The run's length, in rollout steps: ``train.max_steps`` updates when > 0 (rounded
    up to whole steps), else ``algo.total_episodes`` samples over every process, else ``train.epochs`` passes over
    ``n_prompts`` prompts (a pass drops the prompts that do not fill a last step on every process)."""
    algo = cfg.algo
    g = Geometry(world=world, prompts=algo.rollout_batch_size, k=algo.num_generations, mini=algo.mini_batch_size,
                 micro=cfg.train.batch_size, epochs=algo.ppo_epochs, steps=None, length="")
    if cfg.train.max_steps == 0:  # no update: an evaluation of the model as it is (the Python API's evaluate())
        return _with(g, 0, "train.max_steps=0 (no update: an evaluation)")
    if cfg.train.max_steps > 0:
        steps = math.ceil(cfg.train.max_steps / g.updates_per_step)
        return _with(g, steps, f"train.max_steps={cfg.train.max_steps} updates")
    if algo.total_episodes is not None:
        steps = max(1, algo.total_episodes // (g.samples * world))
        return _with(g, steps, f"algo.total_episodes={algo.total_episodes} samples")
    text = f"train.epochs={show_value(cfg.train.epochs)} over the prompts"
    if n_prompts is None:
        return _with(g, None, text)
    per_epoch = n_prompts // (g.prompts * world)
    return _with(g, max(1, int(per_epoch * cfg.train.epochs)), f"{text} ({per_epoch} steps each)")


def _with(g: Geometry, steps: int | None, length: str) -> Geometry:
    return dataclasses.replace(g, steps=steps, length=length)


# ───────────────────────────────────────────────── divisors ───────────────────────────────────────────────────


def divisors(n: int) -> list[int]:
    """Every divisor of ``n`` >= 1, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def nearest(options, target: float) -> list:
    """The option nearest below ``target`` and the one nearest above (one value when ``target`` is an option or
    only one side has any), ascending."""
    options = sorted(set(options))
    below = [o for o in options if o <= target]
    above = [o for o in options if o >= target]
    return sorted({*(below[-1:]), *(above[:1])})


def nearest_divisors(n: int, target: int, multiple_of: int = 1) -> list[int]:
    """The divisors of ``n`` that are multiples of ``multiple_of``, nearest to ``target`` (below and above)."""
    return nearest([d for d in divisors(n) if d % multiple_of == 0], target)


def nearest_multiples(step: int, target: int) -> list[int]:
    """The positive multiples of ``step`` nearest to ``target`` (below and above)."""
    low = (target // step) * step
    return nearest([m for m in (low, low + step) if m > 0], target)


def _or(values) -> str:
    values = list(values)
    return " or ".join(str(v) for v in values)


def check_split(cfg) -> None:
    """The step's samples must split into updates of ``algo.mini_batch_size`` and those into micro-batches of
    ``train.batch_size``; else one line naming the nearest values that divide."""
    algo, micro = cfg.algo, cfg.train.batch_size
    samples, mini = algo.rollout_batch_size * algo.num_generations, algo.mini_batch_size
    what = (f"rollout batch {samples} (= algo.rollout_batch_size {algo.rollout_batch_size} x algo.num_generations "
            f"{algo.num_generations})")
    if samples % mini:
        fixes = []
        minis = nearest_divisors(samples, mini, micro)
        if minis:
            fixes.append(f"algo.mini_batch_size={_or(minis)} (divide {samples}, multiples of train.batch_size={micro})")
        else:  # no update size of whole micro-batches divides the step: a pair of both
            m = nearest_divisors(samples, mini)[-1]
            fixes.append(f"algo.mini_batch_size={m} with train.batch_size={nearest_divisors(m, micro)[0]}")
        if mini % micro == 0:
            step = mini // math.gcd(mini, algo.num_generations)  # rollout sizes whose samples fill whole updates
            fixes.append(f"algo.rollout_batch_size={_or(nearest_multiples(step, algo.rollout_batch_size))}")
        raise ConfigError(f"{what} does not split into updates of algo.mini_batch_size={mini}",
                          where="algo.mini_batch_size", fix="set " + ", or ".join(fixes))
    if mini % micro:
        minis = nearest_divisors(samples, mini, micro)
        raise ConfigError(f"an update of algo.mini_batch_size={mini} samples does not split into micro-batches of "
                          f"train.batch_size={micro}", where="train.batch_size",
                          fix=f"set train.batch_size={_or(nearest_divisors(mini, micro))} (divisors of {mini})"
                              + (f", or algo.mini_batch_size={_or(minis)}" if minis else ""))


# ───────────────────────────────────────────────── TRL's derivation ───────────────────────────────────────────


def trl_batch(per_device: int, k: int, world: int, *, grad_accum: int | None = None,
              generation_batch_size: int | None = None, steps_per_generation: int | None = None,
              source: str = "config") -> dict[str, int]:
    """rlhfkit's ``algo.mini_batch_size`` / ``algo.rollout_batch_size`` (per process) for TRL 1.16's
    ``per_device_train_batch_size`` (B), ``num_generations`` (K), processes, ``gradient_accumulation_steps`` (G),
    ``generation_batch_size`` (N, samples over every process) and ``steps_per_generation`` (S), as
    ``GRPOConfig.__post_init__`` derives them: update = B x G samples per process; N = B x processes x S, S defaulting
    to G when neither N nor S is given. Only the keys given inputs decide are returned (G alone: the update size;
    N or S: the prompts too). A generation batch that is not whole groups on every process is one line naming the
    nearest values that are."""
    if generation_batch_size is not None and steps_per_generation is not None:
        raise ConfigError("'generation_batch_size' and 'steps_per_generation' (TRL) are both set", where=source,
                          fix="give one of them (TRL refuses both too)", key="generation_batch_size")
    out: dict[str, int] = {}
    if grad_accum is not None:
        out["algo.mini_batch_size"] = per_device * grad_accum
    if generation_batch_size is None and steps_per_generation is None:
        return out
    group = k * world
    if generation_batch_size is not None:
        if generation_batch_size % group:
            raise ConfigError(
                f"generation_batch_size={generation_batch_size} (TRL: samples over every process) is not whole groups "
                f"of num_generations={k} on " + (f"each of {world} processes" if world > 1 else "1 process"),
                where=source,
                fix=f"set generation_batch_size={_or(nearest_multiples(group, generation_batch_size))}",
                key="generation_batch_size")
        out["algo.rollout_batch_size"] = generation_batch_size // group
    else:
        samples = per_device * steps_per_generation  # per process
        if samples % k:
            step = k // math.gcd(k, per_device)
            raise ConfigError(
                f"steps_per_generation={steps_per_generation} x per_device_train_batch_size={per_device} = {samples} "
                f"samples per process is not whole groups of num_generations={k}", where=source,
                fix=f"set steps_per_generation={_or(nearest_multiples(step, steps_per_generation))}",
                key="steps_per_generation")
        out["algo.rollout_batch_size"] = samples // k
    return out


# ───────────────────────────────────────────────── the step's lines ───────────────────────────────────────────


def show_value(value) -> str:
    """A setting's value as the config spells it (null, true, 3 for 3.0, [a, b]): the start-up block's lines."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e6:
        return str(int(value))
    if isinstance(value, list):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    return str(value)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def step_lines(cfg, world: int = 1, n_prompts: int | None = None) -> list[str]:
    """The online step's geometry and the run's length, one line each (the start-up block, :mod:`.startup`,
    prints them with what it says about the defaults)."""
    g, name = step_geometry(cfg, world, n_prompts), f"[{cfg.recipe}]"
    where = f"per process, {world} processes" if world > 1 else "1 process"
    lines = [f"{name} step: {_count(g.prompts, 'prompt')} x {_count(g.k, 'generation')} = {g.samples} samples "
             f"({where}) -> "
             f"{g.mini_batches} update{'s' if g.mini_batches > 1 else ''} of {g.mini} samples (micro-batches of "
             f"{g.micro}, {g.micro_per_update} per update) x {g.epochs} PPO epoch{'s' if g.epochs > 1 else ''} = "
             f"{g.updates_per_step} update{'s' if g.updates_per_step > 1 else ''} per step"]
    if g.steps is not None:
        unread = (f"; train.epochs={show_value(cfg.train.epochs)} is not read (it counts only with "
                  "algo.total_episodes=null)"
                  if cfg.algo.total_episodes is not None and cfg.train.max_steps <= 0 and cfg.train.epochs != 1
                  else "")
        lines.append(f"{name} run: {_count(g.steps, 'step')} = {_count(g.updates, 'update')}, from {g.length}{unread}")
    return lines


def step_block(cfg, world: int = 1, n_prompts: int | None = None, width: int = 120) -> str:
    """:func:`step_lines`, wrapped at ``width``."""
    return "\n".join(textwrap.fill(line, width, subsequent_indent="    ", break_on_hyphens=False)
                     for line in step_lines(cfg, world, n_prompts))
