"""Failure calibration: the world's failure model fitted to a call log by maximum likelihood.

``fit_failures(rows)`` reads the calls of a log (``resilibench.envs.real_api.call_log``) that drew their outcome
(replays of a succeeded tool and the rules that answer without a draw are left out) and fits the B.3
success formula ``p = base * uncalled**N_u * failed**N_f * history**N_h`` to their covariates and
outcomes, optionally with a base per tool (``processes.tool_base_success``) and the failure processes
(``PROCESS_OPTIONS``). With processes, a call's likelihood is the sum of the simulator's own branches
(``processes.call_outcomes``) that show what the row shows, the outage state summed out by a forward pass
over each (episode, tool) sequence (``_ProcessModel``). ``log_likelihood(rows, config)`` evaluates it for
a given world.

Every fitted parameter is a probability: L-BFGS-B first on the logit scale, then within [0, 1] where
estimates at a bound converge. Intervals: Wald intervals on the logit scale from the observed Fisher
information (the numerical Hessian at the optimum), mapped back into (0, 1); an estimate at 0 or 1 (no
Fisher information there) gets a one-sided profile-likelihood interval with the boundary cut-off (the
chi-square(1) quantile at 1 - 2 * (1 - level)). A parameter informed by fewer than ``min_rows`` calls, or
with a flat likelihood, is not identified: it keeps its default and the report says so.

Goodness of fit (``FitTest``): predicted against observed successes by bins of predicted probability
(Hosmer-Lemeshow), by tool among the tools that share one base, and the error codes' frequencies among
failures; each a chi-square statistic with its p-value (docs/envs/real_apis.md, "Calibrating the failure
model").
"""

from __future__ import annotations

__all__ = [
    "DRAWLESS_CODES", "FACTORS", "COVARIATES", "EDGE", "ROUGH_LOGIT", "IMPOSSIBLE", "MIN_EXPECTED",
    "Estimate", "FitTest", "FailureFit", "drawing_calls", "PROCESS_OPTIONS", "ANY", "MAX_GRID",
    "in_world_terms", "log_likelihood", "log_registry", "fit_failures", "calibrate",
]

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize, stats
from scipy.special import expit, logit

from resilibench.console import format_table
from resilibench.errors import InputError

from ...core.config import FailureModel, FailureProcesses, WorldConfig
from ...core.processes import (
    RATE_LIMIT_ERROR,
    SERVICE_UNAVAILABLE,
    TIMEOUT,
    CallOutcome,
    ToolState,
    call_outcomes,
)
from ...core.registry import DEPENDENCY_ERROR, ToolRegistry, default_registry
from ...core.simulator import RETRY_LIMIT_ERROR
from .call_log import CallLogRow, read_rows
from .live_apis import live_tool

# Codes that rules give without a draw: they carry no information on the failure model.
DRAWLESS_CODES = (RETRY_LIMIT_ERROR, DEPENDENCY_ERROR)
FACTORS = ("uncalled_dependency_factor", "failed_dependency_factor", "failure_history_factor")
COVARIATES = ("n_uncalled", "n_failed", "n_history")
EDGE = 1e-9  # the optimiser keeps probabilities this far inside [0, 1]; an estimate at it lies at the bound
ROUGH_LOGIT = 12.0  # the first stage of the optimiser stays within these logits
IMPOSSIBLE = 1e300  # the objective where the log likelihood is -inf
MIN_EXPECTED = 5.0  # goodness-of-fit bins are merged until each expects this many of each outcome


@dataclass(frozen=True)
class Estimate:
    """One fitted parameter: its world-config name, estimate and interval (None when not identified)."""

    name: str  # dotted config name: "failure.base_success", "processes.tool_base_success.<tool>"
    value: float  # the estimate, or the default kept when not identified
    low: float | None
    high: float | None
    calls: int  # calls that inform it
    identified: bool
    method: str  # "fisher-logit", "profile" (at a bound; latency weights), "read" (from the log) or "default"
    note: str = ""


@dataclass(frozen=True)
class FitTest:
    """A goodness-of-fit check: ``groups`` rows are (label, calls, observed, expected)."""

    name: str
    statistic: float | None
    df: int
    p_value: float | None  # None: too few groups to test
    groups: tuple[tuple[str, int, float, float], ...]

    def passed(self, alpha: float) -> bool | None:
        return None if self.p_value is None else self.p_value >= alpha


