"""Every online recipe, the multi-turn calculator and ``rlhfkit eval`` with ``generation.engine=static`` and ``auto``
(issue 18), GRPO with ``continuous`` (issue 31, and its resumed run generating what the straight one did), a few
steps each on the session's SFT policy (tiny model), from the shipped configs/*.yaml.

What is checked on every run: the engine's sampling log-probs equal the trainer's recomputed ones at every step
(``rollout/logprob_diff_max`` < 1e-4: the engine samples the distribution the trainer optimises), responses end at
their own EOS, scores and losses are finite, the final model is written. ``auto`` is the static engine uncompiled on
CPU, so the first step of an ``auto`` run equals the ``static`` run's with the same seed: every recipe runs on
``static``, and ``auto`` runs for one recipe with a critic (PPO) and one without (GRPO), each checked against its
``static`` twin (running ``auto`` for all six repeated the same runs: 25 s of the suite). Learning under ``auto`` (the
default engine) is what tests/e2e/test_online*.py measure; the compiled static step is tested under ``-m compile``
(tests/unit/test_rollout_static.py), so ``static`` runs here with ``compile: false``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import run_until_first_checkpoint

from rlhfkit.cli import main
from rlhfkit.config import load_config
from rlhfkit.train.online.synchronous import run_online

pytestmark = pytest.mark.slow

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ENGINES = {"static": ["generation.engine=static", "generation.engine_kwargs={compile: false}"],
           "auto": ["generation.engine=auto"],
           # 5 slots for 8 requests, small blocks, a cache of 256 tokens: slots are reused, blocks shared and grown
           "continuous": ["generation.engine=continuous", "generation.engine_kwargs={block_size: 4, sync_every: 2}",
                          "generation.batch_size=5", "generation.cache_tokens=256"]}
REWARD_FN = "reward.functions=[{fn: 'rlhfkit.tasks.quickstart:reward'}]"
SMALL = ["algo.rollout_batch_size=4", "algo.num_generations=2", "algo.mini_batch_size=8", "train.batch_size=8",
         "algo.total_episodes=16", "generation.max_new_tokens=12", "optim.lr=1e-4", "data.max_length=64",
         "track.report=false", "track.sample_every=0", "train.resume=never", "train.save_every=0"]
RECIPES = {  # config file -> (recipe, what it needs beyond the shipped file to run on the session's SFT policy)
    "ppo": ("ppo", ["reward.model=null", REWARD_FN, "critic.init=policy"]),
    "grpo": ("grpo", []),
    "rloo": ("rloo", []),
    "reinforce": ("reinforce", []),
    "gspo": ("grpo", []),
    "dapo": ("grpo", ["algo.dynamic_sampling.max_draws=2"]),
}


def metrics_of(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl under rlhfkit's names (it writes TRL's for grpo / rloo / online-dpo)."""
    from rlhfkit.track.metrics import read_run_metrics

    return read_run_metrics(run_dir)


def run_recipe(name: str, engine: str, task_data: Path, sft_dir: Path, out: Path) -> list[dict]:
    recipe, extra = RECIPES[name]
    cfg = load_config(recipe, CONFIGS / f"{name}.yaml", [
        f"data.train={task_data / 'prompts.jsonl'}", f"data.eval={task_data / 'eval_prompts.jsonl'}",
        f"output_dir={out}", f"model.name={sft_dir}", *SMALL, *extra, *ENGINES[engine]])
    assert cfg.generation.engine == engine
    run_online(cfg)
    assert (out / "model.safetensors").exists()
    return [r for r in metrics_of(out) if "objective/scores" in r]


AUTO_TOO = ("ppo", "grpo")  # the recipes run on ``auto`` as well as ``static``
RUNS = [(name, "static") for name in RECIPES] + [(name, "auto") for name in AUTO_TOO] + [("grpo", "continuous")]


@pytest.fixture(scope="module")
def runs(task_data, sft_dir, tmp_path_factory) -> dict:
    """name -> engine -> the step rows of its metrics.jsonl; every run made once for the module."""
    root = tmp_path_factory.mktemp("engines")
    out: dict[str, dict] = {}
    for name, engine in RUNS:
        out.setdefault(name, {})[engine] = run_recipe(name, engine, task_data, sft_dir, root / f"{name}-{engine}")
    return out


@pytest.mark.parametrize(("name", "engine"), RUNS)
def test_every_online_recipe_runs_on_the_engine(runs, name, engine):
    rows = runs[name][engine]
    assert len(rows) == 2  # 16 episodes, 8 per step
    for r in rows:
        assert r["rollout/logprob_diff_max"] < 1e-4, r["rollout/logprob_diff_max"]  # sampled = trainer's
        assert math.isfinite(r["objective/scores"]) and math.isfinite(r["loss/policy_avg"])
        assert r["response/clipped_frac"] < 1 and r["response/length_mean"] < 12  # responses end at their own EOS
    if name == "ppo":
        assert all(math.isfinite(r["loss/value_avg"]) for r in rows)


