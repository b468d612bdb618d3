"""Following a plan: the step rule, the invalid-argument rule, and the exact success of following it."""


import numpy as np
import pytest

from helpers import STRICT, exact_play_success, make_task, representative_tasks, scripted_episode
from resilibench.core.arguments import valid_arguments
from resilibench.core.bounds import exact_policy_success, optimal_success, reference_workflow
from resilibench.core.config import WorldConfig
from resilibench.core.plan_follower import PlanFollower, PlanFollowingPlanner, workflow_success
from resilibench.core.registry import INVALID_INPUT, default_registry
from resilibench.core.simulator import Episode
from resilibench.core.workflow import Node, Workflow

# Strict dependencies and a repetition limit above the call cap (4 calls): the optimal policy then never
# leaves its happy path, so following its workflow is optimal.
HAPPY = WorldConfig().replace(rules={"strict_dependencies": True, "max_same_tool_failures": 5})
TASKS = representative_tasks()  # per task type, the task whose bound involves the most tools


def test_next_step_walks_the_plan_in_numbered_order():
    task = make_task(("file_operations_reader", "data_processing_parser"), max_retries=1)
    plan = Workflow((Node("file_operations_reader"), Node(text="think about it"), Node("not_a_tool"),
                     Node("data_processing_parser"), Node("file_operations_reader")))
    follower = PlanFollower(plan)
    episode = scripted_episode(task, [False, True, False, False])
    assert follower.next_step(episode) == 0
    episode.call("file_operations_reader")  # fails: the step stays first
    assert follower.next_step(episode) == 0
    episode.call("file_operations_reader")  # succeeds: text-only and unknown steps are skipped
    assert follower.next_step(episode) == 3
    episode.call("data_processing_parser")
    episode.call("data_processing_parser")  # two failures use up the cap of 1 + max_retries = 2 calls
    assert follower.next_step(episode) is None  # the repeated reader already succeeded
    assert follower.next_call(episode) is None


def test_invalid_arguments_are_called_as_invalid_input():
    registry = default_registry()
    reader = registry["file_operations_reader"]
    good = Node.make("file_operations_reader", arguments=valid_arguments(reader, {"source": "data/x.csv"}))
    bad = Node.make("file_operations_reader", arguments={"source": 42})
    bare = Node("file_operations_reader")  # no arguments: left to the executor, never rejected
    task = make_task(("file_operations_reader",), task_type="simple_data_transformation")
    for node, invalid in ((good, False), (bad, True), (bare, False)):
        follower = PlanFollower(Workflow((node,)))
        episode = Episode.start(task, 0)
        assert follower.next_call(episode) == (registry.id_of("file_operations_reader"), invalid)
        follower.play(episode)
        if invalid:
            assert {r.error_code for r in episode.trace} == {INVALID_INPUT}
            assert episode.evaluation.level == "failure"
    assert workflow_success(task, Workflow((bad,))) == 0.0
    assert workflow_success(task, Workflow((good,))) == workflow_success(task, Workflow((bare,))) > 0.9


@pytest.mark.parametrize("config", [WorldConfig(), STRICT], ids=["default", "strict"])
def test_exact_success_agrees_with_the_bounds_enumeration(config):
    """Two enumerations: the memoised one here and core.bounds.exact_policy_success, on a planner."""
    for task in (TASKS[0], TASKS[3]):
        workflow = reference_workflow(task, config)
        expected = exact_policy_success(PlanFollowingPlanner(workflow, config), task, config)
        assert workflow_success(task, workflow, config) == pytest.approx(expected, abs=1e-12)
        assert workflow_success(task, workflow, config) <= optimal_success(task, config) + 1e-12


def test_following_the_reference_attains_bound_iii_where_the_optimal_policy_keeps_its_happy_path():
    for task in TASKS:
        assert workflow_success(task, reference_workflow(task, HAPPY), HAPPY) == pytest.approx(
            optimal_success(task, HAPPY), abs=1e-12)
    # Under the default rules the optimal policy breaks a tool's failure streak (3 in a row end the
    # episode) with another call before its fourth try; a literal follower cannot, and falls short.
    single = make_task(("file_operations_reader",), task_type="simple_data_transformation")
    follow = workflow_success(single, reference_workflow(single))
    assert follow == pytest.approx(1 - 0.2 * (1 - 0.8 * 0.9) * (1 - 0.8 * 0.81), abs=1e-12)
    assert follow < optimal_success(single) - 0.005


def test_playing_the_plan_attains_its_exact_success():
    """Exactly: every branch of ``PlanFollower.play`` on a scripted stream, weighted by its calls'
    probabilities, sums to ``workflow_success``."""
    task = TASKS[-1]
    workflow = reference_workflow(task)
    assert exact_play_success(PlanFollower(workflow).play, task) == pytest.approx(
        workflow_success(task, workflow), abs=1e-12)


def test_flawed_orders_and_empty_plans():
    task = TASKS[2]
    workflow = reference_workflow(task)
    assert workflow_success(task, Workflow(())) == 0.0
    reversed_plan = Workflow(tuple(reversed(workflow.nodes)))
    assert workflow_success(task, reversed_plan) < workflow_success(task, workflow)
    # The memo keys on the workflow itself: node order matters even where the canonical form is equal
    unordered = Workflow(workflow.nodes)
    assert Workflow(tuple(reversed(workflow.nodes))).canonical_key() == unordered.canonical_key()
    assert workflow_success(task, unordered) != workflow_success(task, reversed_plan)


def test_planner_plays_through_the_planner_interface():
    """The planner (default plan: the reference workflow) played through ``act`` over every branch attains
    the plan's exact success; it must be reset first."""
    task = TASKS[1]
    planner = PlanFollowingPlanner()
    finish = len(default_registry())

    def play(episode: Episode) -> None:
        planner.reset(task, np.random.default_rng(0))
        while not episode.done:
            action = planner.act(episode, None)
            episode.finish() if action == finish else episode.call(action)

    assert exact_play_success(play, task) == pytest.approx(workflow_success(task, reference_workflow(task)),
                                                           abs=1e-12)
    with pytest.raises(RuntimeError, match="reset"):
        PlanFollowingPlanner().act(Episode.start(task, 0), None)
