"""``WorkflowGen-v1``: building a workflow DAG for a task, step by step, scored by execution and structure."""

from __future__ import annotations

__all__ = ["STRUCTURAL_METRICS", "WorkflowReward", "WorkflowGenEnv"]

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from resilibench.settings import Settings, setting, settings_argument

from ...core.bounds import reference_workflow
from ...core.config import WorldConfig
from ...core.frontend import choose_task, discrete_action, select_tasks
from ...core.plan_follower import workflow_success
from ...core.registry import OPERATION_PHRASES, ToolRegistry, default_registry
from ...core.simulator import EnvEpisodes
from ...core.tasks.library import SPLITS, Task
from ...core.text.prompts import render_plan
from ...core.workflow import Node, Workflow
from ...core.world import DEFAULT_WORLD, World, get_world
from ...metrics.structural import chain_f1, reachability_f1
from ..planner.observation import N_TASK_FEATURES, task_features

STRUCTURAL_METRICS = {"chain_f1": chain_f1, "reachability_f1": reachability_f1}


@dataclass(frozen=True)
class WorkflowReward(Settings):
    """The end-of-episode reward of WorkflowGen: ``w_exec * execution + w_struct * structure``."""

    w_exec: float = setting(0.5, bounds=(0, None), help="weight of the exact execution success")
    w_struct: float = setting(0.5, bounds=(0, None), help="weight of the structural consistency")
    structural_metric: str = setting("chain_f1", choices=tuple(STRUCTURAL_METRICS),
                                     help="the structural consistency metric")


