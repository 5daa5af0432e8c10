"""End-to-end runs of the online variants of issue 11 on the tiny model: GSPO, DAPO (dynamic sampling, overlong
shaping), off-policy correction, and the multi-turn calculator environment. Same task and reward as
tests/e2e/test_online.py: the SFT policy shouts about 40 % of the time; the exact-match reward prefers shouting."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import produced, rollout_of, score_of

from rlhfkit.algos import group_all_tied
from rlhfkit.config import build_config
from rlhfkit.train.online.synchronous import run_online

REWARD_FN = "reward.functions=[{fn: 'rlhfkit.tasks.quickstart:reward'}]"


def overrides(task_data, sft_dir, out, *extra) -> list[str]:
    return [f"data.train={task_data / 'prompts.jsonl'}", f"data.eval={task_data / 'eval_prompts.jsonl'}",
            f"output_dir={out}", f"model.name={sft_dir}", "optim.lr=1e-4", "train.batch_size=32",
            "generation.max_new_tokens=12", "track.report=false", "data.max_length=64", "track.sample_every=0",
            "train.resume=never", REWARD_FN, *extra]


def metrics_of(run_dir) -> list[dict]:
    """The run's metrics.jsonl under rlhfkit's names (it writes TRL's for grpo / rloo / online-dpo)."""
    from rlhfkit.track.metrics import read_run_metrics

    return read_run_metrics(run_dir)


@pytest.mark.slow
def test_gspo_raises_gold(task_data, sft_dir, gold_of, tmp_path):
    """GSPO-token equals GSPO in value and gradient for group advantages (unit test), so only GSPO runs here."""
    loss = "gspo"
    out = tmp_path / loss
    cfg = build_config("grpo", {}, overrides(
        task_data, sft_dir, out, f"algo.policy_loss={loss}", "algo.gspo.clip_low=3e-3", "algo.gspo.clip_high=4e-3",
        "algo.rollout_batch_size=8", "algo.num_generations=4", "algo.mini_batch_size=16", "train.batch_size=16",
        "algo.total_episodes=1024"))
    run_online(cfg)
    sft, new = gold_of(sft_dir), gold_of(out)
    print(f"[gspo] gold {sft:.3f} (sft) -> {new:.3f}")
    assert new > sft + 0.15, (loss, sft, new)


def _trainer(task_data, sft_dir, tmp_path, recipe="grpo", *extra):
    from rlhfkit.train.lifecycle.run import start_run
    from rlhfkit.train.online.synchronous import OnlineTrainer

    cfg = build_config(recipe, {}, overrides(
        task_data, sft_dir, tmp_path / "t", "algo.rollout_batch_size=4", "algo.num_generations=2",
        "algo.mini_batch_size=8", "train.batch_size=4", "algo.total_episodes=8", *extra))
    return OnlineTrainer(cfg, start_run(cfg))


@pytest.mark.parametrize("correction", ["tis", "mis"])
def test_off_policy_metrics_and_correction_in_the_loop(correction, task_data, sft_dir, tmp_path):
    """On CPU in float32 the engine's sampling log-probs are the trainer's: tiny mismatch, weights 1, nothing
    dropped; a mismatch injected into the rollout log-probs shows in the metrics and in the weights / mask."""
    online = _trainer(task_data, sft_dir, tmp_path, "grpo", f"algo.off_policy.correction={correction}",
                      "algo.off_policy.cap=1.5", "algo.ppo_epochs=2")  # 2 passes: old log-probs are taken
    trainer = online.learner
    exp = rollout_of(online)
    score_of(online, exp)
    trainer.forward_passes(exp)
    mask0 = exp.mask.clone()
    metrics = trainer.advantages(exp)
    assert metrics["rollout/logprob_diff_max"] < 1e-4
    assert metrics["rollout/is_ratio_outside_frac"] == 0.0
    torch.testing.assert_close(exp.is_weights[mask0.bool()], torch.ones(int(mask0.sum())), atol=1e-4, rtol=0)
    assert torch.equal(exp.mask, mask0)
    # inject: the engine said the first token of every row was 4x less likely than the trainer finds it
    exp2 = rollout_of(online)
    exp2.rollout.logprobs[:, 0] -= math.log(4.0)
    score_of(online, exp2)
    trainer.forward_passes(exp2)
    metrics = trainer.advantages(exp2)
    assert metrics["rollout/logprob_diff_max"] == pytest.approx(math.log(4.0), abs=1e-4)
    assert metrics["rollout/is_ratio_p99"] == pytest.approx(4.0, rel=1e-3)
    assert metrics["rollout/is_ratio_outside_frac"] > 0
    if correction == "tis":
        torch.testing.assert_close(exp2.is_weights[:, 0], torch.full((len(exp2.rollout),), 1.5), atol=1e-4, rtol=0)
    else:
        assert torch.all(exp2.mask[:, 0] == 0) and torch.all(exp2.advantages[:, 0] == 0)
    stats = trainer.policy_micro_step(exp2.rows_of(torch.arange(len(exp2.rollout))), 1.0)
    assert torch.isfinite(stats["loss/policy_avg"])


@pytest.mark.parametrize("loss", ["ppo", "vespo"])
def test_top_entropy_quantile_in_the_loop_is_the_loss_on_the_high_entropy_tokens(loss, task_data, sft_dir, tmp_path):
    """algo.top_entropy_quantile=0.2 (TRL's top_entropy_quantile): a micro-step's gradient is that of the full loss
    with the advantages zeroed on every token below TRL's threshold (torch.quantile of the mask's entropies at 0.8),
    KL term included, and it differs from the gradient on every token. For vespo the selection goes apart from its
    weights (``token_keep``: its kernel still sees every token); with one advantage a row, zeroing the others'
    advantages leaves each row's kernel as it was, so the same equality holds."""
    from rlhfkit.config import replace
    from rlhfkit.train.shared.forward import response_stats

    online = _trainer(task_data, sft_dir, tmp_path, "grpo", "algo.top_entropy_quantile=0.2",
                      f"algo.policy_loss={loss}")
    learner = online.learner
    exp = rollout_of(online)
    score_of(online, exp)
    learner.forward_passes(exp)
    learner.advantages(exp)
    idx = torch.arange(len(exp.rollout))
    adv = torch.linspace(-1.5, 2.0, len(idx))  # by hand: a tiny model's groups may all tie
    mask = exp.rows_of(idx)["mask"].bool()
    with torch.no_grad():
        ent = response_stats(learner.policy, exp.rows_of(idx), online.cfg.generation.temperature, entropy=True).entropy
    keep = mask & (ent >= torch.quantile(ent[mask].float(), 0.8))
    assert 0 < keep.sum() < mask.sum()

    def grads(cfg, advantages):
        learner.cfg = cfg
        learner.policy.zero_grad(set_to_none=True)
        batch = {**exp.rows_of(idx), "advantages": advantages}
        st = learner.policy_micro_step(batch, 1.0)
        return torch.cat([p.grad.flatten() for p in learner.policy.parameters() if p.grad is not None]), st

    g_top, st = grads(online.cfg, adv)
    assert float(st["policy/high_entropy_frac"]) == pytest.approx(float(keep.sum() / mask.sum()))
    every = replace(online.cfg, algo={"top_entropy_quantile": 1.0})
    g_zeroed, st_every = grads(every, adv[:, None] * keep)
    assert "policy/high_entropy_frac" not in st_every
    torch.testing.assert_close(g_top, g_zeroed, rtol=1e-5, atol=1e-8)
    g_all, _ = grads(every, adv)
    assert (g_all - g_top).abs().max() > 1e-3 * g_all.abs().max()


def test_dynamic_sampling_in_the_loop_keeps_only_informative_groups(task_data, sft_dir, tmp_path):
    trainer = _trainer(task_data, sft_dir, tmp_path, "grpo", "algo.dynamic_sampling.enabled=true",
                       "algo.dynamic_sampling.max_draws=6", "algo.num_generations=4", "algo.mini_batch_size=16",
                       "reward.missing_eos_penalty=0")
    exp = produced(trainer)
    k, n = trainer.learner.k, trainer.cfg.algo.rollout_batch_size
    assert len(exp.rollout) == k * n == len(exp.rows) == len(exp.texts) == len(exp.raw_scores)
    m = exp.reward_metrics
    assert 1 <= m["rollout/dynamic_draws"] <= 6
    if m["rollout/degenerate_groups_filled"] == 0:
        assert not group_all_tied(exp.raw_scores.cpu(), k).any()
    # rows of a group share their prompt, and its texts / scores were carried with it
    g = exp.raw_scores.reshape(k, n)
    for p in range(n):
        prompts = {exp.rows[j * n + p]["prompt"][-1]["content"] for j in range(k)}
        assert len(prompts) == 1
    assert torch.isfinite(g).all()
    assert exp.scores is not None and exp.scores.shape == exp.raw_scores.shape


def test_dynamic_sampling_stops_at_its_cap(task_data, sft_dir, tmp_path):
    const = tmp_path / "const_reward.py"
    const.write_text("def zero(prompts, completions, **fields):\n    return [0.0] * len(completions)\n")
    trainer = _trainer(task_data, sft_dir, tmp_path, "grpo", "algo.dynamic_sampling.enabled=true",
                       "algo.dynamic_sampling.max_draws=3", "reward.missing_eos_penalty=0",
                       f"reward.functions=[{{fn: '{const}:zero'}}]")
    calls = []
    real = trainer.producer.rollout
    trainer.producer.rollout = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    exp = produced(trainer)
    assert len(calls) == 3
    m = exp.reward_metrics
    assert m["rollout/dynamic_draws"] == 3 and m["rollout/degenerate_groups"] == 3 * 4
    assert m["rollout/degenerate_groups_filled"] == 4 and len(exp.rollout) == 8


def test_overlong_shaping_and_filter(task_data, sft_dir, tmp_path):
    trainer = _trainer(task_data, sft_dir, tmp_path, "grpo", "algo.overlong.cache_len=4", "algo.overlong.filter=true",
                       "generation.max_new_tokens=6", "reward.missing_eos_penalty=0", "reward.normalize=false",
                       "reward.clip=null")
    exp = produced(trainer)
    want = exp.raw_scores - torch.clamp((exp.rollout.lengths.float() - 2) / 4, 0, 1)
    torch.testing.assert_close(exp.scores, want)
    trainer.learner.forward_passes(exp)
    trainer.learner.advantages(exp)
    cut = ~exp.rollout.ended
    assert torch.all(exp.mask[cut] == 0) and torch.all(exp.advantages[cut] == 0)
    penalty = torch.clamp((exp.rollout.lengths.float() - 2) / 4, 0, 1)
    assert exp.reward_metrics["rewards/overlong_penalty/mean"] == pytest.approx(-penalty.mean().item())


def test_multiturn_calculator_run_end_to_end(tmp_path):
    """A GRPO run with the built-in calculator environment from an untrained tiny model goes through the real loop
    (episodes, masks, rewards, updates, save) and logs the environment's metrics. An untrained model never writes a
    tool call; that tool use is learned is measured by test_calculator_tool_use_is_learned (SFT first)."""
    from rlhfkit.envs import make_arithmetic_prompts

    data = tmp_path / "p.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in make_arithmetic_prompts(40)))
    out = tmp_path / "calc"
    cfg = build_config("grpo", {}, [
        f"data.train={data}", f"output_dir={out}", "model.name=tiny:hidden=32,layers=1", "env.name=calculator",
        "env.max_turns=2", "env.max_total_tokens=40", "generation.max_new_tokens=16", "algo.rollout_batch_size=4",
        "algo.num_generations=2", "algo.mini_batch_size=8", "train.batch_size=8", "algo.total_episodes=16",
        "track.report=false", "track.sample_every=0", "train.resume=never", "data.eval_fraction=0.1",
        "algo.off_policy.correction=tis",
        # a random tiny model earns the same (zero) reward in every group unless an episode happens to end at EOS:
        # the entropy bonus gives every update a gradient (a run that applies no update ends in NoUpdateError)
        "algo.entropy_coef=0.01"])
    last = run_online(cfg)
    rows = metrics_of(out)
    assert len([r for r in rows if "objective/scores" in r]) == 2
    for key in ("env/tool_call_success", "env/turns_mean", "env/episode_reward_mean", "rollout/is_ratio_p99"):
        assert key in last, key
    assert last["env/tool_call_success"] == 0.0 and 1.0 <= last["env/turns_mean"] <= 2.0  # untrained: no calls
    assert (out / "model.safetensors").exists()


CALC = ["env.name=calculator", "env.kwargs={system_prompt: ''}", "env.max_turns=2", "env.max_total_tokens=140",
        "generation.max_new_tokens=100"]


def held_out_tool_success(model_dir, rows: list[dict], seed: int = 0) -> float:
    """Fraction of episodes with a successful calculator call, one episode per row, played outside the trainer
    (``rlhfkit eval --env``'s episodes, a fixed seed, the same limits as the run)."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.envs import CalculatorEnv
    from rlhfkit.evaluate import play_answers
    from rlhfkit.models.tokenizer import load_tokenizer

    tok, model = load_tokenizer(str(model_dir)), AutoModelForCausalLM.from_pretrained(model_dir).eval()
    played = play_answers(model, tok, rows, CalculatorEnv, "calculator", {"system_prompt": ""}, max_new_tokens=100,
                          temperature=1.0, max_turns=2, max_total_tokens=140, seed=seed)
    return played["env"]["tool_call_success"]


@pytest.mark.slow
@pytest.mark.cluster  # 50 s: one of the longest learning checks, run by make test-cluster (CI runs it)
def test_calculator_tool_use_is_learned(tmp_path):
    """The issue's test: the calculator environment's tool-call success rate rises over training. SFT on the
    calculator task's demonstrations (30 % call the tool) teaches the call format; GRPO with the environment then
    makes successful calls far more frequent. Measured on 128 held-out episodes played outside the trainer (SFT
    policy vs the trained one), and in the run's own training and evaluation metrics."""
    from rlhfkit.tasks import make_task_data
    from rlhfkit.train.supervised.sft import run_sft

    data = tmp_path / "data"
    make_task_data("calculator", data, n=800, n_eval=64)
    sft = tmp_path / "sft"
    run_sft(build_config("sft", {}, [
        f"data.train={data / 'sft.jsonl'}", f"output_dir={sft}", "model.name=tiny:hidden=64,layers=2,intermediate=128",
        "optim.lr=5e-3", "train.batch_size=32", "train.epochs=12", "data.max_length=200", "track.report=false"]))
    out = tmp_path / "grpo"
    last = run_online(build_config("grpo", {}, [
        f"data.train={data / 'prompts.jsonl'}", f"data.eval={data / 'eval_prompts.jsonl'}", f"output_dir={out}",
        f"model.name={sft}", *CALC, "algo.rollout_batch_size=8", "algo.num_generations=4",
        "algo.mini_batch_size=32", "train.batch_size=32", "algo.total_episodes=1024", "optim.lr=3e-4",
        "data.max_length=200", "track.report=false", "track.sample_every=0", "train.resume=never"]))
    held_out = [json.loads(x) for x in (data / "eval_prompts.jsonl").read_text().splitlines()] * 2
    before, after = held_out_tool_success(sft, held_out), held_out_tool_success(out, held_out)
    curve = [r["env/tool_call_success"] for r in metrics_of(out) if "env/tool_call_success" in r]
    first, late = sum(curve[:4]) / 4, sum(curve[-8:]) / 8
    print(f"[calculator] held-out tool-call success {before:.3f} (sft) -> {after:.3f}; training {first:.3f} -> "
          f"{late:.3f}; run's eval {last['eval/env/tool_call_success']:.3f}")
    assert 0.05 < before < 0.6, before  # SFT learned the format from 30 % of demonstrations, not more
    assert after > before + 0.2, (before, after)
    assert late > first + 0.15, curve
    assert last["eval/env/tool_call_success"] > before + 0.15


def test_user_environment_run_end_to_end(task_data, two_questions_env, tmp_path):
    out = tmp_path / "user_env"
    cfg = build_config("grpo", {}, [
        f"data.train={task_data / 'prompts.jsonl'}", f"output_dir={out}", "model.name=tiny:hidden=32,layers=1",
        f"env.name={two_questions_env}", "env.kwargs={limit: 8}", "env.max_turns=3", "env.max_total_tokens=40",
        "generation.max_new_tokens=8", "algo.rollout_batch_size=4", "algo.num_generations=2",
        "algo.mini_batch_size=8", "train.batch_size=8", "algo.total_episodes=16", "track.report=false",
        "track.sample_every=0", "train.resume=never", "data.limit=64",
        "algo.entropy_coef=0.01"])  # an untrained model may tie in every group: the bonus keeps each update non-zero
    last = run_online(cfg)
    # the user's metric (step calls counted by the environment) agrees with the loop's own turn count
    assert last["env/turns_seen"] == pytest.approx(last["env/turns_mean"]) and 1.0 <= last["env/turns_mean"] <= 2.0
    assert last["env/episode_reward_mean"] <= last["env/turns_mean"]  # at most 1 per turn


MY_REWARD = '''
def shouted(prompts, completions, target, **fields):
    """1 for the exact target word, 0.5 for it in any case, else 0."""
    return [1.0 if c.strip() == t else 0.5 if c.strip().lower() == t.lower() else 0.0
            for c, t in zip(completions, target)]
'''


@pytest.mark.parametrize("config", ["configs/gspo.yaml", "configs/dapo.yaml"])
def test_shipped_gspo_and_dapo_configs_on_your_own_prompts_and_reward(config, task_data, sft_dir, tmp_path,
                                                                      monkeypatch):
    """What a user does with the shipped configs: their own prompt file (their own column names) and reward
    function file, through the CLI. The run must finish, use the config's variant and call the user's function."""
    from rlhfkit.cli import main

    rows = [json.loads(x) for x in (task_data / "prompts.jsonl").read_text().splitlines()[:64]]
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("\n".join(json.dumps({"question": r["prompt"], "target": r["answer"]}) for r in rows))
    (tmp_path / "my_reward.py").write_text(MY_REWARD)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    code = main(["grpo", str(Path(__file__).parents[2] / config), f"model.name={sft_dir}", f"data.train={prompts}",
                 "data.eval=null", "data.fields={prompt: question}", f"output_dir={out}",
                 "reward.functions=[{fn: my_reward.py:shouted}]", "algo.rollout_batch_size=8",
                 "algo.num_generations=4", "algo.mini_batch_size=16", "train.batch_size=16", "algo.total_episodes=64",
                 "generation.max_new_tokens=12", "data.max_length=64", "track.report=false", "track.progress=false"])
    assert code == 0
    rows_out = metrics_of(out)
    assert any("rewards/shouted/mean" in r for r in rows_out)
    saved = (out / "config.yaml").read_text()
    assert ("policy_loss: gspo" in saved) == config.endswith("gspo.yaml")
    assert ("enabled: true" in saved) == config.endswith("dapo.yaml")  # dynamic sampling on in DAPO only
    if config.endswith("dapo.yaml"):
        assert any("rollout/dynamic_draws" in r for r in rows_out)
