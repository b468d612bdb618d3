"""The adversarial game (PettingZoo): a flaw injector against an executor of the planner MDP.

The game is written once, here, without a version; ``resilibench.envs.adversarial_v1`` and
``adversarial_v0`` are its versions (PettingZoo's convention), each played on its world. ``env()`` is the AEC
env with PettingZoo's standard wrappers, ``raw_env`` the bare AEC env and ``parallel_env()`` the native
parallel env; ``help(raw_env)`` documents the game.
"""

from __future__ import annotations

__all__ = [
    "ADVERSARY", "EXECUTOR", "NO_FLAW", "FLAW_CHOICES", "STEP_FEATURES", "RESET_OPTIONS", "env",
    "parallel_env", "versioned", "raw_env", "AdversarialParallelEnv",
]

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils import wrappers

from ...core.arguments import task_hints
from ...core.bounds import reference_workflow
from ...core.config import WorldConfig
from ...core.frontend import discrete_action
from ...core.plan_follower import PlanFollower
from ...core.registry import default_registry
from ...core.simulator import Episode
from ...core.tasks.library import Task
from ...core.text.flaws import (
    FLAW_METHODS,
    FLAW_TYPES,
    MATCHERS,
    FlawNotApplicable,
    applicable_positions,
    inject_flaw,
)
from ...core.text.prompts import with_arguments
from ...core.workflow import Workflow
from ...core.world import DEFAULT_WORLD, World
from ..planner.env import ResiliBenchEnv

ADVERSARY, EXECUTOR = "adversary", "executor"
NO_FLAW = 0
FLAW_CHOICES: tuple[tuple[str, str], ...] = tuple((t, m) for t in FLAW_TYPES for m in FLAW_METHODS[t])
STEP_FEATURES = 3  # per plan position beyond the tool one-hot: free step, invalid arguments, done
RESET_OPTIONS = ("task_id", "workflow")
_FLAW_STREAM = 0xF1A3  # mixes the reset seed into the separate seed stream of flaw injections


def env(**kwargs) -> AECEnv:
    """The AEC env with PettingZoo's standard checks (action bounds, call order)."""
    aec = raw_env(**kwargs)
    aec = wrappers.AssertOutOfBoundsWrapper(aec)
    return wrappers.OrderEnforcingWrapper(aec)


def parallel_env(**kwargs) -> AdversarialParallelEnv:
    """The native parallel env (see ``AdversarialParallelEnv``)."""
    return AdversarialParallelEnv(**kwargs)


def versioned(world: str) -> tuple[Callable[..., raw_env], Callable[..., AECEnv], Callable[..., AdversarialParallelEnv]]:
    """(raw_env, env, parallel_env) of the game played on ``world`` unless a ``world`` keyword is given: what
    a version module (``adversarial_v1``) exports."""
    return (functools.partial(raw_env, world=world), functools.partial(env, world=world),
            functools.partial(parallel_env, world=world))


@lru_cache(maxsize=4096)
def _follower(workflow: Workflow) -> PlanFollower:
    """The literal plan follower of ``workflow`` (it reads the plan once: steps, tools, argument checks)."""
    return PlanFollower(workflow, default_registry())


@lru_cache(maxsize=4096)
def _plan_rows(workflow: Workflow, max_plan_length: int) -> tuple[np.ndarray, tuple[tuple[int, int], ...]]:
    """(plan rows without done flags, ((row, tool id) of each shown registry-tool step)) of a workflow."""
    registry = default_registry()
    n_tools = len(registry)
    rows = np.zeros((max_plan_length, n_tools + STEP_FEATURES), dtype=np.float32)
    for index, node in enumerate(workflow.nodes[:max_plan_length]):
        if node.tool is None or node.tool not in registry:
            rows[index, n_tools] = 1.0
    shown = []
    for index, tool, invalid in _follower(workflow).steps:
        if index < max_plan_length:
            rows[index, tool] = 1.0
            rows[index, n_tools + 1] = float(invalid)
            shown.append((index, tool))
    rows.flags.writeable = False
    return rows, tuple(shown)


@lru_cache(maxsize=4096)
def _adversary_mask(workflow: Workflow, max_plan_length: int, matcher: str) -> np.ndarray:
    """The adversary's legal actions on ``workflow``: "no flaw" and every applicable (flaw, position)."""
    mask = np.zeros(1 + len(FLAW_CHOICES) * max_plan_length, dtype=np.int8)
    mask[NO_FLAW] = 1
    for k, (flaw_type, method) in enumerate(FLAW_CHOICES):
        for position in applicable_positions(workflow, flaw_type, method, matcher=matcher):
            if position < max_plan_length:
                mask[1 + k * max_plan_length + position] = 1
    mask.flags.writeable = False
    return mask