@dataclass(frozen=True)
class FailureFit:
    """The result of ``fit_failures``: estimates, goodness-of-fit tests and what the log held."""

    estimates: tuple[Estimate, ...]
    tests: tuple[FitTest, ...]
    level: float
    rows: int  # rows read
    calls: int  # rows that drew their outcome (the fit's data)
    episodes: int
    log_likelihood: float
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)  # processes values read, not fitted

    def estimate(self, name: str) -> Estimate:
        return next(e for e in self.estimates if e.name == name)

    def config(self) -> dict[str, Any]:
        """The world-config sections of the identified estimates, each rounded to the digits its interval
        supports (``load_config`` reads it; missing fields keep their defaults)."""
        settings = {k: [round(v, 4) for v in value] if isinstance(value, tuple) else value
                    for k, value in self.settings.items()}
        sections: dict[str, Any] = {"processes": settings} if settings else {}
        for e in self.estimates:
            if not e.identified or e.method == "read" or "[" in e.name:  # read or written with settings
                continue
            section, field, *key = e.name.split(".")
            value = _rounded(e)
            if key:
                sections.setdefault(section, {}).setdefault(field, {})[key[0]] = value
            else:
                sections.setdefault(section, {})[field] = value
        return sections

    def to_dict(self) -> dict[str, Any]:
        alpha = 1 - self.level
        data = dataclasses.asdict(self)
        for test, fit_test in zip(data["tests"], self.tests, strict=True):
            test["passed"] = fit_test.passed(alpha)
            test["groups"] = [dict(zip(("label", "calls", "observed", "expected"), g, strict=True))
                              for g in fit_test.groups]
        data["config"] = self.config()
        return data

    def table(self) -> str:
        """The estimates and the tests as plain-text tables."""
        pct = f"{self.level:.0%}"
        estimates = format_table(
            ("parameter", "estimate", f"{pct} low", f"{pct} high", "calls", "method"),
            [(e.name, e.value, e.low, e.high, e.calls, e.method + (f" ({e.note})" if e.note else ""))
             for e in self.estimates])
        alpha = 1 - self.level
        tests = format_table(
            ("goodness of fit", "chi-square", "df", "p-value", f"passes at {alpha:.2g}"),
            [(t.name, t.statistic, t.df, t.p_value, {None: "-", True: "yes", False: "NO"}[t.passed(alpha)])
             for t in self.tests])
        head = (f"{self.calls} drawing calls of {self.rows} rows, {self.episodes} episodes; "
                f"log likelihood {self.log_likelihood:.2f}")
        return "\n\n".join((head, estimates, tests))


def _rounded(estimate: Estimate) -> float:
    """The estimate to the first significant digit of its interval's half-width, plus one."""
    width = (estimate.high - estimate.low) / 2 if estimate.low is not None and estimate.high is not None else 0
    digits = 4 if width <= 0 else min(4, max(2, 1 - math.floor(math.log10(width))))
    return round(estimate.value, digits)


# --- the data ---------------------------------------------------------------------------------------------


def drawing_calls(rows: Iterable[CallLogRow], source: str = "log") -> list[CallLogRow]:
    """The rows whose outcome was drawn (the fit's data), episodes in order of first appearance and each in
    turn order: replays of a tool that already succeeded in its episode (the MCP fault proxy has none: each
    of its calls is served anew) and the rules' drawless codes are left out. Two rows of one episode with the same turn raise ``InputError`` (field ``turn``)."""
    episodes: dict[str, list[CallLogRow]] = {}
    for row in rows:
        episodes.setdefault(row.episode, []).append(row)
    calls = []
    for name, episode in episodes.items():
        episode.sort(key=lambda r: r.turn)
        succeeded: set[str] = set()
        for before, row in zip([None, *episode], episode, strict=False):
            if before is not None and before.turn == row.turn:
                raise InputError("turn", f"{source}: episode {name!r} has two rows for turn {row.turn}")
            if (row.tool in succeeded and row.source != "mcp") or row.error_code in DRAWLESS_CODES:
                continue
            if row.success:
                succeeded.add(row.tool)
            calls.append(in_world_terms(row))
    return calls


@dataclass
class _Parameter:
    name: str
    default: float
    calls: int
    free: bool


class _Model:
    """The log likelihood of the drawing calls as a function of the parameters (probabilities)."""

    def __init__(self, calls: Sequence[CallLogRow], registry: ToolRegistry, per_tool: bool, min_rows: int,
                 source: str) -> None:
        known = set(registry.names)
        for row in calls:
            if row.tool not in known:
                raise InputError("tool", f"{source}: episode {row.episode!r} turn {row.turn}: unknown tool "
                                 f"{row.tool!r}; the log's tools must be the registry's")
        self.registry = registry
        self.fixed: dict[str, Any] = {}  # process settings read from the log, not fitted (``_ProcessModel``)
        self.read: list[Estimate] = []  # their report entries
        self.tools = sorted({row.tool for row in calls})
        counts = {tool: sum(row.tool == tool for row in calls) for tool in self.tools}
        own = [tool for tool in self.tools if per_tool and counts[tool] >= min_rows]
        self.own_base = own
        # Calls with the same base, covariates and outcome count once, with their number as weight.
        group = {tool: i + 1 for i, tool in enumerate(own)}
        keys = np.array([(group.get(r.tool, 0), r.n_uncalled, r.n_failed, r.n_history, r.success) for r in calls],
                        dtype=np.int64).reshape(len(calls), 5)
        cells, self.cell_of, weight = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
        self.cell_of = self.cell_of.reshape(-1)
        self.weight = weight.astype(np.float64)
        self.base_column, self.covariates, self.success = cells[:, 0], cells[:, 1:4].astype(np.float64), cells[:, 4] == 1
        self.n_bases = 1 + len(own)
        self.tool_names = [r.tool for r in calls]
        self.codes = [r.error_code for r in calls]
        defaults = FailureModel()
        shared = int(sum(r.tool not in group for r in calls))
        self.parameters = [_Parameter("failure.base_success", defaults.base_success, shared, shared >= min_rows)]
        self.parameters += [_Parameter(f"processes.tool_base_success.{tool}", defaults.base_success,
                                       counts[tool], True) for tool in own]
        for factor, name in zip(FACTORS, COVARIATES, strict=True):
            informing = int(sum(getattr(r, name) > 0 for r in calls))
            self.parameters.append(_Parameter(f"failure.{factor}", getattr(defaults, factor), informing,
                                              informing >= min_rows))

    def success_probability(self, theta: np.ndarray) -> np.ndarray:
        """The formula's probability of each cell (``cell_of`` maps calls to cells)."""
        with np.errstate(divide="ignore"):
            log_theta = np.log(theta)
        # x * log(factor) with x = 0 is 0 even for a factor 0 (0**0 = 1 in the formula).
        log_factors = np.where(self.covariates > 0, self.covariates * log_theta[self.n_bases:], 0.0)
        return np.exp(log_theta[self.base_column] + log_factors.sum(axis=1))

    def predictive(self, theta: np.ndarray) -> tuple[list[tuple], np.ndarray]:
        """(every outcome (success, code), P(outcome) per call): failures' codes uniform over the tool's."""
        p = self.success_probability(theta)[self.cell_of]
        codes = sorted({c for t in self.tools for c in self.registry[t].error_codes})
        keys = [(True, None)] + [(False, c) for c in codes]
        probabilities = np.zeros((p.size, len(keys)))
        probabilities[:, 0] = p
        for i, tool in enumerate(self.tool_names):
            tool_codes = self.registry[tool].error_codes
            for c in tool_codes:
                probabilities[i, 1 + codes.index(c)] = (1 - p[i]) / len(tool_codes)
        return keys, probabilities

    def log_likelihood(self, theta: np.ndarray) -> float:
        p = self.success_probability(theta)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(self.success, np.log(p), np.log1p(-np.minimum(p, 1.0)))
        return float(self.weight @ terms)

    def gradient(self, theta: np.ndarray) -> np.ndarray:
        """d log likelihood / d theta: a cell adds weight * (1 if success else -p / (1 - p)) * x / theta, with x
        its indicator of each base and its covariates."""
        p = self.success_probability(theta)
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = self.weight * np.where(self.success, 1.0, -p / (1.0 - p))
            per_base = np.bincount(self.base_column, weights=slope, minlength=self.n_bases)
            return np.concatenate([per_base, slope @ self.covariates]) / theta


