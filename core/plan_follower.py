"""Following a workflow plan literally, and the exact success probability of doing so.

An executor that follows a plan reads its steps in the order they are numbered. ``PlanFollower`` states
that rule once, for every front end:

* the next step is the first step (by node index) whose tool has not yet succeeded in the episode and
  still has calls left under the call cap; a failed step therefore stays first and is retried until it
  succeeds or runs out of calls; steps whose tool is not a registry tool are skipped;
* a step passes its node's ``arguments``; a node that has arguments which break the tool's input schema
  (``Tool.check_arguments``) is called with ``invalid_input=True`` (INVALID_INPUT, no draw), exactly as
  the text env and the MCP server answer such a call. A node without arguments leaves them to the
  executor and is never rejected (the tool names-only plans of the paper);
* when no step is left (or no turn is), the follower signals completion.

``workflow_success`` is the exact expected full-success probability of that rule in the simulator, by
enumerating every success/failure branch of a real ``Episode``. For the optimal policy's workflow it
equals bound (iii) wherever the optimal policy never deviates from its happy path (see
``docs/core/prompts.md``).
"""

from __future__ import annotations

__all__ = ["PlanFollower", "PlanFollowingPlanner", "workflow_success"]

from collections.abc import Callable

import numpy as np

from .bounds import branch_episode, reference_workflow
from .config import WorldConfig
from .evaluator import Evaluation
from .registry import ToolRegistry, default_registry
from .simulator import Episode
from .tasks.library import Task
from .workflow import Workflow


class PlanFollower:
    """Executes a workflow's steps in numbered order under the episode rules (see the module doc)."""

    def __init__(self, workflow: Workflow, registry: ToolRegistry | None = None):
        self.workflow = workflow
        self.registry = registry or default_registry()
        steps = []
        for index, node in enumerate(workflow.nodes):
            if node.tool is None or node.tool not in self.registry:
                continue
            tool = self.registry.id_of(node.tool)
            invalid = bool(node.params) and self.registry.tools[tool].check_arguments(node.arguments) is not None
            steps.append((index, tool, invalid))
        self.steps: tuple[tuple[int, int, bool], ...] = tuple(steps)  # (node index, tool id, invalid input)

    def _next(self, episode: Episode) -> tuple[int, int, bool] | None:
        if episode.done or episode.turns_left == 0:
            return None
        succeeded, calls, cap = episode.succeeded, episode.calls, episode.max_calls
        for step in self.steps:
            tool = step[1]
            if not succeeded[tool] and calls[tool] < cap:
                return step
        return None

    def next_step(self, episode: Episode) -> int | None:
        """Index of the workflow node to execute next, or None to finish."""
        step = self._next(episode)
        return None if step is None else step[0]

    def next_call(self, episode: Episode) -> tuple[int, bool] | None:
        """(tool id, invalid_input) of the next call, or None to finish: what ``Episode.call`` takes."""
        step = self._next(episode)
        return None if step is None else (step[1], step[2])

    def play(self, episode: Episode) -> Evaluation:
        """Run ``episode`` to its end by following the plan; returns the evaluation."""
        while not episode.done:
            call = self.next_call(episode)
            if call is None:
                episode.finish()
            else:
                episode.call(call[0], invalid_input=call[1])
        assert episode.evaluation is not None  # an ended episode is graded
        return episode.evaluation


