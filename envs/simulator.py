"""The seeded tool simulator: one ``Episode`` holds the state of one task attempt under the world's rules.

Every front end (planner env, text env, MCP server, harness) drives an ``Episode``; the batched vector
env applies the same rule functions (``success_probability``, ``termination_reason``) to arrays. The
episode pre-draws its uniform stream (two numbers per possible draw: success, error code), so a run is
reproducible from its seed and the clairvoyant bound can read the same stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from resilibench.envs.config import WorldConfig
from resilibench.envs.evaluator import Evaluation, evaluate
from resilibench.envs.registry import DEPENDENCY_ERROR, ToolRegistry, default_registry
from resilibench.envs.tasks import Task

RETRY_LIMIT_ERROR = "RETRY_LIMIT_EXCEEDED"

# Tool status codes shared by observations and traces.
NOT_ATTEMPTED, SUCCESS, FAILED, DEPENDENCY_FAILED = 0, 1, 2, 3
STATUS_NAMES = ("NOT_ATTEMPTED", "SUCCESS", "FAILED", "DEPENDENCY_FAILED")

# Why an episode ended.
FINISHED, OUT_OF_TURNS, CONSECUTIVE_FAILURES, REPETITION_LOOP = (
    "finished",
    "out_of_turns",
    "consecutive_failures",
    "repetition_loop",
)


def success_probability(base, n_uncalled, n_failed, n_history, failure_model):
    """SPEC 2 success formula; works on scalars and numpy arrays alike."""
    fm = failure_model
    return (
        base
        * fm.uncalled_dependency_factor**n_uncalled
        * fm.failed_dependency_factor**n_failed
        * fm.failure_history_factor**n_history
    )


def termination_reason(consecutive_failures: int, same_tool_streak: int, rules) -> str | None:
    """The failure-termination rule of SPEC 2b, or None while the episode may go on."""
    if consecutive_failures >= rules.max_consecutive_failures:
        return CONSECUTIVE_FAILURES
    if same_tool_streak >= rules.max_same_tool_failures:
        return REPETITION_LOOP
    return None


def draw_stream(rng: np.random.Generator, turn_limit: int) -> np.ndarray:
    """The episode's uniform stream: row i = (success draw, error-code draw) of the i-th draw."""
    return rng.random((turn_limit, 2))


