"""What every front end shares: its world, its task pool, the task and seed of a reset, action checks.

The planner env, its vector env, the text env and WorkflowGen draw their episodes the same way (so that
seeds pair across them) and check actions the same way; the helpers live here once.
"""

from __future__ import annotations

__all__ = [
    "front_end_world", "TaskPool", "task_by_id", "reset_task_id", "choose_task", "discrete_action",
    "select_tasks",
]

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .config import WorldConfig
from .simulator import EnvEpisodes
from .tasks.library import Task
from .world import World, get_world


def front_end_world(world: str | World, config: WorldConfig | None, rules: Mapping[str, Any] | None) -> World:
    """The world a front end runs: the chosen ``world`` under ``config`` (default: the world's own), with
    the episode ``rules`` a front end was given on top (``{"turn_limit": 12}``)."""
    return get_world(world, config).with_rules(**(rules or {}))


class TaskPool(tuple):
    """An env's task pool: a tuple of tasks with an id index (``by_id``) for pinned resets."""

    by_id: dict[str, Task]

    def __new__(cls, tasks=()):
        pool = super().__new__(cls, tasks)
        pool.by_id = {t.instance_id: t for t in pool}
        return pool


def task_by_id(tasks: TaskPool, task_id: str, world: World) -> Task:
    """A task of ``tasks`` by id (a dict look-up), else from ``world``'s shipped library (any split);
    KeyError naming the id."""
    return tasks.by_id.get(task_id) or world.task(task_id)


def reset_task_id(options: dict[str, Any] | None) -> str | None:
    """The task pinned by ``options["task_id"]`` (None: draw one); other options are an error."""
    if not options:
        return None
    options = dict(options)
    task_id = options.pop("task_id", None)
    if options:
        raise ValueError(f"unknown reset option(s) {sorted(options)}; accepted: ['task_id']")
    return task_id


def choose_task(tasks: TaskPool, episodes: EnvEpisodes, seed: int | None, options: dict[str, Any] | None,
                world: World) -> tuple[Task, int]:
    """(task, episode seed) of a reset: the next episode of ``episodes`` (``EnvEpisodes.next``, the same
    in every front end, so seeds pair across them); ``options["task_id"]`` pins the task."""
    task_id = reset_task_id(options)
    pinned = None if task_id is None else task_by_id(tasks, task_id, world)  # a bad id raises before any draw
    index, seed_of_episode = episodes.next(seed, len(tasks))
    return pinned or tasks[index], seed_of_episode


def discrete_action(action, n: int, name: str = "action", hint: str = "") -> int:
    """``action`` as an int in ``[0, n)``, the one action check of the discrete envs. Python and numpy
    integers (0-d integer arrays too, as RL libraries send them) are accepted; floats (even 3.0), strings
    and booleans raise ``ValueError`` naming ``name``, as do integers out of range (``hint`` says what
    the last action is, e.g. "FINISH = 30")."""
    if action.__class__ is not int:  # the common case, checked first
        integral = isinstance(action, int | np.integer) or (
            isinstance(action, np.ndarray) and action.shape == () and action.dtype.kind in "iu")
        if not integral or isinstance(action, bool):
            raise ValueError(f"{name} must be an integer in [0, {n - 1}], got {type(action).__name__} {action!r}")
        action = int(action)
    if not 0 <= action < n:
        raise ValueError(f"{name} must be in [0, {n - 1}]{f' ({hint})' if hint else ''}, got {action}")
    return action


def select_tasks(tasks: Sequence[Task] | None, split: str | None, task_types, world: World) -> TaskPool:
    """The env's task pool: given tasks, or ``world``'s shipped library filtered by split and task types."""
    if task_types is not None and not isinstance(task_types, str) and (
            not isinstance(task_types, Sequence) or not all(isinstance(t, str) for t in task_types)):
        raise ValueError(f"task_types must be a task type name or a list of them, got {task_types!r}")
    pool = TaskPool(tasks if tasks is not None else world.tasks(split, task_types))
    if not pool:
        raise ValueError(f"no tasks for split={split!r}, task_types={task_types!r}")
    return pool
