"""``ResiliBenchText-v1`` as a SkyRL-Gym text environment (``skyrl_gym.envs.base_text_env.BaseTextEnv``).

SkyRL builds one environment per dataset row, ``env_class(env_config, extras)``, then calls ``init(prompt)``
and ``step(action)`` with each model message until ``done``. ``ResiliBenchSkyRLEnv`` plays the text env's
episode of the row's task and seed (``extras``: ``task_id``, ``seed``) under the tag protocol, so the
trace, the level and every outcome are the text env's for the same task and seed. ``skyrl_rows`` builds the
dataset rows and ``register_skyrl`` registers the class under the id ``resilibench``.

The reward is the text env's (1 for full success at the end, else 0). What a step records keeps the two
kinds of failure apart: ``metadata["faults"]`` lists the failures the world injected (the trace's error
codes: a learner should see and handle them), while ``metadata["infrastructure_error"]`` is set when the
environment itself could not go on (an exception in the env, e.g. a real API's client giving up): the episode
then ends with ``done`` and that key, so that a trainer can drop the rollout instead of scoring it.

    from resilibench.envs.text.skyrl import register_skyrl, skyrl_rows
    register_skyrl()                      # skyrl_gym.make("resilibench", env_config=..., extras=row["extras"])
    rows = skyrl_rows(tasks, seeds=[0])   # {"prompt": [...], "env_class": "resilibench", "extras": {...}}
"""

from __future__ import annotations

__all__ = ["ENV_ID", "ResiliBenchSkyRLEnv", "register_skyrl", "skyrl_rows"]

from collections.abc import Mapping, Sequence
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from ...core.tasks.library import Task
from .env import ResiliBenchTextEnv, episode_record

ENV_ID = "resilibench"


class ResiliBenchSkyRLEnv(BaseTextEnv):
    """One episode of the text env for SkyRL. ``env_config``: keyword arguments of ``ResiliBenchTextEnv``
    (``split``, ``world``, ``rules``, ...; a mapping); ``extras``: ``task_id`` (required) and ``seed``
    (default 0)."""

    def __init__(self, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None):
        super().__init__()
        extras = dict(extras or {})
        if not isinstance(extras.get("task_id"), str):
            raise ValueError(f"extras must name the row's task: {{'task_id': str, 'seed': int}}, got {extras!r}")
        seed = extras.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"extras seed must be an integer >= 0, got {seed!r}")
        self.task_id, self.seed = extras["task_id"], seed
        self.env = ResiliBenchTextEnv(**{"split": None, **dict(env_config or {})})
        self.max_turns = self.env.config.rules.turn_limit + 1  # the calls, then the completion signal

    def init(self, prompt: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The episode's first messages (the task prompt of the world, whatever the row's ``prompt``)."""
        _, info = self.env.reset(seed=self.seed, options={"task_id": self.task_id})
        return [dict(m) for m in self.env.messages], episode_record(info)

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        try:
            observation, reward, terminated, truncated, info = self.env.step(action)
        except Exception as exc:  # the env could not go on: not the agent's failure, not a fault of the world
            metadata = episode_record(self.env.info()) | {"infrastructure_error": f"{type(exc).__name__}: {exc}"}
            return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True, metadata=metadata,
                                         postprocessed_action=None)
        done = terminated or truncated
        observations = [{"role": "user", "content": observation}]
        return BaseTextEnvStepOutput(observations=observations, reward=float(reward), done=done,
                                     metadata=episode_record(info), postprocessed_action=None)

    def get_metrics(self) -> dict[str, Any]:
        info = self.env.info()
        return {"full_success": float(info["level"] == "full_success"), "turns": info["turn"]}

    def close(self) -> None:
        self.env.close()


def register_skyrl(env_id: str = ENV_ID) -> None:
    """Register ``ResiliBenchSkyRLEnv`` with SkyRL-Gym under ``env_id`` (once per process)."""
    from skyrl_gym.envs.registration import register, registry

    if env_id not in registry:
        register(id=env_id, entry_point=f"{__name__}:ResiliBenchSkyRLEnv")


def skyrl_rows(tasks: Sequence[Task], seeds: Sequence[int], env_id: str = ENV_ID) -> list[dict[str, Any]]:
    """SkyRL dataset rows, one per task and seed: the ``env_class`` and the ``extras`` the env reads (the
    prompt is the env's own, built at ``init``; the row's is the task description for display)."""
    return [{"prompt": [{"role": "user", "content": task.description}], "env_class": env_id,
             "extras": {"task_id": task.instance_id, "seed": int(seed)}}
            for task in tasks for seed in seeds]