class PlanFollowingPlanner:
    """The ``Planner`` that follows a workflow (default: the optimal policy's ``reference_workflow``).

    ``act`` returns a tool id or FINISH; a front end that can reject arguments (the text env, the MCP
    harness) asks ``next_call`` instead, which also says whether the step's arguments are invalid.
    ``workflow`` is a fixed ``Workflow`` or a function of the task."""

    name = "plan_follower"

    def __init__(
        self,
        workflow: Workflow | Callable[[Task], Workflow] | None = None,
        config: WorldConfig | None = None,
        registry: ToolRegistry | None = None,
    ):
        self.workflow = workflow
        self.config = config or WorldConfig()
        self.registry = registry or default_registry()
        self.follower: PlanFollower | None = None

    def reset(self, task: Task, rng: np.random.Generator) -> None:
        if self.workflow is None:
            workflow = reference_workflow(task, self.config)
        elif isinstance(self.workflow, Workflow):
            workflow = self.workflow
        else:
            workflow = self.workflow(task)
        self.follower = PlanFollower(workflow, self.registry)

    def next_call(self, episode: Episode) -> tuple[int, bool] | None:
        if self.follower is None:
            raise RuntimeError("call reset(task, rng) before acting")
        return self.follower.next_call(episode)

    def act(self, episode: Episode, observation: np.ndarray | None) -> int:
        call = self.next_call(episode)
        return len(self.registry) if call is None else call[0]


# --- exact success of following a workflow --------------------------------------------------------------

_MEMO: dict[tuple, float] = {}
_MEMO_MAX = 1 << 18


def workflow_success(task: Task, workflow: Workflow, config: WorldConfig | None = None,
                     registry: ToolRegistry | None = None) -> float:
    """The exact expected full-success probability of following ``workflow`` on ``task`` (``PlanFollower``
    under the episode rules of ``config``), by enumerating every branch of the episode.

    Memoised on (required tools, call cap, the workflow itself, rules, failure and training models): the
    node order matters to a follower, so two workflows with the same canonical form may differ."""
    config = config or WorldConfig()
    key = (task.required_tools, task.max_retries, workflow, config.rules, config.failure, config.training)
    if registry is None:
        cached = _MEMO.get(key)
        if cached is not None:
            return cached
    value = _enumerate(PlanFollower(workflow, registry), task, config, registry) if workflow.nodes else 0.0
    if registry is None:
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[key] = value
    return value


def _enumerate(follower: PlanFollower, task: Task, config: WorldConfig, registry: ToolRegistry | None) -> float:
    """Expected full success over every branch of a real ``Episode``, merging branches that reach the same
    state: the calls or success of every plan tool and its dependencies, the failure counters and turns.
    Branches keep their undrawn rows at 0 (success), so equal states have equal futures."""
    root = Episode.start(task, 0, config, registry)
    root.stream = np.zeros_like(root.stream)  # every draw succeeds unless a branch sets it to fail
    required = root.required
    relevant = sorted({t for _, t, _ in follower.steps} | set(required)
                      | {d for _, t, _ in follower.steps for d in root.registry.dependency_ids[t]})
    values: dict[tuple, float] = {}

    def expand(episode: Episode) -> float:
        evaluation = episode.evaluation
        if evaluation is not None:  # the episode has ended
            return float(evaluation.level == "full_success")
        k = episode.next_required
        succeeded, calls = episode.succeeded, episode.calls
        if sum(succeeded[t] for t in required) != k:  # a required tool succeeded out of order
            return 0.0
        if k < len(required) and calls[required[k]] >= episode.max_calls:  # the next one can't succeed
            return 0.0
        streak = episode.same_tool_streak
        key = (tuple(-1 if succeeded[t] else calls[t] for t in relevant), episode.n_failures,
               episode.consecutive_failures, streak, episode.last_tool if streak else -1, episode.turns_used)
        value = values.get(key)
        if value is None:
            value = values[key] = step(episode)
        return value

    def step(episode: Episode) -> float:
        """Value of a state not seen before; ``episode`` is this branch's own copy and goes on as the
        success branch."""
        call = follower.next_call(episode)
        if call is None:
            episode.finish()
            return expand(episode)
        tool, invalid = call
        failure_branch = branch_episode(episode)
        failure_branch.stream[episode.draws_used, 0] = 1.0
        p = episode.call(tool, invalid_input=invalid).probability
        if p is None:  # answered without a draw
            return expand(episode)
        value = p * expand(episode) if p > 0.0 else 0.0
        if p < 1.0:
            failure_branch.call(tool)
            value += (1.0 - p) * expand(failure_branch)
        return value

    return expand(root)
