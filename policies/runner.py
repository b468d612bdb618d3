"""Run planners on ResiliBench-v0 episodes and collect one result row per episode.

Every planner meets the same random stream for the same (task, seed): common random numbers make the
comparison between planners, and with bound (iii), paired.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from resilibench.envs.config import WorldConfig
from resilibench.envs.planner_env import ResiliBenchEnv
from resilibench.envs.simulator import task_seed
from resilibench.envs.tasks import Task
from resilibench.policies.base import Planner
from resilibench.policies.bounds import OptimalPlanner, exact_bound, optimal_success
from resilibench.policies.heuristics import HEURISTICS

PLANNER_NAMES = (*HEURISTICS, OptimalPlanner.name)


def make_planner(name: str, config: WorldConfig | None = None) -> Planner:
    """A planner by name: one of ``PLANNER_NAMES``."""
    if name == OptimalPlanner.name:
        return OptimalPlanner(config)
    try:
        return HEURISTICS[name]()
    except KeyError:
        raise ValueError(f"unknown planner {name!r}; choose from {PLANNER_NAMES}") from None


def planner_rng(planner_name: str, seed: int) -> np.random.Generator:
    """The planner's own randomness for an episode, stable across processes."""
    return np.random.default_rng([seed, zlib.crc32(planner_name.encode())])


def run_episode(env: ResiliBenchEnv, planner: Planner, task: Task, seed: int) -> dict[str, Any]:
    """Play one episode of ``task`` for run seed ``seed``; returns its result row."""
    obs, info = env.reset(seed=task_seed(task.instance_id, seed), options={"task_id": task.instance_id})
    planner.reset(task, planner_rng(planner.name, seed))
    total_reward, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, info = env.step(planner.act(env.episode, obs))
        total_reward += reward
        done = terminated or truncated
    episode = env.episode
    return {
        "planner": planner.name,
        "task_id": task.instance_id,
        "task_type": task.task_type,
        "seed": seed,
        "level": info["level"],
        "end_reason": info["end_reason"],
        "calls": episode.turns_used,
        "failed_calls": episode.n_failures,
        "coverage": info["evaluation"].coverage,
        "return": total_reward,
        "tools": [r["tool"] for r in info["trace"]],
    }


def episode_jobs(planners: Sequence[str], tasks: Sequence[Task], seeds: Sequence[int]) -> list[tuple[str, Task, int]]:
    """Every (planner, task, seed) combination in a fixed order."""
    return [(p, t, s) for p in planners for t in tasks for s in seeds]


def run_jobs(
    jobs: Iterable[tuple[str, Task, int]],
    config: WorldConfig | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    clairvoyant: bool = True,
    api: Any = None,
    api_options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run (planner, task, seed) jobs in one env; ``on_result`` sees each row as it is produced.
    Rows carry bound (iii) of the task and, with ``clairvoyant``, bound (ii) of the episode's stream.
    ``api``, ``api_options``: real-API mode (``ResiliBenchEnv``'s options of that name)."""
    config = config or WorldConfig()
    jobs = list(jobs)
    env = ResiliBenchEnv(tasks=sorted({t.instance_id: t for _, t, _ in jobs}.values(), key=lambda t: t.instance_id),
                         config=config, split=None, api=api, api_options=api_options)
    try:
        return _run_in(env, jobs, config, on_result, clairvoyant)
    finally:
        env.close()


def _run_in(env: ResiliBenchEnv, jobs: list[tuple[str, Task, int]], config: WorldConfig,
            on_result: Callable[[dict[str, Any]], None] | None, clairvoyant: bool) -> list[dict[str, Any]]:
    """The rows of ``jobs`` played in ``env`` (see ``run_jobs``)."""
    planners: dict[str, Planner] = {}
    clairvoyant_hits: dict[tuple[str, int], bool] = {}
    rows = []
    for name, task, seed in jobs:
        planner = planners.setdefault(name, make_planner(name, config))
        row = run_episode(env, planner, task, seed)
        row["bound_iii"] = optimal_success(task, config)
        if clairvoyant:
            key = (task.instance_id, seed)
            if key not in clairvoyant_hits:
                clairvoyant_hits[key] = exact_bound(task, config).clairvoyant(env.episode.stream)
            row["bound_ii"] = float(clairvoyant_hits[key])
        rows.append(row)
        if on_result is not None:
            on_result(row)
    return rows
