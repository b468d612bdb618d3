"""The seeded tool simulator: one ``Episode`` holds the state of one task attempt under the world's rules.

Every front end (planner env, text env, MCP server, harness) drives an ``Episode``; the batched vector
env applies the same rule functions (``success_probability``, ``termination_code``, which
``termination_reason`` names) to arrays. Randomness comes from the counter-based source of
``resilibench.core.stream``; this module fixes which draw feeds which use (docs/core/stream.md):

* episode of seed ``s``: the k-th drawing call reads ``uniform(s, 2k)`` (success if below the call's
  probability) and, when it fails, ``uniform(s, 2k + 1)`` (its error code);
* env seeded ``S``, its e-th episode since the seeding (``EnvEpisodes``): task index
  ``below(bits(S, 2e), pool size)``, episode seed ``bits(S, 2e + 1)``;
* run seed ``r`` of task ``t`` (``task_seed``): the env seed ``bits(r, crc32(t))``;
* failure processes (``resilibench.core.processes``), when on: the draw of process stage ``x`` at turn
  ``t`` is ``uniform(subkey(key(s), STAGE_STREAMS[x]), t - 1)``; the success formula keeps the draws above.
"""

from __future__ import annotations

__all__ = [
    "RETRY_LIMIT_ERROR", "ANSWERED_AT_ONCE", "NOT_ATTEMPTED", "SUCCESS", "FAILED", "DEPENDENCY_FAILED",
    "FINISHED", "OUT_OF_TURNS", "CONSECUTIVE_FAILURES", "REPETITION_LOOP", "OUT_OF_TIME", "END_REASONS",
    "FINISHED_CODE", "OUT_OF_TURNS_CODE", "CONSECUTIVE_FAILURES_CODE", "REPETITION_LOOP_CODE",
    "success_probability", "termination_code", "termination_reason", "draw_stream", "env_episode",
    "EnvEpisodes", "registry_tables", "probability_memo", "stage_keys", "call_uniforms", "task_seed",
    "run_episode_seed", "CallRecord",
    "Episode",
]

import secrets
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, overload

import numpy as np

from . import stream as rs
from .config import FailureModel, WorldConfig
from .evaluator import Evaluation, evaluate, task_tables
from .processes import (
    STAGE_STREAMS,
    STAGE_SUCCESS,
    CallOutcome,
    ToolState,
    sample_outcome,
    tool_bases,
)
from .registry import DEPENDENCY_ERROR, INVALID_INPUT, ToolRegistry, default_registry
from .tasks.library import Task

RETRY_LIMIT_ERROR = "RETRY_LIMIT_EXCEEDED"
ANSWERED_AT_ONCE = frozenset({RETRY_LIMIT_ERROR, INVALID_INPUT, DEPENDENCY_ERROR})  # the episode rules' codes

# Tool status codes shared by observations and traces.
NOT_ATTEMPTED, SUCCESS, FAILED, DEPENDENCY_FAILED = 0, 1, 2, 3

# Why an episode ended.
FINISHED, OUT_OF_TURNS, CONSECUTIVE_FAILURES, REPETITION_LOOP = (
    "finished",
    "out_of_turns",
    "consecutive_failures",
    "repetition_loop",
)
OUT_OF_TIME = "out_of_time"  # the time budget of the failure processes ran out (graded as out_of_turns)


# Codes of end reasons, for array front ends (the vector env): index into END_REASONS; 0 = still running.
END_REASONS = (None, FINISHED, OUT_OF_TURNS, CONSECUTIVE_FAILURES, REPETITION_LOOP)
FINISHED_CODE, OUT_OF_TURNS_CODE, CONSECUTIVE_FAILURES_CODE, REPETITION_LOOP_CODE = range(1, 5)


def _table_power(factor: float, exponent: np.ndarray) -> np.ndarray:
    """``factor**k`` elementwise for an integer array, each value computed by Python's float power (numpy's
    vectorised pow may differ from it in the last ulp), so array callers match scalar callers bit for bit."""
    table = np.array([factor**k for k in range(int(np.max(exponent, initial=0)) + 1)], dtype=np.float64)
    return table[exponent]


@overload
def success_probability(base: float, n_uncalled: int, n_failed: int, n_history: int,
                        failure_model: FailureModel) -> float: ...
@overload
def success_probability(base: float | np.ndarray, n_uncalled: np.ndarray, n_failed: np.ndarray,
                        n_history: np.ndarray, failure_model: FailureModel) -> np.ndarray: ...