PROCESS_OPTIONS = ("outages", "rate-limits", "latency")
ANY = None  # an observation slot the log does not show (no Retry-After, no latency)
MAX_GRID = 20  # more distinct durations than this are binned (``_fit_latency``)


def _two_digits_up(duration: float) -> float:
    """``duration`` rounded up to two significant digits (0.2038 -> 0.21)."""
    if duration <= 0:
        return 0.0
    unit = 10.0 ** (math.floor(math.log10(duration)) - 1)
    return round(math.ceil(round(duration / unit, 9)) * unit, 12)


def _shows_world(row: CallLogRow) -> bool:
    """Whether the row's Retry-After and latency are the world's own (turns, simulated durations): a
    simulator row, or an HTTP row of our tool service once ``in_world_terms`` has read its headers."""
    return row.source == "simulator" or row.world_duration is not None


def in_world_terms(row: CallLogRow) -> CallLogRow:
    """An HTTP row of our tool service under failure processes (or a row of the MCP fault proxy injecting
    faults) with the world's account in place of the wire's: Retry-After in turns (``wait_turns``) and latency = the world's duration. Other rows as they are."""
    if row.source == "simulator" or row.world_duration is None:
        return row
    return dataclasses.replace(row, latency_s=row.world_duration,
                               retry_after=row.wait_turns if row.error_code == RATE_LIMIT_ERROR else None)


