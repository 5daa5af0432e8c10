"""`rlhfkit plan`: per-phase figures a reader can follow for a 7B Llama config.json (no weights), what to change
when it does not fit, and the pre-flight checks (each can fail) on the tiny model and the built-in data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlhfkit.cli import main
from rlhfkit.config import build_config
from rlhfkit.models.memory import GiB
from rlhfkit.plan import plan

# the architecture-only configs shipped for planning without downloads (configs/models/); the hand figures below
# (parameter counts, bytes) are computed independently of them
_MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"
LLAMA2_7B = json.loads((_MODELS / "llama2-7b" / "config.json").read_text())
SMOLLM2_135M = json.loads((_MODELS / "smollm2-135m" / "config.json").read_text())

P7B = 6_738_415_616


@pytest.fixture()
def llama_dir(tmp_path):
    d = tmp_path / "llama-7b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA2_7B))
    return d


def test_sft_7b_on_one_80gb_card_does_not_fit_and_says_what_would(llama_dir):
    cfg = build_config("sft", {}, [f"model.name={llama_dir}", "train.batch_size=4", "data.max_length=1024"])
    p = plan(cfg, world=1, gpu_memory=80 * GiB, checks=False)
    step = p.phases[0]
    assert step.name == "train step"
    assert step.items["policy weights"] == P7B * 4
    assert step.items["policy optimizer (AdamW)"] == P7B * 8
    assert step.items["policy activations"] == 4 * 1024 * 32 * 268_288
    assert p.fits is False
    fixes = dict(p.suggestions)
    assert fixes["model.lora.enabled=true"] <= 80 * GiB  # bf16 base + adapters + activations
    # checkpointing alone removes the activations but not the 12 B per parameter of weights, grads and AdamW
    assert P7B * 12 < fixes["model.gradient_checkpointing=true"] < step.total
    assert "distributed.strategy=fsdp2" not in fixes  # one device: nothing to shard over
    # the cheapest change that fits: checkpointing (cost 1) cannot, smaller micro-batches neither; CPU offload (3:
    # FSDP2 keeps weights, gradients and AdamW in host memory, all weights still trained) does, before LoRA (4)
    offload = "distributed.strategy=fsdp2 distributed.cpu_offload=true"
    assert fixes[offload] <= 80 * GiB
    assert p.fit is not None and p.fit.text() == offload and p.fit.peak <= 80 * GiB
    text = p.render()
    assert "does NOT fit in 80.00 GiB" in text and "6.74B x 4 B" in text
    assert re.search(r"\n  fits +\d+\.\d+ GiB  model\.lora\.enabled=true\n", text), text
    assert "(it keeps 100.41 GiB in host memory per process" in text  # 6.74B x (4 + 4 + 8) B
    assert re.search(r"\n  no +\d+\.\d+ GiB  model\.gradient_checkpointing=true\n", text), text


def test_fsdp2_over_8_devices_shards_the_states(llama_dir):
    cfg = build_config("sft", {}, [f"model.name={llama_dir}", "distributed.strategy=fsdp2",
                                   "model.gradient_checkpointing=true", "train.batch_size=4", "data.max_length=1024"])
    p = plan(cfg, world=8, gpu_memory=80 * GiB, checks=False)
    step = p.phases[0]
    assert step.items["policy weights"] == P7B * 4 / 8
    assert step.items["policy gradients"] == P7B * 4 / 8
    assert step.items["policy gathered layers"] == 2 * 202_383_360 * 2  # current + next layer, bf16
    assert step.items["policy gathered root"] == (2 * 32000 * 4096 + 4096) * 2  # embeddings, LM head, final norm
    assert p.fits is True and p.suggestions == []
    assert "fits in 80.00 GiB" in p.render()


def test_deepspeed_zero_stage_read_from_its_config(llama_dir, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    for name, expected in (("zero2", "zero2"), ("zero3", "zero3"), (str(ds), "zero3")):
        cfg = build_config("sft", {}, [f"model.name={llama_dir}", "distributed.strategy=deepspeed",
                                       f"distributed.deepspeed_config={name}"])
        assert plan(cfg, world=4, checks=False).setup.strategy == expected


def test_smollm2_grpo_plan_on_cpu(tmp_path):
    d = tmp_path / "smollm2"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(SMOLLM2_135M))
    cfg = build_config("grpo", {}, [f"model.name={d}"])
    p = plan(cfg, world=2, device="cpu", checks=False)
    assert [ph.name for ph in p.phases] == ["rollout (generation)", "scoring and forward passes", "train step",
                                            "final save"]
    assert p.roles[1].name == "reference" and p.roles[1].weight_bytes == 4  # CPU: fp32 everywhere
    assert p.phases[0].items["KV cache"] == 2 * 30 * (16 * 4) * (512 + 64) * 192 * 4
    assert "policy merged weights (adapted layers)" not in p.phases[-1].items  # every weight trained: no copy


def test_a_lora_runs_final_save_on_cpu_holds_the_merged_adapted_layers(tmp_path):
    """The merged weights of the adapted layers (30 layers of SmolLM2-135M's projections, by hand) beside the
    weights, adapters and optimizer states still held; on a GPU the copy is in host memory: no device phase."""
    d = tmp_path / "smollm2"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(SMOLLM2_135M))
    cfg = build_config("grpo", {}, [f"model.name={d}", "model.lora.enabled=true"])
    p = plan(cfg, world=1, device="cpu", checks=False)
    save = p.phases[-1]
    H, inter, kv = 576, 1536, 3 * 64
    per_layer = H * H * 2 + H * kv * 2 + H * inter * 3 + 2 * H  # q, o; k, v; gate, up, down; two RMSNorms
    assert save.name == "final save" and save.items["policy merged weights (adapted layers)"] == 30 * per_layer * 4
    held = {k for k in save.items if k != "policy merged weights (adapted layers)"}
    assert held == {"policy weights", "policy LoRA adapters", "policy optimizer (AdamW)"}  # reference: adapter off
    assert "final save" not in [ph.name for ph in plan(cfg, world=1, device="cuda", checks=False).phases]


def test_preflight_passes_on_the_tiny_model_and_builtin_data(task_data):
    cfg = build_config("sft", {}, [f"data.train={task_data / 'sft.jsonl'}", "model.name=tiny:hidden=32,layers=1"])
    checks = {c.name: c for c in plan(cfg, world=2, device="cpu").checks}
    assert {c.status for c in checks.values()} == {"ok"}, checks
    assert "global batch = 8 x 1 accumulation x 2 device(s) = 16" in checks["batch divisibility"].message
    assert set(checks) == {"EOS vs pad", "batch divisibility", "template prefix stability", "longest sample",
                           "context"}


def test_preflight_failures(task_data, tmp_path):
    data = f"data.train={task_data / 'sft.jsonl'}"
    # batch divisibility: 10 records cannot fill a global batch of 8 x 2 x 2
    cfg = build_config("sft", {}, [data, "model.name=tiny:hidden=32,layers=1", "data.limit=10", "train.grad_accum=2"])
    checks = {c.name: c for c in plan(cfg, world=2, device="cpu").checks}
    assert checks["batch divisibility"].status == "fail"
    # context: the tiny model's context cut to 16 tokens
    cfg = build_config("sft", {}, [data, "model.name=tiny:hidden=32,layers=1,context=16"])
    checks = {c.name: c for c in plan(cfg, device="cpu").checks}
    assert checks["context"].status == "fail" and "context 16" in checks["context"].message
    # template prefix stability: the prompt alone ends "assistant", the conversation writes "bot"
    tpl = tmp_path / "unstable.jinja"
    tpl.write_text("{% for m in messages %}<|im_start|>{{ 'bot' if m['role'] == 'assistant' else m['role'] }}\n"
                   "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    cfg = build_config("sft", {}, [data, "model.name=tiny:hidden=32,layers=1", f"model.chat_template={tpl}"])
    checks = {c.name: c for c in plan(cfg, device="cpu").checks}
    assert checks["template prefix stability"].status == "fail"


def test_preflight_eos_equal_to_pad_is_flagged(tmp_path, task_data):
    from rlhfkit.models.tiny import build_tiny_tokenizer

    tok_dir = build_tiny_tokenizer(tmp_path / "tok")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    tok.pad_token = tok.eos_token
    tok.save_pretrained(tok_dir)
    (tok_dir / "config.json").write_text(json.dumps({**SMOLLM2_135M, "vocab_size": 100}))
    cfg = build_config("sft", {}, [f"data.train={task_data / 'sft.jsonl'}", f"model.name={tok_dir}"])
    checks = {c.name: c for c in plan(cfg, device="cpu").checks}
    assert checks["EOS vs pad"].status == "warn"


def test_cli_plan_prints_the_figures_and_exits_0(llama_dir, capsys):
    rc = main(["plan", "configs/sft.yaml", "--world-size", "8", f"model.name={llama_dir}", "--gpu-memory=80GiB",
               "data.train=null"])  # plan's flags may sit between the overrides
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "6.738B parameters" in out and "strategy ddp x 8 device(s)" in out
    assert "skip  data checks: no data.train given" in out


def test_cli_plan_bad_input_is_one_line_exit_2(llama_dir, capsys):
    assert main(["plan", "configs/sft.yaml", f"model.name={llama_dir}", "--gpu-memory", "lots"]) == 2
    assert "bad --gpu-memory" in capsys.readouterr().err
    assert main(["plan", "configs/sft.yaml", "model.name=/nowhere/model"]) == 2
    assert "model.name" in capsys.readouterr().err
    assert main(["plan", "configs/pipeline.yaml"]) == 2
    assert main(["plan", "configs/sft.yaml", f"model.name={llama_dir}", "--world-size", "zero"]) == 2
    assert "--world-size" in capsys.readouterr().err


def test_preflight_reward_model_tokenizer(task_data, tmp_path):
    from transformers import AutoTokenizer

    from rlhfkit.models.tiny import build_tiny_tokenizer

    def rm_dir(name: str, extra_token: str | None):
        d = build_tiny_tokenizer(tmp_path / name)
        if extra_token:
            tok = AutoTokenizer.from_pretrained(d)
            tok.add_tokens([extra_token])
            tok.save_pretrained(d)
        (d / "config.json").write_text(json.dumps({**SMOLLM2_135M, "vocab_size": 101}))
        return d

    base = [f"data.train={task_data / 'prompts.jsonl'}", "model.name=tiny:hidden=32,layers=1", "data.limit=64"]
    for name, extra, status in (("same", None, "ok"), ("other", "<extra>", "warn")):
        cfg = build_config("grpo", {}, [*base, f"reward.model={rm_dir(name, extra)}"])
        checks = {c.name: c for c in plan(cfg, device="cpu").checks}
        assert checks["reward-model tokenizer"].status == status, checks["reward-model tokenizer"]


@pytest.mark.parametrize("recipe", ["sft", "grpo", "dpo"])
def test_every_suggestion_is_a_config_that_builds(llama_dir, recipe):
    # what plan proposes must pass the config's own checks (online recipes refuse train.grad_accum != 1)
    cfg = build_config(recipe, {}, [f"model.name={llama_dir}", "train.batch_size=8", "data.max_length=1024"])
    p = plan(cfg, world=1, gpu_memory=80 * GiB, checks=False)
    assert p.suggestions
    for overrides, _ in p.suggestions:
        if "qlora" in overrides:  # needs CUDA + bitsandbytes, checked by check_inputs, not by the config
            continue
        build_config(recipe, {}, [f"model.name={llama_dir}", "train.batch_size=8", "data.max_length=1024",
                                  *overrides.split()])


def _fix_command_plans(command: str, budget: float, device: str = "cuda"):
    """Run the printed command line through the command line's own parsing, the config and the planner."""
    import shlex

    from rlhfkit.cli import split_overrides
    from rlhfkit.config import load_config

    words, world = shlex.split(command), 1
    if words[:2] == ["accelerate", "launch"]:
        world = int(words[words.index("--num_processes") + 1])
        words = ["rlhfkit", *words[words.index("rlhfkit.cli") + 1:]]
    assert words[0] == "rlhfkit"
    path, overrides = split_overrides(words[2:])
    return plan(load_config(words[1], path, overrides), world=world, gpu_memory=budget, checks=False, device=device)


_GRPO_7B = ["model.lora.enabled=true", "generation.max_new_tokens=1024", "data.max_prompt_length=512",
            "data.max_length=1536", "algo.rollout_batch_size=16", "algo.num_generations=8", "algo.mini_batch_size=32",
            "train.batch_size=4", "reward.functions=[{fn: exact_match}]"]


def test_grpo_7b_lora_on_24gib_finds_the_generation_micro_batch_fit(llama_dir, capsys):
    """Issue 22: the rollout's KV cache is the peak; no single change fits, a smaller generation micro-batch with
    gradient checkpointing does, and the printed command line, parsed and planned again, fits."""
    rc = main(["plan", "grpo", f"model.name={llama_dir}", *_GRPO_7B, "--gpu-memory", "24GiB", "--no-checks"])
    out = capsys.readouterr().out
    assert rc == 0 and "does NOT fit in 24.00 GiB" in out
    assert not re.search(r"\n  fits ", out)  # no change alone fits
    fit = re.search(r"cheapest change that fits: (.*) -> ([\d.]+) GiB per device\n  (.*)\n", out)
    assert fit and "generation.batch_size=" in fit[1] and "model.gradient_checkpointing=true" in fit[1], out
    assert "model.lora.qlora" not in fit[1] and "max_new_tokens=512" not in fit[1]  # costlier levers not pulled
    command = fit[3]
    assert command.startswith(f"rlhfkit grpo model.name={llama_dir} ") and command.endswith(fit[1])
    again = _fix_command_plans(command, 24 * GiB)
    assert again.fits is True and again.peak.total == pytest.approx(float(fit[2]) * GiB, rel=1e-3)


def test_full_7b_sft_on_24gib_shards_over_more_devices_or_says_nothing_fits(llama_dir):
    cfg = build_config("sft", {}, [f"model.name={llama_dir}", "train.batch_size=4", "data.max_length=1024"])
    p = plan(cfg, world=1, gpu_memory=24 * GiB, checks=False, device="cpu",
             command=f"rlhfkit sft model.name={llama_dir}")
    assert p.fit is not None  # on CPU the LoRA base stays fp32 (27 GiB): sharding over more devices is what fits
    assert p.fit.world > 1 and p.fix_command().startswith("accelerate launch --num_processes ")
    assert _fix_command_plans(p.fix_command(), 24 * GiB, device="cpu").fits is True
    # on CUDA: CPU offload with a smaller micro-batch (all weights trained; cost 3 + 0.5 below LoRA + a smaller
    # micro-batch, 4.5); the user's own train.batch_size=4 is not repeated in the line
    p = plan(cfg, world=1, gpu_memory=24 * GiB, checks=False, command=f"rlhfkit sft model.name={llama_dir} "
             "train.batch_size=4 data.max_length=1024")
    assert p.fit.text() == ("train.batch_size=2 train.grad_accum=2 distributed.strategy=fsdp2 "
                            "distributed.cpu_offload=true") and p.fix_command().count("train.batch_size=") == 1
    assert _fix_command_plans(p.fix_command(), 24 * GiB).fits is True  # through the config's own checks
    # LoRA (with a smaller micro-batch) when full training is not on the table
    lora = build_config("sft", {}, [f"model.name={llama_dir}", "train.batch_size=4", "data.max_length=1024",
                                    "model.lora.enabled=true"])
    p = plan(lora, world=1, gpu_memory=24 * GiB, checks=False)
    assert p.fits or "distributed.cpu_offload" not in p.fit.text()
    p = plan(cfg, world=1, gpu_memory=2 * GiB, checks=False)
    assert p.fit is None and "nothing fits" in p.render()


def test_cli_plan_takes_the_recipe_first_and_warns_on_missing_data(llama_dir, capsys):
    rc = main(["plan", "sft", f"model.name={llama_dir}", "data.train=missing.jsonl"])
    out = capsys.readouterr().out
    assert rc == 0 and "plan: sft on" in out
    assert re.search(r"warn  data: .*missing\.jsonl.*no such file", out)  # the run itself stops on it
    assert main(["plan", "grpo", "--recipe", "dpo", f"model.name={llama_dir}"]) == 2
    assert "two recipes" in capsys.readouterr().err


def _one_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = [x for x in captured.err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in captured.err + captured.out, captured.err
    return lines[0]


@pytest.mark.parametrize("size", ["0", "-80GiB", "nan", "inf", "1e-9", "", "80TiB", "NaNGiB", "-0"])
def test_cli_plan_refuses_every_impossible_gpu_memory(llama_dir, capsys, size):
    assert main(["plan", "configs/sft.yaml", f"model.name={llama_dir}", f"--gpu-memory={size}"]) == 2
    assert "--gpu-memory" in _one_error(capsys)


@pytest.mark.parametrize("key, value, words", [
    ("hidden_size", -4096, "hidden = -4096"), ("num_hidden_layers", 0, "layers = 0"), ("vocab_size", "32k", "'32k'"),
    ("num_attention_heads", 31.5, "31.5"), ("num_key_value_heads", 5, "do not split into 5"),
    ("intermediate_size", True, "True"), ("max_position_embeddings", -1, "context = -1"), ("hidden_size", None, None)])
def test_cli_plan_refuses_a_config_json_with_impossible_sizes(tmp_path, capsys, key, value, words):
    d = tmp_path / "m"
    d.mkdir()
    cfg = dict(LLAMA2_7B)
    if value is None:
        del cfg[key]
    else:
        cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    assert main(["plan", "configs/sft.yaml", f"model.name={d}", "--gpu-memory=80GiB"]) == 2
    line = _one_error(capsys)
    assert "config.json" in line and (words or key) in line


@pytest.mark.parametrize("content", [b"[1, 2]", b"\xff\xfe\x00garbage", b'"text"'])
def test_cli_plan_refuses_a_config_json_that_is_not_a_model_config(tmp_path, capsys, content):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_bytes(content)
    assert main(["plan", "configs/sft.yaml", f"model.name={d}"]) == 2
    assert "config.json" in _one_error(capsys)


@pytest.mark.parametrize("content", [
    b"garbage", b"GGUF", b"GGUF\x03\x00\x00\x00" + b"\xff" * 16,
    b"GGUF\x03\x00\x00\x00" + (0).to_bytes(8, "little") + (1).to_bytes(8, "little") + (2**40).to_bytes(8, "little"),
    b"GGUF\x03\x00\x00\x00" + (0).to_bytes(8, "little") + (1).to_bytes(8, "little") + (4).to_bytes(8, "little")
    + b"abcd" + (99).to_bytes(4, "little")])
def test_cli_plan_refuses_a_garbage_gguf_in_one_line(tmp_path, capsys, content):
    f = tmp_path / "model.gguf"
    f.write_bytes(content)
    assert main(["plan", "configs/sft.yaml", f"model.name={f}"]) == 2
    assert str(f) in _one_error(capsys)


def test_continuous_engine_cache_is_its_token_budget_and_plan_says_the_slots(llama_dir, capsys):
    """Issue 31: GRPO with 4096-token answers at 64 prompts x 8 on a 1B model: the static engine's cache (512 rows x
    (prompt + 4096)) alone overflows an 80 GiB card; the continuous engine's is its token budget, whatever the batch,
    and plan prints it in tokens and GiB with the slots it holds at full length."""
    one_b = Path(__file__).resolve().parents[2] / "bench" / "shapes" / "llama-3.2-1b"
    common = [f"model.name={one_b}", "generation.max_new_tokens=4096", "data.max_prompt_length=256",
              "algo.rollout_batch_size=64", "algo.num_generations=8", "algo.mini_batch_size=512",
              "train.batch_size=2", "model.gradient_checkpointing=true"]
    kv_per_token = 2 * 16 * 8 * 64 * 2  # keys + values x layers x kv heads x head dim x bf16
    static = plan(build_config("grpo", {}, [*common, "generation.engine=static"]), world=1, gpu_memory=80 * GiB,
                  checks=False)
    rollout = static.phases[0]
    assert rollout.items["KV cache"] == 512 * (256 + 4096) * kv_per_token  # 68 GiB: the peak, does not fit
    assert static.fits is False and static.peak is rollout
    cont = plan(build_config("grpo", {}, [*common, "generation.engine=continuous", "generation.cache_tokens=524288"]),
                world=1, gpu_memory=80 * GiB, checks=False)
    rollout = cont.phases[0]
    assert rollout.items["KV cache (paged, token budget)"] == 524288 * kv_per_token  # 16 GiB
    assert rollout.items["sampling numbers"] == 512 * 4097 * 8
    assert rollout.total < 40 * GiB and cont.fits is True
    assert "rollout cache: continuous engine, 524,288 tokens = 16.00 GiB (paged); 256 slots decode together; 120 " \
           "sequences of 256 + 4096 tokens fit at full length" in cont.render()
    # no float32 [B, T, V] tensor in the rollout: its largest logits term is one step's [slots, V]
    assert rollout.items["logits and sampling of one decode step"] == 256 * 128256 * 16
    # the static plan's cheapest fit may take the token-budget cache, and that command plans as it says
    assert any("generation.engine=continuous generation.cache_tokens=" in o for o, _ in static.suggestions)
    with pytest.raises(Exception, match="no token-budget cache"):
        build_config("grpo", {}, [*common, "generation.engine=static", "generation.cache_tokens=100000"])
    # auto takes the continuous engine for 4096-token answers (rollout/auto.py) and plans its cache: its default
    # budget (every slot at full length) or the one given
    auto = plan(build_config("grpo", {}, common), world=1, gpu_memory=80 * GiB, checks=False).phases[0]
    assert auto.items["KV cache (paged, token budget)"] == 256 * (256 + 4096) * kv_per_token
    given = plan(build_config("grpo", {}, [*common, "generation.cache_tokens=524288"]), world=1, checks=False)
    assert given.phases[0].items["KV cache (paged, token budget)"] == 524288 * kv_per_token
    with pytest.raises(Exception, match="holds less than one sequence"):
        build_config("grpo", {}, [*common, "generation.engine=continuous", "generation.cache_tokens=4000"])


_PPO_7B = ["model.name=configs/models/llama2-7b", "reward.model=configs/models/pythia-1.4b",
           "critic.model=configs/models/pythia-1.4b", "generation.max_new_tokens=128", "algo.rollout_batch_size=8",
           "algo.mini_batch_size=8", "train.batch_size=8", "data.max_prompt_length=512", "data.max_length=640"]


def test_ppo_7b_with_pythia_reward_and_critic_lists_the_offload_levers_and_keeps_full_training(capsys):
    """Issue 32: Llama-2-7B full PPO with a Pythia-1.4B reward model and critic on one 80 GiB GPU: the plan lists
    every offload lever with what it gives, and the cheapest fit trains every weight (CPU offload, not LoRA)."""
    rc = main(["plan", "ppo", *(o.replace("configs/models/", f"{_MODELS}/") for o in _PPO_7B), "--gpu-memory",
               "80GiB", "--no-checks"])
    out = capsys.readouterr().out
    assert rc == 0 and "does NOT fit in 80.00 GiB" in out
    levers = dict(re.findall(r"\n  (?:fits|no) +([\d.]+ GiB)  (.+)", out)[i][::-1] for i in range(9))
    for lever in ("memory.offload_optimizer=true", "memory.offload_reference=true", "memory.offload_reward=true",
                  "distributed.strategy=fsdp2 distributed.cpu_offload=true", "model.lora.enabled=true"):
        assert lever in levers, out
    fit = re.search(r"cheapest change that fits: (.*) -> ([\d.]+) GiB per device\n  (.*)\n", out)
    assert fit[1] == "distributed.strategy=fsdp2 distributed.cpu_offload=true" and float(fit[2]) <= 80, out
    assert "model.lora" not in fit[1]
    again = _fix_command_plans(fit[3], 80 * GiB)
    assert again.fits and all(r.trainable == "full" for r in again.roles if r.name in ("policy", "critic"))
    # the host memory it needs: the policy's and the critic's fp32 weights, gradients and AdamW moments (16 B each)
    host = (P7B + 1_414_647_808 - 50304 * 2048 + 2048) * 16
    assert f"(it keeps {host / GiB:.2f} GiB in host memory per process" in out
    phases = {p.name: p for p in again.phases}
    assert phases["rollout (generation)"].items["policy weights gathered for generation"] == P7B * 2


def test_the_release_and_offload_levers_carry_their_costs():
    from rlhfkit.plan import levers_of

    llama = f"model.name={_MODELS / 'llama2-7b'}"
    cfg = build_config("grpo", {}, [llama, "memory.release_engine_cache=false", "reward.functions=[{fn: exact_match}]"])
    by_name = {lv.name: lv.steps for lv in levers_of(cfg, 1, "cuda")}
    assert by_name["release the engine's cache after each rollout"] == ((0.5, (("memory.release_engine_cache",
                                                                                True),), 1),)
    assert by_name["optimizer state in host memory while generating"][0][:2] == (
        2, (("memory.offload_optimizer", True),))
    assert by_name["CPU offload"][0][:2] == (3, (("distributed.strategy", "fsdp2"), ("distributed.cpu_offload", True)))
    pulled = build_config("grpo", {}, [llama, "memory.offload_optimizer=true", "model.lora.enabled=true",
                                       "reward.functions=[{fn: exact_match}]"])
    names = {lv.name for lv in levers_of(pulled, 1, "cuda")}
    assert "optimizer state in host memory while generating" not in names  # already pulled
    assert "CPU offload" not in names  # LoRA under FSDP2 is not built: no offload lever for it
    assert "release the engine's cache after each rollout" not in names  # on by default
