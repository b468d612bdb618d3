"""``ResiliBenchText-v1`` as an OpenEnv environment server (``openenv.core.env_server.Environment``).

OpenEnv (the environment interface TRL, ART and Unsloth consume) serves an ``Environment`` over HTTP and a
WebSocket per session; clients (``EnvClient``) call ``reset(**kwargs)`` and ``step(action)``.
``ResiliBenchOpenEnv`` plays the text env's episode of ``reset(task_id=..., seed=...)`` under the tag
protocol: an action is the agent's message, an observation the env's answer to it, so the trace, the level
and every outcome are the text env's for the same task and seed. ``create_openenv_app`` builds the server
(one text env per WebSocket session), ``ResiliBenchEnvClient`` is its typed client.

The reward is the text env's (1 for full success at the end, else 0). Observations keep the two kinds of
failure apart: ``metadata["faults"]`` lists the failures the world injected (the trace's error codes: a
learner should see and handle them), while ``metadata["infrastructure_error"]`` is set when the environment
itself could not go on (an exception in the env, e.g. a real API's client giving up, or a step after the
episode's end): the observation is then ``done`` with that key, so that a trainer can drop the rollout.

    python -m uvicorn --factory resilibench.envs.text.openenv:create_openenv_app --port 8000

    from resilibench.envs.text.openenv import ResiliBenchAction, ResiliBenchEnvClient
    with ResiliBenchEnvClient(base_url="http://127.0.0.1:8000").sync() as client:
        result = client.reset(task_id="...", seed=0)         # result.observation.messages: the prompt
        result = client.step(ResiliBenchAction(message="<tool_call>...</tool_call>"))
"""

from __future__ import annotations

__all__ = ["ENV_NAME", "ResiliBenchAction", "ResiliBenchEnvClient", "ResiliBenchObservation", "ResiliBenchOpenEnv",
           "ResiliBenchState", "create_openenv_app"]

from collections.abc import Mapping
from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
from pydantic import Field

from .env import ResiliBenchTextEnv, episode_record

ENV_NAME = "resilibench"


class ResiliBenchAction(Action):
    """The agent's message: tool calls in ``<tool_call>`` tags, or the completion signal."""

    message: str = Field(description="The agent's message under the text env's tag protocol")


class ResiliBenchObservation(Observation):
    """The env's new messages (at reset the opening conversation, after a step its answer); ``metadata``:
    the episode's task, turn, level, end reason, trace and ``faults`` (and ``infrastructure_error``)."""

    messages: list[dict[str, Any]] = Field(default_factory=list, description="The env's new chat messages")


class ResiliBenchState(State):
    """The session's episode: its task and seed, the evaluator's level (None while it runs)."""

    task_id: str | None = None
    seed: int | None = None
    level: str | None = None


class ResiliBenchOpenEnv(Environment[ResiliBenchAction, ResiliBenchObservation, ResiliBenchState]):
    """Episodes of the text env for OpenEnv; ``env_options``: keyword arguments of ``ResiliBenchTextEnv``
    (``world``, ``rules``, ``tasks``, ...; any task id of the world resets by default)."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # one text env per instance, nothing shared between sessions

    def __init__(self, **env_options: Any):
        super().__init__()
        self.env = ResiliBenchTextEnv(**{"split": None, **env_options})
        self._state = ResiliBenchState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              **_options: Any) -> ResiliBenchObservation:
        """Open the text env's episode of ``task_id`` and ``seed`` (default 0)."""
        if not isinstance(task_id, str):
            raise ValueError(f"reset needs the episode's task: task_id must be a string, got {task_id!r}")
        seed = 0 if seed is None else seed
        _, info = self.env.reset(seed=seed, options={"task_id": task_id})
        self._state = ResiliBenchState(episode_id=episode_id or f"{task_id}/{seed}", task_id=task_id, seed=seed)
        return ResiliBenchObservation(messages=[dict(m) for m in self.env.messages], reward=0.0,
                                      metadata=episode_record(info))

    def step(self, action: ResiliBenchAction, timeout_s: float | None = None, **_: Any) -> ResiliBenchObservation:
        self._state.step_count += 1
        try:
            observation, reward, terminated, truncated, info = self.env.step(action.message)
        except Exception as exc:  # the env could not go on: not the agent's failure, not a fault of the world
            record = episode_record(self.env.info()) if self.env.episode is not None else {}
            return ResiliBenchObservation(done=True, reward=0.0, metadata=record | {
                "infrastructure_error": f"{type(exc).__name__}: {exc}"})
        self._state.level = info["level"]
        return ResiliBenchObservation(messages=[{"role": "user", "content": observation}],
                                      done=terminated or truncated, reward=reward, metadata=episode_record(info))

    @property
    def state(self) -> ResiliBenchState:
        return self._state

    def close(self) -> None:
        self.env.close()


class ResiliBenchEnvClient(EnvClient[ResiliBenchAction, ResiliBenchObservation, ResiliBenchState]):
    """OpenEnv's WebSocket client for a ResiliBench server (one episode session per connection)."""

    def _step_payload(self, action: ResiliBenchAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: Mapping[str, Any]) -> StepResult[ResiliBenchObservation]:
        observation = ResiliBenchObservation(**payload["observation"], done=payload["done"],
                                             reward=payload["reward"])
        return StepResult(observation=observation, reward=payload["reward"], done=payload["done"],
                          metadata=observation.metadata)

    def _parse_state(self, payload: Mapping[str, Any]) -> ResiliBenchState:
        return ResiliBenchState(**payload)


def create_openenv_app(max_concurrent_envs: int = 64, **env_options: Any):
    """The OpenEnv server (a FastAPI app: ``/ws`` sessions, ``/health``, ``/schema``...): each session plays
    its own ``ResiliBenchOpenEnv(**env_options)``, up to ``max_concurrent_envs`` at once."""
    return create_fastapi_app(lambda: ResiliBenchOpenEnv(**env_options), ResiliBenchAction, ResiliBenchObservation,
                              max_concurrent_envs=max_concurrent_envs, env_name=ENV_NAME)
