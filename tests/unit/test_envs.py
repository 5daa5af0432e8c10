"""Multi-turn environments: the calculator (tool-call parsing, safe evaluation, per-turn / per-episode rewards), the
episode runner (model ids carried verbatim, environment tokens masked, limits), user environments from a file, and
a failing environment stopping the run with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from rlhfkit.config import ModelConfig
from rlhfkit.data.chat import render_conversation
from rlhfkit.envs import CalculatorEnv, EnvError, load_environment, parse_tool_calls, safe_eval
from rlhfkit.envs.episodes import run_episodes
from rlhfkit.envs.host import EnvCalls
from rlhfkit.models.loading import load_tokenizer_for
from rlhfkit.rollout import Engine, SamplingParams
from rlhfkit.tasks import get_task

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 3"}}</tool_call>'


def test_safe_eval_and_parse_tool_calls():
    assert safe_eval("12 * 3 + (4 - 1) ** 2") == 45
    assert safe_eval("-7 // 2") == -4
    for bad in ("__import__('os')", "a + 1", "2 ** 1000", "1 / 0", "[1]"):
        with pytest.raises(ValueError):
            safe_eval(bad)
    calls = parse_tool_calls("x " + CALL + ' y <tool_call>{"name": "calculator", "arguments": "{\\"expression\\": '
                             '\\"1+1\\"}"}</tool_call> <tool_call>not json</tool_call>')
    assert calls[0] == {"name": "calculator", "arguments": {"expression": "12 * 3"}}
    assert calls[1]["arguments"] == {"expression": "1+1"}  # arguments given as a JSON string (OpenAI style)
    assert calls[2]["name"] is None
    assert parse_tool_calls("The answer is 36") == []


def test_calculator_rewards_per_turn_and_per_episode():
    env = CalculatorEnv(tool_reward=0.2, answer_reward=1.0)
    msgs = env.reset({"prompt": [{"role": "user", "content": "What is 12 * 3?"}]})  # answer from the question
    new, r, done = env.step(msgs, CALL)
    assert new == [{"role": "tool", "content": "36"}] and r == pytest.approx(0.2) and not done
    new, r, done = env.step(msgs, "It is 36")
    assert new == [] and r == 1.0 and done
    assert env.metrics() == {"tool_calls": 1.0, "tool_call_success": 1.0, "correct": 1.0}
    env2 = CalculatorEnv()
    env2.reset({"prompt": "What is it?", "expression": "2 + 2"})
    new, r, _ = env2.step([], '<tool_call>{"name": "calc", "arguments": {}}</tool_call>')
    assert r == 0 and new[0]["content"].startswith("error")
    assert env2.step([], "5")[1] == 0.0 and env2.metrics()["tool_call_success"] == 0.0


def test_calculator_pays_the_tool_reward_once_per_episode():
    """Calling again (in the same turn or the next) earns nothing more: the reward cannot be farmed up to
    env.max_turns; the calls are still answered and counted."""
    env = CalculatorEnv(tool_reward=0.2)
    msgs = env.reset({"prompt": "What is 12 * 3?"})
    new, r, _ = env.step(msgs, CALL + CALL)
    assert r == pytest.approx(0.2) and new == [{"role": "tool", "content": "36"}] * 2
    new, r, done = env.step(msgs, CALL)
    assert r == 0.0 and new == [{"role": "tool", "content": "36"}] and not done
    assert env.metrics()["tool_calls"] == 3.0 and env.metrics()["tool_call_success"] == 1.0


class ScriptedEngine(Engine):
    """Stands in for a rollout engine: answers turn t of every episode with script[t] (text), as token ids. Like
    every engine it writes only ``_decode``; the base class cuts, pads and masks."""

    name = "scripted"

    def __init__(self, tok, script):
        super().__init__(tok, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
        self.tok, self.script, self.turn, self.prompts = tok, script, 0, []

    def _decode(self, model, ids, mask, params, seed):
        self.prompts.append([row[m.bool()].tolist() for row, m in zip(ids, mask)])
        text = self.script[min(self.turn, len(self.script) - 1)]
        self.turn += 1
        out = (self.tok(text, add_special_tokens=False)["input_ids"] + [self.eos_token_ids[0]])[:params.max_new_tokens]
        raw = torch.tensor([out] * len(ids))
        return raw, torch.full(raw.shape, -0.5)


MODEL = torch.nn.Linear(1, 1)  # the scripted engine reads no weights; generate() only needs a module


def _calls(cls, kwargs, spec):
    """The environment's calls in this process (the worker pool is tested in test_env_limits.py)."""
    return EnvCalls(spec, cls, kwargs, workers=0, timeout_s=None)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer_for(ModelConfig(name="tiny"))


