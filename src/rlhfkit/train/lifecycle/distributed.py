"""Distributed strategies: how the trained models are spread over the devices (``distributed.strategy``).

The recipes do not know which one runs; they ask the strategy (:func:`get_strategy`) to

- ``wrap`` a trained model before its optimizer is built (FSDP2 replaces the parameters by sharded ``DTensor`` objects),
- ``prepare`` model and optimizer with the accelerator (DDP wrapping, DeepSpeed engine),
- give full weights for a phase of many forwards without gradients (``gathered``: generation, evaluation) —
  gathered **once** for the phase, not per decode step, then resharded,
- ``save_state`` / ``load_state`` of checkpoints (sharded with torch.distributed.checkpoint under FSDP2),
- return ``full_model``: a plain ``transformers`` model with every weight, on the main process, for the final
  Hugging Face directory (other processes get None).

``ddp``: accelerate's data parallel (the default). ``fsdp2``: PyTorch's ``fully_shard`` driven here, because
accelerate 1.15 ignores its FSDP plugin on CPU (it wraps the model in DDP there), while ``fully_shard`` itself works
on CPU with gloo, so the same path is tested on CPU and used on GPUs. On one device, ``distributed.cpu_offload``
still runs FSDP2 (a group of one process): the parameters, gradients and AdamW states live in host memory and each
layer's weights come to the device for its forward and backward, which is how a full fine-tune of a 7B policy
(about 16 bytes per parameter of model state) trains on one 80 GB GPU. Each decoder layer (the classes a
``transformers`` model lists in ``_no_split_modules``, i.e. what its authors say must not be split) is one FSDP unit,
then the root (embeddings, final norm, LM head or scalar head: tied weights stay in one unit; kept gathered from
forward to backward). Mixed precision follows
``train.mixed_precision`` (bf16: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``), activation
checkpointing follows ``model.gradient_checkpointing``, ``distributed.cpu_offload`` uses ``CPUOffloadPolicy``.
Frozen models (reference, reward) are not sharded: each process holds them whole (bf16 on CUDA).
``deepspeed``: accelerate's DeepSpeed integration with the shipped ``configs/deepspeed/zero{2,3}.json``; under ZeRO-3
generation runs inside ``deepspeed.zero.GatheredParameters`` (gathered once per rollout). Not measured here (no GPU).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
from pathlib import Path

import torch

from ...errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[4] / "configs" / "deepspeed"
SHIPPED_DS = {"zero2": "zero2.json", "zero3": "zero3.json"}


def _world() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def reentrant(gathered):
    """A strategy's ``gathered`` that does nothing inside another ``gathered`` block of the same model: DAPO's
    dynamic sampling gathers once around all its draws (each process draws its own number of times, so a gather
    per draw would pair different draws across processes) and each draw's rollout finds the weights gathered."""

    @functools.wraps(gathered)
    @contextlib.contextmanager
    def once(self, model):
        if getattr(model, "rlhfkit_gathered", False):
            yield model
            return
        with gathered(self, model):
            model.rlhfkit_gathered = True
            try:
                yield model
            finally:
                model.rlhfkit_gathered = False

    return once


class DDPStrategy:
    """accelerate's data parallel: every process holds the whole model; gradients are all-reduced."""

    name = "ddp"
    sharded_state = False

    def accelerator_kwargs(self, cfg) -> dict:
        return {}

    def wrap(self, model, cfg, device):
        return model

    def prepare(self, accelerator, *objects):
        return accelerator.prepare(*objects)

    def gathered(self, model):
        return contextlib.nullcontext(model)

    def full_model(self, accelerator, model):
        """The plain model with every weight, on the main process (None elsewhere). Every process must call it."""
        return accelerator.unwrap_model(model) if accelerator.is_main_process else None

    def local_model(self, accelerator, model):
        return accelerator.unwrap_model(model)