def success_probability(base, n_uncalled, n_failed, n_history, failure_model):
    """The success formula (paper app. B.3; docs/core/rules.md); works on scalars and numpy integer arrays alike (bit-identical results)."""
    fm = failure_model
    arrays = isinstance(n_uncalled, np.ndarray) or isinstance(n_failed, np.ndarray) or isinstance(
        n_history, np.ndarray)
    power = _table_power if arrays else pow
    return (
        base
        * power(fm.uncalled_dependency_factor, n_uncalled)
        * power(fm.failed_dependency_factor, n_failed)
        * power(fm.failure_history_factor, n_history)
    )


def termination_code(consecutive_failures, same_tool_streak, rules):
    """The failure-termination rule (docs/core/rules.md, "The rules") as a code (0 = go on, else an index into ``END_REASONS``);
    scalars or numpy arrays. Too many consecutive failures takes precedence over a repetition loop."""
    consecutive = consecutive_failures >= rules.max_consecutive_failures
    repetition = same_tool_streak >= rules.max_same_tool_failures
    # ``repetition > consecutive`` is "repetition and not consecutive" for bools and bool arrays alike.
    return consecutive * CONSECUTIVE_FAILURES_CODE + (repetition > consecutive) * REPETITION_LOOP_CODE


def termination_reason(consecutive_failures: int, same_tool_streak: int, rules) -> str | None:
    """The failure-termination rule (docs/core/rules.md, "The rules"), or None while the episode may go on."""
    return END_REASONS[termination_code(consecutive_failures, same_tool_streak, rules)]


def draw_stream(seed: int, turn_limit: int) -> np.ndarray:
    """The episode's uniform stream as an array: row k = (success draw, error-code draw) of the k-th
    drawing call, ``uniform(seed, 2k)`` and ``uniform(seed, 2k + 1)``."""
    k = rs.key(seed)
    return np.array([rs.uniform(k, i) for i in range(2 * turn_limit)], dtype=np.float64).reshape(turn_limit, 2)


def env_episode(env_seed: int, episode: int, n_tasks: int) -> tuple[int, int]:
    """(task index in a pool of ``n_tasks``, episode seed) of episode number ``episode`` (0 = the first
    after seeding) of an env seeded ``env_seed``: ``below(bits(S, 2e), n_tasks)`` and ``bits(S, 2e + 1)``."""
    return _episode_of_key(rs.key(env_seed), episode, n_tasks)


def _episode_of_key(k: int, episode: int, n_tasks: int) -> tuple[int, int]:
    return rs.below(rs.bits(k, 2 * episode), n_tasks), rs.bits(k, 2 * episode + 1)


class EnvEpisodes:
    """The sequence of episodes of one env (every front end resets through one): ``next(seed, n_tasks)``
    restarts the sequence at ``seed`` when one is given (an unseeded env starts from OS entropy) and
    returns the next (task index, episode seed) of ``env_episode``."""

    def __init__(self) -> None:
        self.env_seed: int | None = None
        self.count = 0

    def next(self, seed: int | None, n_tasks: int) -> tuple[int, int]:
        if seed is not None or self.env_seed is None:
            self.env_seed = secrets.randbits(64) if seed is None else int(seed) & rs.M64
            self.count, self._key = 0, rs.key(self.env_seed)
        self.count += 1
        return _episode_of_key(self._key, self.count - 1, n_tasks)


# --- per-registry and per-task tables, built once (hot-path lookups) ----------------------------------

_REGISTRY_TABLES: dict[int, tuple] = {}
_PROBABILITY_MEMO: dict[int, tuple] = {}  # id(FailureModel) -> (model, {(N_u, N_f, N_h): p})
_MEMO_MAX = 1 << 16


def registry_tables(registry: ToolRegistry) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...], tuple,
                                                     np.ndarray]:
    """(names, dependency ids, error codes per tool, a fresh episode's action mask) of ``registry``,
    cached; copy the mask before changing it."""
    entry = _REGISTRY_TABLES.get(id(registry))
    if entry is None or entry[0] is not registry:
        codes = tuple(t.error_codes for t in registry.tools)
        mask = np.ones(len(registry.names) + 1, dtype=np.int8)  # tools, then the completion signal
        entry = (registry, registry.names, registry.dependency_ids, codes, mask)
        _REGISTRY_TABLES[id(registry)] = entry
    return entry[1:]


