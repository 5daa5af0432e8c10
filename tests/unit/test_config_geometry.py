"""TRL's GRPO semantics made visible and selectable: the step's geometry (config/geometry.py) against a slow
re-derivation of TRL 1.16's own arithmetic (GRPOConfig.__post_init__ and its trainer's buffer), the block an online
run starts with, defaults=trl, the command line winning over the file whichever names either uses, and a geometry
that does not divide naming the nearest values that do."""

import math

import pytest
import yaml

from rlhfkit.config import build_config, load_config
from rlhfkit.config.geometry import (
    check_split,
    divisors,
    nearest,
    nearest_divisors,
    nearest_multiples,
    step_block,
    step_geometry,
)
from rlhfkit.config.startup import differences, startup_block
from rlhfkit.errors import ConfigError

M = "model.name=tiny:x"


@pytest.fixture(autouse=True)
def _fresh_log(monkeypatch):  # (the config notes start fresh in every test: tests/conftest.py)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def trl_reference(b, g, k, world, n=None, s=None, iterations=1):
    """TRL 1.16, written out: GRPOConfig.__post_init__ fills generation_batch_size / steps_per_generation from
    per_device_train_batch_size (b), gradient_accumulation_steps (g) and the processes; the trainer generates N
    samples over every process, feeds each process's N / world in micro-batches of b, steps the optimizer every g
    micro-batches and regenerates after steps_per_generation x num_iterations micro-batches. Returns, per process,
    (samples per generation, samples per update, micro-batch, updates per generation)."""
    if n is None and s is None:
        s = g
        n = b * world * s
    elif s is None:
        assert n % (b * world) == 0
        s = n // (b * world)
    else:
        n = b * world * s
    assert n % k == 0
    micro_steps = s * iterations
    return n // world, b * g, b, micro_steps // g


CASES = [  # (b, g, k, world, n, s, iterations)
    (8, 1, 8, 1, None, None, 1),  # TRL's defaults: one prompt of 8, one update
    (8, 1, 4, 1, None, None, 1),
    (4, 2, 4, 1, None, None, 1),
    (4, 1, 4, 1, 16, None, 1),  # a generation batch of 4 updates
    (4, 1, 2, 1, None, 4, 2),
    (8, 2, 4, 2, None, None, 1),  # two processes
    (4, 1, 4, 2, 32, None, 3),
    (2, 2, 2, 4, None, 4, 1),
]