class FSDP2Strategy(DDPStrategy):
    """PyTorch FSDP2 (``fully_shard``) per decoder layer; see the module docstring."""

    name = "fsdp2"
    sharded_state = True

    def wrap(self, model, cfg, device):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        world = _world()
        if world == 1 and not cfg.distributed.cpu_offload:
            return model  # nothing to shard over; one process trains as with ddp
        if world == 1:  # one device with CPU offload: FSDP2 over a group of one process (a 7B full fine-tune)
            single_process_group(device)
        model.to(device)
        mesh = init_device_mesh(torch.device(device).type, (world,))
        kwargs = {"mesh": mesh, "reshard_after_forward": cfg.distributed.reshard_after_forward}
        if cfg.train.mixed_precision == "bf16" or (cfg.train.mixed_precision == "auto" and torch.cuda.is_available()):
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if cfg.distributed.cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
        units = layer_units(model)
        if not units:
            raise ConfigError(f"fsdp2 found no decoder layers to shard in {type(model).__name__}",
                              where="distributed.strategy", fix="use distributed.strategy=ddp for this model")
        for unit in units:
            fully_shard(unit, **kwargs)
            unit.rlhfkit_reshard_after_forward = kwargs["reshard_after_forward"]  # restored after a gathered phase
        model.rlhfkit_reshard_after_forward = False
        # the root (embeddings, final norm, a tied LM head) stays gathered from forward to backward: reward models and
        # critics take their loss from the head's output captured by a hook, not from the root's output, so the
        # root's pre-backward hook (which would gather it again) never runs
        fully_shard(model, **{**kwargs, "reshard_after_forward": False})
        return model

    def prepare(self, accelerator, *objects):
        return objects if len(objects) > 1 else objects[0]

    @reentrant
    @contextlib.contextmanager
    def gathered(self, model):
        """Every FSDP unit all-gathered once, kept unsharded through all the forwards of the block (generation,
        evaluation: no collective per decode step, so processes may run different numbers of forwards), then
        resharded."""
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        if not units:
            yield model
            return
        for unit in units:
            unit.unshard()
            unit.set_reshard_after_forward(False, recurse=False)
        try:
            yield model
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(getattr(unit, "rlhfkit_reshard_after_forward", True), recurse=False)

    def full_model(self, accelerator, model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(model, FSDPModule):
            return super().full_model(accelerator, model)
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not accelerator.is_main_process:
            return None
        cls = next(c for c in type(model).__mro__[1:] if not issubclass(c, FSDPModule))
        with torch.random.fork_rng():
            plain = cls(copy.deepcopy(model.config))
        plain.load_state_dict(state)
        plain.to(next(iter(state.values())).dtype)
        if getattr(model, "generation_config", None) is not None:
            plain.generation_config = copy.deepcopy(model.generation_config)
        plain.train(model.training)
        return plain

    def save_state(self, path: Path, models: dict, optimizers: dict) -> None:
        """Each process writes its shards of every model and optimizer (torch.distributed.checkpoint)."""
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(models, optimizers), checkpoint_id=str(Path(path) / "sharded"))

    def load_state(self, path: Path, models: dict, optimizers: dict) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        state = self._state(models, optimizers)
        dcp.load(state, checkpoint_id=str(Path(path) / "sharded"))
        for k, m in models.items():
            if k in optimizers:
                set_state_dict(m, optimizers[k], model_state_dict=state[k]["model"],
                               optim_state_dict=state[k]["optim"])
            else:
                set_model_state_dict(m, state[k]["model"])

    @staticmethod
    def _state(models: dict, optimizers: dict) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        out = {}
        for k, m in models.items():
            if k in optimizers:
                msd, osd = get_state_dict(m, optimizers[k])
                out[k] = {"model": msd, "optim": osd}
            else:
                out[k] = {"model": get_model_state_dict(m)}
        return out