class _ProcessModel(_Model):
    """The log likelihood with failure processes: each (episode, tool) sequence of calls is a hidden Markov
    chain over the outage state (not called yet, up, down), its transitions and observation probabilities
    the branches of ``processes.call_outcomes`` (the simulator's own rules). A branch's probability is
    linear in the formula's p, so each evaluation enumerates the branches at p = 0 and p = 1 once per
    context (outage state, turns still blocked, the tool's error codes) and combines them per call."""

    def __init__(self, calls: Sequence[CallLogRow], registry: ToolRegistry, per_tool: bool, min_rows: int,
                 source: str, options: Sequence[str], level: float, world: FailureProcesses | None = None) -> None:
        """``world``: evaluate in these processes (their latency grid, timeout and wait) instead of reading
        those from the log."""
        super().__init__(calls, registry, per_tool, min_rows, source)
        self.level = level
        self.n_formula = len(self.parameters)
        self._table_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        # Simulator rows show the world's turns (Retry-After) and durations; an HTTP row's Retry-After is in
        # seconds and its latency the wire's, so those slots of its observation are left open.
        rate_rows = [r for r in calls if r.error_code == RATE_LIMIT_ERROR and _shows_world(r)]
        self.use_retry = "rate-limits" in options and all(r.retry_after is not None for r in rate_rows)
        self.grid: tuple[float, ...] = ()
        self.timeout: float | None = None
        if world is not None:
            self.fixed = {"latency_seconds": world.latency_seconds, "latency_weights": world.latency_weights,
                          "call_timeout_seconds": world.call_timeout_seconds, "rate_limit_wait": world.rate_limit_wait}
            self.timeout = world.call_timeout_seconds if world.latency_seconds else None
            self.grid = tuple(sorted(v for v in world.latency_seconds if self.timeout is None or v <= self.timeout))
        elif "latency" in options:
            self._fit_latency(calls, min_rows)
        if "rate-limits" in options:
            self.parameters.append(_Parameter("processes.rate_limit_probability", 0.0, len(calls),
                                              len(calls) >= min_rows))
            known = self.use_retry and bool(rate_rows)
            wait = int(max((r.retry_after or 0 for r in rate_rows), default=0)) if known else 0
            if known:
                self.fixed.setdefault("rate_limit_wait", wait)
            self.read.append(Estimate("processes.rate_limit_wait", wait, wait if known else None,
                                      wait if known else None, len(rate_rows), known, "read" if known else "default",
                                      "the largest Retry-After" if known else
                                      "not identified: no refusal with its wait in turns (simulator rows, or our tool "
                                      "service's X-Retry-After-Turns)"))
        if "outages" in options:
            self.parameters.append(_Parameter("processes.outage_start", 0.0, len(calls), len(calls) >= min_rows))
            self.parameters.append(_Parameter("processes.outage_end", 1.0, len(calls), len(calls) >= min_rows))
        foreign = next((r for r in calls if r.error_code is not None and r.error_code not in
                        (*registry[r.tool].error_codes, RATE_LIMIT_ERROR, SERVICE_UNAVAILABLE, TIMEOUT)), None)
        if foreign is not None:
            raise InputError("error_code", f"{source}: episode {foreign.episode!r} turn {foreign.turn}: "
                             f"{foreign.error_code} is neither a code of {foreign.tool} nor a process's; "
                             "fit without processes")
        self._index_calls(calls, registry)

    def _fit_latency(self, calls: Sequence[CallLogRow], min_rows: int) -> None:
        """The latency distribution on a grid of the logged durations (multinomial maximum likelihood, closed
        form: each grid value's share of the calls that reached the latency stage) and the timeout (the
        shortest duration of the TIMEOUT calls that lasted longer than every other call); likelihood-ratio
        intervals per weight. More than ``MAX_GRID`` distinct durations (wire times) are binned: each goes to
        the smallest grid value at or above it, the grid being the durations rounded up to two significant
        digits, or ten quantiles of those when still more than ``MAX_GRID``."""
        timed = [(r, float(r.latency_s)) for r in calls if r.latency_s is not None]
        if len(timed) < min_rows:
            self.read.append(Estimate("processes.latency_seconds", 0.0, None, None, len(timed), False, "default",
                                      f"not identified: {len(timed)} calls with a latency < {min_rows}"))
            return
        longest_other = max((d for r, d in timed if r.error_code != TIMEOUT), default=0.0)
        timed_out = [d for r, d in timed if r.error_code == TIMEOUT and d > longest_other]
        self.timeout = min(timed_out) if timed_out else None
        # Refusals and down calls end before the latency stage (duration 0; on the wire they cannot be told
        # from the formula's codes of the same name, so an HTTP row with either code is left out).
        refused = (RATE_LIMIT_ERROR, SERVICE_UNAVAILABLE)
        reached = [d for r, d in timed if not (r.error_code in refused and (d == 0 or not _shows_world(r)))
                   and not (r.error_code == TIMEOUT and d > longest_other)]
        values = sorted(set(reached))
        if len(values) > MAX_GRID:  # wire times: two significant digits, rounded up
            values = sorted({_two_digits_up(d) for d in reached})
        if len(values) > MAX_GRID:
            values = sorted({float(np.quantile(values, q)) for q in np.linspace(0.1, 1.0, 10)})
        self.grid = tuple(values)
        counts = [0] * len(values)
        for d in reached:
            counts[self._bin(d)] += 1
        grid = list(values)
        if self.timeout is not None:
            grid.append(2 * self.timeout)  # any duration above the timeout gives the same world
            counts.append(len(timed_out))
            self.fixed["call_timeout_seconds"] = self.timeout
        total = sum(counts)
        self.fixed["latency_seconds"] = tuple(grid)
        self.fixed["latency_weights"] = tuple(c / total for c in counts)
        for k, (value, count) in enumerate(zip(grid, counts, strict=True)):
            low, high = _binomial_interval(count, total, self.level)
            label = (f"> {self.timeout:g} s (timeout)" if self.timeout is not None and value > self.timeout
                     else f"{value:g} s")
            self.read.append(Estimate(f"processes.latency_weights[{k}]", count / total, low, high, total, True,
                                      "profile", f"latency {label}"))

    def _bin(self, duration: float) -> int:
        """The index of the smallest grid value at or above ``duration`` (the largest for a longer one)."""
        return min(int(np.searchsorted(self.grid, duration - 1e-9)), len(self.grid) - 1)

    def _shown_duration(self, code: str | None, duration: float) -> float:
        """A duration as the likelihood compares it: 0, the timeout, or its grid value."""
        if duration == 0 or not self.grid:
            return duration
        if self.timeout is not None and code == TIMEOUT and duration >= self.timeout:
            return self.timeout
        return self.grid[self._bin(duration)]

    def _index_calls(self, calls: Sequence[CallLogRow], registry: ToolRegistry) -> None:
        """Per call: its sequence, position, observation key, turns blocked and error-code list."""
        lists = sorted({registry[t].error_codes for t in self.tools})
        self.code_lists = lists
        self.keys: dict[tuple, int] = {}
        sequence_of: dict[tuple[str, str], int] = {}
        blocked_until: dict[tuple[str, str], int] = {}
        n = len(calls)
        self.sequence, self.position = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self.key, self.blocked, self.code_list = (np.zeros(n, dtype=np.int64) for _ in range(3))
        counts: dict[int, int] = {}
        for i, row in enumerate(calls):
            name = (row.episode, row.tool)
            seq = sequence_of.setdefault(name, len(sequence_of))
            self.sequence[i], self.position[i] = seq, counts.get(seq, 0)
            counts[seq] = counts.get(seq, 0) + 1
            self.blocked[i] = max(blocked_until.get(name, 0) - row.turn + 1, 0)
            world = _shows_world(row)
            if row.error_code == RATE_LIMIT_ERROR and self.use_retry and world:
                blocked_until[name] = row.turn + int(row.retry_after or 0)
            retry = row.retry_after if world and self.use_retry and row.error_code == RATE_LIMIT_ERROR else ANY
            duration = (self._shown_duration(row.error_code, row.latency_s)
                        if world and self.grid and row.latency_s is not None else ANY)
            self.key[i] = self.keys.setdefault((row.success, row.error_code, retry, duration), len(self.keys))
            self.code_list[i] = lists.index(registry[row.tool].error_codes)
        self.n_sequences = len(sequence_of)
        self.max_blocked = int(self.blocked.max(initial=0))
        self.rows_at = [np.flatnonzero(self.position == k) for k in range(int(self.position.max(initial=-1)) + 1)]
        # Per call, its context in each outage state (calls x 3).
        self.contexts = np.stack([self._context(s, self.blocked, self.code_list) for s in range(3)], axis=1)

    def _keys_of(self, outcome: CallOutcome) -> set[tuple]:
        """Every observation key that shows ``outcome``: with and without its Retry-After and duration."""
        retry = outcome.retry_after if self.use_retry and outcome.error_code == RATE_LIMIT_ERROR else ANY
        duration = self._shown_duration(outcome.error_code, outcome.duration) if self.grid else ANY
        return {(outcome.success, outcome.error_code, r, d) for r in (retry, ANY) for d in (duration, ANY)}

    def processes(self, theta: np.ndarray) -> FailureProcesses:
        values = dict(self.fixed)
        for p, value in zip(self.parameters[self.n_formula:], theta[self.n_formula:], strict=True):
            values[p.name.split(".")[1]] = float(value)
        return FailureProcesses(**values)

    def _context(self, down: int, blocked: Any, code_list: Any) -> Any:
        """The context index of an outage state, turns blocked and error-code list (ints or arrays)."""
        return (down * (self.max_blocked + 1) + blocked) * len(self.code_lists) + code_list

    def _tables(self, theta: np.ndarray, keys: dict[tuple, int]) -> tuple[np.ndarray, np.ndarray]:
        """(A, B) with P(observation key, next outage state | context) = A + B * p; a branch counts in every
        key that shows it (``_keys_of``); keys not in ``keys`` go to the last column. They depend on the
        process parameters only, so the last few are kept (a gradient's formula steps reuse them)."""
        cache_key = (tuple(keys), tuple(theta[self.n_formula:]))
        cached = self._table_cache.get(cache_key)
        if cached is not None:
            return cached
        if len(self._table_cache) >= 4:
            self._table_cache.clear()
        processes = self.processes(theta)
        n_contexts = 3 * (self.max_blocked + 1) * len(self.code_lists)
        tables = np.zeros((2, n_contexts, len(keys) + 1, 3))
        columns: dict[tuple, list[int]] = {}  # what an outcome shows -> the columns of its keys
        for down in range(3):
            for blocked in range(self.max_blocked + 1):
                for c, codes in enumerate(self.code_lists):
                    ctx = self._context(down, blocked, c)
                    state = ToolState((None, False, True)[down], blocked)
                    for t, p in enumerate((0.0, 1.0)):
                        for weight, outcome in call_outcomes(processes, state, p, codes):
                            after = {None: 0, False: 1, True: 2}[outcome.state.down]
                            shown = outcome[:3] + (outcome.retry_after,)
                            if shown not in columns:
                                columns[shown] = [keys.get(key, len(keys)) for key in self._keys_of(outcome)]
                            for column in columns[shown]:
                                tables[t, ctx, column, after] += weight
        self._table_cache[cache_key] = tables[0], tables[1] - tables[0]
        return self._table_cache[cache_key]

    def _transitions(self, theta: np.ndarray, keys: dict[tuple, int], key: np.ndarray,
                     slope: bool = False) -> np.ndarray:
        """Per call, the matrix P(its observation ``key``, next state | state) (calls x 3 x 3); ``slope``:
        its derivative in the formula's p instead (the matrix is linear in p)."""
        a, b = self._tables(theta, keys)
        if slope:
            return b[self.contexts, key[:, None]]
        p = self.success_probability(theta[:self.n_formula])[self.cell_of]
        return a[self.contexts, key[:, None]] + b[self.contexts, key[:, None]] * p[:, None, None]

    def _forward(self, matrices: np.ndarray) -> tuple[float, np.ndarray]:
        """(log likelihood, the state distribution before each call given the calls before it)."""
        alpha = np.zeros((self.n_sequences, 3))
        alpha[:, 0] = 1.0
        before = np.zeros((self.key.size, 3))
        total = 0.0
        for rows in self.rows_at:
            seqs = self.sequence[rows]
            before[rows] = alpha[seqs]
            new = np.einsum("ns,nst->nt", alpha[seqs], matrices[rows])
            norm = new.sum(axis=1)
            with np.errstate(divide="ignore"):
                total += float(np.log(norm).sum())
            alpha[seqs] = new / np.where(norm > 0, norm, 1.0)[:, None]
        return total, before

    def _backward(self, matrices: np.ndarray) -> np.ndarray:
        """Per call, the likelihood of its sequence's later calls given the state after it (scaled)."""
        beta = np.ones((self.n_sequences, 3))
        after = np.zeros((self.key.size, 3))
        for rows in reversed(self.rows_at):
            seqs = self.sequence[rows]
            after[rows] = beta[seqs]
            new = np.einsum("nst,nt->ns", matrices[rows], beta[seqs])
            norm = new.sum(axis=1)
            beta[seqs] = new / np.where(norm > 0, norm, 1.0)[:, None]
        return after

    def log_likelihood(self, theta: np.ndarray) -> float:
        return self._forward(self._transitions(theta, self.keys, self.key))[0]

    def gradient(self, theta: np.ndarray, step: float = 1e-7) -> np.ndarray:
        """The formula's parameters by the forward-backward algorithm: d log L / d p of a call is
        (before' B after) / (before' M after), M its matrix and B = dM/dp; the process parameters by
        central differences, each step kept inside (0, 1)."""
        matrices = self._transitions(theta, self.keys, self.key)
        slopes = self._transitions(theta, self.keys, self.key, slope=True)
        _, before = self._forward(matrices)
        after = self._backward(matrices)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_p = (np.einsum("ns,nst,nt->n", before, slopes, after)
                     / np.einsum("ns,nst,nt->n", before, matrices, after))
        # d p / d theta_j = p * x_j / theta_j, x the call's base indicator and covariates.
        weight = per_p * self.success_probability(theta[:self.n_formula])[self.cell_of]
        columns = self.base_column[self.cell_of]
        formula = np.concatenate([np.bincount(columns, weights=weight, minlength=self.n_bases),
                                  weight @ self.covariates[self.cell_of]]) / theta[:self.n_formula]
        gradient = np.zeros(theta.size)
        gradient[:self.n_formula] = formula
        for j in range(self.n_formula, theta.size):
            up, down = theta.copy(), theta.copy()
            up[j], down[j] = min(theta[j] + step, 1 - EDGE / 2), max(theta[j] - step, EDGE / 2)
            gradient[j] = (self.log_likelihood(up) - self.log_likelihood(down)) / (up[j] - down[j])
        return gradient

    def predictive(self, theta: np.ndarray) -> tuple[list[tuple], np.ndarray]:
        """(every outcome (success, code, ANY, ANY), P(outcome) per call given the calls before it in its
        sequence)."""
        _, before = self._forward(self._transitions(theta, self.keys, self.key))
        keys: dict[tuple, int] = {}
        processes = self.processes(theta)
        for down in range(3):
            for blocked in range(self.max_blocked + 1):
                for codes in self.code_lists:
                    for _, o in call_outcomes(processes, ToolState((None, False, True)[down], blocked), 0.5, codes):
                        keys.setdefault((o.success, o.error_code, ANY, ANY), len(keys))
        probabilities = np.zeros((self.key.size, len(keys)))
        for k in range(len(keys)):
            matrices = self._transitions(theta, keys, np.full(self.key.size, k))
            probabilities[:, k] = np.einsum("ns,nst->n", before, matrices)
        return list(keys), probabilities


