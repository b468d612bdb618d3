"""A planner's exact success under failure processes, met a frontier at a time (``exact_policy_success``),
equals a depth-first enumeration with a memo bit for bit, whether the planner decides one episode at a time
or a whole frontier in one ``act_batch`` call."""

from pathlib import Path

from helpers import depth_first_success
from resilibench.core.bounds import exact_policy_success
from resilibench.core.config import load_config
from resilibench.core.tasks.library import interleave_task_types
from resilibench.core.world import load_tasks
from resilibench.policies.heuristics import HEURISTICS

EXAMPLES = Path(__file__).parents[2] / "examples" / "processes"


class Batched:
    """A planner's ``act`` offered as ``act_batch`` (records the batch sizes)."""

    def __init__(self, planner):
        self.planner, self.name, self.batches = planner, planner.name, []

    def reset(self, task, rng):
        self.planner.reset(task, rng)

    def act(self, episode, observation):
        raise AssertionError("the enumeration decides a frontier with act_batch")

    def act_batch(self, episodes):
        self.batches.append(len(episodes))
        return [self.planner.act(e, None) for e in episodes]


def test_frontier_enumeration_matches_depth_first():
    config = load_config(EXAMPLES / "combined.yaml").replace(rules={"turn_limit": 6})  # all processes at once
    for task in interleave_task_types(load_tasks(split="test"))[:2]:
        for name in ("in_order", "process_aware"):
            reference = depth_first_success(HEURISTICS[name](), task, config)
            assert exact_policy_success(HEURISTICS[name](), task, config) == reference
            batched = Batched(HEURISTICS[name]())
            assert exact_policy_success(batched, task, config) == reference
            assert max(batched.batches) > 1  # branches of the processes meet in frontiers
