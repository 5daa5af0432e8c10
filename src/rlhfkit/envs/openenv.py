"""OpenEnv environments as rlhfkit environments (``env.name=openenv``).

OpenEnv (Meta's ``openenv-core``) writes an environment as a server-side class with ``reset(seed=, episode_id=) ->
Observation`` and ``step(action) -> Observation`` (pydantic models; an observation carries ``done``, ``reward`` and
the environment's own fields), usually served over HTTP and driven by a client class (``EnvClient``: ``reset()`` /
``step(action)`` returning ``StepResult(observation, reward, done)``). :class:`OpenEnvAdapter` drives either one
through rlhfkit's environment interface (``rlhfkit.envs.base``), so an OpenEnv environment trains as the built-in
``calculator`` does, in the environment workers under ``env.timeout_s``::

    env.name=openenv
    env.kwargs={env: my_env.server:EchoEnvironment, action: my_env.models:EchoAction, field: message}
    # or a running server:  {client: my_env:EchoEnv, base_url: "http://127.0.0.1:8000", action: ..., field: ...}

Each assistant turn becomes ``Action(**{field: completion})``; the observation's ``reward`` is the turn's reward
(None: 0), its ``done`` ends the episode, and its text (the field ``observation``, by default the first text field
other than ``metadata``) comes back to the model as a user message (after ``reset``, appended to the data's prompt:
an environment that poses its own task, such as a game, shows it there). The package itself is never imported here:
the classes named are, so its (heavy: FastAPI, Gradio, ...) dependencies are the user's choice.
"""

from __future__ import annotations

from typing import Any

WHERE = "env.kwargs"


def _error(message: str, fix: str):
    from ..errors import EnvError

    return EnvError(message, where=WHERE, fix=fix)


def _load(spec: str, what: str):
    from ..errors import RewardError
    from ..rewards.loading import load_reward_function

    try:
        return load_reward_function(spec)  # the same import rules: module or file.py, the cwd on the path
    except RewardError as exc:
        raise _error(f"openenv: cannot load the {what} {spec!r} ({exc.message})",
                     f"name the {what} class as package.module:Class or path/to/file.py:Class") from None


def observation_text(observation: Any, field: str | None = None) -> str:
    """The text of an OpenEnv observation shown to the model: its ``field``, or the first text field other than
    ``metadata`` (pydantic models by ``model_dump``, other objects by ``vars``); "" when it has none."""
    if observation is None:
        return ""
    if field is not None:
        value = getattr(observation, field, None)
        if value is None and isinstance(observation, dict):
            value = observation.get(field)
        return "" if value is None else str(value)
    data = observation.model_dump() if hasattr(observation, "model_dump") else \
        observation if isinstance(observation, dict) else vars(observation)
    for key, value in data.items():
        if key not in ("metadata", "done", "reward") and isinstance(value, str):
            return value
    return ""


class OpenEnvAdapter:
    """One episode of an OpenEnv environment (see the module docstring). ``env``: an ``Environment`` class built
    here as ``Env(**env_kwargs)``; or ``client`` (an ``EnvClient`` class) with ``base_url``; ``action``: the
    ``Action`` class; ``field``: its text field; ``observation``: the observation's field shown to the model;
    ``reset_kwargs``: passed to ``reset`` (the row's ``seed`` too, when it has one); ``show_reset``: show the first
    observation's text after the prompt."""

    def __init__(self, env: str | None = None, action: str | None = None, field: str = "message",
                 observation: str | None = None, client: str | None = None, base_url: str | None = None,
                 env_kwargs: dict | None = None, reset_kwargs: dict | None = None, show_reset: bool = True):
        if (env is None) == (client is None):
            raise _error("openenv needs one of env (an Environment class, run here) and client (an EnvClient class, "
                         "with base_url)", "env.kwargs={env: pkg.mod:MyEnvironment, action: pkg.mod:MyAction}")
        if action is None:
            raise _error("openenv needs the action class",
                         "add action: pkg.mod:MyAction (and field: its text field, default message)")
        if client is not None and not base_url:
            raise _error("openenv: a client needs base_url", "add base_url: http://host:port")
        self.action_cls, self.field, self.observation = _load(action, "action"), field, observation
        self.reset_kwargs, self.show_reset = dict(reset_kwargs or {}), show_reset
        if env is not None:
            self.env = _load(env, "environment")(**dict(env_kwargs or {}))
        else:
            self.env = _load(client, "client")(base_url=base_url)

    @staticmethod
    def _unpack(out: Any) -> tuple[Any, float, bool]:
        """(observation, reward, done) of what ``reset`` / ``step`` returned: an Observation, or a client's
        StepResult(observation, reward, done)."""
        obs = getattr(out, "observation", out)
        reward = getattr(out, "reward", None) if hasattr(out, "observation") else getattr(obs, "reward", None)
        done = getattr(out, "done", None) if hasattr(out, "observation") else getattr(obs, "done", False)
        return obs, 0.0 if reward is None else float(reward), bool(done)

    def reset(self, row: dict) -> list[dict]:
        kwargs = dict(self.reset_kwargs)
        if row.get("seed") is not None:
            kwargs.setdefault("seed", row["seed"])
        obs, _, _ = self._unpack(self.env.reset(**kwargs))
        text = observation_text(obs, self.observation) if self.show_reset else ""
        return list(row["prompt"]) + ([{"role": "user", "content": text}] if text else [])

    def step(self, messages: list[dict], completion: str) -> tuple[list[dict], float, bool]:
        try:
            action = self.action_cls(**{self.field: completion})
        except Exception as exc:  # noqa: BLE001 - a pydantic ValidationError, a TypeError
            raise _error(f"openenv: {self.action_cls.__name__}({self.field}=...) failed: {type(exc).__name__}",
                         "set field: to the action's text field") from None
        obs, reward, done = self._unpack(self.env.step(action))
        text = "" if done else observation_text(obs, self.observation)
        return ([{"role": "user", "content": text}] if text else []), reward, done