@pytest.mark.parametrize("b,g,k,world,n,s,iterations", CASES)
def test_trl_batch_names_give_trls_step(b, g, k, world, n, s, iterations, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    names = [M, f"per_device_train_batch_size={b}", f"gradient_accumulation_steps={g}", f"num_generations={k}",
             f"num_iterations={iterations}"]
    names += [f"generation_batch_size={n}"] if n is not None else []
    names += [f"steps_per_generation={s}"] if s is not None else []
    cfg = build_config("grpo", {}, names)
    geo = step_geometry(cfg, world)
    samples, update, micro, updates = trl_reference(b, g, k, world, n, s, iterations)
    assert (geo.samples, geo.mini, geo.micro, geo.updates_per_step) == (samples, update, micro, updates)
    # defaults=trl derives the same from per_device_train_batch_size alone when G, N, S are TRL's defaults
    if g == 1 and n is None and s is None:
        trl = build_config("grpo", {}, [M, "defaults=trl", f"per_device_train_batch_size={b}",
                                        f"num_generations={k}"])
        assert (step_geometry(trl, world).samples, step_geometry(trl, world).mini) == (samples, update)


def test_trl_generation_batch_that_is_not_whole_groups_per_process_names_the_nearest(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError) as e:
        build_config("grpo", {}, [M, "per_device_train_batch_size=4", "num_generations=4",
                                  "generation_batch_size=20"])
    assert "generation_batch_size=16 or 24" in str(e.value) and "2 processes" in str(e.value)
    with pytest.raises(ConfigError, match="steps_per_generation=2 or 4"):
        build_config("grpo", {}, [M, "per_device_train_batch_size=2", "num_generations=4",
                                  "steps_per_generation=3"])
    with pytest.raises(ConfigError, match="both set"):
        build_config("grpo", {}, [M, "generation_batch_size=16", "steps_per_generation=2"])


def test_defaults_trl_is_trls_grpo_and_rloo():
    cfg = build_config("grpo", {}, [M, "defaults=trl"])
    algo = cfg.algo
    assert (algo.num_generations, algo.ppo_epochs, algo.kl.coef, algo.loss_aggregation) == (8, 1, 0.0, "token_mean")
    assert (algo.rollout_batch_size, algo.mini_batch_size, cfg.train.batch_size) == (1, 8, 8)
    assert (cfg.generation.max_new_tokens, cfg.optim.lr, cfg.optim.schedule) == (512, 1e-6, "linear")
    assert cfg.model.gradient_checkpointing and cfg.reward.missing_eos_penalty is None and cfg.reward.clip is None
    assert (algo.total_episodes, cfg.train.epochs, cfg.data.eval_fraction) == (None, 3.0, 0.0)
    assert differences(cfg) == []  # nothing left to say
    rloo = build_config("rloo", {}, [M, "defaults=trl"])
    assert (rloo.algo.num_generations, rloo.algo.kl.coef, rloo.algo.rollout_batch_size) == (2, 0.05, 4)
    assert differences(rloo) == []
    with pytest.raises(ConfigError, match="TRL 1.16 has no trainer for ppo"):
        build_config("ppo", {}, [M, "defaults=trl"])


def test_defaults_trl_sits_under_the_file_and_the_command_line(tmp_path):
    path = tmp_path / "trl.yaml"  # a TRL user's short config
    path.write_text(yaml.safe_dump({"model_name_or_path": "tiny:x", "defaults": "trl", "beta": 0.04,
                                    "per_device_train_batch_size": 16, "num_generations": 4}))
    cfg = load_config("grpo", path, ["algo.ppo_epochs=2"])
    assert (cfg.algo.kl.coef, cfg.algo.ppo_epochs) == (0.04, 2)  # the file's, the command line's
    assert (cfg.algo.rollout_batch_size, cfg.algo.mini_batch_size) == (4, 16)  # TRL's geometry from the file's B, K
    assert differences(cfg) == []  # the user's own values are never listed: the rest are TRL's
    cfg = load_config("grpo", path, ["algo.rollout_batch_size=8"])  # an explicit key wins over TRL's derivation
    assert (cfg.algo.rollout_batch_size, cfg.algo.mini_batch_size, step_geometry(cfg).updates_per_step) == (8, 16, 2)


def test_the_command_line_wins_over_the_file_whichever_names(tmp_path):
    # the shipped config sets algo.ppo.clip_high (null); TRL's epsilon_high on the command line wins over it
    cfg = load_config("grpo", "configs/grpo.yaml", [M, "epsilon_high=0.28", "data.train=x.jsonl"])
    assert cfg.algo.ppo.clip_high == 0.28
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump({"model": {"name": "tiny:x"}, "algo": {"kl": {"coef": 0.1},
                                                                         "mini_batch_size": 32}}))
    assert load_config("grpo", path, ["beta=0.2"]).algo.kl.coef == 0.2  # TRL name over the file's key
    assert load_config("grpo", path, ["gradient_accumulation_steps=2"]).algo.mini_batch_size == 16  # derived too
    path.write_text(yaml.safe_dump({"model": {"name": "tiny:x"}, "beta": 0.1, "gradient_accumulation_steps": 2}))
    assert load_config("grpo", path, ["algo.kl.coef=0.3", "algo.mini_batch_size=8"]).algo.mini_batch_size == 8
    path.write_text(yaml.safe_dump({"model": {"name": "tiny:x"}, "gradient_accumulation_steps": 2,
                                    "algo": {"mini_batch_size": 32}}))
    with pytest.raises(ConfigError, match="'gradient_accumulation_steps' \\(TRL\\) makes algo.mini_batch_size=16"):
        load_config("grpo", path, [])  # two values in one source stay an error