def log_likelihood(rows: Iterable[CallLogRow], config: WorldConfig, registry: ToolRegistry | None = None,
                   source: str = "log") -> float:
    """The log likelihood of a log's drawing calls in the world ``config`` (its failure model and failure
    processes), the quantity ``fit_failures`` maximises: compare worlds on one log."""
    calls = drawing_calls(rows, source)
    processes = config.processes
    model = _ProcessModel(calls, registry or log_registry(calls), True, 1, source, PROCESS_OPTIONS, 0.95, processes)
    theta = []
    for parameter in model.parameters:
        section, field, *tool = parameter.name.split(".")
        if tool:
            theta.append(processes.tool_base_success.get(tool[0], config.failure.base_success))
        else:
            theta.append(getattr(config.failure if section == "failure" else processes, field))
    return model.log_likelihood(np.array(theta, dtype=np.float64))


def _binomial_interval(count: int, total: int, level: float) -> tuple[float, float]:
    """The likelihood-ratio interval of a binomial proportion (the profile interval of one multinomial
    weight), with the boundary cut-off when the estimate is 0 or 1."""
    share = count / total
    at_bound = count in (0, total)
    cutoff = float(stats.chi2.ppf(1 - 2 * (1 - level) if at_bound else level, 1)) / 2

    def drop(w: float) -> float:
        return float(stats.binom.logpmf(count, total, share) - stats.binom.logpmf(count, total, w)) - cutoff

    low = 0.0 if count == 0 else _root(drop, 1e-12, share)
    high = 1.0 if count == total else _root(drop, share, 1 - 1e-12)
    return low, high


