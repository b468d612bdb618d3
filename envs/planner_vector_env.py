"""``ResiliBench-v0`` natively batched: numpy over N episodes (``gymnasium.make_vec(..., "vector_entry_point")``)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from resilibench.envs import stream as rs
from resilibench.envs.config import WorldConfig
from resilibench.envs.evaluator import FULL, LEVELS, grade, output_tool_ids
from resilibench.envs.observation import (
    N_STATUS,
    ObservationLayout,
    check_features,
    counter_tables,
    initial_observation,
)
from resilibench.envs.planner_env import make_world_config, select_tasks, task_by_id
from resilibench.envs.registry import ToolRegistry, default_registry
from resilibench.envs.rewards import PHASES, REWARD_MODES
from resilibench.envs.simulator import (
    CONSECUTIVE_FAILURES_CODE,
    DEPENDENCY_FAILED,
    END_REASONS,
    FAILED,
    FINISHED_CODE,
    NOT_ATTEMPTED,
    OUT_OF_TURNS_CODE,
    SUCCESS,
    success_probability,
    termination_code,
)
from resilibench.envs.tasks import DEFAULT_WORLD, SPLITS, Task


class ResiliBenchVectorEnv(gym.vector.VectorEnv):
    """
    ## Description

    ``ResiliBench-v0`` for N episodes at once, stepped with numpy over the batch (no Python loop over
    sub-envs). Sub-env ``i`` behaves exactly like a ``ResiliBenchEnv`` (see ``resilibench.envs.planner_env``)
    reset with seed ``seed + i``: the same task sampling, the same episode random stream, and step for step
    the same observations, rewards, terminations, truncations, action masks and final levels (a test
    checks this against N single envs). No rule is written twice: at construction the env evaluates the
    rule functions on arrays of every input an episode can reach, ``success_probability`` and
    ``termination_code`` (``resilibench.envs.simulator``), ``grade`` (``resilibench.envs.evaluator``) and
    ``counter_tables`` (``resilibench.envs.observation``), and a step looks the results up. Randomness is
    the counter-based stream of ``resilibench.envs.stream``, computed on arrays: sub-env ``i`` keeps its
    env seed's key and episode number, draws each new episode's task and seed as ``EnvEpisodes`` does, and
    a step computes each drawing sub-env's success draw from (episode seed, draw index). Throughput: see
    ``docs/benchmarks.md``.

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
      ``registry``, ``features``: as for ``ResiliBench-v0``.
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
        world: str = DEFAULT_WORLD,
        features: str = "full",
    ):
        self.features = check_features(features)
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
        self.world = world
        self.config = make_world_config(config, turn_limit, strict_dependencies, profile, world)
        rules = self.config.rules
        if rules.profile != "test":
            raise ValueError(
                f"the batched ResiliBench-v0 supports profile='test' only, got {rules.profile!r}; for the training "
                "profile use gymnasium.make_vec('ResiliBench-v0', num_envs=N, vectorization_mode='sync', "
                "profile='training')"
            )
        self.registry = registry or default_registry()
        self.tasks = select_tasks(tasks, split, task_types, world)
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
        # Per (sub-env, tool) one uint8: calls so far (bits 0-5), succeeded (64), last failure was a
        # dependency problem (128). Columns: the n tools, then MET, a satisfied dependency that pads the
        # dependency lists.
        self._met, self._cols = n, n + 1
        self._tc_init = np.zeros(self._cols, dtype=np.uint8)
        self._tc_init[self._met] = _SUCCEEDED + 1
        codes = np.arange(256)
        calls_of, succeeded_of = codes & _CALLS, (codes & _SUCCEEDED) > 0
        # Observation status of a code, and the kind of a dependency (0 uncalled, 1 failed so far, 2 met).
        self._status_of = np.where(succeeded_of, SUCCESS, np.where(
            calls_of == 0, NOT_ATTEMPTED, np.where(codes & _DEPENDENCY_PROBLEM, DEPENDENCY_FAILED, FAILED)))
        kind = np.where(succeeded_of, 2, np.where(calls_of > 0, 1, 0))
        deps = self.registry.dependency_ids
        self._n_deps = max(max((len(d) for d in deps), default=0), 1)
        dep_idx = np.full((n, self._n_deps), self._met, dtype=np.int64)
        for t, d in enumerate(deps):
            dep_idx[t, : len(d)] = d
        self._dep_cols = [np.ascontiguousarray(dep_idx[:, j]) for j in range(self._n_deps)]
        # The success formula over every (kinds of the dependencies, failed calls so far) it can meet:
        # index = sum_j kind_j * 3**j * (T + 1) + N_h, read through ``_kind_index[j][code]``.
        self._kind_index = [(kind * 3**j * (T + 1)).astype(np.int64) for j in range(self._n_deps)]
        combos = np.array(np.meshgrid(*[np.arange(3)] * self._n_deps, indexing="ij")).reshape(self._n_deps, -1)
        combo = (combos * (3 ** np.arange(self._n_deps))[:, None]).sum(axis=0)
        order = np.argsort(combo)
        n_uncalled = (combos == 0).sum(axis=0)[order]
        n_failed = (combos == 1).sum(axis=0)[order]
        fm = self.config.failure
        history = np.arange(T + 1)
        self._p_table = np.ascontiguousarray(success_probability(
            fm.base_success, np.repeat(n_uncalled, T + 1), np.repeat(n_failed, T + 1),
            np.tile(history, len(order)), fm), dtype=np.float64)
        self._unmet_table = np.repeat(n_uncalled + n_failed > 0, T + 1)
        # Failure termination and the observation's counters for every count an episode can reach.
        counts = np.arange(T + 1)
        consecutive, streak = np.meshgrid(counts, counts, indexing="ij")
        self._end_table = np.asarray(termination_code(consecutive, streak, rules), dtype=np.int64).reshape(-1)
        self._step_table, self._failures_table, self._consecutive_table = (
            np.asarray(x, dtype=np.float64) for x in counter_tables(rules))
        self._finished_mask = np.zeros(n + 1, dtype=np.int8)
        self._finished_mask[n] = 1
        self._build_task_tables(self.known_tasks)
        # The stream: key of each sub-env's env seed, number of its next episode, key of its episode seed;
        # ``_draw_offset[d]`` turns the episode key into the input of draw 2d (the d-th success draw).
        self._env_key = np.zeros(N, dtype=np.uint64)
        self._episode_no = np.zeros(N, dtype=np.int64)
        self._seeded = np.zeros(N, dtype=bool)
        self._episode_key = np.zeros(N, dtype=np.uint64)
        self._draw_offset = rs.offsets(2 * np.arange(T + 1))

        # Batched state. The observation and mask buffers carry one extra row: a dump for masked scatters.
        rows = np.arange(N, dtype=np.int64)
        self._row_cols, self._row_obs, self._row_mask = rows * self._cols, rows * self.layout.size, rows * (n + 1)
        self._dump_obs, self._dump_mask = N * self.layout.size, N * (n + 1)
        self._obs_buf = np.zeros((N + 1, self.layout.size), dtype=np.float32)
        self._mask_buf = np.zeros((N + 1, n + 1), dtype=np.int8)
        self._tc = np.zeros((N, self._cols), dtype=np.uint8)
        # Integer state as rows of one matrix (a reset writes it in one operation); the last rows are
        # copied from the task tables.
        self._ints = np.zeros((_N_INTS, N), dtype=np.int64)
        (self._task, self._turns, self._draws, self._n_failures, self._consecutive, self._last_tool, self._streak,
         self._next_req, self._covered, self._done_bits, self._order_broken, self._output_done, self._max_calls_row,
         self._task_tools, self._task_req, self._n_req_row, self._grade_base) = self._ints
        self._autoreset = np.zeros(N, dtype=bool)
        self._started = False

    # --- construction ----------------------------------------------------------------------------------

    def _build_task_tables(self, tasks: Sequence[Task]) -> None:
        """Per-task arrays, built once: required ids, positions, outputs, limits, first observations."""
        n, reg, lay = self.n_tools, self.registry, self.layout
        required = [task.required_ids(reg) for task in tasks]
        width = max((len(r) for r in required), default=0) + 1  # one padding position: "all done"
        if width > 21:
            raise ValueError(f"the batched env supports tasks with at most 20 required tools, got {width - 1}; "
                             "use vectorization_mode='sync'")
        k = len(tasks)
        pos_bit = np.zeros((k, n), dtype=np.int64)  # 1 << position of each required tool, 0 otherwise
        out_mask = np.zeros((k, n), dtype=bool)
        # Observation offset of "next required = j" (-1, i.e. no write, without the next-required one-hot).
        next_obs = np.full((k, width), -1, dtype=np.int64)
        fields = np.zeros((_N_INTS, k), dtype=np.int64)  # the integer state at the start of an episode
        classes: dict[tuple[int, float], int] = {}  # (number of required tools, min coverage) -> grade class
        self._min_cov = np.zeros(k, dtype=np.float64)
        self._init_obs = np.zeros((k, lay.size), dtype=np.float32)
        coverage = self.config.evaluator.min_coverage
        for i, (task, req) in enumerate(zip(tasks, required, strict=True)):
            pos_bit[i, list(req)] = 1 << np.arange(len(req))
            if self.features == "full":
                next_obs[i, : len(req)] = lay.next_required + np.asarray(req, dtype=np.int64)
            outputs = output_tool_ids(req, reg)
            out_mask[i, list(outputs)] = True
            fields[_OUTPUT_DONE, i] = not outputs  # a task without outputs counts as having produced them
            max_calls = 1 + task.max_retries
            if not 1 <= max_calls <= _CALLS:
                raise ValueError(f"task {task.instance_id!r}: the batched env needs 0 <= max_retries <= {_CALLS - 1}, "
                                 f"got {task.max_retries}; use vectorization_mode='sync'")
            fields[_TASK, i], fields[_MAX_CALLS, i], fields[_N_REQ, i] = i, max_calls, len(req)
            fields[_TASK_TOOLS, i], fields[_TASK_REQ, i] = i * n, i * width
            if task.task_type not in coverage:
                raise ValueError(f"no min_coverage for task type {task.task_type!r}; configured: {sorted(coverage)}")
            self._min_cov[i] = coverage[task.task_type]
            grade_class = classes.setdefault((len(req), self._min_cov[i]), len(classes))
            fields[_GRADE_BASE, i] = grade_class * width * 16
            self._init_obs[i] = initial_observation(task, reg, lay, self.features)
        self._pos_bit, self._out_mask, self._next_obs = pos_bit.reshape(-1), out_mask.reshape(-1), next_obs.reshape(-1)
        fields[_LAST_TOOL] = -1
        self._ints_start = fields
        self._task_fields = fields[_TASK_FIELDS]
        # The evaluator's ``grade`` over every (class, covered, order broken, output, completion, failure
        # termination) an episode can end in: index = base + covered * 16 + broken * 8 + output * 4
        # + completed * 2 + failed; the sequence holds when a required tool succeeded and none out of order.
        grid = np.array(np.meshgrid(np.arange(len(classes)), np.arange(width), *[[0, 1]] * 4,
                                    indexing="ij")).reshape(6, -1)
        class_n_req = np.array([c[0] for c in classes], dtype=np.int64)
        class_cov = np.array([c[1] for c in classes], dtype=np.float64)
        flags = grid[2:].astype(bool)
        sequence = (grid[1] > 0) & ~flags[0]
        _, _, code = grade(grid[1], class_n_req[grid[0]], sequence, flags[1], flags[2], flags[3],
                           class_cov[grid[0]], self.config.evaluator.partial_conditions_needed,
                           self.config.evaluator.partial_rule)
        self._grade_table = np.asarray(code, dtype=np.int8)
        # Next required position from the bit set of required positions done: its lowest zero bit.
        bits = np.arange(1 << width, dtype=np.int64)
        self._next_of_bits = _lowest_zero_bit(bits)
        self._task_row_of = {id(t): i for i, t in enumerate(tasks)}

    def _task_row(self, task: Task) -> int:
        """Row of ``task`` in the task tables, adding it (after the pool) when it is new."""
        row = self._task_row_of.get(id(task))
        if row is None or self.known_tasks[row] is not task:
            self.known_tasks.append(task)
            self._build_task_tables(self.known_tasks)
            self._ints[_TASK_FIELDS] = self._task_fields[:, self._task]  # tables may have a new layout
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
        elif isinstance(seed, Sequence | np.ndarray) and not isinstance(seed, str):
            seeds = list(seed)
            if len(seeds) != N:
                raise ValueError(f"a list of seeds must have num_envs={N} entries, got {len(seeds)}")
        else:
            raise ValueError(f"seed must be a non-negative integer, a list of num_envs={N} of them (or None) "
                             f"or None, got {seed!r}")
        for s in seeds:
            if s is not None and not (isinstance(s, int | np.integer) and not isinstance(s, bool) and s >= 0):
                raise ValueError(f"seeds must be non-negative integers or None, got {s!r}")
        pinned = self._pinned_rows(task_id, rows)
        self._seed_rows(rows, [seeds[i] for i in rows.tolist()])
        self._start_episodes(rows, pinned)
        self._autoreset[rows] = False
        self._started = True
        return self._obs_buf[:N].copy(), self._info_arrays()

    def step(self, actions):
        if not self._started:
            raise RuntimeError("call reset() before step()")
        N, n, T, lay = self.num_envs, self.n_tools, self._turn_limit, self.layout
        a = np.asarray(actions)
        if a.shape != (N,) or a.dtype.kind not in "iu":
            raise ValueError(f"actions must be an integer array of shape ({N},), got {a.dtype} {a.shape}")
        a = a.astype(np.int64, copy=False)
        if (a.view(np.uint64) > n).any():  # negative actions wrap to huge values
            raise ValueError(f"actions must be in [0, {n}] (FINISH = {n}), got {a[(a < 0) | (a > n)][:5]}")
        autoreset = self._autoreset
        if autoreset.any():
            self._start_episodes(autoreset.nonzero()[0], {})
        acting = ~autoreset
        finish = acting & (a == n)
        tool_action = acting ^ finish
        out_of_turns = tool_action & (self._turns >= T)
        call = tool_action ^ out_of_turns
        # Rows without a call read tool min(a, n - 1); every write below leaves them unchanged.
        at = np.minimum(a, n - 1)
        tc_flat, obs_flat, mask_flat = self._tc.reshape(-1), self._obs_buf.reshape(-1), self._mask_buf.reshape(-1)

        cell = self._row_cols + at
        tc = tc_flat[cell]
        replay = (tc & _SUCCEEDED) > 0
        calls_before = tc & _CALLS
        max_calls = self._max_calls_row
        live = call & ~replay & (calls_before < max_calls)  # neither a replay nor over the call cap
        p_index = self._n_failures.copy()
        for j in range(self._n_deps):
            p_index += self._kind_index[j][tc_flat[self._row_cols + self._dep_cols[j][at]]]
        unmet = self._unmet_table[p_index]
        if self._strict:
            strict_fail = live & unmet
            draw = live ^ strict_fail
        else:
            strict_fail, draw = None, live
        u = rs.to_uniform(rs.bits_array(self._episode_key, self._draw_offset[self._draws]))
        success = draw & (u < self._p_table[p_index])
        self._draws += draw
        changed = call & ~replay
        failed = changed ^ success
        dependency_problem = draw & unmet if strict_fail is None else strict_fail | (draw & unmet)
        new_tc = np.where(changed, calls_before + live + success * _SUCCEEDED
                          + (failed & dependency_problem) * _DEPENDENCY_PROBLEM, tc)
        tc_flat[cell] = new_tc
        block = self._row_obs + (lay.status + N_STATUS * at)
        obs_flat[block + self._status_of[tc]] = 0.0
        obs_flat[block + self._status_of[new_tc]] = 1.0
        mask_off = success | (failed & (calls_before + live >= max_calls))
        mask_flat[np.where(mask_off, self._row_mask + at, self._dump_mask)] = 0

        self._turns += call
        limit = (call & (self._turns == T)).nonzero()[0]
        if limit.size:
            self._mask_buf[limit, :n] = 0
        self._n_failures += failed
        consecutive = (self._consecutive + failed) * ~success
        self._consecutive[:] = consecutive
        streak = self._streak
        np.copyto(streak, failed * (1 + (at == self._last_tool) * streak), where=changed)
        np.copyto(self._last_tool, at, where=changed)
        end_code = self._end_table[consecutive * (T + 1) + streak] * failed

        task_cell = self._task_tools + at
        self._output_done |= success & self._out_mask[task_cell]
        pos_bit = self._pos_bit[task_cell] * success  # first success of a required tool: 1 << its position
        hit = pos_bit.nonzero()[0]
        if hit.size:
            self._required_success(hit, pos_bit[hit])
        obs = self._obs_buf
        obs[:N, lay.step] = self._step_table[self._turns]
        obs[:N, lay.failures] = self._failures_table[self._n_failures]
        obs[:N, lay.consecutive] = self._consecutive_table[consecutive]

        ended = finish | out_of_turns | (end_code > 0)
        end_code = end_code + finish * FINISHED_CODE + out_of_turns * OUT_OF_TURNS_CODE
        level = np.full(N, -1, dtype=np.int8)
        reward = np.zeros(N, dtype=np.float64)
        rows = ended.nonzero()[0]
        if rows.size:
            code = self._grade(rows, finish[rows], end_code[rows])
            level[rows] = code
            reward[rows] = code == FULL
            self._mask_buf[rows] = self._finished_mask
        self._autoreset = ended
        info = self._info_arrays()
        info["level"], info["_level"] = level, ended.copy()
        info["end_reason"], info["_end_reason"] = end_code.astype(np.int8), ended.copy()
        return obs[:N].copy(), reward, ended ^ out_of_turns, out_of_turns, info

    def close_extras(self, **kwargs: Any) -> None:
        pass

    # --- pieces ----------------------------------------------------------------------------------------

    def _required_success(self, rows: np.ndarray, pos_bit: np.ndarray) -> None:
        """First successes of required tools (``pos_bit`` = 1 << position): order, coverage, next required
        tool and progress, in the state and the observation."""
        obs_flat = self._obs_buf.reshape(-1)
        bits = self._done_bits[rows]
        self._order_broken[rows] |= bits > pos_bit  # an earlier success at a later position
        bits |= pos_bit
        self._done_bits[rows] = bits
        covered = self._covered[rows] + 1
        self._covered[rows] = covered
        task_req, base = self._task_req[rows], self._row_obs[rows]
        old_next, new_next = self._next_req[rows], self._next_of_bits[bits]
        self._next_req[rows] = new_next
        for position, value in ((old_next, 0.0), (new_next, 1.0)):  # unchanged rows: 0 then 1, same cell
            offset = self._next_obs[task_req + position]
            obs_flat[np.where(offset >= 0, base + offset, self._dump_obs)] = value
        obs_flat[base + self.layout.progress] = covered / self._n_req_row[rows]  # a hit implies n_req >= 1

    def _grade(self, rows: np.ndarray, completed: np.ndarray, end_code: np.ndarray) -> np.ndarray:
        """Level codes of the episodes ending in ``rows``: the evaluator's ``grade`` (tabulated) on counters."""
        index = (self._grade_base[rows] + self._covered[rows] * 16 + self._order_broken[rows] * 8
                 + self._output_done[rows] * 4 + completed * 2 + (end_code >= CONSECUTIVE_FAILURES_CODE))
        return self._grade_table[index]

    def _info_arrays(self) -> dict[str, Any]:
        N = self.num_envs
        everywhere = np.ones(N, dtype=bool)
        return {
            "action_mask": self._mask_buf[:N].copy(),
            "_action_mask": everywhere,
            "task_index": self._task.copy(),
            "_task_index": everywhere.copy(),
        }

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
                pinned[r] = self._task_row(task_by_id(self.tasks, ids[r], self.world))
        return pinned

    def _seed_rows(self, rows: np.ndarray, seeds: list[int | None]) -> None:
        """Restart the episode sequence of rows with a seed (as ``EnvEpisodes.next``); rows without one go
        on, or start from OS entropy when they were never seeded."""
        fresh = [(r, s) for r, s in zip(rows.tolist(), seeds, strict=True)
                 if s is not None or not self._seeded[r]]
        if fresh:
            r = np.array([x[0] for x in fresh], dtype=np.int64)
            values = [secrets.randbits(64) if s is None else int(s) & rs.M64 for _, s in fresh]
            self._env_key[r] = rs.key_array(np.array(values, dtype=np.uint64))
            self._episode_no[r] = 0
            self._seeded[r] = True

    def _start_episodes(self, rows: np.ndarray, pinned: dict[int, int]) -> None:
        """Begin new episodes in ``rows``: next task and episode seed of each row's sequence, state cleared."""
        env_key, e = self._env_key[rows], self._episode_no[rows]
        task = rs.below_array(rs.bits_array(env_key, rs.offsets(2 * e)), len(self.tasks))
        self._episode_key[rows] = rs.key_array(rs.bits_array(env_key, rs.offsets(2 * e + 1)))
        self._episode_no[rows] = e + 1
        if pinned:
            for i, r in enumerate(rows.tolist()):
                task[i] = pinned.get(r, task[i])
        self._ints[:, rows] = self._ints_start[:, task]
        self._tc[rows] = self._tc_init
        self._mask_buf[rows] = 1
        self._obs_buf[rows] = self._init_obs[task]

    # --- helpers ---------------------------------------------------------------------------------------

    @staticmethod
    def level_names(codes: np.ndarray) -> np.ndarray:
        """Level names ("failure", "partial_success", "full_success"; None for -1) of level codes."""
        return np.array([*LEVELS, None], dtype=object)[np.asarray(codes, dtype=np.int64)]

    @staticmethod
    def end_reason_names(codes: np.ndarray) -> np.ndarray:
        """End reasons (None for 0) of end-reason codes."""
        return np.array(END_REASONS, dtype=object)[np.asarray(codes, dtype=np.int64)]


# Bits of the per-(sub-env, tool) code.
_CALLS, _SUCCEEDED, _DEPENDENCY_PROBLEM = 63, 64, 128
# Rows of the integer state matrix; the task-derived ones come last.
(_TASK, _TURNS, _DRAWS, _N_FAILURES, _CONSECUTIVE, _LAST_TOOL, _STREAK, _NEXT_REQ, _COVERED, _DONE_BITS,
 _ORDER_BROKEN, _OUTPUT_DONE, _MAX_CALLS, _TASK_TOOLS, _TASK_REQ, _N_REQ, _GRADE_BASE) = range(17)
_N_INTS = 17
_TASK_FIELDS = np.array([_TASK, _MAX_CALLS, _TASK_TOOLS, _TASK_REQ, _N_REQ, _GRADE_BASE])


def _lowest_zero_bit(bits: np.ndarray) -> np.ndarray:
    """Index of the lowest zero bit of each value (the number of trailing ones)."""
    out = np.zeros(bits.shape, dtype=np.int64)
    ones = bits.copy()
    while True:
        more = (ones & 1) == 1
        if not more.any():
            return out
        out += more
        ones = np.where(more, ones >> 1, 0)