def test_the_runs_length():
    cfg = build_config("grpo", {}, [M, "algo.ppo_epochs=2"])  # 16 prompts x 4, 4 updates of 16, 2 epochs: 8 a step
    assert (step_geometry(cfg).steps, step_geometry(cfg).updates) == (16, 128)  # 1024 samples
    assert step_geometry(build_config("grpo", {}, [M])).updates == 64  # grpo's default: one pass
    cfg = build_config("grpo", {}, [M, "algo.ppo_epochs=2", "max_steps=20"])  # TRL's max_steps: updates, whole steps
    assert (step_geometry(cfg).steps, step_geometry(cfg).updates) == (3, 24)
    cfg = build_config("grpo", {}, [M, "num_train_epochs=2"])
    assert cfg.algo.total_episodes is None and step_geometry(cfg).steps is None  # counted from the prompts
    assert step_geometry(cfg, 1, n_prompts=100).steps == 2 * (100 // 16)
    assert step_geometry(cfg, 2, n_prompts=100).steps == 2 * (100 // 32)


def test_a_split_that_does_not_divide_names_the_nearest_values():
    with pytest.raises(ConfigError) as e:
        build_config("grpo", {}, [M, "algo.mini_batch_size=24"])
    msg = str(e.value)  # 16 prompts x 4 = 64 samples, micro-batches of 8
    assert "algo.mini_batch_size=16 or 32" in msg and "algo.rollout_batch_size=12 or 18" in msg
    with pytest.raises(ConfigError, match=r"train.batch_size=4 or 8 \(divisors of 16\)"):
        build_config("grpo", {}, [M, "train.batch_size=5"])
    for bad in (["algo.mini_batch_size=5"], ["train.batch_size=3", "algo.mini_batch_size=12"],
                ["algo.rollout_batch_size=3", "algo.num_generations=5", "algo.mini_batch_size=10"]):
        with pytest.raises(ConfigError) as e:
            build_config("grpo", {}, [M, *bad])
        fixes = e.value.fix.removeprefix("set ")
        # every value named works: applied, the config builds
        for fix in fixes.split(", or "):
            settings = [f"{k}={v.split()[0]}" for k, v in (part.split("=", 1) for part in fix.split(" with "))]
            check_split(build_config("grpo", {}, [M, *bad, *settings]))


@pytest.mark.parametrize("n", [1, 12, 64, 97, 360])
def test_divisor_helpers_against_a_slow_loop(n):
    assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    for target in (1, 5, 7, 30):
        slow = [d for d in range(1, n + 1) if n % d == 0 and d % 2 == 0]
        got = nearest_divisors(n, target, 2)
        below, above = [d for d in slow if d <= target], [d for d in slow if d >= target]
        assert got == sorted({*below[-1:], *above[:1]})
    assert nearest_multiples(6, 20) == [18, 24] and nearest_multiples(6, 18) == [18] and nearest_multiples(6, 2) == [6]
    assert nearest([], 3) == []


def test_the_block_an_online_run_starts_with(monkeypatch):
    cfg = build_config("grpo", {}, [M, "per_device_train_batch_size=8", "num_generations=4"])
    text = startup_block(cfg, 1, 2000)
    lines, flat = text.splitlines(), text.replace("\n    ", " ")
    assert lines[0].startswith("[grpo] rlhfkit's defaults where TRL 1.16's GRPOConfig differs (defaults=trl for TRL's)")
    assert "[grpo] step: 16 prompts x 4 generations = 64 samples (1 process) -> 4 updates of 16" in flat
    assert "x 1 PPO epoch = 4 updates per step" in flat
    assert "[grpo] run: 16 steps = 64 updates, from algo.total_episodes=1024 samples" in flat
    for item in ("algo.kl.coef=0.04 [beta=0]", "algo.loss_aggregation=seq_mean_token_mean [loss_type=dapo]"):
        assert item in flat
    for own in ("algo.num_generations=", "train.batch_size=", "algo.ppo_epochs="):  # the user's values (TRL names
        # on the command line), and a default that is TRL's (grpo's one pass over each rollout)
        assert own not in flat
    assert max(len(line) for line in lines) <= 120
    trl = startup_block(build_config("grpo", {}, [M, "defaults=trl"]), 1, 100).replace("\n    ", " ")
    assert "differs" not in trl and "[grpo] defaults: TRL 1.16's GRPOConfig (defaults=trl)" in trl
    assert "unlike TRL 1.16 here:" in trl and "TRL logs every logging_steps" in trl
    assert "rlhfkit's practice, not switched on: missing_eos_penalty=1.0" in trl
    assert "reward.missing_eos_scope=varied (the penalty only where a group's scores differ" in trl  # grpo's scope
    said = {ov: startup_block(build_config("grpo", {}, [M, "defaults=trl", ov]), 1, 100).replace("\n    ", " ")
            for ov in ("missing_eos_penalty=null", "missing_eos_penalty=1.0", "reward.missing_eos_scope=all")}
    assert "missing_eos_scope" not in said["missing_eos_penalty=null"]  # no penalty asked for: no scope to advise
    assert "reward.missing_eos_scope=varied" in said["missing_eos_penalty=1.0"]  # TRL's penalty: on every answer
    assert "missing_eos_scope=varied" not in said["reward.missing_eos_scope=all"]  # the user's decision
    rloo = startup_block(build_config("rloo", {}, [M, "defaults=trl"]), 1, 100)
    assert "missing_eos_scope" not in rloo  # measured on grpo only
    assert "TRL" not in startup_block(build_config("ppo", {}, [M]), 1, 100)  # no TRL trainer to compare with
    epochs = startup_block(build_config("grpo", {}, [M, "train.epochs=2"]), 1, 100).replace("\n    ", " ")
    assert "train.epochs=2 is not read" in epochs  # the run's length comes from algo.total_episodes
    assert step_block(cfg, 1, 2000).splitlines()[0].startswith("[grpo] step:")


def test_the_block_is_printed_before_any_weights_load(tmp_path, capsys, monkeypatch):
    import json

    from rlhfkit.train.online import learner
    from rlhfkit.train.online import synchronous as online

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(40)))
    cfg = build_config("grpo", {}, [M, f"data.train={data}", "reward.functions=[{fn: exact_match}]"])
    monkeypatch.setattr(learner, "load_causal_lm", lambda *a, **k: pytest.fail("weights loaded"))
    online._before_run(cfg)
    out = capsys.readouterr().out
    assert "[grpo] step: 16 prompts x 4 generations" in out and "where TRL 1.16's GRPOConfig differs" in out