def probability_memo(failure) -> dict[tuple[int, int, int], float]:
    """The memo {(N_u, N_f, N_h): success probability} shared by every episode of a failure model (looked
    up by identity: hashing the model costs more than an episode start's other work)."""
    entry = _PROBABILITY_MEMO.get(id(failure))
    if entry is None or entry[0] is not failure:
        if len(_PROBABILITY_MEMO) >= _MEMO_MAX:
            _PROBABILITY_MEMO.clear()
        entry = _PROBABILITY_MEMO[id(failure)] = (failure, {})
    return entry[1]


def stage_keys(key: int) -> dict[str, int]:
    """The keys of the failure processes' stage streams (``STAGE_STREAMS``) of an episode's key."""
    return {stage: rs.subkey(key, tag) for stage, tag in STAGE_STREAMS.items()}


def call_uniforms(key: int, keys: dict[str, int], turn: int, draw: int,
                  stream: np.ndarray | None = None) -> Callable[[str], float]:
    """The uniform of each stage of the call at ``turn`` (``draw(stage)`` of ``processes.sample_outcome``):
    a process stage reads ``uniform(keys[stage], turn - 1)``; the success formula's draws, those of the
    episode's ``draw``-th drawing call (0-based): ``uniform(key, 2 * draw)`` and ``uniform(key, 2 * draw + 1)``,
    or row ``draw`` of ``stream`` when given (module docstring)."""

    def uniform(stage: str) -> float:
        if stage in keys:
            return rs.uniform(keys[stage], turn - 1)
        column = 0 if stage == STAGE_SUCCESS else 1
        return rs.uniform(key, 2 * draw + column) if stream is None else stream.item(draw, column)

    return uniform


_PROTOTYPES: dict[tuple[type, int, int], tuple] = {}  # (class, id(config), id(registry)) -> (config, registry, dict)
_PROTOTYPES_MAX = 256


def _prototype(cls: type[Episode], task: Task, config: WorldConfig, registry: ToolRegistry) -> dict:
    """The attributes of a fresh ``cls`` episode made by the constructor (with ``task`` and seed 0), once
    per (class, config, registry) objects: ``Episode.start`` copies them and replaces what depends on the
    task and the seed."""
    key = (cls, id(config), id(registry))
    entry = _PROTOTYPES.get(key)
    if entry is None or entry[0] is not config or entry[1] is not registry:
        if len(_PROTOTYPES) >= _PROTOTYPES_MAX:
            _PROTOTYPES.clear()
        entry = _PROTOTYPES[key] = (config, registry, vars(cls(task, config, registry, 0)))
    return entry[2]


def task_seed(task_id: str, seed: int) -> int:
    """The env seed of a run's episode of (task, run seed), ``bits(seed, crc32(task_id))``: every planner
    meets the same stream on the same task and seed, and different tasks get independent streams."""
    return rs.bits(rs.key(seed), zlib.crc32(task_id.encode()))


def run_episode_seed(task_id: str, seed: int) -> int:
    """The episode seed that a run seeded ``seed`` meets on task ``task_id``: the first episode of an env
    reset with ``task_seed(task_id, seed)`` and the task pinned. Every front end (``resilibench run``, the
    harness, the MCP server, bound (ii)) plays or reads this episode, so they pair across front ends."""
    return env_episode(task_seed(task_id, seed), 0, 1)[1]


class CallRecord(NamedTuple):
    """One tool call in a trace (immutable; cheap to build on the hot path: ``Episode.call`` builds its
    records with ``_new_record(CallRecord, all nine fields)``, which skips the keyword handling of
    ``CallRecord(...)``)."""

    tool: str
    success: bool
    error_code: str | None
    turn: int
    probability: float | None  # None when no draw was made (replay, dependency or retry-limit error)
    unmet_dependencies: tuple[str, ...] = ()
    replayed: bool = False
    duration: float | None = None  # seconds the call took; None in a world without failure processes
    retry_after: int | None = None  # a rate-limit refusal's wait in turns (the Retry-After)

    @property
    def reached_service(self) -> bool:
        """Whether the call got past the rules that answer at once (replay, call cap, invalid arguments,
        strict dependencies): the calls a real API would have seen, which call logs record."""
        return not self.replayed and not (self.probability is None and self.error_code in ANSWERED_AT_ONCE)

    def to_dict(self) -> dict:
        """The record as a JSON-friendly dict (the form of ``info["trace"]`` entries in every env); the keys
        ``duration`` and ``retry_after`` are there when the world has failure processes on."""
        tool, success, error_code, turn, probability, unmet, replayed, duration, retry_after = self
        data = {"tool": tool, "success": success, "error_code": error_code, "turn": turn,
                "probability": probability, "unmet_dependencies": list(unmet), "replayed": replayed}
        if duration is not None:
            data["duration"], data["retry_after"] = duration, retry_after
        return data


