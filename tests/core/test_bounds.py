"""Bound (iii) is exact for the episode rules, bounds every heuristic, and is below bound (ii)."""

import json
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from helpers import (
    STRICT,
    check_env_plays_the_episodes,
    make_task,
    one_task_per_signature,
    representative_tasks,
)
from resilibench.core.bounds import (
    PlainBound,
    Problem,
    clairvoyant_success,
    exact_bound,
    exact_policy_success,
    optimal_success,
    reference_workflow,
    varied_tasks,
)
from resilibench.core.config import WorldConfig
from resilibench.core.simulator import Episode
from resilibench.core.tasks.library import dependency_sort
from resilibench.policies.heuristics import DependencyAwarePlanner, InOrderPlanner, RandomLegalPlanner
from resilibench.policies.optimal import OptimalPlanner
from resilibench.policies.runner import episode_jobs, run_jobs

CONFIGS = pytest.mark.parametrize("config", [WorldConfig(), STRICT], ids=["default", "strict"])

# Problems unlike the v0 library's: every category, dependencies that are not required (helpers), a
# required tool that a helper depends on, single tools with and without helpers, six tools.
NEW_KINDS = [make_task(dependency_sort(tools), task_id=f"task_kind_{i}") for i, tools in enumerate([
    ("file_operations_reader", "data_processing_filter", "network_fetcher", "computation_calculator",
     "integration_mapper", "utility_notifier"),
    ("file_operations_reader", "data_processing_parser", "file_operations_writer"),
    ("computation_analyzer",),
    ("utility_logger",),
    ("network_validator", "utility_tracker", "computation_analyzer", "computation_calculator",
     "integration_authenticator", "network_fetcher"),
    ("data_processing_parser", "data_processing_validator", "computation_calculator",
     "data_processing_aggregator", "network_poster", "integration_queue"),
])]


def all_actions_bound(task, config):
    """Bound (iii) with every tool of the problem an action at every state (later required tools and
    helpers nothing needs any more included): the reference for the pruned action set."""
    problem = Problem(task.required_ids(), 1 + task.max_retries, config.rules, config.failure)
    return PlainBound(problem, all_actions=True)


@CONFIGS
def test_optimal_policy_attains_bound_exactly(config):
    for task in representative_tasks() + NEW_KINDS:
        assert exact_policy_success(OptimalPlanner(config), task, config) == pytest.approx(
            optimal_success(task, config), abs=1e-12)


def test_bound_is_never_below_a_heuristic():
    signatures = one_task_per_signature()
    for task in signatures[:: max(1, len(signatures) // 60)] + NEW_KINDS:  # at most about 60 of the library
        bound = optimal_success(task)
        for planner in (InOrderPlanner(), DependencyAwarePlanner()):
            assert exact_policy_success(planner, task) <= bound + 1e-12


def test_the_env_plays_the_episodes_the_bound_is_exact_for():
    """Through the planner env the optimal and in-order planners play the episodes they play on Episode
    (where the optimal one attains the bound exactly), seed for seed."""
    check_env_plays_the_episodes(representative_tasks()[-1], WorldConfig(), ["optimal", "in_order"], range(300))


def test_clairvoyant_bound_dominates_on_every_stream():
    """Wherever the optimal policy reaches full success the clairvoyant does too, so bound (ii), averaged
    over streams, is at least bound (iii)."""
    task = representative_tasks()[2]
    rows = run_jobs(episode_jobs(["optimal"], [task], list(range(400))))
    for row in rows:
        if row["level"] == "full_success":
            assert row["bound_ii"] == 1.0
    hits = [row["bound_ii"] for row in rows]
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


@CONFIGS
def test_bound_equals_the_full_state_dp_of_v0_on_its_problems(config):
    """Values (to 1e-12) and optimal happy paths recorded from the DP over the full episode state, before
    canonical subproblems and the pruned action set, on every distinct problem of the v0 library."""
    reference = json.loads((Path(__file__).parents[1] / "data" / "bound_iii_v0_reference.json").read_text())
    field = "strict" if config.rules.strict_dependencies else "default"
    assert len(reference["problems"]) == 41
    for row in reference["problems"]:
        task = make_task(row["required_tools"], max_retries=row["max_retries"])
        bound = exact_bound(task, config)
        assert bound.optimal_success == pytest.approx(row[field], abs=1e-12)
        if field == "default":
            assert [bound.registry.names[t] for t in bound.happy_path()] == row["happy_path"]


@CONFIGS
def test_pruned_actions_lose_nothing(config):
    """The next required tool, the helpers still needed and a filler reach the optimum of all actions,
    on new kinds of problems and on random varied ones (same value, same optimal happy path)."""
    for task in NEW_KINDS + varied_tasks(20, seed=11):
        full = all_actions_bound(task, config)
        bound = exact_bound(task, config)
        assert bound.optimal_success == pytest.approx(full.optimal_success, abs=1e-12)
        assert bound.happy_path() == full.happy_path()


def test_optimal_policy_never_loses_where_the_clairvoyant_would_on_new_kinds():
    rows = run_jobs(episode_jobs(["optimal"], NEW_KINDS, list(range(60))))
    for row in rows:
        if row["level"] == "full_success":
            assert row["bound_ii"] == 1.0


def test_pruned_actions_lose_nothing_from_off_policy_states():
    """From states the optimal policy never visits (a later required tool or an unneeded helper already
    called, strings of failures), the pruned DP still has the value of the DP with every action."""
    planner, checked = RandomLegalPlanner(), 0
    for task in NEW_KINDS[:3]:
        bound, full = exact_bound(task), all_actions_bound(task, WorldConfig())
        for seed in range(40):
            episode = Episode.start(task, seed)
            planner.reset(task, np.random.default_rng(seed))
            for _ in range(seed % 6):
                if episode.done:
                    break
                action = planner.act(episode, None)
                episode.finish() if action == len(episode.registry) else episode.call(action)
            if not episode.done:
                assert bound.value(bound.state_of(episode)) == pytest.approx(
                    full.value(full.state_of(episode)), abs=1e-12)
                checked += 1
    assert checked > 60