def test_online_checks_say_what_would_be_silent(capsys):
    with pytest.raises(ConfigError, match="every group ties and grpo learns nothing") as e:
        build_config("grpo", {}, [M, "temperature=0"])
    assert "generation.temperature=1.0" in e.value.fix
    with pytest.raises(ConfigError, match="train.log_every=10 is not read by the online recipes"):
        build_config("grpo", {}, [M, "train.log_every=10"])
    build_config("grpo", {}, [M, "logging_steps=10"])  # TRL's name: noted, nothing to set
    assert "logging_steps=10: nothing to set" in capsys.readouterr().err


def test_ppo_greedy_and_bf16_on_a_cpu_are_said_before_weights(tmp_path, capsys, monkeypatch):
    import torch

    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "q"}\n')
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = build_config("ppo", {}, [M, f"data.train={data}", "reward.functions=[{fn: exact_match}]",
                                   "critic.init=policy", "generation.temperature=0", "bf16=true"])
    cfg.check_inputs()
    out = capsys.readouterr().out
    assert "generation.temperature=0: greedy rollouts explore nothing" in out
    assert "train.mixed_precision=bf16 (TRL's bf16=true) on a CPU" in out
    cfg = build_config("ppo", {}, [M, f"data.train={data}", "reward.functions=[{fn: exact_match}]",
                                   "critic.init=policy"])
    cfg.check_inputs()
    assert capsys.readouterr().out == ""  # silent on a healthy config


@pytest.mark.parametrize("item,fix", [
    ("num_generation=4", "did you mean 'num_generations' (TRL) or 'algo.num_generations'?"),
    ("generation.num_generations=4", "did you mean 'algo.num_generations'?"),
    ("temprature=0.5", "did you mean 'temperature' (TRL) or 'generation.temperature'?"),
    ("rollout_batch_size=4", "did you mean 'algo.rollout_batch_size'?"),
    ("algo.kl.cof=1", "did you mean 'algo.kl.coef'?"),
    ("learnin_rate=1e-5", "did you mean 'learning_rate' (TRL)?"),
])
def test_did_you_mean_searches_rlhfkit_keys_and_trl_names_together(item, fix):
    with pytest.raises(ConfigError) as e:
        build_config("grpo", {}, [M, item])
    assert e.value.fix == fix


def test_did_you_mean_without_a_close_key_lists_the_level():
    with pytest.raises(ConfigError) as e:
        build_config("sft", {}, [M, "xyzzy=1"])
    assert e.value.fix.startswith("valid keys: data, defaults, distributed")
    with pytest.raises(ConfigError, match="'device' \\(TRL\\) has no rlhfkit equivalent") as e:
        build_config("grpo", {}, [M, "device=cpu"])
    assert "CUDA_VISIBLE_DEVICES=" in e.value.fix


def test_the_trl_steps_line_matches_math():
    # rlhfkit's default grpo step: 64 samples in 4 updates; TRL's default generates one update's worth (16 = 4 x 4)
    cfg = build_config("grpo", {}, [M])
    geo = step_geometry(cfg)
    assert geo.mini_batches == 4 and geo.mini // geo.k == 4 and math.gcd(geo.samples, geo.mini) == 16