class raw_env(AECEnv):
    """
    # Adversarial plans (``adversarial_v1``)

    | Import             | `from resilibench.envs import adversarial_v1`               |
    |--------------------|-------------------------------------------------------------|
    | Actions            | Discrete                                                    |
    | Parallel API       | Yes (`adversarial_v1.parallel_env()`, native)               |
    | Agents             | `agents = ['adversary', 'executor']`                        |
    | Action Values      | adversary `[0, 1 + 14 * max_plan_length)`, executor `[0, 30]` |
    | Observations       | Dict: `observation` (float32 in [0, 1]), `action_mask` (int8) |

    ## Description

    A flaw injector plays against an executor over one ResiliBench task. The adversary sees the task and the
    clean plan the executor is about to receive: the optimal policy's ``reference_workflow`` (or a workflow
    passed with ``reset(options={"workflow": ...})``) with valid arguments filled in, exactly the plan of the
    text env's prompts (``core.text.prompts.with_arguments``). It injects flaws into it: one of the seven flaw
    types of ``resilibench.core.text.flaws`` (order, tool misuse, parameter, missing step, redundant, logic
    discontinuity, semantic drift), by one of the type's two methods, at a plan position, up to ``budget``
    injections. The executor then plays the planner MDP of ``ResiliBench-v1`` on the same ``Episode`` core
    (the same rules, random stream and evaluator), seeing the planner observation and the plan it received.
    The game is zero-sum on the executor's full success.

    The plan is advice. An executor's tool call is a planner-MDP call, without arguments, exactly as in
    ``ResiliBench-v1``; in this MDP a plan step is its tool, and whether its arguments fit the tool's
    schema. So a parameter flaw only flags its step (a literal plan follower, ``PlanFollower``, would have
    that call rejected with INVALID_INPUT), and flaws that change only a step's text or an argument's value
    within the schema (``description_drift``, ``format_mismatch``) change nothing the executor sees.

    ## Agents

    ``"adversary"`` acts first, one injection per step, until it chooses "no flaw" or has used its budget;
    then ``"executor"`` acts until the episode ends. Only the agent on turn has legal actions: the other
    agent's ``action_mask`` is all zeros (PettingZoo's convention), and in the parallel API its action is
    ignored (it may be left out).

    ## Action Spaces

    * adversary: ``Discrete(1 + 14 * max_plan_length)``. Action 0 is "no flaw" (it ends the adversary's turn
      and forfeits the rest of its budget). Action ``1 + (2 * t + m) * max_plan_length + p`` injects flaw type
      ``FLAW_TYPES[t]`` by method ``FLAW_METHODS[type][m]`` at plan position ``p`` (0-based node index) with
      the env's fixed ``severity``; ``adversary_action(flaw_type, method, position)`` and
      ``describe_adversary_action(action)`` convert. The mask marks the positions where the flaw applies
      (``applicable_positions``); a masked action injects nothing and still uses one injection of the budget.
    * executor: ``Discrete(31)`` as in ``ResiliBench-v1``: tool ``i < 30`` or FINISH (30). The mask is the
      planner env's (a tool is legal while it has not succeeded, is under its call cap and a turn is left;
      FINISH always); masked actions are played under the shared episode rules, as in ``ResiliBench-v1``.
    * Actions outside the space, or not integers (floats, strings, booleans; numpy integers are fine),
      raise ``ValueError``.

    ## Observation Spaces

    Both are Dicts ``{"observation": Box(0, 1, float32), "action_mask": Box(0, 1, int8)}``. The plan is shown
    as ``max_plan_length`` rows of ``33`` floats, one per plan position (node index): the tool one-hot (30),
    "step without a registry tool", "arguments break the tool's schema", and "the step's tool has succeeded"
    (executor only). Positions beyond the plan are zero; steps beyond ``max_plan_length`` are not shown.

    * adversary (``12 * 33 + 30 + 20 + 1 = 447`` floats by default): the current plan, the task's
      required-tool mask, the 20 task features of the planner observation, and the share of the budget left.
    * executor (``204 + 12 * 33 + 30 = 630`` floats by default): the ``ResiliBench-v1`` observation (see
      ``resilibench.envs.planner.observation``), the received plan (zero while the adversary is still acting), and a
      one-hot of the tool that a literal plan follower would call next (zero when it would finish). With
      ``hide_required=True`` the planner observation's required-tool mask, next-required one-hot and progress
      are zeroed, so the plan is the executor's only guide to which tools the task needs.

    ## Rewards

    Zero-sum, at the end only: the executor gets 1 for full success and 0 otherwise; the adversary gets the
    negative (-1 or 0). Every other step rewards 0.

    ## Starting State

    A task drawn from the pool (or ``options["task_id"]``) and an episode started exactly as
    ``ResiliBench-v1``'s ``reset(seed)`` does: for the same seed and task the executor meets the same task and
    random stream, so with "no flaw" and the same calls its episode is ``ResiliBench-v1``'s, step for step.
    Flaw injections draw their seeds from a separate stream of the same seed.

    ## Episode End

    When the executor's episode ends (FINISH, too many consecutive failures, a repetition loop: terminated;
    a tool action after the turn limit: truncated), both agents end together and receive their rewards.
    ``infos["executor"]`` then holds ``level``, ``evaluation`` and ``end_reason`` as ``ResiliBench-v1``'s info
    does; ``infos[agent]["injections"]`` lists what the adversary did.

    ## Arguments

    ```python
    from resilibench.envs import adversarial_v1

    env = adversarial_v1.env(split="test", task_types=["simple_data_transformation"], budget=1, severity=0.5,
                             max_plan_length=12, hide_required=False, matcher="lexical",
                             rules={"turn_limit": 10})
    env.reset(seed=0, options={"task_id": "task_1a2b3c4d"})
    ```

    * ``split``, ``task_types``, ``tasks``, ``config``, ``rules``, ``world``: as for ``ResiliBench-v1`` (the
      task pool and the world's rules).
    * ``budget``: injections the adversary may make (>= 1, default 1).
    * ``severity``: the severity of every injection, in (0, 1] (default 0.5): the share of the method's
      eligible positions changed, starting at the chosen one (``inject_flaw``).
    * ``matcher``: the tool similarity of the flaws, "auto" (default: the embedding model when installed),
      "semantic" or "lexical"; pass one of the last two for the same flaws on every install.
    * ``max_plan_length``: plan positions shown and addressable (default 12; the library's reference plans
      have at most 8 steps).
    * ``hide_required``: hide the task's required tools from the executor (default False).
    * ``reset`` options: ``task_id`` (pin a task), ``workflow`` (a ``Workflow`` to use as the clean plan).

    ## Version History

    * v0: initial release (episode rules of ResiliBench-v0).
    * v1: world v1 (its task library and grading, docs/core/worlds.md); the default.
    """

    metadata = {
        "name": "adversarial_v0",
        "render_modes": ["ansi", "human"],
        "render_fps": 4,
        # The agents take turns in phases, not in cycles: ``aec_to_parallel`` does not apply; the native
        # ``parallel_env`` does.
        "is_parallelizable": False,
    }

    def __init__(
        self,
        split: str | None = "train",
        task_types: Sequence[str] | str | None = None,
        tasks: Sequence[Task] | None = None,
        budget: int = 1,
        severity: float = 0.5,
        max_plan_length: int = 12,
        hide_required: bool = False,
        matcher: str = "auto",
        config: WorldConfig | None = None,
        rules: Mapping[str, Any] | None = None,
        render_mode: str | None = None,
        world: str | World = DEFAULT_WORLD,
    ):
        super().__init__()
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"budget must be an integer >= 1, got {budget!r}")
        if isinstance(severity, bool) or not isinstance(severity, int | float) or not 0.0 < severity <= 1.0:
            raise ValueError(f"severity must be a number in (0, 1], got {severity!r}")
        if matcher not in MATCHERS:
            raise ValueError(f"matcher must be one of {MATCHERS}, got {matcher!r}")
        if isinstance(max_plan_length, bool) or not isinstance(max_plan_length, int) or max_plan_length < 1:
            raise ValueError(f"max_plan_length must be an integer >= 1, got {max_plan_length!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.planner = ResiliBenchEnv(split=split, task_types=task_types, tasks=tasks, config=config,
                                      rules=rules, world=world)
        self.config = self.planner.config
        # Reference plans come from bound (iii), which is defined for the test profile.
        self._plan_config = self.config.replace(rules={"profile": "test"})
        self.registry = self.planner.registry
        self.budget, self.severity = budget, float(severity)
        self.max_plan_length, self.hide_required, self.matcher = max_plan_length, bool(hide_required), matcher
        self.render_mode = render_mode
        self.possible_agents = [ADVERSARY, EXECUTOR]
        self.agents = []

        n_tools = len(self.registry)
        layout = self.planner.layout
        self._layout, self._n_tools = layout, n_tools
        self._plan_size = max_plan_length * (n_tools + STEP_FEATURES)
        self._hidden = slice(layout.required, layout.progress + 1)
        n_adversary = 1 + len(FLAW_CHOICES) * max_plan_length
        adversary_size = self._plan_size + n_tools + (layout.size - layout.task) + 1
        self._executor_size = executor_size = layout.size + self._plan_size + n_tools
        self._action_spaces = {ADVERSARY: spaces.Discrete(n_adversary), EXECUTOR: spaces.Discrete(n_tools + 1)}
        self._observation_spaces = {
            agent: spaces.Dict({
                "observation": spaces.Box(0.0, 1.0, (size,), np.float32),
                "action_mask": spaces.Box(0, 1, (int(self._action_spaces[agent].n),), np.int8),
            })
            for agent, size in ((ADVERSARY, adversary_size), (EXECUTOR, executor_size))
        }
        self._flaw_rng: np.random.Generator | None = None
        self.task: Task | None = None
        self.clean_plan: Workflow | None = None
        self.plan: Workflow | None = None
        self.injections: list[dict[str, Any]] = []
        self._clean_plans: dict[str, Workflow] = {}

    @property
    def episode(self) -> Episode | None:
        """The executor's ``Episode`` (the same core as ``ResiliBench-v1``'s)."""
        return self.planner.episode

    # --- spaces ---------------------------------------------------------------------------------------

    def observation_space(self, agent: str) -> spaces.Dict:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Discrete:
        return self._action_spaces[agent]

    def adversary_action(self, flaw_type: str, method: str, position: int) -> int:
        """The adversary action that injects ``flaw_type`` by ``method`` at plan position ``position``."""
        try:
            k = FLAW_CHOICES.index((flaw_type, method))
        except ValueError:
            raise ValueError(f"unknown (flaw_type, method) {(flaw_type, method)!r}; accepted: {FLAW_CHOICES}") from None
        if not 0 <= position < self.max_plan_length:
            raise ValueError(f"position must be in [0, {self.max_plan_length}), got {position!r}")
        return 1 + k * self.max_plan_length + position

    def describe_adversary_action(self, action: int) -> tuple[str, str, int] | None:
        """(flaw type, method, position) of an adversary action; None for "no flaw"."""
        action = self._check_action(ADVERSARY, action)
        if action == NO_FLAW:
            return None
        k, position = divmod(action - 1, self.max_plan_length)
        return (*FLAW_CHOICES[k], position)

    # --- AEC API --------------------------------------------------------------------------------------

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        task_id, workflow = self._read_options(options)
        # The planner env draws the task and the episode seed exactly as ResiliBench-v1 does.
        first_obs, _ = self.planner.reset(seed=seed, options=None if task_id is None else {"task_id": task_id})
        if seed is not None or self._flaw_rng is None:
            self._flaw_rng = np.random.default_rng(None if seed is None else [seed, _FLAW_STREAM])
        episode = self.planner.episode
        assert episode is not None  # the planner's reset starts one
        self.task = episode.task
        self.clean_plan = self._clean_plan(self.task, workflow)
        self.plan = self.clean_plan
        self.injections = []
        self._injections_left = self.budget
        self._executor_obs = self._planner_part(first_obs)
        self._end_info: dict[str, Any] = {}
        self._task_part = np.concatenate([first_obs[self._layout.required:self._layout.required + self._n_tools],
                                          first_obs[self._layout.task:]])
        self.agents = self.possible_agents[:]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.agent_selection = ADVERSARY
        self._update_infos()

    def step(self, action) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        if agent == ADVERSARY:
            self._adversary_step(self._check_action(ADVERSARY, action))
        else:
            self._executor_step(action)
        self._update_infos()
        self._accumulate_rewards()
        if self.render_mode == "human":
            print(self.render_text())

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        if agent not in self._observation_spaces:
            raise ValueError(f"unknown agent {agent!r}; agents: {self.possible_agents}")
        on_turn = agent == self.agent_selection and not self.ended
        _, plan, episode = self._played()
        if agent == ADVERSARY:
            rows, _ = _plan_rows(plan, self.max_plan_length)
            left = self._injections_left / self.budget
            obs = np.concatenate([rows.ravel(), self._task_part, np.array([left], dtype=np.float32)])
            mask = _adversary_mask(plan, self.max_plan_length, self.matcher) if on_turn else None
        else:
            obs = np.zeros(self._executor_size, dtype=np.float32)
            obs[:self._layout.size] = self._executor_obs
            if self._injections_left == 0:  # the plan is delivered once the adversary is done
                self._write_plan(obs[self._layout.size:], plan, episode)
            mask = episode.action_mask if on_turn else None
        n_actions = self._action_spaces[agent].n
        action_mask = np.zeros(n_actions, dtype=np.int8) if mask is None else mask.copy()
        return {"observation": obs, "action_mask": action_mask}

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self.render_text()
        if self.render_mode == "human":
            print(self.render_text())
        return None

    def close(self) -> None:
        pass

    # --- helpers --------------------------------------------------------------------------------------

    def render_text(self) -> str:
        """The task, the injections, the plan the executor received and its calls so far."""
        if self.task is None:
            return "(not reset)"
        lines = [f"task {self.task.instance_id} ({self.task.task_type}); required: {', '.join(self.task.required_tools)}"]
        for injection in self.injections:
            done = "injected" if injection["applied"] else "not applicable, nothing injected"
            lines.append(f"  flaw {injection['flaw_type']}/{injection['method']} at step {injection['position'] + 1}: {done}")
        lines.append("  plan:")
        lines += ["    " + line for line in self._played()[1].to_plan().splitlines()]
        lines += self.planner.render_text().splitlines()[1:]
        return "\n".join(lines)

    def _read_options(self, options: dict[str, Any] | None) -> tuple[str | None, Workflow | None]:
        options = dict(options or {})
        unknown = sorted(set(options) - set(RESET_OPTIONS))
        if unknown:  # PettingZoo's API tests pass an arbitrary option; name it rather than fail
            warnings.warn(f"ignoring unknown reset option(s) {unknown}; accepted: {list(RESET_OPTIONS)}",
                          stacklevel=3)
        task_id, workflow = options.get("task_id"), options.get("workflow")
        if task_id is not None and not isinstance(task_id, str):
            raise ValueError(f"reset option task_id must be a task id string, got {task_id!r}")
        if workflow is not None and not isinstance(workflow, Workflow):
            raise ValueError(f"reset option workflow must be a resilibench.core.workflow.Workflow, got {type(workflow).__name__}")
        return task_id, workflow

    def _clean_plan(self, task: Task, workflow: Workflow | None) -> Workflow:
        """The plan before flaws: ``workflow`` (else the task's reference workflow) with valid arguments,
        as the text env's plans carry them (``core.text.prompts.with_arguments``)."""
        if workflow is not None:
            return with_arguments(task, workflow, self.registry)
        plan = self._clean_plans.get(task.instance_id)
        if plan is None:
            reference = reference_workflow(task, self._plan_config)
            plan = self._clean_plans[task.instance_id] = with_arguments(task, reference, self.registry)
        return plan

    def _check_action(self, agent: str, action) -> int:
        return discrete_action(action, int(self._action_spaces[agent].n), f"{agent} action")

    def _adversary_step(self, action: int) -> None:
        choice = self.describe_adversary_action(action)
        if choice is None:
            self._injections_left = 0
        else:
            flaw_type, method, position = choice
            task, plan, _ = self._played()
            assert self._flaw_rng is not None  # reset() draws it
            applied = bool(_adversary_mask(plan, self.max_plan_length, self.matcher)[action])
            seed = int(self._flaw_rng.integers(2**31))
            record = {"flaw_type": flaw_type, "method": method, "position": position, "applied": applied,
                      "changes": None}
            if applied:
                try:
                    injection = inject_flaw(plan, flaw_type, method=method, severity=self.severity,
                                            seed=seed, position=position, matcher=self.matcher,
                                            hints=task_hints(task))
                except FlawNotApplicable:  # applicable_positions said yes: a disagreement, not a user error
                    raise RuntimeError(f"flaw {flaw_type}/{method} at {position} was marked applicable "
                                       "but could not be injected") from None
                self.plan = injection.workflow
                record["changes"] = injection.changes
            self.injections.append(record)
            self._injections_left -= 1
        if self._injections_left == 0:
            self.agent_selection = EXECUTOR

    def _executor_step(self, action) -> None:
        obs, _, terminated, truncated, info = self.planner.step(action)  # validates the action
        self._executor_obs = self._planner_part(obs)
        if not (terminated or truncated):
            return
        reward = 1.0 if info["level"] == "full_success" else 0.0
        self.rewards = {EXECUTOR: reward, ADVERSARY: 0.0 - reward}  # 0.0 - 0.0 is 0.0, not -0.0
        self.terminations = dict.fromkeys(self.agents, terminated)
        self.truncations = dict.fromkeys(self.agents, truncated)
        self._end_info = {k: info[k] for k in ("level", "evaluation", "end_reason")}

    def _planner_part(self, planner_obs: np.ndarray) -> np.ndarray:
        if self.hide_required:
            planner_obs = planner_obs.copy()
            planner_obs[self._hidden] = 0.0
        return planner_obs

    def _write_plan(self, out: np.ndarray, workflow: Workflow, episode: Episode) -> None:
        """The executor's plan rows (with done flags) and next-planned-tool one-hot of ``workflow``, written
        into ``out``."""
        rows, shown = _plan_rows(workflow, self.max_plan_length)
        n_tools = self._n_tools
        plan = out[:self._plan_size].reshape(rows.shape)
        plan[:] = rows
        for index, tool in shown:
            plan[index, n_tools + 2] = float(episode.succeeded[tool])
        call = _follower(workflow).next_call(episode)
        if call is not None:
            out[self._plan_size + call[0]] = 1.0

    @property
    def ended(self) -> bool:
        """Whether the game is over (both agents end together)."""
        return any(self.terminations.values()) or any(self.truncations.values())

    def _played(self) -> tuple[Task, Workflow, Episode]:
        """The game's task, the plan as it stands and the executor's episode; RuntimeError before reset()."""
        task, plan, episode = self.task, self.plan, self.planner.episode
        if task is None or plan is None or episode is None:
            raise RuntimeError("call reset() first")
        return task, plan, episode

    def _update_infos(self) -> None:
        task, _, episode = self._played()
        injections = tuple(dict(i) for i in self.injections)
        base = {"task_id": task.instance_id, "task_type": task.task_type, "injections": injections}
        self.infos = {
            ADVERSARY: dict(base),
            EXECUTOR: {**base, "trace": [r.to_dict() for r in episode.trace], **self._end_info},
        }
        self.infos = {agent: info for agent, info in self.infos.items() if agent in self.agents}


