"""An OpenEnv environment as OpenEnv's own template writes one (``openenv init``: an echo environment), for
tests/unit/test_envs_openenv.py. With openenv-core installed its base classes are used; without it (rlhfkit does not
depend on it: FastAPI, Gradio, ...), pydantic models with the same fields, which is all the adapter reads."""

from pydantic import BaseModel, ConfigDict, Field

try:
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
except ImportError:  # the same shape
    class Action(BaseModel):
        model_config = ConfigDict(extra="forbid")
        metadata: dict = Field(default_factory=dict)

    class Observation(BaseModel):
        model_config = ConfigDict(extra="forbid")
        done: bool = False
        reward: bool | int | float | None = None
        metadata: dict = Field(default_factory=dict)

    class State(BaseModel):
        episode_id: str | None = None
        step_count: int = 0

    class Environment:
        def __init__(self, transform=None, rubric=None):
            self.transform, self.rubric = transform, rubric


class EchoAction(Action):
    """Action for the Echo environment - just a message to echo."""

    message: str = Field(..., description="Message to echo back")


class EchoObservation(Observation):
    """Observation from the Echo environment - the echoed message."""

    echoed_message: str = Field(default="", description="The echoed message")
    message_length: int = Field(default=0, description="Length of the echoed message")


class EchoEnvironment(Environment):
    """Echoes the message back; reward 0.1 per character, the episode ends after ``turns`` steps."""

    def __init__(self, turns: int = 2):
        super().__init__()
        self.turns, self._state = turns, State(episode_id="0", step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> EchoObservation:
        self._state = State(episode_id=episode_id or "0", step_count=0)
        return EchoObservation(echoed_message="Say something short.", message_length=0, done=False, reward=0.0)

    def step(self, action: EchoAction, timeout_s=None, **kwargs) -> EchoObservation:
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message, message_length=len(action.message),
                               done=self._state.step_count >= self.turns, reward=len(action.message) * 0.1)

    @property
    def state(self) -> State:
        return self._state