def _episodes(tok, script, rows=None, **limits):
    rows = rows or [{"prompt": [{"role": "user", "content": "What is 12 * 3?"}]}] * 2
    eng = ScriptedEngine(tok, script)
    kw = {"max_turns": 4, "max_total_tokens": 400, **limits}
    rollout, eps = run_episodes(eng, MODEL, tok, _calls(CalculatorEnv, {}, "calculator"), rows,
                                params=SamplingParams(max_new_tokens=120), seed=0, **kw)
    return rollout, eps, eng


def test_episode_tokens_masks_and_rewards(tok):
    rollout, eps, eng = _episodes(tok, [CALL, "The answer is 36"])
    e = eps[0]
    assert e.turn_rewards == [pytest.approx(0.2), 1.0] and e.done and e.ended
    call_ids = tok(CALL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    answer_ids = tok("The answer is 36", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    n1, n2 = len(call_ids), len(answer_ids)
    row_ids = rollout.response_ids[0].tolist()
    act = rollout.action_mask[0].tolist()
    # the model's ids verbatim, then environment tokens (masked), then the model's second turn
    assert row_ids[:n1] == call_ids and act[:n1] == [1] * n1
    n_env = len(e.ids) - n1 - n2
    assert n_env > 0 and act[n1:n1 + n_env] == [0] * n_env
    assert row_ids[n1 + n_env:n1 + n_env + n2] == answer_ids and act[n1 + n_env:len(e.ids)] == [1] * n2
    env_text = tok.decode(row_ids[n1:n1 + n_env])
    assert "tool" in env_text and "36" in env_text and env_text.rstrip().endswith("assistant")
    # the second turn's prompt is exactly prompt + everything so far (no re-tokenising)
    assert eng.prompts[1][0] == e.prompt_ids + call_ids + row_ids[n1:n1 + n_env]
    assert rollout.response_mask[0].sum() == len(e.ids)
    assert torch.all(rollout.logprobs[0][rollout.action_mask[0] == 0] == 0)
    # the whole conversation re-rendered by the template gives the same tokens (nothing drifted between turns)
    assert e.messages[-1] == {"role": "assistant", "content": "The answer is 36"}
    assert render_conversation(tok, e.messages)[0][:len(e.prompt_ids) + len(e.ids)] == e.prompt_ids + e.ids


def test_episode_limits(tok):
    _, eps, eng = _episodes(tok, [CALL], max_turns=3)
    assert len(eps[0].turn_rewards) == 3 and eng.turn == 3  # tool calls every turn: stopped by max_turns
    rollout, eps, _ = _episodes(tok, [CALL], max_total_tokens=60)
    assert all(len(e.ids) <= 60 for e in eps) and not any(e.ended for e in eps)
    assert rollout.response_ids.shape[1] <= 60


def test_user_environment_from_file_and_failures(tmp_path, tok):
    f = tmp_path / "my_env.py"
    f.write_text(
        "class Echo:\n"
        "    def __init__(self, bonus=0.0):\n        self.bonus = bonus\n"
        "    def reset(self, row):\n        return row['prompt']\n"
        "    def step(self, messages, completion):\n        return [], 1.0 + self.bonus, True\n"
        "class Broken:\n"
        "    def reset(self, row):\n        return row['prompt']\n"
        "    def step(self, messages, completion):\n        raise KeyError('boom')\n")
    cls = load_environment(f"{f}:Echo")
    rows = [{"prompt": [{"role": "user", "content": "hi"}]}]
    eng = ScriptedEngine(tok, ["ok"])
    _, eps = run_episodes(eng, MODEL, tok, _calls(cls, {"bonus": 0.5}, f"{f}:Echo"), rows,
                          params=SamplingParams(max_new_tokens=8), seed=0, max_turns=2, max_total_tokens=50)
    assert eps[0].turn_rewards == [1.5]
    with pytest.raises(EnvError, match=r"environment Broken: step\(\) raised KeyError"):
        broken = _calls(load_environment(f"{f}:Broken"), {}, f"{f}:Broken")
        run_episodes(ScriptedEngine(tok, ["ok"]), MODEL, tok, broken, rows, params=SamplingParams(max_new_tokens=8),
                     seed=0, max_turns=2, max_total_tokens=50)
    for spec, match in ((f"{f}:Nope", "no attribute"), ("calculater", "did you mean 'calculator'"),
                        ("no.such.module:Env", "not found")):
        with pytest.raises(EnvError, match=match):
            load_environment(spec)


def test_cli_unloadable_environment_is_one_line_exit_2(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "What is 1 + 1?"}) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rlhfkit", "grpo", f"data.train={data}", f"output_dir={out}",
                           "env.name=missing_env.py:Env", "model.name=tiny:hidden=32,layers=1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "env.name" in lines[0] and "missing_env.py" in lines[0], proc.stderr
    assert not out.exists()


def test_environment_tokens_never_enter_loss_kl_or_values(tmp_path, tok, monkeypatch):
    """A PPO step (policy + critic + reference KL + TIS) on a scripted two-turn episode: at environment tokens the
    KL, advantages and returns are 0; garbage written into every per-token quantity there (old / reference / sampling
    log-probs, values, returns) changes no loss and no gradient; and the gradient of the losses with respect to the
    logits and values at environment positions is exactly 0."""
    from rlhfkit.config import build_config
    from rlhfkit.envs import make_arithmetic_prompts
    from rlhfkit.train.lifecycle.run import start_run
    from rlhfkit.train.online import learner as learner_module
    from rlhfkit.train.online.synchronous import OnlineTrainer

    data = tmp_path / "p.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in make_arithmetic_prompts(8)))
    cfg = build_config("ppo", {}, [f"data.train={data}", f"output_dir={tmp_path / 'run'}", "env.name=calculator",
                                   "model.name=tiny:hidden=32,layers=1", "critic.init=policy", "algo.kl.coef=0.1",
                                   "algo.off_policy.correction=tis", "algo.rollout_batch_size=2",
                                   "algo.mini_batch_size=2", "train.batch_size=2", "track.report=false",
                                   "train.resume=never", "data.eval_fraction=0.25", "generation.max_new_tokens=120"])
    online = OnlineTrainer(cfg, start_run(cfg))
    producer, trainer = online.producer, online.learner
    producer.engine = ScriptedEngine(trainer.tok, [CALL, "The answer is 36"])
    exp = producer.rollout(trainer.policy, producer.prompt_batch(0, 0), seed=0)
    producer.score(exp)
    exp.scores = trainer.shape_scores(exp.raw_scores, exp.rollout.ended, exp.rollout.lengths, exp.valid)
    trainer.forward_passes(exp)
    trainer.advantages(exp)
    env_pos = (exp.rollout.response_mask == 1) & (exp.rollout.action_mask == 0)
    assert env_pos.any() and torch.all(exp.mask[env_pos] == 0)
    for name in ("kl", "advantages", "returns"):
        assert torch.all(getattr(exp, name)[env_pos] == 0), name

    seen = {}
    real_stats, real_values = learner_module.response_stats, learner_module.response_values

    def stats_hook(model, batch, temperature, **kwargs):
        out = real_stats(model, batch, temperature, **kwargs)
        for name in ("logprobs", "entropy"):  # what the policy's loss reads of the head (train/shared/forward.py)
            t = getattr(out, name)
            if t is not None and t.requires_grad:
                t.retain_grad()
                seen[name] = t
        return out

    def values_hook(critic, batch):
        out = real_values(critic, batch)
        if out.requires_grad:
            out.retain_grad()
            seen["values"] = out
        return out

    monkeypatch.setattr(learner_module, "response_stats", stats_hook)
    monkeypatch.setattr(learner_module, "response_values", values_hook)

    def step(e):
        trainer.policy.zero_grad()
        trainer.critic.zero_grad()
        batch = e.rows_of(torch.arange(len(e.rollout)))
        st = {**trainer.policy_micro_step(batch, 1.0), **trainer.critic_micro_step(batch, 1.0)}
        grads = torch.cat([p.grad.flatten() for m in (trainer.policy, trainer.critic) for p in m.parameters()
                           if p.grad is not None])
        return st, grads

    st_a, g_a = step(exp)
    assert torch.all(seen["logprobs"].grad[env_pos] == 0)
    assert "entropy" not in seen or torch.all(seen["entropy"].grad[env_pos] == 0)
    assert torch.all(seen["values"].grad[env_pos] == 0)
    assert g_a.abs().sum() > 0
    garbage = torch.randn_like(exp.old_logprobs) * 10
    for name in ("old_logprobs", "ref_logprobs", "values", "returns", "is_weights"):
        setattr(exp, name, torch.where(env_pos, garbage, getattr(exp, name)))
    st_b, g_b = step(exp)
    for key in st_a:
        torch.testing.assert_close(st_a[key], st_b[key], msg=key)
    torch.testing.assert_close(g_a, g_b, rtol=0, atol=0)


def test_calculator_system_prompt_and_config_file():
    from rlhfkit.config import load_config

    msgs = CalculatorEnv().reset({"prompt": "What is 1 + 2?"})
    assert msgs[0]["role"] == "system" and "<tool_call>" in msgs[0]["content"] and len(msgs) == 2
    assert len(CalculatorEnv(system_prompt="").reset({"prompt": "What is 1 + 2?"})) == 1
    cfg = load_config("grpo", "configs/multiturn_calculator.yaml")
    assert cfg.env.name == "calculator" and not cfg.reward.functions


def test_turn_rewards_sit_on_each_turns_last_model_token(tok):
    from rlhfkit.envs.episodes import turn_reward_tensor

    rollout, eps, _ = _episodes(tok, [CALL, "The answer is 36"])
    turns = turn_reward_tensor(eps, rollout.response_ids.shape[1])
    e = eps[0]
    n1 = len(tok(CALL, add_special_tokens=False)["input_ids"]) + 1
    assert e.turn_ends == [n1 - 1, len(e.ids) - 1]
    assert turns[0, n1 - 1].item() == pytest.approx(0.2) and turns[0, len(e.ids) - 1].item() == 1.0
    assert turns[0].sum().item() == pytest.approx(1.2)
    assert torch.all(turns[rollout.action_mask == 0] == 0)


def test_an_episode_is_token_for_token_the_demonstration_sft_trained_on(tok):
    """Replaying a tool demonstration through the environment gives the SFT rendering's token ids, and the action
    mask is SFT's assistant mask: what SFT taught is exactly what RL samples and trains."""
    record = next(r for r in get_task("calculator").sft_records(50) if len(r["messages"]) == 4)
    msgs = record["messages"]
    _, (episode,) = run_episodes(
        ScriptedEngine(tok, [msgs[1]["content"], msgs[3]["content"]]), MODEL, tok,
        _calls(CalculatorEnv, {"system_prompt": ""}, "calculator"), [{"prompt": msgs[:1]}],
        params=SamplingParams(max_new_tokens=120), seed=0, max_turns=2, max_total_tokens=300)
    sft_ids, sft_mask = render_conversation(tok, msgs)
    n = len(episode.prompt_ids) + len(episode.ids)
    assert episode.prompt_ids + episode.ids == sft_ids[:n]
    assert sft_ids[n:] == tok("\n", add_special_tokens=False)["input_ids"]  # the template's trailing newline only
    assert episode.action == sft_mask[len(episode.prompt_ids):n]
    assert episode.metrics == {"tool_calls": 1.0, "tool_call_success": 1.0, "correct": 1.0}
    assert episode.turn_rewards == [pytest.approx(0.2), 1.0]