@pytest.mark.parametrize("name", AUTO_TOO)
def test_auto_is_the_uncompiled_static_engine_on_cpu(runs, name):
    first = {e: runs[name][e][0] for e in ("static", "auto")}  # the same seed, the same weights: the same rollout
    for key in ("objective/scores", "response/length_mean", "response/clipped_frac"):
        assert first["auto"][key] == first["static"][key], key


def test_continuous_engine_resumed_run_generates_what_the_straight_run_did(task_data, tmp_path):
    """GRPO on the continuous engine, 3 steps with a checkpoint after each: a run stopped after its first checkpoint
    and resumed generates, at steps 2 and 3, the responses the run that never stopped generated (each request's
    generator is seeded by the run seed, the step, its prompt and its sample, nothing else). A random tiny policy:
    what is checked is the generation, not learning."""
    from rlhfkit.track.samples import read_samples

    def cfg_for(out, resume="never"):
        recipe, extra = RECIPES["grpo"]
        return load_config(recipe, CONFIGS / "grpo.yaml", [
            f"data.train={task_data / 'prompts.jsonl'}", "data.eval=null", f"output_dir={out}",
            "model.name=tiny:hidden=32,layers=1", *SMALL, *extra, *ENGINES["continuous"], "algo.total_episodes=24",
            "train.save_every=1", "track.sample_every=1", f"train.resume={resume}"])

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_online(cfg_for(straight))
    run_until_first_checkpoint(run_online, cfg_for(resumed))
    run_online(cfg_for(resumed, "auto"))
    want = [(r["step"], r["prompt"], r["response"]) for r in read_samples(straight)]
    got = [(r["step"], r["prompt"], r["response"]) for r in read_samples(resumed)]
    assert len({step for step, _, _ in want}) == 3 and got == want  # three steps (updates 2, 4, 6)
    assert len({response for _, _, response in want}) > 4  # sampled, not one repeated answer


@pytest.mark.parametrize("engine", ["static", "auto"])
def test_multiturn_calculator_on_the_engine(engine, tmp_path):
    from rlhfkit.envs import make_arithmetic_prompts

    data = tmp_path / "p.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in make_arithmetic_prompts(40)))
    out = tmp_path / "calc"
    cfg = load_config("grpo", CONFIGS / "multiturn_calculator.yaml", [
        f"data.train={data}", "data.eval=null", "data.eval_fraction=0.1", f"output_dir={out}",
        "model.name=tiny:hidden=32,layers=1", "env.max_turns=2", "env.max_total_tokens=40", *SMALL,
        "generation.max_new_tokens=16",
        # a random tiny model earns the same (zero) reward in every group: without an entropy bonus no update would
        # have a gradient, and a run that applies no update ends in NoUpdateError (exit 2) instead of a model
        "algo.entropy_coef=0.01", *ENGINES[engine]])
    last = run_online(cfg)
    rows = [r for r in metrics_of(out) if "objective/scores" in r]
    assert len(rows) == 2 and all(r["rollout/logprob_diff_max"] < 1e-4 for r in rows)
    assert 1.0 <= last["env/turns_mean"] <= 2.0 and math.isfinite(last["env/episode_reward_mean"])
    assert (out / "model.safetensors").exists()


def test_eval_greedy_answers_are_the_same_on_every_engine(sft_dir, task_data, tmp_path):
    """``rlhfkit eval --engine E``: greedy answers token-identical to hf's, so the same gold metric."""
    results = {}
    for engine, kwargs in (("hf", "{}"), ("static", "{compile: false}"), ("auto", "{}")):
        out = tmp_path / f"{engine}.json"
        assert main(["eval", str(sft_dir), "--data", str(task_data / "eval_prompts.jsonl"), "--n", "24", "--greedy",
                     "--max-new-tokens", "12", "--batch-size", "16", "--task", "quickstart", "--engine", engine,
                     "--engine-kwargs", kwargs, "--out", str(out)]) == 0
        results[engine] = json.loads(out.read_text())
        assert results[engine]["sampling"]["engine"] == engine
    ref = [s["response"] for s in results["hf"]["samples"]]
    assert results["hf"]["responses"]["eos_frac"] > 0.5
    for engine in ("static", "auto"):
        assert [s["response"] for s in results[engine]["samples"]] == ref, engine
        assert results[engine]["gold"] == results["hf"]["gold"]
