"""``ResiliBench-v1`` natively batched: one compiled loop over N episodes (``gymnasium.make_vec(...,
"vector_entry_point")``)."""

from __future__ import annotations

__all__ = ["ResiliBenchVectorEnv"]

import secrets
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import gymnasium as gym
import numba
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from resilibench.errors import ConfigError

from ...core import stream as rs
from ...core.config import WorldConfig
from ...core.evaluator import FULL, LEVELS, grade, output_tool_ids
from ...core.frontend import front_end_world, select_tasks, task_by_id
from ...core.registry import ToolRegistry, default_registry
from ...core.rewards import PHASES, REWARD_MODES
from ...core.simulator import (
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
from ...core.tasks.library import SPLITS, Task
from ...core.world import DEFAULT_WORLD, World
from .observation import (
    N_STATUS,
    UINT8_SCALE,
    ObservationLayout,
    check_features,
    counter_tables,
    initial_observation,
    quantize_uint8,
)


class ResiliBenchVectorEnv(gym.vector.VectorEnv):
    """
    ## Description

    ``ResiliBench-v1`` for N episodes at once, stepped by one numba-compiled loop over the batch (no Python
    loop over sub-envs). Sub-env ``i`` behaves exactly like a ``ResiliBenchEnv`` (see ``resilibench.envs.planner.env``)
    reset with seed ``seed + i``: the same task sampling, the same episode random stream, and step for step
    the same observations, rewards, terminations, truncations, action masks and final levels (a test
    checks this against N single envs). No rule is written twice: at construction the env evaluates the
    rule functions on arrays of every input an episode can reach, ``success_probability`` and
    ``termination_code`` (``resilibench.core.simulator``), ``grade`` (``resilibench.core.evaluator``) and
    ``counter_tables`` (``resilibench.envs.planner.observation``), and the compiled step (``_advance_rows``) looks
    the results up. Randomness is the counter-based stream of ``resilibench.core.stream``, computed inside
    the compiled step with the stream's own ``mix``: sub-env ``i`` keeps its env seed's key and episode
    number, an episode start computes the episode's task and seed as ``EnvEpisodes`` does, and a call that
    draws computes its draw from (episode seed, draw index); the step also checks the actions before
    changing anything.
    Throughput: see ``docs/benchmarks.md``.

    ```python
    import gymnasium as gym
    import resilibench

    envs = gym.make_vec("ResiliBench-v1", num_envs=1024, vectorization_mode="vector_entry_point")
    obs, info = envs.reset(seed=0)
    obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample())
    ```

    ## Action Space

    ``MultiDiscrete([31] * N)``: per sub-env, tool ``i < 30`` or ``30`` = FINISH, as in ``ResiliBench-v1``.
    Every action must lie in ``[0, 31)`` (``ValueError`` otherwise), including those of sub-envs that are
    being autoreset (their actions are ignored).

    ## Observation Space

    ``Box(0, 1, (N, 204), float32)``: row ``i`` is sub-env ``i``'s ``ResiliBench-v1`` observation (layout
    in ``resilibench.envs.planner.observation``). With ``observation_dtype="float16"``, ``Box(0, 1, (N, 204),
    float16)``: the same observation rounded to half precision (``obs.astype(np.float16)``; every entry but
    the fractions is exact), half the memory and bandwidth, for policies that read half precision. With
    ``observation_dtype="uint8"``, ``Box(0, 240, (N, 204), uint8)``: the observation in units of 1/240
    (``quantize_uint8`` in ``resilibench.envs.planner.observation``; divide by 240 to read it), a quarter of
    the bytes; exact for every binary entry and every fraction whose denominator divides 240, within 1/480
    for the others (the sevenths of tasks with seven required tools): an opt-in quantization. The
    batched ``observation_space`` is built on first use (Gymnasium's ``Box`` holds four arrays of the batch's
    shape: 30 MB at 16,384 envs); ``single_observation_space`` is always there.

    ## What a caller may keep

    ``reset`` and ``step`` return the env's own buffers as read-only arrays, not copies (as Gymnasium's
    vector envs with ``copy=False``): the observation, reward, terminated, truncated and every array of
    ``info`` hold their values until the next ``step`` or ``reset``, which overwrites them in place. Keep
    one beyond that with ``np.copy`` (a rollout buffer's copy into its own storage is that copy). The
    ``info`` dict itself is new at every call.

    ## Rewards

    ``reward="sparse"`` only: 1.0 when an episode ends in full success, else 0.0 (float64 array). The
    shaped reward and the ``training`` dynamics profile keep per-env running state and are served by
    ``gymnasium.make_vec("ResiliBench-v1", num_envs=N, vectorization_mode="sync", reward="shaped")``.

    ## Episode End

    As in ``ResiliBench-v1``: terminated on FINISH or a failure termination, truncated on a tool action
    after the turn limit. Autoreset follows Gymnasium's ``NEXT_STEP`` mode (``metadata["autoreset_mode"]``):
    the step after an episode ends resets that sub-env (its action is ignored) and returns the first
    observation of the new episode with reward 0, ``terminated = truncated = False``.

    ``info`` (arrays over sub-envs, with Gymnasium's ``_key`` masks):

    * ``action_mask``: (N, 31) int8, the single env's ``info["action_mask"]`` row by row (only FINISH after
      an episode's end);
    * ``task_index``: (N,) int64, the row of ``env.known_tasks`` each sub-env is playing;
    * ``level`` / ``_level``: (N,) int8 level codes, indices into ``resilibench.core.evaluator.LEVELS``
      (0 failure, 1 partial_success, 2 full_success), set where an episode ended at this step (``_level``
      True) and -1 elsewhere;
    * ``end_reason`` / ``_end_reason``: (N,) int8 indices into ``resilibench.core.simulator.END_REASONS``
      (1 finished, 2 out_of_turns, 3 consecutive_failures, 4 repetition_loop), 0 where none ended.

    The per-call trace (tool names, error codes) is not kept; use ``ResiliBench-v1`` for traces.

    ## Arguments

    * ``num_envs``: the batch size N.
    * ``split``, ``task_types``, ``tasks``, ``config``, ``rules``, ``world``, ``registry``, ``features``:
      as for ``ResiliBench-v1``.
    * ``reward``: "sparse" (the default; "shaped" raises ``ValueError``); the rules' ``profile``: "test"
      (the default; "training" raises ``ValueError``); ``reward_phase`` is accepted for symmetry and unused. A
      ``config`` with failure processes on raises ``ConfigError`` naming ``processes`` (the single env
      plays them).
    * ``observation_dtype``: "float32" (the default), "float16" or "uint8" (see Observation Space).
    * ``reset(seed=s)`` seeds sub-env ``i`` with ``s + i`` (or per sub-env from a list of N ints/None);
      ``reset(options={"task_id": id or [N ids/None]})`` pins tasks like the single env;
      ``options={"reset_mask": bool array}`` resets only the masked sub-envs.

    ## Version History

    * v0: initial release, the rules of ``ResiliBench-v0`` v0.
    * v1: world v1 (its task library and grading, docs/core/worlds.md); the default. Later in v1, with no
      change to any value: the ``observation_dtype="float16"`` option, and the returned arrays became the
      env's read-only buffers (see What a caller may keep). Later still, with no change to any value of the
      default: the ``observation_dtype="uint8"`` option (the observation in 240ths, a documented
      quantization); episodes are drawn at their start inside the compiled step (the same tasks and seeds).
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
        rules: Mapping[str, Any] | None = None,
        registry: ToolRegistry | None = None,
        render_mode: str | None = None,
        world: str | World = DEFAULT_WORLD,
        features: str = "full",
        observation_dtype: str = "float32",
    ):
        self.features = check_features(features)
        if observation_dtype not in OBSERVATION_DTYPES:
            raise ValueError(f"observation_dtype must be one of {OBSERVATION_DTYPES}, got {observation_dtype!r}")
        self.observation_dtype = np.dtype(observation_dtype)
        if not isinstance(num_envs, int | np.integer) or isinstance(num_envs, bool) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        if reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {reward!r}")
        if reward != "sparse":
            raise ValueError(
                f"the batched ResiliBench-v1 supports reward='sparse' only, got {reward!r}; for the shaped reward "
                "use gymnasium.make_vec('ResiliBench-v1', num_envs=N, vectorization_mode='sync', reward='shaped')"
            )
        if reward_phase not in PHASES:
            raise ValueError(f"reward phase must be one of {PHASES}, got {reward_phase!r}")
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
        if render_mode is not None:
            raise ValueError(
                f"the batched ResiliBench-v1 does not render (render_mode={render_mode!r}); use "
                "vectorization_mode='sync' with render_mode='ansi'"
            )
        self.world = front_end_world(world, config, rules)
        self.config = self.world.config
        episode_rules = self.config.rules
        if episode_rules.profile != "test":
            raise ValueError(
                f"the batched ResiliBench-v1 supports profile='test' only, got {episode_rules.profile!r}; for the training "
                "profile use gymnasium.make_vec('ResiliBench-v1', num_envs=N, vectorization_mode='sync', "
                "rules={'profile': 'training'})"
            )
        if self.config.processes.active:
            raise ConfigError("processes", "processes: the batched ResiliBench-v1 does not play failure processes "
                              "(the single env plays them); use gymnasium.make_vec('ResiliBench-v1', num_envs=N, "
                              "vectorization_mode='sync', config=...)")
        self.registry = registry or default_registry()
        self.tasks = select_tasks(tasks, split, task_types, self.world)
        self.known_tasks: list[Task] = list(self.tasks)  # the pool, then tasks pinned by id from elsewhere
        self.num_envs = int(num_envs)
        self.render_mode = None
        self.reward_mode = reward
        self.n_tools = n = len(self.registry)
        self.finish_action = n
        self.layout = ObservationLayout(n)
        self.single_action_space = spaces.Discrete(n + 1)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        high = UINT8_SCALE if self.observation_dtype == np.uint8 else 1.0
        self.single_observation_space = spaces.Box(0, high, (self.layout.size,), self.observation_dtype.type)
        self._observation_space: spaces.Space | None = None

        self._turn_limit = episode_rules.turn_limit
        self._strict = episode_rules.strict_dependencies
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
        self._dep_idx = dep_idx
        # The success formula over every (kinds of the dependencies, failed calls so far) it can meet:
        # index = sum_j kind_j * 3**j * (T + 1) + N_h, read through ``_kind_table[j, code]``.
        self._kind_table = np.stack([(kind * 3**j * (T + 1)).astype(np.int64) for j in range(self._n_deps)])
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
        self._end_table = np.asarray(termination_code(consecutive, streak, episode_rules),
                                     dtype=np.int64).reshape(-1)
        self._counter_tables = tuple(_cells(self._observation_values(x)) for x in counter_tables(episode_rules))
        self._one = _cells(self._observation_values([1.0]))
        self._finished_mask = np.zeros(n + 1, dtype=np.int8)
        self._finished_mask[n] = 1
        self._build_task_tables(self.known_tasks)
        # The stream. Per sub-env: the key of its env seed, the number of its next episode and the key of the
        # running episode; an episode start computes its task and key from the first two (as ``EnvEpisodes``).
        # ``_draw_offset[d]`` turns an episode key into the input of draw 2d (the d-th success draw).
        self._env_key = np.zeros(N, dtype=np.uint64)
        self._seeded = np.zeros(N, dtype=bool)
        self._episode = np.zeros(N, dtype=np.uint64)
        self._episode_key = np.zeros(N, dtype=np.uint64)
        self._draw_offset = rs.offsets(2 * np.arange(T + 1))

        # Batched state, and the arrays the compiled step writes what it returns to.
        self._obs_buf = np.zeros((N, self.layout.size), dtype=self.observation_dtype)
        self._mask_buf = np.zeros((N, n + 1), dtype=np.int8)
        self._tc = np.zeros((N, self._cols), dtype=np.uint8)
        # Integer state, one narrow row per sub-env (counters below the turn limit, flags; an episode start
        # copies ``_ints_init``), the bit set of required positions done, and the task row, through which the
        # step reads the task's fields (``_task_fields``).
        self._ints = np.zeros((N, _N_INTS), dtype=np.int16)
        self._done_bits = np.zeros(N, dtype=np.int32)
        self._ints_init = np.zeros(_N_INTS, dtype=np.int16)
        self._ints_init[_LAST_TOOL] = -1
        self._task = np.zeros(N, dtype=np.int64)
        self._start = np.full(N, _GO_ON, dtype=np.int32)  # what ``reset`` starts per row
        self._reward = np.zeros(N, dtype=np.float64)
        self._level = np.full(N, -1, dtype=np.int8)
        self._end_code = np.zeros(N, dtype=np.int8)
        self._terminated = np.zeros(N, dtype=bool)
        self._truncated = np.zeros(N, dtype=bool)
        self._ended = np.zeros(N, dtype=bool)  # ended at the last step: the next step resets the row
        # What a caller gets: read-only views of those arrays, made once.
        self._out = {name: _read_only(a) for name, a in (
            ("obs", self._obs_buf), ("reward", self._reward), ("terminated", self._terminated),
            ("truncated", self._truncated), ("mask", self._mask_buf), ("task", self._task),
            ("level", self._level), ("end_code", self._end_code), ("ended", self._ended),
            ("everywhere", np.ones(N, dtype=bool)))}
        self._started = False

    @property
    def observation_space(self) -> spaces.Space:  # pyright: ignore[reportIncompatibleVariableOverride]
        """The batched observation space, built on first use."""
        if self._observation_space is None:
            self._observation_space = batch_space(self.single_observation_space, self.num_envs)
        return self._observation_space

    @observation_space.setter
    def observation_space(self, space: spaces.Space) -> None:  # pyright: ignore[reportIncompatibleVariableOverride]
        self._observation_space = space

    def _observation_values(self, values) -> np.ndarray:
        """``values`` as the observation stores them: float32 (the single env's values), then the dtype
        (uint8: ``quantize_uint8``)."""
        values = np.asarray(values, dtype=np.float32)
        return quantize_uint8(values) if self.observation_dtype == np.uint8 else values.astype(self.observation_dtype)

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
        position = np.zeros((k, n), dtype=np.int8)  # 1 + position of each required tool, 0 otherwise
        out_mask = np.zeros((k, n), dtype=bool)
        # Observation offset of "next required = j" (-1, i.e. no write, without the next-required one-hot).
        next_obs = np.full((k, width), -1, dtype=np.int16)
        fields = np.zeros((k, _N_TASK_FIELDS), dtype=np.int32)  # what the step reads of the task
        classes: dict[tuple[int, float], int] = {}  # (number of required tools, min coverage) -> grade class
        init_obs = np.zeros((k, lay.size), dtype=self.observation_dtype)
        coverage = self.config.evaluator.min_coverage
        for i, (task, req) in enumerate(zip(tasks, required, strict=True)):
            position[i, list(req)] = np.arange(1, len(req) + 1)
            if self.features == "full":
                next_obs[i, : len(req)] = lay.next_required + np.asarray(req, dtype=np.int64)
            outputs = output_tool_ids(req, reg)
            out_mask[i, list(outputs)] = True
            fields[i, _NO_OUTPUTS] = not outputs  # a task without outputs counts as having produced them
            max_calls = 1 + task.max_retries
            if not 1 <= max_calls <= _CALLS:
                raise ValueError(f"task {task.instance_id!r}: the batched env needs 0 <= max_retries <= {_CALLS - 1}, "
                                 f"got {task.max_retries}; use vectorization_mode='sync'")
            fields[i, _MAX_CALLS], fields[i, _N_REQ] = max_calls, len(req)
            fields[i, _TASK_TOOLS], fields[i, _TASK_REQ] = i * n, i * width
            if task.task_type not in coverage:
                raise ValueError(f"no min_coverage for task type {task.task_type!r}; configured: {sorted(coverage)}")
            grade_class = classes.setdefault((len(req), coverage[task.task_type]), len(classes))
            fields[i, _GRADE_BASE] = grade_class * width * 16
            init_obs[i] = self._observation_values(initial_observation(task, reg, lay, self.features))
        self._position, self._out_mask, self._next_obs = position.reshape(-1), out_mask.reshape(-1), next_obs.reshape(-1)
        self._task_fields = fields
        # First observations, sparse: the entries every task shares (a row the step keeps in cache), then per
        # task the entries that differ from it, ``_init_at[_init_ptr[i]:_init_ptr[i + 1]]`` (a full row per
        # task, read at random, cost an episode start more than the rest of its episode).
        shared = (init_obs == init_obs[:1]).all(axis=0)
        template = np.where(shared, init_obs[0], 0).astype(self.observation_dtype)
        rows, at = np.nonzero(init_obs != template)
        self._init_template = _cells(template)
        self._init_ptr = np.searchsorted(rows, np.arange(k + 1)).astype(np.int32)
        self._init_at = at.astype(np.int16)
        self._init_val = _cells(np.ascontiguousarray(init_obs[rows, at]))
        # Progress (covered / number required) of every pair, as the observation stores it: index
        # n_required * width + covered.
        n_req, covered = np.meshgrid(np.arange(width), np.arange(width), indexing="ij")
        progress = np.where(covered <= n_req, covered / np.maximum(n_req, 1), 0.0)  # covered <= n_req: the rest unused
        self._progress = _cells(self._observation_values(progress).reshape(-1))
        self._width = width
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
        self._task_row_of: dict[int, int] | None = None  # built when a task is pinned

    def _task_row(self, task: Task) -> int:
        """Row of ``task`` in the task tables, adding it (after the pool) when it is new."""
        if self._task_row_of is None:
            self._task_row_of = {id(t): i for i, t in enumerate(self.known_tasks)}
        row = self._task_row_of.get(id(task))
        if row is None or self.known_tasks[row] is not task:
            self.known_tasks.append(task)
            self._build_task_tables(self.known_tasks)  # the rows' state refers to tasks by row: unchanged
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
            rows = slice(None)
        else:
            if not isinstance(reset_mask, np.ndarray) or reset_mask.dtype != np.bool_ or reset_mask.shape != (N,):
                raise ValueError(f"options['reset_mask'] must be a bool numpy array of shape ({N},), got {reset_mask!r}")
            if not reset_mask.any():
                raise ValueError("options['reset_mask'] must contain at least one True value")
            rows = np.flatnonzero(reset_mask)
        seeds: int | Sequence[int | None]
        if _is_seed(seed):
            seeds = int(seed)  # seed + i: computed on arrays, no list of N ints
        elif seed is None:
            seeds = [None] * N
        elif isinstance(seed, Sequence | np.ndarray) and not isinstance(seed, str):
            seeds = list(seed)
            if len(seeds) != N:
                raise ValueError(f"a list of seeds must have num_envs={N} entries, got {len(seeds)}")
            for s in seeds:
                if s is not None and not _is_seed(s):
                    raise ValueError(f"seeds must be non-negative integers or None, got {s!r}")
        else:
            raise ValueError(f"seed must be a non-negative integer, a list of num_envs={N} of them (or None) "
                             f"or None, got {seed!r}")
        pinned = self._pinned_rows(task_id, rows)
        self._seed_rows(rows, seeds)
        self._start[:] = _GO_ON
        self._start[rows] = _DRAWN
        for r, task_row in pinned.items():
            self._start[r] = task_row
        self._advance(self._start, False)
        self._started = True
        return self._out["obs"], self._info()

    def step(self, actions):
        if not self._started:
            raise RuntimeError("call reset() before step()")
        N, n = self.num_envs, self.n_tools
        a = np.asarray(actions)
        if a.shape != (N,) or a.dtype.kind not in "iu":
            raise ValueError(f"actions must be an integer array of shape ({N},), got {a.dtype} {a.shape}")
        if self._advance(a, True) != _OK:
            bad = a[(a < 0) | (a > n)] if a.dtype.kind == "i" else a[a > n]
            raise ValueError(f"actions must be in [0, {n}] (FINISH = {n}), got {bad[:5]}")
        out = self._out
        info = self._info()
        info["level"], info["_level"] = out["level"], out["ended"]
        info["end_reason"], info["_end_reason"] = out["end_code"], out["ended"]
        return out["obs"], out["reward"], out["terminated"], out["truncated"], info

    def _advance(self, actions: np.ndarray, act: bool) -> int:
        """One call of the compiled step (``_advance_rows``): with ``act``, every row acts on its action or, if
        its episode ended at the last step, starts the next one; without, rows start what ``actions`` (a task
        row, ``_DRAWN`` or ``_GO_ON``) says. Returns the index of the first bad action (nothing changed),
        else ``_OK``."""
        lay = self.layout
        return _advance_rows(
            actions, act,
            (self._env_key, self._episode, self._episode_key, self._draw_offset, self._ints, self._ints_init,
             self._done_bits, self._task, self._tc, self._tc_init, self._mask_buf, _cells(self._obs_buf),
             self._init_template, self._init_ptr, self._init_at, self._init_val),
            (self._task_fields, self._status_of, self._kind_table, self._dep_idx, self._p_table, self._unmet_table,
             self._end_table, *self._counter_tables, self._progress, self._one, self._position, self._out_mask,
             self._next_obs, self._next_of_bits, self._grade_table, self._finished_mask),
            (self.n_tools, self._turn_limit, self._strict, self._width, len(self.tasks), lay.status, lay.progress,
             lay.step, lay.failures, lay.consecutive),
            (self._reward, self._level, self._end_code, self._terminated, self._truncated, self._ended))

    def close_extras(self, **kwargs: Any) -> None:
        pass

    def _info(self) -> dict[str, Any]:
        out = self._out
        return {"action_mask": out["mask"], "_action_mask": out["everywhere"], "task_index": out["task"],
                "_task_index": out["everywhere"]}

    def _pinned_rows(self, task_id, rows: np.ndarray | slice) -> dict[int, int]:
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
        for r in np.arange(self.num_envs)[rows].tolist():
            if ids[r] is not None:
                pinned[r] = self._task_row(task_by_id(self.tasks, ids[r], self.world))
        return pinned

    def _seed_rows(self, rows: np.ndarray | slice, seed: int | Sequence[int | None]) -> None:
        """Restart the episode sequence of rows with a seed (as ``EnvEpisodes.next``): ``seed + row`` for one
        int, else ``seed[row]``; rows without one go on, or start from OS entropy when they were never seeded."""
        if not isinstance(seed, int):
            rows = np.array([r for r in np.arange(self.num_envs)[rows].tolist()
                             if seed[r] is not None or not self._seeded[r]], dtype=np.int64)
            values = np.array([secrets.randbits(64) if seed[r] is None else int(seed[r]) & rs.M64
                               for r in rows.tolist()], dtype=np.uint64)
            self._env_key[rows] = rs.key_array(values)
        else:  # key(seed + row) = mix(seed + row + GAMMA), in place: no more temporaries of N values than needed
            values = np.arange(self.num_envs, dtype=np.uint64)[rows]
            values += np.uint64((int(seed) + rs.GAMMA) & rs.M64)
            self._env_key[rows] = rs.mix_array(values)
        self._seeded[rows] = True
        self._episode[rows] = 0

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
# Columns of the per-row integer state (int16: counts up to the turn limit, flags).
(_TURNS, _DRAWS, _N_FAILURES, _CONSECUTIVE, _LAST_TOOL, _STREAK, _NEXT_REQ, _COVERED, _ORDER_BROKEN,
 _OUTPUT_DONE) = range(10)
_N_INTS = 10
# Columns of the per-task fields.
_MAX_CALLS, _TASK_TOOLS, _TASK_REQ, _N_REQ, _GRADE_BASE, _NO_OUTPUTS = range(6)
_N_TASK_FIELDS = 6
_DRAWN, _GO_ON = -1, -2  # what ``reset`` starts in a row: the drawn task; no new episode
_OK = -1  # what ``_advance_rows`` returns besides the index of a bad action
OBSERVATION_DTYPES = ("float32", "float16", "uint8")
_SHIFT, _HIGH = np.uint64(11), np.uint64(32)
_ONE, _TWO, _GAMMA = np.uint64(1), np.uint64(2), np.uint64(rs.GAMMA)
_mix = numba.njit(rs.mix_array)  # the stream's mix, compiled for one uint64


def _is_seed(s) -> TypeGuard[int | np.integer]:
    """A seed: a non-negative integer (not a bool)."""
    return bool(isinstance(s, int | np.integer) and not isinstance(s, bool) and s >= 0)


def _cells(a: np.ndarray) -> np.ndarray:
    """What the compiled step writes an observation array through: float32 as it is, float16 (which numba
    does not know) as its uint16 bit patterns; tables in the same dtype are copied bit for bit."""
    return a.view(np.uint16) if a.dtype == np.float16 else a


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


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


@numba.njit(cache=True, nogil=True)
def _advance_rows(actions, act, state, tables, sizes, out):
    """Advance every sub-env one step, row by row (compiled). With ``act``: first check every action (return
    the index of the first outside [0, n] before changing anything); then a row whose episode ended at the
    last step starts the next episode of its sequence, and the others act under the tabulated rules of the
    single env (``Episode.call``), drawing from the stream where the single env draws, and fill ``out``.
    Without ``act``, ``actions[i]`` says what row ``i`` starts: a task row, ``_DRAWN`` (the drawn task) or
    ``_GO_ON`` (nothing). Returns ``_OK``. The loop body calls nothing but the inlined mix: this is the
    vector env's hot path."""
    (env_key, episode, episode_key, draw_offset, ints, ints_init, done_bits, task_of, tc, tc_init, mask, obs,
     init_template, init_ptr, init_at, init_val) = state
    (task_fields, status_of, kind_table, dep_idx, p_table, unmet_table, end_table, step_table, failures_table,
     consecutive_table, progress_table, one, position_table, out_mask, next_obs, next_of_bits, grade_table,
     finished_mask) = tables
    n, T, strict, width, n_pool, status_at, progress_at, step_at, failures_at, consecutive_at = sizes
    reward, level, end_code, terminated, truncated, ended = out
    n_rows = actions.shape[0]
    if act:
        for i in range(n_rows):
            if actions[i] < 0 or actions[i] > n:
                return i
    one_value = one[0]
    pool = np.uint64(n_pool)
    for i in range(n_rows):
        if act:
            task = _DRAWN if ended[i] else _GO_ON
            reward[i], level[i], end_code[i] = 0.0, -1, 0
            terminated[i] = truncated[i] = False
        else:
            task = np.int64(actions[i])
        if task != _GO_ON:  # a new episode: number e of the row's sequence, as EnvEpisodes.next
            e = episode[i]
            episode[i] = e + _ONE
            k = env_key[i]
            if task == _DRAWN:  # below(bits(k, 2e), pool size)
                task = np.int64(((_mix(k + (_TWO * e + _ONE) * _GAMMA) >> _HIGH) * pool) >> _HIGH)
            episode_key[i] = _mix(_mix(k + (_TWO * e + _TWO) * _GAMMA) + _GAMMA)  # key(bits(k, 2e + 1))
            task_of[i] = task
            ended[i] = False
            for j in range(ints.shape[1]):  # element loops: faster than slice assignment here
                ints[i, j] = ints_init[j]
            ints[i, _OUTPUT_DONE] = task_fields[task, _NO_OUTPUTS]
            done_bits[i] = 0
            for j in range(tc.shape[1]):
                tc[i, j] = tc_init[j]
            for j in range(mask.shape[1]):
                mask[i, j] = 1
            for j in range(obs.shape[1]):
                obs[i, j] = init_template[j]
            for p in range(init_ptr[task], init_ptr[task + 1]):
                obs[i, init_at[p]] = init_val[p]
            continue
        if not act:
            continue
        t = np.int64(actions[i])
        task = task_of[i]
        finish = t == n
        code = 0
        if finish:
            code = FINISHED_CODE
        elif ints[i, _TURNS] >= T:
            code = OUT_OF_TURNS_CODE
            truncated[i] = True
        else:  # a tool call, as Episode.call
            before = tc[i, t]
            success = failed = False
            new = before
            if not before & _SUCCEEDED:  # else a replay: costs the turn, changes nothing else
                calls = before & _CALLS
                max_calls = task_fields[task, _MAX_CALLS]
                live = calls < max_calls  # under the call cap
                p_index = np.int64(ints[i, _N_FAILURES])
                for j in range(dep_idx.shape[1]):
                    p_index += kind_table[j, tc[i, dep_idx[t, j]]]
                unmet = unmet_table[p_index]
                draw = live and not (strict and unmet)
                if draw:  # uniform(episode seed, 2 * draws so far), as the single env's stream
                    x = _mix(episode_key[i] + draw_offset[ints[i, _DRAWS]])
                    success = (x >> _SHIFT) * rs.UNIT < p_table[p_index]
                    ints[i, _DRAWS] += 1
                failed = not success
                problem = failed and live and unmet  # a failure with unmet dependencies (not a capped call)
                new = calls + live + _SUCCEEDED * success + _DEPENDENCY_PROBLEM * problem
                tc[i, t] = new
                if success or calls + live >= max_calls:
                    mask[i, t] = 0
            block = status_at + N_STATUS * t
            obs[i, block + status_of[before]] = 0
            obs[i, block + status_of[new]] = one_value
            turns = ints[i, _TURNS] + 1
            ints[i, _TURNS] = turns
            if turns == T:
                for j in range(n):
                    mask[i, j] = 0
            if failed:
                ints[i, _N_FAILURES] += 1
                consecutive = ints[i, _CONSECUTIVE] + 1
                streak = ints[i, _STREAK] + 1 if t == ints[i, _LAST_TOOL] else 1
                code = end_table[consecutive * (T + 1) + streak]
                ints[i, _CONSECUTIVE], ints[i, _STREAK], ints[i, _LAST_TOOL] = consecutive, streak, t
            elif success:
                ints[i, _CONSECUTIVE], ints[i, _STREAK], ints[i, _LAST_TOOL] = 0, 0, t
                cell = task_fields[task, _TASK_TOOLS] + t
                if out_mask[cell]:
                    ints[i, _OUTPUT_DONE] = 1
                position = position_table[cell]
                if position:  # first success of a required tool: order, coverage, next, progress
                    bit = 1 << (position - 1)
                    bits = done_bits[i]
                    if bits > bit:  # an earlier success at a later position
                        ints[i, _ORDER_BROKEN] = 1
                    bits |= bit
                    done_bits[i] = bits
                    covered = ints[i, _COVERED] + 1
                    ints[i, _COVERED] = covered
                    base = task_fields[task, _TASK_REQ]
                    old_offset = next_obs[base + ints[i, _NEXT_REQ]]
                    new_next = next_of_bits[bits]
                    ints[i, _NEXT_REQ] = new_next
                    new_offset = next_obs[base + new_next]
                    if old_offset >= 0:
                        obs[i, old_offset] = 0
                    if new_offset >= 0:
                        obs[i, new_offset] = one_value
                    obs[i, progress_at] = progress_table[task_fields[task, _N_REQ] * width + covered]
            obs[i, step_at] = step_table[turns]
            obs[i, failures_at] = failures_table[ints[i, _N_FAILURES]]
            obs[i, consecutive_at] = consecutive_table[ints[i, _CONSECUTIVE]]
        if code:
            g = grade_table[task_fields[task, _GRADE_BASE] + ints[i, _COVERED] * 16 + ints[i, _ORDER_BROKEN] * 8
                            + ints[i, _OUTPUT_DONE] * 4 + finish * 2 + (code >= CONSECUTIVE_FAILURES_CODE)]
            level[i] = g
            reward[i] = 1.0 if g == FULL else 0.0
            end_code[i] = code
            ended[i] = True
            terminated[i] = not truncated[i]
            for j in range(mask.shape[1]):
                mask[i, j] = finished_mask[j]
    return _OK
