"""Bound (iii) under failure processes is exact: the DP's policy attains the DP's value on real Episodes
(every outcome of every call enumerated), the pruned actions lose nothing, and on small worlds an
expectimax over the real Episode with every tool an action gets the same values, from the start and from
states the optimal policy never visits.

The fast lane checks each on short tasks and short episodes and on the smallest worlds; the slow lane
(``-m slow``) repeats them on the library's longest tasks at the default turn limit and on larger small
worlds.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import check_env_plays_the_episodes, make_task
from resilibench.core.bounds import (
    ProcessBound,
    branch_episode,
    call_branches,
    clairvoyant_success,
    episode_state,
    exact_bound,
    exact_policy_success,
    monte_carlo_success,
    optimal_success,
    process_problem,
    varied_tasks,
)
from resilibench.core.config import WorldConfig, load_config
from resilibench.core.registry import ToolRegistry, default_registry
from resilibench.core.simulator import Episode
from resilibench.core.world import load_tasks
from resilibench.errors import ConfigError
from resilibench.policies.heuristics import DependencyAwarePlanner, InOrderPlanner
from resilibench.policies.optimal import OptimalPlanner

REGISTRY = default_registry()
EXAMPLES = Path(__file__).parents[2] / "examples" / "processes"
# One setting per process (docs/core/bounds.md, "Failure processes"), and all of them at once.
OPTIONS = {
    "bases": load_config(EXAMPLES / "bases.yaml").to_dict()["processes"],
    "outages": {"outage_start": 0.15, "outage_end": 0.4},
    "rate_limits": {"rate_limit_probability": 0.2, "rate_limit_wait": 2},
    "latency": {"latency_seconds": [0.5, 1.0, 3.0], "latency_weights": [0.6, 0.3, 0.1],
                "call_timeout_seconds": 2.5, "time_budget_seconds": 12.0},
}
OPTIONS["combined"] = {k: v for option in OPTIONS.values() for k, v in option.items()}


# Short tasks for short episodes: a required tool behind two helpers, a helper that depends on a required
# tool, a single tool.
SHORT_TASKS = [make_task(("file_operations_reader", "network_poster"), task_id="task_short_helpers"),
               make_task(("data_processing_parser", "computation_calculator"), task_id="task_short_required_dep"),
               make_task(("utility_logger",), task_id="task_short_single")]
# The fast lane on short tasks and short episodes, the slow lane on long ones.
LANES = pytest.mark.parametrize("short", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["short", "long"])


def world(option: str, strict: bool = False, short: bool = False) -> WorldConfig:
    """The world of ``option``; all processes at once with 6 turns (at 10 their state space is large).
    Short episodes: 6 turns, all processes at once 5."""
    turns = (5 if option == "combined" else 6) if short else (6 if option == "combined" else None)
    rules = {"turn_limit": turns} if turns else {}
    return WorldConfig().replace(processes=OPTIONS[option], rules={"strict_dependencies": strict, **rules})


def some_tasks():
    """The two longest test-split tasks, a hand-made one with a helper that is not required, two random."""
    library = sorted(load_tasks(split="test"), key=lambda t: -len(exact_bound(t).tools))[:2]
    helper = make_task(("file_operations_reader", "data_processing_validator", "computation_calculator",
                        "data_processing_aggregator", "network_poster"), task_id="task_helpers")
    return library + [helper] + varied_tasks(2, seed=5)


@LANES
@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_optimal_policy_attains_the_bound_exactly(option, strict, short):
    config = world(option, strict, short)
    for task in SHORT_TASKS if short else some_tasks():
        bound = optimal_success(task, config)
        assert exact_policy_success(OptimalPlanner(config), task, config) == pytest.approx(bound, abs=1e-12)
        assert optimal_success(task, config) <= optimal_success(task, WorldConfig().replace(
            rules={"strict_dependencies": strict})) + 1e-12 or option == "bases"  # processes only add failures
        for planner in (InOrderPlanner(), DependencyAwarePlanner()):
            assert exact_policy_success(planner, task, config) <= bound + 1e-12


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_processes_that_change_nothing_give_the_v1_bound(strict):
    """A world with a process 'on' that changes no probability (every base the default one) is solved by
    the process DP and gives the v1 DP's values, bit for bit."""
    v1 = WorldConfig().replace(rules={"strict_dependencies": strict})
    neutral = v1.replace(processes={"tool_base_success": {n: 0.8 for n in REGISTRY.names}})
    for task in some_tasks() + varied_tasks(10, seed=3):
        assert isinstance(exact_bound(task, neutral), ProcessBound)
        assert optimal_success(task, neutral) == optimal_success(task, v1)


REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "bound_iii_processes_reference.json").read_text())


