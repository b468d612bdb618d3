"""The failure processes of one tool call, written once (docs/core/processes.md).

``call_outcomes`` lists the branches of one call, (probability, ``CallOutcome``), from the tool's process
state (``ToolState``) and the success formula's probability; the simulator's ``Episode`` samples a call
with ``sample_outcome``, which walks the same stages and takes the branch its uniform draws select, so
enumerating the branches (bound (iii), calibration) is exact for the simulator. The stages, in order:

1. rate-limit block: a tool refused within the last ``rate_limit_wait`` turns is refused again
   (RATE_LIMIT_ERROR, no draw);
2. rate-limit draw: refused with ``rate_limit_probability`` (the block starts);
3. outage draw: the tool is down (SERVICE_UNAVAILABLE) with the two-state chain's probability: at its
   first call of the episode the stationary start / (start + end), then start after an up call and
   1 - end after a down call. A rate-limited call does not reach the service and leaves the chain as is;
4. latency draw: a duration from the latency distribution; longer than the call timeout: TIMEOUT,
   costing the timeout;
5. the success formula's draw, and the error-code draw on failure (uniform over the tool's codes).

A stage whose process is off is skipped without a draw. Each stage's uniform comes from its own stream
(``STAGE_STREAMS``, ``resilibench.core.stream.subkey``), so with every process off the draws are v1's.
"""

from __future__ import annotations

__all__ = [
    "RATE_LIMIT_ERROR", "SERVICE_UNAVAILABLE", "TIMEOUT", "STAGE_RATE", "STAGE_OUTAGE", "STAGE_LATENCY",
    "STAGE_SUCCESS", "STAGE_CODE", "STAGE_STREAMS", "ToolState", "FRESH", "CallOutcome", "Pick",
    "down_probability", "latency_probabilities", "call_outcomes", "select", "sample_outcome", "tool_bases",
]

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from resilibench.errors import ConfigError

from .config import FailureModel, FailureProcesses
from .registry import ToolRegistry

RATE_LIMIT_ERROR, SERVICE_UNAVAILABLE, TIMEOUT = "RATE_LIMIT_ERROR", "SERVICE_UNAVAILABLE", "TIMEOUT"

# Stages that draw, in order; the first three draw from their own streams (``subkey(key(seed), tag)``),
# indexed by the call's turn - 1; STAGE_SUCCESS and STAGE_CODE are the success formula's draws of the v1 stream.
STAGE_RATE, STAGE_OUTAGE, STAGE_LATENCY, STAGE_SUCCESS, STAGE_CODE = "rate", "outage", "latency", "success", "code"
STAGE_STREAMS = {STAGE_RATE: 1, STAGE_OUTAGE: 2, STAGE_LATENCY: 3}


class ToolState(NamedTuple):
    """The process state of one tool between its calls."""

    down: bool | None = None  # outages: whether its last call found it down (None: not called yet)
    blocked: int = 0  # rate limits: coming turns (from the next one) in which its calls are refused


FRESH = ToolState()


class CallOutcome(NamedTuple):
    """What one call gives: the outcome, its duration, the tool's state after it, and whether the success
    formula was drawn (else a process decided the call)."""

    success: bool
    error_code: str | None
    duration: float
    state: ToolState
    drew: bool

    @property
    def retry_after(self) -> int | None:
        """For a rate-limit refusal, the turns to let pass before the tool takes calls again; else None."""
        return self.state.blocked if self.error_code == RATE_LIMIT_ERROR else None


# pick(stage, probabilities) -> the (option index, probability) pairs taken at that stage.
Pick = Callable[[str, Sequence[float]], Iterable[tuple[int, float]]]


def down_probability(processes: FailureProcesses, down: bool | None) -> float:
    """P that a call finds the tool down, given whether its last call did (None: its first call)."""
    start, end = processes.outage_start, processes.outage_end
    if down is None:
        return start / (start + end)
    return 1.0 - end if down else start


def latency_probabilities(processes: FailureProcesses) -> tuple[float, ...]:
    """The latency weights normalised to probabilities."""
    total = sum(processes.latency_weights)
    return tuple(w / total for w in processes.latency_weights)


def _walk(processes: FailureProcesses, state: ToolState, p: float, codes: Sequence[str],
          pick: Pick) -> list[tuple[float, CallOutcome]]:
    """The stages of one call (module docstring), taking at each the options ``pick`` returns."""
    if state.blocked > 0:
        return [(1.0, CallOutcome(False, RATE_LIMIT_ERROR, 0.0, state._replace(blocked=state.blocked - 1), False))]
    q = processes.rate_limit_probability
    if q > 0.0:
        branches = []
        for option, weight in pick(STAGE_RATE, (q, 1.0 - q)):
            if option == 0:
                refused = state._replace(blocked=processes.rate_limit_wait)
                branches.append((weight, CallOutcome(False, RATE_LIMIT_ERROR, 0.0, refused, False)))
            else:
                branches += [(weight * w, o) for w, o in _served(processes, state, p, codes, pick)]
        return branches
    return _served(processes, state, p, codes, pick)


