"""The planner observation (paper app. D; docs/envs/planner.md): layout, the 20-dim task features, and encoding of an Episode.

Layout of the flat float32 vector (N = 30 tools):
    [0, 4N)        tool status one-hot, tool-major: NOT_ATTEMPTED, SUCCESS, FAILED, DEPENDENCY_FAILED
    [4N, 5N)       required-tool mask
    [5N, 6N)       features="full": next-required tool one-hot (all zero once every required tool has
                   succeeded); features="no_dependency_hints": the required order, (k + 1) / n for the
                   k-th of n required tools, fixed for the episode
    6N             progress (share of required tools that succeeded)
    6N + 1         step fraction (turns used / turn limit)
    6N + 2         failed calls so far N_h / turn limit
    6N + 3         consecutive failures / their limit
    [6N + 4, +20)  task features (``task_features``)

With failure processes on (``WorldConfig.processes``; ``ObservationLayout(N, processes=True)``) three
blocks follow, so a policy sees the process state it needs (``process_features``):
    [6N + 24, 7N + 24)  per tool, turns its calls stay rate-limited / rate_limit_wait (0 when free)
    [7N + 24, 8N + 24)  per tool, 1 when its last call found it down (an outage), else 0
    8N + 24             share of the time budget left (1 without a budget)

``features`` (``OBSERVATION_FEATURES``) chooses what the observation hands a policy about dependencies.
"full" (the default) also gives the next required tool and two dependency features of the task (share of
required tools with dependencies, dependencies outside the required list): the inputs of the
dependency-aware heuristic. "no_dependency_hints" keeps the task itself (which tools, in which order) and
the outcomes of calls, and leaves out what is derived from them: the next required tool (a policy must
track it from the statuses and the order) and both dependency features (zero). Same layout and size.
"""

from __future__ import annotations

__all__ = [
    "N_STATUS", "N_TASK_FEATURES", "OBSERVATION_FEATURES", "DEPENDENCY_TASK_FEATURES", "check_features",
    "ObservationLayout", "task_features", "counter_features", "counter_tables", "initial_observation",
    "process_features", "UINT8_SCALE", "quantize_uint8",
]

import numpy as np

from ...core.registry import CATEGORIES, ToolRegistry
from ...core.tasks.library import COMPLEXITIES, TASK_TYPE_NAMES, Task

N_STATUS = 4
N_TASK_FEATURES = 20
OBSERVATION_FEATURES = ("full", "no_dependency_hints")
DEPENDENCY_TASK_FEATURES = (15, 19)  # the task features about dependencies (zero without hints)
UINT8_SCALE = 240  # the compact observation's unit is 1/240: 240 = 2**4 * 3 * 5


def check_features(features: str) -> str:
    """``features`` if it is one of ``OBSERVATION_FEATURES``; ValueError naming the field otherwise."""
    if features not in OBSERVATION_FEATURES:
        raise ValueError(f"features must be one of {OBSERVATION_FEATURES}, got {features!r}")
    return features


class ObservationLayout:
    """Offsets of each block for a registry of ``n_tools`` tools (with ``processes``: the failure processes'
    blocks too)."""

    def __init__(self, n_tools: int, processes: bool = False):
        self.n_tools, self.processes = n_tools, processes
        self.status = 0
        self.required = N_STATUS * n_tools
        self.next_required = self.required + n_tools
        self.progress = self.next_required + n_tools
        self.step = self.progress + 1
        self.failures = self.step + 1
        self.consecutive = self.failures + 1
        self.task = self.consecutive + 1
        self.size = self.task + N_TASK_FEATURES
        if processes:
            self.blocked = self.size
            self.down = self.blocked + n_tools
            self.time_left = self.down + n_tools
            self.size = self.time_left + 1


