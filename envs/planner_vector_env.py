"""``ResiliBench-v0`` natively batched: numpy over N episodes (``gymnasium.make_vec(..., "vector_entry_point")``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from resilibench.envs import rng as brng
from resilibench.envs.config import WorldConfig
from resilibench.envs.evaluator import FULL, LEVELS, grade, output_tool_ids
from resilibench.envs.observation import N_STATUS, ObservationLayout, initial_observation
from resilibench.envs.planner_env import make_world_config, select_tasks
from resilibench.envs.registry import ToolRegistry, default_registry
from resilibench.envs.rewards import PHASES, REWARD_MODES
from resilibench.envs.simulator import (
    CONSECUTIVE_FAILURES_CODE,
    DEPENDENCY_FAILED,
    END_REASONS,
    FAILED,
    FINISHED_CODE,
    OUT_OF_TURNS_CODE,
    REPETITION_LOOP_CODE,
    SUCCESS,
    episode_seed,
    success_probability,
    termination_code,
)
from resilibench.envs.tasks import SPLITS, Task, get_task

_U64 = np.uint64
_EPISODE_SEED_BOUND = 2**63 - 1  # episode_seed draws integers(2**63 - 1)


class ResiliBenchVectorEnv(gym.vector.VectorEnv):
    """
    ## Description

    ``ResiliBench-v0`` for N episodes at once, stepped with numpy over the batch (no Python loop over
    sub-envs). Sub-env ``i`` behaves exactly like a ``ResiliBenchEnv`` (see ``resilibench.envs.planner_env``)
    reset with seed ``seed + i``: the same task sampling, the same episode random stream, and step for step
    the same observations, rewards, terminations, truncations, action masks and final levels (a test
    checks this against N single envs). It applies the rule functions of ``resilibench.envs.simulator``
    (``success_probability``, ``termination_code``, ``episode_seed``) and the evaluator's ``grade``
    (coverage, level rule) to arrays; the random draws of each sub-env's generator (PCG64 via
    ``np.random.default_rng``/``SeedSequence``) are reproduced bit for bit by ``resilibench.envs.rng``,
    batched; rare cases (a rejected bounded-integer draw, a pinned task, or a failed self-check of
    ``resilibench.envs.rng``) run numpy's own Generator for the rows concerned.

    ```python
    import gymnasium as gym
    import resilibench

    envs = gym.make_vec("ResiliBench-v0", num_envs=1024, vectorization_mode="vector_entry_point")
    obs, info = envs.reset(seed=0)
    obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample())
    ```

    ## Action Space

    ``MultiDiscrete([31] * N)``: per sub-env, tool ``i < 30`` or ``30`` = FINISH, as in ``ResiliBench-v0``.
    Every action must lie in ``[0, 31)`` (``ValueError`` otherwise), including those of sub-envs that are
    being autoreset (their actions are ignored).

    ## Observation Space

    ``Box(0, 1, (N, 204), float32)``: row ``i`` is sub-env ``i``'s ``ResiliBench-v0`` observation (layout
    in ``resilibench.envs.observation``).

    ## Rewards

    ``reward="sparse"`` only: 1.0 when an episode ends in full success, else 0.0 (float64 array). The
    shaped reward and the ``training`` dynamics profile keep per-env running state and are served by
    ``gymnasium.make_vec("ResiliBench-v0", num_envs=N, vectorization_mode="sync", reward="shaped")``.

    ## Episode End

    As in ``ResiliBench-v0``: terminated on FINISH or a failure termination, truncated on a tool action
    after the turn limit. Autoreset follows Gymnasium's ``NEXT_STEP`` mode (``metadata["autoreset_mode"]``):
    the step after an episode ends resets that sub-env (its action is ignored) and returns the first
    observation of the new episode with reward 0, ``terminated = truncated = False``.

    ``info`` (arrays over sub-envs, with Gymnasium's ``_key`` masks):

    * ``action_mask``: (N, 31) int8, the single env's ``info["action_mask"]`` row by row (only FINISH after
      an episode's end);
    * ``task_index``: (N,) int64, the row of ``env.known_tasks`` each sub-env is playing;
    * ``level`` / ``_level``: (N,) int8 level codes, indices into ``resilibench.envs.evaluator.LEVELS``
      (0 failure, 1 partial_success, 2 full_success), set where an episode ended at this step (``_level``
      True) and -1 elsewhere;
    * ``end_reason`` / ``_end_reason``: (N,) int8 indices into ``resilibench.envs.simulator.END_REASONS``
      (1 finished, 2 out_of_turns, 3 consecutive_failures, 4 repetition_loop), 0 where none ended.

    The per-call trace (tool names, error codes) is not kept; use ``ResiliBench-v0`` for traces.

    ## Arguments

    * ``num_envs``: the batch size N.
    * ``split``, ``task_types``, ``tasks``, ``config``, ``turn_limit``, ``strict_dependencies``,
      ``registry``: as for ``ResiliBench-v0``.
    * ``reward``: "sparse" (the default; "shaped" raises ``ValueError``); ``profile``: "test" (the default;
      "training" raises ``ValueError``); ``reward_phase`` is accepted for symmetry and unused.
    * ``reset(seed=s)`` seeds sub-env ``i`` with ``s + i`` (or per sub-env from a list of N ints/None);
      ``reset(options={"task_id": id or [N ids/None]})`` pins tasks like the single env;
      ``options={"reset_mask": bool array}`` resets only the masked sub-envs.

    ## Version History

    * v0: initial release, the rules of ``ResiliBench-v0`` v0.
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        num_envs: int = 1,
        split: str | None = "train",
        task_types: Sequence[str] | str | None = None,
        tasks: Sequence[Task] | None = None,
        reward: str = "sparse",
        reward_phase: str = "adaptive",
        config: WorldConfig | None = None,
        turn_limit: int | None = None,
        strict_dependencies: bool | None = None,
        profile: str | None = None,
        registry: ToolRegistry | None = None,
        render_mode: str | None = None,
    ):
        if not isinstance(num_envs, int | np.integer) or isinstance(num_envs, bool) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        if reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {reward!r}")
        if reward != "sparse":
            raise ValueError(
                f"the batched ResiliBench-v0 supports reward='sparse' only, got {reward!r}; for the shaped reward "
                "use gymnasium.make_vec('ResiliBench-v0', num_envs=N, vectorization_mode='sync', reward='shaped')"
            )
        if reward_phase not in PHASES:
            raise ValueError(f"reward phase must be one of {PHASES}, got {reward_phase!r}")
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
        if render_mode is not None:
            raise ValueError(
                f"the batched ResiliBench-v0 does not render (render_mode={render_mode!r}); use "
                "vectorization_mode='sync' with render_mode='ansi'"
            )
        self.config = make_world_config(config, turn_limit, strict_dependencies, profile)
        rules = self.config.rules
        if rules.profile != "test":
            raise ValueError(
                f"the batched ResiliBench-v0 supports profile='test' only, got {rules.profile!r}; for the training "
                "profile use gymnasium.make_vec('ResiliBench-v0', num_envs=N, vectorization_mode='sync', "
                "profile='training')"
            )
        self.registry = registry or default_registry()
        self.tasks = select_tasks(tasks, split, task_types)
        self.known_tasks: list[Task] = list(self.tasks)  # the pool, then tasks pinned by id from elsewhere
        self.num_envs = int(num_envs)
        self.render_mode = None
        self.reward_mode = reward
        self.n_tools = n = len(self.registry)
        self.finish_action = n
        self.layout = ObservationLayout(n)
        self.single_action_space = spaces.Discrete(n + 1)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.single_observation_space = spaces.Box(0.0, 1.0, (self.layout.size,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

        self._turn_limit = rules.turn_limit
        self._strict = rules.strict_dependencies
        N, T = self.num_envs, self._turn_limit
        # Per-tool state, one uint8 per (sub-env, tool): calls so far, plus 64 once the tool has succeeded.
        # Columns: the n tools, then MET (a satisfied dependency; pads dependency lists) and NEVER (a tool
        # that never succeeds; pads required-tool lists).
        self._met, self._never, self._cols = n, n + 1, n + 2
        max_deps = max((len(d) for d in self.registry.dependency_ids), default=0)
        self._n_deps = max(max_deps, 1)
        self._dep_idx = np.full((n, self._n_deps), self._met, dtype=np.int64)
        for t, deps in enumerate(self.registry.dependency_ids):
            self._dep_idx[t, : len(deps)] = deps
        # The success formula over every (uncalled, failed, failed calls so far) it can meet, flattened.
        n_u, n_f, n_h = np.meshgrid(np.arange(self._n_deps + 1), np.arange(self._n_deps + 1), np.arange(T + 1),
                                    indexing="ij")
        fm = self.config.failure
        self._p_table = np.ascontiguousarray(
            success_probability(fm.base_success, n_u, n_f, n_h, fm), dtype=np.float64).reshape(-1)
        self._finished_mask = np.zeros(n + 1, dtype=np.int8)
        self._finished_mask[n] = 1
        self._build_task_tables(self.known_tasks)
        self._source = _EpisodeSource(self)

        # Batched state. Observation and mask buffers carry one extra row: a dump for masked scatters.
        rows = np.arange(N, dtype=np.int64)
        self._row_cols, self._row_tools = rows * self._cols, rows * n
        self._row_obs, self._row_mask = rows * self.layout.size, rows * (n + 1)
        self._dump_obs, self._dump_mask = N * self.layout.size, N * (n + 1)
        self._obs_buf = np.zeros((N + 1, self.layout.size), dtype=np.float32)
        self._mask_buf = np.zeros((N + 1, n + 1), dtype=np.int8)
        self._tc = np.zeros((N, self._cols), dtype=np.uint8)
        self._tc_init = np.zeros(self._cols, dtype=np.uint8)
        self._tc_init[self._met] = 64 + 1
        self._status = np.zeros((N, n), dtype=np.int64)
        # Integer counters as rows of one matrix, so a reset clears them in one operation.
        self._ints = np.zeros((_N_INTS, N), dtype=np.int64)
        self._ints_init = np.zeros((_N_INTS, 1), dtype=np.int64)
        self._ints_init[_LAST_TOOL] = self._ints_init[_LAST_POS] = -1
        (self._task, self._turns, self._n_failures, self._consecutive, self._last_tool, self._streak,
         self._next_req, self._covered, self._last_pos) = self._ints
        self._order_broken = np.zeros(N, dtype=bool)
        self._output_done = np.zeros(N, dtype=bool)
        self._autoreset = np.zeros(N, dtype=bool)
        # Episode streams: ``_g`` is the generator state whose output is the next success draw ``_u``;
        # ``_gc`` = inc * (mult + 1), so two steps are state * mult**2 + _gc.
        self._g_hi, self._g_lo, self._gc_hi, self._gc_lo = (np.zeros(N, dtype=_U64) for _ in range(4))
        self._u = np.zeros(N, dtype=np.float64)
        self._mult2 = brng.jump(2)[0]
        self._started = False

    # --- construction ----------------------------------------------------------------------------------

    def _build_task_tables(self, tasks: Sequence[Task]) -> None:
        """Per-task arrays, built once: required ids, positions, outputs, limits, first observations."""
        n, reg, lay = self.n_tools, self.registry, self.layout
        required = [task.required_ids(reg) for task in tasks]
        width = max((len(r) for r in required), default=0) + 1  # always one padding column
        k = len(tasks)
        self._req = np.full((k, width), self._never, dtype=np.int64)
        req_pos = np.full((k, n), -1, dtype=np.int64)
        out_mask = np.zeros((k, n), dtype=bool)
        self._n_req = np.zeros(k, dtype=np.int64)
        self._has_outputs = np.zeros(k, dtype=bool)
        self._max_calls = np.zeros(k, dtype=np.int64)
        self._min_cov = np.zeros(k, dtype=np.float64)
        self._init_obs = np.zeros((k, lay.size), dtype=np.float32)
        coverage = self.config.evaluator.min_coverage
        for i, (task, req) in enumerate(zip(tasks, required, strict=True)):
            self._req[i, : len(req)] = req
            req_pos[i, list(req)] = np.arange(len(req))
            outputs = output_tool_ids(req, reg)
            out_mask[i, list(outputs)] = True
            self._has_outputs[i] = bool(outputs)
            self._n_req[i] = len(req)
            self._max_calls[i] = 1 + task.max_retries
            if not 1 <= self._max_calls[i] <= 63:
                raise ValueError(f"task {task.instance_id!r}: the batched env needs 0 <= max_retries <= 62, got "
                                 f"{task.max_retries}; use vectorization_mode='sync'")
            if task.task_type not in coverage:
                raise ValueError(f"no min_coverage for task type {task.task_type!r}; configured: {sorted(coverage)}")
            self._min_cov[i] = coverage[task.task_type]
            self._init_obs[i] = initial_observation(task, reg, lay)
        self._req_pos, self._out_mask = req_pos.reshape(-1), out_mask.reshape(-1)
        # Observation offsets of "next required = position j" (-1 past the last required tool).
        self._next_obs = np.where(np.arange(width) < self._n_req[:, None], lay.next_required + self._req, -1)
        self._task_row_of = {id(t): i for i, t in enumerate(tasks)}

    def _task_row(self, task: Task) -> int:
        """Row of ``task`` in the task tables, adding it (after the pool) when it is new."""
        row = self._task_row_of.get(id(task))
        if row is None or self.known_tasks[row] is not task:
            self.known_tasks.append(task)
            self._build_task_tables(self.known_tasks)
            row = len(self.known_tasks) - 1
        return row

    # --- Gymnasium API ---------------------------------------------------------------------------------

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        N = self.num_envs
        options = dict(options or {})
        reset_mask = options.pop("reset_mask", None)
        task_id = options.pop("task_id", None)
        if options:
            raise ValueError(f"unknown reset option(s) {sorted(options)}; accepted: ['reset_mask', 'task_id']")
        if reset_mask is None:
            rows = np.arange(N)
        else:
            if not isinstance(reset_mask, np.ndarray) or reset_mask.dtype != np.bool_ or reset_mask.shape != (N,):
                raise ValueError(f"options['reset_mask'] must be a bool numpy array of shape ({N},), got {reset_mask!r}")
            if not reset_mask.any():
                raise ValueError("options['reset_mask'] must contain at least one True value")
            rows = np.flatnonzero(reset_mask)
        if seed is None:
            seeds: list[int | None] = [None] * N
        elif isinstance(seed, int | np.integer) and not isinstance(seed, bool):
            seeds = [int(seed) + i for i in range(N)]
        else:
            seeds = list(seed)
            if len(seeds) != N:
                raise ValueError(f"a list of seeds must have num_envs={N} entries, got {len(seeds)}")
        for s in seeds:
            if s is not None and not (isinstance(s, int | np.integer) and not isinstance(s, bool) and s >= 0):
                raise ValueError(f"seeds must be non-negative integers or None, got {s!r}")
        pinned = self._pinned_rows(task_id, rows)
        self._source.seed(rows, [seeds[i] for i in rows.tolist()])
        self._start_episodes(rows, pinned)
        self._autoreset[rows] = False
        self._started = True
        return self._obs_buf[:N].copy(), self._info_arrays()

    def step(self, actions):
        if not self._started:
            raise RuntimeError("call reset() before step()")
        N, n, T, lay = self.num_envs, self.n_tools, self._turn_limit, self.layout
        a = np.asarray(actions)
        if a.shape != (N,) or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"actions must be an integer array of shape ({N},), got {a.dtype} {a.shape}")
        if a.min() < 0 or a.max() > n:
            raise ValueError(f"actions must be in [0, {n}] (FINISH = {n}), got {a[(a < 0) | (a > n)][:5]}")
        a = a.astype(np.int64, copy=False)
        autoreset = self._autoreset
        if autoreset.any():
            self._start_episodes(np.flatnonzero(autoreset), {})
        acting = ~autoreset
        finish = acting & (a == n)
        tool_action = acting ^ finish
        out_of_turns = tool_action & (self._turns >= T)
        call = tool_action ^ out_of_turns
        # Finish rows read tool n - 1: every write below leaves rows without a call unchanged.
        at = np.minimum(a, n - 1)
        task = self._task
        tc_flat, obs_flat, mask_flat = self._tc.reshape(-1), self._obs_buf.reshape(-1), self._mask_buf.reshape(-1)

        cell = self._row_cols + at
        tc = tc_flat[cell]
        replay = tc >= 64
        calls_before = tc & 63
        max_calls = self._max_calls[task]
        live = call & ~replay & (calls_before < max_calls)  # not replayed, not over the call cap
        dep = tc_flat[self._row_cols[:, None] + self._dep_idx[at]]
        n_uncalled = (dep == 0).sum(axis=1)
        n_met = (dep >= 64).sum(axis=1)
        unmet = n_met < self._n_deps
        if self._strict:
            strict_fail = live & unmet
            draw = live ^ strict_fail
            booked = live
        else:
            strict_fail = None
            draw = booked = live
        p = self._p_table[((n_uncalled * (self._n_deps + 1)) + (self._n_deps - n_uncalled - n_met)) * (T + 1)
                          + self._n_failures]
        success = draw & (self._u < p)
        self._advance_streams(draw)
        tc_flat[cell] = tc + booked + success * 64
        changed = call & ~replay
        failed = changed ^ success
        dependency_problem = (draw & unmet) if strict_fail is None else (strict_fail | (draw & unmet))

        status_cell = self._row_tools + at
        old_status = self._status.reshape(-1)[status_cell]
        status = np.where(changed, success * SUCCESS + failed * (FAILED + dependency_problem * (DEPENDENCY_FAILED - FAILED)),
                          old_status)
        self._status.reshape(-1)[status_cell] = status
        block = self._row_obs + (lay.status + N_STATUS * at)
        obs_flat[block + old_status] = 0.0
        obs_flat[block + status] = 1.0
        mask_off = success | (failed & (calls_before + booked >= max_calls))
        mask_flat[np.where(mask_off, self._row_mask + at, self._dump_mask)] = 0

        self._turns += call
        limit = call & (self._turns == T)
        if limit.any():
            self._mask_buf[:N][limit, :n] = 0
        self._n_failures += failed
        consecutive = (self._consecutive + failed) * ~success
        self._consecutive[:] = consecutive
        streak = np.where(changed, failed * (1 + (at == self._last_tool) * self._streak), self._streak)
        self._streak[:] = streak
        self._last_tool[:] = np.where(changed, at, self._last_tool)
        end_code = termination_code(consecutive, streak, self.config.rules) * failed

        task_cell = task * n + at
        self._output_done |= success & self._out_mask[task_cell]
        pos = self._req_pos[task_cell]
        hit = success & (pos >= 0)
        if hit.any():
            self._required_success(np.flatnonzero(hit), pos)
        obs = self._obs_buf
        obs[:N, lay.step] = self._turns / T
        obs[:N, lay.failures] = np.minimum(self._n_failures / T, 1.0)
        obs[:N, lay.consecutive] = np.minimum(consecutive / self.config.rules.max_consecutive_failures, 1.0)

        ended = finish | out_of_turns | (end_code > 0)
        end_code = (end_code + finish * FINISHED_CODE + out_of_turns * OUT_OF_TURNS_CODE).astype(np.int8)
        reward = np.zeros(N, dtype=np.float64)
        level = np.full(N, -1, dtype=np.int8)
        if ended.any():
            rows = np.flatnonzero(ended)
            codes = self._grade(rows, finish[rows], end_code[rows])
            level[rows] = codes
            reward[rows] = codes == FULL
            self._mask_buf[rows] = self._finished_mask
        self._autoreset = ended
        info = self._info_arrays()
        info["level"], info["_level"] = level, ended.copy()
        info["end_reason"], info["_end_reason"] = end_code, ended.copy()
        return obs[:N].copy(), reward, ended ^ out_of_turns, out_of_turns, info

    def close_extras(self, **kwargs: Any) -> None:
        pass

    # --- pieces of a step ------------------------------------------------------------------------------

    def _advance_streams(self, draw: np.ndarray) -> None:
        """Move the episode streams of the rows that drew to their next success draw (two outputs on: the
        error-code draw is not needed without a trace)."""
        hi, lo = brng.mul128(self._g_hi, self._g_lo, self._mult2)
        hi, lo = brng.add128(hi, lo, self._gc_hi, self._gc_lo)
        self._u = np.where(draw, brng.to_double(brng.output(hi, lo)), self._u)
        self._g_hi = np.where(draw, hi, self._g_hi)
        self._g_lo = np.where(draw, lo, self._g_lo)

    def _required_success(self, rows: np.ndarray, pos: np.ndarray) -> None:
        """Book first successes of required tools in ``rows``: coverage, order, next-required, progress."""
        lay = self.layout
        pos = pos[rows]
        task = self._task[rows]
        obs_flat = self._obs_buf.reshape(-1)
        self._order_broken[rows] |= pos < self._last_pos[rows]
        self._last_pos[rows] = pos
        covered = self._covered[rows] + 1
        self._covered[rows] = covered
        req = self._req[task]
        old_next = self._next_req[rows]
        done = self._tc.reshape(-1)[self._row_cols[rows][:, None] + req] >= 64
        new_next = np.argmin(done, axis=1)  # first required tool not yet done (padding never is)
        self._next_req[rows] = new_next
        base = self._row_obs[rows]
        old_obs = self._next_obs[task, old_next]
        obs_flat[np.where(old_obs >= 0, base + old_obs, self._dump_obs)] = 0.0
        new_obs = self._next_obs[task, new_next]
        obs_flat[np.where(new_obs >= 0, base + new_obs, self._dump_obs)] = 1.0
        n_req = self._n_req[task]
        empty = n_req == 0
        obs_flat[base + lay.progress] = (covered + empty) / (n_req + empty)

    def _grade(self, rows: np.ndarray, completed: np.ndarray, end_code: np.ndarray) -> np.ndarray:
        """Level codes of the episodes ending in ``rows`` (the evaluator's ``grade`` on counters)."""
        task = self._task[rows]
        covered = self._covered[rows]
        sequence = (covered > 0) & ~self._order_broken[rows]
        output = self._output_done[rows] | ~self._has_outputs[task]
        failed_termination = (end_code == CONSECUTIVE_FAILURES_CODE) | (end_code == REPETITION_LOOP_CODE)
        _, _, code = grade(covered, self._n_req[task], sequence, output, completed, failed_termination,
                           self._min_cov[task], self.config.evaluator.partial_conditions_needed)
        return np.asarray(code, dtype=np.int8)

    def _info_arrays(self) -> dict[str, Any]:
        N = self.num_envs
        everywhere = np.ones(N, dtype=bool)
        return {
            "action_mask": self._mask_buf[:N].copy(),
            "_action_mask": everywhere,
            "task_index": self._task.copy(),
            "_task_index": everywhere.copy(),
        }

    # --- episodes --------------------------------------------------------------------------------------

    def _pinned_rows(self, task_id, rows: np.ndarray) -> dict[int, int]:
        """{row: task-table row} for ``options['task_id']`` (one id for all rows, or one per sub-env)."""
        if task_id is None:
            return {}
        if isinstance(task_id, str):
            ids = [task_id] * self.num_envs
        else:
            ids = list(task_id)
            if len(ids) != self.num_envs:
                raise ValueError(f"options['task_id'] must be one id or num_envs={self.num_envs} ids/None")
        pinned = {}
        for r in rows.tolist():
            if ids[r] is not None:
                pinned[r] = self._task_row(self._task_by_id(ids[r]))
        return pinned

    def _task_by_id(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.instance_id == task_id:
                return task
        return get_task(task_id)

    def _start_episodes(self, rows: np.ndarray, pinned: dict[int, int]) -> None:
        """Begin new episodes in ``rows``: next task and stream from each row's generator, state cleared."""
        task, g_hi, g_lo, gc_hi, gc_lo, u = self._source.take(rows, pinned)
        self._ints[:, rows] = self._ints_init
        self._task[rows] = task
        self._g_hi[rows], self._g_lo[rows], self._gc_hi[rows], self._gc_lo[rows], self._u[rows] = (
            g_hi, g_lo, gc_hi, gc_lo, u)
        self._tc[rows] = self._tc_init
        self._status[rows] = 0
        self._order_broken[rows] = False
        self._output_done[rows] = False
        self._mask_buf[rows] = 1
        self._obs_buf[rows] = self._init_obs[task]

    # --- helpers ---------------------------------------------------------------------------------------

    def generator(self, i: int) -> np.random.Generator:
        """A copy of sub-env ``i``'s ``np_random`` as a numpy Generator (the state the next reset draws from)."""
        return self._source.generator(i)

    @staticmethod
    def level_names(codes: np.ndarray) -> np.ndarray:
        """Level names ("failure", "partial_success", "full_success"; None for -1) of level codes."""
        return np.array([*LEVELS, None], dtype=object)[np.asarray(codes, dtype=np.int64)]

    @staticmethod
    def end_reason_names(codes: np.ndarray) -> np.ndarray:
        """End reasons (None for 0) of end-reason codes."""
        return np.array(END_REASONS, dtype=object)[np.asarray(codes, dtype=np.int64)]


# Rows of the integer counter matrix.
(_TASK, _TURNS, _N_FAILURES, _CONSECUTIVE, _LAST_TOOL, _STREAK, _NEXT_REQ, _COVERED, _LAST_POS) = range(9)
_N_INTS = 9


class _EpisodeSource:
    """Each sub-env's ``np_random`` and the episodes it yields, batched.

    Sub-env ``i`` owns a PCG64 generator, exactly as ``ResiliBenchEnv.np_random``. A new episode draws from
    it in the single env's order: ``integers(len(tasks))`` (unless the task is pinned), then
    ``episode_seed``; the episode's stream is ``default_rng(episode seed)``. Those draws are computed ahead
    for ``capacity`` episodes per sub-env at once (large numpy batches; ``resilibench.envs.rng``), and the
    generator state before each queued episode is kept, so reseeding or pinning a sub-env simply recomputes
    the queue from its current state. Rows where numpy's bounded-integer sampler would reject a draw (about
    one in a million draws), pinned tasks, and every row when ``rng.checked()`` is False go through numpy's
    own Generator instead.
    """

    def __init__(self, env: ResiliBenchVectorEnv):
        self.env = env
        N = env.num_envs
        self.capacity = M = int(min(64, max(8, 65536 // N)))
        self.inc_hi, self.inc_lo = np.zeros(N, dtype=_U64), np.zeros(N, dtype=_U64)
        # Generator state before queued episode e (column M: after the last one).
        self.r_hi, self.r_lo = np.zeros((N, M + 1), dtype=_U64), np.zeros((N, M + 1), dtype=_U64)
        self.r_has32, self.r_u32 = np.zeros((N, M + 1), dtype=bool), np.zeros((N, M + 1), dtype=_U64)
        self.task = np.zeros((N, M), dtype=np.int64)
        self.g_hi, self.g_lo, self.gc_hi, self.gc_lo = (np.zeros((N, M), dtype=_U64) for _ in range(4))
        self.u = np.zeros((N, M), dtype=np.float64)
        self.cursor = np.zeros(N, dtype=np.int64)
        self.seeded = np.zeros(N, dtype=bool)
        self.dirty = True
        self.gc_factor = brng.jump(2)[1]

    # --- generator states ---

    def seed(self, rows: np.ndarray, seeds: list[int | None]) -> None:
        """``np_random = default_rng(seed)`` for rows with a seed (as ``gymnasium.Env.reset(seed=...)``);
        rows without one keep their generator, or get one from OS entropy when they have none yet."""
        fast, slow = [], []
        for r, s in zip(rows.tolist(), seeds, strict=True):
            if s is None:
                if not self.seeded[r]:
                    slow.append((r, np.random.default_rng()))
            elif brng.checked() and int(s) < 2**64:
                fast.append((r, int(s)))
            else:
                slow.append((r, np.random.default_rng(int(s))))
        if fast:
            r = np.array([x[0] for x in fast], dtype=np.int64)
            hi, lo, inc_hi, inc_lo = brng.seed_states(np.array([x[1] for x in fast], dtype=_U64))
            self._set_rows(r, hi, lo, inc_hi, inc_lo, np.zeros(r.size, dtype=bool), np.zeros(r.size, dtype=_U64))
        for r, gen in slow:
            self._set_generator(r, gen)

    def _set_rows(self, r, hi, lo, inc_hi, inc_lo, has32, u32) -> None:
        """Set the current generator state of rows ``r`` (the queue is recomputed before the next use)."""
        self.cursor[r] = 0
        self.r_hi[r, 0], self.r_lo[r, 0], self.r_has32[r, 0], self.r_u32[r, 0] = hi, lo, has32, u32
        self.inc_hi[r], self.inc_lo[r] = inc_hi, inc_lo
        self.seeded[r] = True
        self.dirty = True

    def _set_generator(self, row: int, gen: np.random.Generator) -> None:
        state, inc, has32, u32 = brng.generator_state(gen)
        r = np.array([row])
        self._set_rows(r, _U64(state >> 64), _U64(state & brng.M64), _U64(inc >> 64), _U64(inc & brng.M64),
                       bool(has32), _U64(u32))

    def generator(self, row: int) -> np.random.Generator:
        """A numpy Generator in ``row``'s current state."""
        c = int(self.cursor[row])
        state = int(self.r_hi[row, c]) << 64 | int(self.r_lo[row, c])
        inc = int(self.inc_hi[row]) << 64 | int(self.inc_lo[row])
        return brng.generator_from_state(state, inc, int(self.r_has32[row, c]), int(self.r_u32[row, c]))

    # --- episodes ---

    def take(self, rows: np.ndarray, pinned: dict[int, int]):
        """(task row, stream state, stream increment factor, first draw) of the next episode of each row."""
        if pinned:
            self._pin(pinned)
        free = rows if not pinned else rows[[r not in pinned for r in rows.tolist()]]
        if self.dirty or (free.size and self.cursor[free].max() >= self.capacity):
            self._refill()
        slot = self.cursor[rows]
        self.cursor[free] += 1
        flat = rows * self.capacity + slot
        out = [self.task.reshape(-1)[flat]] + [a.reshape(-1)[flat] for a in (self.g_hi, self.g_lo, self.gc_hi,
                                                                              self.gc_lo, self.u)]
        if pinned:  # pinned rows: their episode was put in the current slot by _pin (not consumed here)
            for i, r in enumerate(rows.tolist()):
                if r in pinned:
                    out[0][i] = pinned[r]
                    for k, arr in enumerate((self.pin_g_hi, self.pin_g_lo, self.pin_gc_hi, self.pin_gc_lo,
                                             self.pin_u), start=1):
                        out[k][i] = arr[r]
        return out

    def _pin(self, pinned: dict[int, int]) -> None:
        """Pinned task: the single env draws only ``episode_seed`` (numpy's Generator, row by row)."""
        N = self.env.num_envs
        self.pin_g_hi, self.pin_g_lo, self.pin_gc_hi, self.pin_gc_lo = (np.zeros(N, dtype=_U64) for _ in range(4))
        self.pin_u = np.zeros(N, dtype=np.float64)
        rows = np.array(sorted(pinned), dtype=np.int64)
        seeds = []
        for r in rows.tolist():
            gen = self.generator(r)
            seeds.append(episode_seed(gen))
            self._set_generator(r, gen)
        g_hi, g_lo, gc_hi, gc_lo, u = self._streams(np.array(seeds, dtype=_U64))
        self.pin_g_hi[rows], self.pin_g_lo[rows], self.pin_gc_hi[rows], self.pin_gc_lo[rows] = g_hi, g_lo, gc_hi, gc_lo
        self.pin_u[rows] = u

    def _refill(self) -> None:
        """Recompute ``capacity`` queued episodes for every row from its current generator state."""
        env, M = self.env, self.capacity
        N, n_pool = env.num_envs, len(env.tasks)
        r = np.arange(N)
        c = self.cursor
        hi, lo, has32, u32 = self.r_hi[r, c], self.r_lo[r, c], self.r_has32[r, c], self.r_u32[r, c]
        inc_hi, inc_lo = self.inc_hi, self.inc_lo
        seeds = np.zeros((N, M), dtype=_U64)
        rejected = np.zeros(N, dtype=bool)
        for e in range(M):
            self.r_hi[:, e], self.r_lo[:, e], self.r_has32[:, e], self.r_u32[:, e] = hi, lo, has32, u32
            if n_pool >= 2:  # 32-bit bounded draw: the buffered high half, else the low half of a new output
                s_hi, s_lo = brng.advance(hi, lo, inc_hi, inc_lo)
                out = brng.output(s_hi, s_lo)
                need = ~has32
                value = np.where(need, out & _U64(brng.M32), u32)
                u32 = np.where(need, out >> _U64(32), u32)
                hi, lo, has32 = np.where(need, s_hi, hi), np.where(need, s_lo, lo), need
                self.task[:, e], rejected_task = brng.bounded_uint32(value, n_pool)
                rejected |= rejected_task
            else:
                self.task[:, e] = 0
            hi, lo = brng.advance(hi, lo, inc_hi, inc_lo)
            seeds[:, e], rejected_seed = brng.bounded_uint64(brng.output(hi, lo), _EPISODE_SEED_BOUND)
            rejected |= rejected_seed
        self.r_hi[:, M], self.r_lo[:, M], self.r_has32[:, M], self.r_u32[:, M] = hi, lo, has32, u32
        self.cursor[:] = 0
        slow = np.flatnonzero(rejected) if brng.checked() else r
        for row in slow.tolist():  # numpy's own Generator, episode by episode
            gen = brng.generator_from_state(int(self.r_hi[row, 0]) << 64 | int(self.r_lo[row, 0]),
                                            int(inc_hi[row]) << 64 | int(inc_lo[row]),
                                            int(self.r_has32[row, 0]), int(self.r_u32[row, 0]))
            for e in range(M + 1):
                state, _, h, u = brng.generator_state(gen)
                self.r_hi[row, e], self.r_lo[row, e] = state >> 64, state & brng.M64
                self.r_has32[row, e], self.r_u32[row, e] = bool(h), u
                if e < M:
                    self.task[row, e] = int(gen.integers(n_pool))
                    seeds[row, e] = episode_seed(gen)
        streams = self._streams(seeds.reshape(-1))
        for dst, src in zip((self.g_hi, self.g_lo, self.gc_hi, self.gc_lo, self.u), streams, strict=True):
            dst[:] = src.reshape(N, M)
        self.dirty = False

    def _streams(self, seeds: np.ndarray):
        """For episode seeds: the stream generator state of the first success draw, inc * (mult + 1), and
        the first draw (``draw_stream(default_rng(seed), T)[0, 0]``)."""
        if brng.checked():
            s_hi, s_lo, inc_hi, inc_lo = brng.seed_states(seeds)
        else:
            states = [brng.generator_state(np.random.default_rng(int(s))) for s in seeds.tolist()]
            s_hi = np.array([st[0] >> 64 for st in states], dtype=_U64)
            s_lo = np.array([st[0] & brng.M64 for st in states], dtype=_U64)
            inc_hi = np.array([st[1] >> 64 for st in states], dtype=_U64)
            inc_lo = np.array([st[1] & brng.M64 for st in states], dtype=_U64)
        g_hi, g_lo = brng.advance(s_hi, s_lo, inc_hi, inc_lo)
        gc_hi, gc_lo = brng.mul128(inc_hi, inc_lo, self.gc_factor)
        return g_hi, g_lo, gc_hi, gc_lo, brng.to_double(brng.output(g_hi, g_lo))
