"""OpenEnv environments through rlhfkit's environment interface (rlhfkit/envs/openenv.py): an echo environment
written as OpenEnv's template writes one (tests/unit/openenv_echo.py), in process and through a client's
StepResult, its mistakes in one line, and a GRPO run on the tiny model that plays its episodes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlhfkit.envs import load_environment
from rlhfkit.envs.base import EnvError
from rlhfkit.envs.openenv import OpenEnvAdapter, observation_text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
ECHO = {"env": "openenv_echo:EchoEnvironment", "action": "openenv_echo:EchoAction", "field": "message"}
PROMPT = [{"role": "user", "content": "Play."}]


def test_an_episode_in_process():
    env = load_environment("openenv")(**ECHO)
    messages = env.reset({"prompt": PROMPT})
    assert messages == PROMPT + [{"role": "user", "content": "Say something short."}]  # the first observation
    new, reward, done = env.step(messages, "hello")
    assert (new, reward, done) == ([{"role": "user", "content": "hello"}], pytest.approx(0.5), False)
    new, reward, done = env.step(messages, "bye")
    assert (new, reward, done) == ([], pytest.approx(0.3), True)  # the last observation is not shown


def test_a_client_step_result_and_the_observation_field():
    class StepResult:
        def __init__(self, observation, reward, done):
            self.observation, self.reward, self.done = observation, reward, done

    class Client:  # an EnvClient's shape: built with base_url, returns StepResult
        def __init__(self, base_url):
            import openenv_echo

            self.env, self.base_url = openenv_echo.EchoEnvironment(turns=1), base_url

        def reset(self, **kwargs):
            obs = self.env.reset(**kwargs)
            return StepResult(obs, None, False)

        def step(self, action):
            obs = self.env.step(action)
            return StepResult(obs, obs.reward, obs.done)

    sys.modules["openenv_echo"].Client = Client
    env = OpenEnvAdapter(client="openenv_echo:Client", base_url="http://127.0.0.1:1", action=ECHO["action"],
                         observation="message_length", show_reset=False)
    assert env.reset({"prompt": PROMPT}) == PROMPT
    assert env.step(PROMPT, "abcd") == ([], pytest.approx(0.4), True)
    assert observation_text({"done": False, "text": "hi"}) == "hi"


def test_mistakes_are_one_line():
    with pytest.raises(EnvError, match="needs one of env"):
        OpenEnvAdapter(action=ECHO["action"])
    with pytest.raises(EnvError, match="cannot load the action 'openenv_echo:Nope'"):
        OpenEnvAdapter(env=ECHO["env"], action="openenv_echo:Nope")
    env = OpenEnvAdapter(env=ECHO["env"], action=ECHO["action"], field="text")
    env.reset({"prompt": PROMPT})
    with pytest.raises(EnvError, match=r"EchoAction\(text=...\) failed.*set field"):
        env.step(PROMPT, "x")


@pytest.mark.slow
def test_grpo_plays_openenv_episodes_on_the_tiny_model(tmp_path, monkeypatch):
    import json

    from rlhfkit.config import build_config
    from rlhfkit.train.online.synchronous import run_online

    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", str(HERE))  # the environment workers import openenv_echo too
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Game {i}."}) + "\n" for i in range(16)))
    out = tmp_path / "run"
    cfg = build_config("grpo", {"env": {"name": "openenv", "kwargs": {**ECHO, "env_kwargs": {"turns": 2}}}}, [
        f"data.train={data}", f"output_dir={out}", "model.name=tiny:hidden=32,layers=1", "env.max_turns=3",
        "env.max_total_tokens=40", "generation.max_new_tokens=8", "algo.rollout_batch_size=4",
        "algo.num_generations=2", "algo.mini_batch_size=8", "train.batch_size=8", "algo.total_episodes=16",
        "track.report=false", "train.resume=never", "data.eval_fraction=0", "algo.entropy_coef=0.01"])
    last = run_online(cfg)
    # an untrained model rarely ends a turn with EOS, and a turn cut at max_new_tokens ends its episode (envs/
    # episodes.py): 1 or 2 turns (the environment ends the episode after its 2 steps)
    assert 1.0 <= last["env/turns_mean"] <= 2.0
    assert 0 < last["env/episode_reward_mean"] <= 2 * 8 * 0.1 + 1e-6  # 0.1 per character echoed, 8 tokens a turn


def test_an_openenv_error_inside_a_call_is_one_line_with_one_fix():
    from rlhfkit.envs.host import EnvCalls

    kwargs = {**ECHO, "field": "text"}  # EchoAction has no field `text`: the adapter's own one-line complaint
    for workers in (0, 1):
        with EnvCalls("openenv", load_environment("openenv"), kwargs, workers=workers, timeout_s=60) as envs:
            envs.calls("new", [(0, ())], 1)
            envs.calls("reset", [(0, ({"prompt": PROMPT},))], 1)
            with pytest.raises(EnvError) as info:
                envs.calls("step", [(0, (PROMPT, "hello"))], 1)
        line = str(info.value)
        assert line.count("(fix:") == 1 and "EchoAction(text=...) failed" in line and "set field" in line, line