class DeepSpeedStrategy(DDPStrategy):
    """accelerate's DeepSpeed integration (ZeRO-2 / ZeRO-3 from the shipped or a given JSON). CUDA only; the
    environment is checked by the config's ``check_inputs`` before anything loads. DeepSpeed steps the optimizer in
    every ``backward``, so the config requires one backward per update (``train.grad_accum=1``; online:
    ``algo.mini_batch_size = train.batch_size``) and one trained model (no PPO critic). Not measured here."""

    name = "deepspeed"
    sharded_state = True

    def accelerator_kwargs(self, cfg) -> dict:
        from accelerate.utils import DeepSpeedPlugin

        return {"deepspeed_plugin": DeepSpeedPlugin(hf_ds_config=ds_config(cfg))}

    @reentrant
    @contextlib.contextmanager
    def gathered(self, model):
        """ZeRO-3: the whole model's parameters gathered once for the block (not per token); ZeRO-2: nothing."""
        import deepspeed

        params = [p for p in model.parameters() if hasattr(p, "ds_id")]
        if not params:
            yield model
            return
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield model

    def full_model(self, accelerator, model):
        state = accelerator.get_state_dict(model)  # every process: ZeRO-3 gathers the shards onto the main one
        if not accelerator.is_main_process:
            return None
        inner = accelerator.unwrap_model(model)
        plain = type(inner)(copy.deepcopy(inner.config))
        plain.load_state_dict(state)
        if getattr(inner, "generation_config", None) is not None:
            plain.generation_config = copy.deepcopy(inner.generation_config)
        return plain

    def save_state(self, path: Path, models: dict, optimizers: dict) -> None:
        for k, engine in models.items():  # the engine writes its own shards (model + optimizer) per process
            engine.save_checkpoint(str(Path(path) / "sharded" / k))

    def load_state(self, path: Path, models: dict, optimizers: dict) -> None:
        for k, engine in models.items():
            engine.load_checkpoint(str(Path(path) / "sharded" / k))


def ds_config(cfg) -> dict:
    """The DeepSpeed JSON with this run's values in place of its "auto" ones (see configs/deepspeed/README.md)."""
    name = cfg.distributed.deepspeed_config
    path = CONFIG_DIR / SHIPPED_DS[name] if name in SHIPPED_DS else Path(name)
    ds = json.loads(path.read_text())
    ds["train_micro_batch_size_per_gpu"] = cfg.train.batch_size
    ds["gradient_accumulation_steps"] = 1
    ds["gradient_clipping"] = cfg.optim.max_grad_norm or 0.0
    ds.pop("train_batch_size", None)
    mp = cfg.train.mixed_precision
    ds["bf16"] = {"enabled": mp == "bf16" or (mp == "auto" and torch.cuda.is_available())}
    ds["fp16"] = {"enabled": mp == "fp16"}
    if cfg.distributed.cpu_offload:
        zero = ds.setdefault("zero_optimization", {})
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if zero.get("stage") == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return ds


STRATEGIES = {"ddp": DDPStrategy(), "fsdp2": FSDP2Strategy(), "deepspeed": DeepSpeedStrategy()}


def get_strategy(cfg):
    """The strategy of a run's config (ddp for configs without a ``distributed`` section)."""
    dist = getattr(cfg, "distributed", None)
    return STRATEGIES[dist.strategy if dist is not None else "ddp"]


def die_with_launcher() -> None:
    """Under torchrun, make this worker die when its launcher dies (Linux ``PR_SET_PDEATHSIG``).

    torchrun starts each worker in a session of its own, so a SIGKILL of the launcher (``kill -9``, a scheduler
    killing the job step) would leave the workers running on, still writing checkpoints into the run directory
    while the job is restarted; with this, the workers go with it and the same command resumes cleanly."""
    import os
    import signal
    import sys

    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # pragma: no cover - no prctl: workers behave as torchrun makes them
        return
    if os.getppid() == 1:  # the launcher died before we asked
        os._exit(1)


def single_process_group(device) -> None:
    """A process group of this process alone (an in-memory store), for FSDP2 on one device: its CPU offload needs a
    mesh, and a mesh a group. Nothing when a group exists (``accelerate launch`` made one)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def layer_units(model) -> list[torch.nn.Module]:
    """The modules FSDP shards one by one: instances of the classes in ``model._no_split_modules`` (transformers'
    per-architecture list of blocks that must stay whole: ``LlamaDecoderLayer``, ``Qwen2DecoderLayer``, …)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names and m is not model]


def local_param_fraction(model) -> float:
    """Elements of the parameters this process holds / elements of the whole model (1.0 unsharded)."""
    local = total = 0
    for p in model.parameters():
        total += p.numel()
        local += p.to_local().numel() if hasattr(p, "to_local") else p.numel()
    return local / max(total, 1)