def _root(function: Any, a: float, b: float) -> float:
    """The root of ``function`` between ``a`` and ``b`` (Brent's method)."""
    return float(optimize.brentq(function, a, b, xtol=1e-7))  # type: ignore[arg-type]


# --- fitting ----------------------------------------------------------------------------------------------


def _maximise(model: _Model, theta: np.ndarray, free: np.ndarray, near: bool = False) -> tuple[np.ndarray, float]:
    """``theta`` with its ``free`` entries at the maximum of the log likelihood (the rest fixed): L-BFGS-B
    on the logit scale (smooth, unbounded steps), then within [EDGE, 1 - EDGE] where estimates at a bound
    converge. ``near``: ``theta`` is already close (skip the first stage)."""
    index = np.flatnonzero(free)
    if index.size == 0:
        return theta, model.log_likelihood(theta)

    def negative(values: np.ndarray, logits: bool) -> tuple[float, np.ndarray]:
        full = theta.copy()
        full[index] = expit(values) if logits else values
        value = -model.log_likelihood(full)
        if not math.isfinite(value):  # an observed outcome impossible there: let the line search step back
            return IMPOSSIBLE, np.zeros(index.size)
        gradient = -model.gradient(full)[index]
        return value, gradient * full[index] * (1 - full[index]) if logits else gradient

    start = theta[index]
    if not near:
        rough = optimize.minimize(negative, logit(np.clip(start, 0.01, 0.99)), args=(True,), jac=True,
                                  method="L-BFGS-B", bounds=[(-ROUGH_LOGIT, ROUGH_LOGIT)] * index.size)
        start = expit(rough.x)
    result = optimize.minimize(negative, np.clip(start, EDGE, 1 - EDGE), args=(False,), jac=True,
                               method="L-BFGS-B", bounds=[(EDGE, 1 - EDGE)] * index.size,
                               options={"ftol": 1e-12, "gtol": 1e-6, "maxiter": 5000})
    best = theta.copy()
    best[index] = result.x
    return best, -float(result.fun)


