"""Strategy selection and its guards: DeepSpeed fails in one line before anything loads when it cannot run here,
its JSON gets the run's values, unsupported combinations are config errors, FSDP2 finds the decoder layers."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from rlhfkit.cli import main
from rlhfkit.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.train.lifecycle import distributed as D

TINY = "model.name=tiny:hidden=32,layers=1"


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None and torch.cuda.is_available(),
                    reason="deepspeed and CUDA are both here: the guard has nothing to refuse")
def test_deepspeed_without_package_or_gpu_is_one_line_before_loading(task_data, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["sft", TINY, f"data.train={task_data / 'sft.jsonl'}", f"output_dir={out}",
               "distributed.strategy=deepspeed"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "distributed.strategy: distributed.strategy=deepspeed needs" in err
    assert not out.exists()  # nothing written


def test_shipped_deepspeed_configs_get_the_runs_values():
    for name, stage in (("zero2", 2), ("zero3", 3)):
        shipped = json.loads((D.CONFIG_DIR / f"{name}.json").read_text())
        assert shipped["zero_optimization"]["stage"] == stage
        cfg = build_config("sft", {}, [TINY, "distributed.strategy=deepspeed", f"distributed.deepspeed_config={name}",
                                       "train.batch_size=4", "optim.max_grad_norm=0.5", "distributed.cpu_offload=true",
                                       "train.mixed_precision=bf16"])
        ds = D.ds_config(cfg)
        assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["gradient_clipping"]) == \
            (4, 1, 0.5)
        assert ds["bf16"] == {"enabled": True} and ds["fp16"] == {"enabled": False}
        assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
        assert ("offload_param" in ds["zero_optimization"]) == (stage == 3)
        assert "auto" not in json.dumps(ds)  # every "auto" value was filled


@pytest.mark.parametrize("recipe,overrides,where", [
    ("sft", ["distributed.strategy=deepspeed", "train.grad_accum=2"], "train.grad_accum"),
    ("grpo", ["distributed.strategy=deepspeed", "train.batch_size=8"], "algo.mini_batch_size"),
    ("ppo", ["distributed.strategy=deepspeed", "train.batch_size=16"], "distributed.strategy"),
    ("sft", ["distributed.strategy=fsdp2", "model.lora.enabled=true"], "distributed.strategy"),
    ("grpo", ["distributed.strategy=fsdp2", "memory.offload_optimizer=true"], "memory.offload_optimizer"),
    ("grpo", ["distributed.strategy=deepspeed", "train.batch_size=8", "algo.mini_batch_size=8",
              "memory.offload_optimizer=true"],
     "memory.offload_optimizer"),
    ("sft", ["distributed.strategy=zero3"], "config + overrides"),
])
def test_unsupported_combinations_are_config_errors(recipe, overrides, where):
    with pytest.raises(ConfigError) as err:
        build_config(recipe, {}, [TINY, *overrides])
    assert err.value.where == where


def test_fsdp2_units_are_the_decoder_layers_and_one_process_is_left_whole():
    from rlhfkit.models.loading import load_causal_lm

    cfg = build_config("sft", {}, ["model.name=tiny:hidden=32,layers=3", "distributed.strategy=fsdp2"])
    model, _ = load_causal_lm(cfg.model)
    units = D.layer_units(model)
    assert [type(u).__name__ for u in units] == ["LlamaDecoderLayer"] * 3
    assert D.get_strategy(cfg).wrap(model, cfg, "cpu") is model  # no process group: nothing to shard over
    assert D.local_param_fraction(model) == 1.0
    assert D.get_strategy(build_config("sft", {}, [TINY])).name == "ddp"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, CPU offload is a valid choice")
def test_fsdp2_cpu_offload_without_gpu_is_one_line(task_data, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["sft", TINY, f"data.train={task_data / 'sft.jsonl'}", f"output_dir={out}",
               "distributed.strategy=fsdp2", "distributed.cpu_offload=true"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "distributed.cpu_offload" in err
    assert not out.exists()


def test_fsdp2_cpu_offload_on_one_device_trains_as_the_plain_model():
    """distributed.cpu_offload on one process: FSDP2 over a group of one (the 7B-on-one-GPU path); on CPU the
    offload has nowhere to go, but the path runs and its updates equal the unwrapped model's."""
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlhfkit.config.schema import OptimConfig
    from rlhfkit.train.lifecycle.optim import build_optimizer

    cfg = build_config("sft", {}, [TINY, "distributed.strategy=fsdp2", "distributed.cpu_offload=true",
                                   "train.mixed_precision=no"])
    losses = {}
    try:
        for wrapped in (False, True):
            torch.manual_seed(0)
            model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=4, num_key_value_heads=2, intermediate_size=64))
            if wrapped:
                model = D.FSDP2Strategy().wrap(model, cfg, "cpu")
                assert D.local_param_fraction(model) == 1.0 and type(next(model.parameters())).__name__ == "DTensor"
            opt = build_optimizer(model.parameters(), OptimConfig(lr=1e-2))
            x = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
            losses[wrapped] = []
            for _ in range(3):
                loss = model(input_ids=x, labels=x).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses[wrapped].append(loss.item())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert losses[True] == pytest.approx(losses[False], abs=1e-5)
    assert losses[True][-1] < losses[True][0]