@pytest.mark.parametrize("every", [200, pytest.param(25, marks=pytest.mark.slow)], ids=["sample", "recorded"])
@pytest.mark.parametrize("name", sorted(REFERENCE["values"]))
def test_process_worlds_give_the_recorded_values_bit_for_bit(name, every):
    """Every 25th test task (fast lane: every 200th) of each world of examples/processes/ gets the value
    recorded from the earlier DP over tuple keys, bit for bit (the same float, not one within 1e-12)."""
    config = load_config(EXAMPLES / f"{name}.yaml")
    recorded = REFERENCE["values"][name]
    tasks = load_tasks(split="test")[::every]
    assert tasks and all(t.instance_id in recorded for t in tasks)
    assert {t.instance_id: repr(optimal_success(t, config)) for t in tasks} == {
        t.instance_id: recorded[t.instance_id] for t in tasks}


@LANES
@pytest.mark.parametrize("option", list(OPTIONS))
def test_pruned_actions_lose_nothing(option, short):
    """The next required tool, the helpers still needed, the kept failed spares and the best fresh spare
    reach the optimum of every tool of the problem as an action (value and optimal happy path)."""
    for strict in (False, True):
        config = world(option, strict, short)
        for task in SHORT_TASKS if short else some_tasks()[2:4] + varied_tasks(2, seed=9):
            problem = process_problem(task.required_ids(), 1 + task.max_retries, config)
            full, bound = ProcessBound(problem, all_actions=True), exact_bound(task, config)
            assert bound.optimal_success == pytest.approx(full.optimal_success, abs=1e-12)
            assert bound.happy_path() == full.happy_path()


# --- brute force on small worlds ------------------------------------------------------------------------

def small_registry(required, n_spares, n_others):
    """The tools of ``required`` and their prerequisites, ``n_spares`` dependency-free other tools, and
    ``n_others`` other tools with dependencies (all among the tools kept)."""
    keep = {REGISTRY.id_of(n) for n in required}
    for name in required:
        keep |= REGISTRY.ancestors(REGISTRY.id_of(name))
    keep |= set([t for t in range(len(REGISTRY)) if t not in keep and not REGISTRY.dependency_ids[t]][:n_spares])
    keep |= set([t for t in range(len(REGISTRY)) if t not in keep and REGISTRY.dependency_ids[t]
                 and set(REGISTRY.dependency_ids[t]) <= keep][:n_others])
    return ToolRegistry(tuple(REGISTRY.tools[t] for t in sorted(keep)))


def expectimax(root: Episode) -> dict:
    """The best full-success probability from every state reachable from ``root`` (required tools
    succeeding in order) with every legal tool an action, and FINISH, over the real Episode's branches:
    {episode_state: (value, an episode in that state)}."""
    memo: dict = {}

    def value(episode: Episode) -> float:
        if episode.done:
            return float(episode.evaluation.level == "full_success")
        if sum(episode.succeeded[t] for t in episode.required) != episode.next_required:
            return 0.0
        key = episode_state(episode)
        if key not in memo:
            finished = branch_episode(episode)
            best = float(finished.finish().level == "full_success")
            if episode.turns_left > 0:
                for tool in np.flatnonzero(episode.action_mask[:-1]):
                    best = max(best, sum(q * value(b) for q, b in call_branches(episode, int(tool)) if q > 0))
            memo[key] = best, episode
        return memo[key][0]

    value(root)
    return memo


# Short episodes where fillers matter: 2 failures of one tool in a row end the episode (a filler call in
# between lets it be tried again), and so do 3 failures in a row (unless the case keeps the default 5).
SMALL_RULES = {"max_consecutive_failures": 3, "max_same_tool_failures": 2}
SMALL_WORLDS = {
    # tools of distinct bases: fillers taken best first, a failed better spare re-called; tools with
    # dependencies no more reliable than dependency-free ones (what the bound requires)
    "bases": {"tool_base_success": {n: (0.5 if REGISTRY.dependency_ids[i] else 0.7) + 0.008 * i
                                    for i, n in enumerate(REGISTRY.names)}},
    "outages": OPTIONS["outages"],  # a spare found up is better than a fresh one
    "anti_outages": {"outage_start": 0.7, "outage_end": 0.6},  # a spare found down is better than a fresh one
    "rate_limits": {"rate_limit_probability": 0.3, "rate_limit_wait": 1},
    "latency": {"latency_seconds": [0.5, 1.0, 3.0], "latency_weights": [0.6, 0.3, 0.1],
                "call_timeout_seconds": 2.5, "time_budget_seconds": 3.0},
    "bases_outages": {"tool_base_success": {n: (0.6 if REGISTRY.dependency_ids[i] else 0.95) - 0.005 * i
                                            for i, n in enumerate(REGISTRY.names)},
                      "outage_start": 0.2, "outage_end": 0.5},
}
ONE, TWO = ("file_operations_reader",), ("file_operations_reader", "data_processing_parser")
# (world, required tools, turn limit, the default consecutive-failure limit, spare tools, other tools with
# dependencies). The fast lane: each world once, as small as it goes; with one tool and 5 turns a failed
# spare is worth calling again (the first case fails when the DP never keeps one). The slow lane: larger
# registries, and the outage case where a spare found up is worth calling again.
FAST_SMALL_CASES = [("bases", ONE, 5, True, 5, 0), ("bases", TWO, 4, False, 4, 1), ("outages", ONE, 4, False, 4, 0),
                    ("anti_outages", ONE, 4, False, 4, 0), ("rate_limits", ONE, 4, False, 4, 0),
                    ("latency", ONE, 4, False, 4, 0), ("bases_outages", ONE, 4, False, 4, 0)]