def _served(processes: FailureProcesses, state: ToolState, p: float, codes: Sequence[str],
            pick: Pick) -> list[tuple[float, CallOutcome]]:
    """Stages 3-5: a call that reached the service."""
    if processes.outage_start > 0.0:
        down = down_probability(processes, state.down)
        branches = []
        for option, weight in pick(STAGE_OUTAGE, (down, 1.0 - down)):
            if option == 0:
                branches.append((weight, CallOutcome(False, SERVICE_UNAVAILABLE, 0.0, ToolState(True, 0), False)))
            else:
                branches += [(weight * w, o) for w, o in _timed(processes, ToolState(False, 0), p, codes, pick)]
        return branches
    return _timed(processes, state, p, codes, pick)


def _timed(processes: FailureProcesses, state: ToolState, p: float, codes: Sequence[str],
           pick: Pick) -> list[tuple[float, CallOutcome]]:
    """Stages 4-5: the call's duration, then the success formula."""
    if not processes.latency_seconds:
        return _drawn(0.0, state, p, codes, pick)
    timeout, branches = processes.call_timeout_seconds, []
    for option, weight in pick(STAGE_LATENCY, latency_probabilities(processes)):
        duration = processes.latency_seconds[option]
        if timeout is not None and duration > timeout:
            branches.append((weight, CallOutcome(False, TIMEOUT, timeout, state, False)))
        else:
            branches += [(weight * w, o) for w, o in _drawn(duration, state, p, codes, pick)]
    return branches


def _drawn(duration: float, state: ToolState, p: float, codes: Sequence[str],
           pick: Pick) -> list[tuple[float, CallOutcome]]:
    """Stage 5: the success formula's draw, then the error code's."""
    branches = []
    for option, weight in pick(STAGE_SUCCESS, (p, 1.0 - p)):
        if option == 0:
            branches.append((weight, CallOutcome(True, None, duration, state, True)))
        else:
            share = 1.0 / len(codes)
            branches += [(weight * w, CallOutcome(False, codes[i], duration, state, True))
                         for i, w in pick(STAGE_CODE, (share,) * len(codes))]
    return branches


def _every_option(stage: str, probabilities: Sequence[float]) -> list[tuple[int, float]]:
    return [(i, q) for i, q in enumerate(probabilities) if q > 0.0]


def call_outcomes(processes: FailureProcesses, state: ToolState, p: float,
                  codes: Sequence[str]) -> list[tuple[float, CallOutcome]]:
    """Every branch (probability, outcome) of one call of a tool in process state ``state`` whose success
    formula gives ``p`` and whose error codes are ``codes`` (pass one code to merge the failures of the
    formula into one branch). Branches of probability 0 are left out; the probabilities sum to 1."""
    return _walk(processes, state, p, codes, _every_option)


def select(stage: str, u: float, probabilities: Sequence[float]) -> int:
    """The option a uniform draw ``u`` selects at ``stage``: the first whose cumulative probability exceeds
    ``u`` (for STAGE_SUCCESS: success when ``u < p``, as in v1); for STAGE_CODE, ``int(u * n)`` (v1's code draw)."""
    n = len(probabilities)
    if stage == STAGE_CODE:
        return min(int(u * n), n - 1)
    total = 0.0
    for i, q in enumerate(probabilities[:-1]):
        total += q
        if u < total:
            return i
    return n - 1


def sample_outcome(processes: FailureProcesses, state: ToolState, p: float, codes: Sequence[str],
                   draw: Callable[[str], float]) -> CallOutcome:
    """The branch of ``call_outcomes`` that the uniform draws select; ``draw(stage)`` is the uniform of a
    stage, read only when the call reaches it."""
    [(_, outcome)] = _walk(processes, state, p, codes,
                           lambda stage, probabilities: ((select(stage, draw(stage), probabilities), 1.0),))
    return outcome


def tool_bases(processes: FailureProcesses, failure: FailureModel, registry: ToolRegistry) -> tuple[float, ...]:
    """The base success of each tool (registry order): ``processes.tool_base_success`` for the tools it
    names, ``failure.base_success`` for the others; ConfigError for a name the registry lacks."""
    unknown = sorted(set(processes.tool_base_success) - set(registry.names))
    if unknown:
        raise ConfigError("processes.tool_base_success", f"processes.tool_base_success names unknown tool(s) "
                          f"{unknown}; accepted: the registry's tool names ({registry.names[0]}, ...)")
    return tuple(processes.tool_base_success.get(name, failure.base_success) for name in registry.names)
