"""The process-aware heuristic: what it does on crafted traces (a Retry-After, a failure streak), that it
plays like the dependency-aware heuristic where nothing fails, and that it beats it in a process world."""

from pathlib import Path

import numpy as np
import pytest

from helpers import make_task
from resilibench.core.bounds import exact_policy_success
from resilibench.core.config import WorldConfig, load_config
from resilibench.core.processes import RATE_LIMIT_ERROR, SERVICE_UNAVAILABLE
from resilibench.core.registry import default_registry
from resilibench.core.simulator import Episode
from resilibench.core.tasks.library import interleave_task_types
from resilibench.core.world import load_tasks
from resilibench.policies.compare import mean_interval, summarize_exact
from resilibench.policies.heuristics import DependencyAwarePlanner, ProcessAwarePlanner

REGISTRY = default_registry()
EXAMPLES = Path(__file__).parents[2] / "examples" / "processes"
READER, POSTER = "file_operations_reader", "network_poster"  # the poster depends on a helper
TASK = make_task((READER, POSTER), task_id="task_reader_poster")


def answer(success: bool, code: str | None, retry_after: int | None = None):
    """A call's outcome as the real-API mode hands it to the episode (only the trace records it)."""
    return lambda tool: (success, code, 0.1, retry_after)


def act(planner, episode: Episode) -> int:
    return planner.act(episode, None)


def test_a_retry_after_is_spent_on_the_later_tools_dependencies_then_the_tool_is_called_again():
    episode = Episode.start(TASK, 0, load_config(EXAMPLES / "rate_limits.yaml"))
    planner = ProcessAwarePlanner()
    planner.reset(TASK, np.random.default_rng(0))
    reader, poster = REGISTRY.id_of(READER), REGISTRY.id_of(POSTER)
    assert act(planner, episode) == reader
    episode.call(reader, outcome=answer(False, RATE_LIMIT_ERROR, retry_after=2))  # turn 1: refused for 2 turns
    helper = DependencyAwarePlanner()._first_unmet(episode, poster)
    assert helper != poster and act(planner, episode) == helper  # turn 2: the poster's prerequisite
    episode.call(helper, outcome=answer(True, None))
    second = act(planner, episode)  # turn 3: still refused; another call, never a required tool
    assert second not in (reader, poster, helper) and REGISTRY.names[second] not in TASK.required_tools
    episode.call(second, outcome=answer(True, None))
    assert act(planner, episode) == reader  # turn 4: the Retry-After has passed


def test_the_call_that_would_end_the_episode_goes_to_a_harmless_tool():
    """Two outages in a row on the next tool: a third failure would hit the repetition limit, so the
    planner calls a dependency-free tool the task does not need, the most reliable one, then retries."""
    config = load_config(EXAMPLES / "bases.yaml").replace(processes={"outage_start": 0.15, "outage_end": 0.4})
    task = make_task((READER,), task_id="task_reader")
    episode = Episode.start(task, 0, config)
    planner = ProcessAwarePlanner()
    reader = REGISTRY.id_of(READER)
    for _ in range(2):
        assert act(planner, episode) == reader
        episode.call(reader, outcome=answer(False, SERVICE_UNAVAILABLE))
    spare = act(planner, episode)
    bases = config.processes.tool_base_success
    free = [n for n in REGISTRY.names if n != READER and not REGISTRY.dependency_ids[REGISTRY.id_of(n)]]
    assert REGISTRY.names[spare] == max(free, key=bases.__getitem__)
    episode.call(spare, outcome=answer(False, SERVICE_UNAVAILABLE))
    assert act(planner, episode) == reader  # the streak is broken


def test_without_failures_it_plays_like_the_dependency_aware_heuristic():
    episode = Episode.start(TASK, 0, WorldConfig())
    process_aware, dependency_aware = ProcessAwarePlanner(), DependencyAwarePlanner()
    while not episode.done:
        action = act(dependency_aware, episode)
        assert act(process_aware, episode) == action
        if action == len(REGISTRY):
            episode.finish()
        else:
            episode.call(action, outcome=answer(True, None))


@pytest.mark.parametrize("world", ["rate_limits", "outages"])
def test_it_beats_the_dependency_aware_heuristic_in_a_process_world(world):
    config = load_config(EXAMPLES / f"{world}.yaml")
    tasks = interleave_task_types(load_tasks(None, "test", None))[:3]
    rows = [{"bound_iii": 1.0, **{p.name: exact_policy_success(p, t, config)
                                  for p in (DependencyAwarePlanner(), ProcessAwarePlanner())}} for t in tasks]
    summary = summarize_exact(rows, ["dependency_aware", "process_aware"], "process_aware")
    assert summary["process_aware"]["mean"] > summary["dependency_aware"]["mean"]
    assert summary["dependency_aware"]["minus_process_aware"]["mean"] < 0


def test_mean_interval():
    mean, low, high = mean_interval([0.0, 1.0, 0.0, 1.0])
    assert mean == 0.5 and low < 0.5 < high and high - 0.5 == pytest.approx(0.5 - low)
    assert mean_interval([0.3]) == (0.3, 0.3, 0.3)
