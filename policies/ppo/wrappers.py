"""ResiliBench-v1 as RLlib's action-masking modules expect it: a Dict observation with the mask inside.

RLlib's masking modules read the legal actions from the observation, not from ``info``. ``MaskedPlannerEnv``
wraps ``ResiliBench-v1`` without changing its contract: the same episodes, rewards and ends, with the
observation ``{"observations": <the 204 floats>, "action_mask": <31 floats, 1 = legal>}``. It also lets
a curriculum narrow the task pool (``set_stage``) and keeps ``info`` small, since RLlib stores every
step's info and ships episodes between processes.

``episode_observation`` recomputes the flat observation of any ``Episode`` from scratch, so a trained
policy can act where only the episode is at hand (``core.bounds.exact_policy_success`` passes no
observation).
"""

from __future__ import annotations

__all__ = [
    "OBSERVATIONS", "ACTION_MASK", "episode_observation", "masked_observation", "MaskedPlannerEnv",
    "make_env",
]

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ...core.config import WorldConfig
from ...core.frontend import TaskPool
from ...core.simulator import Episode
from ...core.tasks.library import Task
from ...envs.planner.env import ResiliBenchEnv
from ...envs.planner.observation import (
    N_STATUS,
    ObservationLayout,
    counter_features,
    initial_observation,
    process_features,
)

OBSERVATIONS = "observations"
ACTION_MASK = "action_mask"


def episode_observation(episode: Episode, layout: ObservationLayout | None = None,
                        features: str = "full", start: np.ndarray | None = None) -> np.ndarray:
    """The ``ResiliBench-v1`` observation of ``episode`` in its current state (while it is running), with
    the ``features`` of ``resilibench.envs.planner.observation``; ``start``: the task's
    ``initial_observation`` with the same layout and features, when the caller keeps it (copied)."""
    layout = layout or ObservationLayout(len(episode.registry), episode.processes_on)
    obs = initial_observation(episode.task, episode.registry, layout, features) if start is None else start.copy()
    status = np.asarray(episode.status)
    tool_blocks = obs[layout.status:layout.required].reshape(-1, N_STATUS)
    tool_blocks[:] = 0.0
    tool_blocks[np.arange(len(status)), status] = 1.0
    if features == "full":  # else the block holds the fixed required order
        next_required = obs[layout.next_required:layout.progress]
        next_required[:] = 0.0
        if episode.next_required < len(episode.required):
            next_required[episode.required[episode.next_required]] = 1.0
    obs[layout.progress] = episode.progress
    step, failures, consecutive = counter_features(episode.turns_used, episode.n_failures,
                                                   episode.consecutive_failures, episode.config.rules)
    obs[layout.step], obs[layout.failures], obs[layout.consecutive] = step, failures, consecutive
    if layout.processes:
        process_features(episode, layout, obs)
    return obs


def masked_observation(observation: np.ndarray, action_mask: np.ndarray) -> dict[str, np.ndarray]:
    """The Dict observation: the flat observation and the mask as float32 (1 = legal)."""
    return {OBSERVATIONS: observation, ACTION_MASK: action_mask.astype(np.float32)}


