"""``ResiliBench-v1``: the planner MDP over the 30 simulated tools."""

from __future__ import annotations

__all__ = ["ResiliBenchEnv"]

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from resilibench.settings import settings_argument

from ...core.config import WorldConfig
from ...core.frontend import choose_task, discrete_action, front_end_world, select_tasks
from ...core.registry import ToolRegistry, default_registry
from ...core.rewards import REWARD_MODES, ShapedRewarder
from ...core.simulator import SUCCESS, EnvEpisodes, Episode
from ...core.tasks.library import SPLITS, Task
from ...core.world import DEFAULT_WORLD, World
from .observation import (
    N_STATUS,
    ObservationLayout,
    check_features,
    counter_tables,
    initial_observation,
    process_features,
)

if TYPE_CHECKING:  # real-API mode's client (and its HTTP stack) loads only when an api is given
    from ..real_api.live_apis import RealApi


class ResiliBenchEnv(gym.Env):
    """
    ## Description

    A planner chooses which of 30 simulated tools to call, one per turn, to complete a task from the
    ResiliBench library (5,040 generated tasks, five types). Tools fail the way APIs fail: a call succeeds
    with probability ``0.8 * 0.5**N_u * 0.7**N_f * 0.9**N_h`` (dependencies never called, dependencies
    called but never successful, failed calls so far); a failure carries an error code drawn from the
    tool's list (TIMEOUT, INVALID_INPUT, ...). The episode is graded by the shared evaluator as
    ``full_success``, ``partial_success`` or ``failure``.

    ## Action Space

    ``Discrete(31)``: action ``i < 30`` calls tool ``i`` (order of ``resilibench.core.registry``), action
    ``30`` is FINISH (the completion signal; it costs no turn). ``info["action_mask"]`` (int8) marks legal
    actions: a tool is legal while it has not succeeded, is under its call cap (1 + the task's
    ``max_retries``) and a turn is left; FINISH is always legal. A masked tool action is still executed
    under the shared episode rules (a succeeded tool returns its earlier result and costs the turn, a
    capped tool returns ``RETRY_LIMIT_EXCEEDED``); a tool action after the last turn ends the episode
    without completion (truncated). Actions outside ``[0, 31)`` raise ``ValueError``, as do actions that
    are not integers: floats (even 3.0), strings and booleans; Python and numpy integers are accepted.

    ## Observation Space

    ``Box(0, 1, (204,), float32)``: per-tool status one-hot (NOT_ATTEMPTED, SUCCESS, FAILED,
    DEPENDENCY_FAILED), required-tool mask, next-required one-hot, progress, step fraction, failed calls
    N_h / turn limit, consecutive failures / limit, and 20 task features. With failure processes on
    (``config.processes``), ``(265,)``: per tool the turns it stays rate-limited and whether its last call
    found it down, and the share of the time budget left follow. See ``resilibench.envs.planner.observation`` for
    the exact layout.

    ## Rewards

    ``reward="sparse"``: 1 when the episode ends in full success, else 0. ``reward="shaped"``: the paper's
    two-phase reward (D.3): coverage phase (attempt, novelty, required-tool success, progress and milestone
    increments) while the running success rate is below 0.3, then the sequence phase (order bonus or
    misplacement penalty, progress, efficiency), with error and repetition penalties and a terminal bonus.
    Weights live in ``resilibench.core.config.ShapedReward``.

    ## Starting State

    A task drawn uniformly from the pool (split and task types chosen at make) by the env's counter-based
    stream (``EnvEpisodes``; docs/core/stream.md), or the task named by
    ``reset(options={"task_id": ...})``; every tool NOT_ATTEMPTED.

    ## Episode End

    Terminated on FINISH, after ``max_consecutive_failures`` (5) consecutive failed calls, or when the same
    tool fails ``max_same_tool_failures`` (3) times in a row (both grade as failure). Truncated when a tool
    action is chosen after the turn limit (10 calls), or once the time budget of the failure processes is
    spent (end reason ``out_of_time``). ``info["level"]`` and ``info["evaluation"]`` are set
    at the end; ``info["trace"]`` always holds the calls so far as a list of dicts (tool, success,
    error_code, turn, probability, unmet_dependencies, replayed; duration and retry_after with failure
    processes on), as in the text env (the dicts are shared
    by the infos of one episode: copy one before changing it).

    ## Arguments

    ```python
    import gymnasium as gym
    import resilibench

    env = gym.make("ResiliBench-v1", split="test", task_types=["complex_network_integration"],
                   reward="shaped", rules={"strict_dependencies": False, "turn_limit": 10})
    obs, info = env.reset(seed=0, options={"task_id": "task_1a2b3c4d"})
    ```

    * ``split``: "train" (default), "validation", "test" or None for all tasks.
    * ``task_types``: a task type name or list of them (default: all five).
    * ``tasks``: an explicit list of ``Task`` objects instead of the shipped library.
    * ``reward``: "sparse" (default) or "shaped"; ``reward_phase``: "adaptive", "coverage", "sequence".
    * ``config``: a ``WorldConfig`` (default: the world's); ``rules``: episode rules changed on top of it
      (``turn_limit``, ``strict_dependencies``, ``profile``: "test" or "training"). ``world``: "v1" (the
      env id's) or a ``World`` (``resilibench.core.world``).
    * ``features``: "full" (default) or "no_dependency_hints": the observation without the next-required
      one-hot and the dependency task features (the ablation of docs/policies/ppo.md; see
      ``resilibench.envs.planner.observation``).
    * ``api``: real-API mode, a ``RealApi`` as in ``ResiliBenchText-v1``: where the simulator would draw,
      the tool is called over HTTP (our tool service, whose episode mirrors this one, or a client).

    ## Version History

    * v0: initial release (rules of docs/core/rules.md; any change to them bumps the version).
    * v1: world v1 (its task library and grading, docs/core/worlds.md); the default.
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init__(
        self,
        split: str | None = "train",
        task_types: Sequence[str] | str | None = None,
        tasks: Sequence[Task] | None = None,
        reward: str = "sparse",
        reward_phase: str = "adaptive",
        config: WorldConfig | None = None,
        rules: Mapping[str, Any] | None = None,
        registry: ToolRegistry | None = None,
        render_mode: str | None = None,
        world: str | World = DEFAULT_WORLD,
        features: str = "full",
        api: RealApi | None = None,
    ):
        if reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {reward!r}")
        self.features = check_features(features)
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.world = front_end_world(world, config, rules)
        self.config = self.world.config
        self.registry = registry or default_registry()
        self.tasks = select_tasks(tasks, split, task_types, self.world)
        self.reward_mode = reward
        self.rewarder = ShapedRewarder(self.config.reward, reward_phase)
        self.render_mode = render_mode
        self.n_tools = len(self.registry)
        self.finish_action = self.n_tools
        self._processes = self.config.processes.active
        self.layout = ObservationLayout(self.n_tools, self._processes)
        self.action_space = spaces.Discrete(self.n_tools + 1)
        self.observation_space = spaces.Box(0.0, 1.0, (self.layout.size,), np.float32)
        self.episode: Episode | None = None
        self._obs = np.zeros(self.layout.size, dtype=np.float32)
        self._shaped = reward == "shaped"
        self._initial_obs: dict[int, tuple[Task, np.ndarray]] = {}  # id(task) -> (task, first observation)
        self._finished_mask = _finished_mask(self.n_tools)
        self._counters = counter_tables(self.config.rules)
        self._episodes = EnvEpisodes()
        self._training = self.config.rules.profile == "training"
        self._action_hint = f"FINISH = {self.n_tools}"
        self._trace: list[dict] = []  # ``info["trace"]``: the episode's calls as dicts, one per record
        if api is not None:  # real-API mode (and its HTTP stack) loads only when an api is given
            from ..real_api.live_apis import RealApi

            api = settings_argument("api", api, RealApi)
        # Real-API mode: calls go over HTTP through this client (the text env's ``api``); None: simulated.
        self.client = None if api is None else api.client(self.registry)
        self._owns_client = api is None or self.client is not api.target
        self._call: Any = None  # the episode's call, or its HttpExecutor's in real-API mode

    # --- Gymnasium API -------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        task, seed_of_episode = choose_task(self.tasks, self._episodes, seed, options, self.world)
        # The running success rate matters to the training profile only (summing the window costs a reset
        # more than a microsecond).
        rate = self.rewarder.success_rate if self._training else 0.0
        self.episode = episode = Episode.start(task, seed_of_episode, self.config, self.registry,
                                               success_rate=rate)
        if self.client is None:
            self._call = episode.call
        else:
            from ..real_api.client import HttpExecutor

            self._call = HttpExecutor(self.client, episode).call
        self._trace = []
        self._obs = self._initial_observation(task)
        return self._obs.copy(), self._info(episode)

    def step(self, action):
        episode = self.episode
        if episode is None:
            raise RuntimeError("call reset() before step()")
        if episode.end_reason is not None:
            raise RuntimeError("episode has ended; call reset()")
        if action.__class__ is not int or not 0 <= action <= self.finish_action:  # else it is valid as it is
            action = discrete_action(action, self.n_tools + 1, hint=self._action_hint)
        reward, truncated = 0.0, False
        if action == self.finish_action:
            episode.finish()
        elif episode.turns_left == 0:
            episode.end_out_of_turns()
            truncated = True
        else:
            status_before, prefix = episode.status[action], episode.next_required
            if self._shaped:
                progress = episode.progress
                record = self._call(action)
                self._update_observation(episode, action, status_before, prefix)
                reward += self.rewarder.step_reward(episode, record, progress, prefix)
            else:
                self._call(action)
                self._update_observation(episode, action, status_before, prefix)
        evaluation = episode.evaluation
        if evaluation is not None:
            if self._shaped:
                reward += self.rewarder.terminal_reward(episode, evaluation)
            else:
                full = evaluation.level == "full_success"
                self.rewarder.recent.append(full)
                reward = 1.0 if full else 0.0
        if self.render_mode == "human":
            print(self.render_text())
        return self._obs.copy(), float(reward), evaluation is not None and not truncated, truncated, self._info(episode)

    def close(self):
        if self.client is not None and self._owns_client:
            self.client.close()
        super().close()

    def render(self):
        if self.render_mode == "ansi":
            return self.render_text()
        if self.render_mode == "human":
            print(self.render_text())
        return None

    # --- helpers -------------------------------------------------------------------------------------

    def render_text(self) -> str:
        """A readable summary of the episode so far."""
        ep = self.episode
        if ep is None:
            return "(not reset)"
        lines = [f"task {ep.task.instance_id} ({ep.task.task_type}); required: {', '.join(ep.task.required_tools)}"]
        for r in ep.trace:
            outcome = "ok" if r.success else r.error_code
            lines.append(f"  turn {r.turn}: {r.tool} -> {outcome}")
        if ep.evaluation is not None:
            lines.append(f"  end: {ep.end_reason}, level {ep.evaluation.level}")
        return "\n".join(lines)

    def _initial_observation(self, task: Task) -> np.ndarray:
        """A fresh copy of the first observation of ``task`` (computed once per task object)."""
        entry = self._initial_obs.get(id(task))
        if entry is None or entry[0] is not task:
            entry = (task, initial_observation(task, self.registry, self.layout, self.features))
            self._initial_obs[id(task)] = entry
        return entry[1].copy()

    def _update_observation(self, ep: Episode, tool: int, status_before: int,
                            next_required_before: int) -> None:
        """Update the observation after a call of ``tool``, given the tool's status and the episode's
        next-required index before the call (each one-hot block holds a single 1, so only the changed
        entries are written)."""
        obs, lay = self._obs, self.layout
        status = ep.status[tool]
        block = lay.status + N_STATUS * tool
        obs[block + status_before] = 0.0
        obs[block + status] = 1.0
        if status == SUCCESS and tool in ep.required_position:
            required = ep.required
            if self.features == "full":  # else the block holds the fixed required order
                if next_required_before < len(required):
                    obs[lay.next_required + required[next_required_before]] = 0.0
                if ep.next_required < len(required):
                    obs[lay.next_required + required[ep.next_required]] = 1.0
            obs[lay.progress] = ep.progress
        step, failures, consecutive = self._counters
        obs[lay.step] = step[ep.turns_used]
        obs[lay.failures] = failures[ep.n_failures]
        obs[lay.consecutive] = consecutive[ep.consecutive_failures]
        if self._processes:
            process_features(ep, lay, obs)

    def _info(self, ep: Episode) -> dict[str, Any]:
        trace, records = self._trace, ep.trace
        n = len(trace)
        if n < len(records):  # each record converted once, when it is new (one per step, unless driven directly)
            if n + 1 == len(records):
                trace.append(records[n].to_dict())
            else:
                trace.extend([r.to_dict() for r in records[n:]])
        task, evaluation = ep.task, ep.evaluation
        if evaluation is None:
            return {"action_mask": ep.action_mask.copy(), "trace": trace[:], "task_id": task.instance_id,
                    "task_type": task.task_type}
        return {"action_mask": self._finished_mask.copy(), "trace": trace[:], "task_id": task.instance_id,
                "task_type": task.task_type, "level": evaluation.level, "evaluation": evaluation,
                "end_reason": ep.end_reason}


def _finished_mask(n_tools: int) -> np.ndarray:
    """Mask after the end: only FINISH, so masked samplers always have a legal action."""
    mask = np.zeros(n_tools + 1, dtype=np.int8)
    mask[n_tools] = 1
    return mask