def _information(model: _Model, theta: np.ndarray, index: np.ndarray, step: float = 1e-5) -> np.ndarray:
    """The observed Fisher information in the logit of the parameters ``index``: minus the Hessian of the
    log likelihood, by central differences of its gradient."""
    z = logit(theta[index])

    def gradient(shift: np.ndarray) -> np.ndarray:
        full = theta.copy()
        full[index] = expit(z + shift)
        return model.gradient(full)[index] * full[index] * (1 - full[index])

    eye = np.eye(index.size) * step
    hessian = np.array([(gradient(e) - gradient(-e)) / (2 * step) for e in eye])
    return -(hessian + hessian.T) / 2


def _profile_interval(model: _Model, theta: np.ndarray, free: np.ndarray, j: int, best: float,
                      level: float) -> tuple[float, float]:
    """The one-sided profile-likelihood interval of parameter ``j`` whose estimate lies at a bound: the
    values whose profile log likelihood is within half the boundary cut-off of the maximum."""
    cutoff = stats.chi2.ppf(1 - 2 * (1 - level), 1) / 2
    others = free.copy()
    others[j] = False
    at_low = theta[j] < 0.5

    def drop(value: float) -> float:
        fixed = theta.copy()
        fixed[j] = value
        return float(best - _maximise(model, fixed, others, near=True)[1] - cutoff)

    far = 1 - EDGE if at_low else EDGE
    if drop(far) <= 0:  # the whole range is within the cut-off
        return (0.0, 1.0)
    end = _root(drop, float(theta[j]), far)
    return (0.0, float(end)) if at_low else (float(end), 1.0)


def log_registry(rows: Sequence[CallLogRow]) -> ToolRegistry:
    """The tools of a log: the simulator's registry, or for a log of the MCP fault proxy (source ``mcp``)
    the upstream's tools it names, each a live tool (``live_apis.live_tool``: it fails with ``LIVE_ERRORS``),
    as the proxy sees them."""
    if rows and all(r.source == "mcp" for r in rows):
        return ToolRegistry(tuple(live_tool(name, "", ()) for name in dict.fromkeys(r.tool for r in rows)))
    return default_registry()


def fit_failures(rows: Iterable[CallLogRow], *, per_tool: bool = False, processes: Sequence[str] = (),
                 level: float = 0.95, min_rows: int = 30, registry: ToolRegistry | None = None,
                 source: str = "log") -> FailureFit:
    """Fit the failure model to call-log rows by maximum likelihood (module docstring). ``per_tool``: a base
    per tool with at least ``min_rows`` drawing calls; ``processes``: the failure processes to fit too (of
    ``PROCESS_OPTIONS``); ``source`` names the log in error messages."""
    if not 0 < level < 1:
        raise InputError("level", f"level must be in (0, 1), got {level}")
    if min_rows < 1:
        raise InputError("min_rows", f"min_rows must be at least 1, got {min_rows}")
    unknown = sorted(set(processes) - set(PROCESS_OPTIONS))
    if unknown:
        raise InputError("processes", f"unknown process(es) {unknown}; accepted: {list(PROCESS_OPTIONS)}")
    rows = list(rows)
    calls = drawing_calls(rows, source)
    if not calls:
        raise InputError("log", f"{source}: no call drew its outcome; nothing to fit")
    registry = registry or log_registry(calls)
    model = (_ProcessModel(calls, registry, per_tool, min_rows, source, processes, level) if processes
             else _Model(calls, registry, per_tool, min_rows, source))
    params = model.parameters
    free = np.array([p.free for p in params])
    theta, best = _maximise(model, np.array([p.default for p in params]), free)
    at_bound = free & ((theta <= 2 * EDGE) | (theta >= 1 - 2 * EDGE))
    intervals = _wald_intervals(model, theta, free & ~at_bound, level)
    for j in np.flatnonzero(at_bound):
        intervals[j] = _profile_interval(model, theta, free, int(j), best, level)
    estimates = []
    for j, p in enumerate(params):
        interval = intervals[j]
        if not p.free or interval is None:
            why = (f"{p.calls} informing calls < {min_rows}" if not p.free else "flat likelihood")
            estimates.append(Estimate(p.name, p.default, None, None, p.calls, False, "default",
                                      f"not identified: {why}"))
        else:
            low, high = interval
            estimates.append(Estimate(p.name, float(theta[j]), low, high, p.calls, True,
                                      "profile" if at_bound[j] else "fisher-logit"))
    return FailureFit((*estimates, *model.read), _goodness_of_fit(model, theta), level, len(rows), len(calls),
                      len({r.episode for r in rows}), best, dict(model.fixed))


def _wald_intervals(model: _Model, theta: np.ndarray, interior: np.ndarray,
                    level: float) -> list[tuple[float, float] | None]:
    """Wald intervals on the logit scale from the observed information of the ``interior`` parameters;
    None where the information gives no finite positive variance."""
    intervals: list[tuple[float, float] | None] = [None] * theta.size
    index = np.flatnonzero(interior)
    if not index.size:
        return intervals
    z = stats.norm.ppf(0.5 + level / 2)
    try:
        covariance = np.linalg.inv(_information(model, theta, index))
    except np.linalg.LinAlgError:
        return intervals
    for k, j in enumerate(index):
        if covariance[k, k] > 0 and math.isfinite(covariance[k, k]):
            centre, half = logit(theta[j]), z * math.sqrt(covariance[k, k])
            intervals[j] = (float(expit(centre - half)), float(expit(centre + half)))
    return intervals


# --- goodness of fit --------------------------------------------------------------------------------------