class AdversarialParallelEnv(ParallelEnv):
    """``adversarial_v1`` through PettingZoo's parallel API, natively (the AEC env's docstring documents
    the game). Both agents are live until the end and observe every step; only the agent on turn
    (``agent_on_turn``) has legal actions, and only its action is played (the other may be omitted)."""

    metadata = raw_env.metadata

    def __init__(self, **kwargs):
        self.game = raw_env(**kwargs)
        self.possible_agents = self.game.possible_agents[:]
        self.agents: list[str] = []
        self.render_mode = self.game.render_mode

    def observation_space(self, agent: str) -> spaces.Dict:
        return self.game.observation_space(agent)

    def action_space(self, agent: str) -> spaces.Discrete:
        return self.game.action_space(agent)

    @property
    def agent_on_turn(self) -> str | None:
        """The agent whose action the next step plays, or None after the end."""
        return self.game.agent_selection if self.agents else None

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        self.game.reset(seed=seed, options=options)
        self.agents = self.game.agents[:]
        return self._observations(), {a: dict(self.game.infos[a]) for a in self.agents}

    def step(self, actions: dict[str, Any]):
        if not self.agents:
            raise RuntimeError("the episode has ended (or reset() was not called); call reset()")
        agent = self.game.agent_selection
        if not isinstance(actions, dict) or agent not in actions:
            raise ValueError(f"actions must be a dict that includes the agent on turn, {agent!r}; got {actions!r}")
        self.game.step(actions[agent])
        game = self.game
        result = (self._observations(), {a: float(game.rewards[a]) for a in self.agents},
                  dict(game.terminations), dict(game.truncations), {a: dict(game.infos[a]) for a in self.agents})
        if game.ended:
            self.agents = []
        return result

    def render(self) -> str | None:
        return self.game.render()

    def close(self) -> None:
        self.game.close()

    def _observations(self) -> dict[str, dict[str, np.ndarray]]:
        return {a: self.game.observe(a) for a in self.agents}