class MaskedPlannerEnv(gym.Wrapper):
    """
    ## Description

    ``ResiliBench-v1`` with the action mask moved into the observation, for RLlib's action-masking
    RLModules (``resilibench.policies.ppo.module``). Episodes, rewards, terminations and truncations are
    the wrapped env's.

    ## Action Space

    ``Discrete(31)``, as ``ResiliBench-v1`` (30 tools, then FINISH).

    ## Observation Space

    ``Dict({"observations": Box(0, 1, (204,), float32), "action_mask": Box(0, 1, (31,), float32)})``: the
    wrapped env's observation and ``info["action_mask"]`` as floats (float, so a module can take its log).

    ## Rewards

    The wrapped env's (``reward="sparse"`` or ``"shaped"``).

    ## Episode End

    The wrapped env's. ``info`` holds only ``task_type``, ``stage`` (the curriculum stage the episode was
    started under, or -1) and, at the end, ``level``, ``progress`` (share of required tools that
    succeeded in required order, i.e. the in-order prefix), ``coverage`` and ``errors`` (failed calls):
    what the training callbacks read.

    ## Arguments

    * ``env``: a ``ResiliBenchEnv`` (or a wrapper of one).
    * ``stage_pools``: optional task pools by curriculum stage; ``set_stage(k)`` samples tasks from pool
      ``k`` from the next reset on.
    * ``balance_task_types``: draw a task type uniformly among those of the pool, then a task of that
      type (the wrapped env draws tasks uniformly, so rare types are rarely practised); the draw uses a
      generator seeded from ``reset(seed=...)``, so episodes stay reproducible.

    ## Version History

    * v0: initial release.
    """

    def __init__(self, env: gym.Env, stage_pools: Sequence[Sequence[Task]] | None = None, stage: int = -1,
                 balance_task_types: bool = False):
        super().__init__(env)
        inner = env.unwrapped
        if not isinstance(inner, ResiliBenchEnv):
            raise TypeError(f"MaskedPlannerEnv wraps ResiliBench-v1, got {type(inner).__name__}")
        self._inner = inner
        n_actions = inner.n_tools + 1  # the tools, then FINISH
        self.observation_space = spaces.Dict({
            OBSERVATIONS: env.observation_space,
            ACTION_MASK: spaces.Box(0.0, 1.0, (n_actions,), np.float32),
        })
        self.full_pool = list(inner.tasks)
        self.stage_pools = [list(p) for p in stage_pools] if stage_pools else None
        self.stage = -1
        self.balance_task_types = balance_task_types
        self._by_type: list[list[Task]] = []
        self._rng = np.random.default_rng(0)  # re-seeded by reset(seed=...)
        self.set_stage(stage)

    def set_stage(self, stage: int) -> None:
        """Draw tasks from the pool of curriculum stage ``stage`` (-1: the whole pool) from the next reset."""
        if stage >= 0 and not self.stage_pools:
            raise ValueError("this env has no curriculum stage pools")
        if self.stage_pools and not -1 <= stage < len(self.stage_pools):
            raise ValueError(f"stage must be in [-1, {len(self.stage_pools)}), got {stage}")
        self.stage = stage
        if stage < 0:
            pool = self.full_pool
        else:
            assert self.stage_pools is not None  # checked above
            pool = self.stage_pools[stage]
        self._inner.tasks = TaskPool(pool)
        by_type: dict[str, list[Task]] = {}
        for task in pool:
            by_type.setdefault(task.task_type, []).append(task)
        self._by_type = list(by_type.values())

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._rng = np.random.default_rng([seed, 1])
        if self.balance_task_types and not (options and "task_id" in options):
            tasks = self._by_type[int(self._rng.integers(len(self._by_type)))]
            options = {**(options or {}), "task_id": tasks[int(self._rng.integers(len(tasks)))].instance_id}
        obs, info = self.env.reset(seed=seed, options=options)
        return masked_observation(obs, info[ACTION_MASK]), self._slim_info(info)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return masked_observation(obs, info[ACTION_MASK]), reward, terminated, truncated, self._slim_info(info)

    def _slim_info(self, info: Mapping[str, Any]) -> dict[str, Any]:
        slim = {"task_type": info["task_type"], "stage": self.stage}
        if "level" in info:
            episode = self._inner.episode
            assert episode is not None  # the step that ended it
            required = len(episode.required)
            slim.update(level=info["level"], coverage=info["evaluation"].coverage, errors=episode.n_failures,
                        progress=episode.next_required / required if required else 1.0)
        return slim


def make_env(env_config: Mapping[str, Any]) -> MaskedPlannerEnv:
    """RLlib's env creator: ``MaskedPlannerEnv`` over ``ResiliBenchEnv``.

    ``env_config`` keys (all optional): ``tasks_path`` (a task library file; default the shipped one),
    ``split`` (default "train"), ``task_types``, ``reward`` ("sparse" or "shaped"), ``features`` (the
    observation's, default "full"), ``world`` (a ``WorldConfig`` as a dict), ``curriculum`` (bool: build the stage pools of
    ``resilibench.policies.ppo.curriculum``), ``stage`` (the stage to start in) and
    ``balance_task_types``. (``curriculum_config`` is read by the training callback.)
    """
    from ...core.world import load_tasks
    from .curriculum import stage_pools

    world = WorldConfig().replace(**env_config["world"]) if env_config.get("world") else WorldConfig()
    tasks = load_tasks(env_config.get("tasks_path"), env_config.get("split", "train"), env_config.get("task_types"))
    env = ResiliBenchEnv(tasks=tasks, split=None, reward=env_config.get("reward", "sparse"), config=world,
                         features=env_config.get("features", "full"))
    pools = stage_pools(tasks) if env_config.get("curriculum") else None
    return MaskedPlannerEnv(env, pools, int(env_config.get("stage", 0 if pools else -1)),
                            bool(env_config.get("balance_task_types", False)))