def _chi_square(name: str, labels: Sequence[str], members: Sequence[np.ndarray], observed: np.ndarray,
                expected: np.ndarray, variance: np.ndarray, fitted: int) -> FitTest:
    """Sum over groups of (observed - expected)^2 / variance, groups merged in order until each expects
    ``MIN_EXPECTED`` of each outcome; df = groups - ``fitted``."""
    merged: list[tuple[list[str], np.ndarray]] = []
    for label, member in zip(labels, members, strict=True):
        if merged and not _enough(merged[-1][1], expected, variance):
            merged[-1] = (merged[-1][0] + [label], np.concatenate([merged[-1][1], member]))
        else:
            merged.append(([label], member))
    if len(merged) > 1 and not _enough(merged[-1][1], expected, variance):
        last = merged.pop()
        merged[-1] = (merged[-1][0] + last[0], np.concatenate([merged[-1][1], last[1]]))
    groups, statistic = [], 0.0
    for group_labels, member in merged:
        o, e, v = float(observed[member].sum()), float(expected[member].sum()), float(variance[member].sum())
        statistic += (o - e) ** 2 / v if v > 0 else 0.0
        label = group_labels[0] if len(group_labels) == 1 else f"{group_labels[0]} .. {group_labels[-1]}"
        groups.append((label, int(member.size), o, e))
    df = len(groups) - fitted
    if df < 1:
        return FitTest(name, None, df, None, tuple(groups))
    return FitTest(name, statistic, df, float(stats.chi2.sf(statistic, df)), tuple(groups))


def _enough(member: np.ndarray, expected: np.ndarray, variance: np.ndarray) -> bool:
    e = expected[member].sum()
    return e >= MIN_EXPECTED and member.size - e >= MIN_EXPECTED and variance[member].sum() > 0


def _goodness_of_fit(model: _Model, theta: np.ndarray) -> tuple[FitTest, ...]:
    keys, probabilities = model.predictive(theta)
    success = model.success[model.cell_of]
    p = probabilities[:, [k for k, key in enumerate(keys) if key[0]]].sum(axis=1)  # per call
    observed = success.astype(np.float64)
    variance = p * (1 - p)
    # Hosmer-Lemeshow: ten bins of predicted probability (ties kept together).
    order = np.argsort(p, kind="stable")
    edges = np.unique(np.quantile(p, np.linspace(0, 1, 11)[1:-1]))
    bins = np.searchsorted(edges, p[order], side="right")
    members = [order[bins == b] for b in range(len(edges) + 1) if np.any(bins == b)]
    labels = [f"p {p[m].min():.3f}-{p[m].max():.3f}" for m in members]
    tests = [_chi_square("by predicted probability", labels, members, observed, p, variance, 2)]
    # By tool, among the tools that share the base: one base fitted for them all.
    shared = [t for t in model.tools if t not in model.own_base]
    tool_names = np.array(model.tool_names)
    members = [np.flatnonzero(tool_names == t) for t in shared]
    tests.append(_chi_square("by tool (shared base)", shared, members, observed, p, variance, 1))
    # Error codes among failures: observed against the model's code probabilities given a failure.
    failed = np.flatnonzero(~success)
    codes = sorted({key[1] for key in keys if not key[0]})
    given_failure = probabilities[failed] / np.maximum(1 - p[failed], 1e-300)[:, None]
    observed_codes = np.array([sum(model.codes[i] == c for i in failed) for c in codes], dtype=np.float64)
    expected_codes = np.array([given_failure[:, [k for k, key in enumerate(keys) if not key[0] and key[1] == c]].sum()
                               for c in codes])
    tests.append(_code_test(codes, observed_codes, expected_codes, failed.size))
    return tuple(tests)


def _code_test(codes: Sequence[str], observed: np.ndarray, expected: np.ndarray, failures: int) -> FitTest:
    """Pearson's chi-square of the error codes' counts among failures against the model's expectation, over
    the codes expected at least ``MIN_EXPECTED`` times (df = those codes - 1)."""
    groups = tuple((code, failures, float(o), float(e)) for code, o, e in zip(codes, observed, expected, strict=True))
    usable = [(o, e) for _, _, o, e in groups if e >= MIN_EXPECTED]
    df = len(usable) - 1
    if df < 1:
        return FitTest("error codes among failures", None, df, None, groups)
    statistic = sum((o - e) ** 2 / e for o, e in usable)
    return FitTest("error codes among failures", statistic, df, float(stats.chi2.sf(statistic, df)), groups)


# --- the command's work -----------------------------------------------------------------------------------


def calibrate(log: str | Path, out: str | Path, *, per_tool: bool = False, processes: Sequence[str] = (),
              level: float = 0.95, min_rows: int = 30) -> tuple[FailureFit, Path, Path]:
    """Fit a call log and write the world config (YAML, the fitted values only) to ``out`` and the report
    (JSON) beside it (``<out stem>.report.json``); returns (fit, config path, report path)."""
    import yaml

    out = Path(out)
    if out.suffix.lower() not in (".yaml", ".yml"):
        raise InputError("out", f"the world config must end in .yaml or .yml, got {out.name!r}")
    fit = fit_failures(read_rows(log), per_tool=per_tool, processes=processes, level=level, min_rows=min_rows,
                       source=str(log))
    report = out.with_name(out.stem + ".report.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    header = f"# World config fitted to {Path(log).name} by resilibench failures fit (report: {report.name})\n"
    out.write_text(header + yaml.safe_dump(fit.config(), sort_keys=True), encoding="utf-8")
    report.write_text(json.dumps(fit.to_dict(), indent=2) + "\n", encoding="utf-8")
    return fit, out, report
