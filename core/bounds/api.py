"""Bound (iii) of a task, chosen between the two DPs, and what is derived from it (docs/core/bounds.md):
``exact_bound`` (``plain.PlainBound`` without failure processes, ``processes.ProcessBound`` with some),
bound (iii) ``optimal_success``, bound (ii) ``clairvoyant_success`` and the optimal policy's
``reference_workflow``. Bound (i) is 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from itertools import pairwise

import numpy as np

from ..config import WorldConfig
from ..registry import OPERATION_PHRASES, ToolRegistry, default_registry
from ..simulator import draw_stream, run_episode_seed
from ..tasks.library import Task, dependency_sort
from ..workflow import Node, Workflow
from .base import ExactBound, Problem
from .plain import PlainBound


def bound_of(problem: Problem, registry: ToolRegistry | None = None) -> ExactBound:
    """Bound (iii) of a problem: a ``ProcessBound`` when failure processes are on, else a ``PlainBound``.
    The process DP's module (numba, which imports scipy) is imported only when a world has processes."""
    if problem.processes:
        from .processes import ProcessBound

        return ProcessBound(problem, registry)
    return PlainBound(problem, registry)


@cache
def _shared_bound(problem: Problem) -> ExactBound:
    """``bound_of`` with the default registry, one per problem for the life of the process."""
    return bound_of(problem)


def task_problem(task: Task, config: WorldConfig, registry: ToolRegistry | None = None) -> Problem:
    """The ``Problem`` of a task in a world: its required tools, its call cap, the world's rules, failure
    model and, when some are on, failure processes."""
    required, max_calls = task.required_ids(registry), 1 + task.max_retries
    if config.processes.active:
        from .processes import process_problem

        return process_problem(required, max_calls, config)
    return Problem(required, max_calls, config.rules, config.failure)


def exact_bound(task: Task, config: WorldConfig | None = None, registry: ToolRegistry | None = None) -> ExactBound:
    """The (cached) bound (iii) of a task (``bound_of``); tasks with the same required tools share one."""
    problem = task_problem(task, config or WorldConfig(), registry)
    return _shared_bound(problem) if registry is None else bound_of(problem, registry)


def optimal_success(task: Task, config: WorldConfig | None = None) -> float:
    """Bound (iii): the exact optimal full-success probability of ``task``."""
    return exact_bound(task, config).optimal_success


def clairvoyant_success(task: Task, seeds: Sequence[int], config: WorldConfig | None = None) -> float:
    """Bound (ii) averaged over the streams that a run's episodes of ``task`` meet for run seeds ``seeds``
    (``simulator.run_episode_seed``, as ``policies.runner`` plays them)."""
    config = config or WorldConfig()
    bound = exact_bound(task, config)
    turn_limit = config.rules.turn_limit
    hits = [bound.clairvoyant(draw_stream(run_episode_seed(task.instance_id, seed), turn_limit)) for seed in seeds]
    return float(np.mean(hits)) if hits else float("nan")


def varied_tasks(count: int, seed: int = 0, max_tools: int = 6, registry: ToolRegistry | None = None
                 ) -> list[Task]:
    """``count`` tasks with distinct random required-tool lists (1 to ``max_tools`` of any tools, sorted by
    their dependencies, max_retries 3): a varied workload for checking and timing the bounds."""
    registry = registry or default_registry()
    rng = np.random.default_rng(seed)
    seen: set[tuple[str, ...]] = set()
    tasks = []
    while len(tasks) < count:
        picked = rng.choice(len(registry), size=int(rng.integers(1, max_tools + 1)), replace=False)
        tools = tuple(dependency_sort([registry.names[t] for t in picked], registry))
        if tools not in seen:
            seen.add(tools)
            tasks.append(Task(instance_id=f"varied_{len(tasks):05d}", task_type="basic_file_processing",
                              description="random required tools", inputs={}, expected_outputs={},
                              required_tools=tools, constraints={"max_retries": 3}, complexity="medium"))
    return tasks


def reference_workflow(task: Task, config: WorldConfig | None = None) -> Workflow:
    """The optimal policy's workflow: its happy-path tool sequence with dependency edges (a tool after
    each tool it depends on) and the required order (each required tool after the previous one)."""
    problem = task_problem(task, config or WorldConfig())
    return path_workflow(task, _shared_happy_path(problem), _shared_bound(problem).registry)


@cache
def _shared_happy_path(problem: Problem) -> tuple[int, ...]:
    """``happy_path`` of the shared bound of ``problem`` (``exact_bound``), once per problem: every prompt
    that shows the optimal plan reads it."""
    return tuple(_shared_bound(problem).happy_path())


def path_workflow(task: Task, tools: Sequence[int], registry: ToolRegistry) -> Workflow:
    """The workflow of a tool sequence: each tool after the tools it depends on, each required tool after
    the previous required one (how the optimal and the learned policies' workflows are built)."""
    nodes = tuple(Node(registry.names[t], OPERATION_PHRASES[registry.tools[t].operation]) for t in tools)
    position = {t: i for i, t in enumerate(tools)}
    edges = {(position[d], position[t]) for t in tools for d in registry.dependency_ids[t] if d in position}
    required = [t for t in task.required_ids(registry) if t in position]
    edges |= {(position[a], position[b]) for a, b in pairwise(required)}
    return Workflow(nodes, tuple(sorted(edges)))