def episode_seed(np_random: np.random.Generator) -> int:
    """The seed of the next episode drawn from an env's generator (the same rule in every front end)."""
    return int(np_random.integers(2**63 - 1))


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One tool call in a trace."""

    tool: str
    success: bool
    error_code: str | None
    turn: int
    probability: float | None  # None when no draw was made (replay, dependency or retry-limit error)
    unmet_dependencies: tuple[str, ...] = ()
    replayed: bool = False

    def to_dict(self) -> dict:
        return {
            "tool": self.tool,
            "success": self.success,
            "error_code": self.error_code,
            "turn": self.turn,
            "probability": self.probability,
            "unmet_dependencies": list(self.unmet_dependencies),
            "replayed": self.replayed,
        }


@dataclass
class Episode:
    """State of one attempt at one task. Create with ``Episode.start``; act with ``call`` and ``finish``."""

    task: Task
    config: WorldConfig
    registry: ToolRegistry
    stream: np.ndarray
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

    def __post_init__(self) -> None:
        n = len(self.registry)
        self.action_mask = np.ones(n + 1, dtype=np.int8)  # tools, then the completion signal
        self.calls = [0] * n
        self.status = [NOT_ATTEMPTED] * n
        self.succeeded = [False] * n
        self.required = self.task.required_ids(self.registry)
        self.required_position = {t: i for i, t in enumerate(self.required)}
        self.max_calls = 1 + self.task.max_retries

    @classmethod
    def start(
        cls,
        task: Task,
        seed: int | np.random.Generator | None = None,
        config: WorldConfig | None = None,
        registry: ToolRegistry | None = None,
        success_rate: float = 0.0,
    ) -> Episode:
        """Begin an episode; its whole random stream comes from ``seed``."""
        config = config or WorldConfig()
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        return cls(task, config, registry or default_registry(), draw_stream(rng, config.rules.turn_limit),
                   success_rate)

    # --- queries -------------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    @property
    def turns_left(self) -> int:
        return self.config.rules.turn_limit - self.turns_used

    def unmet_dependencies(self, tool: int) -> tuple[int, ...]:
        return tuple(d for d in self.registry.dependency_ids[tool] if not self.succeeded[d])

    def probability(self, tool: int) -> float:
        """Success probability of calling ``tool`` now (before strict-dependency checks)."""
        deps = self.registry.dependency_ids[tool]
        if self.config.rules.profile == "training":
            tr = self.config.training
            n_unmet = sum(1 for d in deps if not self.succeeded[d])
            semantic = tr.semantic_factor_range[1] if tool in self.required_position else tr.semantic_factor_range[0]
            p = (tr.base_success(self.success_rate) * tr.dependency_factor**n_unmet
                 * tr.retry_factor ** self.calls[tool] * semantic)
            return min(1.0, p)
        n_uncalled = sum(1 for d in deps if self.calls[d] == 0)
        n_failed = sum(1 for d in deps if self.calls[d] and not self.succeeded[d])
        fm = self.config.failure
        return success_probability(fm.base_success, n_uncalled, n_failed, self.n_failures, fm)

    def legal_tools(self) -> np.ndarray:
        """Planner-env legality per tool (int8): not yet succeeded, under the call cap, a turn left, running.
        ``action_mask`` holds the same with the completion signal appended."""
        return self.action_mask[:-1]

    @property
    def progress(self) -> float:
        """Share of required tools that have succeeded."""
        if not self.required:
            return 1.0
        return sum(self.succeeded[t] for t in self.required) / len(self.required)

    # --- actions -------------------------------------------------------------------------------------

    def spend_turn(self) -> None:
        """Use one turn without a tool call (the text env's search and info messages)."""
        self._require_running()
        self._use_turn()

    def call(self, tool: int | str) -> CallRecord:
        """Call a tool: costs one turn; draws from the stream unless answered without a draw."""
        self._require_running()
        tool_id = self.registry.id_of(tool) if isinstance(tool, str) else int(tool)
        if not 0 <= tool_id < len(self.registry):
            raise ValueError(f"tool id must be in [0, {len(self.registry)}), got {tool_id}")
        self._use_turn()
        name = self.registry.names[tool_id]
        if self.succeeded[tool_id]:  # already done: the earlier result, no draw, no failure
            record = CallRecord(name, True, None, self.turns_used, None, replayed=True)
            self.trace.append(record)
            return record
        if self.calls[tool_id] >= self.max_calls:
            return self._record_failure(tool_id, CallRecord(name, False, RETRY_LIMIT_ERROR, self.turns_used, None))
        unmet = self.unmet_dependencies(tool_id)
        unmet_names = tuple(self.registry.names[d] for d in unmet)
        if unmet and self.config.rules.strict_dependencies:
            record = CallRecord(name, False, DEPENDENCY_ERROR, self.turns_used, None, unmet_names)
            self.calls[tool_id] += 1
            return self._record_failure(tool_id, record, dependency_problem=True)
        p = self.probability(tool_id)
        u_success, u_error = self.stream[self.draws_used]
        self.draws_used += 1
        self.calls[tool_id] += 1
        if u_success < p:
            record = CallRecord(name, True, None, self.turns_used, p, unmet_names)
            self.trace.append(record)
            self._record_success(tool_id)
            return record
        codes = self.registry.tools[tool_id].error_codes
        code = codes[min(int(u_error * len(codes)), len(codes) - 1)]
        record = CallRecord(name, False, code, self.turns_used, p, unmet_names)
        return self._record_failure(tool_id, record, dependency_problem=bool(unmet))

    def finish(self) -> Evaluation:
        """Signal completion (free of turns) and evaluate."""
        self._require_running()
        self.completed = True
        return self._end(FINISHED)

    def end_out_of_turns(self) -> Evaluation:
        """End without a completion signal because the agent went on past its turns."""
        self._require_running()
        return self._end(OUT_OF_TURNS)

    # --- internals -----------------------------------------------------------------------------------

    def _require_running(self) -> None:
        if self.done:
            raise RuntimeError(f"episode already ended ({self.end_reason}); start a new one")

    def _use_turn(self) -> None:
        if self.turns_used >= self.config.rules.turn_limit:
            raise RuntimeError(f"no turns left (limit {self.config.rules.turn_limit}); only finishing is possible")
        self.turns_used += 1
        if self.turns_used == self.config.rules.turn_limit:
            self.action_mask[:-1] = 0

    def _record_success(self, tool: int) -> None:
        self.action_mask[tool] = 0
        self.succeeded[tool] = True
        self.status[tool] = SUCCESS
        self.consecutive_failures = 0
        self.last_tool, self.same_tool_streak = tool, 0
        if tool in self.required_position:
            while self.next_required < len(self.required) and self.succeeded[self.required[self.next_required]]:
                self.next_required += 1

    def _record_failure(self, tool: int, record: CallRecord, dependency_problem: bool = False) -> CallRecord:
        self.trace.append(record)
        if self.calls[tool] >= self.max_calls:
            self.action_mask[tool] = 0
        self.status[tool] = DEPENDENCY_FAILED if dependency_problem else FAILED
        self.n_failures += 1
        self.consecutive_failures += 1
        self.same_tool_streak = self.same_tool_streak + 1 if tool == self.last_tool else 1
        self.last_tool = tool
        reason = termination_reason(self.consecutive_failures, self.same_tool_streak, self.config.rules)
        if reason is not None:
            self._end(reason)
        return record

    def _end(self, reason: str) -> Evaluation:
        self.action_mask[:] = 0
        self.end_reason = reason
        self.evaluation = evaluate(self.task, self.trace, self.completed, reason, self.config.evaluator,
                                   self.registry)
        return self.evaluation
