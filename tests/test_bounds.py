"""Bound (iii) is exact for the episode rules, bounds every heuristic, and is below bound (ii)."""

import math
from itertools import pairwise

import numpy as np
import pytest

from helpers import make_task
from resilibench.envs.config import WorldConfig
from resilibench.envs.simulator import Episode
from resilibench.envs.tasks import TASK_TYPE_NAMES, load_tasks
from resilibench.policies.bounds import (
    OptimalPlanner,
    clairvoyant_success,
    exact_bound,
    exact_policy_success,
    optimal_success,
    reference_workflow,
)
from resilibench.policies.heuristics import DependencyAwarePlanner, InOrderPlanner, RandomLegalPlanner
from resilibench.policies.runner import episode_jobs, run_jobs

STRICT = WorldConfig().replace(rules={"strict_dependencies": True})


def one_task_per_signature():
    seen = {}
    for task in load_tasks(split=None):
        seen.setdefault(task.required_tools, task)
    return list(seen.values())


def representative_tasks():
    """The longest-signature task of every type."""
    tasks = one_task_per_signature()
    return [max((t for t in tasks if t.task_type == ty), key=lambda t: len(exact_bound(t).tools))
            for ty in TASK_TYPE_NAMES]


@pytest.mark.parametrize("config", [WorldConfig(), STRICT], ids=["default", "strict"])
def test_optimal_policy_attains_bound_exactly(config):
    for task in representative_tasks():
        assert exact_policy_success(OptimalPlanner(config), task, config) == pytest.approx(
            optimal_success(task, config), abs=1e-12)


def test_bound_is_never_below_a_heuristic():
    for task in one_task_per_signature():
        bound = optimal_success(task)
        for planner in (InOrderPlanner(), DependencyAwarePlanner()):
            assert exact_policy_success(planner, task) <= bound + 1e-12


def test_bound_matches_monte_carlo_of_its_policy_through_the_env():
    task = representative_tasks()[-1]
    n = 3000
    rows = run_jobs(episode_jobs(["optimal", "random_legal"], [task], list(range(n))), clairvoyant=False)
    bound = optimal_success(task)
    optimal = np.mean([r["level"] == "full_success" for r in rows if r["planner"] == "optimal"])
    se = math.sqrt(bound * (1 - bound) / n)
    assert abs(optimal - bound) < 4.5 * se
    random_rate = np.mean([r["level"] == "full_success" for r in rows if r["planner"] == "random_legal"])
    assert random_rate < bound


def test_clairvoyant_bound_dominates_on_every_stream():
    task = representative_tasks()[2]
    bound = exact_bound(task)
    rows = run_jobs(episode_jobs(["optimal"], [task], list(range(400))))
    for row in rows:  # what the optimal policy achieved on a stream, the clairvoyant achieves too
        if row["level"] == "full_success":
            assert row["bound_ii"] == 1.0
    hits = [row["bound_ii"] for row in rows]
    assert np.mean(hits) >= bound.optimal_success - 4.5 * math.sqrt(0.25 / 400)
    assert np.mean(hits) > np.mean([row["level"] == "full_success" for row in rows])
    assert clairvoyant_success(task, range(50)) == pytest.approx(np.mean(hits[:50]))


def test_strict_dependencies_never_raise_the_bound():
    for task in representative_tasks():
        assert optimal_success(task, STRICT) <= optimal_success(task) + 1e-12


def test_bound_values_are_sane():
    single = make_task(("file_operations_reader",), task_type="simple_data_transformation")
    # One dependency-free tool, up to 3 tries before the repetition rule: 1 - P(three failures)
    p1, p2, p3 = 0.8, 0.8 * 0.9, 0.8 * 0.81
    v = optimal_success(single)
    assert v >= 1 - (1 - p1) * (1 - p2) * (1 - p3) - 1e-12
    assert 0.0 < v < 1.0
    with pytest.raises(ValueError, match="test"):
        optimal_success(single, WorldConfig().replace(rules={"profile": "training"}))


def test_random_planner_is_legal():
    task = representative_tasks()[0]
    planner = RandomLegalPlanner()
    for seed in range(50):
        episode = Episode.start(task, seed)
        planner.reset(task, np.random.default_rng(seed))
        while not episode.done:
            action = planner.act(episode, None)
            assert episode.action_mask[action] == 1
            episode.finish() if action == len(episode.registry) else episode.call(action)


def test_reference_workflow_is_the_optimal_happy_path():
    for task in representative_tasks():
        workflow = reference_workflow(task)
        tools = list(workflow.tools)
        positions = [tools.index(t) for t in task.required_tools]
        assert positions == sorted(positions)  # required tools in required order
        graph = workflow.to_networkx()
        for a, b in pairwise(positions):
            assert graph.has_edge(a, b)
        for j, tool in enumerate(tools):  # dependencies come first and are linked
            for dep in exact_bound(task).registry[tool].dependencies:
                if dep in tools:
                    assert graph.has_edge(tools.index(dep), j)
        # Following the workflow when every call succeeds is a full success
        episode = Episode.start(task, 0)
        episode.stream[:, 0] = 0.0
        for tool in tools:
            assert episode.call(tool).success
        assert episode.finish().level == "full_success"
