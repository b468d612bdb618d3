"""Run planners on ResiliBench-v1 episodes and collect one result row per episode.

Every planner meets the same random stream for the same (task, seed): common random numbers make the
comparison between planners, and with bound (iii), paired. A run can also write a call log
(``resilibench.envs.real_api.call_log``): one row per call that reached the (simulated) service, for calibration.
"""

from __future__ import annotations

__all__ = [
    "PLANNER_NAMES", "make_planner", "planner_rng", "run_episode", "log_row", "episode_jobs", "run_jobs",
]

import zlib
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.bounds import exact_bound, optimal_success
from ..core.config import WorldConfig
from ..core.planner import Planner
from ..core.simulator import CallRecord, Episode, task_seed
from ..core.tasks.library import Task
from ..envs.planner.env import ResiliBenchEnv
from ..envs.real_api.call_log import CallLogRow, write_rows
from .heuristics import HEURISTICS
from .optimal import OptimalPlanner

if TYPE_CHECKING:  # real-API mode's client (and its HTTP stack) loads only when an api is given
    from ..envs.real_api.live_apis import RealApi


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


def run_episode(env: ResiliBenchEnv, planner: Planner, task: Task, seed: int,
                call_log: list[CallLogRow] | None = None) -> dict[str, Any]:
    """Play one episode of ``task`` for run seed ``seed``; returns its result row. ``call_log``: a list
    that receives the episode's call-log rows (``log_row``)."""
    obs, info = env.reset(seed=task_seed(task.instance_id, seed), options={"task_id": task.instance_id})
    planner.reset(task, planner_rng(planner.name, seed))
    total_reward, done = 0.0, False
    episode, n_tools = env.episode, env.n_tools
    assert episode is not None  # started by the reset above
    while not done:
        action = planner.act(episode, obs)
        covariates = episode.covariates(action) if call_log is not None and action < n_tools else None
        calls_before = len(episode.trace)
        obs, reward, terminated, truncated, info = env.step(action)
        total_reward += reward
        done = terminated or truncated
        if call_log is not None and covariates is not None and len(episode.trace) > calls_before:
            record = episode.trace[-1]
            if record.reached_service:
                call_log.append(log_row(record, covariates, f"{planner.name}/{task.instance_id}/{seed}", episode))
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


def log_row(record: CallRecord, covariates: tuple[int, int, int], episode_id: str, episode: Episode) -> CallLogRow:
    """The call-log row (source "simulator") of a call ``record`` of ``episode`` made with the success
    formula's ``covariates`` (taken before the call): its duration as the latency when the world has
    latency, the refusal's wait as the Retry-After."""
    latency = record.duration if episode.config.processes.latency_seconds else None
    return CallLogRow("simulator", episode.task.instance_id, episode_id, record.turn, record.tool, *covariates,
                      record.success, record.error_code, latency_s=latency, retry_after=record.retry_after)


def episode_jobs(planners: Sequence[str], tasks: Sequence[Task], seeds: Sequence[int]) -> list[tuple[str, Task, int]]:
    """Every (planner, task, seed) combination in a fixed order."""
    return [(p, t, s) for p in planners for t in tasks for s in seeds]


def run_jobs(
    jobs: Iterable[tuple[str, Task, int]],
    config: WorldConfig | None = None,
    on_result: Callable[[dict[str, Any]], object] | None = None,
    clairvoyant: bool = True,
    call_log: str | Path | None = None,
    api: RealApi | None = None,
    bounds: bool = True,
    logged: Collection[str] = (),
) -> list[dict[str, Any]]:
    """Run (planner, task, seed) jobs in one env; ``on_result`` sees each row as it is produced.
    ``bounds=False`` leaves both bounds out of the rows (a call log's generation needs none, and under
    failure processes the exact bound takes seconds per task).
    Rows carry bound (iii) of the task and, with ``clairvoyant``, bound (ii) of the episode's stream (not
    defined under failure processes: their draws come from streams of their own). ``call_log``: a file that
    receives every episode's call-log rows (appended in one write per episode), but for the episodes named in
    ``logged`` (those a resumed run's log holds already: a kill between an episode's rows and its result row
    leaves them there). ``api``: real-API mode (``ResiliBenchEnv``'s ``RealApi``; its client writes its own
    log there)."""
    config = config or WorldConfig()
    clairvoyant = clairvoyant and not config.processes.active
    jobs = list(jobs)
    env = ResiliBenchEnv(tasks=sorted({t.instance_id: t for _, t, _ in jobs}.values(), key=lambda t: t.instance_id),
                         config=config, split=None, api=api)
    try:
        return _run_in(env, jobs, config, on_result, clairvoyant and bounds, call_log, bounds, set(logged))
    finally:
        env.close()


def _run_in(env: ResiliBenchEnv, jobs: list[tuple[str, Task, int]], config: WorldConfig,
            on_result: Callable[[dict[str, Any]], object] | None, clairvoyant: bool,
            call_log: str | Path | None, bounds: bool, logged: set[str]) -> list[dict[str, Any]]:
    """The rows of ``jobs`` played in ``env`` (see ``run_jobs``)."""
    planners: dict[str, Planner] = {}
    clairvoyant_hits: dict[tuple[str, int], bool] = {}
    rows = []
    for name, task, seed in jobs:
        planner = planners.setdefault(name, make_planner(name, config))
        rows_of_calls: list[CallLogRow] | None = [] if call_log is not None else None
        row = run_episode(env, planner, task, seed, rows_of_calls)
        if call_log is not None and rows_of_calls and rows_of_calls[0].episode not in logged:
            write_rows(call_log, rows_of_calls)
        if bounds:
            row["bound_iii"] = optimal_success(task, config)
        if clairvoyant:
            key = (task.instance_id, seed)
            if key not in clairvoyant_hits:
                assert env.episode is not None  # run_episode played it
                clairvoyant_hits[key] = exact_bound(task, config).clairvoyant(env.episode.stream)
            row["bound_ii"] = float(clairvoyant_hits[key])
        rows.append(row)
        if on_result is not None:
            on_result(row)
    return rows