SLOW_SMALL_CASES = [("outages", ONE, 5, True, 5, 1), ("bases", ONE, 5, True, 5, 1), ("outages", TWO, 4, False, 5, 2),
                    ("anti_outages", ONE, 4, False, 5, 2), ("rate_limits", TWO, 4, False, 5, 2),
                    ("latency", ONE, 4, False, 5, 2), ("bases", TWO, 4, False, 5, 2),
                    ("bases_outages", TWO, 4, False, 5, 2)]
SMALL_CASES = [pytest.param(*case, id=f"{case[0]}-{len(case[1])}-T{case[2]}-S{case[4]}-O{case[5]}", marks=marks)
               for cases, marks in ((FAST_SMALL_CASES, ()), (SLOW_SMALL_CASES, pytest.mark.slow)) for case in cases]


@pytest.mark.parametrize(("option", "required", "turn_limit", "default_consecutive", "spares", "others"),
                         SMALL_CASES)
def test_bound_equals_expectimax_over_every_tool_on_small_worlds(option, required, turn_limit,
                                                                 default_consecutive, spares, others):
    """Checks the arguments the DP rests on (fillers are spare tools, fresh ones taken best first, a failed
    spare kept only when the best fresh one is not as good, the pruned actions) against an expectimax with
    every tool an action (spares and other tools with dependencies among them), in every state it reaches:
    the DP's value of each state equals the expectimax's."""
    registry = small_registry(required, spares, others)
    task = make_task(required)
    processes = dict(SMALL_WORLDS[option])
    if "tool_base_success" in processes:  # the tools of the small registry
        processes["tool_base_success"] = {n: b for n, b in processes["tool_base_success"].items() if n in registry}
    rules = {**SMALL_RULES, "turn_limit": turn_limit}
    if default_consecutive:
        del rules["max_consecutive_failures"]
    for strict in (False, True)[: 2 if len(required) > 1 else 1]:  # one tool has no dependency to be strict on
        config = WorldConfig().replace(rules={**rules, "strict_dependencies": strict}, processes=processes)
        bound = ProcessBound(process_problem(task.required_ids(registry), 4, config), registry)
        values = expectimax(Episode.start(task, 0, config, registry))
        assert len(values) > 100
        for value, episode in values.values():
            assert bound.value(bound.state_of(episode)) == pytest.approx(value, abs=1e-12)


# --- through the env, and bad input -----------------------------------------------------------------------

def test_the_env_plays_the_episodes_the_bound_is_exact_for():
    """Under all processes at once the optimal and in-order planners play the same episodes through the
    planner env as on Episode (where the optimal one attains the bound exactly), seed for seed; rows carry
    no bound (ii)."""
    task = some_tasks()[2]  # five tools: full success is possible in the 6 turns of the combined world
    rows = check_env_plays_the_episodes(task, world("combined"), ["optimal", "in_order"], range(150))
    assert not any("bound_ii" in row for row in rows)


def test_bad_process_settings_are_named():
    task = some_tasks()[2]
    with pytest.raises(ConfigError, match="processes.tool_base_success"):
        optimal_success(task, WorldConfig().replace(processes={"tool_base_success": {"no_such_tool": 0.9}}))
    with pytest.raises(ConfigError, match="^processes: bound \\(ii\\)"):
        clairvoyant_success(task, range(2), world("outages"))


def test_monte_carlo_estimate_covers_the_exact_value():
    """The one statistical check: the 95% interval of the estimate covers the exact value."""
    task, config = some_tasks()[2], world("outages")
    rate, (low, high) = monte_carlo_success(OptimalPlanner(config), [task], config, episodes=800)
    assert low <= optimal_success(task, config) <= high and low < rate < high
    in_order, _ = monte_carlo_success(InOrderPlanner(), [task], config, episodes=800)
    assert in_order < low