def task_features(task: Task, registry: ToolRegistry) -> np.ndarray:
    """20 normalised features: type (5), complexity (3), size, category mix (6), dependency and limits (5)."""
    required = task.required_ids(registry)
    f = np.zeros(N_TASK_FEATURES, dtype=np.float32)
    f[TASK_TYPE_NAMES.index(task.task_type)] = 1.0
    f[5 + COMPLEXITIES.index(task.complexity)] = 1.0
    n = max(len(required), 1)
    f[8] = min(len(required), 6) / 6.0  # capped: the required-tool mask carries the exact count
    categories = list(CATEGORIES)
    for t in required:
        f[9 + categories.index(registry.tools[t].category)] += 1.0 / n
    f[15] = sum(1 for t in required if registry.dependency_ids[t]) / n
    f[16] = float(any(t in registry.output_ids for t in required))
    f[17] = task.max_retries / 5.0
    f[18] = float(task.constraints.get("timeout", 300)) / 600.0
    ancestors = set().union(*(registry.ancestors(t) for t in required)) if required else set()
    f[19] = min(len(ancestors - set(required)), 5) / 5.0
    return f


def counter_features(turns_used, n_failures, consecutive_failures, rules):
    """The observation's counters: step fraction, failed calls N_h / turn limit and consecutive failures /
    their limit (both capped at 1). Python numbers, or numpy arrays for all three (the batched env builds
    its tables from this function)."""
    cap = np.minimum if isinstance(turns_used, np.ndarray) else min
    limit = rules.turn_limit
    return (turns_used / limit, cap(n_failures / limit, 1.0),
            cap(consecutive_failures / rules.max_consecutive_failures, 1.0))


def counter_tables(rules) -> tuple[list[float], list[float], list[float]]:
    """``counter_features`` of every count an episode can reach (0 .. turn limit), as three lists (the same
    numbers, looked up instead of recomputed on the hot path)."""
    counts = np.arange(rules.turn_limit + 1)
    return tuple(np.asarray(x, dtype=np.float64).tolist() for x in counter_features(counts, counts, counts, rules))


def initial_observation(task: Task, registry: ToolRegistry, layout: ObservationLayout,
                        features: str = "full") -> np.ndarray:
    """Observation at the start of an episode of ``task`` (``features``: see the module docstring)."""
    obs = np.zeros(layout.size, dtype=np.float32)
    obs[layout.status : layout.required : N_STATUS] = 1.0  # every tool NOT_ATTEMPTED
    required = task.required_ids(registry)
    for t in required:
        obs[layout.required + t] = 1.0
    if not required:
        obs[layout.progress] = 1.0
    obs[layout.task : layout.task + N_TASK_FEATURES] = task_features(task, registry)
    if layout.processes:
        obs[layout.time_left] = 1.0
    if check_features(features) == "full":
        if required:
            obs[layout.next_required + required[0]] = 1.0
    else:
        for k, t in enumerate(required):
            obs[layout.next_required + t] = (k + 1) / len(required)
        obs[[layout.task + i for i in DEPENDENCY_TASK_FEATURES]] = 0.0
    return obs


def process_features(episode, layout: ObservationLayout, obs: np.ndarray) -> None:
    """Write the failure processes' blocks of ``obs`` (layout with ``processes``) from ``episode``'s state:
    turns each tool stays rate-limited (over ``rate_limit_wait``), whether its last call found it down, and
    the share of the time budget left."""
    processes = episode.config.processes
    wait = max(processes.rate_limit_wait, 1)
    down, blocked = episode.process_state()
    n = layout.n_tools
    obs[layout.blocked:layout.blocked + n] = np.minimum(np.asarray(blocked, dtype=np.float64) / wait, 1.0)
    obs[layout.down:layout.down + n] = [1.0 if d else 0.0 for d in down]
    budget, left = processes.time_budget_seconds, episode.time_left
    obs[layout.time_left] = 1.0 if budget is None else left / budget


def quantize_uint8(obs) -> np.ndarray:
    """The compact observation: each entry (in [0, 1]) in units of 1/``UINT8_SCALE``, rounded to the nearest
    (uint8, 0..240; ``obs / 240`` recovers it). Exact for 0, 1 and every fraction whose denominator divides
    240 (halves to sixths, eighths, tenths, twelfths, ...; the step fraction for turn limits dividing 240);
    others (sevenths: tasks with seven required tools) are off by at most 1/480."""
    return np.rint(np.asarray(obs, dtype=np.float32).astype(np.float64) * UINT8_SCALE).astype(np.uint8)