_new_record = tuple.__new__


@dataclass
class Episode:
    """State of one attempt at one task. Create with ``Episode.start``; act with ``call`` and ``finish``."""

    task: Task
    config: WorldConfig
    registry: ToolRegistry
    seed: int
    success_rate: float = 0.0  # running success rate, read only by the training profile
    calls: list[int] = field(init=False)
    status: list[int] = field(init=False)
    succeeded: list[bool] = field(init=False)
    trace: list[CallRecord] = field(default_factory=list, init=False)
    n_failures: int = field(default=0, init=False)
    consecutive_failures: int = field(default=0, init=False)
    last_tool: int = field(default=-1, init=False)
    same_tool_streak: int = field(default=0, init=False)
    turns_used: int = field(default=0, init=False)
    draws_used: int = field(default=0, init=False)
    next_required: int = field(default=0, init=False)
    completed: bool = field(default=False, init=False)
    end_reason: str | None = field(default=None, init=False)
    evaluation: Evaluation | None = field(default=None, init=False)
    time_used: float = field(default=0.0, init=False)  # seconds of calls (failure processes' latency)
    # Called with the episode once it ends (an HTTP executor writes the episode's call-log rows then).
    end_listeners: list[Callable[[Episode], object]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        names, dependency_ids, error_codes, mask = registry_tables(self.registry)
        n = len(names)
        # Hot-path constants (the config is frozen; the registry is read-only).
        rules = self.config.rules
        self._names, self._dependency_ids, self._error_codes, self._n_tools = names, dependency_ids, error_codes, n
        self._fresh_mask = mask
        self._rules, self._turn_limit = rules, rules.turn_limit
        # No failure termination is possible while consecutive failures are below both limits (a same-tool
        # streak never exceeds the consecutive failures).
        self._end_check_from = min(rules.max_consecutive_failures, rules.max_same_tool_failures)
        self._strict, self._training = rules.strict_dependencies, rules.profile == "training"
        self._probabilities = probability_memo(self.config.failure)
        self._calls_end = self._turn_limit  # the turn after which no call is possible (earlier out of time)
        self._bases: tuple[float, ...] | None = None  # per-tool base success (processes.tool_base_success)
        processes = self.config.processes
        self._processes = processes if processes.active else None
        self._no_time = None if self._processes is None else 0.0  # the duration of a call answered at once
        if self._processes is not None and processes.tool_base_success:
            self._bases = tool_bases(processes, self.config.failure, self.registry)
        self._memo = self._probabilities if self._bases is None and not self._training else None
        self._set_task()
        self._begin()

    def _set_task(self) -> None:
        """The task's tables (shared per task object, read-only)."""
        self.required, self.required_position, _, self.max_calls = task_tables(self.task, self.registry)

    def _begin(self) -> None:
        """The state an episode starts from that depends on its seed or changes during the episode: every
        mutable object is new here (``start`` copies the rest from a prototype)."""
        n = self._n_tools
        self.action_mask = self._fresh_mask.copy()
        self.calls = [0] * n
        self.status = [NOT_ATTEMPTED] * n
        self.succeeded = [False] * n
        self.trace = []
        self.end_listeners = []
        self._key = rs.key(self.seed)
        self._stream: np.ndarray | None = None  # set once ``stream`` is read or replaced
        if self._processes is not None:
            self._down: list[bool | None] = [None] * n  # outages: whether each tool's last call found it down
            self._blocked_until = [0] * n  # rate limits: the last turn in which each tool's calls are refused
            self._stage_keys = stage_keys(self._key)

    @classmethod
    def start(
        cls,
        task: Task,
        seed: int | None = None,
        config: WorldConfig | None = None,
        registry: ToolRegistry | None = None,
        success_rate: float = 0.0,
    ) -> Episode:
        """Begin an episode; its whole random stream comes from ``seed`` (an int, taken modulo 2**64;
        None: OS entropy).

        The same episode as ``Episode(task, config, registry, seed, success_rate)``, built faster: what
        depends only on (config, registry) is copied from a prototype episode that the constructor made
        once, then the task's tables and a fresh ``_begin`` state are set."""
        seed = secrets.randbits(64) if seed is None else int(seed) & rs.M64
        config = config or WorldConfig()
        registry = registry or default_registry()
        episode = cls.__new__(cls)
        fields = _prototype(cls, task, config, registry).copy()
        fields["task"], fields["seed"], fields["success_rate"] = task, seed, success_rate
        episode.__dict__ = fields
        episode._set_task()
        episode._begin()
        return episode

    @property
    def stream(self) -> np.ndarray:
        """The episode's draws as a (turn limit, 2) array, ``draw_stream(seed, turn limit)``. Reading it
        fixes it: the episode then draws from this array, so writing into it (or assigning another
        array) changes what later calls draw; the bounds and their tests branch episodes that way."""
        if self._stream is None:
            self._stream = draw_stream(self.seed, self._turn_limit)
        return self._stream

    @stream.setter
    def stream(self, value: np.ndarray) -> None:
        self._stream = value

    # --- queries -------------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    @property
    def turns_left(self) -> int:
        """Calls still possible: the turns left, 0 once the time budget is spent."""
        return self._calls_end - self.turns_used

    @property
    def processes_on(self) -> bool:
        """Whether the world's failure processes are on (``config.processes``)."""
        return self._processes is not None

    @property
    def time_left(self) -> float | None:
        """Seconds left of the time budget (None: no budget)."""
        budget = self.config.processes.time_budget_seconds
        return None if budget is None else max(budget - self.time_used, 0.0)

    def tool_state(self, tool: int) -> ToolState:
        """The failure processes' state of ``tool`` for a call now (``resilibench.core.processes``)."""
        if self._processes is None:
            return ToolState()
        return ToolState(self._down[tool], max(self._blocked_until[tool] - self.turns_used, 0))

    def process_state(self) -> tuple[tuple[bool | None, ...], tuple[int, ...]]:
        """Every tool's ``tool_state`` at once, as two tuples: whether its last call found it down, and the
        coming turns in which its calls are refused (one pass, for memo keys and observations)."""
        n = self._n_tools
        if self._processes is None:
            return (None,) * n, (0,) * n
        turn = self.turns_used
        return tuple(self._down), tuple(until - turn if until > turn else 0 for until in self._blocked_until)

    def unmet_dependencies(self, tool: int) -> tuple[int, ...]:
        succeeded = self.succeeded
        return tuple(d for d in self._dependency_ids[tool] if not succeeded[d])

    def probability(self, tool: int) -> float:
        """Success probability of calling ``tool`` now (before strict-dependency checks)."""
        deps = self._dependency_ids[tool]
        if self._training:
            tr = self.config.training
            n_unmet = sum(1 for d in deps if not self.succeeded[d])
            semantic = tr.semantic_factor_range[1] if tool in self.required_position else tr.semantic_factor_range[0]
            p = (tr.base_success(self.success_rate) * tr.dependency_factor**n_unmet
                 * tr.retry_factor ** self.calls[tool] * semantic)
            return min(1.0, p)
        key = self.covariates(tool)
        if self._bases is not None:
            return float(success_probability(self._bases[tool], *key, self.config.failure))
        p = self._probabilities.get(key)
        if p is None:  # memo of success_probability, shared by every episode with this failure model
            fm = self.config.failure
            p = self._probabilities[key] = success_probability(fm.base_success, *key, fm)
        return p

    def covariates(self, tool: int) -> tuple[int, int, int]:
        """(N_u, N_f, N_h) of a call of ``tool`` now: its dependencies never called, its dependencies whose
        calls all failed, and the episode's failed calls so far (the success formula's inputs; call logs
        record them so the formula can be fitted to real calls)."""
        n_uncalled = n_failed = 0
        deps = self._dependency_ids[tool]
        if deps:
            calls, succeeded = self.calls, self.succeeded
            for d in deps:
                if calls[d] == 0:
                    n_uncalled += 1
                elif not succeeded[d]:
                    n_failed += 1
        return n_uncalled, n_failed, self.n_failures

    def legal_tools(self) -> np.ndarray:
        """Planner-env legality per tool (int8): not yet succeeded, under the call cap, a turn left, running.
        ``action_mask`` holds the same with the completion signal appended."""
        return self.action_mask[:-1]

    @property
    def progress(self) -> float:
        """Share of required tools that have succeeded."""
        if not self.required:
            return 1.0
        succeeded = self.succeeded
        return sum(succeeded[t] for t in self.required) / len(self.required)

    # --- actions -------------------------------------------------------------------------------------

    def spend_turn(self) -> None:
        """Use one turn without a tool call (the text env's search and info messages)."""
        self._require_running()
        self._use_turn()

    def call(self, tool: int | str, invalid_input: bool = False,
             outcome: Callable[[int], tuple] | None = None) -> CallRecord:
        """Call a tool: costs one turn; draws from the stream unless answered without a draw.

        ``invalid_input=True`` says the front end found the call's arguments invalid (its schema check):
        the call then fails with INVALID_INPUT without a draw and counts like any failed call.
        ``outcome``: the real-API mode. Where the simulator would draw, ``outcome(tool_id)`` is called
        instead (it performs the real call) and its (success, error code[, duration s[, rate-limit wait
        in turns]]) is recorded; the record's probability is then None. With failure processes on, the
        duration counts against the time budget as a simulated call's does. Every rule that answers without a draw (replay, call cap, invalid
        input, strict dependencies) still answers without calling it."""
        if self.end_reason is not None:
            self._require_running()
        tool_id = tool if type(tool) is int else self.registry.id_of(tool) if isinstance(tool, str) else int(tool)
        if not 0 <= tool_id < self._n_tools:
            raise ValueError(f"tool id must be in [0, {self._n_tools}), got {tool_id}")
        turn = self.turns_used + 1  # _use_turn, inlined
        if turn > self._calls_end:
            self._use_turn()  # raises
        self.turns_used = turn
        if turn == self._turn_limit:
            self.action_mask[:-1] = 0
        name = self._names[tool_id]
        succeeded = self.succeeded
        if succeeded[tool_id]:  # already done: the earlier result, no draw, no failure
            record = _new_record(CallRecord, (name, True, None, turn, None, (), True, self._no_time, None))
            self.trace.append(record)
            return record
        calls = self.calls
        if calls[tool_id] >= self.max_calls:
            return self._record_failure(tool_id, CallRecord(name, False, RETRY_LIMIT_ERROR, turn, None, (), False,
                                                            self._no_time))
        if invalid_input:
            calls[tool_id] += 1
            return self._record_failure(tool_id, CallRecord(name, False, INVALID_INPUT, turn, None, (), False,
                                                            self._no_time))
        deps = self._dependency_ids[tool_id]
        unmet_names = tuple([self._names[d] for d in deps if not succeeded[d]]) if deps else ()
        if unmet_names and self._strict:
            calls[tool_id] += 1
            record = CallRecord(name, False, DEPENDENCY_ERROR, turn, None, unmet_names, False, self._no_time)
            return self._record_failure(tool_id, record, dependency_problem=True)
        if outcome is not None:
            calls[tool_id] += 1
            success, code, *timing = outcome(tool_id)
            duration, retry_after = (timing + [None, None])[:2] if self._processes is not None else (None, None)
            if duration is not None:
                self._spend_time(turn, duration)
            record = CallRecord(name, success, None if success else code, turn, None, unmet_names, False,
                                self._no_time if duration is None else duration, retry_after)
            if success:
                self.trace.append(record)
                self._record_success(tool_id)
                return record
            return self._record_failure(tool_id, record, dependency_problem=bool(unmet_names))
        if self._processes is not None:
            return self._call_with_processes(tool_id, turn, unmet_names)
        memo = self._memo  # the memo of ``probability`` (None where it has no memo)
        p = None if memo is None else memo.get(self.covariates(tool_id) if deps else (0, 0, self.n_failures))
        if p is None:
            p = self.probability(tool_id)
        draw = self.draws_used
        stream = self._stream
        u_success = rs.uniform(self._key, 2 * draw) if stream is None else stream.item(draw, 0)
        self.draws_used = draw + 1
        calls[tool_id] += 1
        if u_success < p:
            record = _new_record(CallRecord, (name, True, None, turn, p, unmet_names, False, None, None))
            self.trace.append(record)
            self._record_success(tool_id)
            return record
        codes = self._error_codes[tool_id]
        u_code = rs.uniform(self._key, 2 * draw + 1) if stream is None else stream.item(draw, 1)
        code = codes[min(int(u_code * len(codes)), len(codes) - 1)]
        record = _new_record(CallRecord, (name, False, code, turn, p, unmet_names, False, None, None))
        return self._record_failure(tool_id, record, dependency_problem=bool(unmet_names))

    def finish(self) -> Evaluation:
        """Signal completion (free of turns) and evaluate."""
        self._require_running()
        self.completed = True
        return self._end(FINISHED)

    def end_out_of_turns(self) -> Evaluation:
        """End without a completion signal because the agent went on past its turns (or its time budget:
        the end reason is then ``out_of_time``)."""
        self._require_running()
        return self._end(OUT_OF_TIME if self._calls_end < self._turn_limit else OUT_OF_TURNS)

    # --- internals -----------------------------------------------------------------------------------

    def _require_running(self) -> None:
        if self.end_reason is not None:
            raise RuntimeError(f"episode already ended ({self.end_reason}); start a new one")

    def _use_turn(self) -> None:
        if self.turns_used >= self._calls_end:
            spent = (f"the time budget is spent ({self.time_used:g} s)" if self._calls_end < self._turn_limit
                     else f"no turns left (limit {self._turn_limit})")
            raise RuntimeError(f"{spent}; only finishing is possible")
        self.turns_used += 1
        if self.turns_used == self._turn_limit:
            self.action_mask[:-1] = 0

    def _spend_time(self, turn: int, duration: float) -> None:
        """Add a call's duration to the time used; a spent budget allows no further call."""
        self.time_used += duration
        budget = self.config.processes.time_budget_seconds
        if budget is not None and self.time_used >= budget and turn < self._turn_limit:
            self._calls_end = turn
            self.action_mask[:-1] = 0

    def _call_with_processes(self, tool: int, turn: int, unmet_names: tuple[str, ...]) -> CallRecord:
        """A call that reaches the draw point in a world with failure processes: the branch of
        ``call_outcomes`` that this turn's draws select (``sample_outcome``), then its record."""
        draw = self.draws_used
        p = self.probability(tool)
        state = ToolState(self._down[tool], max(self._blocked_until[tool] - turn + 1, 0))  # turn is under way
        uniform = call_uniforms(self._key, self._stage_keys, turn, draw, self._stream)
        outcome: CallOutcome = sample_outcome(self.config.processes, state, p, self._error_codes[tool], uniform)
        if outcome.drew:
            self.draws_used = draw + 1
        self.calls[tool] += 1
        self._down[tool] = outcome.state.down
        self._blocked_until[tool] = turn + outcome.state.blocked
        self._spend_time(turn, outcome.duration)
        record = CallRecord(self._names[tool], outcome.success, outcome.error_code, turn,
                            p if outcome.drew else None, unmet_names, False, outcome.duration, outcome.retry_after)
        if outcome.success:
            self.trace.append(record)
            self._record_success(tool)
            return record
        return self._record_failure(tool, record, dependency_problem=bool(unmet_names))

    def _record_success(self, tool: int) -> None:
        self.action_mask[tool] = 0
        self.succeeded[tool] = True
        self.status[tool] = SUCCESS
        self.consecutive_failures = 0
        self.last_tool, self.same_tool_streak = tool, 0
        if tool in self.required_position:
            required, succeeded, k = self.required, self.succeeded, self.next_required
            while k < len(required) and succeeded[required[k]]:
                k += 1
            self.next_required = k

    def _record_failure(self, tool: int, record: CallRecord, dependency_problem: bool = False) -> CallRecord:
        self.trace.append(record)
        if self.calls[tool] >= self.max_calls:
            self.action_mask[tool] = 0
        self.status[tool] = DEPENDENCY_FAILED if dependency_problem else FAILED
        self.n_failures += 1
        self.consecutive_failures += 1
        self.same_tool_streak = self.same_tool_streak + 1 if tool == self.last_tool else 1
        self.last_tool = tool
        if self.consecutive_failures >= self._end_check_from:
            reason = END_REASONS[termination_code(self.consecutive_failures, self.same_tool_streak, self._rules)]
            if reason is not None:
                self._end(reason)
        return record

    def _end(self, reason: str) -> Evaluation:
        self.action_mask.fill(0)
        self.end_reason = reason
        self.evaluation = evaluate(self.task, self.trace, self.completed, reason, self.config.evaluator,
                                   self.registry)
        for listener in self.end_listeners:
            listener(self)
        return self.evaluation