class WorkflowGenEnv(gym.Env):
    """
    ## Description

    Workflow generation as an episodic MDP. For a task of the ResiliBench library the agent builds a
    workflow: it adds tool steps (numbered in the order they are added) and dependency edges between
    steps, then stops. The finished workflow is scored by what it is worth when executed and by how much
    it looks like the optimal one:

    * execution: the exact probability that following it (``core.plan_follower``: steps in numbered
      order, a failed step retried while it has calls left) ends in full success in the simulator;
    * structure: its structural consistency with the task's ``reference_workflow`` (the optimal policy's
      workflow), by chain F1 or reachability F1 from ``resilibench.metrics.structural``.

    ## Action Space

    ``Discrete(T + N*N + 1)`` with T = 30 tools and N = ``max_nodes`` (default 10, so 131 actions):

    * ``a < T``: add a step calling tool ``a`` (its text is the tool's operation phrase);
    * ``T <= a < T + N*N``: add the edge ``(u, v)`` with ``u, v = divmod(a - T, N)``, step u before step v;
    * ``a = T + N*N``: STOP.

    ``info["action_mask"]`` (int8) marks the legal actions: adding a tool while fewer than N steps exist
    and the tool has fewer than ``max_copies`` steps; an edge between two existing, different steps that
    is not there yet and closes no cycle; STOP always. An illegal action inside the space is rejected
    (Gymnasium's convention for masked actions that a learner sends anyway): nothing changes, the reward
    is 0 and ``info["illegal_action"]`` says why; it still uses a step. Actions outside the space, and
    actions that are not integers (floats, strings, booleans; numpy integers are fine), raise ``ValueError``.

    ## Observation Space

    ``Box(0, 1, (20 + T + N*T + N*N + 2,), float32)`` (452 for the defaults), in this order: the 20 task
    features of ``envs.planner.observation.task_features``; the task's required-tool mask (T); per step slot a
    one-hot of its tool (N rows of T, zero for empty slots); the adjacency matrix (N rows of N,
    ``[u, v] = 1`` for an edge u -> v); the number of steps / N; the steps used / ``max_steps``.

    ## Rewards

    0 on every step but the last; at the end ``w_exec * execution + w_struct * structure`` (both in
    [0, 1]; defaults 0.5 and 0.5). The reference workflow itself earns ``w_exec * execution(reference)
    + w_struct``; its execution equals bound (iii) wherever the optimal policy never leaves its happy
    path, and is a little below it otherwise (``docs/core/prompts.md``). ``info`` at the end carries
    ``workflow``, ``reference``, ``execution`` and ``structure``.

    ## Starting State

    An empty workflow for a task sampled uniformly from the pool, or the task named by
    ``reset(options={"task_id": ...})``.

    ## Episode End

    Terminated on STOP. Truncated after ``max_steps`` steps (default ``N + N*(N-1)/2 + 1``, enough for any
    sequence of legal actions, so only rejected actions can use it up); the workflow built so far is
    scored either way.

    ## Arguments

    ```python
    import gymnasium as gym
    import resilibench

    from resilibench.envs.workflowgen.env import WorkflowReward

    env = gym.make("WorkflowGen-v1", split="test", task_types=["complex_validation_pipeline"],
                   reward=WorkflowReward(w_exec=0.5, w_struct=0.5, structural_metric="chain_f1"),
                   max_nodes=10, render_mode="ansi")
    obs, info = env.reset(seed=0, options={"task_id": "task_1a2b3c4d"})
    ```

    * ``split``, ``task_types``, ``tasks``: the task pool, as in ``ResiliBench-v1``.
    * ``config``: the ``WorldConfig`` the workflow is executed under (its ``test`` failure profile).
    * ``reward``: a ``WorkflowReward``: the non-negative weights ``w_exec`` and ``w_struct`` and the
      ``structural_metric``, "chain_f1" (default) or "reachability_f1".
    * ``max_nodes`` (N), ``max_copies`` (steps per tool, default 1), ``max_steps``.
    * ``render_mode``: "ansi" renders the task and the plan built so far.

    ## Version History

    * v0: initial release.
    * v1: world v1 (its task library and grading, docs/core/worlds.md); the default.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        split: str | None = "train",
        task_types: Sequence[str] | str | None = None,
        tasks: Sequence[Task] | None = None,
        config: WorldConfig | None = None,
        reward: WorkflowReward | None = None,
        max_nodes: int = 10,
        max_copies: int = 1,
        max_steps: int | None = None,
        registry: ToolRegistry | None = None,
        render_mode: str | None = None,
        world: str | World = DEFAULT_WORLD,
    ):
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
        reward = settings_argument("reward", reward, WorkflowReward) or WorkflowReward()
        for name, value in (("max_nodes", max_nodes), ("max_copies", max_copies)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.metric = STRUCTURAL_METRICS[reward.structural_metric]
        self.structural_metric = reward.structural_metric
        self.world = get_world(world, config)
        self.config = self.world.config
        self.registry = registry or default_registry()
        self.tasks = select_tasks(tasks, split, task_types, self.world)
        self._episodes = EnvEpisodes()
        self.w_exec, self.w_struct = reward.w_exec, reward.w_struct
        self.max_nodes, self.max_copies = max_nodes, max_copies
        self.max_steps = max_steps if max_steps is not None else max_nodes + max_nodes * (max_nodes - 1) // 2 + 1
        if not isinstance(self.max_steps, int) or isinstance(self.max_steps, bool) or self.max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
        self.render_mode = render_mode
        self.n_tools = len(self.registry)
        self.edge_offset = self.n_tools
        self.stop_action = self.n_tools + max_nodes * max_nodes
        self.action_space = spaces.Discrete(self.stop_action + 1)
        n, t = max_nodes, self.n_tools
        self._slots = N_TASK_FEATURES + t  # where the step one-hots begin
        self._adjacency = self._slots + n * t
        self._counts = self._adjacency + n * n
        self.observation_space = spaces.Box(0.0, 1.0, (self._counts + 2,), np.float32)
        self.task: Task | None = None

    # --- Gymnasium API -------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        task, _ = choose_task(self.tasks, self._episodes, seed, options, self.world)
        self.task = task
        self.nodes: list[int] = []
        self.edges: list[tuple[int, int]] = []
        self.reach = np.zeros((self.max_nodes, self.max_nodes), dtype=bool)  # u ~> v
        self.steps = 0
        self.done = False
        self._obs = np.zeros(self._counts + 2, dtype=np.float32)  # the observation space's shape
        self._obs[:N_TASK_FEATURES] = task_features(task, self.registry)
        self._obs[N_TASK_FEATURES + np.asarray(task.required_ids(self.registry), dtype=np.int64)] = 1.0
        return self._obs.copy(), self._info(task)

    def step(self, action):
        task = self.task
        if task is None:
            raise RuntimeError("call reset() before step()")
        if self.done:
            raise RuntimeError("episode has ended; call reset()")
        action = discrete_action(action, self.stop_action + 1, hint=f"STOP = {self.stop_action}")
        self.steps += 1
        problem = self._problem(action)
        if problem is None and action < self.n_tools:
            self._add_node(action)
        elif problem is None and action < self.stop_action:
            self._add_edge(*divmod(action - self.edge_offset, self.max_nodes))
        terminated = problem is None and action == self.stop_action
        truncated = not terminated and self.steps >= self.max_steps
        self._obs[self._counts + 1] = self.steps / self.max_steps
        info = self._info(task)
        reward = 0.0
        if terminated or truncated:
            self.done = True
            info |= self._score(task)
            reward = info["reward_exec"] + info["reward_struct"]
        if problem is not None:
            info["illegal_action"] = problem
        return self._obs.copy(), float(reward), terminated, truncated, info

    def render(self):
        if self.render_mode == "ansi":
            return self.render_text()
        return None

    # --- actions ---------------------------------------------------------------------------------------

    def action_mask(self) -> np.ndarray:
        """Legal actions (int8): tools that can be added, edges that can be added, STOP."""
        mask = np.zeros(self.stop_action + 1, dtype=np.int8)
        mask[self.stop_action] = 1
        if self.done:
            return mask
        n = len(self.nodes)
        if n < self.max_nodes:
            counts = np.bincount(np.asarray(self.nodes, dtype=np.int64), minlength=self.n_tools)
            mask[: self.n_tools] = counts < self.max_copies
        if n > 1:
            legal = ~self.reach[:n, :n].T  # u -> v closes a cycle when v ~> u already
            np.fill_diagonal(legal, False)
            for u, v in self.edges:
                legal[u, v] = False
            edges = np.zeros((self.max_nodes, self.max_nodes), dtype=np.int8)
            edges[:n, :n] = legal
            mask[self.edge_offset : self.stop_action] = edges.ravel()
        return mask

    def actions_for(self, workflow: Workflow) -> list[int]:
        """The actions that build ``workflow`` (its tool steps in order, then its edges) and stop."""
        if len(workflow.nodes) > self.max_nodes:
            raise ValueError(f"workflow has {len(workflow.nodes)} steps, more than max_nodes={self.max_nodes}")
        adds = []
        for node in workflow.nodes:
            if node.tool is None:
                raise ValueError("every step of a workflow built in WorkflowGen-v1 calls a tool")
            adds.append(self.registry.id_of(node.tool))
        edges = [self.edge_offset + a * self.max_nodes + b for a, b in workflow.edges]
        return adds + edges + [self.stop_action]

    def workflow(self) -> Workflow:
        """The workflow built so far."""
        names = self.registry.names
        nodes = tuple(Node(names[t], OPERATION_PHRASES[self.registry.tools[t].operation]) for t in self.nodes)
        return Workflow(nodes, tuple(sorted(self.edges)))

    def _problem(self, action: int) -> str | None:
        """Why ``action`` is illegal now, or None."""
        n = len(self.nodes)
        if action == self.stop_action:
            return None
        if action < self.n_tools:
            if n >= self.max_nodes:
                return f"the workflow already has max_nodes={self.max_nodes} steps"
            if self.nodes.count(action) >= self.max_copies:
                return f"{self.registry.names[action]} already has max_copies={self.max_copies} step(s)"
            return None
        u, v = divmod(action - self.edge_offset, self.max_nodes)
        if u >= n or v >= n:
            return f"edge ({u}, {v}) needs both steps to exist; the workflow has {n}"
        if u == v:
            return f"edge ({u}, {v}) is a self-loop"
        if (u, v) in self.edges:
            return f"edge ({u}, {v}) is already there"
        if self.reach[v, u]:
            return f"edge ({u}, {v}) would close a cycle"
        return None

    def _add_node(self, tool: int) -> None:
        i = len(self.nodes)
        self.nodes.append(tool)
        self._obs[self._slots + i * self.n_tools + tool] = 1.0
        self._obs[self._counts] = len(self.nodes) / self.max_nodes

    def _add_edge(self, u: int, v: int) -> None:
        self.edges.append((u, v))
        sources = self.reach[:, u].copy()
        sources[u] = True
        targets = self.reach[v].copy()
        targets[v] = True
        self.reach |= np.outer(sources, targets)
        self._obs[self._adjacency + u * self.max_nodes + v] = 1.0

    # --- scoring -----------------------------------------------------------------------------------------

    def _score(self, task: Task) -> dict[str, Any]:
        built = self.workflow()
        reference = reference_workflow(task, self.config)
        execution = workflow_success(task, built, self.config)
        structure = float(self.metric(built, reference).f1)
        return {
            "workflow": built,
            "reference": reference,
            "execution": execution,
            "structure": structure,
            "reward_exec": self.w_exec * execution,
            "reward_struct": self.w_struct * structure,
        }

    def _info(self, task: Task) -> dict[str, Any]:
        return {
            "action_mask": self.action_mask(),
            "task_id": task.instance_id,
            "task_type": task.task_type,
            "n_nodes": len(self.nodes),
            "n_edges": len(self.edges),
        }

    def render_text(self) -> str:
        """The task and the plan built so far, as a numbered plan."""
        if self.task is None:
            return "(not reset)"
        head = f"task {self.task.instance_id} ({self.task.task_type}); required: {', '.join(self.task.required_tools)}"
        return head + "\n" + render_plan(self.workflow(), "numbered")
